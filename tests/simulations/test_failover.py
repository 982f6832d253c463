"""Region failover in the simulator: the replica copy, its checkers, and a few fixed seeds.

The seeds are short runs (``days=0.02``) of the ``region`` scenario chosen because each
exercises one kind of cross-region delivery: attempts claimed in the lag window (2),
attempts in flight at the replica's copy (4), both (24); and one run of
``region-unfenced`` (6), which must pass while reporting the hazard.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import trio
import trio.testing

from engine.ledger.memory import MemoryLedger
from engine.ledger.params import (
    Fence,
    LeasesAcquire,
    RegionFailover,
    SchedulesCreate,
    SchedulesDelete,
    SchedulesList,
    TaskTypesPut,
)
from engine.model import Execution, ExecutionStatus, HandlerKind, Lease, Schedule, TaskType
from engine.testing.clock import ManualClock
from simulations import scenario
from simulations.check_failover import FailoverChecker, FailoverLog
from simulations.effects import Delivery
from simulations.leases import LeaseMonitor
from simulations.params import derive
from simulations.replica import replica_of
from simulations.runner import run_simulation
from simulations.scenarios import keep_a_node_in_the_active_region

ROOT = Path(__file__).resolve().parents[2]
T0 = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
DAYS = 0.02


def _schedule(schedule_id: str) -> Schedule:
    return Schedule(schedule_id=schedule_id, tenant_id="acme", cron_expr="* * * * *", task_type="t")


async def _ids(ledger: MemoryLedger) -> list[str]:
    return [s.schedule_id for s in (await ledger.schedules_list(SchedulesList())).items]


async def test_a_replica_is_a_copy_that_neither_side_writes_through() -> None:
    clock = ManualClock(T0)
    primary = MemoryLedger(clock=clock, partition_count=2, active_region="a")
    await primary.task_types_put(
        TaskTypesPut(TaskType(name="t", kind=HandlerKind.NOOP, allowed_tenants=("*",)))
    )
    await primary.schedules_create(SchedulesCreate([_schedule("s1")]))
    [lease] = await primary.leases_acquire(LeasesAcquire("n1", [0], 30.0, "a"))
    replica = replica_of(primary)
    assert replica._clock is primary._clock  # shared, not copied
    assert await _ids(replica) == ["s1"]
    assert await replica.leases_list() == await primary.leases_list()
    assert await replica.schedule_changes_head() == await primary.schedule_changes_head()

    await primary.schedules_create(SchedulesCreate([_schedule("s2")]))
    await replica.schedules_delete(SchedulesDelete("s1"))
    change = await replica.region_failover(RegionFailover("b", actor="sim"))
    assert await _ids(primary) == ["s1", "s2"]
    assert await _ids(replica) == []
    assert (await primary.cluster_get()).active_region == "a"
    assert change.settings.region_epoch == 2
    assert change.revoked == 1
    assert (await primary.leases_list())[0].owner_id == lease.owner_id
    assert (await replica.leases_list())[0].owner_id is None
    assert await primary.schedule_changes_head() == 2
    assert await replica.schedule_changes_head() == 2  # its own second change: the delete


async def test_a_replica_feed_wakes_only_its_own_waiters(
    autojump_clock: trio.testing.MockClock,
) -> None:
    primary = MemoryLedger(clock=ManualClock(T0), partition_count=1)
    await primary.task_types_put(
        TaskTypesPut(TaskType(name="t", kind=HandlerKind.NOOP, allowed_tenants=("*",)))
    )
    woken: list[bool] = []
    async with trio.open_nursery() as nursery:

        async def wait_on_primary() -> None:
            woken.append(await primary.schedule_changes_wait(0, 5.0))

        nursery.start_soon(wait_on_primary)
        await trio.sleep(1.0)  # parked on the primary's feed
        replica = replica_of(primary)
        await replica.schedules_create(SchedulesCreate([_schedule("s1")]))
        assert await replica.schedule_changes_wait(0, 0.1)
    assert woken == [False]  # the write to the replica did not reach the primary's waiter


# -- the checkers have teeth ------------------------------------------------------------------


def _failover(*, fenced: bool = True) -> scenario.RegionFailover:
    return scenario.RegionFailover(300.0, 5.0, 60.0, ("n2",), fenced)


def _delivery(node: str, attempt: int, started_s: float) -> Delivery:
    return Delivery(
        execution_id="s0:2026-05-01T12:05:00Z",
        schedule_id="s0",
        planned_at=T0 + timedelta(seconds=295),
        attempt=attempt,
        fencing_token=attempt,
        node=node,
        started_at=T0 + timedelta(seconds=started_s),
        fate="ok",
    )


def _running(attempt: int, expires_s: float) -> Execution:
    return Execution(
        execution_id="s0:2026-05-01T12:05:00Z",
        schedule_id="s0",
        tenant_id="acme",
        task_type="sim",
        planned_at=T0 + timedelta(seconds=295),
        status=ExecutionStatus.RUNNING,
        attempt=attempt,
        attempt_expires_at=T0 + timedelta(seconds=expires_s),
        partition_id=0,
    )


def _check(
    log: FailoverLog, deliveries: list[Delivery], claims: dict[int, float], fenced: bool = True
) -> list[str]:
    """The violations found, given region A's claims on the old primary (attempt: +s)."""
    params = replace(derive(1, "region", nodes=2, days=DAYS), start=T0)
    checker = FailoverChecker(params, _failover(fenced=fenced), log, {"n1": "a", "n2": "b"})
    execution_id = deliveries[0].execution_id
    at = {(execution_id, a): T0 + timedelta(seconds=s) for a, s in claims.items()}
    return checker.check(deliveries, at, [], 0).violations


