"""The overlap guard on its own: one popped batch is judged in the order its executions were
planned, whatever order the queue popped them in."""

from __future__ import annotations

from datetime import timedelta

import trio
import trio.testing

from engine.actors.attempts import OVERLAP, Attempt
from engine.actors.overlap import OverlapGuard
from engine.actors.partitions import PartitionTable
from engine.actors.schedule_cache import ScheduleCache
from engine.core.fair_queue import FairQueue
from engine.ledger.memory import MemoryLedger
from engine.ledger.params import (
    ExecutionsPlan,
    ExecutionsQuery,
    Fence,
    LeasesAcquire,
    PlannedExecution,
    SchedulesCreate,
    TaskTypesPut,
)
from engine.model import Execution, ExecutionStatus, HandlerKind, OverlapPolicy, Schedule, TaskType
from engine.testing import SkewedClock
from tests.actors.harness import START, node_context

SLOW = TaskType(
    name="slow", kind=HandlerKind.NOOP, allowed_tenants=("*",), overlap=OverlapPolicy.SKIP
)


async def test_of_two_fires_of_a_skip_schedule_popped_together_the_earlier_starts(
    autojump_clock: trio.testing.MockClock,
) -> None:
    clock = SkewedClock(START)
    ledger = MemoryLedger(clock=clock, partition_count=1)
    await ledger.task_types_put(TaskTypesPut(SLOW))
    schedule = Schedule(
        schedule_id="report", tenant_id="acme", cron_expr="* * * * *", task_type="slow"
    )
    await ledger.schedules_create(SchedulesCreate([schedule]))
    [lease] = await ledger.leases_acquire(LeasesAcquire("n1", [0], 60))
    fence = Fence(0, "n1", lease.fencing_token)
    table = PartitionTable()
    table.add(fence, trio.current_time() + 60)
    # A fire whose attempt was cut off and re-queued, and the schedule's next fire.
    fires = [START, START + timedelta(minutes=1)]
    planned = [PlannedExecution("report", "acme", "slow", at) for at in fires]
    await ledger.executions_plan(ExecutionsPlan(fence, planned, []))
    page = await ledger.executions_query(ExecutionsQuery(schedule_id="report", limit=10))
    earlier, later = sorted(page.items, key=lambda e: e.planned_at)

    guard = OverlapGuard(
        ctx=node_context(ledger, clock, table=table),
        schedules=ScheduleCache(ledger, clock, ttl_s=10),
        queue=FairQueue[Execution](),
        task_type={SLOW.name: SLOW}.get,
    )
    attempts = [Attempt(later), Attempt(earlier)]
    admitted = await guard.admit(attempts)

    assert [a.execution.execution_id for a in admitted] == [earlier.execution_id]
    assert admitted[0].held == (OVERLAP,)  # its schedule's slot, until its run ends
    stored = {
        e.planned_at: e
        for e in (
            await ledger.executions_query(ExecutionsQuery(schedule_id="report", limit=10))
        ).items
    }
    assert stored[later.planned_at].status is ExecutionStatus.SKIPPED
    assert stored[later.planned_at].error_code == "overlap"
    assert stored[earlier.planned_at].status is ExecutionStatus.QUEUED
