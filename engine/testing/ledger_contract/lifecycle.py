"""The ledger contract for a schedule's life: pausing and resuming, deleting and re-creating,
and the executions an operator adds (trigger and backfill) over what those skipped.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta, timezone

import msgspec
import pytest

from engine.core.instants import format_utc
from engine.errors import (
    InvalidField,
    NotFound,
)
from engine.ledger.params import (
    BATCH_ROWS_MAX,
    PAGE_SIZE_MAX,
    AuditQuery,
    Backfilled,
    ChangeKind,
    Completion,
    DeadLettersReplay,
    ExecutionsBackfill,
    ExecutionsClaim,
    ExecutionsComplete,
    ExecutionsPlan,
    ExecutionsQuery,
    ExecutionsSkip,
    ExecutionsTrigger,
    Outcome,
    PlannedExecution,
    ScheduleChangesSince,
    SchedulesCreate,
    SchedulesDelete,
    SchedulesUpdate,
)
from engine.model import (
    ExecutionStatus,
    Schedule,
    execution_id,
)
from engine.testing.ledger_contract.backend import (
    Backend,
    ids_in_partition,
    schedule,
)
from engine.testing.ledger_contract.support import due_now, own, planned


async def test_pausing_skips_queued_executions(backend: Backend) -> None:
    partition = 4
    [sid] = ids_in_partition(partition, 1, prefix="pause")
    await backend.ledger.schedules_create(SchedulesCreate([schedule(sid)]))
    fence = await own(backend, partition)
    now = await backend.ledger.database_now()
    at = now.replace(second=0, microsecond=0)  # fires of its minutely timetable
    instants = [at - timedelta(minutes=3), at - timedelta(minutes=2), at + timedelta(minutes=1)]
    for instant in instants:
        await planned(backend, fence, [sid], instant)
    running, failed, queued = (execution_id(sid, instant) for instant in instants)
    claimed = await backend.ledger.executions_claim(
        ExecutionsClaim([fence], [running, failed], 60, "n")
    )
    assert len(claimed) == 2
    retry = Completion(failed, 1, Outcome.FAILED, not_before=now + timedelta(hours=1))
    await backend.ledger.executions_complete(ExecutionsComplete([fence], [retry]))
    current = await backend.ledger.schedules_get(sid)
    paused = await backend.ledger.schedules_update(
        SchedulesUpdate(msgspec.structs.replace(current, enabled=False), current.version)
    )
    for key in (failed, queued):
        execution = (await backend.ledger.executions_get(key)).execution
        assert (execution.status, execution.error_code) == (
            ExecutionStatus.SKIPPED,
            "schedule_paused",
        )
        assert execution.finished_at is not None
        assert execution.not_before is None
    # A running attempt finishes normally.
    assert (await backend.ledger.executions_get(running)).execution.status is (
        ExecutionStatus.RUNNING
    )
    done = await backend.ledger.executions_complete(
        ExecutionsComplete([fence], [Completion(running, 1, Outcome.SUCCEEDED)])
    )
    assert done.applied == [running]
    # Enabling it again queues the fire to come again (the lifecycle tests below), but not
    # the one that failed and awaited a retry: it started, and its instant has passed.
    await backend.ledger.schedules_update(
        SchedulesUpdate(msgspec.structs.replace(paused, enabled=True), paused.version)
    )
    assert (await backend.ledger.executions_get(failed)).execution.status is (
        ExecutionStatus.SKIPPED
    )
    assert await due_now(backend, partition, after=7200) == [queued]
    changes = await backend.ledger.schedule_changes(ScheduleChangesSince(after_seq=0))
    assert [c.kind for c in changes] == [ChangeKind.CREATED, ChangeKind.UPDATED, ChangeKind.UPDATED]


async def test_a_paused_schedule_is_not_planned_until_enabled_again(backend: Backend) -> None:
    partition = 2
    [sid] = ids_in_partition(partition, 1, prefix="paused")
    [created] = await backend.ledger.schedules_create(
        SchedulesCreate([schedule(sid, enabled=False)])
    )
    fence = await own(backend, partition)
    at = (await backend.ledger.database_now()).replace(microsecond=0) - timedelta(seconds=1)
    fire = PlannedExecution(sid, "acme", "noop", at)
    # A planner that has not heard of the pause yet plans nothing for it.
    result = await backend.ledger.executions_plan(ExecutionsPlan(fence, [fire], []))
    assert result.inserted == []
    await backend.ledger.schedules_update(
        SchedulesUpdate(msgspec.structs.replace(created, enabled=True), created.version)
    )
    result = await backend.ledger.executions_plan(ExecutionsPlan(fence, [fire], []))
    assert result.inserted == [execution_id(sid, at)]


QUEUED = ExecutionStatus.QUEUED


SKIPPED = ExecutionStatus.SKIPPED


async def state(backend: Backend, key: str) -> tuple[ExecutionStatus, str | None, int]:
    execution = (await backend.ledger.executions_get(key)).execution
    return execution.status, execution.error_code, execution.attempt


async def set_enabled(backend: Backend, schedule_id: str, enabled: bool) -> Schedule:
    current = await backend.ledger.schedules_get(schedule_id)
    wanted = msgspec.structs.replace(current, enabled=enabled)
    return await backend.ledger.schedules_update(SchedulesUpdate(wanted, current.version))


async def whole_minute(backend: Backend) -> datetime:
    """The ledger's clock, down to the minute: minutely fires are this plus whole minutes."""
    return (await backend.ledger.database_now()).replace(second=0, microsecond=0)


