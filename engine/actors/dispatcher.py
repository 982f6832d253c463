"""Moves due executions of the owned partitions from the ledger to the workers, fairly.

Design
------
Two loops share a :class:`~engine.core.fair_queue.FairQueue`:

* **fetch** -- at each instant something was announced for (the planner announces what it
  planned, workers announce retries) and at least every ``fetch_interval_s``, it reads the
  startable executions of the owned partitions (``executions_due``, by the database-corrected
  clock) and queues those it does not hold yet. The queue is bounded; when it is full,
  fetching pauses, so a backlog stays in the ledger, not in memory.
* **dispatch** -- pops executions in weighted-fair order across tenants (never before their
  instant, never beyond a task-type cap or tenant quota), paced by an optional node-wide
  token bucket, claims them in one fenced call per batch (``executions_claim``: queued ->
  running, next attempt, attempt lease), and hands each claimed one to the worker pool, which
  blocks when every worker is busy (backpressure).

The attempt lease is the task type's timeout plus a margin, so a live worker never loses its
attempt and a crashed one's attempt is re-queued by the redeliverer once it has run out.
An execution claimed by no one (another node got it, or it stopped being startable) is
simply forgotten; the ledger stays the source of truth.
"""

from __future__ import annotations

import functools
import logging
import math
import random
from datetime import datetime
from typing import Any, Final

import msgspec
import trio

from engine.actors.clock_monitor import ClockMonitor
from engine.actors.partitions import PartitionTable
from engine.actors.retry import retry_unavailable
from engine.actors.workers import Work, WorkerPool
from engine.clock import Clock
from engine.core.dispatch import ConcurrencyLimits
from engine.core.fair_queue import FairQueue, PushOutcome
from engine.core.token_bucket import TokenBucket
from engine.errors import CarillonError, LeaseLost
from engine.ledger.base import PAGE_SIZE_MAX, ExecutionsClaim, ExecutionsDue, Fence, Ledger
from engine.model import Execution

log = logging.getLogger("carillon.dispatcher")

FETCH_INTERVAL_S_DEFAULT: Final = 5.0
"""Fallback period of the fetch loop; planned fires and retries ask for a fetch at their
instant (:meth:`Dispatcher.request_fetch`), so this only catches what nobody announced
(replays, re-queued attempts, executions of a partition just taken over)."""
CLAIM_BATCH_DEFAULT: Final = 500
QUEUE_MAX_DEFAULT: Final = 50_000
ATTEMPT_LEASE_MARGIN_S: Final = 30.0
SETTINGS_REFRESH_S: Final = 10.0
"""How often task-type caps and tenant weights and quotas are re-read from the ledger."""


class DispatcherConfig(msgspec.Struct, frozen=True):
    node_id: str
    fetch_interval_s: float = FETCH_INTERVAL_S_DEFAULT
    claim_batch: int = CLAIM_BATCH_DEFAULT
    queue_max: int = QUEUE_MAX_DEFAULT
    rate_per_s: float | None = None
    """Node-wide starts per second (``None``: as fast as the workers go)."""
    burst: int = 1_000
    smoothing_window_s: float = 0.0
    """Spread a burst's tolerance over this many seconds instead of releasing it at once."""


class DispatcherStatistics(msgspec.Struct, frozen=True):
    queued: int
    claimed: int
    not_claimed: int
    fetches: int


