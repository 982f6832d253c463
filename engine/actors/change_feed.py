"""Delivers schedule changes to the planners that own them, within about a second.

The feed keeps a watermark (the last change ``seq`` seen). It waits for a notification
(LISTEN/NOTIFY on Postgres) for at most ``poll_interval_s`` -- the polling fallback when a
notification is lost -- then reads every change past the watermark and tells the planner of
the change's partition, if this node runs one. The watermark is taken *before* any planner
loads, and a planner registers before it loads, so no change can fall between a planner's
snapshot and the feed.
"""

from __future__ import annotations

import logging
import random
from typing import Any, Protocol

import msgspec
import trio

from engine.actors.retry import retry_unavailable
from engine.errors import LedgerUnavailable
from engine.ledger.base import PAGE_SIZE_MAX, Ledger, ScheduleChangesSince

log = logging.getLogger("carillon.changes")


class ChangeSink(Protocol):
    def notify(self, partition_id: int, schedule_id: str) -> None: ...


class ChangeFeedConfig(msgspec.Struct, frozen=True):
    poll_interval_s: float


class ChangeFeedStatistics(msgspec.Struct, frozen=True):
    watermark: int
    delivered: int


class ChangeFeed:
    def __init__(
        self, config: ChangeFeedConfig, ledger: Ledger, sink: ChangeSink, rng: random.Random
    ) -> None:
        self.config = config
        self._ledger = ledger
        self._sink = sink
        self._rng = rng
        self.watermark = 0
        self._delivered = 0

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
            changes = await self._ledger.schedule_changes(
                ScheduleChangesSince(self.watermark, PAGE_SIZE_MAX)
            )
            for change in changes:
                self._sink.notify(change.partition_id, change.schedule_id)
                self.watermark = change.seq
            delivered += len(changes)
            if len(changes) < PAGE_SIZE_MAX:
                break
        self._delivered += delivered
        return delivered

    def statistics(self) -> ChangeFeedStatistics:
        return ChangeFeedStatistics(self.watermark, self._delivered)
