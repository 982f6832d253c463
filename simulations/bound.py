"""The start-delay bound, and the lengths derived from it (see ``docs/simulation.md``).

A fire planned at ``P`` must have its first attempt start (its handler invoked) by

* ``P + B`` when the cluster was healthy around ``P``, where the **healthy pipeline bound**
  ``B = clock_skew_bound + FETCH_INTERVAL + change_poll + 1 s``: the dispatcher's corrected
  clock may be off by up to the skew bound (its probes' precision); a fire nobody announced
  is found by the fallback fetch; a schedule created just before its first fire reaches the
  planner within a change poll; one second covers ledger round trips and the claim;
* otherwise by ``y + B``, where ``[x, y]`` is the *disrupted stretch* that meets
  ``[P, P + B]``: the union of every applied fault's interval and the heal, each extended
  by the **recovery time** ``R``. Clock faults (skews and steps of a node's wall clock) are
  not in it: the engine plans and dispatches on the database-corrected clock, so a wrong
  wall clock must not delay anything.

  ``R = TTL + TTL/3`` (a dead or frozen owner's lease runs out; a survivor takes it at once,
  or at its next lease cycle if that wake-up fails) ``+ HAND_BACK_DRAIN (5 s) +
  PLANNER_STOP_WAIT (2 s)`` (a graceful hand-back: its attempts in flight settle, then its
  planner stops) ``+ 6.5 s`` (the longest ledger retry backoff, with jitter) ``+ lookahead``
  ``+ attempt_lease + 10 s`` (an attempt claimed by a process that then died, or whose claim
  reply was lost, is re-queued once its attempt lease runs out, by a redeliverer round, and
  fetched) ``+ RESTART_DELAY (5 s)`` (a restarted node whose id is still registered is
  refused, and tried again).

The liveness phase lasts ``R + W + 60 s``, where the **completion allowance** ``W = B +
max_attempts x (longest handler run + backoff_max x 1.2 + FETCH_INTERVAL) + attempt_lease +
10 s`` is the time a fire needs, once startable, to run through all its attempts. Fires
planned within ``W`` of the end are not required to have finished.

With a handler-latency fault (a few workers, a hook fleet, slow receivers) the workers
themselves may be the bottleneck, and :class:`LoadBound` adds a **queue allowance**: see its
docstring and ``docs/simulation.md``.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections import Counter
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Final

from engine.actors.dispatcher import FETCH_INTERVAL_S_DEFAULT
from engine.actors.lease_keeper import HAND_BACK_DRAIN_S, PLANNER_STOP_WAIT_S
from engine.actors.redeliverer import REDELIVER_INTERVAL_S_DEFAULT
from engine.actors.retry import LEDGER_BACKOFF
from engine.model import execution_id
from simulations import oracle
from simulations.effects import Fates
from simulations.host import RESTART_DELAY_S
from simulations.scenario import Jump, Outage, RegionFailover, ScheduleChange, Skew, disruption
from simulations.workload import SimSchedule

if TYPE_CHECKING:
    from simulations.params import SimParams

RUN_S_MAX: Final = 30.0
"""The longest a schedule's handler works (``simulations.workload``)."""
HANG_FACTOR_MAX: Final = 3.0
"""A hanging handler works up to this many attempt leases (``simulations.effects``)."""
LIVENESS_MARGIN_S: Final = 60.0


def healthy_bound_s(params: SimParams) -> float:
    """``B``: the start delay of a fire planned while the cluster is healthy."""
    s = params.settings
    return s.clock_skew_bound_s + FETCH_INTERVAL_S_DEFAULT + s.change_poll_interval_s + 1.0


def recovery_s(params: SimParams) -> float:
    """``R``: how long after a fault ends the cluster may still be recovering."""
    s = params.settings
    backoff_max = LEDGER_BACKOFF.max_s * (1 + LEDGER_BACKOFF.jitter)
    return (
        s.lease_ttl_s
        + s.lease_ttl_s / 3
        + HAND_BACK_DRAIN_S
        + PLANNER_STOP_WAIT_S
        + backoff_max
        + s.lookahead_s
        + s.attempt_lease_s
        + REDELIVER_INTERVAL_S_DEFAULT
        + FETCH_INTERVAL_S_DEFAULT
        + RESTART_DELAY_S
    )


