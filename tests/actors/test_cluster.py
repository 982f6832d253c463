"""Whole nodes on the mock clock: planning exactly once through crashes, pauses, joins, skew."""

from __future__ import annotations

from collections import Counter
from datetime import datetime, timedelta

import msgspec
import pytest
import trio
import trio.testing

from engine.actors.announcements import ANNOUNCED_MAX
from engine.actors.lease_keeper import HAND_BACK_DRAIN_S
from engine.ledger.params import TaskTypesPut
from engine.model import CatchUpPolicy, ExecutionStatus, HandlerKind, Schedule, TaskType
from tests.actors import probe_handlers
from tests.actors.harness import (
    START,
    TEST_TENANTS,
    all_executions,
    cluster,
    create,
    expected_fires,
    make_schedules,
    within,
)
from tests.ledger.backends import put_noop_task_type

PLANNED_OR_RUN = {ExecutionStatus.QUEUED, ExecutionStatus.RUNNING, ExecutionStatus.SUCCEEDED}
PROBE = TaskType(
    name="probe",
    kind=HandlerKind.PYTHON,
    allowed_tenants=TEST_TENANTS,
    settings={"callable": "tests.actors.probe_handlers:probe"},
)
"""Records each start by execution id (``probe_handlers.RUNS``)."""


def probe_schedules(count: int, expression: str) -> list[Schedule]:
    return [
        msgspec.structs.replace(s, task_type="probe")
        for s in make_schedules(count, START, lambda n: (expression, "UTC"))
    ]


def count_ids(executions: list) -> Counter[tuple[str, object]]:  # type: ignore[type-arg]
    return Counter((e.schedule_id, e.planned_at) for e in executions)


