"""The planner supervisor: one planner per owned partition, for as long as it is trusted."""

from __future__ import annotations

import random
from typing import Any

import trio
import trio.testing

from engine.actors.clock_monitor import ClockMonitor, ClockMonitorConfig
from engine.actors.forecast import BurstForecast, ForecastConfig
from engine.actors.partitions import PartitionTable
from engine.actors.planner import PlannerConfig
from engine.actors.planner_supervisor import PlannerSupervisor
from engine.core.timetable import TimetableCache
from engine.ledger.base import Fence, LeasesAcquire, PlannableSchedule, SchedulesPlannable
from engine.ledger.memory import MemoryLedger
from engine.metrics import NodeMetrics
from engine.testing import SkewedClock
from tests.actors.harness import START


class SlowLoads:
    """The ledger, with ``schedules_plannable`` (a planner's load) held (shielded, like a
    call through the database bridge) until the test lets it go."""

    def __init__(self, inner: MemoryLedger) -> None:
        self._inner = inner
        self.held = trio.Event()
        self.release = trio.Event()
        self.loads = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def schedules_plannable(self, params: SchedulesPlannable) -> list[PlannableSchedule]:
        self.loads += 1
        with trio.CancelScope(shield=True):
            self.held.set()
            await self.release.wait()
        return await self._inner.schedules_plannable(params)


async def test_a_planner_stopped_by_its_deadline_resumes_when_a_late_renewal_extended_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Found by the simulator (seed 238): with a slow database, a planner's trust deadline
    passed while a renewal was in flight; the renewal then extended the window, so the
    planner, on its way out, neither dropped the partition nor was replaced. The lease stayed
    owned and renewed, and nothing planned the partition for minutes."""
    clock = SkewedClock(START)
    ledger = MemoryLedger(clock=clock, partition_count=1)
    [lease] = await ledger.leases_acquire(LeasesAcquire("n1", [0], 15))
    slow = SlowLoads(ledger)
    table = PartitionTable()
    rng = random.Random(1)
    supervisor = PlannerSupervisor(
        PlannerConfig(lookahead_s=5, batch_max=100, catchup_grace_s=60),
        slow,  # type: ignore[arg-type]
        ClockMonitor(ClockMonitorConfig(bound_s=2, interval_s=5), ledger, clock, rng),
        TimetableCache(),
        table,
        rng,
        BurstForecast(ForecastConfig(5, 10_000, 60)),
        metrics=NodeMetrics(),
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(supervisor.run)
        table.add(Fence(0, "n1", lease.fencing_token), trio.current_time() + 13)
        await slow.held.wait()  # the planner is loading, its call in flight
        await trio.sleep(14)  # its deadline passes meanwhile
        owned = table.get(0)
        assert owned is not None
        owned.extend(trio.current_time() + 13)  # the renewal that was in flight returns
        slow.release.set()
        await trio.sleep(1)
        assert 0 in table  # still owned and trusted...
        assert [p.partition_id for p in supervisor.statistics().planners] == [0]  # ...and planned
        assert slow.loads == 2  # by a new planner
        assert not owned.stopped.is_set()
        nursery.cancel_scope.cancel()
