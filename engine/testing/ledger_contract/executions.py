"""The ledger contract: executions -- due, claimed, completed, retried, dead-lettered, skipped,
requeued when their attempt lease runs out, queried, purged by retention, capped per task
type and counted in statistics -- attempt-lease renewal, and folded claims (started without
a claim, finished in one step).
"""

from __future__ import annotations

from collections.abc import Awaitable
from datetime import datetime, timedelta

import msgspec
import pytest

from engine.errors import (
    InvalidField,
    LeaseLost,
    NotFound,
)
from engine.ledger.params import (
    BATCH_ROWS_MAX,
    STATS_BUCKET_S_MAX,
    STATS_BUCKETS_MAX,
    AttemptRef,
    AuditQuery,
    Backfilled,
    Completion,
    DeadLettersPurge,
    DeadLettersReplay,
    DueCursor,
    ExecutionsBackfill,
    ExecutionsClaim,
    ExecutionsComplete,
    ExecutionsDue,
    ExecutionsExtend,
    ExecutionsFinish,
    ExecutionsPlan,
    ExecutionsPurge,
    ExecutionsQuery,
    ExecutionsRequeueExpired,
    ExecutionsSkip,
    ExecutionsStats,
    Fence,
    LeasesRelease,
    Outcome,
    PlannedExecution,
    SchedulesCreate,
    SchedulesDelete,
    TaskTypesPut,
    due_cursor,
)
from engine.model import (
    Execution,
    ExecutionStatus,
    HandlerKind,
    TaskType,
    execution_id,
)
from engine.testing.ledger_contract.backend import (
    Backend,
    ids_in_partition,
    schedule,
)
from engine.testing.ledger_contract.support import TTL_S, claim_now, due_now, own, planned


async def test_due_and_claim_never_start_early(backend: Backend) -> None:
    sids = ids_in_partition(2, 2)
    await backend.ledger.schedules_create(SchedulesCreate([schedule(s) for s in sids]))
    fence = await own(backend, 2)
    now = (await backend.ledger.database_now()).replace(microsecond=0)
    past, future = now - timedelta(seconds=1), now + timedelta(minutes=10)
    await planned(backend, fence, sids[:1], past)
    await planned(backend, fence, sids[1:], future)
    assert await due_now(backend, 2) == [execution_id(sids[0], past)]
    later = await due_now(backend, 2, after=3600)
    assert later == [execution_id(sids[0], past), execution_id(sids[1], future)]
    claimed = await backend.ledger.executions_claim(
        ExecutionsClaim(
            [fence],
            [execution_id(sids[0], past), execution_id(sids[1], future)],
            attempt_lease_s=30,
            node_id="n1",
        )
    )
    assert [c.execution_id for c in claimed] == [execution_id(sids[0], past)]
    [running] = claimed
    assert (running.status, running.attempt) == (ExecutionStatus.RUNNING, 1)
    assert running.started_at is not None
    assert running.attempt_expires_at is not None
    assert running.attempt_expires_at > running.started_at
    # Already running: a second claim (another worker, a redelivery) gets nothing.
    assert (
        await backend.ledger.executions_claim(
            ExecutionsClaim([fence], [running.execution_id], 30, "n2")
        )
        == []
    )


async def test_due_pages_one_tenants_backlog_after_a_cursor_in_due_order(
    backend: Backend,
) -> None:
    sids = ids_in_partition(3, 9)
    tenants = ["acme", "beta", "gamma"]
    await backend.ledger.schedules_create(
        SchedulesCreate([schedule(s, tenant_id=tenants[n % 3]) for n, s in enumerate(sids)])
    )
    fence = await own(backend, 3)
    now = (await backend.ledger.database_now()).replace(microsecond=0)
    early, late = now - timedelta(seconds=2), now - timedelta(seconds=1)
    await planned(backend, fence, sids[:6], early)
    await planned(backend, fence, sids[6:], late)
    everything = await backend.ledger.executions_due(ExecutionsDue([3], now))
    betas = [e for e in everything if e.tenant_id == "beta"]
    assert [e.execution_id for e in betas] == [
        *sorted(execution_id(s, early) for s in sids[1:6:3]),
        execution_id(sids[7], late),
    ]

    def beta_due(after: DueCursor | None, limit: int) -> Awaitable[list[Execution]]:
        return backend.ledger.executions_due(
            ExecutionsDue([3], now, limit, after=after, tenant_id="beta")
        )

    # Only beta's, in due order, paged after a cursor that may be another tenant's.
    assert await beta_due(None, 10) == betas
    assert await beta_due(None, 1) == betas[:1]
    for execution in everything:
        position = due_cursor(execution)
        key = (position.startable_at, position.execution_id)
        assert await beta_due(position, 10) == [
            b for b in betas if (due_cursor(b).startable_at, b.execution_id) > key
        ]
    assert await backend.ledger.executions_due(ExecutionsDue([3], now, tenant_id="nobody")) == []
    other_partition = ExecutionsDue([4], now, tenant_id="beta")
    assert await backend.ledger.executions_due(other_partition) == []


async def test_only_the_current_attempt_completes(backend: Backend) -> None:
    [sid] = ids_in_partition(1, 1)
    await backend.ledger.schedules_create(SchedulesCreate([schedule(sid)]))
    fence = await own(backend, 1)
    at = (await backend.ledger.database_now()).replace(microsecond=0) - timedelta(seconds=1)
    await planned(backend, fence, [sid], at)
    eid = execution_id(sid, at)
    [running] = await backend.ledger.executions_claim(ExecutionsClaim([fence], [eid], 30, "n"))
    result = await backend.ledger.executions_complete(
        ExecutionsComplete(
            [fence],
            [Completion(eid, running.attempt + 1, Outcome.SUCCEEDED)],
        )
    )
    assert (result.applied, result.stale) == ([], [eid])
    done = await backend.ledger.executions_complete(
        ExecutionsComplete([fence], [Completion(eid, running.attempt, Outcome.SUCCEEDED)])
    )
    assert done.applied == [eid]
    again = await backend.ledger.executions_complete(
        ExecutionsComplete([fence], [Completion(eid, running.attempt, Outcome.SUCCEEDED)])
    )
    assert again.stale == [eid]
    detail = await backend.ledger.executions_get(eid)
    assert detail.execution.status is ExecutionStatus.SUCCEEDED
    assert detail.execution.finished_at is not None
    assert [(a.attempt, a.outcome) for a in detail.attempts] == [(1, "succeeded")]