async def test_resume_queues_again_the_fires_to_come_that_the_pause_skipped(
    backend: Backend,
) -> None:
    partition = 1
    [sid] = ids_in_partition(partition, 1, prefix="resume")
    await backend.ledger.schedules_create(SchedulesCreate([schedule(sid)]))
    fence = await own(backend, partition)
    minute = await whole_minute(backend)
    # One fire already due, two within the lookahead (planned ahead, as a planner does).
    instants = [minute - timedelta(minutes=1), minute + timedelta(minutes=1)]
    instants.append(minute + timedelta(minutes=2))
    for at in instants:
        await planned(backend, fence, [sid], at)
    keys = [execution_id(sid, at) for at in instants]
    before = [(await backend.ledger.executions_get(key)).execution for key in keys]
    await set_enabled(backend, sid, False)
    assert [await state(backend, key) for key in keys] == [(SKIPPED, "schedule_paused", 0)] * 3
    assert await due_now(backend, partition, after=600) == []
    head = await backend.ledger.schedule_changes_head()
    await backend.advance(0.01)
    resumed = await set_enabled(backend, sid, True)
    resumed_by = await backend.ledger.database_now()
    # The fire whose instant had passed stays skipped; the two to come are queued again.
    assert await state(backend, keys[0]) == (SKIPPED, "schedule_paused", 0)
    for key, old in zip(keys[1:], before[1:], strict=True):
        detail = await backend.ledger.executions_get(key)
        revived = detail.execution
        assert (
            revived.status,
            revived.attempt,
            revived.error_code,
            revived.error_message,
            revived.finished_at,
            revived.not_before,
            revived.started_at,
        ) == (QUEUED, 0, None, None, None, None, None)
        assert (revived.planned_at, revived.partition_id, revived.tenant_id) == (
            old.planned_at,
            partition,
            "acme",
        )
        assert old.enqueued_at is not None
        assert revived.enqueued_at is not None
        assert old.enqueued_at < revived.enqueued_at <= resumed_by
        assert detail.attempts == []
    assert await due_now(backend, partition, after=600) == keys[1:]
    # The owning planner, told of the change, plans those fires again: nothing twice.
    assert await planned(backend, fence, [sid], instants[1]) == []
    assert await due_now(backend, partition, after=600) == keys[1:]
    changes = await backend.ledger.schedule_changes(ScheduleChangesSince(head))
    assert [(c.kind, c.version) for c in changes] == [(ChangeKind.UPDATED, resumed.version)]


