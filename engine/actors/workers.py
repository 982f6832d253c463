"""The workers: run claimed attempts through their task type's handler.

The claimers fill the claimed channel; one task, the *hand-out*, takes what is there in one
go and passes it to the workers a *turn* at a time: an attempt alone, or a batch of inline
attempts (below). For an attempt alone a worker builds the :class:`ExecutionContext` (the
execution id is the idempotency key), runs the task type's handler under the task type's
timeout, decides the execution's fate with :func:`~engine.core.retry_policy.decide`, and
sends the attempt, its completion attached, on to the completion writer. Whatever happens,
the worker gives back the attempt's run resources (:meth:`Attempt.run_ended`) before it
passes the attempt on, and closes the attempt itself when it does not pass it on.

**Inline attempts run in batches.** A handler whose ``run`` never waits declares itself
*inline* (``engine/handlers/base.py``: ``noop`` without a delay). For those, what costs is
not the handler but the machinery around it -- a channel receive (a trip through trio's run
loop) and a deadline cancel scope per attempt -- so consecutive inline attempts, up to
:data:`INLINE_BATCH_MAX`, make one turn: one worker runs them one after another inside one
cancel scope whose deadline is the earliest of theirs (an inline handler cannot overrun; the
deadline stops one that breaks its word). Each attempt keeps what it has alone: it is not
started if abandoned or if :meth:`WorkerPool._why_not_start` objects; one whose own deadline
passed before its turn came ends ``timeout`` without running; its duration is measured and
observed; its start delay is its own, read on a clock taken once per batch (the batch lasts
well under a millisecond). The metrics of the batch's starts and successes are added once
per batch, each observation still its own. An attempt that needs a read first (its task
type not cached when it is handed out, its schedule not cached or cached as gone), and
every attempt not reached when the scope was cancelled (its deadline, or an abandonment
cancelling the running one), runs alone after the batch.
With tracing on, nothing is batched: every attempt keeps its own span. The hand-out exists
for the batches: with every idle worker waiting on the claimed channel, trio handed each
claimed attempt straight to a worker of its own, and no attempt was ever found waiting.

**The handler boundary is a wall.** A handler is supposed to return every outcome as a
value, but whatever escapes it -- any exception, ``SystemExit`` and ``KeyboardInterrupt``
included -- becomes the *unknown* outcome ``handler_crashed`` of that attempt, logged with
its traceback. Only trio's cancellation (the node stopping, the attempt abandoned, its
deadline) passes through. No handler outcome can end a node.

**Attempt leases.** Every claimed attempt carries an attempt lease; if it runs out, the
redeliverer of the partition's owner re-queues the execution for another attempt. While an
attempt waits for a worker or runs, :meth:`WorkerPool.renew_attempt_leases` renews its
lease once a third of it has passed (fenced like every write), so a long handler keeps its
attempt. An attempt the ledger no longer has running under this number (re-queued after
all, completed elsewhere), or one of a partition this node no longer owns, is *abandoned*:
its handler is cancelled, or it never starts, and no completion is written -- the attempt
that replaced it is the one that counts.

**A handler starts only for a partition owned and trusted at that moment**, and only while
less than :data:`ATTEMPT_START_WITHIN` of its attempt lease has passed since the claim or
the last renewal *began*: after that, the lease may have run out (a node frozen or cut off
from the database) and the partition's owner may have re-queued and re-run the execution.
A *folded* attempt (docs/ledger.md, "Folded claims") has no attempt lease: it starts only
if its bound -- its deadline here -- ends within the partition's trust window, and never in
a partition being handed back; it runs under the attempt number after its execution's.

**Durations** feed the pipeline's :class:`~engine.core.admission.HandoffSizer`, measured
from the handler's start (not from the hand-off, which a frozen process would stretch) and
clamped to the handler's timeout. In an inline batch an attempt's run is timed from the end
of the one before it: one clock reading per attempt, the accounting between them included.

**An execution runs with its schedule's payload, never without one.** If its schedule was
deleted after the claim (or its id now belongs to another tenant), checked against the
ledger itself rather than a cached "deleted", the handler never starts: the execution ends
``skipped`` with ``schedule_deleted``, as the delete ends every execution not yet started.

Task types and their handlers come from :class:`~engine.actors.task_kinds.TaskKinds`,
schedules from the pipeline's :class:`~engine.actors.schedule_cache.ScheduleCache`. While
the ledger is unavailable those reads are retried with backoff: a database blip is not the
execution's failure and spends none of its attempts. A task type that cannot be found or
built fails the attempt as *unknown* (``setup_error``) rather than crashing the worker.
"""