async def test_failed_attempts_retry_after_not_before_then_dead_letter_and_replay(
    backend: Backend,
) -> None:
    [sid] = ids_in_partition(3, 1)
    await backend.ledger.schedules_create(SchedulesCreate([schedule(sid)]))
    fence = await own(backend, 3)
    at = (await backend.ledger.database_now()).replace(microsecond=0) - timedelta(seconds=1)
    await planned(backend, fence, [sid], at)
    eid = execution_id(sid, at)
    claim = ExecutionsClaim([fence], [eid], attempt_lease_s=30, node_id="n")
    [first] = await backend.ledger.executions_claim(claim)
    retry_at = (await backend.ledger.database_now()) + timedelta(seconds=TTL_S)
    await backend.ledger.executions_complete(
        ExecutionsComplete(
            [fence],
            [Completion(eid, first.attempt, Outcome.FAILED, retry_at, "http_503", "busy")],
        )
    )
    failed = (await backend.ledger.executions_get(eid)).execution
    assert (failed.status, failed.not_before, failed.error_code) == (
        ExecutionStatus.FAILED,
        retry_at,
        "http_503",
    )
    assert await due_now(backend, 3) == []
    assert await backend.ledger.executions_claim(claim) == []
    await backend.advance(TTL_S + 0.1)
    assert await due_now(backend, 3) == [eid]
    [second] = await backend.ledger.executions_claim(claim)
    assert second.attempt == 2
    await backend.ledger.executions_complete(
        ExecutionsComplete(
            [fence],
            [Completion(eid, 2, Outcome.DEAD_LETTER, error_code="http_404", error_message="gone")],
        )
    )
    letters = await backend.ledger.executions_query(
        ExecutionsQuery(status=ExecutionStatus.DEAD_LETTER)
    )
    assert [e.execution_id for e in letters.items] == [eid]
    assert await backend.ledger.dead_letters_replay(
        DeadLettersReplay([eid, "nope:x"], actor="ops")
    ) == [eid]
    replayed = (await backend.ledger.executions_get(eid)).execution
    assert replayed.status is ExecutionStatus.QUEUED
    [third] = await backend.ledger.executions_claim(claim)
    assert third.execution_id == eid  # the same id: the idempotency key is unchanged
    assert third.attempt == 3
    history = (await backend.ledger.executions_get(eid)).attempts
    assert [(a.attempt, a.outcome, a.error_code) for a in history] == [
        (1, "failed", "http_503"),
        (2, "dead-letter", "http_404"),
    ]
    # Only dead letters are replayed.
    assert await backend.ledger.dead_letters_replay(DeadLettersReplay([eid], actor="ops")) == []


async def test_skip_ends_only_unstarted_executions_fenced_and_idempotently(
    backend: Backend,
) -> None:
    sids = ids_in_partition(4, 4)
    await backend.ledger.schedules_create(SchedulesCreate([schedule(s) for s in sids]))
    fence = await own(backend, 4)
    now = (await backend.ledger.database_now()).replace(microsecond=0)
    past, future = now - timedelta(seconds=1), now + timedelta(minutes=10)
    await planned(backend, fence, sids[:3], past)
    await planned(backend, fence, sids[3:], future)
    queued, running, failed, not_due = (
        execution_id(sids[0], past),
        execution_id(sids[1], past),
        execution_id(sids[2], past),
        execution_id(sids[3], future),
    )
    await backend.ledger.executions_claim(ExecutionsClaim([fence], [running, failed], 30, "n"))
    retry_at = now + timedelta(hours=1)
    await backend.ledger.executions_complete(
        ExecutionsComplete([fence], [Completion(failed, 1, Outcome.FAILED, retry_at, "http_503")])
    )
    skip = ExecutionsSkip(
        [fence], [not_due, running, queued, failed, queued], "overlap", "still running"
    )
    # Not-yet-due, queued and failed-awaiting-retry ones are skipped; running ones are not.
    assert await backend.ledger.executions_skip(skip) == [not_due, queued, failed]
    assert await backend.ledger.executions_skip(skip) == []
    for eid in (not_due, queued, failed):
        detail = await backend.ledger.executions_get(eid)
        row = detail.execution
        assert (row.status, row.error_code, row.error_message) == (
            ExecutionStatus.SKIPPED,
            "overlap",
            "still running",
        )
        assert row.finished_at is not None
        assert row.not_before is None
        assert row.fencing_token == fence.fencing_token
        assert len(detail.attempts) == (1 if eid == failed else 0)  # a skip is no attempt
    assert (await backend.ledger.executions_get(running)).execution.status is (
        ExecutionStatus.RUNNING
    )
    assert await due_now(backend, 4, after=3600) == []
    with pytest.raises(InvalidField):
        await backend.ledger.executions_skip(ExecutionsSkip([fence], [running], ""))
    [other] = ids_in_partition(5, 1)
    with pytest.raises(InvalidField):
        await backend.ledger.executions_skip(
            ExecutionsSkip([fence], [execution_id(other, past)], "overlap")
        )
    # A stale fence changes nothing.
    await backend.ledger.leases_release(LeasesRelease([fence]))
    newer = await own(backend, 4, owner="node-b")
    await planned(backend, newer, sids[:1], now)
    with pytest.raises(LeaseLost):
        await backend.ledger.executions_skip(
            ExecutionsSkip([fence], [execution_id(sids[0], now)], "overlap")
        )
    assert (await backend.ledger.executions_get(execution_id(sids[0], now))).execution.status is (
        ExecutionStatus.QUEUED
    )