async def test_resume_revives_no_other_skip_and_nothing_that_started(backend: Backend) -> None:
    partition = 3
    [sid] = ids_in_partition(partition, 1, prefix="keep")
    await backend.ledger.schedules_create(SchedulesCreate([schedule(sid)]))
    fence = await own(backend, partition)
    now = await backend.ledger.database_now()
    minute = now.replace(second=0, microsecond=0)
    overlap_at, catch_up_at, foreign_at, mine_at = (
        minute + timedelta(minutes=n) for n in (1, 2, 3, 4)
    )
    await planned(backend, fence, [sid], overlap_at)
    overlap = execution_id(sid, overlap_at)
    await backend.ledger.executions_skip(ExecutionsSkip([fence], [overlap], "overlap"))
    await backend.ledger.executions_plan(
        ExecutionsPlan(
            fence,
            [
                PlannedExecution(
                    sid, "acme", "noop", catch_up_at, SKIPPED, error_code="catchup_window"
                ),
                PlannedExecution(sid, "globex", "noop", foreign_at),  # another tenant's row
                PlannedExecution(sid, "acme", "noop", mine_at),
            ],
            [],
        )
    )
    # A fire that started (it failed and awaits a retry), and an operator's run.
    ran_at = minute - timedelta(minutes=1)
    await planned(backend, fence, [sid], ran_at)
    ran = execution_id(sid, ran_at)
    await backend.ledger.executions_claim(ExecutionsClaim([fence], [ran], 60, "n"))
    retry = Completion(ran, 1, Outcome.FAILED, not_before=now + timedelta(hours=1))
    await backend.ledger.executions_complete(ExecutionsComplete([fence], [retry]))
    triggered = await backend.ledger.executions_trigger(ExecutionsTrigger(sid, "ops"))
    await set_enabled(backend, sid, False)
    await set_enabled(backend, sid, True)
    assert [
        await state(backend, key)
        for key in (
            overlap,
            execution_id(sid, catch_up_at),
            execution_id(sid, foreign_at),
            execution_id(sid, mine_at),
            ran,
            triggered.execution_id,
        )
    ] == [
        (SKIPPED, "overlap", 0),
        (SKIPPED, "catchup_window", 0),
        (SKIPPED, "schedule_paused", 0),
        (QUEUED, None, 0),
        (SKIPPED, "schedule_paused", 1),
        (SKIPPED, "schedule_paused", 0),  # not a fire of its timetable: never revived
    ]


async def test_a_timing_change_while_paused_revives_only_the_fires_the_new_timetable_has(
    backend: Backend,
) -> None:
    partition = 5
    cron_sid, zone_sid = ids_in_partition(partition, 2, prefix="retime")
    await backend.ledger.schedules_create(
        SchedulesCreate([schedule(cron_sid), schedule(zone_sid, cron_expr="0 * * * *")])
    )
    fence = await own(backend, partition)
    minute = await whole_minute(backend)
    first, second = minute + timedelta(minutes=1), minute + timedelta(minutes=2)
    hour = minute.replace(minute=0) + timedelta(hours=1)
    for at in (first, second):
        await planned(backend, fence, [cron_sid], at)
    await planned(backend, fence, [zone_sid], hour)
    paused = await set_enabled(backend, cron_sid, False)
    # Now fires only at the second instant's minute of each hour.
    retimed = msgspec.structs.replace(paused, cron_expr=f"{second.minute} * * * *")
    await backend.ledger.schedules_update(SchedulesUpdate(retimed, paused.version))
    paused = await set_enabled(backend, zone_sid, False)
    # Kolkata is UTC+05:30: "0 * * * *" there fires at half past each UTC hour.
    moved = msgspec.structs.replace(paused, timezone="Asia/Kolkata")
    await backend.ledger.schedules_update(SchedulesUpdate(moved, paused.version))
    await set_enabled(backend, cron_sid, True)
    await set_enabled(backend, zone_sid, True)
    assert await state(backend, execution_id(cron_sid, first)) == (SKIPPED, "schedule_paused", 0)
    assert await state(backend, execution_id(cron_sid, second)) == (QUEUED, None, 0)
    assert await state(backend, execution_id(zone_sid, hour)) == (SKIPPED, "schedule_paused", 0)


async def test_pausing_and_resuming_again_and_again_keeps_one_queued_execution_per_fire(
    backend: Backend,
) -> None:
    partition = 6
    [sid] = ids_in_partition(partition, 1, prefix="again")
    await backend.ledger.schedules_create(SchedulesCreate([schedule(sid)]))
    fence = await own(backend, partition)
    at = await whole_minute(backend) + timedelta(minutes=1)
    await planned(backend, fence, [sid], at)
    key = execution_id(sid, at)
    for _ in range(3):
        await set_enabled(backend, sid, False)
        assert await state(backend, key) == (SKIPPED, "schedule_paused", 0)
        await set_enabled(backend, sid, True)
        assert await state(backend, key) == (QUEUED, None, 0)
        assert await planned(backend, fence, [sid], at) == []
    page = await backend.ledger.executions_query(ExecutionsQuery(schedule_id=sid))
    assert [(e.execution_id, e.status) for e in page.items] == [(key, QUEUED)]
    assert await due_now(backend, partition, after=600) == [key]