def failover_startup_s(params: SimParams) -> float:
    """How long after a region failover region B's nodes may take to hold the partitions:
    they start at the failover and acquire at their first lease cycle; a node that starts
    after another of its region takes its share at the next cycle (``TTL / 3``). The
    recovery time ``R`` is added on top, as after any disruption."""
    return params.settings.lease_ttl_s / 3


def completion_s(params: SimParams) -> float:
    """``W``: how long a startable fire may take to run through all its attempts (with a
    handler-latency fault, at least as long as any fire of the healed phase may take)."""
    base = _completion_s(params)
    if not params.latency:
        return base
    return max(base, load_bound(params).completion_s)


def _completion_s(params: SimParams) -> float:
    s, task = params.settings, params.task
    longest_run = max(RUN_S_MAX, HANG_FACTOR_MAX * s.attempt_lease_s)
    per_attempt = longest_run + task.backoff_max_s * 1.2 + FETCH_INTERVAL_S_DEFAULT
    return (
        healthy_bound_s(params)
        + task.max_attempts * per_attempt
        + s.attempt_lease_s
        + REDELIVER_INTERVAL_S_DEFAULT
        + FETCH_INTERVAL_S_DEFAULT
    )


def liveness_s(params: SimParams) -> float:
    """``R + W + 60 s``; with a handler-latency fault, also long enough that every fire of
    the safety phase has finished (its backlog drained), and 60 s more."""
    base = recovery_s(params) + completion_s(params) + LIVENESS_MARGIN_S
    if params.latency:
        base = max(base, load_bound(params).drained_s + LIVENESS_MARGIN_S)
    return round(base, 1)


def stale_s(params: SimParams) -> float:
    """How long after a retime a planner that has not heard of it yet may still write the
    old definition's fires: a recovery, plus the longest database outage."""
    outages = [f.duration_s for f in params.faults if isinstance(f, Outage)]
    return recovery_s(params) + max(outages, default=0.0)


def ahead_s(params: SimParams) -> float:
    """How far ahead of now a planner may have written fires: the lookahead, and the most a
    burst's lead may add to it (``NodeConfig.burst_lookahead_extra_s_max``)."""
    return params.settings.lookahead_s + params.settings.config("n").burst_lookahead_extra_s_max


def _stretches(windows: list[tuple[float, float]], recovery: float) -> list[tuple[float, float]]:
    """The disturbed stretches: ``windows`` each extended by ``recovery``, merged."""
    stretches: list[list[float]] = []
    for start, end in sorted(windows):
        end += recovery
        if stretches and start <= stretches[-1][1]:
            stretches[-1][1] = max(stretches[-1][1], end)
        else:
            stretches.append([start, end])
    return [(a, b) for a, b in stretches]


class DelayBound:
    """The start-delay bound of each planned instant (seconds from the start of the run),
    given the ``windows`` during which the run was disturbed: each applied fault's interval
    (:func:`~simulations.scenario.disruption`) except clock faults, and the heal. With a
    handler-latency fault, never less than the :class:`LoadBound`'s."""

    def __init__(
        self,
        params: SimParams,
        windows: list[tuple[float, float]],
        load: LoadBound | None = None,
    ) -> None:
        self.healthy_s = healthy_bound_s(params)
        self.recovery_s = recovery_s(params)
        self.stretches = _stretches(windows, self.recovery_s)
        self.load = load

    def disturbed_bound_s(self, planned_s: float) -> float:
        """The bound without a queue allowance: ``B``, or to the end of the disturbed
        stretch that meets ``[planned, planned + B]`` and ``B`` more."""
        for start, end in self.stretches:
            # disturbed if the stretch meets [planned, planned + B]
            if start - self.healthy_s <= planned_s <= end:
                return max(end - planned_s, 0.0) + self.healthy_s
        return self.healthy_s

    def bound_s(self, planned_s: float) -> float:
        """The most the first start of a fire planned at ``planned_s`` may lag it."""
        bound = self.disturbed_bound_s(planned_s)
        if self.load is not None:
            bound = max(bound, self.load.first_start_s(planned_s))
        return bound


# -- the queue allowance of a handler-latency fault --------------------------------------