async def test_queries_filter_by_task_type_and_finished_since(backend: Backend) -> None:
    await backend.ledger.task_types_put(
        TaskTypesPut(TaskType(name="other", kind=HandlerKind.NOOP, allowed_tenants=("*",)))
    )
    sids = ids_in_partition(4, 3, prefix="ft")
    kinds = ["noop", "other", "other"]
    await backend.ledger.schedules_create(
        SchedulesCreate([schedule(s, task_type=k) for s, k in zip(sids, kinds, strict=True)])
    )
    fence = await own(backend, 4)
    at = (await backend.ledger.database_now()).replace(microsecond=0) - timedelta(seconds=1)
    await planned(backend, fence, sids, at)
    eids = [execution_id(s, at) for s in sids]
    others = await backend.ledger.executions_query(ExecutionsQuery(task_type="other"))
    assert [e.execution_id for e in others.items] == sorted(eids[1:])
    before = await backend.ledger.database_now()
    [claimed] = await backend.ledger.executions_claim(ExecutionsClaim([fence], [eids[1]], 30, "n"))
    await backend.ledger.executions_complete(
        ExecutionsComplete([fence], [Completion(eids[1], claimed.attempt, Outcome.DEAD_LETTER)])
    )
    since = await backend.ledger.executions_query(
        ExecutionsQuery(task_type="other", finished_from=before)
    )
    assert [e.execution_id for e in since.items] == [eids[1]]  # unfinished ones never match
    await backend.advance(0.05)
    later = await backend.ledger.database_now()
    assert (await backend.ledger.executions_query(ExecutionsQuery(finished_from=later))).items == []


async def test_expired_attempts_are_requeued_and_their_late_completion_is_stale(
    backend: Backend,
) -> None:
    [sid] = ids_in_partition(5, 1)
    await backend.ledger.schedules_create(SchedulesCreate([schedule(sid)]))
    fence = await own(backend, 5)
    at = (await backend.ledger.database_now()).replace(microsecond=0) - timedelta(seconds=1)
    await planned(backend, fence, [sid], at)
    eid = execution_id(sid, at)
    [hung] = await backend.ledger.executions_claim(
        ExecutionsClaim([fence], [eid], attempt_lease_s=TTL_S, node_id="n")
    )
    requeue = ExecutionsRequeueExpired([fence])
    assert await backend.ledger.executions_requeue_expired(requeue) == []
    await backend.advance(TTL_S + 0.1)
    assert await backend.ledger.executions_requeue_expired(requeue) == [eid]
    requeued = (await backend.ledger.executions_get(eid)).execution
    assert requeued.status is ExecutionStatus.QUEUED
    assert requeued.attempt_expires_at is None
    late = await backend.ledger.executions_complete(
        ExecutionsComplete([fence], [Completion(eid, hung.attempt, Outcome.SUCCEEDED)])
    )
    assert late.stale == [eid]
    [retry] = await backend.ledger.executions_claim(ExecutionsClaim([fence], [eid], 30, "n2"))
    assert retry.attempt == hung.attempt + 1
    history = (await backend.ledger.executions_get(eid)).attempts
    assert [(a.attempt, a.outcome) for a in history] == [(1, "expired")]


async def test_claims_are_fenced_per_partition(backend: Backend) -> None:
    [mine] = ids_in_partition(0, 1)
    [theirs] = ids_in_partition(1, 1)
    await backend.ledger.schedules_create(SchedulesCreate([schedule(mine), schedule(theirs)]))
    fence = await own(backend, 0, "a")
    other = await own(backend, 1, "b")
    at = (await backend.ledger.database_now()).replace(microsecond=0) - timedelta(seconds=1)
    await planned(backend, fence, [mine], at)
    await planned(backend, other, [theirs], at)
    with pytest.raises(InvalidField):
        await backend.ledger.executions_claim(
            ExecutionsClaim([fence], [execution_id(theirs, at)], 30, "a")
        )
    stale = Fence(1, "a", other.fencing_token)
    with pytest.raises(LeaseLost) as raised:
        await backend.ledger.executions_claim(
            ExecutionsClaim(
                [fence, stale], [execution_id(mine, at), execution_id(theirs, at)], 30, "a"
            )
        )
    assert raised.value.partitions == (1,)
    mine_now = (await backend.ledger.executions_get(execution_id(mine, at))).execution
    assert mine_now.status is ExecutionStatus.QUEUED  # all or nothing


async def test_queries_filter_and_paginate_and_unknown_ids_are_not_found(
    backend: Backend,
) -> None:
    sids = ids_in_partition(6, 3)
    await backend.ledger.schedules_create(
        SchedulesCreate([schedule(s, tenant_id=f"t{n}") for n, s in enumerate(sids)])
    )
    fence = await own(backend, 6)
    base = (await backend.ledger.database_now()).replace(microsecond=0) - timedelta(hours=1)
    for minute in range(4):
        await planned(backend, fence, sids, base + timedelta(minutes=minute))
    everything: list[str] = []
    cursor = None
    while True:
        page = await backend.ledger.executions_query(ExecutionsQuery(cursor=cursor, limit=5))
        everything += [e.execution_id for e in page.items]
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert len(everything) == 12
    assert len(set(everything)) == 12
    one = await backend.ledger.executions_query(ExecutionsQuery(schedule_id=sids[0]))
    assert [e.planned_at for e in one.items] == [base + timedelta(minutes=m) for m in range(4)]
    ranged = await backend.ledger.executions_query(
        ExecutionsQuery(
            tenant_id="t1",
            planned_from=base + timedelta(minutes=1),
            planned_to=base + timedelta(minutes=3),
        )
    )
    assert [e.planned_at for e in ranged.items] == [
        base + timedelta(minutes=1),
        base + timedelta(minutes=2),
    ]
    with pytest.raises(NotFound):
        await backend.ledger.executions_get("nope:2026-01-01T00:00:00Z")