class Dispatcher:
    def __init__(
        self,
        config: DispatcherConfig,
        ledger: Ledger,
        clock: Clock,
        monitor: ClockMonitor,
        table: PartitionTable,
        workers: WorkerPool,
        limits: ConcurrencyLimits,
        rng: random.Random,
    ) -> None:
        self.config = config
        self._ledger = ledger
        self._clock = clock
        self._monitor = monitor
        self._table = table
        self._workers = workers
        self._limits = limits
        self._rng = rng
        self.queue: FairQueue[Execution] = FairQueue(max_items=config.queue_max, limits=limits)
        self._bucket = (
            None
            if config.rate_per_s is None
            else TokenBucket(
                config.rate_per_s, config.burst, smoothing_window_s=config.smoothing_window_s
            )
        )
        self._wake = trio.Event()
        self._fetched = trio.Event()
        self._counts = {"claimed": 0, "not_claimed": 0, "fetches": 0}
        self._settings_due = -math.inf
        self._fetch_at: datetime | None = None

    def request_fetch(self, at: datetime) -> None:
        """Fetch again at ``at`` (when something becomes startable then)."""
        if self._fetch_at is None or at < self._fetch_at:
            self._fetch_at = at
            self._wake.set()

    def finished(self, execution: Execution) -> None:
        """A worker is done with ``execution``: free its slot for the next one."""
        self._limits.finished(execution.tenant_id, execution.task_type)
        self._fetched.set()
        self._fetched = trio.Event()

    async def run(self, *, task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._fetch_loop)
            nursery.start_soon(self._dispatch_loop)
            task_status.started()

    def statistics(self) -> DispatcherStatistics:
        c = self._counts
        return DispatcherStatistics(len(self.queue), c["claimed"], c["not_claimed"], c["fetches"])

    async def fetch(self) -> int:
        """Queue the startable executions of the owned partitions; returns how many were new."""
        owned = list(self._table)
        if not owned or self.queue.room == 0:
            return 0
        due = await self._ledger.executions_due(
            ExecutionsDue(owned, self._monitor.now(), min(PAGE_SIZE_MAX, self.queue.room))
        )
        added = sum(1 for execution in due if self.queue.push(execution) is PushOutcome.QUEUED)
        self._counts["fetches"] += 1
        if added:
            self._fetched.set()
            self._fetched = trio.Event()
        return added

    async def dispatch(self) -> int:
        """Pop what may start now, claim it, hand it to the workers; returns how many started."""
        batch: list[Execution] = []
        now_mono = self._clock.monotonic()
        while len(batch) < self.config.claim_batch:
            if self._bucket is not None and self._bucket.wait_s(now_mono) > 0:
                break
            execution = self.queue.pop(self._monitor.now())
            if execution is None:
                break
            if self._bucket is not None:
                self._bucket.take(now_mono)
            batch.append(execution)
        if not batch:
            return 0
        claimed = await self._claim(batch)
        for execution in claimed:
            await self._workers.submit(Work(execution, execution.partition_id or 0))
        return len(claimed)

    async def _claim(self, batch: list[Execution]) -> list[Execution]:
        by_id = {execution.execution_id: execution for execution in batch}
        fences: dict[int, Fence] = {}
        for execution in batch:
            owned = self._table.get(execution.partition_id or 0)
            if owned is not None:
                fences[owned.fence.partition_id] = owned.fence
        wanted = [e for e in batch if (e.partition_id or 0) in fences]
        claimed: list[Execution] = []
        while wanted:
            lease_s = await self._attempt_lease_s(wanted)
            params = ExecutionsClaim(
                list(fences.values()),
                [e.execution_id for e in wanted],
                lease_s,
                self.config.node_id,
            )
            try:
                claimed = await retry_unavailable(
                    functools.partial(self._ledger.executions_claim, params),
                    rng=self._rng,
                    log=log,
                    what="claim executions",
                )
                break
            except LeaseLost as exc:
                lost = set(exc.partitions)
                fences = {p: f for p, f in fences.items() if p not in lost}
                wanted = [e for e in wanted if (e.partition_id or 0) not in lost]
        started = {execution.execution_id for execution in claimed}
        for execution_id, execution in by_id.items():
            if execution_id not in started:
                self._limits.finished(execution.tenant_id, execution.task_type)
        self._counts["claimed"] += len(started)
        self._counts["not_claimed"] += len(by_id) - len(started)
        return claimed

    async def _attempt_lease_s(self, batch: list[Execution]) -> float:
        longest = 0.0
        for task_type in sorted({execution.task_type for execution in batch}):
            try:
                longest = max(longest, (await self._workers.task_type(task_type))[0].timeout_s)
            except CarillonError:
                longest = max(longest, 30.0)
        return longest + ATTEMPT_LEASE_MARGIN_S

    async def refresh_settings(self) -> None:
        """Apply the stored task-type caps and tenant weights and quotas."""
        for task_type in await self._ledger.task_types_list():
            self._limits.set_task_type_cap(task_type.name, task_type.max_concurrency)
        for tenant in await self._ledger.tenants_list():
            self._limits.set_tenant_quota(tenant.tenant_id, tenant.concurrency_quota)
            self.queue.set_weight(tenant.tenant_id, tenant.weight)
        self._settings_due = self._clock.monotonic() + SETTINGS_REFRESH_S

    async def _fetch_loop(self) -> None:
        while True:
            now = self._monitor.now()
            if self._fetch_at is not None and self._fetch_at <= now:
                self._fetch_at = None
            try:
                if self._clock.monotonic() >= self._settings_due:
                    await self.refresh_settings()
                await self.fetch()
            except CarillonError as exc:
                log.warning("fetching due executions failed: %s", exc)
            wait_s = self.config.fetch_interval_s
            if self._fetch_at is not None:
                wait_s = min(wait_s, max((self._fetch_at - now).total_seconds(), 0.0))
            self._wake = trio.Event()
            with trio.move_on_after(wait_s):
                await self._wake.wait()

    async def _dispatch_loop(self) -> None:
        while True:
            started = await self.dispatch()
            if started:
                continue
            wait_s = self.config.fetch_interval_s
            upcoming = self.queue.next_due_at()
            if upcoming is not None:
                wait_s = min(wait_s, max((upcoming - self._monitor.now()).total_seconds(), 0))
            if self._bucket is not None:
                wait_s = min(wait_s, max(self._bucket.wait_s(self._clock.monotonic()), 0.001))
            with trio.move_on_after(max(wait_s, 0.001) if math.isfinite(wait_s) else 1.0):
                await self._fetched.wait()