ATTEMPT_OVERHEAD_ROUND_TRIPS: Final = 2
"""Ledger round trips a worker may spend on an attempt besides its handler (reading the
task type and the schedule when not cached)."""
RETRY_JITTER: Final = 1.2
"""A retry is due at most ``backoff_max x 1.2`` after its attempt ended (20 % jitter)."""
FIXPOINT_ROUNDS: Final = 30
FAIRNESS_SLACK: Final = 2
"""While a tenant waits, another (of equal weight) is served at most this many times more
than it (``engine.core.fair_queue``: within one of its share, either way)."""


@dataclass
class Fire:
    """One fire that may run, and how long each of its attempts holds a worker."""

    planned_s: float
    tenant: str
    attempts: list[float]
    """Worker-seconds of attempt 1, 2, ... up to the first that succeeds or fails for good
    (or ``max_attempts``), from the seed's draws (:meth:`~simulations.effects.Fates.plan`)."""

    @property
    def longest_s(self) -> float:
        return max(self.attempts)

    @property
    def work_s(self) -> float:
        return sum(self.attempts)


def _definitions(params: SimParams) -> dict[str, list[SimSchedule]]:
    """Every definition each schedule has during the run (created or changed)."""
    out: dict[str, list[SimSchedule]] = {}
    for schedule in params.schedules:
        out.setdefault(schedule.schedule_id, []).append(schedule)
    for fault in params.faults:
        if isinstance(fault, ScheduleChange) and fault.schedule is not None:
            out.setdefault(fault.schedule_id, []).append(fault.schedule)
    return out


def fates_of(params: SimParams) -> Fates:
    """The handler's fates in the run ``params`` (what the world gives its handlers)."""
    return Fates(
        params.seed,
        params.handler,
        params.settings.attempt_lease_s,
        latency=params.latency,
        slow=params.slow_handlers,
        timeouts=params.timeouts,
        start=params.start,
    )


def fires_of(params: SimParams, horizon_s: float) -> list[Fire]:
    """Every fire that may run in ``(0, horizon_s]`` (a superset: the instants of every
    definition a schedule ever has, paused or deleted or not), with its attempts' worker
    time (the longest work any of its definitions gives it), in planned order."""
    fates = fates_of(params)
    overhead = ATTEMPT_OVERHEAD_ROUND_TRIPS * 2 * params.ledger_latency_s
    after, until = params.start, params.start + timedelta(seconds=horizon_s)
    fires = []
    for schedule_id, definitions in sorted(_definitions(params).items()):
        work: dict[float, tuple[float, SimSchedule]] = {}
        for d in definitions:
            for instant in oracle.fires(*d.timing(), after, until):
                at = (instant - params.start).total_seconds()
                known = work.get(at)
                if known is None or d.run_s > known[0]:
                    work[at] = (d.run_s, d)
        for at, (run_s, d) in work.items():
            key = execution_id(schedule_id, params.start + timedelta(seconds=at))
            attempts = []
            for attempt in range(1, params.task.max_attempts + 1):
                plan = fates.plan(key, attempt, d.task_type, at, run_s)
                attempts.append(plan.worker_s + overhead)
                if plan.fate in ("ok", "hang", "permanent"):
                    break
            fires.append(Fire(at, d.tenant_id, attempts))
    fires.sort(key=lambda f: f.planned_s)
    return fires