def test_the_failover_checker_classifies_cross_region_deliveries_and_finds_bad_ones() -> None:
    log = FailoverLog(happened=True, epoch=2)
    # Claimed in the lag window (the copy at +295 has no attempt): a duplicate, allowed.
    ok = _check(log, [_delivery("n1", 1, 297.0), _delivery("n2", 1, 310.0)], {1: 297.0})
    assert ok == []
    # In flight at the copy, its lease ran to +320; region B re-ran it at +310: too early.
    log.snapshot = {"s0:2026-05-01T12:05:00Z": _running(1, 320.0)}
    early = _check(log, [_delivery("n1", 1, 290.0), _delivery("n2", 2, 310.0)], {1: 290.0})
    assert len(early) == 1
    assert "before the attempt lease" in early[0]
    # Region A acted on a claim made after the failover (while the old primary was down).
    log.snapshot = {}
    late = _check(log, [_delivery("n1", 1, 330.0), _delivery("n2", 1, 310.0)], {1: 330.0})
    assert len(late) == 1
    assert "after the failover" in late[0]
    # ... which is the documented hazard once an unfenced old primary is back (+360).
    hazard = _check(
        log, [_delivery("n1", 1, 370.0), _delivery("n2", 1, 310.0)], {1: 370.0}, fenced=False
    )
    assert hazard == []
    # Region B delivered what the copy had finished.
    log.snapshot = {
        "s0:2026-05-01T12:05:00Z": Execution(
            execution_id="s0:2026-05-01T12:05:00Z",
            schedule_id="s0",
            tenant_id="acme",
            task_type="sim",
            planned_at=T0 + timedelta(seconds=295),
            status=ExecutionStatus.SUCCEEDED,
            attempt=1,
            partition_id=0,
        )
    }
    done = _check(log, [_delivery("n2", 2, 310.0)], {})
    assert len(done) == 1
    assert "had finished" in done[0]


