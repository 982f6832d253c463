"""Per-tenant queues served in weighted-fair order, never before due, within concurrency limits.

Responsibility: hold the executions a node has fetched but not started and answer "which one
starts next?", so that a tenant with 10,000 due executions cannot starve tenants with 100,
tenants share the starts in proportion to their weights, nothing starts before its due
instant, and no task-type cap or tenant quota is exceeded. Pure and synchronous; the caller
passes ``now`` (a UTC datetime, like the instants it compares with).

Design
------
*Lanes.* Each tenant has one lane per task type: its due items ordered by ``(due_at,
execution_id)``, ``due_at`` being :func:`~engine.model.startable_at` (planned time, or
``not_before`` for a retry). A tenant's next item is the earliest head among the lanes whose
task type has room, so a capped task type does not hold up the tenant's other task types. A lane
(:class:`_Lane`) keeps its distinct instants in a heap and the ids of each instant in a sorted
deque: a burst puts thousands of items on one instant, arriving in id order (the ledger returns
them so), and then a push is an append and a pop a ``popleft`` -- a heap of ``(due_at,
execution_id, item)`` tuples compared the tied instants before the ids at every step and was
most of the cost of a pop.

*Time.* Items not yet due wait in one pending lane, invisible to fairness; ``pop(now)`` first
releases those due at or before ``now`` into their lanes. The queue keeps the latest ``now``
it was given, so a clock stepping back does not recall what was released.

*Tenant order: EEVDF*, earliest eligible virtual deadline first (Stoica & Abdel-Wahab 1995;
Linux's scheduler since 6.6). Each *competing* tenant ``i`` (one with a due item) has a
virtual time ``e_i``, advanced by one turn, ``TURN // w_i``, each time it is served. The
virtual time ``V`` is the weight-averaged ``e_i``. A tenant is *eligible* when ``e_i <= V``
(it has not been served ahead of its share); a pop serves the eligible tenant with the
earliest virtual deadline ``e_i + TURN // w_i``, ties to the smaller tenant id. Arithmetic is
exact: every allowed weight divides ``TURN`` and ``V`` is only compared as
``e_i * sum(w) <= sum(w * e)``. A pop costs O(log T) for T competing tenants (plus the few
lanes of the chosen tenant).

Fairness bound (tested): while a fixed set of tenants stays backlogged and startable with fixed
weights, from a fresh queue, after any ``k`` pops every tenant's count ``c_i`` has
``|c_i - k * w_i / W| < 1`` (``W`` the weight total): each prefix is within one item of the
exact weighted share, and the tenants interleave (weights 3:1:1 pop as A B A C A).

*Tenant rates.* A tenant may have a token bucket of its own (:meth:`FairQueue.
set_tenant_rate`). Picked with no token, it is parked like a capped tenant, keeping its
offset, and rejoins at the instant its next token comes (:meth:`FairQueue.next_due_at`
reports it, so the caller wakes in time); the other tenants go on meanwhile.

*Joining, leaving, caps.* A tenant joins at ``V`` (no lag) when it gets a due item and leaves,
forgetting its lag (at most one turn), when it has none. A tenant picked but unable to start
(tenant quota full, or every due lane's task type capped) is *parked*: it leaves the
competition keeping its virtual offset from ``V`` (clamped to one turn either way) and rejoins
with it when the limits report room -- by task type in deadline order, as many as the type has
room for. So a capped tenant is skipped, not dropped; it neither banks credit while it cannot
start nor loses its place, and it is served as soon as it can start and its turn comes.

Invariants: ``pop`` never returns an item before its due instant nor beyond a limit (it
reserves the slot with :meth:`ConcurrencyLimits.started`); it returns ``None`` only when no
due item can start; an execution id is queued at most once; at most ``max_items`` are held (a
push beyond returns :attr:`PushOutcome.FULL`: stop fetching); same calls, same results.
"""

from __future__ import annotations

import bisect
import enum
import heapq
import math
from collections import deque
from collections.abc import KeysView, Mapping
from datetime import datetime, timedelta
from typing import Final, Generic, TypeVar

import msgspec

from engine.core.dispatch import ConcurrencyLimits, Dispatchable
from engine.core.token_bucket import TokenBucket
from engine.model import startable_at