async def test_a_fire_whose_instant_passed_during_the_pause_stays_skipped_until_backfilled(
    backend: Backend,
) -> None:
    partition = 7
    [sid] = ids_in_partition(partition, 1, prefix="passed")
    await backend.ledger.schedules_create(SchedulesCreate([schedule(sid, cron_expr="* * * * * *")]))
    fence = await own(backend, partition)
    now = await backend.ledger.database_now()
    at = now.replace(microsecond=0) + timedelta(seconds=1)
    await planned(backend, fence, [sid], at)
    key = execution_id(sid, at)
    await set_enabled(backend, sid, False)
    await backend.advance((at - now).total_seconds() + 0.05)
    await set_enabled(backend, sid, True)
    assert await state(backend, key) == (SKIPPED, "schedule_paused", 0)
    # It never ran: a backfill over its instant queues it again, under its own id.
    backfilled = await backend.ledger.executions_backfill(ExecutionsBackfill(sid, [at], "ops"))
    assert backfilled.inserted == [key]
    assert await state(backend, key) == (QUEUED, None, 0)
    assert await due_now(backend, partition) == [key]


async def test_recreating_a_deleted_schedule_revives_the_fires_to_come_it_still_has(
    backend: Backend,
) -> None:
    partition = 2
    sid, later_sid = ids_in_partition(partition, 2, prefix="recreate")
    await backend.ledger.schedules_create(SchedulesCreate([schedule(sid), schedule(later_sid)]))
    fence = await own(backend, partition)
    minute = await whole_minute(backend)
    instants = [minute - timedelta(minutes=1), minute + timedelta(minutes=1)]
    instants.append(minute + timedelta(minutes=2))
    for at in instants:
        await planned(backend, fence, [sid, later_sid], at)
    past, first, second = (execution_id(sid, at) for at in instants)
    await backend.ledger.schedules_delete(SchedulesDelete(sid))
    assert await state(backend, second) == (SKIPPED, "schedule_deleted", 0)
    # Created again with an expression that keeps only the second instant.
    head = await backend.ledger.schedule_changes_head()
    [created] = await backend.ledger.schedules_create(
        SchedulesCreate([schedule(sid, cron_expr=f"{instants[2].minute} * * * *")])
    )
    assert await state(backend, past) == (SKIPPED, "schedule_deleted", 0)
    assert await state(backend, first) == (SKIPPED, "schedule_deleted", 0)
    assert await state(backend, second) == (QUEUED, None, 0)
    due = [execution_id(later_sid, at) for at in instants] + [second]
    assert sorted(await due_now(backend, partition, after=600)) == sorted(due)
    changes = await backend.ledger.schedule_changes(ScheduleChangesSince(head))
    assert [(c.kind, c.version) for c in changes] == [(ChangeKind.CREATED, created.version)]
    # Created again disabled, nothing comes back until it is resumed; then the delete's
    # skips and the pause's alike.
    await set_enabled(backend, later_sid, False)
    await backend.ledger.schedules_delete(SchedulesDelete(later_sid))
    await backend.ledger.schedules_create(SchedulesCreate([schedule(later_sid, enabled=False)]))
    later = [execution_id(later_sid, at) for at in instants[1:]]
    assert [await state(backend, key) for key in later] == [(SKIPPED, "schedule_paused", 0)] * 2
    await set_enabled(backend, later_sid, True)
    assert [await state(backend, key) for key in later] == [(QUEUED, None, 0)] * 2


async def test_recreating_after_a_delete_revives_a_deleted_skip_on_resume(
    backend: Backend,
) -> None:
    partition = 4
    [sid] = ids_in_partition(partition, 1, prefix="gone")
    await backend.ledger.schedules_create(SchedulesCreate([schedule(sid)]))
    fence = await own(backend, partition)
    at = await whole_minute(backend) + timedelta(minutes=1)
    await planned(backend, fence, [sid], at)
    await backend.ledger.schedules_delete(SchedulesDelete(sid))
    await backend.ledger.schedules_create(SchedulesCreate([schedule(sid, enabled=False)]))
    assert await state(backend, execution_id(sid, at)) == (SKIPPED, "schedule_deleted", 0)
    await set_enabled(backend, sid, True)
    assert await state(backend, execution_id(sid, at)) == (QUEUED, None, 0)


