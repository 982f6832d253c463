"""What operators do through the ledger while a node runs: trigger, backfill, pause.

The node hears of them as of any schedule change (an ``executions_added`` change reloads the
schedule in its planner, which must plan on as before); the added executions run like
planned ones, and a pause stops a schedule's runs, skipping what was planned ahead.
"""

from __future__ import annotations

import itertools
from datetime import timedelta

import msgspec
import trio
import trio.testing

from engine.actors.dispatcher import FETCH_INTERVAL_S_DEFAULT
from engine.ledger.params import ExecutionsBackfill, ExecutionsTrigger, SchedulesUpdate
from engine.model import ExecutionStatus
from tests.actors.harness import START, all_executions, cluster, create, make_schedules


async def test_triggered_and_backfilled_runs_happen_beside_the_planned_fires(
    autojump_clock: trio.testing.MockClock,
) -> None:
    schedules = make_schedules(3, START, lambda n: ("* * * * *", "UTC"))
    every = [s.schedule_id for s in schedules]
    async with cluster() as c:
        await create(c.ledger, schedules)
        await c.start_node("n1")
        await trio.sleep(95)
        triggered = await c.ledger.executions_trigger(ExecutionsTrigger(every[0], "ops"))
        missed = START - timedelta(minutes=30, seconds=7)  # any past instant will do
        [backfilled] = (
            await c.ledger.executions_backfill(ExecutionsBackfill(every[1], [missed], "ops"))
        ).inserted
        await trio.sleep(300)
        executions = await all_executions(c.ledger)
    by_id = {e.execution_id: e for e in executions}
    for key in (triggered.execution_id, backfilled):
        assert by_id[key].status is ExecutionStatus.SUCCEEDED
    started = by_id[triggered.execution_id].started_at
    assert started is not None
    # Found by the dispatcher's next fetch at the latest.
    assert started - triggered.planned_at <= timedelta(seconds=FETCH_INTERVAL_S_DEFAULT + 1)
    # The planners plan on as before: one fire a minute for each schedule, none twice.
    planned = [e for e in executions if e.planned_at.second == 0 and e.planned_at > START]
    for sid in every:
        instants = sorted(e.planned_at for e in planned if e.schedule_id == sid)
        assert len(instants) == len(set(instants)) >= 6
        assert all(b - a == timedelta(minutes=1) for a, b in itertools.pairwise(instants))


async def test_pausing_a_schedule_on_a_running_node_stops_its_runs(
    autojump_clock: trio.testing.MockClock,
) -> None:
    schedules = make_schedules(2, START, lambda n: ("* * * * *", "UTC"))
    paused_id, other_id = (s.schedule_id for s in schedules)
    async with cluster() as c:
        await create(c.ledger, schedules)
        await c.start_node("n1")
        # 3 s before a fire: the planner (5 s lookahead) has queued it already.
        await trio.sleep(147)
        current = await c.ledger.schedules_get(paused_id)
        await c.ledger.schedules_update(
            SchedulesUpdate(msgspec.structs.replace(current, enabled=False), current.version)
        )
        paused_at = c.db_clock.now()
        await trio.sleep(300)
        executions = await all_executions(c.ledger)
    later = [e for e in executions if e.schedule_id == paused_id and e.planned_at > paused_at]
    # The fire planned ahead is skipped; none is planned after it.
    assert [(e.planned_at - paused_at, e.status, e.error_code) for e in later] == [
        (timedelta(seconds=3), ExecutionStatus.SKIPPED, "schedule_paused")
    ]
    others = [e for e in executions if e.schedule_id == other_id and e.planned_at > paused_at]
    assert len(others) >= 4
    assert {e.status for e in others if e.planned_at < paused_at + timedelta(minutes=4)} == {
        ExecutionStatus.SUCCEEDED
    }