async def test_retention_purges_old_terminal_rows_but_keeps_dead_letters(
    backend: Backend,
) -> None:
    sids = ids_in_partition(7, 3)
    await backend.ledger.schedules_create(SchedulesCreate([schedule(s) for s in sids]))
    fence = await own(backend, 7)
    at = (await backend.ledger.database_now()).replace(microsecond=0) - timedelta(seconds=1)
    await planned(backend, fence, sids, at)
    eids = [execution_id(s, at) for s in sids]
    claimed = await backend.ledger.executions_claim(ExecutionsClaim([fence], eids, 30, "n"))
    outcomes = [Outcome.SUCCEEDED, Outcome.SKIPPED, Outcome.DEAD_LETTER]
    await backend.ledger.executions_complete(
        ExecutionsComplete(
            [fence],
            [
                Completion(c.execution_id, c.attempt, o)
                for c, o in zip(claimed, outcomes, strict=True)
            ],
        )
    )
    await backend.advance(0.05)
    cutoff = await backend.ledger.database_now()
    purge = ExecutionsPurge(fence, finished_before=cutoff, limit=1)
    assert await backend.ledger.executions_purge(purge) == 1
    assert await backend.ledger.executions_purge(ExecutionsPurge(fence, cutoff)) == 1
    assert await backend.ledger.executions_purge(ExecutionsPurge(fence, cutoff)) == 0
    remaining = await backend.ledger.executions_query(ExecutionsQuery())
    assert [e.status for e in remaining.items] == [ExecutionStatus.DEAD_LETTER]
    with pytest.raises(LeaseLost):
        await backend.ledger.executions_purge(
            ExecutionsPurge(Fence(7, "x", fence.fencing_token), cutoff)
        )


async def finished(
    backend: Backend, fence: Fence, sids: list[str], at: datetime, outcome: Outcome
) -> list[str]:
    """Plan ``sids`` at ``at``, run them once and finish them with ``outcome``."""
    await planned(backend, fence, sids, at)
    eids = [execution_id(s, at) for s in sids]
    claimed = await backend.ledger.executions_claim(ExecutionsClaim([fence], eids, 30, "n"))
    await backend.ledger.executions_complete(
        ExecutionsComplete(
            [fence], [Completion(c.execution_id, c.attempt, outcome) for c in claimed]
        )
    )
    return eids


async def test_retention_of_dead_letters_purges_only_old_dead_letters(backend: Backend) -> None:
    sids = ids_in_partition(5, 2, prefix="dl")
    await backend.ledger.schedules_create(SchedulesCreate([schedule(s) for s in sids]))
    fence = await own(backend, 5)
    at = (await backend.ledger.database_now()).replace(microsecond=0) - timedelta(minutes=2)
    [letter] = await finished(backend, fence, sids[:1], at, Outcome.DEAD_LETTER)
    [done] = await finished(backend, fence, sids[1:], at, Outcome.SUCCEEDED)
    await backend.advance(0.05)
    cutoff = await backend.ledger.database_now()
    await finished(backend, fence, sids[:1], at + timedelta(minutes=1), Outcome.DEAD_LETTER)
    purge = ExecutionsPurge(fence, cutoff, dead_letters=True)
    assert await backend.ledger.executions_purge(purge) == 1
    assert await backend.ledger.executions_purge(purge) == 0
    with pytest.raises(NotFound):
        await backend.ledger.executions_get(letter)
    left = await backend.ledger.executions_query(ExecutionsQuery())
    assert [(e.execution_id, e.status) for e in left.items] == [
        (done, ExecutionStatus.SUCCEEDED),
        (execution_id(sids[0], at + timedelta(minutes=1)), ExecutionStatus.DEAD_LETTER),
    ]


async def test_dead_letter_purge_deletes_dead_letters_only_and_audits_each(
    backend: Backend,
) -> None:
    sids = ids_in_partition(6, 3, prefix="purge")
    await backend.ledger.schedules_create(SchedulesCreate([schedule(s) for s in sids]))
    fence = await own(backend, 6)
    at = (await backend.ledger.database_now()).replace(microsecond=0) - timedelta(minutes=3)
    letters = await finished(backend, fence, sids[:2], at, Outcome.DEAD_LETTER)
    [done] = await finished(backend, fence, sids[2:], at, Outcome.SUCCEEDED)
    for refused, match in (
        (DeadLettersPurge(letters, ""), "actor"),
        (DeadLettersPurge(letters, "ops", ""), "reason"),
        (DeadLettersPurge(["x"] * (BATCH_ROWS_MAX + 1), "ops"), str(BATCH_ROWS_MAX)),
    ):
        with pytest.raises(InvalidField, match=match):
            await backend.ledger.dead_letters_purge(refused)
    asked = [letters[1], done, "nope:2026-01-01T00:00:00Z", letters[0], letters[1]]
    purged = await backend.ledger.dead_letters_purge(DeadLettersPurge(asked, "ops", "noise"))
    assert purged == [letters[1], letters[0]]
    for key in letters:
        with pytest.raises(NotFound):
            await backend.ledger.executions_get(key)
    assert (await backend.ledger.executions_get(done)).execution.status is ExecutionStatus.SUCCEEDED
    events = await backend.ledger.audit_list(AuditQuery(action="dead_letter.purge"))
    assert [(e.actor, e.target, e.details) for e in events] == [
        (
            "ops",
            key,
            {"reason": "noise", "attempt": 1, "error_code": None, "schedule_id": sid},
        )
        for key, sid in ((letters[1], sids[1]), (letters[0], sids[0]))
    ]
    assert await backend.ledger.dead_letters_purge(DeadLettersPurge(letters, "ops")) == []
    assert len(await backend.ledger.audit_list(AuditQuery(action="dead_letter.purge"))) == 2
    # A purged dead letter is purged history: a backfill does not run its fire again.
    result = await backend.ledger.executions_backfill(ExecutionsBackfill(sids[0], [at], "ops"))
    assert result == Backfilled([], at, 1)