async def test_backfill_revives_what_a_pause_or_delete_skipped_but_never_what_started(
    backend: Backend,
) -> None:
    partition = 0
    sid, gone = ids_in_partition(partition, 2, prefix="refill")
    await backend.ledger.schedules_create(SchedulesCreate([schedule(sid), schedule(gone)]))
    fence = await own(backend, partition)
    now = await backend.ledger.database_now()
    minute = now.replace(second=0, microsecond=0)
    paused_at, ran_at, retry_at, overlap_at, catch_up_at, running_at = (
        minute - timedelta(minutes=n) for n in (6, 5, 4, 3, 2, 1)
    )
    for at in (paused_at, ran_at, retry_at, overlap_at, running_at):
        await planned(backend, fence, [sid], at)
    key = {at: execution_id(sid, at) for at in (paused_at, ran_at, retry_at, overlap_at)}
    key |= {catch_up_at: execution_id(sid, catch_up_at), running_at: execution_id(sid, running_at)}
    await backend.ledger.executions_claim(
        ExecutionsClaim([fence], [key[ran_at], key[retry_at], key[running_at]], 60, "n")
    )
    await backend.ledger.executions_complete(
        ExecutionsComplete(
            [fence],
            [
                Completion(key[ran_at], 1, Outcome.SUCCEEDED),
                Completion(key[retry_at], 1, Outcome.FAILED, not_before=now + timedelta(hours=1)),
            ],
        )
    )
    await backend.ledger.executions_skip(ExecutionsSkip([fence], [key[overlap_at]], "overlap"))
    catch_up = PlannedExecution(
        sid, "acme", "noop", catch_up_at, SKIPPED, error_code="catchup_window"
    )
    await backend.ledger.executions_plan(ExecutionsPlan(fence, [catch_up], []))
    await set_enabled(backend, sid, False)
    everything = [paused_at, ran_at, retry_at, overlap_at, catch_up_at, running_at]
    filled = await backend.ledger.executions_backfill(ExecutionsBackfill(sid, everything, "ops"))
    assert filled.inserted == [key[paused_at]]
    assert [await state(backend, key[at]) for at in everything] == [
        (QUEUED, None, 0),
        (ExecutionStatus.SUCCEEDED, None, 1),
        (SKIPPED, "schedule_paused", 1),
        (SKIPPED, "overlap", 0),
        (SKIPPED, "catchup_window", 0),
        (ExecutionStatus.RUNNING, None, 1),
    ]
    [event] = await backend.ledger.audit_list(AuditQuery(action="schedule.backfill"))
    assert (event.details["inserted"], event.details["requested"]) == (1, 6)
    # A delete's skip of a fire that never started, once the schedule exists again.
    await planned(backend, fence, [gone], paused_at)
    await backend.ledger.schedules_delete(SchedulesDelete(gone))
    await backend.ledger.schedules_create(SchedulesCreate([schedule(gone)]))
    revived = await backend.ledger.executions_backfill(ExecutionsBackfill(gone, [paused_at], "ops"))
    assert revived.inserted == [execution_id(gone, paused_at)]
    assert await state(backend, revived.inserted[0]) == (QUEUED, None, 0)


async def test_a_dead_letter_of_a_deleted_schedule_is_not_replayed(backend: Backend) -> None:
    partition = 5
    [sid] = ids_in_partition(partition, 1, prefix="letter")
    await backend.ledger.schedules_create(SchedulesCreate([schedule(sid)]))
    fence = await own(backend, partition)
    at = await whole_minute(backend) - timedelta(minutes=1)
    await planned(backend, fence, [sid], at)
    key = execution_id(sid, at)
    await backend.ledger.executions_claim(ExecutionsClaim([fence], [key], 60, "n"))
    dead = Completion(key, 1, Outcome.DEAD_LETTER, error_code="http_404", error_message="gone")
    await backend.ledger.executions_complete(ExecutionsComplete([fence], [dead]))
    await backend.ledger.schedules_delete(SchedulesDelete(sid))
    # What it would run with went with its schedule: it stays a dead letter, unaudited.
    assert await backend.ledger.dead_letters_replay(DeadLettersReplay([key], "ops")) == []
    assert await state(backend, key) == (ExecutionStatus.DEAD_LETTER, "http_404", 1)
    assert await backend.ledger.audit_list(AuditQuery(action="dead_letter.replay")) == []
    # Once its schedule exists again, it runs with the new schedule's payload.
    await backend.ledger.schedules_create(SchedulesCreate([schedule(sid, payload={"n": 2})]))
    assert await backend.ledger.dead_letters_replay(DeadLettersReplay([key], "ops")) == [key]
    assert await state(backend, key) == (QUEUED, None, 1)


