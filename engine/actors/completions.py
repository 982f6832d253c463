"""Batches completion writes: what makes a Postgres queue fast.

Workers send each finished attempt, its completion attached, on the completed channel and
move on. The writer collects completions for up to ``flush_interval_s`` or ``batch_max``
rows and writes them in one fenced ``executions_complete`` call -- River and Graphile
Worker gained 4-10x by exactly this. Completions are idempotent (guarded by attempt
number), so a write whose reply was lost is simply retried. Completions of partitions this
node no longer owns are dropped: the new owner re-queues those executions when their
attempt lease runs out (at-least-once; the execution id is the idempotency key
downstream), or, for a folded attempt, finds them still queued and runs them again.
Folded attempts' completions go in their own call, ``executions_finish``, which writes
the claim with the outcome (docs/ledger.md, "Folded claims"). Written, refused or
dropped, every attempt of a batch is closed in a ``finally``: its in-flight count settles
(a partition hand-back waits for it).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, Final

import msgspec
import trio

from engine.actors.attempts import Attempt
from engine.actors.context import NodeContext
from engine.actors.retry import call_fenced
from engine.ledger.params import (
    CompleteResult,
    Completion,
    ExecutionsComplete,
    ExecutionsFinish,
    Fence,
)

log = logging.getLogger("carillon.completions")

FLUSH_INTERVAL_S_DEFAULT: Final = 0.005
BATCH_MAX_DEFAULT: Final = 1_000
WRITERS_DEFAULT: Final = 2
QUEUE_MAX_DEFAULT: Final = 10_000
"""Completions waiting to be written (the completed channel's buffer); a full channel makes
workers wait (backpressure)."""


class CompletionWriterConfig(msgspec.Struct, frozen=True):
    flush_interval_s: float = FLUSH_INTERVAL_S_DEFAULT
    batch_max: int = BATCH_MAX_DEFAULT
    queue_max: int = QUEUE_MAX_DEFAULT
    writers: int = WRITERS_DEFAULT
    """Batches being written at once: one collects while another's round trip is out."""


class CompletionStatistics(msgspec.Struct, frozen=True):
    written: int
    stale: int
    dropped: int
    batches: int


class CompletionWriter:
    def __init__(
        self,
        config: CompletionWriterConfig,
        *,
        ctx: NodeContext,
        node_id: str,
    ) -> None:
        self.config = config
        self._ledger = ctx.ledger
        self._node_id = node_id
        """Recorded as the claimer of the folded attempts it finishes."""
        self._table = ctx.table
        self._rng = ctx.rng
        self._counts = {"written": 0, "stale": 0, "dropped": 0, "batches": 0}

    async def run(
        self,
        completed: trio.MemoryReceiveChannel[Attempt],
        *,
        task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        async with trio.open_nursery() as nursery:
            for _ in range(self.config.writers):
                nursery.start_soon(self._write_loop, completed)
            task_status.started()

    async def _write_loop(self, completed: trio.MemoryReceiveChannel[Attempt]) -> None:
        while True:
            batch = [await completed.receive()]
            try:
                # Let the batch fill for a flush interval, then take what came. (Receiving
                # item by item instead woke this task once per completion: a context switch
                # per execution at burst rates.)
                await trio.sleep(self.config.flush_interval_s)
                while len(batch) < self.config.batch_max:
                    try:
                        batch.append(completed.receive_nowait())
                    except trio.WouldBlock:
                        break
                await self.write(batch)
            finally:
                # Written, refused or dropped: no longer in flight (a hand-back waits for it).
                for attempt in batch:
                    attempt.close()

    async def write(self, batch: list[Attempt]) -> None:
        """Write one batch, dropping completions of partitions no longer owned: the claimed
        attempts' with ``executions_complete``, the folded ones' with ``executions_finish``
        (their claim and completion in one step), each call fenced."""
        fences: dict[int, Fence] = {}
        claimed: list[Attempt] = []
        folded: list[Attempt] = []
        for attempt in batch:
            owned = self._table.get(attempt.partition_id)
            if owned is None or attempt.completion is None:
                self._counts["dropped"] += 1
                continue
            fences[attempt.partition_id] = owned.fence
            (folded if attempt.folded else claimed).append(attempt)
        for kept, call in ((claimed, self._complete), (folded, self._finish)):
            if kept:
                await self._write(fences, kept, call)

    async def _write(
        self,
        fences: dict[int, Fence],
        kept: list[Attempt],
        call: Callable[[list[Fence], list[Attempt]], Awaitable[CompleteResult]],
    ) -> None:
        used = {attempt.partition_id: fences[attempt.partition_id] for attempt in kept}
        result, written, lost = await call_fenced(
            used, kept, _partition_of, call, rng=self._rng, log=log, what="write completions"
        )
        if lost:
            log.warning("completions of lost partitions %s dropped", sorted(lost))
            self._counts["dropped"] += len(kept) - len(written)
        if result is not None:
            self._counts["written"] += len(result.applied)
            self._counts["stale"] += len(result.stale)
            self._counts["batches"] += 1

    async def _complete(self, fences: list[Fence], attempts: list[Attempt]) -> CompleteResult:
        completions: list[Completion] = [a.completion for a in attempts if a.completion]
        return await self._ledger.executions_complete(ExecutionsComplete(fences, completions))

    async def _finish(self, fences: list[Fence], attempts: list[Attempt]) -> CompleteResult:
        completions: list[Completion] = [a.completion for a in attempts if a.completion]
        return await self._ledger.executions_finish(
            ExecutionsFinish(fences, completions, self._node_id)
        )

    def statistics(self) -> CompletionStatistics:
        c = self._counts
        return CompletionStatistics(c["written"], c["stale"], c["dropped"], c["batches"])


def _partition_of(attempt: Attempt) -> int:
    return attempt.partition_id