async def test_backfill_skips_the_fires_whose_history_retention_purged(
    backend: Backend,
) -> None:
    partition = 4
    [sid] = ids_in_partition(partition, 1, prefix="kept")
    await backend.ledger.schedules_create(SchedulesCreate([schedule(sid)]))
    fence = await own(backend, partition)
    t0 = (await backend.ledger.database_now()).replace(microsecond=0) - timedelta(minutes=10)
    t1 = t0 + timedelta(minutes=1)
    await finished(backend, fence, [sid], t0, Outcome.SUCCEEDED)
    await finished(backend, fence, [sid], t1, Outcome.SUCCEEDED)
    await backend.advance(0.05)
    cutoff = await backend.ledger.database_now()
    assert await backend.ledger.executions_purge(ExecutionsPurge(fence, cutoff)) == 2
    asked = [t0 - timedelta(minutes=1), t0, t1, t1 + timedelta(minutes=1)]
    result = await backend.ledger.executions_backfill(ExecutionsBackfill(sid, asked, "ops"))
    assert result == Backfilled([execution_id(sid, asked[3])], t1, 3)
    [event] = await backend.ledger.audit_list(AuditQuery(action="schedule.backfill"))
    assert (event.details["inserted"], event.details["skipped_purged"]) == (1, 3)
    # The horizon outlives the schedule: its id created again has the same execution ids.
    await backend.ledger.schedules_delete(SchedulesDelete(sid))
    await backend.ledger.schedules_create(SchedulesCreate([schedule(sid)]))
    again = await backend.ledger.executions_backfill(ExecutionsBackfill(sid, [t1], "ops"))
    assert again == Backfilled([], t1, 1)
    assert await backend.ledger.executions_backfill(ExecutionsBackfill(sid, [], "ops")) == (
        Backfilled([], t1)
    )
    # Purging an older fire later never moves the horizon back.
    await backend.ledger.executions_skip(
        ExecutionsSkip([fence], [execution_id(sid, asked[3])], "test")
    )
    await backend.advance(0.05)
    cutoff = await backend.ledger.database_now()
    assert await backend.ledger.executions_purge(ExecutionsPurge(fence, cutoff)) == 1
    latest = await backend.ledger.executions_backfill(ExecutionsBackfill(sid, [t1], "ops"))
    assert latest.purged_through == asked[3]


async def test_batches_over_the_limit_are_refused(backend: Backend) -> None:
    fence = await own(backend, 0)
    at = await backend.ledger.database_now()
    [sid] = ids_in_partition(0, 1)
    await backend.ledger.schedules_create(SchedulesCreate([schedule(sid)]))
    too_many = [
        PlannedExecution(sid, "acme", "noop", at + timedelta(seconds=n))
        for n in range(BATCH_ROWS_MAX + 1)
    ]
    with pytest.raises(InvalidField):
        await backend.ledger.executions_plan(ExecutionsPlan(fence, too_many, [], None))
    with pytest.raises(InvalidField):
        await backend.ledger.schedules_create(
            SchedulesCreate([schedule(f"s{n}") for n in range(BATCH_ROWS_MAX + 1)])
        )


async def test_an_extended_attempt_lease_outlives_its_old_expiry(backend: Backend) -> None:
    [sid] = ids_in_partition(6, 1, prefix="long")
    await backend.ledger.schedules_create(SchedulesCreate([schedule(sid)]))
    fence = await own(backend, 6)
    [eid] = await claim_now(backend, fence, [sid], lease_s=TTL_S)
    running = (await backend.ledger.executions_get(eid)).execution
    extend = ExecutionsExtend([fence], [AttemptRef(eid, running.attempt)], TTL_S * 2)
    assert await backend.ledger.executions_extend(extend) == [eid]
    extended = (await backend.ledger.executions_get(eid)).execution
    assert running.attempt_expires_at is not None
    assert extended.attempt_expires_at is not None
    assert extended.attempt_expires_at - running.attempt_expires_at >= timedelta(seconds=TTL_S)
    assert msgspec.structs.replace(extended, attempt_expires_at=running.attempt_expires_at) == (
        running
    )  # nothing else changed: same attempt, same start
    requeue = ExecutionsRequeueExpired([fence])
    await backend.advance(TTL_S + 0.1)  # past the old expiry, before the new one
    assert await backend.ledger.executions_requeue_expired(requeue) == []
    assert (await backend.ledger.executions_get(eid)).execution.status is ExecutionStatus.RUNNING
    await backend.advance(TTL_S)  # past the new expiry: the worker stopped renewing
    assert await backend.ledger.executions_requeue_expired(requeue) == [eid]
    # The re-queued attempt can no longer be extended: its worker learns it lost it.
    assert await backend.ledger.executions_extend(extend) == []
    requeued = (await backend.ledger.executions_get(eid)).execution
    assert (requeued.status, requeued.attempt_expires_at) == (ExecutionStatus.QUEUED, None)


