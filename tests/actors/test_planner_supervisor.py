"""The planner supervisor: one planner per owned partition, for as long as it is trusted."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any

import pytest
import trio
import trio.testing

from engine.actors import planner as planner_module
from engine.actors.clock_monitor import ClockMonitor
from engine.actors.forecast import BurstForecast, ForecastConfig
from engine.actors.partitions import PartitionTable
from engine.actors.planner import PlannerConfig
from engine.actors.planner_supervisor import PlannerSupervisor
from engine.actors.planning_gate import LOAD_HOLD_MAX_S, WRITES_IN_PARALLEL
from engine.core.hashing import partition_of
from engine.core.timetable import TimetableCache
from engine.ledger.memory import MemoryLedger
from engine.ledger.params import Fence, LeasesAcquire, SchedulesPlannable
from engine.model import Schedule
from engine.testing import FaultyLedger, SkewedClock
from tests.actors.harness import START, create, node_context


def load_of(*partitions: int) -> Callable[[tuple[Any, ...]], bool]:
    """A :class:`FaultyLedger` condition: a planner's load of one of ``partitions``."""

    def matches(args: tuple[Any, ...]) -> bool:
        params: SchedulesPlannable = args[0]
        return params.partition_id in partitions

    return matches


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
    # A planner's load held (shielded, like a call through the database bridge) until the
    # test lets it go.
    slow = FaultyLedger(ledger)
    load = slow.hold("schedules_plannable")
    table = PartitionTable()
    supervisor = PlannerSupervisor(
        PlannerConfig(lookahead_s=5, batch_max=100, catchup_grace_s=60),
        ctx=node_context(slow.as_ledger(), clock, table=table),
        cache=TimetableCache(),
        forecast=BurstForecast(ForecastConfig(5, 10_000, 60)),
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(supervisor.run)
        table.add(Fence(0, "n1", lease.fencing_token), trio.current_time() + 13)
        await load.reached.wait()  # the planner is loading, its call in flight
        await trio.sleep(14)  # its deadline passes meanwhile
        owned = table.get(0)
        assert owned is not None
        owned.extend(trio.current_time() + 13)  # the renewal that was in flight returns
        load.release()
        await trio.sleep(1)
        assert 0 in table  # still owned and trusted...
        assert [p.partition_id for p in supervisor.statistics().planners] == [0]  # ...and planned
        assert slow.calls["schedules_plannable"] == 2  # by a new planner
        assert not owned.stopped.is_set()
        nursery.cancel_scope.cancel()


def _supervisor(
    ledger: Any, clock: SkewedClock, table: PartitionTable
) -> tuple[PlannerSupervisor, ClockMonitor]:
    ctx = node_context(ledger, clock, table=table)
    supervisor = PlannerSupervisor(
        PlannerConfig(lookahead_s=5, batch_max=100, catchup_grace_s=60),
        ctx=ctx,
        cache=TimetableCache(),
        forecast=BurstForecast(ForecastConfig(5, 10_000, 60)),
    )
    return supervisor, ctx.monitor


async def _with_schedules_in_each_partition(
    ledger: MemoryLedger, partitions: int = 2, per_partition: int = 1
) -> None:
    """``per_partition`` every-minute schedules in each of ``partitions`` partitions."""
    ids: dict[int, list[str]] = {p: [] for p in range(partitions)}
    n = 0
    while any(len(group) < per_partition for group in ids.values()):
        group = ids[partition_of(f"s{n}", partitions)]
        if len(group) < per_partition:
            group.append(f"s{n}")
        n += 1
    await create(
        ledger,
        [
            Schedule(schedule_id=sid, tenant_id="t", cron_expr="* * * * *", task_type="noop")
            for group in ids.values()
            for sid in group
        ],
    )


async def _owning(ledger: MemoryLedger, table: PartitionTable, partitions: int = 2) -> None:
    leases = await ledger.leases_acquire(LeasesAcquire("n1", list(range(partitions)), 600))
    for lease in leases:
        table.add(Fence(lease.partition_id, "n1", lease.fencing_token), trio.current_time() + 590)


def _planned(supervisor: PlannerSupervisor) -> dict[int, int]:
    return {p.partition_id: p.planned for p in supervisor.statistics().planners}


@asynccontextmanager
async def _planning(
    ledger: MemoryLedger, view: Any, clock: SkewedClock, partitions: int = 2
) -> AsyncIterator[PlannerSupervisor]:
    """A clock monitor and a planner supervisor on ``view`` (the ledger as the planners see
    it), with every partition owned."""
    table = PartitionTable()
    supervisor, monitor = _supervisor(view, clock, table)
    async with trio.open_nursery() as nursery:
        await nursery.start(monitor.run)
        await nursery.start(supervisor.run)
        await _owning(ledger, table, partitions)
        yield supervisor
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize(
    ("held_s", "planned_meanwhile"),
    [
        pytest.param(LOAD_HOLD_MAX_S - 5, {0: 0, 1: 0}, id="held-until-the-load-is-done"),
        pytest.param(LOAD_HOLD_MAX_S + 1, {0: 1, 1: 0}, id="not-held-by-a-stuck-load"),
    ],
)
async def test_a_loaded_partition_plans_once_the_nodes_other_partitions_are_loaded(
    autojump_clock: trio.testing.MockClock, held_s: float, planned_meanwhile: dict[int, int]
) -> None:
    """A cold start loads everything before it plans: planning one partition while the rest
    still load shares the pool and the cores with them, and the node is ready later. A load
    that makes no progress for LOAD_HOLD_MAX_S holds the others back no longer."""
    clock = SkewedClock(START + timedelta(seconds=20))  # 00:00:50; both fire at 00:01:00
    ledger = MemoryLedger(clock=clock, partition_count=2)
    await _with_schedules_in_each_partition(ledger)
    slow = FaultyLedger(ledger)
    load = slow.hold("schedules_plannable", when=load_of(1))
    async with _planning(ledger, slow.as_ledger(), clock) as supervisor:
        await load.reached.wait()  # partition 1 is loading; partition 0 has loaded
        await trio.sleep(held_s)  # partition 0's fire is within the lookahead by now
        try:
            assert _planned(supervisor) == planned_meanwhile
        finally:
            load.release()  # else the held load would keep the test from ending
        await trio.sleep(1)
        assert _planned(supervisor) == {0: 1, 1: 1}


async def test_a_slow_load_that_keeps_reading_pages_holds_planning_back_until_it_is_done(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hold's bound is on a load making *no progress*: a big partition (here five pages
    of 6 s each) is loaded before anything is planned, however long it takes."""
    monkeypatch.setattr(planner_module, "LOAD_PAGE_SIZE", 1)
    clock = SkewedClock(START + timedelta(seconds=20))
    ledger = MemoryLedger(clock=clock, partition_count=2)
    await _with_schedules_in_each_partition(ledger, per_partition=4)
    slow = FaultyLedger(ledger)
    slow.delay("schedules_plannable", 6, when=load_of(1))  # each page of partition 1
    async with _planning(ledger, slow.as_ledger(), clock) as supervisor:
        await trio.sleep(29)  # partition 1's fifth (empty) page comes back at 30 s
        assert _planned(supervisor) == {0: 0, 1: 0}
        await trio.sleep(2)
        assert _planned(supervisor) == {0: 4, 1: 4}


async def test_only_a_few_planners_write_a_batch_at_a_time(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Sixteen partitions due at once: the planners take turns, leaving the rest of the
    pool to the dispatcher, and every fire is still planned."""
    clock = SkewedClock(START + timedelta(seconds=20))
    ledger = MemoryLedger(clock=clock, partition_count=16)
    await _with_schedules_in_each_partition(ledger, partitions=16)
    slow = FaultyLedger(ledger)
    slow.delay("executions_plan", 0.5)  # each batch write
    async with _planning(ledger, slow.as_ledger(), clock, partitions=16) as supervisor:
        await trio.sleep(15)
        assert _planned(supervisor) == dict.fromkeys(range(16), 1)
        assert slow.most_in_flight["executions_plan"] == WRITES_IN_PARALLEL