@dataclass
class LoadBound:
    """The queue allowance under a handler-latency fault: a model of one node's ``w``
    workers serving every fire of the run, computed forward in time (``docs/simulation.md``,
    "The start-delay bound").

    Every fire brings its work at its planned instant: the worker-seconds of all its
    attempts (:class:`Fire`; exact, since every draw depends only on the seed, the execution
    id and the attempt). One node's ``w`` workers serve it all (a node may own every
    partition), outside the disturbed stretches only. An attempt that becomes startable at
    ``t`` starts within ``B`` if fewer than ``w`` fires can be in the system then (each
    holds at most one worker). Otherwise every worker is busy until it starts, since the
    last moment ``tau`` one may have been idle (no queue then), serving only

    * what the workers held at ``tau``: the ``w - 1`` longest attempts of the fires then in
      the system, which they cannot share out;
    * the work that arrived since ``tau``, and the retries of the fires in the system at
      ``tau`` not startable yet (the model counts them at the fire's instant, the engine
      meets them later);
    * the **overtaking** work: the fair queue serves a tenant's items in planned order and
      the tenants in turn (equal weights), so while the attempt's tenant has ``m`` fires in
      the system, every other tenant is served at most its next ``m + 2`` fires planned
      after ``t``, and only those due by then;

    so it starts within ``B`` of ``tau + h``, ``h`` the first time the workers' capacity
    (:func:`_capacity_s`) exceeds that, for every possible ``tau`` (the instants since the
    last one a worker was certainly idle, less those another dominates), at the first fixed
    point of the overtaking work. A fire is in the system from its instant to its last
    attempt's end, each attempt starting within its own bound and its retry due
    ``backoff_max x 1.2`` after it ended.
    """

    workers: int
    healthy_s: float
    stretches: list[tuple[float, float]]
    heal_s: float
    first_start: dict[float, float] = field(default_factory=dict)
    """The first-start bound (seconds after the instant) of the fires planned at each instant."""
    completion_s: float = 0.0
    """The longest a fire planned after the heal stays in the system (instant to last end)."""
    drained_s: float = 0.0
    """When, after the heal, every fire planned before it has ended."""
    max_queue_s: float = 0.0
    """The largest queue allowance (``x`` above) of any attempt."""
    instants: list[float] = field(default_factory=list)

    def first_start_s(self, planned_s: float) -> float:
        """The first-start bound of a fire planned at ``planned_s`` (an instant the model
        does not know takes the larger of its neighbours')."""
        known = self.first_start.get(planned_s)
        if known is not None:
            return known
        index = bisect.bisect_left(self.instants, planned_s)
        near = self.instants[max(index - 1, 0) : index + 1]
        return max((self.first_start[i] for i in near), default=self.healthy_s)

    def after_healthy_s(self, t: float, healthy_s: float) -> float:
        """How long after ``t`` ``healthy_s`` seconds outside the disturbed stretches have
        passed (the workers serve only then)."""
        need = healthy_s
        now = t
        for start, end in self.stretches:
            if end <= now:
                continue
            if start > now:
                if now + need <= start:
                    break
                need -= start - now
            now = max(now, end)
        return now + max(need, 0.0) - t

    def healthy_between(self, a: float, b: float) -> float:
        """Seconds of ``[a, b]`` outside every disturbed stretch."""
        total = b - a
        for start, end in self.stretches:
            total -= max(0.0, min(b, end) - max(a, start))
        return total


class _Tenants:
    """Each tenant's fires in planned order, to sum the work of its next ``n`` after ``t``."""

    def __init__(self, fires: list[Fire]) -> None:
        self.times: dict[str, list[float]] = {}
        self.prefix: dict[str, list[float]] = {}
        for fire in fires:
            self.times.setdefault(fire.tenant, []).append(fire.planned_s)
            prefix = self.prefix.setdefault(fire.tenant, [0.0])
            prefix.append(prefix[-1] + fire.work_s)

    def overtaking(self, tenant: str, t: float, waiting: int, until: float) -> float:
        """The most work the other tenants' fires planned in ``(t, until]`` may be served
        before an item of ``tenant`` that has ``waiting`` items of its own in the system:
        each other tenant's next ``waiting + 2`` at most."""
        total = 0.0
        for other, times in self.times.items():
            if other == tenant:
                continue
            first = bisect.bisect_right(times, t)
            last = min(first + waiting + FAIRNESS_SLACK, bisect.bisect_right(times, until))
            total += self.prefix[other][last] - self.prefix[other][first]
        return total


def _capacity_s(held: tuple[float, ...], workers: int, work: float) -> float:
    """The time ``h`` after which ``workers`` workers, of which those in ``held`` are busy
    that long first with an attempt they cannot share out, have served more than ``work``:
    the first ``h`` with ``sum over workers of max(0, h - held_j) > work``."""
    times = sorted(held) + [0.0] * (workers - len(held))
    times.sort()
    served, free, at = 0.0, 0, 0.0
    for index, busy_until in enumerate(times):
        if index and free:
            step = busy_until - at
            if served + free * step > work:
                return at + (work - served) / free
            served += free * step
        at = busy_until
        free += 1
    return at + max(work - served, 0.0) / free