from __future__ import annotations

import functools
import logging
import traceback
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final, TypeGuard, TypeVar

import msgspec
import trio

from engine.actors.announcements import Announcements
from engine.actors.attempts import Attempt, Room
from engine.actors.context import NodeContext
from engine.actors.retry import call_fenced, retry_unavailable
from engine.actors.schedule_cache import UNCACHED, ScheduleCache
from engine.actors.task_kinds import BLOCKING_KINDS, CALLING_OUT_KINDS, TaskKind, TaskKinds
from engine.config import BLOCKING_WORKERS_DEFAULT, WORKERS_DEFAULT
from engine.core.retry_policy import ATTEMPT_OVERRUN_S, Decision, RetryPolicy, decide
from engine.errors import CarillonError
from engine.handlers import ExecutionContext, HandlerResult, OutcomeKind
from engine.handlers.base import ERROR_MESSAGE_CHARS_MAX, is_cancellation
from engine.ledger.params import (
    BATCH_ROWS_MAX,
    SCHEDULE_DELETED,
    SCHEDULE_DELETED_MESSAGE,
    AttemptRef,
    Completion,
    ExecutionsExtend,
    Fence,
    Outcome,
)
from engine.model import Execution, Schedule
from engine.tracing import Tracing

if TYPE_CHECKING:
    from opentelemetry.trace import Span

log = logging.getLogger("carillon.workers")

T = TypeVar("T")

TIMEOUT_GRACE_S: Final = ATTEMPT_OVERRUN_S
"""Extra time a handler gets beyond its task type's timeout before the worker abandons it."""
INLINE_BATCH_MAX: Final = 64
"""Most inline attempts a worker takes in one turn: enough that the per-turn costs (a channel
receive, a cancel scope, a trip through trio's run loop) are a few percent of the batch's,
few enough that the others waiting see the worker come round within a millisecond."""
HANDOFF_MAX_DEFAULT: Final = 1_000
"""Two claim batches: one being claimed while the workers still hold the other."""
HANDOFF_WAIT_S_DEFAULT: Final = 1.0
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
HANDLER_CRASHED: Final = "handler_crashed"
TASK_TYPE_UNAVAILABLE: Final = "task_type_unavailable"
"""The error code of a run whose tenant may no longer use its task type (a grant withdrawn
after it was queued): it fails for good without running."""
"""The ``error_code`` of an attempt whose handler raised instead of returning a result."""
_OUTCOMES: Final = {str(outcome): outcome for outcome in Outcome}
_SUCCEEDED: Final = Decision("succeeded")
_SUCCEEDED_RESULT: Final = HandlerResult.succeeded()
"""The one success every handler returns (``HandlerResult.succeeded()``)."""
_SETUP_FAILED_POLICY: Final = RetryPolicy()
"""The retry policy of an attempt whose task type could not be read or built."""


_Turn = tuple[list[Attempt], list[TaskKind] | None]
"""What a worker takes at once: an attempt alone (no kinds), or a batch of inline attempts
with their task kinds."""


class _Unavailable(Exception):
    """The execution's tenant may not use its task type."""


def renew_check_s_for(attempt_lease_s: float) -> float:
    """How often to look at the attempt leases of executions claimed with
    ``attempt_lease_s``: every :data:`RENEW_CHECK_S_DEFAULT`, or often enough that a lease
    is renewed by half its length (a 3 s lease checked every 5 s ran out before its first
    renewal, so every handler longer than the lease was re-queued and abandoned forever)."""
    return min(RENEW_CHECK_S_DEFAULT, attempt_lease_s * RENEW_AFTER_FRACTION / 2)


class WorkerPoolConfig(msgspec.Struct, frozen=True):
    workers: int = WORKERS_DEFAULT
    handoff_max: int = HANDOFF_MAX_DEFAULT
    """Claimed executions waiting for a free worker at most. They let the dispatcher claim
    the next batches while the workers run this one; their attempt leases are renewed while
    they wait. Fewer are taken when handlers are slow (see ``handoff_wait_s``)."""
    handoff_wait_s: float = HANDOFF_WAIT_S_DEFAULT
    """About how long a claimed execution may wait for a worker: the hand-off holds no more
    than the workers finish in that time, judged by a moving average of handler durations
    (and never fewer than one per worker)."""
    renew_check_s: float = RENEW_CHECK_S_DEFAULT
    blocking_workers: int = BLOCKING_WORKERS_DEFAULT
    """Of the workers, how many may run a python or shell attempt at once (each holds a
    thread or a process); the others wait for one of those, their attempt leases renewed."""


