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
  bucket (a pacing tick's worth at a time), applies each schedule's overlap policy
  (:mod:`~engine.actors.overlap`), and hands the batch to a claimer -- but only while the
  worker pool has a batch's worth of room (backpressure).
* **claimers** (two, so one claim's round trip overlaps the next) claim a batch in one
  fenced call (``executions_claim``: queued -> running, next attempt, attempt lease) and hand
  what they claimed to the worker pool.

Each claimed execution gets an attempt lease of ``attempt_lease_s``, which the worker pool
renews while it holds the execution; a crashed node's attempts run out and the redeliverer
re-queues them. An execution claimed by no one (another node got it, or it stopped being
startable) is simply forgotten; the ledger stays the source of truth.
"""

from __future__ import annotations

import bisect
import functools
import logging
import math
import random
from datetime import datetime, timedelta
from typing import Any, Final

import msgspec
import trio

from engine.actors.clock_monitor import ClockMonitor
from engine.actors.overlap import OverlapGuard
from engine.actors.partitions import PartitionTable
from engine.actors.retry import retry_unavailable
from engine.actors.schedule_cache import ScheduleCache
from engine.actors.workers import Work, WorkerPool
from engine.clock import Clock
from engine.config import ATTEMPT_LEASE_S_DEFAULT
from engine.core.dispatch import ConcurrencyLimits
from engine.core.fair_queue import FairQueue, PushOutcome
from engine.core.queue_shares import Position, QueueShares
from engine.core.token_bucket import TokenBucket
from engine.errors import CarillonError, LeaseLost
from engine.ledger.base import (
    PAGE_SIZE_MAX,
    DueCursor,
    ExecutionsClaim,
    ExecutionsDue,
    Fence,
    Ledger,
    due_cursor,
)
from engine.metrics import SKIP_OVERLAP, NodeMetrics
from engine.model import Execution, TaskType

log = logging.getLogger("carillon.dispatcher")

FETCH_INTERVAL_S_DEFAULT: Final = 5.0
"""Fallback period of the fetch loop; planned fires and retries ask for a fetch at their
instant (:meth:`Dispatcher.request_fetch`), so this only catches what nobody announced
(replays, re-queued attempts, executions of a partition just taken over)."""
FETCH_AHEAD_S_DEFAULT: Final = 2.0
CLAIM_BATCH_DEFAULT: Final = 500
ANNOUNCE_GRAIN_US: Final = 100_000
ANNOUNCED_MAX: Final = 4_096
"""Distinct announced instants the dispatcher keeps a fetch for. Cron instants fall on whole
seconds and planners write a few seconds ahead, so a handful are pending at a time; beyond
the bound the latest are dropped (counted in ``announcements_dropped``) and the fallback
interval fetches them."""
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
QUEUE_MAX_DEFAULT: Final = 50_000
SETTINGS_REFRESH_S: Final = 10.0
"""How often task-type caps and tenant weights and quotas are re-read from the ledger."""


class DispatcherConfig(msgspec.Struct, frozen=True):
    node_id: str
    fetch_interval_s: float = FETCH_INTERVAL_S_DEFAULT
    claim_batch: int = CLAIM_BATCH_DEFAULT
    queue_max: int = QUEUE_MAX_DEFAULT
    fetch_ahead_s: float = FETCH_AHEAD_S_DEFAULT
    """Queue executions this long before their instant (the queue releases none early), so
    a burst is in memory, its schedules read, when it comes due."""
    rate_per_s: float | None = None
    """Node-wide starts per second (``None``: as fast as the workers go)."""
    burst: int = 1_000
    smoothing_window_s: float = 0.0
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
    """Announced instants beyond :data:`ANNOUNCED_MAX`, left to the fallback fetch."""


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
        *,
        metrics: NodeMetrics,
    ) -> None:
        self.config = config
        self._metrics = metrics
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
        self._to_read, self._pages_to_read = trio.open_memory_channel[list[str]](READ_AHEAD_PAGES)
        self._counts = {
            "claimed": 0,
            "not_claimed": 0,
            "fetches": 0,
        }
        self._settings_due = -math.inf
        self._recheck_due = -math.inf
        self._schedules: ScheduleCache = workers.schedules
        self._task_types: dict[str, TaskType] = {}
        self.overlap = OverlapGuard(
            ledger, table, self._schedules, self.queue, limits, rng, self._task_types_get
        )
        self._overlap_skipped_counted = 0
        """``overlap.skipped`` when last added to the metrics."""
        self._dispatching: set[str] = set()
        """Popped, and not yet claimed or given up: still startable in the ledger."""
        self._gate_room: int | None = None
        """While the dispatch loop waits for room in the worker pool: how much it waits for."""
        self._claiming = 0
        """Admitted executions of batches being claimed: they will need a worker too."""
        self._announced: list[datetime] = []
        """When to fetch for the work announced so far (its instants less ``fetch_ahead_s``):
        sorted, distinct, at most :data:`ANNOUNCED_MAX`."""
        self._announced_dropped = 0
        self._fetch_ahead = timedelta(seconds=config.fetch_ahead_s)
        self._backlog = False
        """The last fetch returned a full page: more is startable than the queue holds."""
        self._cursor: DueCursor | None = None
        self._restart_pass = False
        """Where the next fetch resumes while paging through a backlog."""
        self._shares = QueueShares(self.queue)
        """The tenants whose backlog runs on beyond their share of the queue, read apart."""
        self._pass_closed_until = -math.inf
        """A full page held only spilled tenants: read the pass on, until this monotonic
        time, only when new work is announced."""

    def request_fetch(self, at: datetime) -> None:
        """Fetch in time for ``at`` (when something becomes startable then): ``fetch_ahead_s``
        before it, so it is queued, with its schedule read, when its instant comes.

        Every announced instant gets its fetch: a fetch reads only what is startable within
        ``fetch_ahead_s``, so keeping just the earliest announcement left the later
        instants of a planner's batch to the fallback interval (fires up to
        ``fetch_interval_s`` late in a steady state)."""
        fetch_at = at - self._fetch_ahead
        # Up to the next tenth of a second: a fetch then still reads ``at`` (it reads what is
        # startable within fetch_ahead_s), and jittered retry instants share fetches.
        fetch_at += timedelta(microseconds=-fetch_at.microsecond % ANNOUNCE_GRAIN_US)
        self._pass_closed_until = -math.inf  # the new work may be a tenant's not queued yet
        announced = self._announced
        if announced and announced[0] <= fetch_at and fetch_at <= self._monitor.now():
            return  # a fetch is due already, and reads this too
        index = bisect.bisect_left(announced, fetch_at)
        if index < len(announced) and announced[index] == fetch_at:
            return
        announced.insert(index, fetch_at)
        if len(announced) > ANNOUNCED_MAX:
            announced.pop()  # the latest: the fallback interval fetches it at the latest
            self._announced_dropped += 1
        if index == 0:
            self._wake.set()  # sooner than the fetch loop means to wake

    def finished(self, execution: Execution) -> None:
        """A worker is done with ``execution``: free its slot for the next one, and release
        the execution its schedule holds back (``buffer_one``), if any."""
        self._limits.finished(execution.tenant_id, execution.task_type)
        self.overlap.started_done(execution.schedule_id)
        if self._gate_room is None or self._workers.free - self._claiming >= self._gate_room:
            self._nudge()  # at the gate, only once there is a batch's worth of room

    def _count_overlap_skips(self) -> None:
        """Add the executions the overlap guard recorded as skipped since the last time."""
        skipped = self.overlap.skipped
        if skipped != self._overlap_skipped_counted:
            self._metrics.skipped(SKIP_OVERLAP, skipped - self._overlap_skipped_counted)
            self._overlap_skipped_counted = skipped

    def _task_types_get(self, name: str) -> TaskType | None:
        return self._task_types.get(name)

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
        return self._clock.monotonic() >= self._pass_closed_until

    def _nudge(self) -> None:
        """Wake the dispatch loop: there may be work or room now."""
        self._fetched.set()
        self._fetched = trio.Event()

    async def run(self, *, task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._fetch_loop)
            nursery.start_soon(self._read_schedules)
            nursery.start_soon(self._dispatch_loop)
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
            announcements_dropped=self._announced_dropped,
        )

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
            due = await self._ledger.executions_due(
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
        due = await self._ledger.executions_due(ExecutionsDue(owned, before, limit, after=after))
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
        return await self._queue_page(page.queue)

    def _is_new(self, execution: Execution) -> bool:
        """Not queued, being started or held back already."""
        return (
            execution.execution_id not in self.queue
            and execution.execution_id not in self._dispatching
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
                self.request_fetch(self._monitor.now())
            known = owned

    def _pop_batch(self) -> list[Execution]:
        """What may start now, in fair order, as many as the workers can take and the token
        bucket admits."""
        now_mono = self._clock.monotonic()
        wanted = min(self.config.claim_batch, self._workers.free - self._claiming)
        if self._bucket is not None:
            wanted = min(wanted, self._tokens_now(now_mono))
        batch = self.queue.pop_many(self._monitor.now(), wanted) if wanted > 0 else []
        if batch and self._bucket is not None and not self._bucket.take(now_mono, len(batch)):
            raise AssertionError("the token bucket refused what it said it would admit")
        return batch

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

    async def _admit_batch(self, batch: list[Execution]) -> tuple[list[Execution], int]:
        """The overlap policies (:meth:`OverlapGuard.admit`), keeping the popped executions out of
        fetches until claimed."""
        # Popped but still in the ledger as startable: a fetch meanwhile must not queue them
        # again (a second copy would meet its own hold or run as an overlap).
        popped = [execution.execution_id for execution in batch]
        self._dispatching.update(popped)
        try:
            admitted, settled = await self.overlap.admit(batch)
        except BaseException:
            self._dispatching.difference_update(popped)
            raise
        finally:
            self._count_overlap_skips()
        kept = {execution.execution_id for execution in admitted}
        self._dispatching.difference_update(eid for eid in popped if eid not in kept)
        self._claiming += len(admitted)
        return admitted, settled

    async def _claim_and_submit(self, admitted: list[Execution]) -> int:
        try:
            claimed, lease_s, claimed_at = (
                await self._claim(admitted) if admitted else ([], 0.0, 0.0)
            )
            submitted = 0
            try:
                for execution in claimed:
                    await self._workers.submit(
                        Work(execution, execution.partition_id or 0, lease_s, claimed_at)
                    )
                    submitted += 1
            finally:  # cancelled: the rest never reach a worker
                self._table.attempts_settled_each(e.partition_id or 0 for e in claimed[submitted:])
        finally:
            self._dispatching.difference_update(execution.execution_id for execution in admitted)
            self._claiming -= len(admitted)
        return len(claimed)

    async def _claim(self, batch: list[Execution]) -> tuple[list[Execution], float, float]:
        """The executions of ``batch`` claimed, the attempt lease they got, and the monotonic
        time at which the successful claim was sent (their attempt leases run from then)."""
        by_id = {execution.execution_id: execution for execution in batch}
        fences: dict[int, Fence] = {}
        for execution in batch:
            owned = self._table.get(execution.partition_id or 0)
            if owned is not None and not owned.draining:
                fences[owned.fence.partition_id] = owned.fence
        wanted = [e for e in batch if (e.partition_id or 0) in fences]
        # In flight from now (a hand-back of the partition waits for them), until settled:
        # below when not claimed, by the workers or the completion writer otherwise.
        self._table.attempts_started_each(e.partition_id or 0 for e in wanted)
        claimed: list[Execution] = []
        try:
            claimed, lease_s, sent_at = await self._claim_wanted(fences, wanted)
        finally:
            started = {execution.execution_id for execution in claimed}
            self._table.attempts_settled_each(
                e.partition_id or 0 for e in wanted if e.execution_id not in started
            )
        for execution_id, execution in by_id.items():
            if execution_id not in started:
                self._limits.finished(execution.tenant_id, execution.task_type)
                self.overlap.started_done(execution.schedule_id)
        self._counts["claimed"] += len(started)
        self._counts["not_claimed"] += len(by_id) - len(started)
        return claimed, lease_s, sent_at

    async def _claim_wanted(
        self, fences: dict[int, Fence], wanted: list[Execution]
    ) -> tuple[list[Execution], float, float]:
        """Claim ``wanted`` under ``fences``, leaving out the partitions found lost."""
        claimed: list[Execution] = []
        lease_s = 0.0
        sent_at = self._clock.monotonic()
        while wanted:
            lease_s = self.config.attempt_lease_s
            params = ExecutionsClaim(
                list(fences.values()),
                [e.execution_id for e in wanted],
                lease_s,
                self.config.node_id,
            )
            try:
                claimed, sent_at = await retry_unavailable(
                    functools.partial(self._claim_once, params),
                    rng=self._rng,
                    log=log,
                    what="claim executions",
                )
                break
            except LeaseLost as exc:
                lost = set(exc.partitions)
                fences = {p: f for p, f in fences.items() if p not in lost}
                wanted = [e for e in wanted if (e.partition_id or 0) not in lost]
        return claimed, lease_s, sent_at

    async def _claim_once(self, params: ExecutionsClaim) -> tuple[list[Execution], float]:
        """One claim call, and the monotonic time it was sent at: the attempt leases it
        grants run from no earlier than that (a retry after an outage starts them anew)."""
        sent_at = self._clock.monotonic()
        return await self._ledger.executions_claim(params), sent_at

    async def refresh_settings(self) -> None:
        """Apply the stored task-type caps and tenant weights and quotas."""
        task_types = await self._ledger.task_types_list()
        self._task_types = {task_type.name: task_type for task_type in task_types}
        self._workers.refresh_task_types(task_types)
        for task_type in task_types:
            self._limits.set_task_type_cap(task_type.name, task_type.max_concurrency)
        for tenant in await self._ledger.tenants_list():
            self._limits.set_tenant_quota(tenant.tenant_id, tenant.concurrency_quota)
            self.queue.set_weight(tenant.tenant_id, tenant.weight)
            self.queue.set_tenant_rate(tenant.tenant_id, tenant.rate_per_s, tenant.burst)
        self._settings_due = self._clock.monotonic() + SETTINGS_REFRESH_S

    async def _fetch_loop(self) -> None:
        while True:
            # This fetch reads what is startable within fetch_ahead_s from now: it answers
            # every announcement due by now (and, when it fails, the fallback interval does).
            now = self._monitor.now()
            announced = self._announced
            del announced[: bisect.bisect_right(announced, now)]
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
            await self._wait_for_fetch()

    async def _wait_for_fetch(self) -> None:
        """Until the next fetch is due: the earliest announcement's time, the fallback
        interval, or at once while more is startable in the ledger and the queue runs low.
        An announcement for later only moves the wake-up; it does not fetch now."""
        fallback_at = self._clock.monotonic() + self.config.fetch_interval_s
        while not self._wants_more():
            wait_s = fallback_at - self._clock.monotonic()
            if self._announced:
                ahead_s = (self._announced[0] - self._monitor.now()).total_seconds()
                wait_s = min(wait_s, ahead_s)
            if wait_s <= 0:
                return
            self._wake = trio.Event()
            with trio.move_on_after(wait_s):
                await self._wake.wait()

    async def _dispatch_loop(self) -> None:
        batches, claims = trio.open_memory_channel[list[Execution]](0)
        async with trio.open_nursery() as nursery:
            for _ in range(CLAIMERS):
                nursery.start_soon(self._claimer, claims)
            while True:
                # Claim in batches worth a round trip: until that much room is free in the
                # worker pool (beyond what is being claimed), wait (each finish nudges).
                room = min(self.config.claim_batch, self._workers.capacity // 4)
                while self._workers.free - self._claiming < room:
                    self._gate_room = room
                    try:
                        await self._fetched.wait()
                    finally:
                        self._gate_room = None
                batch = self._pop_batch()
                if batch:
                    admitted, _ = await self._admit_batch(batch)
                    if admitted:
                        await batches.send(admitted)
                if self._wants_more():
                    self._wake.set()  # the ledger holds more startable work: fetch the next page
                if batch:
                    continue
                await self._wait_for_work()

    async def _read_schedules(self) -> None:
        async for schedule_ids in self._pages_to_read:
            await self._schedules.prefetch(schedule_ids)

    async def _claimer(self, claims: trio.MemoryReceiveChannel[list[Execution]]) -> None:
        async for admitted in claims:
            await self._claim_and_submit(admitted)
            self._nudge()  # fewer claimed than admitted leaves room

    async def _wait_for_work(self) -> None:
        wait_s = self.config.fetch_interval_s
        upcoming = self.queue.next_due_at()
        if upcoming is not None:
            # Past means it is due but was not popped (the token bucket is empty): the
            # bucket's wait below decides, or this would spin until a token comes.
            ahead_s = (upcoming - self._monitor.now()).total_seconds()
            if ahead_s > 0:
                wait_s = min(wait_s, ahead_s)
        if self._bucket is not None and len(self.queue):
            # Only while something waits for a token: an idle node with a rate must not wake
            # every millisecond (its bucket is full, its wait zero).
            token_s = self._bucket.wait_s(self._clock.monotonic())
            if token_s > 0:
                wait_s = min(wait_s, max(token_s, 0.001))
        with trio.move_on_after(max(wait_s, 0.001) if math.isfinite(wait_s) else 1.0):
            await self._fetched.wait()


def _position(cursor: DueCursor) -> Position:
    return (cursor.startable_at, cursor.execution_id)