async def test_three_nodes_plan_every_fire_of_a_day_exactly_once_and_ahead_of_time(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # 50 of each kind in the mix: about 17,000 fires over the day.
    schedules = make_schedules(350, START)
    async with cluster() as c:
        await create(c.ledger, schedules)
        for name in ("n1", "n2", "n3"):
            await c.start_node(name)
        await trio.sleep(24 * 3600)
        owners = c.owners()
    executions = await all_executions(c.ledger)
    end = START + timedelta(hours=24) - timedelta(minutes=1)
    window = within(executions, START, end)
    assert set(count_ids(window)) == expected_fires(schedules, START, end)
    assert max(count_ids(window).values()) == 1
    assert all(e.status in PLANNED_OR_RUN for e in window)
    # Durable before the instant: the lookahead wrote each one ahead of time.
    late = [e for e in window if e.enqueued_at is None or e.enqueued_at > e.planned_at]
    assert late == []
    # The partitions were shared out fairly (16 over 3 nodes: 6, 5, 5).
    assert sorted(len(p) for p in owners.values()) == [5, 5, 6]


async def test_a_crashed_nodes_partitions_move_within_ttl_and_missed_fires_follow_policy(
    autojump_clock: trio.testing.MockClock,
) -> None:
    policies = [CatchUpPolicy.ALL, CatchUpPolicy.LATEST, CatchUpPolicy.NONE]
    schedules = [
        msgspec.structs.replace(s, catch_up=policies[n % 3])
        for n, s in enumerate(make_schedules(300, START, lambda n: ("* * * * *", "UTC")))
    ]
    # A 30 s lease and a 5 s grace: a fire due just after the crash is missed, not just late.
    async with cluster(catchup_grace_s=5, lease_ttl_s=30) as c:
        await create(c.ledger, schedules)
        for name in ("n1", "n2", "n3"):
            await c.start_node(name)
        await trio.sleep(620)  # crash at 00:10:50, ten seconds before the next fire
        victim = c.nodes["n1"]
        lost = set(victim.node.table)
        assert lost
        victim.ledger.down = True  # the process is gone: nothing it does reaches the ledger
        victim.scope.cancel()
        del c.nodes["n1"]
        crashed_at = c.db_clock.now()
        await trio.sleep(30 + 10 + 1)  # TTL + renew interval
        survivors = set().union(*c.owners().values())
        assert survivors == set(range(16))
        await trio.sleep(600)
    executions = await all_executions(c.ledger)
    end = START + timedelta(minutes=20)
    window = within(executions, START, end)
    assert set(count_ids(window)) == expected_fires(schedules, START, end)
    assert max(count_ids(window).values()) == 1
    policy_of = {s.schedule_id: s.catch_up for s in schedules}
    skipped = [e for e in window if e.status is ExecutionStatus.SKIPPED]
    assert skipped, "the outage should have made some fires miss their grace"
    for execution in skipped:
        assert crashed_at < execution.planned_at < crashed_at + timedelta(seconds=41)
        expected_reason = {
            CatchUpPolicy.NONE: "catchup_none",
            CatchUpPolicy.LATEST: "catchup_latest_only",
        }.get(policy_of[execution.schedule_id])
        assert execution.error_code == expected_reason
    none_schedules = {s for s, p in policy_of.items() if p is CatchUpPolicy.NONE}
    assert any(e.schedule_id in none_schedules for e in skipped)


@pytest.mark.parametrize("stagger_s", [0.7, 1.6, 2.4])
async def test_a_crashed_nodes_partitions_are_owned_again_within_a_second_of_their_leases_expiring(
    autojump_clock: trio.testing.MockClock, stagger_s: float
) -> None:
    """Wherever in the survivors' 5 s cycles the crash lands, they notice the dead node's
    heartbeat and leases running out at once: RTO <= TTL + 1 s, not TTL + two cycles."""
    async with cluster() as c:  # lease and heartbeat TTL 15 s, cycles of 5 s
        for name in ("n1", "n2", "n3"):
            await c.start_node(name)
            await trio.sleep(stagger_s)  # the nodes' cycles out of step
        await trio.sleep(60)
        victim = max(c.nodes.values(), key=lambda sim: len(sim.node.table))
        lost = set(victim.node.table)
        assert lost
        victim.ledger.down = True
        victim.scope.cancel()
        del c.nodes[victim.node.config.node_id]
        crashed_at = trio.current_time()
        while lost - set().union(*c.owners().values()):
            await trio.sleep(0.05)
            assert trio.current_time() - crashed_at <= 15 + 1
        assert sorted(len(p) for p in c.owners().values()) == [8, 8]


async def test_a_node_whose_renewals_come_back_late_keeps_its_partitions(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Renewals that take 6 s (a starved node; TTL 15 s, trust window 13 s): each cycle starts
    5 s after the previous one *started* -- at once when it overran -- so every renewal
    returns inside the window the one before opened. Counted from the end of a cycle, the
    next returned 17 s after the last began: every planner stopped at 13 s and reloaded."""
    async with cluster() as c:  # lease TTL 15 s, margin 2 s, cycles of 5 s
        n1 = await c.start_node("n1")
        await trio.sleep(30)
        assert len(n1.node.table) == 16
        n1.ledger.delay("leases_renew", 6.0)
        for _ in range(240):
            await trio.sleep(0.5)
            assert len(n1.node.table) == 16
        statistics = n1.node.lease_keeper.statistics()
        assert (statistics.expired_locally, statistics.lost, statistics.acquired) == (0, 0, 16)


async def test_a_paused_node_is_fenced_off_and_steps_down_without_double_planning(
    autojump_clock: trio.testing.MockClock,
) -> None:
    schedules = make_schedules(200, START, lambda n: ("* * * * *", "UTC"))
    async with cluster() as c:
        await create(c.ledger, schedules)
        await c.start_node("n1")
        await c.start_node("n2")
        await trio.sleep(300)
        zombie = c.nodes["n1"]
        zombie.ledger.pause_at_next("executions_plan")
        await zombie.ledger.paused_in_flight.wait()
        await trio.sleep(60)  # far past the 15 s lease TTL: n2 takes every partition
        assert set(c.nodes["n2"].node.table) == set(range(16))
        resumed_at = len(zombie.ledger.history)
        zombie.ledger.resume()
        await trio.sleep(1)
        # The write it had in flight was refused, and it stopped planning that partition:
        # no plan of its succeeded after the pause. (Other calls sent meanwhile -- a fetch,
        # a completion -- may come back first, in whatever order the scheduler picks.)
        after = zombie.ledger.history[resumed_at:]
        plans = [call for call in after if call[0] == "executions_plan"]
        assert plans[0] == ("executions_plan", "lease-lost")
        assert all(outcome == "lease-lost" for _, outcome in plans)
        await trio.sleep(300)
        assert sorted(len(p) for p in c.owners().values()) == [8, 8]
    executions = await all_executions(c.ledger)
    end = START + timedelta(minutes=10)
    window = within(executions, START, end)
    assert set(count_ids(window)) == expected_fires(schedules, START, end)
    assert max(count_ids(window).values()) == 1
    assert all(e.status in PLANNED_OR_RUN for e in window)


async def test_a_joining_node_gets_its_share_without_a_planning_gap(
    autojump_clock: trio.testing.MockClock,
) -> None:
    schedules = make_schedules(400, START, lambda n: ("* * * * *", "UTC"))
    async with cluster() as c:
        await create(c.ledger, schedules)
        await c.start_node("n1")
        await c.start_node("n2")
        await trio.sleep(1800)
        await c.start_node("n3")
        await trio.sleep(60)
        assert sorted(len(p) for p in c.owners().values()) == [5, 5, 6]
        await trio.sleep(600)
    executions = await all_executions(c.ledger)
    end = START + timedelta(minutes=40)
    window = within(executions, START, end)
    assert set(count_ids(window)) == expected_fires(schedules, START, end)
    assert max(count_ids(window).values()) == 1
    late = [e for e in window if e.enqueued_at is None or e.enqueued_at > e.planned_at]
    assert late == []


@pytest.mark.parametrize("skew_s", [30.0, -30.0, 300.0])
async def test_a_node_whose_wall_clock_is_off_plans_and_runs_on_database_time(
    autojump_clock: trio.testing.MockClock, skew_s: float
) -> None:
    """The simulator found that pausing on a wrong wall clock left the node's partitions
    unplanned while it kept their leases (seed 6, ``--scenario skew``). Nothing that decides
    when a fire runs reads the wall clock, so the node plans on: on time, never early."""
    schedules = make_schedules(50, START, lambda n: ("* * * * *", "UTC"))
    async with cluster() as c:
        await put_noop_task_type(c.ledger)
        await create(c.ledger, schedules)
        node = await c.start_node("n1", skew_s=skew_s)
        await trio.sleep(15 * 60)
        stats = node.node.clock_monitor.statistics()
    assert stats.planning_allowed
    assert stats.offset_s == pytest.approx(-skew_s, abs=0.01)
    executions = await all_executions(c.ledger)
    end = START + timedelta(minutes=14)
    window = within(executions, START, end)
    assert set(count_ids(window)) == expected_fires(schedules, START, end)
    assert max(count_ids(window).values()) == 1
    assert {e.status for e in window} == {ExecutionStatus.SUCCEEDED}
    late = [e for e in window if e.enqueued_at is None or e.enqueued_at > e.planned_at]
    assert late == []
    early = [e for e in window if e.started_at is None or e.started_at < e.planned_at]
    assert early == []
    slowest = max((e.started_at - e.planned_at).total_seconds() for e in window)  # type: ignore[operator]
    assert slowest < 2


async def test_planning_pauses_while_the_database_time_cannot_be_measured(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A probe whose round trip is wider than the bound cannot place the database time
    within the bound: until one can, the node plans nothing."""
    schedules = make_schedules(20, START, lambda n: ("* * * * *", "UTC"))
    async with cluster() as c:
        await create(c.ledger, schedules)
        node = await c.start_node("n1", delays={"database_now": 3.0})  # 3 s round trips
        await trio.sleep(300)
        stats = node.node.clock_monitor.statistics()
        assert not stats.planning_allowed
        assert stats.reason == "no measurement yet"
        assert await all_executions(c.ledger) == []
        node.ledger.delay("database_now", 0)
        await trio.sleep(300)
        assert node.node.clock_monitor.statistics().planning_allowed
    executions = await all_executions(c.ledger)
    end = START + timedelta(minutes=10)
    window = within(executions, START, end)
    assert set(count_ids(window)) == expected_fires(schedules, START, end)
    # Missed while paused: the default catch-up policy (latest) ran the newest, recorded the rest.
    skipped = {e.error_code for e in window if e.status is ExecutionStatus.SKIPPED}
    assert skipped <= {"catchup_window", "catchup_latest_only"}


async def test_planning_pauses_while_the_database_clock_steps_until_the_samples_agree(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A step of the database's own clock makes the samples disagree: the corrected time is
    uncertain until the probe window holds only samples taken after the step."""
    async with cluster() as c:
        node = await c.start_node("n1")
        monitor = node.node.clock_monitor
        await trio.sleep(60)
        assert monitor.statistics().planning_allowed
        c.db_clock.jump(5)
        await trio.sleep(10)  # the next probe (every 10 s) sees the step
        stats = monitor.statistics()
        assert not stats.planning_allowed
        assert "unstable" in stats.reason
        await trio.sleep(50)  # five samples after the step
        assert monitor.statistics().planning_allowed
        assert monitor.statistics().spread_s == pytest.approx(0, abs=0.01)


async def test_a_database_outage_makes_nodes_step_down_and_recover_without_crashing(
    autojump_clock: trio.testing.MockClock,
) -> None:
    schedules = make_schedules(100, START, lambda n: ("* * * * *", "UTC"))
    async with cluster() as c:
        await create(c.ledger, schedules)
        for name in ("n1", "n2"):
            await c.start_node(name)
        await trio.sleep(300)
        for sim in c.nodes.values():
            sim.ledger.down = True  # every call fails: the database is unreachable
        await trio.sleep(300)
        assert c.owners() == {"n1": [], "n2": []}  # stepped down inside their trust windows
        outage_end = c.db_clock.now()
        for sim in c.nodes.values():
            sim.ledger.down = False
        await trio.sleep(300)
        assert sorted(len(p) for p in c.owners().values()) == [8, 8]
        for sim in c.nodes.values():
            assert sum(sim.node.supervisor.statistics().restarts.values()) == 0
    executions = await all_executions(c.ledger)
    end = START + timedelta(minutes=14)
    window = within(executions, START, end)
    assert set(count_ids(window)) == expected_fires(schedules, START, end)
    assert max(count_ids(window).values()) == 1
    # Five minutes down: fires missed by more than the grace are recorded as skipped, except
    # the newest of them (the default policy is latest); nothing is lost or doubled.
    skipped = [e for e in window if e.status is ExecutionStatus.SKIPPED]
    assert skipped
    assert all(e.planned_at < outage_end for e in skipped)
    assert {e.error_code for e in skipped} == {"catchup_latest_only"}


async def test_a_node_shutting_down_hands_its_partitions_over_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    schedules = make_schedules(100, START, lambda n: ("* * * * *", "UTC"))
    async with cluster() as c:
        await create(c.ledger, schedules)
        await c.start_node("n1")
        await c.start_node("n2")
        await trio.sleep(120)
        leaving = set(c.nodes["n1"].node.table)
        assert leaving
        c.nodes["n1"].scope.cancel()  # SIGTERM: graceful shutdown
        await trio.sleep(0.1)
        leases = {lease.partition_id: lease for lease in await c.ledger.leases_list()}
        assert all(leases[p].owner_id is None for p in leaving)  # released, not left to expire
        assert [n.node_id for n in await c.ledger.nodes_live()] == ["n2"]
        await trio.sleep(6)  # well under the 15 s TTL
        assert set(c.nodes["n2"].node.table) == set(range(16))
        del c.nodes["n1"]
        await trio.sleep(120)
    executions = await all_executions(c.ledger)
    end = START + timedelta(minutes=4)
    window = within(executions, START, end)
    assert set(count_ids(window)) == expected_fires(schedules, START, end)
    assert max(count_ids(window).values()) == 1
    late = [e for e in window if e.enqueued_at is None or e.enqueued_at > e.planned_at]
    assert late == []


async def test_a_survivor_starts_a_crashed_nodes_queued_executions_once_it_owns_them(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Taking a partition over fetches its startable executions at once, not at the
    dispatcher's fallback interval (5 s): failover RTO is the lease TTL, not TTL + 5 s."""
    schedules = make_schedules(200, START, lambda n: ("* * * * *", "UTC"))
    fire = START.replace(second=0) + timedelta(minutes=1)
    async with cluster() as c:
        await create(c.ledger, schedules)
        await c.start_node("n1")
        await c.start_node("n2")
        await trio.sleep((fire - c.db_clock.now()).total_seconds() - 2)  # planned, not run
        victim, survivor = c.nodes["n1"], c.nodes["n2"]
        lost = set(victim.node.table)
        assert lost
        victim.ledger.down = True
        victim.scope.cancel()
        del c.nodes["n1"]
        taken_at: dict[int, datetime] = {}
        with trio.move_on_after(60):
            while len(taken_at) < len(lost):
                for partition in lost & set(survivor.node.table):
                    taken_at.setdefault(partition, c.db_clock.now())
                await trio.sleep(0.05)
        assert set(taken_at) == lost
        await trio.sleep(30)
    moved = [
        e for e in await all_executions(c.ledger) if e.planned_at == fire and e.partition_id in lost
    ]
    assert moved
    for execution in moved:
        assert execution.started_at is not None
        assert execution.partition_id is not None
        assert execution.started_at - taken_at[execution.partition_id] < timedelta(seconds=1)


async def test_partitions_handed_to_a_joining_node_mid_burst_run_each_attempt_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A rebalance while attempts run: the partitions handed back are drained first -- the
    attempts already claimed there finish and are completed under the old fence -- so none
    is refused, left to its attempt lease, and run a second time."""
    probe_handlers.reset(run_s=2.0)
    schedules = probe_schedules(600, "* * * * *")
    fire = START.replace(second=0) + timedelta(minutes=2)
    async with cluster(workers=32) as c:
        await c.ledger.task_types_put(TaskTypesPut(PROBE))
        await create(c.ledger, schedules)
        await c.start_node("n1")
        await c.start_node("n2")
        # 600 runs of 2 s on 64 workers: the burst keeps every worker busy for ~20 s.
        await trio.sleep((fire - c.db_clock.now()).total_seconds() + 1)
        assert probe_handlers.RUNNING["type:probe"] > 0
        await c.start_node("n3")
        await trio.sleep(30)
        assert sorted(len(p) for p in c.owners().values()) == [5, 5, 6]
        released = c.nodes["n1"].node.lease_keeper.statistics().released
        released += c.nodes["n2"].node.lease_keeper.statistics().released
        assert released > 0, "the join should have moved partitions during the burst"
        await trio.sleep(120)
    executions = within(await all_executions(c.ledger), fire - timedelta(minutes=2), fire)
    assert len(executions) == 2 * 600
    assert all(e.status is ExecutionStatus.SUCCEEDED for e in executions)
    assert [e.execution_id for e in executions if e.attempt != 1] == []
    assert max(probe_handlers.RUNS.values()) == 1


async def test_a_hand_back_waits_for_running_attempts_at_most_its_drain_bound(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Handlers far longer than the drain bound: the joining node still gets its partitions
    within the bound (plus a lease cycle), and the attempts cut off by the hand-back run
    again under the same execution id once their attempt lease runs out."""
    probe_handlers.reset(run_s=40.0)
    probe = msgspec.structs.replace(
        PROBE,
        settings={**PROBE.settings, "timeout_s": 120},
        timeout_s=120,
    )
    schedules = probe_schedules(60, "0 * * * *")
    fire = START.replace(minute=0, second=0) + timedelta(hours=1)
    async with cluster(workers=64) as c:
        await c.ledger.task_types_put(TaskTypesPut(probe))
        await create(c.ledger, schedules)
        await c.start_node("n1")
        await trio.sleep((fire - c.db_clock.now()).total_seconds() + 1)
        assert probe_handlers.RUNNING["type:probe"] == 60
        await c.start_node("n2")
        # n1's membership view has n2 within a heartbeat interval (TTL/3 = 5 s), its next
        # lease cycle (5 s) hands back: it drains for at most the bound, releases, and n2
        # takes them within its next half-second cycle -- long before the 40 s handlers end.
        await trio.sleep(2 * 15 / 3 + HAND_BACK_DRAIN_S + 2 + 1)
        assert sorted(len(p) for p in c.owners().values()) == [8, 8]
        assert probe_handlers.RUNNING["type:probe"] == 60
        await trio.sleep(300)
    executions = within(await all_executions(c.ledger), fire - timedelta(minutes=1), fire)
    assert len(executions) == 60
    assert all(e.status is ExecutionStatus.SUCCEEDED for e in executions)
    rerun = {e.execution_id for e in executions if e.attempt > 1}
    assert rerun, "attempts cut off by the hand-back should have run again"
    assert rerun == {eid for eid, runs in probe_handlers.RUNS.items() if runs > 1}


async def test_a_slow_hand_back_never_lets_the_leases_it_keeps_pass_their_trust_window(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A hand-back that waits its whole drain bound (handlers far longer) while the node's
    other leases have a trust window shorter than that wait: renewals go on beside it, so
    the node keeps every lease it does not hand back (the hand-back once waited inside the
    renewal cycle, and a 3 s TTL's kept leases ran out of trust meanwhile)."""
    probe_handlers.reset(run_s=40.0)
    probe = msgspec.structs.replace(
        PROBE, settings={**PROBE.settings, "timeout_s": 120}, timeout_s=120
    )
    fire = START.replace(minute=0, second=0) + timedelta(hours=1)
    async with cluster(workers=64, lease_ttl_s=3, lease_safety_margin_s=0.5) as c:
        await c.ledger.task_types_put(TaskTypesPut(probe))
        await create(c.ledger, probe_schedules(60, "0 * * * *"))
        n1 = await c.start_node("n1")
        await trio.sleep((fire - c.db_clock.now()).total_seconds() + 1)
        assert probe_handlers.RUNNING["type:probe"] == 60
        await c.start_node("n2")
        await trio.sleep(30)
        statistics = n1.node.lease_keeper.statistics()
        assert sorted(len(p) for p in c.owners().values()) == [8, 8]
    # Each kept lease renewed throughout: none lost, expired or taken and given back again.
    assert (statistics.acquired, statistics.released) == (16, 8)
    assert (statistics.lost, statistics.expired_locally) == (0, 0)


async def test_a_node_shutting_down_mid_burst_lets_its_running_attempts_finish_first(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """SIGTERM during a burst (a deploy): the node claims nothing more, its workers finish
    the attempts already claimed and their completions are written, and only then does it
    stop and release its leases -- no attempt is cut off to run again elsewhere."""
    probe_handlers.reset(run_s=2.0)
    schedules = probe_schedules(600, "0 * * * *")
    fire = START.replace(minute=0, second=0) + timedelta(hours=1)
    async with cluster(workers=32) as c:
        await c.ledger.task_types_put(TaskTypesPut(PROBE))
        await create(c.ledger, schedules)
        await c.start_node("n1")
        await c.start_node("n2")
        await trio.sleep((fire - c.db_clock.now()).total_seconds() + 1)
        leaving = c.nodes["n1"]
        assert leaving.node.workers.statistics().busy > 0
        leaving.scope.cancel()  # SIGTERM: graceful shutdown
        await trio.sleep(10)
        assert set(c.nodes["n2"].node.table) == set(range(16))
        del c.nodes["n1"]
        await trio.sleep(120)
    executions = within(await all_executions(c.ledger), fire - timedelta(minutes=1), fire)
    assert len(executions) == 600
    assert all(e.status is ExecutionStatus.SUCCEEDED for e in executions)
    assert [e.execution_id for e in executions if e.attempt != 1] == []
    assert max(probe_handlers.RUNS.values()) == 1


async def test_fires_spread_over_the_lookahead_start_at_their_instant_not_at_the_next_fallback(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # Five schedules a second apart, each in its own planner's batch: each batch is announced
    # while an earlier fetch is still pending. The dispatcher kept only the earliest pending
    # announcement, so a later fire waited for the next fetch (1 s late every minute).
    schedules = make_schedules(5, START, lambda n: (f"{n} * * * * *", "UTC"))
    async with cluster() as c:
        await create(c.ledger, schedules)
        await c.start_node("n1")
        await trio.sleep(5 * 60)
    started = [e for e in await all_executions(c.ledger) if e.started_at is not None]
    assert len(started) >= 5 * 4
    late_s = max((e.started_at - e.planned_at).total_seconds() for e in started)
    assert 0 <= late_s < 0.1


async def test_announced_instants_are_bounded_and_the_overflow_is_counted(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with cluster() as c:
        sim = await c.start_node("n1")
        dispatcher = sim.node.dispatcher
        board = sim.node.announcements
        soon = (c.db_clock.now() + timedelta(minutes=10)).replace(microsecond=0)
        # Retry instants carry jitter: those within a tenth of a second share one fetch.
        for n in range(ANNOUNCED_MAX + 100):
            board.announce(soon + timedelta(seconds=n / 10))
            board.announce(soon + timedelta(seconds=n / 10, milliseconds=-30))
        # The last 100 tenths did not fit: both announcements of each were dropped.
        assert dispatcher.statistics().announcements_dropped == 2 * 100
        sim.scope.cancel()