class WorkerStatistics(msgspec.Struct, frozen=True):
    busy: int
    finished: dict[str, int]
    waiting: int = 0
    """Claimed executions handed over and waiting for a free worker."""
    renewed: int = 0
    """Attempt leases renewed."""
    abandoned: int = 0
    """Attempts given up because this node no longer held them."""
    crashed: int = 0
    """Attempts whose handler raised instead of returning (``handler_crashed``)."""
    inline_batches: int = 0
    """Turns in which a worker ran a batch of inline attempts (see the module docstring)."""


class WorkerPool:
    """``config.workers`` workers between the claimed and the completed channels."""

    def __init__(
        self,
        config: WorkerPoolConfig,
        *,
        ctx: NodeContext,
        kinds: TaskKinds,
        schedules: ScheduleCache,
        announcements: Announcements,
        room: Room,
    ) -> None:
        self.config = config
        self._ledger = ctx.ledger
        self._clock = ctx.clock
        self._monitor = ctx.monitor
        self._table = ctx.table
        self._kinds = kinds
        self._schedules = schedules
        self._announcements = announcements
        self._room = room
        self._metrics = ctx.metrics
        self._tracing = ctx.tracing
        self._rng = ctx.rng
        self._blocking = trio.CapacityLimiter(config.blocking_workers)
        self._busy = 0
        self._finished: dict[str, int] = {}
        self._counts = {"renewed": 0, "abandoned": 0, "crashed": 0, "inline_batches": 0}

    async def run(
        self,
        claimed: trio.MemoryReceiveChannel[Attempt],
        completed: trio.MemorySendChannel[Attempt],
        *,
        task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        # Plain python callables run in trio's worker threads: enough for every blocking slot.
        threads = trio.to_thread.current_default_thread_limiter()
        threads.total_tokens = max(threads.total_tokens, self.config.blocking_workers)
        # Sized as the claimed channel: every attempt the room lets in fits, so the hand-out
        # never waits on it.
        give, take = trio.open_memory_channel[_Turn](self._room.sizer.capacity_max)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._hand_out, claimed, give)
            for _ in range(self.config.workers):
                nursery.start_soon(self._worker, take, completed)
            nursery.start_soon(self._renew_loop)
            task_status.started()

    @property
    def busy(self) -> int:
        """Attempts whose handler runs now."""
        return self._busy

    def statistics(self) -> WorkerStatistics:
        held = sum(1 for attempt in self._room.open if attempt.held_here)
        return WorkerStatistics(
            self._busy,
            dict(self._finished),
            waiting=max(held - self._busy, 0),
            renewed=self._counts["renewed"],
            abandoned=self._counts["abandoned"],
            crashed=self._counts["crashed"],
            inline_batches=self._counts["inline_batches"],
        )

    # -- running ------------------------------------------------------------------------------

    async def _hand_out(
        self,
        claimed: trio.MemoryReceiveChannel[Attempt],
        turns: trio.MemorySendChannel[_Turn],
    ) -> None:
        """Pass the claimed attempts on to the workers, a turn each: an attempt alone, or up
        to :data:`INLINE_BATCH_MAX` inline attempts that came one after another.

        One task receives from the claimers, so that what they send while it runs waits in
        the channel and is taken in one go. (Had every idle worker waited on that channel,
        trio would have handed each attempt straight to a worker of its own: a burst of
        noops ran in batches of one.)"""
        receive_nowait = claimed.receive_nowait
        batch: list[Attempt] = []
        kinds: list[TaskKind] = []
        try:
            with turns:  # once the claimers are gone and all is handed out, the workers end
                async for attempt in claimed:
                    now = self._clock.monotonic()
                    while True:
                        kind = self._inline_kind(attempt, now)
                        if kind is None:
                            if batch:
                                await self._give(turns, (batch, kinds))
                                batch, kinds = [], []
                            await self._give(turns, ([attempt], None))
                        else:
                            batch.append(attempt)
                            kinds.append(kind)
                            if len(batch) == INLINE_BATCH_MAX:
                                await self._give(turns, (batch, kinds))
                                batch, kinds = [], []
                        try:
                            attempt = receive_nowait()
                        except (trio.WouldBlock, trio.EndOfChannel):
                            break
                    if batch:
                        await self._give(turns, (batch, kinds))
                        batch, kinds = [], []
        finally:
            for attempt in batch:
                attempt.close()

    @staticmethod
    async def _give(turns: trio.MemorySendChannel[_Turn], turn: _Turn) -> None:
        """Send ``turn`` to the workers (the channel holds every attempt the room lets in, so
        it does not wait), or close its attempts if it is cancelled first."""
        try:
            turns.send_nowait(turn)
        except trio.WouldBlock:
            try:
                await turns.send(turn)
            except BaseException:
                for attempt in turn[0]:  # not sent: nobody else will close them
                    attempt.close()
                raise

    async def _worker(
        self,
        turns: trio.MemoryReceiveChannel[_Turn],
        completed: trio.MemorySendChannel[Attempt],
    ) -> None:
        async for attempts, kinds in turns:
            if kinds is None:
                await self._run_one(attempts[0], completed)
            else:
                await self._run_inline(attempts, kinds, completed)

    def _inline_kind(self, attempt: Attempt, now: float) -> TaskKind | None:
        """The cached task kind of ``attempt`` if it may run in an inline batch: its handler
        is inline, and tracing is off (an attempt span is per attempt: the one-by-one path
        keeps them as they were)."""
        if self._tracing is not None:
            return None
        kind = self._kinds.cached(attempt.item.task_type, now)
        return kind if kind is not None and kind.inline else None

    async def _run_one(self, attempt: Attempt, completed: trio.MemorySendChannel[Attempt]) -> None:
        """Run ``attempt`` alone, and hand it on (or close it)."""
        passed_on = False
        try:
            if attempt.abandoned:
                return  # given up while it waited: it never starts
            if await self._execute(attempt):
                attempt.run_ended()  # before the completion waits for room
                try:
                    completed.send_nowait(attempt)
                except trio.WouldBlock:
                    await completed.send(attempt)
                passed_on = True
        finally:
            if not passed_on:
                attempt.close()

    async def _run_inline(
        self,
        batch: list[Attempt],
        kinds: list[TaskKind],
        completed: trio.MemorySendChannel[Attempt],
    ) -> None:
        """Run a batch of inline attempts (:meth:`_run_batch`), hand their completions on, then
        run alone those it left; see the module docstring. Every attempt of the batch is
        handed on, run alone or closed exactly once, whatever ends the batch."""
        self._counts["inline_batches"] += 1
        gone: set[int] = set()
        """The ids of the attempts no longer this batch's to close (handed on, run alone)."""
        try:
            done, alone = await self._run_batch(batch, kinds)
            for attempt in done:
                try:
                    completed.send_nowait(attempt)
                except trio.WouldBlock:
                    await completed.send(attempt)  # sent, or cancelled and not sent
                gone.add(id(attempt))
            for attempt in alone:
                gone.add(id(attempt))
                await self._run_one(attempt, completed)
        finally:
            for attempt in batch:
                if id(attempt) not in gone:
                    attempt.close()

    async def _run_batch(
        self, batch: list[Attempt], kinds: list[TaskKind]
    ) -> tuple[list[Attempt], list[Attempt]]:
        """Run the inline attempts of ``batch`` one after another in one cancel scope: those
        with a completion to hand on (their run resources given back), and those to run alone.

        Per attempt, as :meth:`_execute` does: the abandonment and start checks (closing the
        attempt when it must not start), the start delay, the wall around the handler, the
        duration and the completion; the metrics of the batch's starts and successes are
        added once, at its end. What needs a read (a schedule not cached, or cached as gone)
        and what was not reached when the scope was cancelled (its deadline, an abandonment)
        is left to run alone."""
        done: list[Attempt] = []
        """Run, their run resources given back: to hand on."""
        alone: list[Attempt] = []
        """To run one by one after the batch."""
        started: list[Execution] = []
        delays: list[float] = []
        numbers: list[int] = []
        """The attempts' numbers (a folded attempt runs under its execution's next one)."""
        succeeded: dict[str, list[float]] = {}
        """The durations of the successes, by task type."""
        running: Attempt | None = None
        reached = 0
        try:
            monotonic = self._clock.monotonic
            observe = self._room.observe
            now = run_started = monotonic()
            monitor_now = self._monitor.now()
            delay_at: dict[datetime, float] = {}
            started_at = trio.current_time()
            grace = TIMEOUT_GRACE_S
            bounds = [
                attempt.fold_bound_s if attempt.folded else kind.task_type.timeout_s + grace
                for attempt, kind in zip(batch, kinds, strict=True)
            ]
            """How long each may run: a folded attempt its bound, any other its timeout and
            the grace."""
            with trio.CancelScope(deadline=started_at + min(bounds)) as scope:
                for attempt in batch:
                    reached += 1
                    if attempt.abandoned:
                        attempt.close()  # given up while it waited: it never starts
                        continue
                    execution = attempt.item
                    kind = kinds[reached - 1]
                    task_type = kind.task_type
                    if not task_type.usable_by(execution.tenant_id):
                        result = self._unavailable(execution)
                        attempt.completion = self._complete(attempt, result, kind.policy, 0.0)
                        attempt.run_ended()
                        done.append(attempt)
                        continue
                    schedule = self._schedules.cached(execution.schedule_id, now)
                    if (
                        schedule is UNCACHED
                        or not _runs_under(schedule, execution)
                        or attempt.start_after > run_started
                    ):
                        # A read first, or a folded attempt popped at its instant that must
                        # wait out the clock's uncertainty (never early): alone, after.
                        alone.append(attempt)
                        continue
                    why_not = self._why_not_start(attempt, run_started)
                    if why_not is not None:
                        self._abandon(attempt, why_not)
                        attempt.close()
                        continue
                    planned_at = execution.planned_at
                    delay_s = delay_at.get(planned_at)
                    if delay_s is None:
                        delay_s = delay_at[planned_at] = (monitor_now - planned_at).total_seconds()
                    number = attempt.number
                    started.append(execution)
                    delays.append(delay_s)
                    numbers.append(number)
                    if attempt.folded:  # its finish records when it started
                        attempt.started_at = monitor_now
                    timeout_s = task_type.timeout_s
                    ran: object = None
                    if run_started < started_at + bounds[reached - 1]:  # else: its deadline passed
                        context = ExecutionContext(
                            execution_id=execution.execution_id,
                            schedule_id=execution.schedule_id,
                            tenant_id=execution.tenant_id,
                            task_type=execution.task_type,
                            planned_at=planned_at,
                            attempt=number,
                            fencing_token=execution.fencing_token or 0,
                            payload=schedule.payload,
                        )
                        running = attempt
                        attempt.scope = scope
                        self._busy += 1
                        try:
                            ran = await kind.handler.run(context)
                        except BaseException as error:  # the wall: see the module docstring
                            if is_cancellation(error):
                                raise
                            ran = self._crashed(attempt, error)
                        finally:
                            self._busy -= 1
                            attempt.scope = None
                        running = None
                    ended = monotonic()
                    if ran is _SUCCEEDED_RESULT and not attempt.abandoned:
                        # The common case, written out: what _ran() does for a success.
                        ran_s = ended - run_started
                        observe(ran_s, timeout_s)
                        durations = succeeded.get(execution.task_type)
                        if durations is None:
                            durations = succeeded[execution.task_type] = []
                        durations.append(ran_s)
                        attempt.completion = Completion(
                            execution.execution_id,
                            number,
                            Outcome.SUCCEEDED,
                            started_at=monitor_now if attempt.folded else None,
                        )
                        attempt.run_ended()
                        done.append(attempt)
                    elif self._ran(attempt, ran, kind, run_started, ended):
                        done.append(attempt)
                    run_started = ended
            if running is not None:
                # The scope's deadline (the handler broke its word) or an abandonment
                # stopped it in the middle of its run; what was not reached runs alone.
                if self._ran(running, None, kinds[reached - 1], run_started, monotonic()):
                    done.append(running)
                alone += batch[reached:]
        finally:
            self._counted(started, delays, numbers, succeeded)
        return done, alone

    def _counted(
        self,
        started: list[Execution],
        delays: list[float],
        numbers: list[int],
        succeeded: dict[str, list[float]],
    ) -> None:
        """The metrics of an inline batch's starts and successes, added at once."""
        if started:
            self._metrics.executions_started_each(started, delays, numbers)
        for task_type, durations in succeeded.items():
            self._metrics.executions_finished_each(task_type, _SUCCEEDED.outcome, durations)
            self._finished[_SUCCEEDED.outcome] = self._finished.get(_SUCCEEDED.outcome, 0) + len(
                durations
            )

    def _ran(
        self, attempt: Attempt, ran: object, kind: TaskKind, run_started: float, ended: float
    ) -> bool:
        """Account for an inline attempt's run (``ran``: what its handler returned, ``None``
        for its deadline): its completion attached and its run resources given back, or,
        abandoned meanwhile, closed. Whether it has a completion to hand on."""
        if ran is not None and not isinstance(ran, HandlerResult):
            ran = self._crashed(attempt, TypeError(f"the handler returned {ran!r}"))
        elif attempt.abandoned:
            attempt.close()  # abandoned while it ran: the attempt that replaced it counts
            return False
        timeout_s = kind.task_type.timeout_s
        if ran is None:
            ran = HandlerResult.transient(
                "timeout", f"the handler did not return within {timeout_s:g} s"
            )
        assert isinstance(ran, HandlerResult)
        ran_s = ended - run_started
        self._room.observe(ran_s, timeout_s)
        attempt.completion = self._complete(attempt, ran, kind.policy, ran_s)
        attempt.run_ended()
        return True

    def _unavailable(self, execution: Execution) -> HandlerResult:
        message = (
            f"task type {execution.task_type!r} is not available to tenant {execution.tenant_id!r}"
        )
        log.error("execution %s cannot run: %s", execution.execution_id, message)
        return HandlerResult.permanent(TASK_TYPE_UNAVAILABLE, message)

    async def _execute(self, attempt: Attempt) -> bool:
        """Run one attempt; whether it has a completion to write (an abandoned attempt has
        none). With tracing on, its handler runs in an attempt span, ended here exactly once
        (``engine/tracing.py``); with it off, that costs a few ``None`` checks."""
        tracing = self._tracing
        span: Span | None = None
        ran_as: str | None = None
        """The classification of the handler's result, for the span's status."""
        try:
            execution = attempt.item  # the execution (once per attempt: no property call)
            policy = _SETUP_FAILED_POLICY
            run_started: float | None = None
            timeout_s = 0.0
            try:
                # A database blip is not the execution's failure: wait it out (the attempt
                # lease renewals wait too) instead of spending an attempt as a setup error.
                # Both nearly always come from the caches: look there before setting up a read.
                now = self._clock.monotonic()
                kind = self._kinds.cached(execution.task_type, now)
                if kind is None:
                    kind = await self._read(functools.partial(self._kinds.get, execution.task_type))
                    now = self._clock.monotonic()
                policy = kind.policy
                if not kind.task_type.usable_by(execution.tenant_id):
                    # The ledger lets no live schedule name a task type its tenant may not use;
                    # this run was queued (or dead-lettered) before a grant was withdrawn.
                    raise _Unavailable(
                        f"task type {execution.task_type!r} is not available to tenant "
                        f"{execution.tenant_id!r}"
                    )
                cached = self._schedules.cached(execution.schedule_id, now)
                schedule = (
                    await self._read(functools.partial(self._schedules.get, execution.schedule_id))
                    if cached is UNCACHED
                    else cached
                )
                if not _runs_under(schedule, execution):
                    # Gone, as cached (up to ttl_s ago): ask the ledger before skipping it.
                    refresh = functools.partial(self._schedules.refresh, execution.schedule_id)
                    schedule = await self._read(refresh)
                    if not _runs_under(schedule, execution):
                        attempt.completion = self._schedule_gone(attempt)
                        return True
                context = ExecutionContext(
                    execution_id=execution.execution_id,
                    schedule_id=execution.schedule_id,
                    tenant_id=execution.tenant_id,
                    task_type=execution.task_type,
                    planned_at=execution.planned_at,
                    attempt=attempt.number,
                    fencing_token=execution.fencing_token or 0,
                    payload=schedule.payload,
                )
                # One coroutine from here to the handler's result: each await level is a frame
                # per attempt, tens of thousands a second in a burst.
                blocking = kind.task_type.kind in BLOCKING_KINDS
                if blocking:
                    await self._blocking.acquire()
                try:
                    if attempt.abandoned:
                        return False  # taken away while it waited
                    run_started = self._clock.monotonic()
                    if attempt.start_after > run_started:  # folded, popped at its instant
                        await trio.sleep(attempt.start_after - run_started)  # never early
                        run_started = self._clock.monotonic()
                    why_not = self._why_not_start(attempt, run_started)
                    if why_not is not None:
                        self._abandon(attempt, why_not)
                        return False
                    timeout_s = kind.task_type.timeout_s
                    started_at = attempt.started_at = self._monitor.now()
                    delay_s = (started_at - execution.planned_at).total_seconds()
                    token: object = None
                    if tracing is None:
                        self._metrics.execution_started(execution, delay_s, attempt=attempt.number)
                    else:
                        client = kind.task_type.kind in CALLING_OUT_KINDS
                        span = tracing.start_attempt(attempt, delay_s, client=client)
                        exemplar = Tracing.exemplar(span)
                        self._metrics.execution_started(
                            execution, delay_s, exemplar=exemplar, attempt=attempt.number
                        )
                        token = Tracing.attach(span)  # the handler's current span
                    # One scope for both ends of a run: the deadline (the handler hangs) and an
                    # abandonment (the attempt was taken away; see _abandon).
                    deadline = trio.current_time() + (
                        attempt.fold_bound_s if attempt.folded else timeout_s + TIMEOUT_GRACE_S
                    )
                    ran: HandlerResult | None = None
                    self._busy += 1
                    try:
                        with trio.CancelScope(deadline=deadline) as attempt.scope:
                            ran = await kind.handler.run(context)
                    except BaseException as error:  # the wall: see the module docstring
                        if is_cancellation(error):
                            raise
                        ran = self._crashed(attempt, error)
                    finally:
                        self._busy -= 1
                        attempt.scope = None
                        if token is not None:
                            Tracing.detach(token)
                finally:
                    if blocking:
                        self._blocking.release()
                if ran is not None and not isinstance(ran, HandlerResult):
                    ran = self._crashed(attempt, TypeError(f"the handler returned {ran!r}"))
                elif attempt.abandoned:
                    return False  # abandoned while it ran: the attempt that replaced it counts
                elif ran is None:  # the deadline: the handler ignored its own timeout
                    ran = HandlerResult.transient(
                        "timeout", f"the handler did not return within {timeout_s:g} s"
                    )
                result = ran
            except _Unavailable as exc:
                log.error("execution %s cannot run: %s", execution.execution_id, exc)
                result = HandlerResult.permanent(TASK_TYPE_UNAVAILABLE, str(exc))
            except CarillonError as exc:
                log.error("execution %s cannot run: %s", execution.execution_id, exc)
                result = HandlerResult.unknown("setup_error", str(exc))
            ran_s = 0.0
            if span is not None:
                ran_as = result.kind.value
            if run_started is not None:
                ran_s = self._clock.monotonic() - run_started
                self._room.observe(ran_s, timeout_s)
            attempt.completion = self._complete(attempt, result, policy, ran_s)
            return True
        finally:
            if span is not None:
                Tracing.end_attempt(span, attempt.completion, ran_as)

    def _schedule_gone(self, attempt: Attempt) -> Completion:
        """The completion of an attempt whose schedule was deleted after it was claimed: what
        it would run with (the payload) went with the schedule, so its handler never starts,
        and it ends as the delete ends every execution that has not started -- ``skipped``
        with ``schedule_deleted`` (terminal: not retried, not a dead letter)."""
        execution = attempt.execution
        log.warning(
            "execution %s not run: its schedule %s was deleted",
            execution.execution_id,
            execution.schedule_id,
        )
        outcome = Outcome.SKIPPED
        self._finished[outcome.value] = self._finished.get(outcome.value, 0) + 1
        self._metrics.skipped(SCHEDULE_DELETED)
        return Completion(
            execution.execution_id,
            attempt.number,
            outcome,
            None,
            SCHEDULE_DELETED,
            SCHEDULE_DELETED_MESSAGE,
            self._monitor.now() if attempt.folded else None,
        )

    def _why_not_start(self, attempt: Attempt, now: float) -> str | None:
        """Why ``attempt``'s handler must not start now, or ``None``. A folded attempt has
        no attempt lease: what keeps another node from running it meanwhile is this node's
        partition lease, so its bound must end within the lease's trust window, and it does
        not start in a partition being handed back (docs/ledger.md, "Folded claims")."""
        owned = self._table.get(attempt.partition_id)
        if owned is None:
            return "its partition is no longer owned here"
        if owned.trusted_until <= now:
            return "its partition's lease is no longer trusted"
        if attempt.folded:
            if now + attempt.fold_bound_s > owned.trusted_until:
                return "its bound ends after its partition's trust window (folded)"
            if owned.draining:
                return "its partition is being handed back (folded)"
            return None
        if now - attempt.renewed_at >= attempt.lease_s * ATTEMPT_START_WITHIN:
            return "its attempt lease may have run out before it could start"
        return None

    def _crashed(self, attempt: Attempt, error: BaseException) -> HandlerResult:
        self._counts["crashed"] += 1
        log.error(
            "the handler of %s raised instead of returning a result",
            attempt.execution.execution_id,
            exc_info=error,
        )
        frames = traceback.extract_tb(error.__traceback__)
        origin = f" (raised at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""
        text = f"{type(error).__name__}: {error}"[: ERROR_MESSAGE_CHARS_MAX // 2] + origin
        return HandlerResult.unknown(HANDLER_CRASHED, text[:ERROR_MESSAGE_CHARS_MAX])

    def _complete(
        self, attempt: Attempt, result: HandlerResult, policy: RetryPolicy, ran_s: float
    ) -> Completion:
        execution = attempt.item
        number = attempt.number
        if result.kind is OutcomeKind.SUCCEEDED:
            decision = _SUCCEEDED  # what decide() says of a success, without reading the clock
        else:
            decision = decide(
                result.kind,
                number,
                policy,
                self._monitor.now(),  # retry times are compared with the database's clock
                self._rng,
                retry_after_s=result.retry_after_s,
            )
        self._finished[decision.outcome] = self._finished.get(decision.outcome, 0) + 1
        self._metrics.execution_finished(execution.task_type, decision.outcome, ran_s)
        if decision.not_before is not None:
            self._announcements.announce(decision.not_before)
        started_at = None
        if attempt.folded:  # the finish records when it started (now: its setup failed)
            started_at = attempt.started_at or self._monitor.now()
        return Completion(
            execution.execution_id,
            number,
            _OUTCOMES[decision.outcome],
            decision.not_before,
            result.error_code,
            result.error_message,
            started_at,
        )

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
        """Renew the attempt leases of held attempts a third of whose lease has passed;
        abandon those this node no longer holds. Returns how many were renewed."""
        now = self._clock.monotonic()
        by_lease: dict[float, list[Attempt]] = {}
        for attempt in list(self._room.open):
            lease_s = attempt.lease_s
            if attempt.running_here and now - attempt.renewed_at >= lease_s * RENEW_AFTER_FRACTION:
                by_lease.setdefault(lease_s, []).append(attempt)
        renewed = 0
        for lease_s, group in by_lease.items():
            for first in range(0, len(group), BATCH_ROWS_MAX):
                renewed += await self._renew(lease_s, group[first : first + BATCH_ROWS_MAX], now)
        return renewed

    async def _renew(self, lease_s: float, group: list[Attempt], now: float) -> int:
        fences: dict[int, Fence] = {}
        wanted: list[Attempt] = []
        for attempt in group:
            owned = self._table.get(attempt.partition_id)
            if owned is None:
                self._abandon(attempt, "its partition is no longer owned here")
                continue
            fences[owned.fence.partition_id] = owned.fence
            wanted.append(attempt)

        async def extend(fences: list[Fence], attempts: list[Attempt]) -> list[str]:
            refs = [AttemptRef(a.execution.execution_id, a.execution.attempt) for a in attempts]
            return await self._ledger.executions_extend(ExecutionsExtend(fences, refs, lease_s))

        result, kept, lost = await call_fenced(
            fences,
            wanted,
            _partition_of,
            extend,
            rng=self._rng,
            log=log,
            what="renew attempt leases",
        )
        for attempt in wanted:
            if attempt.partition_id in lost:
                self._abandon(attempt, "its partition's lease was lost")
        extended = set(result or ())
        for attempt in kept:
            if attempt.execution.execution_id in extended:
                attempt.renewed_at = now
            else:
                self._abandon(attempt, "the ledger no longer has this attempt running")
        self._counts["renewed"] += len(extended)
        return len(extended)

    def _abandon(self, attempt: Attempt, why: str) -> None:
        execution = attempt.execution
        log.warning("attempt %d of %s abandoned: %s", attempt.number, execution.execution_id, why)
        attempt.abandoned = True
        self._counts["abandoned"] += 1
        if attempt.scope is not None:
            attempt.scope.cancel()


def _runs_under(schedule: Schedule | None, execution: Execution) -> TypeGuard[Schedule]:
    """Whether ``execution`` may run with ``schedule``'s payload: its schedule exists, and
    is still of the execution's tenant (a deleted id may be created again)."""
    return schedule is not None and schedule.tenant_id == execution.tenant_id


def _partition_of(attempt: Attempt) -> int:
    return attempt.partition_id