async def test_only_attempts_running_under_their_number_are_extended(backend: Backend) -> None:
    sids = ids_in_partition(1, 4, prefix="ext")
    [ghost] = ids_in_partition(1, 1, prefix="ghost")
    await backend.ledger.schedules_create(SchedulesCreate([schedule(s) for s in sids]))
    fence = await own(backend, 1)
    first, second, done = await claim_now(backend, fence, sids[:3], lease_s=30)
    at = (await backend.ledger.database_now()).replace(microsecond=0) - timedelta(seconds=1)
    await planned(backend, fence, sids[3:], at)
    queued = execution_id(sids[3], at)
    await backend.ledger.executions_complete(
        ExecutionsComplete([fence], [Completion(done, 1, Outcome.SUCCEEDED)])
    )
    before = {
        eid: (await backend.ledger.executions_get(eid)).execution
        for eid in (first, second, done, queued)
    }
    refs = [
        AttemptRef(second, 1),
        AttemptRef(first, 2),  # another attempt
        AttemptRef(done, 1),  # finished
        AttemptRef(queued, 0),  # not started
        AttemptRef(execution_id(ghost, at), 1),  # unknown
        AttemptRef(first, 1),
        AttemptRef(second, 1),  # repeated: extended once
    ]
    extended = await backend.ledger.executions_extend(ExecutionsExtend([fence], refs, 60))
    assert extended == [second, first]  # in the order given, without repeats
    for eid in (done, queued):
        assert (await backend.ledger.executions_get(eid)).execution == before[eid]
    for eid in (first, second):
        row = (await backend.ledger.executions_get(eid)).execution
        old = before[eid].attempt_expires_at
        assert row.attempt_expires_at is not None
        assert old is not None
        assert row.attempt_expires_at > old
    assert await backend.ledger.executions_extend(ExecutionsExtend([fence], [], 60)) == []
    [elsewhere] = ids_in_partition(2, 1, prefix="ext")
    for bad in (
        ExecutionsExtend([fence], [AttemptRef(first, 1)], 0),
        ExecutionsExtend([fence], [AttemptRef(first, 1)], -1),
        ExecutionsExtend([fence], [AttemptRef(execution_id(elsewhere, at), 1)], 60),
        ExecutionsExtend([fence], [AttemptRef(first, 1)] * (BATCH_ROWS_MAX + 1), 60),
    ):
        with pytest.raises(InvalidField):
            await backend.ledger.executions_extend(bad)


async def test_a_lost_fence_extends_nothing(backend: Backend) -> None:
    [sid] = ids_in_partition(5, 1, prefix="ext")
    await backend.ledger.schedules_create(SchedulesCreate([schedule(sid)]))
    fence = await own(backend, 5)
    [eid] = await claim_now(backend, fence, [sid], lease_s=30)
    before = (await backend.ledger.executions_get(eid)).execution
    stale = Fence(5, fence.owner_id, fence.fencing_token + 1)
    with pytest.raises(LeaseLost) as raised:
        await backend.ledger.executions_extend(ExecutionsExtend([stale], [AttemptRef(eid, 1)], 60))
    assert raised.value.partitions == (5,)
    await backend.ledger.leases_release(LeasesRelease([fence]))
    await own(backend, 5, owner="node-b")
    with pytest.raises(LeaseLost):
        await backend.ledger.executions_extend(ExecutionsExtend([fence], [AttemptRef(eid, 1)], 60))
    assert (await backend.ledger.executions_get(eid)).execution == before


async def test_a_cluster_cap_starts_at_most_that_many_of_a_task_type(backend: Backend) -> None:
    capped = TaskType(
        name="capped", kind=HandlerKind.NOOP, allowed_tenants=("*",), max_concurrency_cluster=2
    )
    await backend.ledger.task_types_put(TaskTypesPut(capped))
    mine = ids_in_partition(2, 5, prefix="cap")
    [theirs] = ids_in_partition(3, 1, prefix="cap")
    [free] = ids_in_partition(2, 1, prefix="free")
    await backend.ledger.schedules_create(
        SchedulesCreate(
            [schedule(s, task_type="capped") for s in [*mine, theirs]] + [schedule(free)]
        )
    )
    fence = await own(backend, 2, "node-a")
    other = await own(backend, 3, "node-b")
    at = (await backend.ledger.database_now()).replace(microsecond=0) - timedelta(seconds=1)
    await planned(backend, fence, [*mine, free], at)
    await planned(backend, other, [theirs], at)
    # The order the ids are given in decides which start, not their planned order.
    given = sorted((execution_id(s, at) for s in mine), reverse=True)
    free_id, theirs_id = execution_id(free, at), execution_id(theirs, at)

    async def claim(by: Fence, ids: list[str]) -> list[str]:
        started = await backend.ledger.executions_claim(ExecutionsClaim([by], ids, 30, "n"))
        return sorted(e.execution_id for e in started)

    assert await claim(fence, [*given, free_id]) == sorted([*given[:2], free_id])
    # The cap is cluster-wide: another node's partition starts none while two run.
    assert await claim(other, [theirs_id]) == []
    assert await due_now(backend, 3) == [theirs_id]  # still queued
    await backend.ledger.executions_complete(
        ExecutionsComplete([fence], [Completion(given[0], 1, Outcome.SUCCEEDED)])
    )
    assert await claim(fence, given) == [given[2]]
    assert await claim(fence, given) == []
    assert await claim(other, [theirs_id]) == []
    # A higher cap binds the next claim.
    higher = msgspec.structs.replace(capped, max_concurrency_cluster=5)
    await backend.ledger.task_types_put(TaskTypesPut(higher))
    assert await claim(fence, given) == sorted(given[3:])
    assert await claim(other, [theirs_id]) == [theirs_id]
    running = await backend.ledger.executions_query(
        ExecutionsQuery(status=ExecutionStatus.RUNNING, task_type="capped")
    )
    assert len(running.items) == 5