def test_fencing_is_judged_per_database_and_tokens_across_databases() -> None:
    monitor = LeaseMonitor(partitions=1)
    until = T0 + timedelta(seconds=30)
    monitor.acquired(Lease(partition_id=0, owner_id="n1", fencing_token=7, expires_at=until), T0)
    monitor.copy_database("a", "b")
    monitor.revoked_all("b")
    epoch_2 = (1 << 32) + 1
    monitor.acquired(
        Lease(partition_id=0, owner_id="n2", fencing_token=epoch_2, expires_at=until), T0, "b"
    )
    monitor.write_accepted("n1#1", "executions_plan", [Fence(0, "n1", 7)], T0, "a")
    monitor.write_accepted("n2#1", "executions_plan", [Fence(0, "n2", epoch_2)], T0, "b")
    assert monitor.violations == []  # each holds the lease in its own database
    monitor.fenced.add("a")
    monitor.write_accepted("n1#1", "executions_claim", [Fence(0, "n1", 7)], T0, "a")
    assert "accepted by the fenced database a" in monitor.violations[-1]
    later = until + timedelta(seconds=1)
    monitor.acquired(Lease(partition_id=0, owner_id="n1", fencing_token=8, expires_at=later), later)
    assert "below another database's" in monitor.violations[-1]
    monitor = LeaseMonitor(partitions=1)
    monitor.copy_database("a", "b")
    monitor.acquired(
        Lease(partition_id=0, owner_id="n2", fencing_token=epoch_2, expires_at=T0), T0, "b"
    )
    monitor.unfenced_return = "a"
    monitor.acquired(Lease(partition_id=0, owner_id="n1", fencing_token=8, expires_at=T0), T0, "a")
    assert monitor.violations == []
    assert monitor.stale_epoch_acquisitions == 1


def test_random_keeps_a_node_in_the_active_region_around_a_failover() -> None:
    drawn = scenario.RegionFailover(500.0, 2.0, None, ("n2",))
    faults: list[scenario.Fault] = [
        scenario.Leave(100.0, "n1"),  # the only node of region A before the failover
        scenario.Join(550.0, "n5"),  # a new node joins region B
        scenario.Leave(600.0, "n2"),  # fine: n5 stays
        scenario.Leave(700.0, "n5"),  # the last of region B
        scenario.Leave(800.0, "n1"),  # region A's, after the failover: harmless
    ]
    kept = keep_a_node_in_the_active_region(("n1", "n2"), faults, drawn)
    assert [(type(f).__name__, f.at_s) for f in kept] == [
        ("Join", 550.0),
        ("Leave", 600.0),
        ("Leave", 800.0),
    ]


# -- whole runs -----------------------------------------------------------------------------


def test_region_seeds_pass_with_duplicates_only_inside_the_window() -> None:
    seen = {"lag": 0, "in_flight": 0}
    for seed in (2, 4, 24):
        result = run_simulation(derive(seed, "region", days=DAYS))
        assert result.ok, result.violations
        report = result.failover
        assert report is not None
        assert report.epoch == 2
        seen["lag"] += report.lag_window
        seen["in_flight"] += report.in_flight
    assert seen["lag"] > 0
    assert seen["in_flight"] > 0


def test_an_unfenced_old_primary_doubles_deliveries_under_the_same_keys() -> None:
    result = run_simulation(derive(6, "region-unfenced", days=DAYS))
    assert result.ok, result.violations  # the hazard is reported, not failed
    report = result.failover
    assert report is not None
    assert report.after_return > 0
    assert result.fires.repeat_deliveries > 0
    assert not any("duplicate effect" in v for v in result.violations)
    assert result.fires.stale_token_deliveries > 0  # a fencing-aware receiver refuses them


def test_a_region_seed_replays_with_the_same_trace_in_another_process() -> None:
    here = run_simulation(derive(24, "region", days=0.01))
    assert here.failover is not None
    assert here.failover.epoch == 2
    command = ["-m", "simulations", "run", "--seed", "24", "--scenario", "region", "--days", "0.01"]
    completed = subprocess.run(
        [sys.executable, *command],
        cwd=ROOT,
        env={**os.environ, "PYTHONHASHSEED": "4242"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert f"hash {here.digest}" in completed.stdout, completed.stdout[-2000:]
