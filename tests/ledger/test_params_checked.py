"""Each parameter object checks itself: one rule and one message, whichever backend serves it.

Both ledgers call ``params.checked()`` before anything else, so what is pinned here is what
either refuses, word for word; the contract suite shows that both do refuse.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from engine.errors import InvalidField
from engine.ledger.params import (
    BATCH_ROWS_MAX,
    AttemptRef,
    Completion,
    DueCursor,
    ExecutionsBackfill,
    ExecutionsClaim,
    ExecutionsComplete,
    ExecutionsDue,
    ExecutionsExtend,
    ExecutionsFinish,
    ExecutionsPlan,
    ExecutionsQuery,
    ExecutionsSkip,
    Fence,
    LeasesAcquire,
    NodesHeartbeat,
    Outcome,
    PlannedExecution,
    ScheduleAdvance,
    SchedulesCreate,
    SchedulesList,
    SessionsCreate,
    TokensRevoke,
)
from engine.model import ExecutionStatus, Schedule

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
PLUS_TWO = timezone(timedelta(hours=2))
NAIVE = datetime(2026, 1, 1, 12, 0)
FENCE = Fence(0, "n1", 1)


def fire(**overrides: object) -> PlannedExecution:
    fields: dict[str, object] = {
        "schedule_id": "s",
        "tenant_id": "acme",
        "task_type": "noop",
        "planned_at": NOW,
    }
    fields.update(overrides)
    return PlannedExecution(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("params", "message"),
    [
        (
            ExecutionsClaim([FENCE], ["s:x"] * (BATCH_ROWS_MAX + 1), 30, "n1"),
            f"execution_ids carries {BATCH_ROWS_MAX + 1} rows; at most {BATCH_ROWS_MAX} per call",
        ),
        (
            ExecutionsClaim([FENCE], [], 0, "n1"),
            "attempt_lease_s must be a positive number of seconds up to 31622400, got 0",
        ),
        (
            ExecutionsExtend([FENCE], [AttemptRef("s:x", 1)], float("nan")),
            "attempt_lease_s must be a positive number of seconds up to 31622400, got nan",
        ),
        (ExecutionsDue([0], NAIVE), f"before {NAIVE.isoformat()} has no UTC offset"),
        (
            ExecutionsDue([0], NOW, after=DueCursor(NAIVE, "s:x")),
            f"after.startable_at {NAIVE.isoformat()} has no UTC offset",
        ),
        (ExecutionsDue([0], NOW, limit=0), "limit must be between 1 and 1000, got 0"),
        (
            ExecutionsPlan(FENCE, [fire(status=ExecutionStatus.RUNNING)], []),
            "a planned execution is queued or skipped, not running",
        ),
        (
            ExecutionsPlan(FENCE, [fire(status=ExecutionStatus.SKIPPED)], []),
            "a skipped execution must carry an error_code saying why",
        ),
        (
            ExecutionsPlan(FENCE, [], [ScheduleAdvance("s", NAIVE, 1)]),
            f"next_run_at {NAIVE.isoformat()} has no UTC offset",
        ),
        (
            ExecutionsComplete([FENCE], [Completion("s:x", 1, "won")]),  # type: ignore[arg-type]
            "unknown outcome 'won'",
        ),
        (
            ExecutionsFinish([FENCE], [Completion("s:x", 1, Outcome.SUCCEEDED)], "n1"),
            "a folded completion needs started_at",
        ),
        (
            ExecutionsFinish(
                [FENCE], [Completion("s:x", 1, Outcome.SUCCEEDED, started_at=NAIVE)], "n1"
            ),
            f"started_at {NAIVE.isoformat()} has no UTC offset",
        ),
        (ExecutionsSkip([FENCE], ["s:x"], ""), "a skipped execution must carry an error_code"),
        (LeasesAcquire("", [0], 10), "owner_id must not be empty"),
        (NodesHeartbeat("n1", "default", 10, float("inf")), "clock_offset_s must be a finite"),
        (SchedulesList(id_prefix="x" * 129), "id_prefix is 129 characters long"),
        (
            SchedulesCreate(
                [
                    Schedule(
                        schedule_id="a", tenant_id="acme", cron_expr="* * * * *", task_type="noop"
                    )
                ]
                * 2
            ),
            "schedule ids repeated in one call: a",
        ),
        (ExecutionsQuery(planned_to=NAIVE), "planned_to"),
        (
            ExecutionsBackfill("s", [NAIVE], "ops"),
            f"backfill instant {NAIVE.isoformat()} has no UTC offset",
        ),
        (SessionsCreate(b"x" * 32, "t", 10, 5), "a session needs 0 < idle_timeout_s"),
        (TokensRevoke("t", ""), "actor"),
    ],
)
def test_a_malformed_call_is_refused_with_one_message(params: object, message: str) -> None:
    with pytest.raises(InvalidField) as refused:
        params.checked()  # type: ignore[attr-defined]
    assert message in str(refused.value)


def test_instants_come_back_in_utc() -> None:
    plan = ExecutionsPlan(
        FENCE,
        [fire(planned_at=NOW.astimezone(PLUS_TWO))],
        [ScheduleAdvance("s", NOW.astimezone(PLUS_TWO), 1)],
        checkpoint=NOW.astimezone(PLUS_TWO),
    ).checked()
    assert plan.executions[0].planned_at.tzinfo is UTC
    assert plan.advances[0].next_run_at is not None
    assert plan.advances[0].next_run_at.tzinfo is UTC
    assert plan.checkpoint is not None
    assert plan.checkpoint.tzinfo is UTC
    assert plan.executions[0].planned_at == NOW


def test_a_backfill_keeps_each_instant_once_in_the_order_given() -> None:
    later = NOW + timedelta(minutes=1)
    checked = ExecutionsBackfill("s", [later, NOW.astimezone(PLUS_TWO), later, NOW], "ops")
    assert checked.checked().planned_at == [later, NOW]


def test_a_well_formed_hot_path_batch_is_not_copied() -> None:
    fires = [fire(planned_at=NOW + timedelta(seconds=n)) for n in range(3)]
    plan = ExecutionsPlan(FENCE, fires, []).checked()
    assert all(a is b for a, b in zip(plan.executions, fires, strict=True))
    complete = ExecutionsComplete([FENCE], [Completion("s:x", 1, Outcome.FAILED, NOW)])
    assert complete.checked() is complete
    claim = ExecutionsClaim([FENCE], ["s:x"], 30, "n1")
    assert claim.checked() is claim
    finish = ExecutionsFinish([FENCE], [Completion("s:x", 1, Outcome.FAILED, started_at=NOW)], "n")
    assert finish.checked() is finish


def test_a_folded_completion_comes_back_with_its_start_in_utc() -> None:
    finish = ExecutionsFinish(
        [FENCE], [Completion("s:x", 1, Outcome.SUCCEEDED, started_at=NOW.astimezone(PLUS_TWO))], "n"
    )
    (completion,) = finish.checked().completions
    assert completion.started_at == NOW
    assert completion.started_at.tzinfo is UTC


def test_an_outcome_given_as_text_comes_back_as_an_outcome() -> None:
    complete = ExecutionsComplete([FENCE], [Completion("s:x", 1, "failed")])  # type: ignore[arg-type]
    (completion,) = complete.checked().completions
    assert completion.outcome is Outcome.FAILED