async def test_stats_count_planned_started_on_time_dead_letters_starts_and_skips(
    backend: Backend,
) -> None:
    first, skipped, retried, other = ids_in_partition(5, 4)
    await backend.ledger.schedules_create(
        SchedulesCreate(
            [
                schedule(first),
                schedule(skipped),
                schedule(retried),
                schedule(other, tenant_id="globex"),
            ]
        )
    )
    fence = await own(backend, 5)
    now = (await backend.ledger.database_now()).replace(microsecond=0)
    start = now - timedelta(minutes=10)
    early, late = start + timedelta(seconds=5), start + timedelta(seconds=130)
    await planned(backend, fence, [first], start - timedelta(seconds=1))  # before the range
    await planned(backend, fence, [first, skipped, other], early)
    await planned(backend, fence, [retried], late)
    claim = ExecutionsClaim(
        [fence],
        [execution_id(first, early), execution_id(retried, late)],
        attempt_lease_s=30,
        node_id="n",
    )
    assert len(await backend.ledger.executions_claim(claim)) == 2
    done = [
        Completion(execution_id(first, early), 1, Outcome.DEAD_LETTER, error_code="boom"),
        Completion(execution_id(retried, late), 1, Outcome.FAILED, now - timedelta(seconds=1)),
    ]
    await backend.ledger.executions_complete(ExecutionsComplete([fence], done))
    [again] = await backend.ledger.executions_claim(claim)
    assert again.attempt == 2  # its first start is attempt 1's, from the history
    await backend.ledger.executions_skip(
        ExecutionsSkip([fence], [execution_id(skipped, early)], "overlap")
    )

    stats = await backend.ledger.executions_stats(
        ExecutionsStats(planned_from=start, bucket_s=60, buckets=12, on_time_s=500)
    )
    assert len(stats) == 12
    b0, b2, b10 = stats[0], stats[2], stats[10]
    assert (b0.planned, b0.started, b0.on_time, b0.dead_letters) == (3, 1, 0, 1)
    assert (b2.planned, b2.started, b2.on_time, b2.dead_letters) == (1, 1, 1, 0)
    assert 595 <= b0.plan_lag_s_max < 620  # written ten minutes after their instant
    assert 470 <= b2.plan_lag_s_max < 495
    assert (b10.starts, b10.skips) == (2, 1)  # the retry is no first start
    quiet = [b for i, b in enumerate(stats) if i not in (0, 2, 10)]
    assert all(b == type(b)() for b in quiet)
    assert sum(b.planned for b in stats) == 4  # the fire before the range is not counted

    globex = await backend.ledger.executions_stats(
        ExecutionsStats(start, 60, 12, 500, tenant_id="globex")
    )
    assert [b.planned for b in globex] == [1] + [0] * 11
    assert sum(b.starts + b.skips for b in globex) == 0
    strict = await backend.ledger.executions_stats(ExecutionsStats(start, 60, 12, 0.0))
    assert sum(b.on_time for b in strict) == 0
    nobody = await backend.ledger.executions_stats(ExecutionsStats(start, 60, 3, 1, "nobody"))
    assert nobody == [type(nobody[0])()] * 3


@pytest.mark.parametrize(
    "change",
    [
        {"planned_from": datetime(2026, 1, 1)},  # noqa: DTZ001 (naive: refused)
        {"buckets": 0},
        {"buckets": STATS_BUCKETS_MAX + 1},
        {"bucket_s": 0},
        {"bucket_s": STATS_BUCKET_S_MAX + 1},
        {"on_time_s": -1.0},
        {"on_time_s": float("nan")},
    ],
)
async def test_stats_refuse_out_of_bounds_ranges(
    backend: Backend, change: dict[str, object]
) -> None:
    now = await backend.ledger.database_now()
    params = msgspec.structs.replace(ExecutionsStats(now, 60, 60, 1.0), **change)
    with pytest.raises(InvalidField):
        await backend.ledger.executions_stats(params)


# --- folded claims: executions_finish ---------------------------------------------------------


def folded(
    eid: str,
    attempt: int,
    outcome: Outcome,
    started_at: datetime,
    not_before: datetime | None = None,
    error_code: str | None = None,
) -> Completion:
    """The completion of a folded attempt (its number is the execution's + 1)."""
    return Completion(eid, attempt, outcome, not_before, error_code, started_at=started_at)


async def test_a_folded_attempt_moves_a_queued_execution_to_its_outcome_once(
    backend: Backend,
) -> None:
    sids = ids_in_partition(2, 2)
    await backend.ledger.schedules_create(SchedulesCreate([schedule(s) for s in sids]))
    fence = await own(backend, 2)
    now = (await backend.ledger.database_now()).replace(microsecond=0)
    at = now - timedelta(seconds=2)
    await planned(backend, fence, sids, at)
    ok, bad = execution_id(sids[0], at), execution_id(sids[1], at)
    started = now - timedelta(seconds=1)
    result = await backend.ledger.executions_finish(
        ExecutionsFinish(
            [fence],
            [
                folded(ok, 1, Outcome.SUCCEEDED, started),
                folded(bad, 1, Outcome.DEAD_LETTER, started, error_code="http_404"),
            ],
            "n1",
        )
    )
    assert (result.applied, result.stale) == ([ok, bad], [])
    done = await backend.ledger.executions_get(ok)
    row = done.execution
    assert (row.status, row.attempt, row.started_at) == (ExecutionStatus.SUCCEEDED, 1, started)
    assert row.finished_at is not None
    assert row.finished_at >= started
    assert (row.attempt_expires_at, row.fencing_token) == (None, fence.fencing_token)
    assert [(a.attempt, a.outcome, a.started_at) for a in done.attempts] == [
        (1, "succeeded", started)
    ]
    dead = await backend.ledger.executions_get(bad)
    assert (dead.execution.status, dead.execution.attempt, dead.execution.error_code) == (
        ExecutionStatus.DEAD_LETTER,
        1,
        "http_404",
    )
    assert [(a.attempt, a.outcome, a.started_at, a.error_code) for a in dead.attempts] == [
        (1, "dead-letter", started, "http_404")
    ]
    # The same attempt finished again (a retried write whose reply was lost), or completed
    # as if claimed: stale, nothing changes.
    again = await backend.ledger.executions_finish(
        ExecutionsFinish([fence], [folded(ok, 1, Outcome.FAILED, started)], "n1")
    )
    assert (again.applied, again.stale) == ([], [ok])
    completed = await backend.ledger.executions_complete(
        ExecutionsComplete([fence], [Completion(ok, 1, Outcome.FAILED)])
    )
    assert completed.stale == [ok]
    assert await backend.ledger.executions_get(ok) == done


