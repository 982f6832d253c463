"""A bounded pool of workers that run claimed executions through their task type's handler.

Each worker takes one claimed execution at a time from a bounded channel, builds the
:class:`ExecutionContext` (the execution id is the idempotency key), runs the task type's
handler under the task type's timeout, decides the execution's fate with
:func:`~engine.core.retry_policy.decide`, and hands the completion to the batched
:class:`~engine.actors.completions.CompletionWriter`.

The pool holds at most :attr:`WorkerPool.capacity` claimed executions: one per worker plus a
hand-off of claimed ones waiting for a worker, so the dispatcher claims the next batches
while this one runs. The hand-off is sized by how fast handlers finish (a moving average):
about a second's worth, at most ``handoff_max`` -- a thousand no-op executions, or one per
worker when each takes a second -- so a claimed execution rarely waits long for its worker.
The dispatcher claims no more than :attr:`WorkerPool.free` (backpressure).

**Attempt leases.** Every claimed execution carries an attempt lease; if it runs out, the
redeliverer of the partition's owner re-queues the execution for another attempt. While
the pool holds an execution -- waiting or running -- it renews the lease once a third of it
has passed (:meth:`WorkerPool.renew_attempt_leases`, fenced like every write), so a long
handler keeps its attempt. An attempt the ledger no longer has running under this number
(re-queued after all, completed elsewhere), or one of a partition this node no longer
owns, is *abandoned*: its handler is cancelled, or it never starts, and no completion is
written -- the attempt that replaced it is the one that counts. A handler also never starts
once more than :data:`ATTEMPT_START_WITHIN` of its attempt lease has passed since the claim
or the last renewal *began*: after that, the lease may have run out (a node frozen or cut
off from the database) and the partition's owner may have re-queued and re-run the
execution already.

Task types are read from the ledger and cached for ``cache_ttl_s`` (a change reaches the
workers within that time), schedules through the node's shared
:class:`~engine.actors.schedule_cache.ScheduleCache`. While the ledger is unavailable those
reads are retried with backoff: a database blip is not the execution's failure and spends
none of its attempts. A task type that cannot be found or built fails the attempt as
*unknown* -- retried a few times, then dead-lettered -- rather than crashing the worker.
"""

from __future__ import annotations

import functools
import logging
import random
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any, Final, TypeVar

import msgspec
import trio

from engine.actors.clock_monitor import ClockMonitor
from engine.actors.completions import CompletionWriter
from engine.actors.partitions import PartitionTable
from engine.actors.retry import retry_unavailable
from engine.actors.schedule_cache import UNCACHED, ScheduleCache
from engine.clock import Clock
from engine.core.retry_policy import Decision, RetryPolicy, decide
from engine.errors import CarillonError, LeaseLost
from engine.handlers import (
    ExecutionContext,
    Handler,
    HandlerOptions,
    HandlerResult,
    OutcomeKind,
    build_handler,
)
from engine.ledger.base import (
    BATCH_ROWS_MAX,
    AttemptRef,
    Completion,
    ExecutionsExtend,
    Fence,
    Ledger,
    Outcome,
)
from engine.metrics import NodeMetrics
from engine.model import Execution, TaskType

log = logging.getLogger("carillon.workers")

T = TypeVar("T")