WEIGHT_DEFAULT: Final = 1
WEIGHT_MAX: Final = 1000
QUEUE_ITEMS_MAX_DEFAULT: Final = 100_000
TURN: Final = math.lcm(*range(1, WEIGHT_MAX + 1))
"""A weight-1 tenant's turn in virtual ticks; every allowed weight divides it exactly."""
STALE_ENTRIES_SLACK: Final = 64
"""Outdated heap entries tolerated beyond the live ones before a heap is rebuilt."""

T = TypeVar("T", bound=Dispatchable)


class PushOutcome(enum.StrEnum):
    QUEUED = "queued"
    DUPLICATE = "duplicate"
    """That execution id is queued already; nothing changed."""
    FULL = "full"
    """The queue holds ``max_items``; nothing changed. Stop fetching until pops make room."""


class FairQueueStatistics(msgspec.Struct, frozen=True, kw_only=True):
    queued: int
    not_yet_due: int
    tenants: int
    tenants_competing: int
    tenants_parked: int
    duplicates_total: int
    overflows_total: int


class _Phase(enum.Enum):
    IDLE = "idle"
    """Nothing due."""
    COMPETING = "competing"
    PARKED = "parked"


class _Lane:
    """Execution ids in ``(due_at, execution_id)`` order (see *Lanes* in the module doc)."""

    __slots__ = ("_by_instant", "_instants", "_last_ids", "_last_instant")

    def __init__(self) -> None:
        self._instants: list[datetime] = []
        """A heap of the distinct instants held."""
        self._by_instant: dict[datetime, deque[str]] = {}
        """The ids due at each instant, in order."""
        self._last_instant: datetime | None = None
        self._last_ids: deque[str] | None = None
        """The instant pushed to last, and its ids: a burst pushes to one instant over and
        over, and comparing instants is cheaper than hashing one."""

    def __bool__(self) -> bool:
        return bool(self._instants)

    def push(self, due_at: datetime, execution_id: str) -> None:
        ids = self._last_ids if due_at == self._last_instant else self._by_instant.get(due_at)
        if ids is None:
            ids = self._by_instant[due_at] = deque((execution_id,))
            heapq.heappush(self._instants, due_at)
        elif execution_id > ids[-1]:
            ids.append(execution_id)
        else:
            bisect.insort(ids, execution_id)
        self._last_instant, self._last_ids = due_at, ids

    def head(self) -> tuple[datetime, str]:
        """The first ``(due_at, execution_id)``; the lane must not be empty."""
        due_at = self._instants[0]
        return due_at, self._by_instant[due_at][0]

    def first_due_at(self) -> datetime:
        return self._instants[0]

    def pop(self) -> str:
        """Remove and return the first execution id; the lane must not be empty."""
        due_at = self._instants[0]
        ids = self._by_instant[due_at]
        execution_id = ids.popleft()
        if not ids:
            heapq.heappop(self._instants)
            del self._by_instant[due_at]
            if ids is self._last_ids:
                self._last_instant = self._last_ids = None
        return execution_id


class _Tenant(Generic[T]):
    __slots__ = (
        "due",
        "lanes",
        "offset",
        "parked_on_quota",
        "parked_on_rate",
        "phase",
        "queued",
        "turn",
        "version",
        "vt",
        "weight",
    )
    vt: int
    """Virtual time ``e_i`` while competing."""
    offset: int
    """``e_i - floor(V)`` kept while parked."""

    def __init__(self) -> None:
        self.lanes: dict[str, _Lane] = {}
        self.due = 0
        self.queued = 0
        self.phase = _Phase.IDLE
        self.weight = WEIGHT_DEFAULT
        self.turn = TURN // WEIGHT_DEFAULT
        """``TURN // weight``, kept with the weight (a division of a very large number)."""
        self.vt = 0
        self.offset = 0
        self.parked_on_quota = False
        self.parked_on_rate = False
        self.version = 0
        """Bumped on every change of phase, weight or virtual time: older heap entries lapse."""


