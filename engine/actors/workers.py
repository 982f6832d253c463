"""A bounded pool of workers that run claimed executions through their task type's handler.

Each worker takes one claimed execution at a time from a bounded channel (the dispatcher
waits when every worker is busy: backpressure), builds the :class:`ExecutionContext` (the
execution id is the idempotency key), runs the task type's handler under the task type's
timeout, decides the execution's fate with :func:`~engine.core.retry_policy.decide`, and
hands the completion to the batched :class:`~engine.actors.completions.CompletionWriter`.

Task types and schedules are read from the ledger and cached for ``cache_ttl_s`` (a change
reaches the workers within that time); the :class:`ScheduleCache` is shared with the
dispatcher, which reads each schedule's overlap policy from it. A task type that cannot be
read or built fails the attempt as *unknown* -- retried a few times, then dead-lettered --
rather than crashing the worker.
"""

from __future__ import annotations

import contextlib
import logging
import random
from collections.abc import Callable
from datetime import datetime
from typing import Any, Final

import msgspec
import trio

from engine.actors.completions import CompletionWriter
from engine.clock import Clock
from engine.core.retry_policy import RetryPolicy, decide
from engine.errors import CarillonError, NotFound
from engine.handlers import ExecutionContext, Handler, HandlerOptions, HandlerResult, build_handler
from engine.ledger.base import Completion, Ledger, Outcome
from engine.model import Execution, Schedule, TaskType

log = logging.getLogger("carillon.workers")

WORKERS_DEFAULT: Final = 32
CACHE_TTL_S_DEFAULT: Final = 10.0
TIMEOUT_GRACE_S: Final = 5.0
"""Extra time a handler gets beyond its task type's timeout before the worker abandons it."""
SCHEDULE_CACHE_MAX: Final = 100_000
"""Schedules cached at most; when full, the cache starts over (they are read again)."""
PREFETCH_CONCURRENCY: Final = 32
"""Schedule reads in flight at once when a batch's schedules are read ahead."""


class WorkerPoolConfig(msgspec.Struct, frozen=True):
    workers: int = WORKERS_DEFAULT
    cache_ttl_s: float = CACHE_TTL_S_DEFAULT


class WorkerStatistics(msgspec.Struct, frozen=True):
    busy: int
    finished: dict[str, int]


class Work(msgspec.Struct, frozen=True):
    """A claimed execution and what is needed to finish it."""

    execution: Execution
    partition_id: int


class ScheduleCache:
    """Schedules by id, read through the ledger and kept for ``ttl_s``.

    A deleted schedule is cached as ``None``. Read errors (``LedgerUnavailable``) propagate
    and nothing is cached for them.
    """

    def __init__(
        self, ledger: Ledger, clock: Clock, ttl_s: float, *, max_entries: int = SCHEDULE_CACHE_MAX
    ) -> None:
        self._ledger = ledger
        self._clock = clock
        self._ttl_s = ttl_s
        self._max_entries = max_entries
        self._entries: dict[str, tuple[float, Schedule | None]] = {}

    async def get(self, schedule_id: str) -> Schedule | None:
        """The schedule, or ``None`` if it is deleted (at most ``ttl_s`` old)."""
        now = self._clock.monotonic()
        cached = self._entries.get(schedule_id)
        if cached is not None and cached[0] > now:
            return cached[1]
        try:
            schedule: Schedule | None = await self._ledger.schedules_get(schedule_id)
        except NotFound:
            schedule = None
        if len(self._entries) >= self._max_entries:
            self._entries.clear()
        self._entries[schedule_id] = (now + self._ttl_s, schedule)
        return schedule

    async def prefetch(self, schedule_ids: list[str]) -> None:
        """Read the listed schedules that are not cached, up to
        :data:`PREFETCH_CONCURRENCY` at once; read errors are left for :meth:`get`."""
        now = self._clock.monotonic()
        missing = [
            sid
            for sid in dict.fromkeys(schedule_ids)
            if (cached := self._entries.get(sid)) is None or cached[0] <= now
        ]
        if not missing:
            return
        limiter = trio.CapacityLimiter(PREFETCH_CONCURRENCY)

        async def read(schedule_id: str) -> None:
            async with limiter:
                with contextlib.suppress(CarillonError):  # get() will raise it again
                    await self.get(schedule_id)

        async with trio.open_nursery() as nursery:
            for schedule_id in missing:
                nursery.start_soon(read, schedule_id)