WORKERS_DEFAULT: Final = 32
CACHE_TTL_S_DEFAULT: Final = 10.0
TIMEOUT_GRACE_S: Final = 5.0
"""Extra time a handler gets beyond its task type's timeout before the worker abandons it."""
HANDOFF_MAX_DEFAULT: Final = 1_000
"""Two claim batches: one being claimed while the workers still hold the other."""
HANDOFF_WAIT_S_DEFAULT: Final = 1.0
DURATION_SMOOTHING: Final = 0.05
"""Weight of the newest handler duration in the moving average."""
DURATION_S_INITIAL: Final = 1.0
"""The assumed handler duration before any has finished: a cautious start (a hand-off of
one execution per worker) that grows as fast handlers finish."""
RENEW_CHECK_S_DEFAULT: Final = 5.0
"""How often the attempt leases of the executions held here are looked at."""
RENEW_AFTER_FRACTION: Final = 1 / 3
"""An attempt lease is renewed once this share of it has passed: two renewals in a row can
fail (a database blip) before it runs out."""
ATTEMPT_START_WITHIN: Final = 2 / 3
"""A claimed execution's handler starts only while less than this share of its attempt
lease has passed since the claim (or the last renewal) was sent. In normal operation a
renewal comes once a third has passed; beyond two thirds, renewals have been failing or the
node was not running, and the lease may run out before the handler is under way."""
_OUTCOMES: Final = {str(outcome): outcome for outcome in Outcome}
_SUCCEEDED: Final = Decision("succeeded")
_SETUP_FAILED_POLICY: Final = RetryPolicy()
"""The retry policy of an attempt whose task type could not be read or built."""


def renew_check_s_for(attempt_lease_s: float) -> float:
    """How often to look at the attempt leases of executions claimed with
    ``attempt_lease_s``: every :data:`RENEW_CHECK_S_DEFAULT`, or often enough that a lease
    is renewed by half its length (a 3 s lease checked every 5 s ran out before its first
    renewal, so every handler longer than the lease was re-queued and abandoned forever)."""
    return min(RENEW_CHECK_S_DEFAULT, attempt_lease_s * RENEW_AFTER_FRACTION / 2)


class WorkerPoolConfig(msgspec.Struct, frozen=True):
    workers: int = WORKERS_DEFAULT
    cache_ttl_s: float = CACHE_TTL_S_DEFAULT
    handoff_max: int = HANDOFF_MAX_DEFAULT
    """Claimed executions waiting for a free worker at most. They let the dispatcher claim
    the next batches while the workers run this one; their attempt leases are renewed while
    they wait. Fewer are taken when handlers are slow (see ``handoff_wait_s``)."""
    handoff_wait_s: float = HANDOFF_WAIT_S_DEFAULT
    """About how long a claimed execution may wait for a worker: the hand-off holds no more
    than the workers finish in that time, judged by a moving average of handler durations
    (and never fewer than one per worker)."""
    renew_check_s: float = RENEW_CHECK_S_DEFAULT


class WorkerStatistics(msgspec.Struct, frozen=True):
    busy: int
    finished: dict[str, int]
    waiting: int = 0
    """Claimed executions handed over and waiting for a free worker."""
    renewed: int = 0
    """Attempt leases renewed."""
    abandoned: int = 0
    """Attempts given up because this node no longer held them."""


class Work(msgspec.Struct, frozen=True):
    """A claimed execution and what is needed to finish it."""

    execution: Execution
    partition_id: int
    attempt_lease_s: float = 60.0
    """The attempt lease it was claimed with, renewed at the same length."""
    claimed_at: float | None = None
    """Monotonic time at which the claim was sent: the attempt lease runs from no earlier
    than that. ``None``: when handed over."""


class _Held:
    """A claimed execution this pool holds, waiting or running."""

    __slots__ = ("abandoned", "renewed_at", "scope", "work")

    def __init__(self, work: Work, now: float) -> None:
        self.work = work
        self.renewed_at = now
        self.scope: trio.CancelScope | None = None
        self.abandoned = False


class _Kind(msgspec.Struct, frozen=True):
    """A task type as the workers use it, cached."""

    expires: float
    task_type: TaskType
    handler: Handler
    policy: RetryPolicy


