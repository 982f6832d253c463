"""The change feed: a node that fell behind the pruned changes reloads instead of missing them."""

from __future__ import annotations

from datetime import timedelta

import trio
import trio.testing

from engine.actors.change_feed import ChangeFeed, ChangeFeedConfig
from engine.actors.forecast import BurstForecast, ForecastConfig
from engine.actors.planner import PlannerConfig
from engine.actors.planner_supervisor import PlannerSupervisor
from engine.core.timetable import TimetableCache
from engine.ledger.memory import MemoryLedger
from engine.ledger.params import (
    ExecutionsQuery,
    Fence,
    LeasesAcquire,
    ScheduleChangesPrune,
    SchedulesCreate,
    SchedulesUpdate,
)
from engine.metrics import NodeMetrics
from engine.model import Schedule
from engine.testing import SkewedClock
from tests.actors.harness import START, create, node_context


class Recorder:
    """A change sink that remembers what it was told."""

    def __init__(self) -> None:
        self.notified: list[tuple[int, str]] = []
        self.reloads = 0

    def notify(self, partition_id: int, schedule_id: str) -> None:
        self.notified.append((partition_id, schedule_id))

    def reload_all(self) -> None:
        self.reloads += 1


def every_minute(schedule_id: str, *, enabled: bool = True) -> Schedule:
    return Schedule(
        schedule_id=schedule_id,
        tenant_id="t",
        cron_expr="* * * * *",
        task_type="noop",
        enabled=enabled,
    )


async def test_a_feed_behind_the_pruned_changes_reloads_once_and_resumes_at_the_head(
    autojump_clock: trio.testing.MockClock,
) -> None:
    clock = SkewedClock(START)
    ledger = MemoryLedger(clock=clock, partition_count=1)
    await create(ledger, [every_minute("seen")])
    sink = Recorder()
    metrics = NodeMetrics()
    ctx = node_context(ledger, clock, metrics=metrics)
    feed = ChangeFeed(ChangeFeedConfig(1.0), ctx=ctx, sink=sink)
    assert await feed.step() == 1  # "seen" was delivered: watermark 1
    await ledger.schedules_create(SchedulesCreate([every_minute("lost-1"), every_minute("lost-2")]))
    await trio.sleep(10)
    cutoff = await ledger.database_now()
    assert await ledger.schedule_changes_prune(ScheduleChangesPrune(cutoff)) == 3
    await ledger.schedules_create(SchedulesCreate([every_minute("kept")]))
    # Behind the pruned changes: skip to the head (the reload reads "kept" from the
    # schedules table, like every lost change), then reload.
    assert await feed.step() == 0
    assert sink.reloads == 1
    assert sink.notified == [(0, "seen")]
    assert feed.watermark == await ledger.schedule_changes_head() == 4
    assert feed.statistics().gap_reloads == 1
    assert metrics.registry.get_sample_value("carillon_change_feed_gap_reloads_total") == 1
    await ledger.schedules_create(SchedulesCreate([every_minute("after")]))
    assert await feed.step() == 1  # caught up: delivered as usual, no second reload
    assert sink.notified == [(0, "seen"), (0, "after")]
    assert sink.reloads == 1


async def test_planners_reload_the_changes_a_stalled_feed_lost_to_pruning(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A node whose feed was stalled past the change retention: the pause of one schedule and
    the creation of another were pruned before it read them. Without the reload its planner
    would go on planning the paused schedule and never plan the new one."""
    clock = SkewedClock(START)
    ledger = MemoryLedger(clock=clock, partition_count=1)
    await create(ledger, [every_minute("paused-later")])
    ctx = node_context(ledger, clock)
    monitor, table = ctx.monitor, ctx.table
    supervisor = PlannerSupervisor(
        PlannerConfig(lookahead_s=5, batch_max=100, catchup_grace_s=60),
        ctx=ctx,
        cache=TimetableCache(),
        forecast=BurstForecast(ForecastConfig(5, 10_000, 60)),
    )
    feed = ChangeFeed(ChangeFeedConfig(1.0), ctx=ctx, sink=supervisor)
    async with trio.open_nursery() as nursery:
        await nursery.start(monitor.run)
        await nursery.start(supervisor.run)
        feed.watermark = await ledger.schedule_changes_head()  # watermark first, as at start
        [lease] = await ledger.leases_acquire(LeasesAcquire("n1", [0], 3600))
        table.add(Fence(0, "n1", lease.fencing_token), trio.current_time() + 3500)
        await trio.sleep(60)
        [held] = supervisor.statistics().planners
        assert held.schedules == 1
        # The feed is stalled: these changes are written, then pruned, unread.
        stored = await ledger.schedules_get("paused-later")
        await ledger.schedules_update(
            SchedulesUpdate(every_minute("paused-later", enabled=False), stored.version)
        )
        await ledger.schedules_create(SchedulesCreate([every_minute("created-later")]))
        now = await ledger.database_now()
        await ledger.schedule_changes_prune(ScheduleChangesPrune(now + timedelta(seconds=1)))
        await feed.step()
        await trio.sleep(120)
        [reloaded] = supervisor.statistics().planners
        assert reloaded.schedules == 1  # "created-later" only
        page = await ledger.executions_query(ExecutionsQuery(schedule_id="created-later"))
        assert len(page.items) >= 2
        nursery.cancel_scope.cancel()
    assert feed.statistics().gap_reloads == 1
