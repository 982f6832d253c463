"""Removes old finished executions of the partitions this node owns, in bounded batches.

A busy cluster writes hundreds of millions of ledger rows a day; without retention the table
and its indexes grow without end. Every ``interval_s`` the keeper deletes, for each owned
partition, succeeded and skipped executions that finished more than ``keep_s`` ago (seven
days by default), ``batch`` rows per fenced call and at most ``batches_per_round`` calls per
partition per round, so it never competes for long with planning. Dead letters are kept
until they are replayed or explicitly purged. The cutoff is computed from the database's
clock, like every expiry.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any, Final

import msgspec
import trio

from engine.actors.partitions import PartitionTable
from engine.actors.retry import repeat_every
from engine.errors import LeaseLost
from engine.ledger.base import ExecutionsPurge, Ledger

log = logging.getLogger("carillon.retention")

RETENTION_KEEP_S_DEFAULT: Final = 7 * 24 * 3600.0
RETENTION_INTERVAL_S_DEFAULT: Final = 300.0
RETENTION_BATCH_DEFAULT: Final = 5_000
RETENTION_BATCHES_PER_ROUND_DEFAULT: Final = 20


class RetentionConfig(msgspec.Struct, frozen=True):
    keep_s: float = RETENTION_KEEP_S_DEFAULT
    interval_s: float = RETENTION_INTERVAL_S_DEFAULT
    batch: int = RETENTION_BATCH_DEFAULT
    batches_per_round: int = RETENTION_BATCHES_PER_ROUND_DEFAULT


class RetentionStatistics(msgspec.Struct, frozen=True):
    purged: int
    rounds: int
    failures: int


class RetentionKeeper:
    def __init__(self, config: RetentionConfig, ledger: Ledger, table: PartitionTable) -> None:
        self.config = config
        self._ledger = ledger
        self._table = table
        self._purged = 0
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
        """One round over the owned partitions; returns how many rows were removed."""
        cutoff = await self._ledger.database_now() - timedelta(seconds=self.config.keep_s)
        removed = 0
        for fence in self._table.fences():
            for _ in range(self.config.batches_per_round):
                try:
                    count = await self._ledger.executions_purge(
                        ExecutionsPurge(fence, finished_before=cutoff, limit=self.config.batch)
                    )
                except LeaseLost:
                    break  # the lease keeper notices on its next renewal
                removed += count
                if count < self.config.batch:
                    break
        self._purged += removed
        self._rounds += 1
        if removed:
            log.info("retention removed %d finished executions", removed)
        return removed

    def statistics(self) -> RetentionStatistics:
        return RetentionStatistics(self._purged, self._rounds, self._failures)
