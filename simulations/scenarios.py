"""Named scenarios: each draws a fault timeline for the safety phase from its own stream.

``calm`` has no faults at all (the baseline: tight start delays). Each of the others stresses
one kind of trouble; ``random`` draws a little of everything. All faults start after a
warm-up (the cluster has formed) and end before the safety phase does. A run has at most one
region failover, and only with two nodes or more (one region each at least). A
handler-latency fault (:func:`latency`) brings its own workload and worker count: a fleet
of ``hook`` schedules firing together, on few workers, so that a slow receiver builds a
backlog.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Final

from simulations import oracle
from simulations.params import NodeSettings, stream
from simulations.scenario import (
    CommitUnknown,
    Crash,
    Fault,
    HandlerFaults,
    HandlerLatency,
    Join,
    Jump,
    Leave,
    Outage,
    Pause,
    RegionFailover,
    ScheduleChange,
    Skew,
    SlowHandler,
    SlowLedger,
    StuckRenewals,
)
from simulations.workload import (
    HOOK_EXPRESSIONS,
    HOOK_TYPE,
    TASK_TYPE,
    SimSchedule,
    draw_hooks,
    draw_schedule,
    retimed,
    with_payload,
)

WARM_UP_S: Final = 120.0
COOL_DOWN_S: Final = 30.0
LAG_S_MAX: Final = 10.0
"""The longest replication lag a failover loses (a healthy asynchronous standby's)."""
FAILOVER_IN_RANDOM_P: Final = 0.25
LATENCY_IN_RANDOM_P: Final = 0.25
HOOK_FIRES_MAX: Final = 5_000
"""The most fires a hook fleet may have in the safety phase and half an hour after it (the
run's cost grows with them: about a second per 3,000)."""
HEALTHY_LOAD_MAX: Final = 0.3
"""Healthy handlers keep one node's workers at most this busy (the hook fleet is cut down to
fit): a backlog comes from the fault, not from a workload the cluster cannot carry."""
SLOW_BACKLOG_S_MAX: Final = 900.0
"""A slow stretch brings at most this much work per worker (a step ends sooner, a spike
slows fewer attempts): its backlog drains within minutes, not hours."""
EVERYDAY: Final = HandlerFaults(transient_p=0.03, lost_reply_p=0.02, permanent_p=0.01, hang_p=0.01)


@dataclass
class Context:
    rng: random.Random
    nodes: tuple[str, ...]
    safety_s: float
    settings: NodeSettings
    schedules: tuple[SimSchedule, ...]
    start: datetime
    transition: tuple[str, datetime] | None
    seed: int = 0
    """The run's seed, for a draw that needs a stream of its own."""
    timeout_s: float = 120.0
    """The ``sim`` task type's timeout."""


@dataclass
class Built:
    faults: list[Fault] = field(default_factory=list)
    handler: HandlerFaults = EVERYDAY
    schedules: list[SimSchedule] = field(default_factory=list)
    """Schedules the scenario adds to the workload (a hook fleet)."""
    latency: list[HandlerLatency] = field(default_factory=list)
    workers: int | None = None
    """Workers per node, when the scenario decides (the default otherwise)."""
    hook_timeout_s: float | None = None
    lease_ttl_s: float | None = None
    """A longer partition lease than drawn, when the scenario needs one."""
    folding: tuple[str, ...] = ()
    """Task types whose attempts fold (:mod:`simulations.folding`)."""


def _at(ctx: Context, length_s: float = 0.0, rng: random.Random | None = None) -> float:
    """A start time for a fault lasting ``length_s`` inside the safety phase."""
    latest = max(WARM_UP_S, ctx.safety_s - COOL_DOWN_S - length_s)
    return round((rng or ctx.rng).uniform(WARM_UP_S, latest), 3)


def _magnitude(rng: random.Random, low: float, high: float) -> float:
    """Log-uniform in ``[low, high]`` with a random sign (1 s ... 300 s alike)."""
    value = math.exp(rng.uniform(math.log(low), math.log(high)))
    return round(value if rng.random() < 0.5 else -value, 3)


def _links(ctx: Context) -> tuple[str, ...]:
    """The whole database, or one node's connection to it."""
    return () if ctx.rng.random() < 0.5 else (ctx.rng.choice(ctx.nodes),)


def calm(ctx: Context) -> Built:
    return Built(handler=HandlerFaults())


def crash(ctx: Context, count: int | None = None) -> Built:
    ttl = ctx.settings.lease_ttl_s
    faults: list[Fault] = []
    for _ in range(count or ctx.rng.randint(1, 3)):
        kind = ctx.rng.random()
        down = (
            ctx.rng.uniform(1, ttl)
            if kind < 0.3
            else ctx.rng.uniform(ttl, 4 * ttl)
            if kind < 0.7
            else ctx.rng.uniform(60, 600)
            if kind < 0.95
            else None
        )
        down = None if down is None else round(down, 3)
        faults.append(Crash(_at(ctx, down or 0), ctx.rng.choice(ctx.nodes), down))
    return Built(faults)


def zombie(ctx: Context, count: int | None = None) -> Built:
    ttl = ctx.settings.lease_ttl_s
    faults: list[Fault] = []
    for _ in range(count or ctx.rng.randint(1, 3)):
        factor = ctx.rng.uniform(1.2, 5.0) if ctx.rng.random() < 0.8 else ctx.rng.uniform(0.2, 0.9)
        duration = round(ttl * factor, 3)
        faults.append(Pause(_at(ctx, duration), ctx.rng.choice(ctx.nodes), duration))
    return Built(faults)


def skew(ctx: Context, count: int | None = None) -> Built:
    faults: list[Fault] = []
    for node in ctx.nodes:
        if ctx.rng.random() < 0.5:
            duration = round(ctx.rng.uniform(60, 1800), 3)
            magnitude = _magnitude(ctx.rng, 1, 300)
            faults.append(Skew(_at(ctx, duration), node, magnitude, duration))
    for _ in range(count or ctx.rng.randint(1, 4)):
        settle = round(ctx.rng.uniform(5, 600), 3)
        delta = _magnitude(ctx.rng, 1, 300)
        faults.append(Jump(_at(ctx, settle), ctx.rng.choice(ctx.nodes), delta, settle))
    return Built(faults)


def outage(ctx: Context, count: int | None = None) -> Built:
    ttl = ctx.settings.lease_ttl_s
    faults: list[Fault] = []
    for _ in range(count or ctx.rng.randint(1, 2)):
        duration = round(ctx.rng.uniform(2, 120) if ctx.rng.random() < 0.8 else 300.0, 3)
        faults.append(Outage(_at(ctx, duration), duration))
    for _ in range(ctx.rng.randint(0, 2)):
        duration = round(ctx.rng.uniform(5, 4 * ttl), 3)
        faults.append(Outage(_at(ctx, duration), duration, (ctx.rng.choice(ctx.nodes),)))
    for _ in range(ctx.rng.randint(0, 2)):
        duration = round(ctx.rng.uniform(30, 600), 3)
        latency = round(ctx.rng.uniform(0.05, 3.0), 3)
        faults.append(SlowLedger(_at(ctx, duration), duration, latency, _links(ctx)))
    return Built(faults)


def commit_unknown(ctx: Context, count: int | None = None) -> Built:
    faults: list[Fault] = []
    for _ in range(count or ctx.rng.randint(1, 3)):
        duration = round(ctx.rng.uniform(30, 900), 3)
        p = round(ctx.rng.uniform(0.05, 0.5), 3)
        faults.append(CommitUnknown(_at(ctx, duration), duration, p, _links(ctx)))
    return Built(faults)


def redelivery(ctx: Context, count: int | None = None) -> Built:
    lease = ctx.settings.attempt_lease_s
    faults: list[Fault] = []
    for _ in range(count or ctx.rng.randint(1, 3)):
        # Long enough that handlers hanging meanwhile need renewals, and lose their attempt.
        duration = round(ctx.rng.uniform(3 * lease + 60, 10 * lease + 300), 3)
        faults.append(StuckRenewals(_at(ctx, duration), ctx.rng.choice(ctx.nodes), duration))
    handler = HandlerFaults(transient_p=0.08, lost_reply_p=0.05, permanent_p=0.02, hang_p=0.12)
    return Built(faults, handler)


def rebalance(ctx: Context, count: int | None = None) -> Built:
    faults: list[Fault] = []
    present = list(ctx.nodes)
    gone: list[str] = []
    joined = 0
    times = sorted(_at(ctx) for _ in range(count or ctx.rng.randint(2, 5)))
    for at in times:
        roll = ctx.rng.random()
        if roll < 0.4 and len(present) > 1:
            node = ctx.rng.choice(present)
            present.remove(node)
            gone.append(node)
            faults.append(Leave(at, node))
        elif roll < 0.6 and gone:
            node = gone.pop(0)  # the same id comes back as a new process
            present.append(node)
            faults.append(Join(at, node))
        else:
            joined += 1
            node = f"n{len(ctx.nodes) + joined}"
            present.append(node)
            faults.append(Join(at, node))
    return Built(faults)


def churn(ctx: Context, count: int | None = None) -> Built:
    """Schedules created, changed, paused, resumed and deleted during the safety phase."""
    rng = ctx.rng
    dst_zone = None if ctx.transition is None else ctx.transition[0]
    live = {s.schedule_id: s for s in ctx.schedules}
    paused: set[str] = set()
    faults: list[Fault] = []
    created = 0
    for at in sorted(_at(ctx) for _ in range(count or rng.randint(4, 12))):
        action = rng.choices(
            ["create", "payload", "retime", "pause", "resume", "delete"], [3, 2, 3, 2, 2, 1]
        )[0]
        active = sorted(set(live) - paused)
        if action == "create" or not active:
            sid = f"s{100 + created:03d}"
            created += 1
            live[sid] = draw_schedule(rng, sid, dst_zone=dst_zone, minutely_ok=False)
            faults.append(ScheduleChange(at, "create", sid, live[sid]))
        elif action == "resume" and paused:
            sid = rng.choice(sorted(paused))
            paused.discard(sid)
            faults.append(ScheduleChange(at, "resume", sid))
        elif action == "payload":
            sid = rng.choice(active)
            live[sid] = with_payload(rng, live[sid])
            faults.append(ScheduleChange(at, "payload", sid, live[sid]))
        elif action == "retime":
            sid = rng.choice(active)
            live[sid] = retimed(rng, live[sid], dst_zone=dst_zone)
            faults.append(ScheduleChange(at, "retime", sid, live[sid]))
        elif action == "delete":
            sid = rng.choice(active)
            del live[sid]
            faults.append(ScheduleChange(at, "delete", sid))
        else:
            sid = rng.choice(active)
            paused.add(sid)
            faults.append(ScheduleChange(at, "pause", sid))
    return Built(faults)


def dst(ctx: Context, count: int | None = None) -> Built:
    """Crashes timed so that the restart falls inside the repeated (or skipped) hour."""
    built = Built()
    if ctx.transition is None:
        return built
    _, instant = ctx.transition
    at_transition = (instant - ctx.start).total_seconds()
    for _ in range(count or ctx.rng.randint(1, 2)):
        restart = at_transition + ctx.rng.uniform(-3600, 3600)
        down = round(ctx.rng.uniform(5, 120), 3)
        at = max(WARM_UP_S, round(restart - down, 3))
        if at + down < ctx.safety_s - COOL_DOWN_S:
            built.faults.append(Crash(at, ctx.rng.choice(ctx.nodes), down))
    if ctx.rng.random() < 0.5:
        built.faults += zombie(ctx, 1).faults
    return built


def standby_nodes(nodes: tuple[str, ...]) -> tuple[str, ...]:
    """Region B's nodes: the last half (rounded down, at least one of two or more)."""
    return nodes[len(nodes) - len(nodes) // 2 :] if len(nodes) >= 2 else ()


def failover(ctx: Context, *, fenced: bool = True) -> RegionFailover | None:
    """One region failover: a replica 0-10 s behind (none at all a fifth of the time: a
    planned switch-over), and an old primary that comes back after 5 s to 10 minutes (or,
    when fenced, never, a quarter of the time). Three times in four the replica's copy is
    taken around a fire, from ``lag + 1`` s before it to 10 s after (its claim falls in the
    lag window, or its handler is running at the copy); otherwise at any time. ``None``
    with fewer than two nodes."""
    standby = standby_nodes(ctx.nodes)
    if not standby:
        return None
    rng = ctx.rng
    lag = 0.0 if rng.random() < 0.2 else round(rng.uniform(0.0, LAG_S_MAX), 3)
    back = None if fenced and rng.random() < 0.25 else round(rng.uniform(5.0, 600.0), 3)
    at = _at(ctx, back or 0.0)
    aimed = _near_a_fire(ctx, back or 0.0)
    if aimed is not None and rng.random() < 0.75:
        at = round(aimed + rng.uniform(-lag - 1.0, 10.0) + lag, 3)
    at = min(max(at, round(WARM_UP_S + lag, 3)), _latest(ctx, back or 0.0))
    return RegionFailover(at, lag, back, standby, fenced)


def _latest(ctx: Context, length_s: float) -> float:
    return max(WARM_UP_S + LAG_S_MAX, ctx.safety_s - COOL_DOWN_S - length_s)


def _near_a_fire(ctx: Context, length_s: float) -> float | None:
    """A fire's instant (seconds from the start) where a failover fits, busy instants
    being likelier (one entry per schedule firing then); ``None`` if there is none."""
    after = ctx.start + timedelta(seconds=WARM_UP_S + LAG_S_MAX + 10.0)
    until = ctx.start + timedelta(seconds=_latest(ctx, length_s) - 10.0 - LAG_S_MAX)
    if until <= after:
        return None
    instants = [
        (instant - ctx.start).total_seconds()
        for schedule in ctx.schedules
        for instant in oracle.fires(*schedule.timing(), after, until)
    ]
    return ctx.rng.choice(sorted(instants)) if instants else None


def region(ctx: Context, count: int | None = None) -> Built:
    """A forced region failover, and the everyday handler faults (attempts in flight)."""
    drawn = failover(ctx)
    return Built([] if drawn is None else [drawn])


def region_unfenced(ctx: Context, count: int | None = None) -> Built:
    """The hazard the runbook's fence step exists for: the old primary takes its old
    region's clients again without being fenced (never drawn by ``random``)."""
    drawn = failover(ctx, fenced=False)
    return Built([] if drawn is None else [drawn])


def latency(ctx: Context, count: int | None = None) -> Built:
    """The handler-latency fault, and the everyday handler faults."""
    return with_latency(ctx, ctx.rng, Built())


def with_latency(ctx: Context, rng: random.Random, built: Built) -> Built:
    """``built`` with a handler-latency fault drawn from ``rng``: a hook fleet of 60-400
    schedules firing together every 1, 2 or 5 minutes on 2-6 workers a node; per task
    type, a fast latency (a few ms to tens of ms), slow tails and timeout overruns; the
    hook type's receiver slow for 1-3 steps (0.5-3 s an attempt, minutes long) and 0-3
    spikes (a share of one burst's attempts at a good fraction of the timeout); the ``sim``
    type's at most one of each, milder (its own work is up to 30 s). The fleet is cut down
    until healthy handlers keep a node's workers at most 30 % busy, and each slow stretch to
    at most 15 minutes of a worker's work: a slow receiver builds a backlog that drains once
    it is fast again."""
    period_s = 60.0 * rng.choices([1, 2, 5], [3, 2, 1])[0]
    expression = HOOK_EXPRESSIONS[[60.0, 120.0, 300.0].index(period_s)]
    workers = rng.choice([2, 3, 4, 6])
    hook_timeout = rng.choice([5.0, 10.0, 15.0])
    hook = _latency_profile(rng, "hook", hook_timeout, fast_ms=(2.0, 60.0), tail_max=0.9)
    sim = _latency_profile(
        rng, TASK_TYPE, ctx.timeout_s, fast_ms=(0.0, 10.0), tail_max=0.4, work_s=30.0
    )
    sim_load = _sim_load(ctx)  # worker-seconds a second
    workers = max(workers, math.ceil(2 * sim_load / HEALTHY_LOAD_MAX))
    per_attempt = _mean_s(hook, hook_timeout, built.handler, ctx.settings.attempt_lease_s)
    room = HEALTHY_LOAD_MAX * workers * period_s - sim_load * period_s
    fires_each = (ctx.safety_s + 1800.0) / period_s
    count = min(
        rng.randint(60, 400),
        int(HOOK_FIRES_MAX / fires_each),
        max(int(room / per_attempt), 10),
    )
    faults: list[Fault] = []
    for task_type, steps, spikes, timeout, fleet, spike in (
        (HOOK_TYPE, rng.randint(1, 3), rng.randint(0, 3), hook_timeout, count, (0.2, 0.5, 0.8)),
        (TASK_TYPE, rng.randint(0, 1), rng.randint(0, 1), ctx.timeout_s, 0, (0.1, 0.2, 0.4)),
    ):
        per_burst = max(fleet, 1)
        for _ in range(steps):
            low = round(rng.uniform(0.5, 1.5), 3)
            high = round(rng.uniform(low, 3.0), 3)
            bursts = max(1, int(SLOW_BACKLOG_S_MAX * workers / (per_burst * high)))
            length = min(rng.uniform(60.0, 600.0), bursts * period_s)
            at = _at(ctx, length, rng)
            faults.append(SlowHandler(at, round(length, 3), task_type, low, high))
        for _ in range(spikes):
            low = round(timeout * rng.uniform(spike[0], spike[1]), 3)
            high = round(timeout * rng.uniform(spike[1], spike[2]), 3)
            share = min(rng.uniform(0.05, 0.5), SLOW_BACKLOG_S_MAX * workers / (per_burst * high))
            length = rng.uniform(5.0, 30.0)
            at = _at(ctx, length, rng)
            faults.append(
                SlowHandler(at, round(length, 3), task_type, low, high, "spike", round(share, 3))
            )
    built.faults += faults
    built.schedules += draw_hooks(rng, count, expression)
    built.latency += [hook, sim]
    built.workers = workers
    built.hook_timeout_s = hook_timeout
    return built


def _latency_profile(
    rng: random.Random,
    task_type: str,
    timeout_s: float,
    *,
    fast_ms: tuple[float, float],
    tail_max: float,
    work_s: float = 0.0,
) -> HandlerLatency:
    """Fast answers; a slow tail up to a good fraction of what the timeout leaves beside the
    work (none, a third of the time); overruns of the timeout now and then."""
    high_ms = rng.uniform(max(fast_ms[0], fast_ms[1] / 6), fast_ms[1])
    low_ms = rng.uniform(fast_ms[0], high_ms / 2)
    tail_p = 0.0 if rng.random() < 1 / 3 else round(rng.uniform(0.002, 0.03), 4)
    tail_high = round((timeout_s - work_s) * rng.uniform(tail_max / 3, tail_max), 3)
    timeout_p = 0.0 if rng.random() < 1 / 3 else round(rng.uniform(0.001, 0.01), 4)
    return HandlerLatency(
        task_type,
        (round(low_ms / 1000, 4), round(high_ms / 1000, 4)),
        tail_p,
        (min(0.2, tail_high), tail_high),
        timeout_p,
    )


def _mean_s(
    profile: HandlerLatency, timeout_s: float, faults: HandlerFaults, lease_s: float
) -> float:
    """The mean worker time an attempt brings under ``profile`` and ``faults`` (no slow
    stretch), its retries included."""
    low, high = profile.tail_s
    tail = (high - low) / math.log(high / low) if high > low else low
    fast = sum(profile.fast_s) / 2
    hang = min(2.25 * lease_s, timeout_s)
    once = fast + profile.tail_p * tail + (profile.timeout_p + faults.hang_p) * timeout_s
    once = max(once, fast + faults.hang_p * hang)
    failing = faults.transient_p + faults.lost_reply_p + profile.timeout_p
    return once / (1 - min(failing, 0.5))


def _sim_load(ctx: Context) -> float:
    """Worker-seconds a second the ``sim`` schedules bring in the safety phase (their work)."""
    end = ctx.start + timedelta(seconds=ctx.safety_s)
    total = sum(s.run_s * len(oracle.fires(*s.timing(), ctx.start, end)) for s in ctx.schedules)
    return total / ctx.safety_s


def random_mix(ctx: Context) -> Built:
    """A little of everything: each kind of fault with probability one half."""
    built = Built()
    kinds: list[Callable[[Context, int | None], Built]] = [
        crash,
        zombie,
        skew,
        outage,
        commit_unknown,
        redelivery,
        rebalance,
        churn,
    ]
    for kind in kinds:
        if ctx.rng.random() < 0.5:
            built.faults += kind(ctx, ctx.rng.randint(1, 2) if kind is not churn else None).faults
    built.faults += dst(ctx).faults
    roll = ctx.rng.random()
    built.handler = EVERYDAY if roll < 0.7 else redelivery(ctx, 1).handler
    if ctx.rng.random() < FAILOVER_IN_RANDOM_P:  # drawn last: the draws above are unchanged
        drawn = failover(ctx)
        if drawn is not None:
            built.faults = keep_a_node_in_the_active_region(ctx.nodes, built.faults, drawn)
            built.faults.append(drawn)
    latency_rng = stream(ctx.seed, "faults:random:latency")  # its own: the rest is unchanged
    if latency_rng.random() < LATENCY_IN_RANDOM_P:
        with_latency(ctx, latency_rng, built)
    return built


def keep_a_node_in_the_active_region(
    nodes: tuple[str, ...], faults: list[Fault], drawn: RegionFailover
) -> list[Fault]:
    """``faults`` without the graceful leaves that would leave the active region with no
    node (``rebalance`` keeps one node of the cluster, but before the failover region B's
    are not running, and after it region A's are cut off)."""
    region = {node: "b" if node in drawn.standby else "a" for node in nodes}
    present = {node for node in nodes if region[node] == "a"}
    kept: list[Fault] = []
    failed_over = False
    for fault in sorted(faults, key=lambda f: f.at_s):
        if not failed_over and fault.at_s >= drawn.at_s:
            failed_over = True
            present = {node for node in present if region[node] == "b"} | set(drawn.standby)
        active = "b" if failed_over else "a"
        if isinstance(fault, Join):
            region.setdefault(fault.node, active)
            if region[fault.node] == active:
                present.add(fault.node)
        elif isinstance(fault, Leave) and region.get(fault.node) == active:
            if present == {fault.node}:
                continue
            present.discard(fault.node)
        kept.append(fault)
    return kept


def folded(ctx: Context, count: int | None = None) -> Built:
    """Folded claims (docs/ledger.md, "Folded claims"): a hook fleet of 30-120 schedules
    firing together, its attempts short (a 0.5-2 s timeout, a tenth to two fifths of it of
    work) and folded -- started without a recorded claim, their claim written with their
    completion -- on a 15 or 30 s partition lease whose trust window holds them. Crashes and
    pauses past the lease are aimed within half a timeout after a fleet's fire, while its
    folded attempts run or their completions are on the way; a rebalance hands partitions
    back, an outage stops every write. The ``sim`` schedules are claimed as usual."""
    rng = ctx.rng
    period_s = 60.0 * rng.choices([1, 2, 5], [3, 2, 1])[0]
    expression = HOOK_EXPRESSIONS[[60.0, 120.0, 300.0].index(period_s)]
    fires_each = (ctx.safety_s + 1800.0) / period_s
    fleet = min(rng.randint(30, 120), max(int(HOOK_FIRES_MAX / fires_each), 10))
    ttl = max(ctx.settings.lease_ttl_s, rng.choice([15.0, 30.0]))
    timeout = rng.choice([0.5, 1.0, 2.0])
    # Work of a tenth to two fifths of the timeout: a fire's folded attempts run for a while,
    # and the faults below land among them.
    hooks = [
        replace(hook, run_s=round(timeout * rng.uniform(0.1, 0.4), 3))
        for hook in draw_hooks(rng, fleet, expression)
    ]
    built = Built(
        schedules=hooks,
        hook_timeout_s=timeout,
        lease_ttl_s=ttl,
        folding=(HOOK_TYPE,),
    )
    for _ in range(count or rng.randint(1, 2)):
        at = _hook_fire(ctx, period_s, ttl * 4) + rng.uniform(0.0, timeout / 2)
        down = None if rng.random() < 0.1 else round(rng.uniform(1.0, 4 * ttl), 3)
        built.faults.append(Crash(round(at, 4), rng.choice(ctx.nodes), down))
    for _ in range(rng.randint(1, 2)):
        duration = round(ttl * rng.uniform(1.2, 3.0), 3)
        at = _hook_fire(ctx, period_s, duration) + rng.uniform(0.0, timeout / 2)
        built.faults.append(Pause(round(at, 4), rng.choice(ctx.nodes), duration))
    built.faults += rebalance(ctx, rng.randint(1, 3)).faults
    if rng.random() < 0.5:
        built.faults += outage(ctx, 1).faults
    return built


def _hook_fire(ctx: Context, period_s: float, length_s: float) -> float:
    """A fire of a hook fleet firing every ``period_s`` (seconds from the start) inside the
    safety phase, with ``length_s`` after it."""
    latest = ctx.safety_s - COOL_DOWN_S - length_s
    first = WARM_UP_S + (-(ctx.start.timestamp() + WARM_UP_S)) % period_s
    if latest < first:
        return _at(ctx, length_s)
    return first + period_s * ctx.rng.randint(0, int((latest - first) // period_s))


SCENARIOS: Final[dict[str, Callable[[Context], Built]]] = {
    "calm": calm,
    "crash": crash,
    "zombie": zombie,
    "skew": skew,
    "outage": outage,
    "commit-unknown": commit_unknown,
    "redelivery": redelivery,
    "rebalance": rebalance,
    "churn": churn,
    "dst": dst,
    "region": region,
    "region-unfenced": region_unfenced,
    "latency": latency,
    "folded": folded,
    "random": random_mix,
}
