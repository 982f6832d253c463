"""Retention: old finished executions of owned partitions go; dead letters and fresh ones stay."""

from __future__ import annotations

from datetime import timedelta

import trio

from engine.actors.partitions import PartitionTable
from engine.actors.retention import RetentionConfig, RetentionKeeper
from engine.ledger.base import (
    Completion,
    ExecutionsClaim,
    ExecutionsComplete,
    ExecutionsPlan,
    ExecutionsQuery,
    Fence,
    LeasesAcquire,
    Outcome,
    PlannedExecution,
    SchedulesCreate,
)
from engine.ledger.memory import MemoryLedger
from engine.model import ExecutionStatus, Schedule, execution_id
from engine.testing import ManualClock
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
        RetentionConfig(keep_s=7 * 86400, batch=4, batches_per_round=2), ledger, table
    )
    clock.advance(6 * 86400)
    assert await keeper.step() == 0  # not old enough yet
    clock.advance(2 * 86400)
    assert await keeper.step() == 8  # two batches of four per round
    assert await keeper.step() == 3
    remaining = (await ledger.executions_query(ExecutionsQuery())).items
    assert [e.status for e in remaining] == [ExecutionStatus.DEAD_LETTER]
    assert keeper.statistics().purged == 11