BURST_SCHEDULES = os.environ.get("CARILLON_TEST_BURST_SCHEDULES")
"""Schedules due at one instant in the burst test; by default 2,000 on the memory ledger and
300 on Postgres (each is paused and resumed on its own: two transactions). The issue's case
is 200,000 fires: set this to run it."""


async def test_a_burst_planned_ahead_paused_and_resumed_is_queued_again_exactly_once(
    backend: Backend,
) -> None:
    partition = 3
    count = int(BURST_SCHEDULES or (2_000 if backend.clock_stands_still else 300))
    ids = ids_in_partition(partition, count, prefix="burst")
    for first in range(0, len(ids), BATCH_ROWS_MAX):
        chunk = ids[first : first + BATCH_ROWS_MAX]
        await backend.ledger.schedules_create(SchedulesCreate([schedule(sid) for sid in chunk]))
    fence = await own(backend, partition)
    # Within the lookahead (a minute ahead) -- on Postgres, whose clock runs while the test
    # pauses and resumes each schedule, with a minute more per 200 schedules, so the instant
    # is still to come when the last one resumes.
    ahead = 1 if backend.clock_stands_still else 1 + count // 200
    at = await whole_minute(backend) + timedelta(minutes=ahead)
    for first in range(0, len(ids), BATCH_ROWS_MAX):
        chunk = ids[first : first + BATCH_ROWS_MAX]
        plan = [PlannedExecution(sid, "acme", "noop", at) for sid in chunk]
        await backend.ledger.executions_plan(ExecutionsPlan(fence, plan, []))
    for enabled in (False, True):
        for sid in ids:
            await set_enabled(backend, sid, enabled)
    queued: list[str] = []
    cursor: str | None = None
    while True:
        page = await backend.ledger.executions_query(
            ExecutionsQuery(planned_from=at, cursor=cursor, limit=PAGE_SIZE_MAX)
        )
        assert {e.status for e in page.items} <= {QUEUED}
        queued += [e.execution_id for e in page.items]
        cursor = page.next_cursor
        if cursor is None:
            break
    assert sorted(queued) == sorted(execution_id(sid, at) for sid in ids)


async def test_a_trigger_queues_a_run_due_at_once_and_is_audited(backend: Backend) -> None:
    partition = 6
    [sid] = ids_in_partition(partition, 1, prefix="trig")
    [stored] = await backend.ledger.schedules_create(
        SchedulesCreate([schedule(sid, tenant_id="globex")])
    )
    head = await backend.ledger.schedule_changes_head()
    before = await backend.ledger.database_now()
    execution = await backend.ledger.executions_trigger(
        ExecutionsTrigger(sid, "cli:alice@ops-1", "rerun after the fix")
    )
    after = await backend.ledger.database_now()
    # Ledger now, or a microsecond after it if now is a whole second (a cron fire's instant).
    assert before <= execution.planned_at <= after + timedelta(microseconds=1)
    assert execution.planned_at.microsecond != 0
    assert execution.execution_id == execution_id(sid, execution.planned_at)
    assert (
        execution.schedule_id,
        execution.tenant_id,
        execution.task_type,
        execution.partition_id,
        execution.status,
        execution.attempt,
    ) == (sid, "globex", "noop", partition, ExecutionStatus.QUEUED, 0)
    assert execution.enqueued_at is not None
    assert (await backend.ledger.executions_get(execution.execution_id)).execution == execution
    await backend.advance(0.001)
    assert await due_now(backend, partition) == [execution.execution_id]
    fence = await own(backend, partition)
    [started] = await backend.ledger.executions_claim(
        ExecutionsClaim([fence], [execution.execution_id], 60, "n")
    )
    assert started.attempt == 1
    [event] = await backend.ledger.audit_list(AuditQuery(action="schedule.trigger"))
    assert (event.actor, event.target, event.details) == (
        "cli:alice@ops-1",
        execution.execution_id,
        {"schedule_id": sid, "reason": "rerun after the fix"},
    )
    [change] = await backend.ledger.schedule_changes(ScheduleChangesSince(head))
    assert (change.schedule_id, change.partition_id, change.kind, change.version) == (
        sid,
        partition,
        ChangeKind.EXECUTIONS_ADDED,
        stored.version,
    )
    for bad in (ExecutionsTrigger(sid, ""), ExecutionsTrigger(sid, "ops", "  ")):
        with pytest.raises(InvalidField):
            await backend.ledger.executions_trigger(bad)
    with pytest.raises(NotFound):
        await backend.ledger.executions_trigger(ExecutionsTrigger("nope", "ops"))
    await backend.ledger.schedules_delete(SchedulesDelete(sid))
    with pytest.raises(NotFound):
        await backend.ledger.executions_trigger(ExecutionsTrigger(sid, "ops"))
    assert len(await backend.ledger.audit_list(AuditQuery(action="schedule.trigger"))) == 1


