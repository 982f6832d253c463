"""Moves due executions of the owned partitions from the ledger to the workers, fairly.

Design
------
Three kinds of task share a :class:`~engine.core.fair_queue.FairQueue`:

* **fetch** -- ahead of each instant something was announced for (the planner announces every
  instant it planned, workers announce retries; ``fetch_ahead_s`` early) and at least every
  ``fetch_interval_s``, it reads the startable executions of the owned partitions
  (``executions_due``, by the database-corrected clock) and queues those it does not hold
  yet. Through a backlog it pages with a keyset cursor (the *pass*, every tenant in the
  ledger's order) and fills the queue up to its bound -- fairness can only weigh what has
  been fetched -- and no further: the rest of a backlog stays in the ledger, not in memory.
  Filled in the ledger's order, the queue would hold the tenants by backlog, not by weight
  (the heavy tenants' items run out while the light tenants' pile up), so each tenant gets a
  share of the bound by weight (:mod:`~engine.core.queue_shares`): a tenant past its share
  *spills* -- the pass leaves the rest of its work to reads of that tenant alone
  (``executions_due`` with ``tenant_id``), made whenever its queued items fall a refill's
  worth below its share, the emptiest tenant first. While every tenant of the pass has
  spilled, the pass reads on only at the fallback interval or when new work is announced.
  A page's schedules are read meanwhile by another task.
* **dispatch** -- pops executions in weighted-fair order across tenants (never before their
  instant, never beyond a cap, quota or tenant rate), paced by an optional node-wide token
  bucket (a pacing tick's worth at a time), as many as the pipeline's
  :class:`~engine.actors.attempts.Room` admits *now* (backpressure, asked afresh at every
  release: :func:`~engine.core.admission.claim_size`). Each popped execution becomes an
  :class:`~engine.actors.attempts.Attempt` that owns its resources from then on; the
  schedule's overlap policy (:mod:`~engine.actors.overlap`) admits it or not, and the
  admitted batch goes to a claimer.
* **claimers** (two, so one claim's round trip overlaps the next) claim a batch in one
  fenced call (``executions_claim``: queued -> running, next attempt, attempt lease) and
  send what they claimed on the claimed channel to the workers. What is not claimed is
  closed at once: its slots are free for the next pop. Short attempts of out-of-process
  kinds that fit the partition's trust window are *folded* instead (:meth:`Dispatcher._fold`;
  docs/ledger.md, "Folded claims"): sent without a claim, their claim written with their
  completion, and kept out of fetches until they are closed.

Each claimed execution gets an attempt lease of ``attempt_lease_s``, which the worker pool
renews while it holds the execution; a crashed node's attempts run out and the redeliverer
re-queues them. An execution claimed by no one (another node got it, or it stopped being
startable) is simply forgotten; the ledger stays the source of truth.

What to fetch is announced on the node's :class:`~engine.actors.announcements.Announcements`
board; the dispatcher reads it and holds no reference to any announcer. It keeps
:attr:`Dispatcher.progress_at`, the last time it could hand work on or had none to hand on,
for the pipeline's stall watchdog.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, Final

import msgspec
import trio

from engine.actors.announcements import Announcements
from engine.actors.attempts import DISPATCHING, FOLDED, IN_FLIGHT, LIMITS, Attempt, Room
from engine.actors.context import NodeContext
from engine.actors.overlap import OverlapGuard
from engine.actors.retry import call_fenced
from engine.actors.schedule_cache import ScheduleCache
from engine.actors.task_kinds import BLOCKING_GROUP, BLOCKING_KINDS, TaskKinds
from engine.config import (
    ATTEMPT_LEASE_S_DEFAULT,
    DISPATCH_BURST_DEFAULT,
    DISPATCH_QUEUE_MAX_DEFAULT,
    DISPATCH_SMOOTHING_WINDOW_S_DEFAULT,
)
from engine.core.dispatch import ConcurrencyLimits, idle_wait_s
from engine.core.fair_queue import FairQueue, PushOutcome
from engine.core.queue_shares import Position, QueueShares
from engine.core.token_bucket import TokenBucket
from engine.errors import CarillonError
from engine.ledger.params import (
    PAGE_SIZE_MAX,
    DueCursor,
    ExecutionsClaim,
    ExecutionsDue,
    Fence,
    due_cursor,
)
from engine.metrics import SKIP_OVERLAP
from engine.model import Execution, startable_at
from engine.tracing import CLAIMED

log = logging.getLogger("carillon.dispatcher")

FETCH_INTERVAL_S_DEFAULT: Final = 5.0
"""Fallback period of the fetch loop; planned fires and retries ask for a fetch at their
instant on the node's announcements board, so this only catches what nobody announced
(replays, re-queued attempts, executions of a partition just taken over)."""
FETCH_AHEAD_S_DEFAULT: Final = 2.0
CLAIM_BATCH_DEFAULT: Final = 500
PACE_TICK_S: Final = 0.02
"""With a node rate, starts are admitted in ticks of this length (100 at 5,000/s): one claim
per tick instead of one per start, which capped a paced node at a few hundred a second."""
READ_AHEAD_PAGES: Final = 4
"""Fetched pages whose schedules wait to be read; a fetch beyond waits (backpressure)."""
REFILLS_PER_FETCH: Final = 16
"""Spilled tenants read on their own per fetch, the emptiest first; the others wait for the
next fetch, which comes at once while any is wanted."""
CLAIMERS: Final = 2
"""Claims in flight at once: the next batch is claimed while the previous one's round trip
is still out."""
FOLD_START_MARGIN_S: Final = 2.0
"""An attempt is folded only if its bound ends this long before its partition's trust
window: the time it may wait for a worker (the hand-off holds about a second's work)."""
FOLD_UNCERTAINTY_S_MAX: Final = 1.0
"""While the node's reading of the database's clock may be further off than this (no probe
yet, probes spread out), nothing is folded: the claim judges every instant instead."""
SETTINGS_REFRESH_S: Final = 10.0
"""How often task-type caps and tenant weights and quotas are re-read from the ledger."""


class DispatcherConfig(msgspec.Struct, frozen=True):
    node_id: str
    fetch_interval_s: float = FETCH_INTERVAL_S_DEFAULT
    claim_batch: int = CLAIM_BATCH_DEFAULT
    queue_max: int = DISPATCH_QUEUE_MAX_DEFAULT
    fetch_ahead_s: float = FETCH_AHEAD_S_DEFAULT
    """Queue executions this long before their instant (the queue releases none early), so
    a burst is in memory, its schedules read, when it comes due."""
    rate_per_s: float | None = None
    """Node-wide starts per second (``None``: as fast as the workers go)."""
    burst: int = DISPATCH_BURST_DEFAULT
    smoothing_window_s: float = DISPATCH_SMOOTHING_WINDOW_S_DEFAULT
    """Spread a burst's tolerance over this many seconds instead of releasing it at once."""
    attempt_lease_s: float = ATTEMPT_LEASE_S_DEFAULT
    """How long a claimed attempt is this node's without renewal. The worker pool renews it
    every third of that while it holds the execution, so a handler may run for hours; when a
    node dies, its attempts are re-queued within about this long."""


class DispatcherStatistics(msgspec.Struct, frozen=True):
    queued: int
    claimed: int
    not_claimed: int
    fetches: int
    overlap_skipped: int = 0
    overlap_held: int = 0
    """Held now (``buffer_one``), waiting for their schedule's run to finish."""
    overlap_deferred: int = 0
    """Left in the ledger because their schedule could not be read (retried on a later fetch)."""
    announcements_dropped: int = 0
    """Announced instants beyond the board's bound, left to the fallback fetch."""
    due: int = 0
    """Queued executions released as due when the queue last moved (waiting for their turn,
    a slot, a cap or a token)."""
    claim_errors: int = 0
    """Claims that failed with an unexpected error (logged; their executions stay queued in
    the ledger for a later fetch)."""
    folded: int = 0
    """Attempts started without a recorded claim (docs/ledger.md, "Folded claims")."""


class Dispatcher:
    def __init__(
        self,
        config: DispatcherConfig,
        *,
        ctx: NodeContext,
        announcements: Announcements,
        room: Room,
        limits: ConcurrencyLimits,
        schedules: ScheduleCache,
        kinds: TaskKinds,
    ) -> None:
        self.config = config
        self._metrics = ctx.metrics
        self._tracing = ctx.tracing
        self._ledger = ctx.ledger
        self._clock = clock = ctx.clock
        self._monitor = ctx.monitor
        self._table = ctx.table
        self._announcements = announcements
        self._room = room
        self._limits = limits
        self._schedules = schedules
        self._kinds = kinds
        self._rng = ctx.rng
        self.queue: FairQueue[Execution] = FairQueue(max_items=config.queue_max, limits=limits)
        self._bucket = (
            None
            if config.rate_per_s is None
            else TokenBucket(
                config.rate_per_s, config.burst, smoothing_window_s=config.smoothing_window_s
            )
        )
        self._fetched = trio.Event()
        self._to_read, self._pages_to_read = trio.open_memory_channel[list[str]](READ_AHEAD_PAGES)
        self._counts = {
            "claimed": 0,
            "not_claimed": 0,
            "fetches": 0,
            "claim_errors": 0,
            "folded": 0,
        }
        self._settings_due = -math.inf
        self._recheck_due = -math.inf
        self.overlap = OverlapGuard(
            ctx=ctx, schedules=schedules, queue=self.queue, task_type=kinds.task_type
        )
        self._overlap_skipped_counted = 0
        """``overlap.skipped`` when last added to the metrics."""
        self._dispatching: set[str] = set()
        """Popped, and not yet claimed or given up: still startable in the ledger. A folded
        attempt stays here until it is closed."""
        self._reading = False
        self._settled_while_reading: set[str] = set()
        """Folded attempts closed while a read of due executions was out: it may have read
        them before their completion committed, still startable, and must not queue them
        again (their handler ran; a second would run it again)."""
        self._fetch_ahead = timedelta(seconds=config.fetch_ahead_s)
        self._backlog = False
        """The last fetch returned a full page: more is startable than the queue holds."""
        self._cursor: DueCursor | None = None
        self._restart_pass = False
        """Where the next fetch resumes while paging through a backlog."""
        self._shares = QueueShares(self.queue)
        """The tenants whose backlog runs on beyond their share of the queue, read apart."""
        self._waits_for_token = False
        """The last pop took fewer than the room admitted for want of tokens."""
        self._pass_closed_until = -math.inf
        self._pass_closed_at = -1
        """A full page held only spilled tenants: read the pass on, until this monotonic
        time, only when new work is announced (the board's generation moves on)."""
        self.progress_at = clock.monotonic()
        """Monotonic time the dispatch loop last could pop (whether or not anything was due)
        or had nothing due: what the stall watchdog measures from."""
        self.fetched_at = clock.monotonic()
        """Monotonic time the last fetch ended, well or not (the fetch loop moves)."""
        self.fetching = False
        """A fetch waits on the ledger now (retrying through an outage too): a pipeline
        waiting on its database is not stalled; the database check says why."""
        room.on_room = self._nudge
        # The attempts' release functions, bound once: holding a resource allocates nothing.
        self._release_limits = self._limits_released
        self._release_dispatching = self._dispatched
        self._release_in_flight = self._settled
        self._release_folded = self._fold_settled
        self._popped_hold: dict[str, Callable[[Attempt], object]] = {
            LIMITS: self._release_limits,
            DISPATCHING: self._release_dispatching,
        }
        """What a popped attempt holds beyond its room (the fair queue reserved its
        tenant's and task type's slots; it is kept out of fetches until claimed)."""

    # The release functions run once per attempt: they read ``attempt.item`` (the execution)
    # rather than the ``execution`` property, a call fewer each.
    def _limits_released(self, attempt: Attempt) -> None:
        execution = attempt.item
        self._limits.finished(execution.tenant_id, execution.task_type)

    def _dispatched(self, attempt: Attempt) -> None:
        execution_id = attempt.item.execution_id
        self._dispatching.discard(execution_id)
        if attempt.folded and self._reading:
            self._settled_while_reading.add(execution_id)

    def _settled(self, attempt: Attempt) -> None:
        self._table.attempts_settled(attempt.partition_id)

    def _fold_settled(self, attempt: Attempt) -> None:
        self._table.fold_settled(attempt.partition_id)

    async def _read_due(self, params: ExecutionsDue) -> list[Execution]:
        """``executions_due``, noting the folded attempts closed meanwhile (see
        :meth:`_is_new`); one read at a time (the fetch loop's)."""
        self._settled_while_reading.clear()
        self._reading = True
        try:
            return await self._ledger.executions_due(params)
        finally:
            self._reading = False

    def _count_overlap_skips(self) -> None:
        """Add the executions the overlap guard recorded as skipped since the last time."""
        skipped = self.overlap.skipped
        if skipped != self._overlap_skipped_counted:
            self._metrics.skipped(SKIP_OVERLAP, skipped - self._overlap_skipped_counted)
            self._overlap_skipped_counted = skipped

    def _wants_more(self) -> bool:
        """Whether to fetch at once: a spilled tenant's queued items ran a refill's worth
        below its share, or the pass holds more startable work, it may be of tenants not
        spilled, and a page fits. The queue fills up to its bound, because fairness across
        tenants can only weigh what has been fetched: a big tenant's thousands, fetched
        first, must not keep a small tenant's few in the ledger."""
        room = self.queue.room - self.overlap.held
        if room > 0 and self._shares.refills(1, PAGE_SIZE_MAX):
            return True
        return self._backlog and self._pass_open() and room >= PAGE_SIZE_MAX

    def _pass_open(self) -> bool:
        return (
            self._clock.monotonic() >= self._pass_closed_until
            or self._announcements.generation != self._pass_closed_at
        )

    def _nudge(self) -> None:
        """Wake the dispatch loop: there may be work or room now. A nudge while the loop is
        busy is kept for its next wait (it then looks again at once); many nudges before
        that wait cost one wake-up."""
        self._fetched.set()

    async def run(
        self,
        claimed: trio.MemorySendChannel[Attempt],
        *,
        task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._fetch_loop)
            nursery.start_soon(self._read_schedules)
            nursery.start_soon(self._dispatch_loop, claimed)
            nursery.start_soon(self._watch_partitions)
            task_status.started()

    def statistics(self) -> DispatcherStatistics:
        c = self._counts
        return DispatcherStatistics(
            len(self.queue),
            c["claimed"],
            c["not_claimed"],
            c["fetches"],
            overlap_skipped=self.overlap.skipped,
            overlap_held=self.overlap.held,
            overlap_deferred=self.overlap.deferred,
            announcements_dropped=self._announcements.dropped,
            due=max(len(self.queue) - self.queue.statistics().not_yet_due, 0),
            claim_errors=c["claim_errors"],
            folded=c["folded"],
        )

    def has_due(self) -> bool:
        """Whether a queued execution's instant has come (see :meth:`FairQueue.has_due`)."""
        return self.queue.has_due(self._monitor.now())

    async def fetch(self) -> int:
        """Queue the startable executions of the owned partitions: the spilled tenants'
        refills first, then a page of the pass while it is open; returns how many were new."""
        owned = self._table.claimable()  # not the draining ones: they are being handed back
        if not owned:
            # Nothing to read for: no refill or next page is wanted (the fetch loop would spin
            # on them), and the pass finds the spills anew once partitions are owned again.
            self._shares.clear()
            self._backlog = False
            return 0
        if self.queue.room - self.overlap.held <= 0:
            return 0
        before = self._monitor.now() + self._fetch_ahead
        added = 0
        for refill in self._shares.refills(REFILLS_PER_FETCH, PAGE_SIZE_MAX):
            room = self.queue.room - self.overlap.held  # held ones count against the bound too
            if room <= 0:
                break
            limit = min(refill.limit, room)
            after = None if refill.after is None else DueCursor(*refill.after)
            due = await self._read_due(
                ExecutionsDue(owned, before, limit, after=after, tenant_id=refill.tenant_id)
            )
            last = _position(due_cursor(due[-1])) if due else refill.after
            self._shares.refilled(refill.tenant_id, last, complete=len(due) < limit)
            added += await self._queue_page([e for e in due if self._is_new(e)])
        if self._pass_open():
            added += await self._fetch_pass_page(owned, before)
        return added

    async def _fetch_pass_page(self, owned: list[int], before: datetime) -> int:
        """The next page of the pass through every tenant's startable work, each tenant's
        items queued up to its share of the queue (:meth:`QueueShares.sort`)."""
        room = self.queue.room - self.overlap.held
        if room <= 0:
            return 0
        limit = min(PAGE_SIZE_MAX, room)
        after = self._cursor
        due = await self._read_due(ExecutionsDue(owned, before, limit, after=after))
        # A full page means more is startable now: fetch the next page as soon as the queue
        # runs low instead of waiting for the fallback interval, starting after this one (a
        # backlog is paged through once instead of re-reading what the queue holds already).
        # A short page ends the pass; the next starts from the beginning again, so whatever
        # became startable behind the cursor meanwhile (a retry, a re-queued attempt) is seen.
        self._backlog = len(due) >= limit
        self._cursor = due_cursor(due[-1]) if self._backlog and not self._restart_pass else None
        self._restart_pass = False
        page = self._shares.sort(
            due,
            [_position(due_cursor(execution)) for execution in due],
            None if after is None else _position(after),
            room=self.queue.room - self.overlap.held,
            is_new=self._is_new,
        )
        if self._backlog and not page.open:
            # Every tenant of a full page has spilled: the pages after it are most likely
            # theirs too, read by their refills. Read on at the fallback interval (a tenant
            # behind them) or when new work is announced, not at every wake.
            self._pass_closed_until = self._clock.monotonic() + self.config.fetch_interval_s
            self._pass_closed_at = self._announcements.generation
        return await self._queue_page(page.queue)

    def _is_new(self, execution: Execution) -> bool:
        """Not queued, being started or held back already, nor a folded attempt's that
        finished while it was being read (the ledger had it startable until then)."""
        return (
            execution.execution_id not in self.queue
            and execution.execution_id not in self._dispatching
            and execution.execution_id not in self._settled_while_reading
            and not self.overlap.is_held(execution)
        )

    async def _queue_page(self, executions: list[Execution]) -> int:
        added = sum(1 for e in executions if self.queue.push(e) is PushOutcome.QUEUED)
        self._counts["fetches"] += 1
        if added:
            # Have their schedules read meanwhile, off the dispatch path (it needs their
            # overlap policy) and off this loop (the next page is fetched at the same time).
            await self._to_read.send([execution.schedule_id for execution in executions])
            self._nudge()
        return added

    async def _watch_partitions(self) -> None:
        """A partition just taken over (its owner died, a rebalance) may hold startable work
        already: fetch at once instead of at the fallback interval, and from the start of
        the order, since its executions may sort before the cursor of a pass in progress
        (and before where a spilled tenant's refills resume: the pass finds the spills anew)."""
        known = set(self._table)
        while True:
            await self._table.wait_changed()
            owned = set(self._table)
            if owned - known:
                self._cursor = None
                self._restart_pass = True  # a fetch in flight must not set its cursor
                self._shares.clear()
                self._announcements.announce(self._monitor.now())
            known = owned

    def _pop_batch(self) -> list[Attempt]:
        """What may start now, in fair order, as many as the room and the token bucket
        admit; each popped execution an attempt holding its slots."""
        now_mono = self._clock.monotonic()
        wanted = self._room.claim_size()
        if wanted > 0:
            self.progress_at = now_mono  # able to hand work on, whether or not any is due
        short_of_tokens = False
        if self._bucket is not None and wanted > 0:
            tokens = self._tokens_now(now_mono)
            short_of_tokens = tokens < wanted
            wanted = min(wanted, tokens)
        popped = self.queue.pop_many(self._monitor.now(), wanted) if wanted > 0 else []
        # Held back by the bucket only if the queue gave all the tokens allowed (it may hold
        # more that is due); an idle queue is not waiting for a token.
        self._waits_for_token = short_of_tokens and len(popped) == wanted
        if popped and self._bucket is not None and not self._bucket.take(now_mono, len(popped)):
            raise AssertionError("the token bucket refused what it said it would admit")
        if not popped:
            return []
        # Popped but still startable in the ledger: a fetch meanwhile must not queue them
        # again (a second copy would meet its own hold or run as an overlap).
        self._dispatching.update([execution.execution_id for execution in popped])
        return self._room.admit_each(popped, self._popped_hold)

    def _tokens_now(self, now_mono: float) -> int:
        """How many starts the token bucket admits at once now: a pacing tick's worth, so a
        paced burst is claimed in batches rather than one by one (the pacer then stays busy
        for that tick), and never more than the bucket holds."""
        bucket = self._bucket
        assert bucket is not None
        if bucket.wait_s(now_mono) > 0:
            return 0
        per_s = bucket.pace_per_s or bucket.rate_per_s
        tick = max(1, int(per_s * PACE_TICK_S))
        return max(1, min(tick, int(bucket.available(now_mono)), bucket.burst))

    async def _admit(self, attempts: list[Attempt]) -> list[Attempt]:
        """The overlap policies (:meth:`OverlapGuard.admit`); the attempts not admitted are
        closed (their slots are free again)."""
        admitted: list[Attempt] = []
        try:
            admitted = await self.overlap.admit(attempts)
        finally:
            self._count_overlap_skips()
            kept = set(admitted)
            for attempt in attempts:
                if attempt not in kept:
                    attempt.close()
        return admitted

    async def _claim_and_send(
        self, attempts: list[Attempt], claimed: trio.MemorySendChannel[Attempt]
    ) -> None:
        """Claim ``attempts`` and send the claimed ones to the workers -- the folded ones
        first, without waiting for the claim. Each attempt is either sent (the workers own it
        from then on) or closed here, whatever happens."""
        sent: set[Attempt] = set()

        def send(attempts: list[Attempt]) -> None:
            for attempt in attempts:
                claimed.send_nowait(attempt)  # sized for every slot: never full
                sent.add(attempt)

        try:
            for attempt in await self._claim(attempts, send):
                attempt.release(DISPATCHING)  # running in the ledger: no fetch returns it
                claimed.send_nowait(attempt)
                sent.add(attempt)
        except Exception as exc:
            # Not worth the pipeline: the executions stay queued in the ledger (or running
            # there under an attempt lease that runs out) and a later fetch finds them.
            self._counts["claim_errors"] += 1
            log.error("claiming %d executions failed", len(attempts), exc_info=exc)
        finally:
            for attempt in attempts:
                if attempt not in sent:  # not claimed, or never sent
                    attempt.close()

    async def _claim(
        self, attempts: list[Attempt], send_folded: Callable[[list[Attempt]], None]
    ) -> list[Attempt]:
        """The attempts of ``attempts`` that the ledger gave this node, marked claimed with
        their attempt lease (running from when the successful claim was sent); those folded
        instead (see :meth:`_fold`) go to ``send_folded`` before the claim is sent."""
        fences: dict[int, Fence] = {}
        trusted: dict[int, float] = {}
        for attempt in attempts:
            owned = self._table.get(attempt.partition_id)
            if owned is not None and not owned.draining:
                fences[owned.fence.partition_id] = owned.fence
                trusted[owned.fence.partition_id] = owned.trusted_until
        wanted = [a for a in attempts if a.partition_id in fences]
        # In flight from now (a hand-back of the partition waits for it) until closed.
        self._table.attempts_started_each([attempt.partition_id for attempt in wanted])
        Attempt.hold_each(wanted, IN_FLIGHT, self._release_in_flight)
        folded = self._fold(wanted, trusted)
        if folded:
            wanted = [a for a in wanted if not a.folded]
            self._counts["folded"] += len(folded)
            send_folded(folded)
        if not wanted:
            self._metrics.attempts_dispatched(0, len(folded))
            self._counts["not_claimed"] += len(attempts) - len(folded)
            return []
        lease_s = self.config.attempt_lease_s
        sent_at = [self._clock.monotonic()]

        async def claim(fences: list[Fence], attempts: list[Attempt]) -> list[Execution]:
            sent_at[0] = self._clock.monotonic()
            params = ExecutionsClaim(
                fences, [a.item.execution_id for a in attempts], lease_s, self.config.node_id
            )
            return await self._ledger.executions_claim(params)

        tracing = self._tracing
        if tracing is None:
            result, _, _ = await call_fenced(
                fences, wanted, _partition_of, claim, rng=self._rng, log=log,
                what="claim executions",
            )  # fmt: skip
        else:  # one span per claim batch; each attempt it produced links to it
            with tracing.claiming(len(fences), len(wanted)) as span:
                result, _, _ = await call_fenced(
                    fences, wanted, _partition_of, claim, rng=self._rng, log=log,
                    what="claim executions",
                )  # fmt: skip
                span.set_attribute(CLAIMED, len(result or ()))
            span_context = span.get_span_context()
            for attempt in wanted:
                attempt.claim_span = span_context
        by_id = {attempt.item.execution_id: attempt for attempt in wanted}
        claimed: list[Attempt] = []
        for execution in result or ():
            got = by_id.get(execution.execution_id)
            if got is None:
                continue
            got.item = execution  # as claimed: the attempt number, the fencing token
            got.claimed = True
            got.lease_s = lease_s
            got.renewed_at = sent_at[0]
            claimed.append(got)
        self._counts["claimed"] += len(claimed)
        self._counts["not_claimed"] += len(attempts) - len(claimed) - len(folded)
        self._metrics.attempts_dispatched(len(claimed), len(folded))
        return claimed

    def _fold(self, attempts: list[Attempt], trusted: dict[int, float]) -> list[Attempt]:
        """Mark *folded* the attempts that need no recorded claim (docs/ledger.md, "Folded
        claims") and return them: of a kind that runs outside the node and a task type
        without a cluster cap (:func:`~engine.actors.task_kinds.fold_bound_s`), whose bound
        ends :data:`FOLD_START_MARGIN_S` before the trust window of their partition's lease
        (``trusted``) -- no other node can take the partition while they run. One popped
        within the clock monitor's uncertainty of its instant gets a ``start_after``: a
        claim would be judged by the database's clock, a fold only by the node's reading of
        it, so its worker waits until the instant is surely past (a millisecond or so).
        Nothing folds while that uncertainty exceeds :data:`FOLD_UNCERTAINTY_S_MAX`. They keep
        their ``dispatching`` hold until closed: the ledger has them startable until their
        completion is written. Each also holds ``folded`` (a hand-back waits for it)."""
        folded: list[Attempt] = []
        uncertainty_s = self._monitor.uncertainty_s
        if uncertainty_s > FOLD_UNCERTAINTY_S_MAX:
            return folded
        bound_of = self._kinds.fold_bound_s
        now = self._clock.monotonic()
        latest = now + FOLD_START_MARGIN_S
        # Never early: a claim is refused before the instant by the database's clock; a fold
        # is judged by the node's reading of it, which may be this far off.
        now_db = self._monitor.now()
        due_by = now_db - timedelta(seconds=uncertainty_s)
        bounds: dict[str, float | None] = {}
        for attempt in attempts:
            execution = attempt.item
            task_type = execution.task_type
            if task_type in bounds:
                bound_s = bounds[task_type]
            else:
                bound_s = bounds[task_type] = bound_of(task_type)
            if bound_s is None or latest + bound_s > trusted[attempt.partition_id]:
                continue
            at = startable_at(execution)
            if at is None:
                continue
            if at > due_by:  # popped at its instant: its worker waits until it is surely due
                attempt.start_after = now + (at - due_by).total_seconds()
            attempt.folded = True
            attempt.fold_bound_s = bound_s
            folded.append(attempt)
        if folded:
            self._table.folds_started_each([attempt.partition_id for attempt in folded])
            Attempt.hold_each(folded, FOLDED, self._release_folded)
        return folded

    async def refresh_settings(self) -> None:
        """Apply the stored task-type caps and tenant weights and quotas."""
        task_types = await self._ledger.task_types_list()
        self._kinds.refresh(task_types)
        for task_type in task_types:
            self._limits.set_task_type_cap(task_type.name, task_type.max_concurrency)
            blocking = task_type.kind in BLOCKING_KINDS
            self._limits.set_task_type_group(task_type.name, BLOCKING_GROUP if blocking else None)
        for tenant in await self._ledger.tenants_list():
            self._limits.set_tenant_quota(tenant.tenant_id, tenant.concurrency_quota)
            self.queue.set_weight(tenant.tenant_id, tenant.weight)
            self.queue.set_tenant_rate(tenant.tenant_id, tenant.rate_per_s, tenant.burst)
        self._settings_due = self._clock.monotonic() + SETTINGS_REFRESH_S

    async def _fetch_loop(self) -> None:
        while True:
            # This fetch reads what is startable within fetch_ahead_s from now: it answers
            # every announcement due by now (and, when it fails, the fallback interval does).
            self._announcements.take_due(self._monitor.now())
            self.fetching = True
            try:
                if self._clock.monotonic() >= self._settings_due:
                    await self.refresh_settings()
                await self.fetch()
                if self.overlap.held and self._clock.monotonic() >= self._recheck_due:
                    self._recheck_due = self._clock.monotonic() + self.config.fetch_interval_s
                    if await self.overlap.recheck_held():
                        self._nudge()
            except CarillonError as exc:
                log.warning("fetching due executions failed: %s", exc)
            finally:
                self.fetching = False
            self.fetched_at = self._clock.monotonic()  # the loop moves, if only to fail
            await self._wait_for_fetch()

    async def _wait_for_fetch(self) -> None:
        """Until the next fetch is due: the earliest announcement's time, the fallback
        interval, or at once while more is startable in the ledger and the queue runs low.
        An announcement for later only moves the wake-up; it does not fetch now."""
        fallback_at = self._clock.monotonic() + self.config.fetch_interval_s
        while not self._wants_more():
            wait_s = fallback_at - self._clock.monotonic()
            next_at = self._announcements.next_at()
            if next_at is not None:
                wait_s = min(wait_s, (next_at - self._monitor.now()).total_seconds())
            if wait_s <= 0:
                return
            await self._announcements.wait(wait_s)

    async def _dispatch_loop(self, claimed: trio.MemorySendChannel[Attempt]) -> None:
        batches, claims = trio.open_memory_channel[list[Attempt]](0)
        async with trio.open_nursery() as nursery:
            for _ in range(CLAIMERS):
                nursery.start_soon(self._claimer, claims, claimed)
            while True:
                # As many as the room admits now (a claim's worth once enough is free; each
                # slot given back asks again and nudges), so no threshold goes stale.
                batch = self._pop_batch()
                if batch:
                    admitted = await self._admit(batch)
                    if admitted:
                        try:
                            await batches.send(admitted)
                        except BaseException:
                            for attempt in admitted:
                                attempt.close()
                            raise
                if self._wants_more():
                    self._announcements.wake()  # more is startable: fetch the next page
                if batch:
                    continue
                if not self.has_due():
                    self.progress_at = self._clock.monotonic()  # nothing due: not stalled
                await self._wait_for_work()

    async def _read_schedules(self) -> None:
        async for schedule_ids in self._pages_to_read:
            await self._schedules.prefetch(schedule_ids)

    async def _claimer(
        self,
        claims: trio.MemoryReceiveChannel[list[Attempt]],
        claimed: trio.MemorySendChannel[Attempt],
    ) -> None:
        async for admitted in claims:
            await self._claim_and_send(admitted, claimed)

    async def _wait_for_work(self) -> None:
        upcoming = self.queue.next_due_at()
        token_s = None
        if self._bucket is not None and self._waits_for_token:
            token_s = self._bucket.wait_s(self._clock.monotonic())
        wait_s = idle_wait_s(
            fallback_s=self.config.fetch_interval_s,
            next_due_in_s=None
            if upcoming is None
            else (upcoming - self._monitor.now()).total_seconds(),
            token_wait_s=token_s,
        )
        nudged = self._fetched
        if not nudged.is_set():
            with trio.move_on_after(max(wait_s, 0.001) if math.isfinite(wait_s) else 1.0):
                await nudged.wait()
        if nudged.is_set():
            self._fetched = trio.Event()


def _position(cursor: DueCursor) -> Position:
    return (cursor.startable_at, cursor.execution_id)


def _partition_of(attempt: Attempt) -> int:
    return attempt.partition_id
