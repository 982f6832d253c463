"""Delivers schedule changes to the planners that own them, within about a second.

The feed keeps a watermark (the last change ``seq`` seen). It waits for a notification
(LISTEN/NOTIFY on Postgres) for at most ``poll_interval_s`` -- the polling fallback when a
notification is lost -- then reads every change past the watermark and tells the planner of
the change's partition, if this node runs one. The watermark is taken *before* any planner
loads, and a planner registers before it loads, so no change can fall between a planner's
snapshot and the feed.

The feed is pruned (the retention keeper removes changes older than a window of days). A
node whose watermark fell below the pruned changes -- paused or partitioned for longer than
the window -- is told so by the ledger (:class:`~engine.errors.ChangesPruned`) instead of
silently missing changes: the feed takes the current head as its watermark, then asks every
planner to reload its partition from the schedules table (and the dispatcher to fetch, as a
missed ``executions_added`` change would have), logs a warning and counts it
(``carillon_change_feed_gap_reloads_total``). Watermark first, reload after: as at start.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

import msgspec
import trio

from engine.actors.context import NodeContext
from engine.actors.retry import retry_unavailable
from engine.errors import ChangesPruned, LedgerUnavailable
from engine.ledger.params import PAGE_SIZE_MAX, ScheduleChangesSince

log = logging.getLogger("carillon.changes")


class ChangeSink(Protocol):
    def notify(self, partition_id: int, schedule_id: str) -> None: ...

    def reload_all(self) -> None:
        """Changes may have been missed: reload everything derived from the feed."""
        ...


class ChangeFeedConfig(msgspec.Struct, frozen=True):
    poll_interval_s: float


class ChangeFeedStatistics(msgspec.Struct, frozen=True):
    watermark: int
    delivered: int
    gap_reloads: int = 0
    """Times the watermark was found below the pruned changes (planners reloaded)."""


class ChangeFeed:
    def __init__(
        self,
        config: ChangeFeedConfig,
        *,
        ctx: NodeContext,
        sink: ChangeSink,
    ) -> None:
        self.config = config
        self._ledger = ctx.ledger
        self._sink = sink
        self._rng = ctx.rng
        self._metrics = ctx.metrics
        self.watermark = 0
        self._delivered = 0
        self._gap_reloads = 0

    async def run(self, *, task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
        self.watermark = await retry_unavailable(
            self._ledger.schedule_changes_head, rng=self._rng, log=log, what="change feed head"
        )
        task_status.started()
        while True:
            try:
                await self._ledger.schedule_changes_wait(
                    self.watermark, self.config.poll_interval_s
                )
                await self.step()
            except LedgerUnavailable as exc:
                log.warning("change feed: %s", exc)
                await trio.sleep(self.config.poll_interval_s)

    async def step(self) -> int:
        """Deliver every change past the watermark; returns how many."""
        delivered = 0
        while True:
            try:
                changes = await self._ledger.schedule_changes(
                    ScheduleChangesSince(self.watermark, PAGE_SIZE_MAX)
                )
            except ChangesPruned as exc:
                await self._reload_after_gap(exc)
                continue
            for change in changes:
                self._sink.notify(change.partition_id, change.schedule_id)
                self.watermark = change.seq
            delivered += len(changes)
            if len(changes) < PAGE_SIZE_MAX:
                break
        self._delivered += delivered
        return delivered

    async def _reload_after_gap(self, gap: ChangesPruned) -> None:
        """Skip to the head, then have the planners reload what the lost changes said."""
        head = await self._ledger.schedule_changes_head()
        log.warning(
            "change feed: watermark %d is below the pruned changes (through %d); planners "
            "reload their partitions, feed resumes at %d",
            self.watermark,
            gap.pruned_through,
            head,
        )
        self.watermark = max(head, gap.pruned_through, self.watermark)
        self._gap_reloads += 1
        self._metrics.change_feed_gap()
        self._sink.reload_all()

    def statistics(self) -> ChangeFeedStatistics:
        return ChangeFeedStatistics(self.watermark, self._delivered, self._gap_reloads)