class WorkerPool:
    def __init__(
        self,
        config: WorkerPoolConfig,
        ledger: Ledger,
        clock: Clock,
        completions: CompletionWriter,
        options: HandlerOptions,
        rng: random.Random,
        on_finished: Callable[[Execution], None] = lambda execution: None,
        on_retry: Callable[[datetime], None] = lambda at: None,
    ) -> None:
        self._on_retry = on_retry
        self.config = config
        self._ledger = ledger
        self._clock = clock
        self._completions = completions
        self._options = options
        self._rng = rng
        self._on_finished = on_finished
        self._send, self._receive = trio.open_memory_channel[Work](0)
        self._task_types: dict[str, tuple[float, TaskType, Handler]] = {}
        self.schedules = ScheduleCache(ledger, clock, config.cache_ttl_s)
        self._busy = 0
        self._finished: dict[str, int] = {}

    async def submit(self, work: Work) -> None:
        """Hand a claimed execution to a free worker (waits until one is free)."""
        await self._send.send(work)

    async def run(self, *, task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            for _ in range(self.config.workers):
                nursery.start_soon(self._worker)
            task_status.started()

    def statistics(self) -> WorkerStatistics:
        return WorkerStatistics(self._busy, dict(self._finished))

    async def task_type(self, name: str) -> tuple[TaskType, Handler]:
        """The task type ``name`` and its handler, cached for ``cache_ttl_s``."""
        now = self._clock.monotonic()
        cached = self._task_types.get(name)
        if cached is not None and cached[0] > now:
            return cached[1], cached[2]
        task_type = await self._ledger.task_types_get(name)
        handler = build_handler(
            task_type.kind, task_type.settings, options=self._options, clock=self._clock
        )
        self._task_types[name] = (now + self.config.cache_ttl_s, task_type, handler)
        return task_type, handler

    async def _payload(self, schedule_id: str) -> dict[str, Any]:
        schedule = await self.schedules.get(schedule_id)
        # Deleted while running: the attempt still gets its context.
        return {} if schedule is None else schedule.payload

    async def _worker(self) -> None:
        async for work in self._receive:
            self._busy += 1
            try:
                await self._execute(work)
            finally:
                self._busy -= 1
                self._on_finished(work.execution)

    async def _execute(self, work: Work) -> None:
        execution = work.execution
        policy = RetryPolicy()
        try:
            task_type, handler = await self.task_type(execution.task_type)
            policy = RetryPolicy(
                max_attempts=task_type.max_attempts,
                backoff_base_s=task_type.backoff_base_s,
                backoff_max_s=task_type.backoff_max_s,
            )
            context = ExecutionContext(
                execution_id=execution.execution_id,
                schedule_id=execution.schedule_id,
                tenant_id=execution.tenant_id,
                task_type=execution.task_type,
                planned_at=execution.planned_at,
                attempt=execution.attempt,
                fencing_token=execution.fencing_token or 0,
                payload=await self._payload(execution.schedule_id),
            )
            result = await self._run_handler(handler, context, task_type.timeout_s)
        except CarillonError as exc:
            log.error("execution %s cannot run: %s", execution.execution_id, exc)
            result = HandlerResult.unknown("setup_error", str(exc))
        decision = decide(
            result.kind,
            execution.attempt,
            policy,
            self._clock.now(),
            self._rng,
            retry_after_s=result.retry_after_s,
        )
        self._finished[decision.outcome] = self._finished.get(decision.outcome, 0) + 1
        if decision.not_before is not None:
            self._on_retry(decision.not_before)
        await self._completions.submit(
            work.partition_id,
            Completion(
                execution.execution_id,
                execution.attempt,
                Outcome(decision.outcome),
                decision.not_before,
                result.error_code,
                result.error_message,
            ),
        )

    async def _run_handler(
        self, handler: Handler, context: ExecutionContext, timeout_s: float
    ) -> HandlerResult:
        with trio.move_on_after(timeout_s + TIMEOUT_GRACE_S):
            return await handler.run(context)
        return HandlerResult.transient(
            "timeout", f"the handler did not return within {timeout_s:g} s"
        )