@dataclass
class _Idle:
    """A moment ``tau`` (just before an instant, or between instants) when the pool may
    have been idle last: what the workers then held, and the retries not startable yet."""

    at: float
    healthy_at: float
    """Seconds outside the disturbed stretches from the start of the run to ``at``."""
    arrived: float
    """Work arrived before ``at``."""
    held: tuple[float, ...]
    pending: float


def _compute_load(
    params: SimParams, windows: tuple[tuple[float, float], ...], horizon: float
) -> LoadBound:
    """One forward pass of the model over the fires planned up to ``horizon``."""
    healthy = healthy_bound_s(params)
    heal = params.safety_s
    load = LoadBound(
        params.settings.workers, healthy, _stretches(list(windows), recovery_s(params)), heal
    )
    fires = fires_of(params, horizon)
    tenants = _Tenants(fires)
    instants = sorted({f.planned_s for f in fires})
    load.instants = instants
    by_instant: dict[float, list[int]] = {}
    for i, fire in enumerate(fires):
        by_instant.setdefault(fire.planned_s, []).append(i)
    w = load.workers
    retry_gap = RETRY_JITTER * params.task.backoff_max_s
    base = DelayBound(params, list(windows))
    live: dict[int, float] = {}
    """The fires in the system, and until when each is known to be: its next retry's due
    time, or its last attempt's end (infinity while that is being worked out)."""
    waiting: Counter[str] = Counter()
    """Fires in the system per tenant."""
    departures: list[tuple[float, int]] = []
    events: list[tuple[float, int, int]] = []  # (retry due, fire, attempt index)
    ends: dict[int, float] = {}
    state = {"arrived": 0.0, "pending": 0.0}
    """Work arrived so far; work of the retries of the fires in the system not startable
    yet (the model counts it at the fire's instant, the engine meets it later)."""
    idle: list[_Idle] = []
    """The moments the pool may have been idle last, since the last one it certainly was,
    less those another dominates."""

    def enter(i: int) -> None:
        if i not in live:
            waiting[fires[i].tenant] += 1
        live[i] = math.inf

    def depart(until: float) -> None:
        while departures and departures[0][0] <= until:
            at, i = heapq.heappop(departures)
            if live.get(i) == at:
                del live[i]
                waiting[fires[i].tenant] -= 1

    def stay(i: int, until: float) -> None:
        live[i] = until
        heapq.heappush(departures, (until, i))

    def now_idle(at: float) -> _Idle:
        """The pool as it may be idle at ``at``: the ``w - 1`` longest attempts of the fires
        in the system held, and their retries pending."""
        held = tuple(heapq.nlargest(w - 1, (fires[i].longest_s for i in live))) if w > 1 else ()
        healthy_at = load.healthy_between(0.0, at)
        return _Idle(at, healthy_at, state["arrived"], held, state["pending"])

    def add_idle(candidate: _Idle) -> None:
        """Keep ``candidate``; drop the earlier ones it dominates: in healthy time, theirs
        is ``healthy_at - arrived / w`` plus the same arrivals since, plus their pending and
        at most all they held (over ``w``), never more than ``candidate``'s least."""

        def key(c: _Idle) -> float:
            return c.healthy_at - c.arrived / w

        floor = key(candidate) + candidate.pending / w
        while idle and key(idle[-1]) + (idle[-1].pending + sum(idle[-1].held)) / w <= floor:
            idle.pop()
        idle.append(candidate)

    def start_bound(t: float, tenant: str) -> float:
        """How long after ``t`` an attempt of ``tenant`` startable at ``t`` starts at the
        latest (see :class:`LoadBound`).

        Until it starts at ``S``, every worker is busy from the last moment ``tau`` one
        may have been idle (no queue then), serving only what it held then, what arrived
        since, the retries then pending, and the other tenants' overtaking work (which
        grows with ``S``): ``S`` is at most the first ``x`` from which the capacity since
        ``tau`` exceeds all that for every possible ``tau``."""
        first = bisect.bisect_right(instants, t)
        coming = sum(
            len(by_instant[instants[j]])
            for j in range(first, bisect.bisect_right(instants, t + healthy))
        )
        bound = base.disturbed_bound_s(t)
        if len(live) + coming <= w:
            return bound  # a worker is free whenever it is startable
        last = now_idle(t)
        candidates = [*idle, last]

        def served_by(until: float, cap: bool) -> float:
            ahead = tenants.overtaking(tenant, t, waiting[tenant], math.inf if cap else until)
            latest = t
            for c in candidates:
                h = _capacity_s(c.held, w, state["arrived"] - c.arrived + c.pending + ahead)
                latest = max(latest, c.at + load.after_healthy_s(c.at, h))
            return latest

        x = t
        for _ in range(FIXPOINT_ROUNDS):
            nxt = served_by(x, cap=False)
            if nxt <= x:
                break
            x = nxt
        else:
            x = served_by(math.inf, cap=True)  # every other tenant's next m + 2, whenever
        queue = x - t
        load.max_queue_s = max(load.max_queue_s, queue)
        return max(bound, healthy + queue)

    def attempt(i: int, k: int, t: float, bound: float) -> None:
        """Attempt ``k`` of fire ``i``, startable at ``t``, starts within ``bound``."""
        end = t + bound + fires[i].attempts[k]
        if k + 1 < len(fires[i].attempts):
            due = end + retry_gap
            heapq.heappush(events, (due, i, k + 1))
            stay(i, due)
        else:
            ends[i] = end
            stay(i, end)

    def retries_until(t: float) -> None:
        while events and events[0][0] <= t:
            due, i, k = heapq.heappop(events)
            depart(due)
            state["pending"] -= fires[i].attempts[k]  # startable now
            enter(i)
            attempt(i, k, due, start_bound(due, fires[i].tenant))

    for at in instants:
        retries_until(at)
        depart(at)
        if len(live) < w:  # a worker is idle just before this instant: older moments go
            idle.clear()
        add_idle(now_idle(at))
        arriving = by_instant[at]
        for i in arriving:
            state["pending"] += sum(fires[i].attempts[1:])
            state["arrived"] += fires[i].work_s  # its retries too: they may come before S
            enter(i)
        bounds = {
            tenant: start_bound(at, tenant)
            for tenant in sorted({fires[i].tenant for i in arriving})
        }
        load.first_start[at] = max(bounds.values())
        for i in arriving:
            attempt(i, 0, at, bounds[fires[i].tenant])
    retries_until(math.inf)
    after = [ends[i] - f.planned_s for i, f in enumerate(fires) if f.planned_s >= heal]
    before = [ends[i] for i, f in enumerate(fires) if f.planned_s < heal]
    load.completion_s = max(after, default=0.0)
    load.drained_s = max(max(before, default=heal) - heal, 0.0)
    return load