class FairQueue(Generic[T]):
    """Executions waiting to start, released fairly across tenants (see the module doc)."""

    def __init__(
        self,
        *,
        max_items: int = QUEUE_ITEMS_MAX_DEFAULT,
        limits: ConcurrencyLimits | None = None,
        weights: Mapping[str, int] | None = None,
    ) -> None:
        if max_items < 1:
            raise ValueError(f"fair queue max_items must be >= 1, not {max_items}")
        self._max_items = max_items
        self._limits = limits if limits is not None else ConcurrencyLimits()
        self._weights: dict[str, int] = {}
        self._tenants: dict[str, _Tenant[T]] = {}
        self._items: dict[str, T] = {}
        """Every item held, by execution id."""
        self._pending = _Lane()
        """Items not yet due."""
        self._now: datetime | None = None
        self._now_s = 0.0
        """``_now`` as a POSIX timestamp (the token buckets' clock)."""
        self._sum_w = 0
        self._sum_wvt = 0
        self._v_idle = 0
        self._competing = 0
        self._parked = 0
        self._by_eligible: list[tuple[int, str, int]] = []
        self._by_deadline: list[tuple[int, str, int]] = []
        self._parked_on_type: dict[str, list[tuple[int, str, int]]] = {}
        self._buckets: dict[str, TokenBucket] = {}
        self._parked_on_rate: list[tuple[datetime, str, int]] = []
        """Tenants out of tokens, by the instant their next token comes."""
        self._not_yet_due = 0
        self._duplicates_total = 0
        self._overflows_total = 0
        for tenant_id, weight in (weights or {}).items():
            self.set_weight(tenant_id, weight)

    @property
    def limits(self) -> ConcurrencyLimits:
        return self._limits

    @property
    def max_items(self) -> int:
        return self._max_items

    @property
    def room(self) -> int:
        """How many more items fit: fetch at most this many."""
        return self._max_items - len(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, execution_id: object) -> bool:
        return execution_id in self._items

    def count(self, tenant_id: str) -> int:
        """Items queued for ``tenant_id``, due or not."""
        tenant = self._tenants.get(tenant_id)
        return tenant.queued if tenant is not None else 0

    def counts(self) -> dict[str, int]:
        """Items queued per tenant, in tenant id order."""
        return {tenant_id: self._tenants[tenant_id].queued for tenant_id in sorted(self._tenants)}

    def tenant_ids(self) -> KeysView[str]:
        """The tenants with items queued, in no set order (unsorted, for sums and unions)."""
        return self._tenants.keys()

    def weight(self, tenant_id: str) -> int:
        return self._weights.get(tenant_id, WEIGHT_DEFAULT)

    def set_weight(self, tenant_id: str, weight: int | None) -> None:
        """Set a tenant's weight, 1-``WEIGHT_MAX`` (``None``: the default); effective at once."""
        if weight is not None and (
            isinstance(weight, bool) or not isinstance(weight, int) or not 1 <= weight <= WEIGHT_MAX
        ):
            raise ValueError(f"tenant weight must be an integer 1-{WEIGHT_MAX}, not {weight!r}")
        if weight is None:
            self._weights.pop(tenant_id, None)
        else:
            self._weights[tenant_id] = weight
        tenant = self._tenants.get(tenant_id)
        if tenant is not None and tenant.phase is _Phase.COMPETING:
            new = self.weight(tenant_id)
            self._sum_w += new - tenant.weight
            self._sum_wvt += (new - tenant.weight) * tenant.vt
            tenant.weight = new
            tenant.turn = TURN // new
            tenant.version += 1
            self._push_eligible(tenant_id, tenant)

    def set_tenant_rate(self, tenant_id: str, rate_per_s: float | None, burst: int | None) -> None:
        """Bound how fast ``tenant_id``'s items start: ``rate_per_s`` sustained, ``burst`` at
        once (default: one second's worth); ``None``: no rate of its own. A tenant out of
        tokens is parked -- it keeps its place, the others go on -- until its next token."""
        if rate_per_s is None:
            self._buckets.pop(tenant_id, None)
            tenant = self._tenants.get(tenant_id)
            if tenant is not None and tenant.parked_on_rate:
                self._wake(tenant_id, tenant)
            return
        allowance = burst if burst is not None else max(1, math.ceil(rate_per_s))
        current = self._buckets.get(tenant_id)
        if current is None or (current.rate_per_s, current.burst) != (rate_per_s, allowance):
            self._buckets[tenant_id] = TokenBucket(rate_per_s, allowance)

    def next_due_at(self) -> datetime | None:
        """The earliest instant something waiting may start: a not-yet-due item becomes due,
        or a tenant out of tokens gets its next one (``None``: nothing waits on time)."""
        while self._parked_on_rate:
            _, tenant_id, version = self._parked_on_rate[0]
            if self._live(tenant_id, version, _Phase.PARKED) is not None:
                break
            heapq.heappop(self._parked_on_rate)
        times = [self._parked_on_rate[0][0]] if self._parked_on_rate else []
        if self._pending:
            times.append(self._pending.first_due_at())
        return min(times) if times else None

    def statistics(self) -> FairQueueStatistics:
        return FairQueueStatistics(
            queued=len(self._items),
            not_yet_due=self._not_yet_due,
            tenants=len(self._tenants),
            tenants_competing=self._competing,
            tenants_parked=self._parked,
            duplicates_total=self._duplicates_total,
            overflows_total=self._overflows_total,
        )

    def push(self, item: T) -> PushOutcome:
        """Queue ``item`` until it is due and its turn comes."""
        execution_id = item.execution_id
        instant = startable_at(item)
        if instant is None:
            raise ValueError(
                f"execution {execution_id} is {item.status}: only a queued or failed one can start"
            )
        items = self._items
        if execution_id in items:
            self._duplicates_total += 1
            return PushOutcome.DUPLICATE
        if len(items) >= self._max_items:
            self._overflows_total += 1
            return PushOutcome.FULL
        items[execution_id] = item
        tenant = self._tenants.get(item.tenant_id)
        if tenant is None:
            tenant = self._tenants[item.tenant_id] = _Tenant()
        tenant.queued += 1
        if self._now is not None and instant <= self._now:
            self._release(item.tenant_id, tenant, instant, item)
        else:
            self._pending.push(instant, execution_id)
            self._not_yet_due += 1
        return PushOutcome.QUEUED

    def pop(self, now: datetime) -> T | None:
        """The next item to start at ``now``, its slot reserved in :attr:`limits`; or ``None``.

        ``None`` means nothing due can start: wait for :meth:`next_due_at`, a finished
        execution or a push. The caller reports the end with ``limits.finished(tenant, type)``
        -- also when it does not start the item after all, and then pushes it back. (Check the
        token bucket's ``wait_s`` before popping, so that a popped item can always start.)
        """
        self._advance(now)
        return self._next(self._now_s)

    def pop_many(self, now: datetime, limit: int) -> list[T]:
        """Up to ``limit`` items to start at ``now``: what as many :meth:`pop` calls would
        return, in that order, up to the first ``None``. (One call for a batch: the dispatcher
        pops hundreds at a time.)"""
        self._advance(now)
        popped: list[T] = []
        clock_s = self._now_s
        while len(popped) < limit:
            item = self._next(clock_s)
            if item is None:
                break
            popped.append(item)
        return popped

    def has_due(self, now: datetime) -> bool:
        """Whether something queued is due at ``now``: released already and waiting for its
        turn, a slot, a cap or a token, or pending with its instant come. Reads only: the
        queue's time moves on with pops alone."""
        if len(self._items) > self._not_yet_due:
            return True
        upcoming = self.next_due_at()
        return upcoming is not None and upcoming <= now

    def _advance(self, now: datetime) -> None:
        """Move the queue's time to ``now`` (never back) and release what is due by then."""
        if self._now is None or now > self._now:
            self._now = now
            self._now_s = now.timestamp()
        now = self._now
        pending = self._pending
        while pending and (instant := pending.first_due_at()) <= now:
            item = self._items[pending.pop()]
            self._not_yet_due -= 1
            tenant_id = item.tenant_id
            self._release(tenant_id, self._tenants[tenant_id], instant, item)

    def _next(self, clock_s: float) -> T | None:
        """One :meth:`pop` at the queue's time (``clock_s``: that time in seconds)."""
        self._wake_freed()
        assert self._now is not None
        self._wake_rated(self._now)
        while self._competing:
            tenant_id = self._select()
            tenant = self._tenants[tenant_id]
            bucket = self._buckets.get(tenant_id)
            if bucket is not None and (wait_s := bucket.wait_s(clock_s)) > 0:
                self._park_on_rate(tenant_id, tenant, self._now + timedelta(seconds=wait_s))
                continue
            task_type = self._startable_lane(tenant_id, tenant)
            if task_type is None:
                self._park(tenant_id, tenant)
            else:
                if bucket is not None:
                    bucket.take(clock_s)
                return self._take(tenant_id, tenant, task_type)
        return None

    # -- lanes -------------------------------------------------------------------------------

    def _release(self, tenant_id: str, tenant: _Tenant[T], instant: datetime, item: T) -> None:
        task_type = item.task_type
        lane = tenant.lanes.get(task_type)
        new_lane = lane is None
        if lane is None:
            lane = tenant.lanes[task_type] = _Lane()
        lane.push(instant, item.execution_id)
        tenant.due += 1
        if tenant.phase is _Phase.IDLE:
            self._join(tenant_id, tenant, offset=0)
        elif tenant.phase is _Phase.PARKED and not (
            tenant.parked_on_quota or tenant.parked_on_rate
        ):
            if self._limits.task_type_has_room(task_type):
                self._wake(tenant_id, tenant)
            elif new_lane:
                self._wait_on_type(tenant_id, tenant, task_type)

    def _startable_lane(self, tenant_id: str, tenant: _Tenant[T]) -> str | None:
        if not self._limits.tenant_has_room(tenant_id):
            return None
        best: tuple[datetime, str] | None = None
        best_type = None
        for task_type, lane in tenant.lanes.items():
            head = lane.head()
            if (best is None or head < best) and self._limits.task_type_has_room(task_type):
                best, best_type = head, task_type
        return best_type

    def _take(self, tenant_id: str, tenant: _Tenant[T], task_type: str) -> T:
        lane = tenant.lanes[task_type]
        item = self._items.pop(lane.pop())
        if not lane:
            del tenant.lanes[task_type]
        tenant.due -= 1
        tenant.queued -= 1
        self._limits.started(tenant_id, task_type)
        turn = tenant.turn
        tenant.vt += turn
        self._sum_wvt += tenant.weight * turn
        tenant.version += 1
        if tenant.due:
            self._push_eligible(tenant_id, tenant)
        else:
            self._leave(tenant, _Phase.IDLE)
            if not tenant.queued:
                del self._tenants[tenant_id]
        return item

    # -- EEVDF over tenants ------------------------------------------------------------------

    def _select(self) -> str:
        """The eligible competing tenant with the earliest virtual deadline."""
        sum_w, sum_wvt = self._sum_w, self._sum_wvt
        eligible, deadlines = self._by_eligible, self._by_deadline
        tenants = self._tenants
        # Entries of tenants whose version or phase moved on are stale (see _live, inlined:
        # this runs for every pop).
        while eligible:
            vt, tenant_id, version = eligible[0]
            tenant = tenants.get(tenant_id)
            live = (
                tenant is not None
                and tenant.version == version
                and tenant.phase is _Phase.COMPETING
            )
            if live and vt * sum_w > sum_wvt:
                break
            heapq.heappop(eligible)
            if live:
                assert tenant is not None
                heapq.heappush(deadlines, (vt + tenant.turn, tenant_id, version))
        while True:
            _, tenant_id, version = deadlines[0]
            tenant = tenants.get(tenant_id)
            if tenant is None or tenant.version != version or tenant.phase is not _Phase.COMPETING:
                heapq.heappop(deadlines)
            elif tenant.vt * sum_w > sum_wvt:
                # V fell back (a tenant ahead of it joined or one behind it left).
                heapq.heappop(deadlines)
                heapq.heappush(eligible, (tenant.vt, tenant_id, version))
            else:
                return tenant_id

    def _live(self, tenant_id: str, version: int, phase: _Phase) -> _Tenant[T] | None:
        tenant = self._tenants.get(tenant_id)
        if tenant is None or tenant.version != version or tenant.phase is not phase:
            return None
        return tenant

    def _v_floor(self) -> int:
        return self._sum_wvt // self._sum_w if self._sum_w else self._v_idle

    def _join(self, tenant_id: str, tenant: _Tenant[T], *, offset: int) -> None:
        tenant.weight = self.weight(tenant_id)
        tenant.turn = TURN // tenant.weight
        tenant.vt = self._v_floor() + offset
        tenant.phase = _Phase.COMPETING
        tenant.version += 1
        self._sum_w += tenant.weight
        self._sum_wvt += tenant.weight * tenant.vt
        self._competing += 1
        self._push_eligible(tenant_id, tenant)

    def _leave(self, tenant: _Tenant[T], phase: _Phase) -> None:
        v_floor = self._v_floor()
        self._sum_w -= tenant.weight
        self._sum_wvt -= tenant.weight * tenant.vt
        self._competing -= 1
        if not self._competing:
            self._v_idle = v_floor
        tenant.phase = phase
        tenant.version += 1

    def _push_eligible(self, tenant_id: str, tenant: _Tenant[T]) -> None:
        heapq.heappush(self._by_eligible, (tenant.vt, tenant_id, tenant.version))
        if len(self._by_eligible) + len(self._by_deadline) > (
            2 * self._competing + STALE_ENTRIES_SLACK
        ):
            self._by_deadline = []
            self._by_eligible = [
                (t.vt, tenant_id, t.version)
                for tenant_id, t in self._tenants.items()
                if t.phase is _Phase.COMPETING
            ]
            heapq.heapify(self._by_eligible)

    # -- parking -----------------------------------------------------------------------------

    def _park(self, tenant_id: str, tenant: _Tenant[T]) -> None:
        turn = tenant.turn
        tenant.offset = min(max(tenant.vt - self._v_floor(), -turn), turn)
        self._leave(tenant, _Phase.PARKED)
        self._parked += 1
        tenant.parked_on_quota = not self._limits.tenant_has_room(tenant_id)
        if tenant.parked_on_quota:
            # Whatever room of its task types it was woken for goes to the next in line.
            for task_type in sorted(tenant.lanes):
                self._wake_on_type(task_type)
        else:
            for task_type in tenant.lanes:
                self._wait_on_type(tenant_id, tenant, task_type)

    def _park_on_rate(self, tenant_id: str, tenant: _Tenant[T], until: datetime) -> None:
        turn = tenant.turn
        tenant.offset = min(max(tenant.vt - self._v_floor(), -turn), turn)
        self._leave(tenant, _Phase.PARKED)
        self._parked += 1
        tenant.parked_on_rate = True
        heapq.heappush(self._parked_on_rate, (until, tenant_id, tenant.version))

    def _wake_rated(self, now: datetime) -> None:
        """Wake the tenants whose next token has come."""
        while self._parked_on_rate and self._parked_on_rate[0][0] <= now:
            _, tenant_id, version = heapq.heappop(self._parked_on_rate)
            tenant = self._live(tenant_id, version, _Phase.PARKED)
            if tenant is not None and tenant.parked_on_rate:
                self._wake(tenant_id, tenant)

    def _wait_on_type(self, tenant_id: str, tenant: _Tenant[T], task_type: str) -> None:
        waiting = self._parked_on_type.setdefault(task_type, [])
        heapq.heappush(waiting, (tenant.offset + tenant.turn, tenant_id, tenant.version))
        if len(waiting) > 2 * self._parked + STALE_ENTRIES_SLACK:
            waiting[:] = [e for e in waiting if self._live(e[1], e[2], _Phase.PARKED)]
            heapq.heapify(waiting)

    def _wake(self, tenant_id: str, tenant: _Tenant[T]) -> None:
        tenant.parked_on_rate = False
        self._parked -= 1
        self._join(tenant_id, tenant, offset=tenant.offset)

    def _wake_on_type(self, task_type: str) -> None:
        """Wake as many tenants waiting on ``task_type`` as it has room for, best first."""
        waiting = self._parked_on_type.get(task_type)
        room = self._limits.task_type_room(task_type)
        while waiting and (room is None or room > 0):
            _, tenant_id, version = heapq.heappop(waiting)
            tenant = self._live(tenant_id, version, _Phase.PARKED)
            if tenant is None or tenant.parked_on_quota or tenant.parked_on_rate:
                continue
            if not self._limits.tenant_has_room(tenant_id):
                tenant.parked_on_quota = True  # its quota wakes it now, not this type
                continue
            self._wake(tenant_id, tenant)
            room = None if room is None else room - 1
        if waiting is not None and not waiting:
            del self._parked_on_type[task_type]

    def _wake_freed(self) -> None:
        tenants, task_types = self._limits.drain_freed()
        for tenant_id in tenants:
            tenant = self._tenants.get(tenant_id)
            if (
                tenant is not None
                and tenant.phase is _Phase.PARKED
                and not tenant.parked_on_rate
                and self._limits.tenant_has_room(tenant_id)
            ):
                self._wake(tenant_id, tenant)
        for task_type in task_types:
            self._wake_on_type(task_type)
