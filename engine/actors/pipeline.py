"""The execution pipeline: from due executions in the ledger to written completions.

One direction of flow, one owner per resource::

    ledger --fetch--> fair queue --pop--> admission --claim--> [claimed]     (Dispatcher)
           --> workers --> [completed]                                     (WorkerPool)
           --> batched, fenced completion --> ledger                 (CompletionWriter)

* :class:`~engine.actors.dispatcher.Dispatcher` -- due fetch, the weighted-fair queue,
  admission (:class:`~engine.actors.attempts.Room`, token bucket, tenant quotas, task-type
  caps, overlap policies), and the fenced claim.
* :class:`~engine.actors.workers.WorkerPool` -- runs each claimed attempt's handler.
* :class:`~engine.actors.completions.CompletionWriter` -- writes completions in batches.

Work moves only forward, on trio memory channels, as :class:`~engine.actors.attempts.Attempt`
tickets that own every per-attempt resource; no stage calls back into another. Shared by
the stages and built here: the :class:`~engine.core.dispatch.ConcurrencyLimits`, the
:class:`~engine.actors.attempts.Room`, the schedule cache and the task-type cache.

The pipeline also owns the node's webhook client (:mod:`engine.handlers.http_client`):
keep-alive connections pooled per vetted address, opened with the pipeline and closed with
it, so every webhook task type shares them; and the node's broker bridge
(:mod:`engine.handlers.brokers`): the message-broker clients on their own asyncio loop,
pooled per vetted settings, closed with the pipeline.

**A restart is a fresh pipeline.** The node's supervisor runs the pipeline as one child
whose factory builds a new instance from its config, so nothing a crashed pipeline counted
-- a slot, an overlap count, a claim in progress -- survives into the next. On the way out,
whatever the reason, the pipeline closes every attempt still open (:meth:`Room.close_all`),
so the in-flight counts of the node's partition table, which outlive the pipeline, settle.
Attempts claimed by the old pipeline stay ``running`` in the ledger until their attempt
lease runs out and the redeliverer re-queues them.

**Liveness is watched.** The pipeline's watchdog measures how long due work has waited in
the queue while admission handed none on although every admitted attempt was running and a
worker was idle, and how long
the fetch loop has not come round (:attr:`PipelineStatistics.stalled_s`,
``carillon_dispatch_stalled_seconds``). Past ``stall_after_s`` it logs an error with the
pipeline's state (once per stall) and the node's ``/readyz`` fails its ``dispatch`` check. A
pipeline that is merely saturated -- every worker busy -- or held back by a cap, a quota or
a rate is not stalled, and neither is one waiting on a database that is down (its claims
and fetches are being retried; ``/readyz``'s ``database`` check reports that).
"""

from __future__ import annotations

import logging
from typing import Any, Final

import msgspec
import trio

from engine.actors.announcements import Announcements
from engine.actors.attempts import Attempt, Room
from engine.actors.completions import CompletionWriter, CompletionWriterConfig
from engine.actors.context import NodeContext
from engine.actors.dispatcher import Dispatcher, DispatcherConfig
from engine.actors.schedule_cache import ScheduleCache
from engine.actors.task_kinds import BLOCKING_GROUP, CACHE_TTL_S_DEFAULT, TaskKinds
from engine.actors.workers import WorkerPool, WorkerPoolConfig
from engine.config import DISPATCH_STALL_AFTER_S_DEFAULT
from engine.core.admission import HandoffSizer
from engine.core.dispatch import ConcurrencyLimits
from engine.handlers import HandlerOptions
from engine.handlers.brokers import open_broker_bridge
from engine.handlers.http_client import WebhookClientConfig, open_webhook_client

log = logging.getLogger("carillon.pipeline")

WATCH_INTERVAL_S_MAX: Final = 5.0
"""The watchdog looks every sixth of ``stall_after_s``, at most this often apart: a stall is
measured to within that, and an idle node does not wake every second for it (a day of
three mock-clock nodes spent a third of its actors' time in 1 s ticks)."""
FROZEN_AFTER_S: Final = 5.0
"""A watchdog tick this much later than planned means the process itself was not running
(SIGSTOP, a VM pause): the time is not the dispatcher's stall, so measuring starts anew."""


class PipelineConfig(msgspec.Struct, frozen=True):
    dispatcher: DispatcherConfig
    workers: WorkerPoolConfig = WorkerPoolConfig()
    completions: CompletionWriterConfig = CompletionWriterConfig()
    webhook: WebhookClientConfig = WebhookClientConfig()
    cache_ttl_s: float = CACHE_TTL_S_DEFAULT
    stall_after_s: float = DISPATCH_STALL_AFTER_S_DEFAULT
    """Due work waiting this long with idle workers and nothing handed on is a stall."""


class PipelineStatistics(msgspec.Struct, frozen=True):
    in_flight: int
    """Attempts popped and not done running."""
    capacity: int
    """What the room holds at most now (workers plus the hand-off)."""
    open: int
    """Attempts not closed yet (including those whose completion is being written)."""
    stalled_s: float
    """How long due work has waited with idle workers and nothing handed on, or how long
    the fetch loop has not come round, whichever is longer (0 while the pipeline moves)."""


