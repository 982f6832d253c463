"""Removes old history in bounded batches: finished executions of the partitions this node
owns, old dead letters if so configured, and old schedule changes.

A busy cluster writes hundreds of millions of ledger rows a day; without retention the table
and its indexes grow without end. Every ``interval_s`` the keeper deletes, for each owned
partition, succeeded and skipped executions that finished more than ``keep_s`` ago (seven
days by default), ``batch`` rows per fenced call and at most ``batches_per_round`` calls per
partition per round, so it never competes for long with planning. Dead letters are kept
until they are replayed or explicitly purged -- unless ``dead_letters_keep_s`` is set, when
those that became dead letters longer ago than that go the same way. Every removed
execution leaves its schedule's purge horizon behind, so a backfill never runs it again.

The schedule change feed is pruned of changes older than ``changes_keep_s`` (seven days by
default: far beyond any pause a node survives with its planners intact) by the node that
owns partition 0, so that one node does it; a node whose feed fell behind the pruned part
reloads its planners (:mod:`engine.actors.change_feed`). Every cutoff is computed from the
database's clock, like every expiry.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any, Final

import msgspec
import trio

from engine.actors.context import NodeContext
from engine.actors.retry import repeat_every
from engine.config import CHANGE_RETENTION_DAYS_DEFAULT, DAY_S, RETENTION_DAYS_DEFAULT
from engine.errors import LeaseLost
from engine.ledger.params import ExecutionsPurge, ScheduleChangesPrune

log = logging.getLogger("carillon.retention")

RETENTION_INTERVAL_S_DEFAULT: Final = 300.0
RETENTION_BATCH_DEFAULT: Final = 5_000
RETENTION_BATCHES_PER_ROUND_DEFAULT: Final = 20
CHANGES_PRUNER_PARTITION: Final = 0
"""The owner of this partition prunes the change feed (one node at a time, usually)."""


class RetentionConfig(msgspec.Struct, frozen=True):
    keep_s: float = RETENTION_DAYS_DEFAULT * DAY_S
    interval_s: float = RETENTION_INTERVAL_S_DEFAULT
    batch: int = RETENTION_BATCH_DEFAULT
    batches_per_round: int = RETENTION_BATCHES_PER_ROUND_DEFAULT
    dead_letters_keep_s: float | None = None
    """Dead letters finished longer ago than this are deleted; ``None``: kept forever."""
    changes_keep_s: float = CHANGE_RETENTION_DAYS_DEFAULT * DAY_S
    """Schedule changes older than this are pruned from the feed."""


class RetentionStatistics(msgspec.Struct, frozen=True):
    purged: int
    rounds: int
    failures: int
    dead_letters_purged: int = 0
    changes_pruned: int = 0


class RetentionKeeper:
    def __init__(self, config: RetentionConfig, *, ctx: NodeContext) -> None:
        self.config = config
        self._ledger = ctx.ledger
        self._table = ctx.table
        self._purged = 0
        self._dead_letters_purged = 0
        self._changes_pruned = 0
        self._rounds = 0
        self._failures = 0

    async def run(self, *, task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        await repeat_every(
            self.config.interval_s,
            self.step,
            log=log,
            what="retention round",
            on_failure=self._failed,
        )

    def _failed(self) -> None:
        self._failures += 1

    async def step(self) -> int:
        """One round over the owned partitions (and the change feed, by the owner of
        partition 0); returns how many executions, dead letters included, were removed."""
        now = await self._ledger.database_now()
        cutoff = now - timedelta(seconds=self.config.keep_s)
        removed = 0
        letters = 0
        for fence in self._table.fences():
            removed += await self._purge(ExecutionsPurge(fence, cutoff, self.config.batch))
            if self.config.dead_letters_keep_s is not None:
                before = now - timedelta(seconds=self.config.dead_letters_keep_s)
                purge = ExecutionsPurge(fence, before, self.config.batch, dead_letters=True)
                letters += await self._purge(purge)
        pruned = 0
        if CHANGES_PRUNER_PARTITION in self._table:
            pruned = await self._prune_changes(now - timedelta(seconds=self.config.changes_keep_s))
        self._purged += removed
        self._dead_letters_purged += letters
        self._changes_pruned += pruned
        self._rounds += 1
        if removed:
            log.info("retention removed %d finished executions", removed)
        if letters:
            log.info("retention removed %d dead letters", letters)
        if pruned:
            log.info("retention pruned %d schedule changes", pruned)
        return removed + letters

    async def _purge(self, purge: ExecutionsPurge) -> int:
        removed = 0
        for _ in range(self.config.batches_per_round):
            try:
                count = await self._ledger.executions_purge(purge)
            except LeaseLost:
                break  # the lease keeper notices on its next renewal
            removed += count
            if count < self.config.batch:
                break
        return removed

    async def _prune_changes(self, before: datetime) -> int:
        pruned = 0
        for _ in range(self.config.batches_per_round):
            count = await self._ledger.schedule_changes_prune(
                ScheduleChangesPrune(before, self.config.batch)
            )
            pruned += count
            if count < self.config.batch:
                break
        return pruned

    def statistics(self) -> RetentionStatistics:
        return RetentionStatistics(
            self._purged,
            self._rounds,
            self._failures,
            self._dead_letters_purged,
            self._changes_pruned,
        )