async def test_trigger_twice_in_one_microsecond_gets_two_ids(backend: Backend) -> None:
    partition = 1
    [sid] = ids_in_partition(partition, 1, prefix="twice")
    await backend.ledger.schedules_create(SchedulesCreate([schedule(sid)]))
    fence = await own(backend, partition)
    now = await backend.ledger.database_now()
    taken = now + timedelta(microseconds=2)
    await planned(backend, fence, [sid], taken)
    runs = [await backend.ledger.executions_trigger(ExecutionsTrigger(sid, "ops")) for _ in "abc"]
    ids = [run.execution_id for run in runs]
    assert len({*ids, execution_id(sid, taken)}) == 4
    assert [run.planned_at for run in runs] == sorted({run.planned_at for run in runs})
    if backend.clock_stands_still:
        # The memory ledger's clock stands still (on a whole second, which a trigger leaves
        # to the cron fires): each trigger moves on by a microsecond, and past the fire
        # planned at that very instant.
        assert now.microsecond == 0
        assert [run.planned_at - now for run in runs] == [
            timedelta(microseconds=1),
            timedelta(microseconds=3),
            timedelta(microseconds=4),
        ]
    assert len(await backend.ledger.audit_list(AuditQuery(action="schedule.trigger"))) == 3


async def test_a_trigger_never_takes_the_instant_of_a_cron_fire(backend: Backend) -> None:
    partition = 3
    [sid] = ids_in_partition(partition, 1, prefix="dot")
    await backend.ledger.schedules_create(SchedulesCreate([schedule(sid)]))
    run = await backend.ledger.executions_trigger(ExecutionsTrigger(sid, "ops"))
    assert run.planned_at.microsecond != 0
    # The fire of that second (every fire is at a whole second) is still planned.
    second = run.planned_at.replace(microsecond=0)
    fence = await own(backend, partition)
    assert await planned(backend, fence, [sid], second) == [execution_id(sid, second)]


async def test_a_trigger_runs_a_paused_schedule_and_a_later_update_keeps_it(
    backend: Backend,
) -> None:
    partition = 5
    [sid] = ids_in_partition(partition, 1, prefix="manual")
    [created] = await backend.ledger.schedules_create(
        SchedulesCreate([schedule(sid, enabled=False)])
    )
    execution = await backend.ledger.executions_trigger(ExecutionsTrigger(sid, "ops"))
    assert execution.status is ExecutionStatus.QUEUED
    changed = msgspec.structs.replace(created, cron_expr="0 * * * *")  # still disabled
    await backend.ledger.schedules_update(SchedulesUpdate(changed, created.version))
    await backend.advance(0.001)
    assert await due_now(backend, partition) == [execution.execution_id]


async def test_backfill_inserts_past_fires_once_each_and_is_audited_once(
    backend: Backend,
) -> None:
    partition = 2
    [sid] = ids_in_partition(partition, 1, prefix="fill")
    # A disabled schedule may be backfilled too.
    [stored] = await backend.ledger.schedules_create(
        SchedulesCreate([schedule(sid, enabled=False)])
    )
    head = await backend.ledger.schedule_changes_head()
    now = await backend.ledger.database_now()
    hour = now.replace(minute=0, second=0, microsecond=0)
    instants = [hour - timedelta(hours=2), hour - timedelta(hours=1), now]
    paris = instants[1].astimezone(timezone(timedelta(hours=2)))  # the same instant again
    asked = [instants[1], instants[0], paris, instants[2]]
    result = await backend.ledger.executions_backfill(
        ExecutionsBackfill(sid, asked, "ops", "the outage of 1 March")
    )
    ids = [execution_id(sid, instant) for instant in instants]
    assert result == Backfilled([ids[1], ids[0], ids[2]], None, 0)
    for key, instant in zip(ids, instants, strict=True):
        execution = (await backend.ledger.executions_get(key)).execution
        assert (execution.status, execution.planned_at, execution.partition_id) == (
            ExecutionStatus.QUEUED,
            instant,
            partition,
        )
    assert sorted(await due_now(backend, partition)) == sorted(ids)
    [event] = await backend.ledger.audit_list(AuditQuery(action="schedule.backfill"))
    assert (event.actor, event.target, event.details) == (
        "ops",
        sid,
        {
            "inserted": 3,
            "requested": 3,
            "first": format_utc(instants[0]),
            "last": format_utc(instants[2]),
            "reason": "the outage of 1 March",
            "skipped_purged": 0,
        },
    )
    [change] = await backend.ledger.schedule_changes(ScheduleChangesSince(head))
    assert (change.kind, change.version) == (ChangeKind.EXECUTIONS_ADDED, stored.version)
    assert await backend.ledger.executions_backfill(ExecutionsBackfill(sid, [], "ops")) == (
        Backfilled([])
    )
    assert len(await backend.ledger.audit_list(AuditQuery(action="schedule.backfill"))) == 1


