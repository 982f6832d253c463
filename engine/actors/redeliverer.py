"""Re-queues executions whose attempt lease ran out: the worker crashed, hung or lost its node.

Every ``interval_s`` it asks the ledger to put back to ``queued`` the running executions of
the partitions this node owns whose attempt lease (judged by the database clock) expired.
The next claim starts the next attempt under the same execution id, so delivery is
at-least-once while the idempotency key keeps the effect once.
"""

from __future__ import annotations

import logging
from typing import Any, Final

import msgspec
import trio

from engine.actors.context import NodeContext
from engine.actors.retry import repeat_every
from engine.errors import LeaseLost
from engine.ledger.params import ExecutionsRequeueExpired

log = logging.getLogger("carillon.redeliverer")

REDELIVER_INTERVAL_S_DEFAULT: Final = 5.0


class RedelivererConfig(msgspec.Struct, frozen=True):
    interval_s: float = REDELIVER_INTERVAL_S_DEFAULT


class RedelivererStatistics(msgspec.Struct, frozen=True):
    requeued: int


class Redeliverer:
    def __init__(
        self,
        config: RedelivererConfig,
        *,
        ctx: NodeContext,
    ) -> None:
        self.config = config
        self._metrics = ctx.metrics
        self._ledger = ctx.ledger
        self._table = ctx.table
        self._requeued = 0

    async def run(self, *, task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        await repeat_every(self.config.interval_s, self.step, log=log, what="redelivery round")

    async def step(self) -> list[str]:
        """One round; returns the ids put back in the queue."""
        requeued: list[str] = []
        fences = self._table.fences()
        while fences:
            try:
                requeued = await self._ledger.executions_requeue_expired(
                    ExecutionsRequeueExpired(fences)
                )
                break
            except LeaseLost as exc:  # the lease keeper notices on its next renewal
                fences = [f for f in fences if f.partition_id not in exc.partitions]
        if requeued:
            log.warning("re-queued %d executions whose attempt lease expired", len(requeued))
        self._requeued += len(requeued)
        self._metrics.attempts_expired(len(requeued))
        return requeued

    def statistics(self) -> RedelivererStatistics:
        return RedelivererStatistics(self._requeued)