class WorkerPool:
    def __init__(
        self,
        config: WorkerPoolConfig,
        ledger: Ledger,
        clock: Clock,
        completions: CompletionWriter,
        options: HandlerOptions,
        rng: random.Random,
        *,
        table: PartitionTable,
        monitor: ClockMonitor,
        metrics: NodeMetrics,
        on_finished: Callable[[Execution], None] = lambda execution: None,
        on_retry: Callable[[datetime], None] = lambda at: None,
    ) -> None:
        self.config = config
        self._monitor = monitor
        self._metrics = metrics
        self._ledger = ledger
        self._clock = clock
        self._completions = completions
        self._options = options
        self._rng = rng
        self._table = table
        self._on_finished = on_finished
        self._on_retry = on_retry
        handoff_max = max(config.handoff_max, config.workers)
        self._send, self._receive = trio.open_memory_channel[Work](handoff_max)
        self._handoff_max = handoff_max
        self._duration_s = DURATION_S_INITIAL
        self._held: dict[tuple[str, int], _Held] = {}
        self._kinds: dict[str, _Kind] = {}
        self._loading: dict[str, trio.Lock] = {}
        self._unusable: set[tuple[str, int]] = set()
        """Task types (name, version) that could not be set up here, already logged."""
        self.schedules = ScheduleCache(ledger, clock, config.cache_ttl_s)
        self._busy = 0
        self._finished: dict[str, int] = {}
        self._counts = {"renewed": 0, "abandoned": 0}

    @property
    def capacity(self) -> int:
        """Claimed executions this pool holds at most now: one running per worker, and as
        many waiting as the workers are expected to start within ``handoff_wait_s``."""
        workers = self.config.workers
        expected = workers * self.config.handoff_wait_s / max(self._duration_s, 1e-6)
        return workers + int(min(max(expected, workers), self._handoff_max))

    @property
    def free(self) -> int:
        """How many more claimed executions :meth:`submit` takes without waiting."""
        return max(self.capacity - len(self._held), 0)

    async def submit(self, work: Work) -> None:
        """Hand a claimed execution to the workers; waits only when :attr:`free` is 0."""
        key = (work.execution.execution_id, work.execution.attempt)
        claimed_at = self._clock.monotonic() if work.claimed_at is None else work.claimed_at
        self._held[key] = _Held(work, claimed_at)
        try:
            try:
                self._send.send_nowait(work)  # room is the rule: the dispatcher counts ``free``
            except trio.WouldBlock:
                await self._send.send(work)
        except BaseException:
            del self._held[key]
            raise

    async def run(self, *, task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            for _ in range(self.config.workers):
                nursery.start_soon(self._worker)
            nursery.start_soon(self._renew_loop)
            task_status.started()

    def statistics(self) -> WorkerStatistics:
        return WorkerStatistics(
            self._busy,
            dict(self._finished),
            waiting=len(self._held) - self._busy,
            renewed=self._counts["renewed"],
            abandoned=self._counts["abandoned"],
        )

    async def task_type(self, name: str) -> tuple[TaskType, Handler]:
        """The task type ``name`` and its handler, cached for ``cache_ttl_s``."""
        kind = await self._kind(name)
        return kind.task_type, kind.handler

    async def _kind(self, name: str) -> _Kind:
        cached = self._kinds.get(name)
        if cached is not None and cached.expires > self._clock.monotonic():
            return cached
        # One read per task type, however many workers miss at once (a burst has every
        # worker miss together when the entry expires).
        async with self._loading.setdefault(name, trio.Lock()):
            cached = self._kinds.get(name)
            if cached is not None and cached.expires > self._clock.monotonic():
                return cached
            return self._remember(await self._ledger.task_types_get(name))

    def refresh_task_types(self, task_types: list[TaskType]) -> None:
        """Take the task types just read from the ledger (the dispatcher reads them all
        every few seconds): changed ones get a new handler, unchanged ones a new expiry.

        A task type this node cannot run (a ``shell`` one on a node without
        ``--enable-shell``, settings that no longer validate) is logged once per version and
        left out; its executions fail with ``setup_error`` when they come up, while every
        other task type keeps running.
        """
        for task_type in task_types:
            try:
                self._remember(task_type)
            except CarillonError as exc:
                key = (task_type.name, task_type.version)
                if key not in self._unusable:
                    self._unusable.add(key)
                    log.warning("task type %r cannot run on this node: %s", task_type.name, exc)

    def _remember(self, task_type: TaskType) -> _Kind:
        expires = self._clock.monotonic() + self.config.cache_ttl_s
        cached = self._kinds.get(task_type.name)
        if cached is not None and cached.task_type == task_type:
            kind = msgspec.structs.replace(cached, expires=expires)
        else:
            handler = build_handler(
                task_type.kind,
                task_type.settings,
                options=self._options,
                clock=self._monitor.clock(),
            )
            policy = RetryPolicy(
                max_attempts=task_type.max_attempts,
                backoff_base_s=task_type.backoff_base_s,
                backoff_max_s=task_type.backoff_max_s,
            )
            kind = _Kind(expires, task_type, handler, policy)
        self._kinds[task_type.name] = kind
        return kind

    # -- running ------------------------------------------------------------------------------

    async def _worker(self) -> None:
        async for work in self._receive:
            key = (work.execution.execution_id, work.execution.attempt)
            held = self._held.get(key)
            completed = False
            try:
                if held is None or held.abandoned:
                    continue  # given up while it waited: it never starts
                self._busy += 1
                started = self._clock.monotonic()
                try:
                    completed = await self._execute(work, held)
                finally:
                    self._busy -= 1
                    duration_s = self._clock.monotonic() - started
                    self._duration_s += DURATION_SMOOTHING * (duration_s - self._duration_s)
            finally:
                self._held.pop(key, None)
                if not completed:  # else in flight until the completion writer settles it
                    self._table.attempts_settled(work.partition_id)
                self._on_finished(work.execution)

    async def _execute(self, work: Work, held: _Held) -> bool:
        """Run one attempt; whether its completion went to the completion writer (an
        abandoned attempt writes none)."""
        execution = work.execution
        policy = _SETUP_FAILED_POLICY
        run_started: float | None = None
        try:
            # A database blip is not the execution's failure: wait it out (the attempt
            # lease renewals wait too) instead of spending an attempt as a setup error.
            # Both nearly always come from the caches: look there before setting up a read.
            now = self._clock.monotonic()
            kind = self._kinds.get(execution.task_type)
            if kind is None or kind.expires <= now:
                kind = await self._read(functools.partial(self._kind, execution.task_type))
                now = self._clock.monotonic()
            policy = kind.policy
            cached = self.schedules.cached(execution.schedule_id, now)
            schedule = (
                await self._read(functools.partial(self.schedules.get, execution.schedule_id))
                if cached is UNCACHED
                else cached
            )
            context = ExecutionContext(
                execution_id=execution.execution_id,
                schedule_id=execution.schedule_id,
                tenant_id=execution.tenant_id,
                task_type=execution.task_type,
                planned_at=execution.planned_at,
                attempt=execution.attempt,
                fencing_token=execution.fencing_token or 0,
                # Deleted while it ran: the attempt still gets its context.
                payload={} if schedule is None else schedule.payload,
            )
            if held.abandoned:
                return False  # taken away while its context was prepared
            run_started = self._clock.monotonic()
            if run_started - held.renewed_at >= work.attempt_lease_s * ATTEMPT_START_WITHIN:
                self._abandon(held, "its attempt lease may have run out before it could start")
                return False
            timeout_s = kind.task_type.timeout_s
            delay = self._monitor.now() - execution.planned_at
            self._metrics.execution_started(execution, delay.total_seconds())
            # One scope for both ends of a run: the deadline (the handler hangs) and an
            # abandonment (the attempt was taken away; see _abandon).
            with trio.CancelScope(deadline=trio.current_time() + timeout_s + TIMEOUT_GRACE_S) as (
                held.scope
            ):
                result = await kind.handler.run(context)
            if held.scope.cancelled_caught:
                if held.abandoned:
                    return False  # no completion: the attempt that replaced it counts
                result = HandlerResult.transient(
                    "timeout", f"the handler did not return within {timeout_s:g} s"
                )
        except CarillonError as exc:
            log.error("execution %s cannot run: %s", execution.execution_id, exc)
            result = HandlerResult.unknown("setup_error", str(exc))
        ran_s = 0.0 if run_started is None else self._clock.monotonic() - run_started
        if result.kind is OutcomeKind.SUCCEEDED:
            decision = _SUCCEEDED  # what decide() says of a success, without reading the clock
        else:
            decision = decide(
                result.kind,
                execution.attempt,
                policy,
                self._monitor.now(),  # retry times are compared with the database's clock
                self._rng,
                retry_after_s=result.retry_after_s,
            )
        self._finished[decision.outcome] = self._finished.get(decision.outcome, 0) + 1
        self._metrics.execution_finished(execution.task_type, decision.outcome, ran_s)
        if decision.not_before is not None:
            self._on_retry(decision.not_before)
        await self._completions.submit(
            work.partition_id,
            Completion(
                execution.execution_id,
                execution.attempt,
                _OUTCOMES[decision.outcome],
                decision.not_before,
                result.error_code,
                result.error_message,
            ),
        )
        return True

    async def _read(self, call: Callable[[], Awaitable[T]]) -> T:
        return await retry_unavailable(call, rng=self._rng, log=log, what="prepare an execution")

    # -- attempt leases -----------------------------------------------------------------------

    async def _renew_loop(self) -> None:
        while True:
            await trio.sleep(self.config.renew_check_s)
            try:
                await self.renew_attempt_leases()
            except CarillonError as exc:
                log.warning("renewing attempt leases failed (retried next round): %s", exc)

    async def renew_attempt_leases(self) -> int:
        """Renew the attempt leases of held executions a third of whose lease has passed;
        abandon those this node no longer holds. Returns how many were renewed."""
        now = self._clock.monotonic()
        by_lease: dict[float, list[_Held]] = {}
        for held in list(self._held.values()):
            lease_s = held.work.attempt_lease_s
            if not held.abandoned and now - held.renewed_at >= lease_s * RENEW_AFTER_FRACTION:
                by_lease.setdefault(lease_s, []).append(held)
        renewed = 0
        for lease_s, group in by_lease.items():
            for first in range(0, len(group), BATCH_ROWS_MAX):
                renewed += await self._renew(lease_s, group[first : first + BATCH_ROWS_MAX], now)
        return renewed

    async def _renew(self, lease_s: float, group: list[_Held], now: float) -> int:
        fences: dict[int, Fence] = {}
        wanted: list[_Held] = []
        for held in group:
            owned = self._table.get(held.work.partition_id)
            if owned is None:
                self._abandon(held, "its partition is no longer owned here")
                continue
            fences[owned.fence.partition_id] = owned.fence
            wanted.append(held)
        while wanted:
            params = ExecutionsExtend(
                list(fences.values()),
                [
                    AttemptRef(h.work.execution.execution_id, h.work.execution.attempt)
                    for h in wanted
                ],
                lease_s,
            )
            try:
                extended = set(
                    await retry_unavailable(
                        functools.partial(self._ledger.executions_extend, params),
                        rng=self._rng,
                        log=log,
                        what="renew attempt leases",
                    )
                )
            except LeaseLost as exc:
                lost = set(exc.partitions)
                for held in wanted:
                    if held.work.partition_id in lost:
                        self._abandon(held, "its partition's lease was lost")
                fences = {p: f for p, f in fences.items() if p not in lost}
                wanted = [h for h in wanted if h.work.partition_id not in lost]
                continue
            for held in wanted:
                if held.work.execution.execution_id in extended:
                    held.renewed_at = now
                else:
                    self._abandon(held, "the ledger no longer has this attempt running")
            self._counts["renewed"] += len(extended)
            return len(extended)
        return 0

    def _abandon(self, held: _Held, why: str) -> None:
        execution = held.work.execution
        log.warning(
            "attempt %d of %s abandoned: %s", execution.attempt, execution.execution_id, why
        )
        held.abandoned = True
        self._counts["abandoned"] += 1
        if held.scope is not None:
            held.scope.cancel()