async def test_backfill_over_runs_that_happened_inserts_nothing(backend: Backend) -> None:
    partition = 3
    [sid] = ids_in_partition(partition, 1, prefix="ran")
    await backend.ledger.schedules_create(SchedulesCreate([schedule(sid)]))
    fence = await own(backend, partition)
    at = (await backend.ledger.database_now()).replace(microsecond=0) - timedelta(minutes=5)
    ran, skipped, pending = at, at + timedelta(minutes=1), at + timedelta(minutes=2)
    await planned(backend, fence, [sid], ran)
    await planned(backend, fence, [sid], pending)
    catch_up = PlannedExecution(
        sid, "acme", "noop", skipped, ExecutionStatus.SKIPPED, error_code="catchup_window"
    )
    await backend.ledger.executions_plan(ExecutionsPlan(fence, [catch_up], []))
    await backend.ledger.executions_claim(
        ExecutionsClaim([fence], [execution_id(sid, ran)], 60, "n")
    )
    await backend.ledger.executions_complete(
        ExecutionsComplete([fence], [Completion(execution_id(sid, ran), 1, Outcome.SUCCEEDED)])
    )
    ids = [execution_id(sid, instant) for instant in (ran, skipped, pending)]
    before = [(await backend.ledger.executions_get(key)).execution for key in ids]
    head = await backend.ledger.schedule_changes_head()
    backfill = ExecutionsBackfill(sid, [ran, skipped, pending], "ops")
    assert await backend.ledger.executions_backfill(backfill) == Backfilled([])
    assert [(await backend.ledger.executions_get(key)).execution for key in ids] == before
    assert [e.status for e in before] == [
        ExecutionStatus.SUCCEEDED,
        ExecutionStatus.SKIPPED,
        ExecutionStatus.QUEUED,
    ]
    [event] = await backend.ledger.audit_list(AuditQuery(action="schedule.backfill"))
    assert (event.details["inserted"], event.details["requested"]) == (0, 3)
    assert await backend.ledger.schedule_changes(ScheduleChangesSince(head)) == []


async def test_backfill_refuses_future_naive_or_too_many_instants_and_changes_nothing(
    backend: Backend,
) -> None:
    [sid] = ids_in_partition(7, 1, prefix="bad")
    await backend.ledger.schedules_create(SchedulesCreate([schedule(sid)]))
    now = await backend.ledger.database_now()
    past = now - timedelta(hours=1)
    refused = [
        (ExecutionsBackfill(sid, [past, now + timedelta(hours=1)], "ops"), "later than"),
        (ExecutionsBackfill(sid, [past.replace(tzinfo=None)], "ops"), "UTC offset"),
        (
            ExecutionsBackfill(
                sid, [past - timedelta(seconds=n) for n in range(BATCH_ROWS_MAX + 1)], "ops"
            ),
            "at most",
        ),
        (ExecutionsBackfill(sid, [past], ""), "actor"),
        (ExecutionsBackfill(sid, [past], "ops", ""), "reason"),
    ]
    for params, match in refused:
        with pytest.raises(InvalidField, match=match):
            await backend.ledger.executions_backfill(params)
    with pytest.raises(NotFound):
        await backend.ledger.executions_backfill(ExecutionsBackfill("nope", [past], "ops"))
    page = await backend.ledger.executions_query(ExecutionsQuery(schedule_id=sid))
    assert page.items == []
    assert await backend.ledger.audit_list(AuditQuery()) == []
