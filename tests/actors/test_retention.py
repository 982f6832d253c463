"""Retention: old finished executions of owned partitions go, dead letters only if configured,
fresh ones stay; the owner of partition 0 prunes the old schedule changes."""

from __future__ import annotations

from datetime import timedelta

import trio

from engine.actors.partitions import PartitionTable
from engine.actors.retention import RetentionConfig, RetentionKeeper
from engine.ledger.memory import MemoryLedger
from engine.ledger.params import (
    Completion,
    ExecutionsBackfill,
    ExecutionsClaim,
    ExecutionsComplete,
    ExecutionsPlan,
    ExecutionsQuery,
    Fence,
    LeasesAcquire,
    Outcome,
    PlannedExecution,
    ScheduleChangesSince,
    SchedulesCreate,
)
from engine.model import ExecutionStatus, Schedule, execution_id
from engine.testing import ManualClock
from tests.actors.harness import node_context
from tests.ledger.backends import START, ids_in_partition, put_noop_task_type


async def test_retention_removes_old_finished_executions_in_bounded_batches() -> None:
    clock = ManualClock(START)
    ledger = MemoryLedger(clock=clock, partition_count=8)
    sids = ids_in_partition(3, 12)
    await put_noop_task_type(ledger)
    await ledger.schedules_create(
        SchedulesCreate(
            [
                Schedule(schedule_id=s, tenant_id="t", cron_expr="* * * * *", task_type="noop")
                for s in sids
            ]
        )
    )
    [lease] = await ledger.leases_acquire(LeasesAcquire("n", [3], ttl_s=30 * 86400))
    fence = Fence(3, "n", lease.fencing_token)
    at = START - timedelta(minutes=1)
    await ledger.executions_plan(
        ExecutionsPlan(fence, [PlannedExecution(s, "t", "noop", at) for s in sids], [], None)
    )
    ids = [execution_id(s, at) for s in sids]
    claimed = await ledger.executions_claim(ExecutionsClaim([fence], ids, 60, "n"))
    outcomes = [Outcome.DEAD_LETTER] + [Outcome.SUCCEEDED] * 9 + [Outcome.SKIPPED] * 2
    await ledger.executions_complete(
        ExecutionsComplete(
            [fence],
            [
                Completion(c.execution_id, c.attempt, o)
                for c, o in zip(claimed, outcomes, strict=True)
            ],
        )
    )
    table = PartitionTable()
    table.add(fence, trusted_until=trio.current_time() + 3600)
    keeper = RetentionKeeper(
        RetentionConfig(keep_s=7 * 86400, batch=4, batches_per_round=2),
        ctx=node_context(ledger, clock, table=table),
    )
    clock.advance(6 * 86400)
    assert await keeper.step() == 0  # not old enough yet
    clock.advance(2 * 86400)
    assert await keeper.step() == 8  # two batches of four per round
    assert await keeper.step() == 3
    remaining = (await ledger.executions_query(ExecutionsQuery())).items
    assert [e.status for e in remaining] == [ExecutionStatus.DEAD_LETTER]
    assert keeper.statistics().purged == 11


async def _ledger_with_finished(
    clock: ManualClock, partition: int, outcomes: list[Outcome]
) -> tuple[MemoryLedger, Fence, list[str]]:
    """A ledger whose partition ``partition`` holds one execution finished with each outcome
    (a minute before the clock's start), leased to node "n" for a year."""
    ledger = MemoryLedger(clock=clock, partition_count=8)
    sids = ids_in_partition(partition, len(outcomes))
    await put_noop_task_type(ledger)
    await ledger.schedules_create(
        SchedulesCreate(
            [
                Schedule(schedule_id=s, tenant_id="t", cron_expr="* * * * *", task_type="noop")
                for s in sids
            ]
        )
    )
    [lease] = await ledger.leases_acquire(LeasesAcquire("n", [partition], ttl_s=365 * 86400))
    fence = Fence(partition, "n", lease.fencing_token)
    at = START - timedelta(minutes=1)
    await ledger.executions_plan(
        ExecutionsPlan(fence, [PlannedExecution(s, "t", "noop", at) for s in sids], [], None)
    )
    ids = [execution_id(s, at) for s in sids]
    claimed = await ledger.executions_claim(ExecutionsClaim([fence], ids, 60, "n"))
    await ledger.executions_complete(
        ExecutionsComplete(
            [fence],
            [
                Completion(c.execution_id, c.attempt, o)
                for c, o in zip(claimed, outcomes, strict=True)
            ],
        )
    )
    return ledger, fence, ids


async def test_dead_letters_are_kept_by_default_and_deleted_after_their_retention() -> None:
    clock = ManualClock(START)
    outcomes = [Outcome.DEAD_LETTER, Outcome.DEAD_LETTER, Outcome.SUCCEEDED]
    ledger, fence, ids = await _ledger_with_finished(clock, 3, outcomes)
    table = PartitionTable()
    table.add(fence, trusted_until=trio.current_time() + 3600)
    ctx = node_context(ledger, clock, table=table)
    keeping = RetentionKeeper(RetentionConfig(keep_s=86400), ctx=ctx)
    purging = RetentionKeeper(
        RetentionConfig(keep_s=86400, dead_letters_keep_s=30 * 86400, batch=1), ctx=ctx
    )
    clock.advance(2 * 86400)
    assert await keeping.step() == 1  # the succeeded one
    clock.advance(20 * 86400)
    assert await keeping.step() == 0
    assert await purging.step() == 0  # not old enough yet
    clock.advance(10 * 86400)
    assert await purging.step() == 2  # in batches of one
    assert (await ledger.executions_query(ExecutionsQuery())).items == []
    assert purging.statistics().dead_letters_purged == 2
    # Their fires are purged history: a backfill leaves them alone.
    result = await ledger.executions_backfill(
        ExecutionsBackfill(ids[0].split(":")[0], [START - timedelta(minutes=1)], "ops")
    )
    assert (result.inserted, result.skipped_purged) == ([], 1)


async def test_the_owner_of_partition_0_prunes_changes_older_than_their_retention() -> None:
    clock = ManualClock(START)
    ledger, fence, _ = await _ledger_with_finished(clock, 0, [Outcome.SUCCEEDED] * 3)
    elsewhere, other_fence, _ = await _ledger_with_finished(clock, 5, [Outcome.SUCCEEDED])
    config = RetentionConfig(changes_keep_s=7 * 86400, batch=2)
    owner_table, other_table = PartitionTable(), PartitionTable()
    owner_table.add(fence, trusted_until=trio.current_time() + 3600)
    other_table.add(other_fence, trusted_until=trio.current_time() + 3600)
    owner = RetentionKeeper(config, ctx=node_context(ledger, clock, table=owner_table))
    other = RetentionKeeper(config, ctx=node_context(elsewhere, clock, table=other_table))
    clock.advance(6 * 86400)
    await owner.step()
    assert len(await ledger.schedule_changes(ScheduleChangesSince(0))) == 3  # too young
    clock.advance(2 * 86400)
    await owner.step()
    await other.step()
    assert owner.statistics().changes_pruned == 3  # in batches of two
    assert await ledger.schedule_changes(ScheduleChangesSince(3)) == []
    assert other.statistics().changes_pruned == 0  # partition 0 is not its own
    assert len(await elsewhere.schedule_changes(ScheduleChangesSince(0))) == 1