async def test_a_folded_failure_waits_for_its_retry_and_the_retry_folds_from_failed(
    backend: Backend,
) -> None:
    [sid] = ids_in_partition(3, 1)
    await backend.ledger.schedules_create(SchedulesCreate([schedule(sid)]))
    fence = await own(backend, 3)
    now = (await backend.ledger.database_now()).replace(microsecond=0)
    at = now - timedelta(seconds=2)
    await planned(backend, fence, [sid], at)
    eid = execution_id(sid, at)
    first_start = now - timedelta(seconds=1)
    retry_at = (await backend.ledger.database_now()) + timedelta(seconds=TTL_S)
    failure = folded(eid, 1, Outcome.FAILED, first_start, retry_at, "http_503")
    assert (
        await backend.ledger.executions_finish(ExecutionsFinish([fence], [failure], "n1"))
    ).applied == [eid]
    failed = (await backend.ledger.executions_get(eid)).execution
    assert (failed.status, failed.attempt, failed.not_before, failed.finished_at) == (
        ExecutionStatus.FAILED,
        1,
        retry_at,
        None,
    )
    # Not startable before its retry: neither a fold nor a claim may start it.
    retry = folded(eid, 2, Outcome.SUCCEEDED, now)
    early = await backend.ledger.executions_finish(ExecutionsFinish([fence], [retry], "n1"))
    assert early.stale == [eid]
    await backend.advance(TTL_S + 0.1)
    second_start = await backend.ledger.database_now()
    # The attempt number must be the next one: not the same, not one further.
    for wrong in (1, 3):
        stale = await backend.ledger.executions_finish(
            ExecutionsFinish([fence], [folded(eid, wrong, Outcome.SUCCEEDED, second_start)], "n1")
        )
        assert stale.stale == [eid]
    retry = folded(eid, 2, Outcome.SUCCEEDED, second_start)
    assert (
        await backend.ledger.executions_finish(ExecutionsFinish([fence], [retry], "n1"))
    ).applied == [eid]
    detail = await backend.ledger.executions_get(eid)
    assert (detail.execution.status, detail.execution.attempt) == (ExecutionStatus.SUCCEEDED, 2)
    assert (detail.execution.not_before, detail.execution.error_code) == (None, None)
    assert [(a.attempt, a.outcome, a.started_at) for a in detail.attempts] == [
        (1, "failed", first_start),
        (2, "succeeded", second_start),
    ]


async def test_a_finish_is_stale_after_a_claim_a_skip_or_before_the_instant(
    backend: Backend,
) -> None:
    sids = ids_in_partition(4, 4)
    await backend.ledger.schedules_create(SchedulesCreate([schedule(s) for s in sids]))
    fence = await own(backend, 4)
    now = (await backend.ledger.database_now()).replace(microsecond=0)
    past, future = now - timedelta(seconds=1), now + timedelta(minutes=10)
    await planned(backend, fence, sids[:3], past)
    await planned(backend, fence, sids[3:], future)
    claimed, deleted, skipped, not_due = (
        execution_id(sids[0], past),
        execution_id(sids[1], past),
        execution_id(sids[2], past),
        execution_id(sids[3], future),
    )
    [running] = await backend.ledger.executions_claim(ExecutionsClaim([fence], [claimed], 30, "n2"))
    await backend.ledger.schedules_delete(SchedulesDelete(sids[1]))
    await backend.ledger.executions_skip(ExecutionsSkip([fence], [skipped], "overlap"))
    before = {
        eid: await backend.ledger.executions_get(eid)
        for eid in (claimed, deleted, skipped, not_due)
    }
    assert before[deleted].execution.status is ExecutionStatus.SKIPPED
    finishes = [
        folded(eid, attempt, Outcome.SUCCEEDED, now)
        for eid in (claimed, deleted, skipped, not_due)
        for attempt in (1, 2)
    ]
    result = await backend.ledger.executions_finish(ExecutionsFinish([fence], finishes, "n1"))
    assert result.applied == []
    for eid, detail in before.items():
        assert await backend.ledger.executions_get(eid) == detail
    # The claimed attempt completes as usual.
    done = await backend.ledger.executions_complete(
        ExecutionsComplete([fence], [Completion(claimed, running.attempt, Outcome.SUCCEEDED)])
    )
    assert done.applied == [claimed]


async def test_a_finish_is_fenced_and_checks_its_input(backend: Backend) -> None:
    [sid] = ids_in_partition(6, 1)
    await backend.ledger.schedules_create(SchedulesCreate([schedule(sid)]))
    fence = await own(backend, 6)
    now = (await backend.ledger.database_now()).replace(microsecond=0)
    at = now - timedelta(seconds=1)
    await planned(backend, fence, [sid], at)
    eid = execution_id(sid, at)
    with pytest.raises(InvalidField):
        await backend.ledger.executions_finish(
            ExecutionsFinish([fence], [Completion(eid, 1, Outcome.SUCCEEDED)], "n1")
        )
    with pytest.raises(InvalidField):
        await backend.ledger.executions_finish(
            ExecutionsFinish(
                [fence], [folded(eid, 1, Outcome.SUCCEEDED, at.replace(tzinfo=None))], "n1"
            )
        )
    [other] = ids_in_partition(7, 1)
    with pytest.raises(InvalidField):
        await backend.ledger.executions_finish(
            ExecutionsFinish(
                [fence], [folded(execution_id(other, at), 1, Outcome.SUCCEEDED, now)], "n1"
            )
        )
    # A zombie's finish -- its lease ran out and another node owns the partition -- is refused
    # whole, as its completion would be; the execution stays queued for the new owner.
    await backend.advance(TTL_S * 50 + 0.1)
    successor = await own(backend, 6, "successor")
    with pytest.raises(LeaseLost):
        await backend.ledger.executions_finish(
            ExecutionsFinish([fence], [folded(eid, 1, Outcome.SUCCEEDED, now)], "zombie")
        )
    row = (await backend.ledger.executions_get(eid)).execution
    assert (row.status, row.attempt) == (ExecutionStatus.QUEUED, 0)
    result = await backend.ledger.executions_finish(
        ExecutionsFinish([successor], [folded(eid, 1, Outcome.SUCCEEDED, now)], "successor")
    )
    assert result.applied == [eid]
    assert (await backend.ledger.executions_get(eid)).execution.fencing_token == (
        successor.fencing_token
    )