class ExecutionPipeline:
    """Dispatcher, workers and completion writer, wired by channels (see the module doc)."""

    def __init__(
        self,
        config: PipelineConfig,
        *,
        ctx: NodeContext,
        announcements: Announcements,
        options: HandlerOptions,
    ) -> None:
        self.config = config
        self._clock = clock = ctx.clock
        self._table = ctx.table
        workers = config.workers
        self.room = Room(
            HandoffSizer(workers.workers, workers.handoff_max, workers.handoff_wait_s),
            config.dispatcher.claim_batch,
        )
        self.limits = ConcurrencyLimits()
        # Python and shell attempts hold a thread or a process: past twice the workers'
        # limit of them (one running and one handed over per thread, so a thread does not
        # idle through a claim's round trip), their backlog waits in the dispatcher's queue,
        # not in worker slots.
        self.limits.set_group_cap(BLOCKING_GROUP, 2 * workers.blocking_workers)
        schedules = ScheduleCache(ctx.ledger, clock, config.cache_ttl_s)
        kinds = self._kinds = TaskKinds(
            ctx.ledger, clock, options, wall_clock=ctx.monitor.clock(), ttl_s=config.cache_ttl_s
        )
        self.dispatcher = Dispatcher(
            config.dispatcher,
            ctx=ctx,
            announcements=announcements,
            room=self.room,
            limits=self.limits,
            schedules=schedules,
            kinds=kinds,
        )
        self.workers = WorkerPool(
            workers,
            ctx=ctx,
            kinds=kinds,
            schedules=schedules,
            announcements=announcements,
            room=self.room,
        )
        self.completions = CompletionWriter(
            config.completions, ctx=ctx, node_id=config.dispatcher.node_id
        )
        self._resumed_at = clock.monotonic()
        """Monotonic time the watchdog last found the process had been frozen."""
        self._stuck_since: float | None = None
        """Monotonic time since which every watchdog tick found due work, idle workers and
        no dispatch progress (``None``: the last tick found the pipeline moving)."""
        self._tick_at = clock.monotonic()
        self._stall_logged = False
        # Sized for every slot the room can ever give, so a claimer never waits on it.
        self._claimed = trio.open_memory_channel[Attempt](self.room.sizer.capacity_max)
        self._completed = trio.open_memory_channel[Attempt](config.completions.queue_max)

    async def run(self, *, task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
        claimed_send, claimed_receive = self._claimed
        completed_send, completed_receive = self._completed
        try:
            async with (
                open_webhook_client(self.config.webhook) as webhook_client,
                open_broker_bridge() as brokers,
                trio.open_nursery() as nursery,
            ):
                self._kinds.webhook_client = webhook_client
                self._kinds.brokers = brokers
                await nursery.start(self.completions.run, completed_receive)
                await nursery.start(self.workers.run, claimed_receive, completed_send)
                await nursery.start(self.dispatcher.run, claimed_send)
                nursery.start_soon(self._watch)
                task_status.started()
        finally:
            # Whatever ended the pipeline, nothing it took outlives it.
            self.room.close_all()

    @property
    def task_kinds(self) -> TaskKinds:
        """The pipeline's task types and their handlers (and its webhook client and broker
        bridge while it runs)."""
        return self._kinds

    def hand_over(self, attempt: Attempt) -> None:
        """Send a claimed ``attempt`` to the workers, as the claimers do (for tests that
        drive the workers directly)."""
        self._claimed[0].send_nowait(attempt)

    def statistics(self) -> PipelineStatistics:
        return PipelineStatistics(
            in_flight=self.room.in_flight,
            capacity=self.room.sizer.capacity,
            open=len(self.room.open),
            stalled_s=self.stalled_s(self._clock.monotonic()),
        )

    def stalled_s(self, now: float) -> float:
        """See :attr:`PipelineStatistics.stalled_s` (as of the watchdog's last tick)."""
        stalled = 0.0 if self._stuck_since is None else now - self._stuck_since
        dispatcher = self.dispatcher
        if len(self._table) and not dispatcher.fetching:
            # The fetch loop comes round at least every fallback interval.
            stalled = max(stalled, now - max(dispatcher.fetched_at, self._resumed_at))
        return max(stalled, 0.0)

    def _stuck(self, since: float) -> bool:
        """Due work waits, every admitted attempt is running (none waits for a worker, a
        thread, a claim or an overlap check -- those are saturation or a database at work),
        a worker is idle, and the dispatcher has not popped since ``since``. Capped,
        quota-bound and rate-paced pipelines pop all the same, so none of them is stuck."""
        dispatcher = self.dispatcher
        busy = self.workers.busy
        return (
            self.room.in_flight <= busy < self.config.workers.workers
            and dispatcher.progress_at < since
            and dispatcher.has_due()
        )

    def stall_check(self) -> str | None:
        """The ``/readyz`` check: ``None`` while the pipeline moves, else what is wrong."""
        stalled = self.stalled_s(self._clock.monotonic())
        if stalled < self.config.stall_after_s:
            return None
        return f"due work has not been dispatched for {stalled:.0f} s"

    async def _watch(self) -> None:
        interval_s = min(WATCH_INTERVAL_S_MAX, max(self.config.stall_after_s / 6, 0.1))
        while True:
            before = self._tick_at
            await trio.sleep(interval_s)
            now = self._tick_at = self._clock.monotonic()
            if now - before - interval_s > FROZEN_AFTER_S:
                # The process itself was not running: measure anew from here.
                self._resumed_at = now
                self._stuck_since = None
                continue
            if not self._stuck(before):
                self._stuck_since = None
            elif self._stuck_since is None:
                self._stuck_since = before
            stalled = self.stalled_s(now)
            if stalled >= self.config.stall_after_s:
                if not self._stall_logged:
                    self._stall_logged = True
                    log.error(
                        "dispatch stalled for %.0f s: %s; %s; %s",
                        stalled,
                        self.statistics(),
                        self.dispatcher.statistics(),
                        self.workers.statistics(),
                    )
            elif self._stall_logged:
                self._stall_logged = False
                log.warning("dispatch moves again")