def planned_windows(params: SimParams) -> tuple[tuple[float, float], ...]:
    """Every fault's disturbance as drawn (a superset of what is applied), and the heal."""
    windows = []
    for fault in params.faults:
        if isinstance(fault, Skew | Jump):
            continue  # a wrong wall clock disturbs nothing (see DelayBound)
        window = disruption(fault, params.safety_s)
        if window is not None:
            if isinstance(fault, RegionFailover):
                window = (window[0], window[1] + failover_startup_s(params))
            windows.append(window)
    windows.append((params.safety_s, params.safety_s))
    return tuple(sorted(windows))


_LOADS: dict[tuple[object, ...], LoadBound] = {}
_LOADS_KEPT: Final = 4


def load_bound(params: SimParams) -> LoadBound:
    """The run's :class:`LoadBound`, over the faults' disturbances as drawn (computed once
    per run). Its horizon covers the whole run and the longest allowance after it."""
    key = (
        params.seed,
        params.scenario,
        params.start,
        params.safety_s,
        params.settings,
        params.task,
        params.schedules,
        params.faults,
        params.handler,
        params.latency,
        params.hook_timeout_s,
        params.ledger_latency_s,
    )
    found = _LOADS.get(key)
    if found is not None:
        return found
    windows = planned_windows(params)
    recovery = recovery_s(params)
    horizon = params.safety_s + recovery + _completion_s(params) + LIVENESS_MARGIN_S + 1800.0
    while True:
        load = _compute_load(params, windows, horizon)
        completion = max(_completion_s(params), load.completion_s)
        end = params.safety_s + max(recovery + completion, load.drained_s) + LIVENESS_MARGIN_S
        if end + completion + ahead_s(params) <= horizon:
            break
        horizon = end + completion + ahead_s(params) + 1800.0
    while len(_LOADS) >= _LOADS_KEPT:
        del _LOADS[next(iter(_LOADS))]
    _LOADS[key] = load
    return load
