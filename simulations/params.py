"""Everything a run is made of, derived from its seed alone.

:func:`derive` turns ``(seed, scenario)`` -- and optionally a node count and a length in
days, which override what the seed would draw -- into a frozen :class:`SimParams`: the
cluster configuration, the start instant, the schedules, the fault timeline and the handler
faults (and, with a handler-latency fault, the latency profiles and the ``hook`` fleet). Each
part draws from its own stream (``random.Random(f"carillon-sim:{seed}:...")``),
so adding a draw to one part does not reshuffle the others. Nothing else in a run is random
except through streams derived the same way (node RNGs, the ledger proxies, trio's
scheduler), so the seed reproduces the run.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from engine.config import SHUTDOWN_TIMEOUT_S_DEFAULT, NodeConfig
from engine.ledger.params import REGION_DEFAULT
from simulations import oracle
from simulations.scenario import Fault, HandlerFaults, HandlerLatency, SlowHandler, describe
from simulations.workload import DST_ZONES, HOOK_TYPE, TASK_TYPE, SimSchedule, draw_workload

YEAR = 2026


def stream(seed: int, name: str) -> random.Random:
    """The seeded random stream ``name`` of run ``seed``."""
    return random.Random(f"carillon-sim:{seed}:{name}")


NTP_INTERVAL_S = (300.0, 1800.0)
DRIFT_PPM_MAX = 30.0


@dataclass(frozen=True)
class HostClockDraw:
    """A host's clock before any fault: NTP-level error, drift, and how often NTP syncs."""

    skew_s: float
    drift_ppm: float
    ntp_interval_s: float


def host_clock(seed: int, node_id: str) -> HostClockDraw:
    rng = stream(seed, f"host:{node_id}")
    return HostClockDraw(
        skew_s=rng.uniform(-0.02, 0.02),
        drift_ppm=rng.uniform(-DRIFT_PPM_MAX, DRIFT_PPM_MAX),
        ntp_interval_s=rng.uniform(*NTP_INTERVAL_S),
    )


@dataclass(frozen=True)
class NodeSettings:
    """The configuration every node of the run shares (only the id differs)."""

    lease_ttl_s: float
    lease_safety_margin_s: float
    lookahead_s: float
    clock_probe_interval_s: float
    clock_skew_bound_s: float
    change_poll_interval_s: float
    catchup_grace_s: float
    attempt_lease_s: float
    workers: int = 64
    shutdown_timeout_s: float = SHUTDOWN_TIMEOUT_S_DEFAULT
    retention_days: float = 30.0

    def config(self, node_id: str, region: str = REGION_DEFAULT) -> NodeConfig:
        return NodeConfig(
            node_id=node_id,
            region=region,
            lease_ttl_s=self.lease_ttl_s,
            lease_safety_margin_s=self.lease_safety_margin_s,
            lookahead_s=self.lookahead_s,
            clock_probe_interval_s=self.clock_probe_interval_s,
            clock_skew_bound_s=self.clock_skew_bound_s,
            change_poll_interval_s=self.change_poll_interval_s,
            catchup_grace_s=self.catchup_grace_s,
            attempt_lease_s=self.attempt_lease_s,
            workers=self.workers,
            shutdown_timeout_s=self.shutdown_timeout_s,
            retention_days=self.retention_days,
            http="",  # many nodes in one process: no HTTP API
            enable_python=True,  # the sim task type is a python callable
            blocking_workers=self.workers,  # ... standing in for any handler
        )


@dataclass(frozen=True)
class TaskSettings:
    """The ``sim`` task type's retry policy and timeout."""

    max_attempts: int
    backoff_base_s: float
    backoff_max_s: float
    timeout_s: float


@dataclass(frozen=True)
class SimParams:
    seed: int
    scenario: str
    start: datetime
    """True time (and the database clock) when the run starts."""
    nodes: tuple[str, ...]
    """The nodes started at the beginning; joins add more."""
    partitions: int
    safety_s: float
    """Length of the safety phase (faults on)."""
    liveness_s: float
    """Length of the healed liveness phase (faults off, every node up)."""
    settings: NodeSettings
    task: TaskSettings
    ledger_latency_s: float
    """Baseline one-way latency of a ledger call."""
    schedules: tuple[SimSchedule, ...]
    faults: tuple[Fault, ...]
    handler: HandlerFaults
    dst_transition: tuple[str, datetime] | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    latency: tuple[HandlerLatency, ...] = ()
    """The handler-latency fault's profiles, one per task type (none: handlers take only
    their work); its slow stretches are :class:`SlowHandler` records among the faults."""
    hook_timeout_s: float | None = None
    """The ``hook`` task type's timeout, when the run has a hook fleet (the retry policy is
    the ``sim`` type's)."""
    folding: tuple[str, ...] = ()
    """Task types whose attempts fold (:mod:`simulations.folding`); none but in the
    ``folded`` scenario."""

    @property
    def end_s(self) -> float:
        return self.safety_s + self.liveness_s

    @property
    def timeouts(self) -> dict[str, float]:
        """Each task type's timeout."""
        out = {TASK_TYPE: self.task.timeout_s}
        if self.hook_timeout_s is not None:
            out[HOOK_TYPE] = self.hook_timeout_s
        return out

    @property
    def slow_handlers(self) -> tuple[SlowHandler, ...]:
        return tuple(f for f in self.faults if isinstance(f, SlowHandler))

    def lines(self, *, schedules: bool = True) -> list[str]:
        """Every derived parameter, one per line (printed before a run); ``schedules=False``
        leaves out the list of schedules (a report that tabulates them itself)."""
        s = self.settings
        out = [
            f"seed {self.seed}  scenario {self.scenario}",
            f"start {self.start.isoformat()}  safety {self.safety_s:.0f}s  "
            f"liveness {self.liveness_s:.0f}s",
            f"nodes {','.join(self.nodes)}  partitions {self.partitions}  "
            f"ledger latency {self.ledger_latency_s * 1000:.1f}ms",
            f"lease ttl {s.lease_ttl_s}s margin {s.lease_safety_margin_s}s  lookahead "
            f"{s.lookahead_s}s  probe {s.clock_probe_interval_s}s  skew bound "
            f"{s.clock_skew_bound_s}s  change poll {s.change_poll_interval_s}s  grace "
            f"{s.catchup_grace_s}s  attempt lease {s.attempt_lease_s}s  workers {s.workers}",
            f"task: max attempts {self.task.max_attempts}  backoff {self.task.backoff_base_s}"
            f"-{self.task.backoff_max_s}s  timeout {self.task.timeout_s}s",
            f"handler faults: {self.handler}",
        ]
        if self.hook_timeout_s is not None:
            out.append(f"task {HOOK_TYPE}: timeout {self.hook_timeout_s}s (retry policy as above)")
        out += [profile.describe() for profile in self.latency]
        joined = [getattr(f, "node", "") for f in self.faults if type(f).__name__ == "Join"]
        for node in dict.fromkeys([*self.nodes, *joined]):
            c = host_clock(self.seed, node)
            out.append(
                f"host {node}: clock {c.skew_s * 1000:+.1f}ms, drift {c.drift_ppm:+.1f}ppm, "
                f"NTP every {c.ntp_interval_s:.0f}s"
            )
        if self.dst_transition is not None:
            zone, at = self.dst_transition
            out.append(f"dst transition {zone} at {at.isoformat()}")
        if schedules:
            out.append(f"schedules ({len(self.schedules)}):")
            hooks = [x for x in self.schedules if x.task_type == HOOK_TYPE]
            out += [
                f"  {x.schedule_id} {x.tenant_id} {x.describe()}"
                for x in self.schedules
                if x.task_type != HOOK_TYPE
            ]
            if hooks:  # a fleet of one definition: one line
                tenants = Counter(x.tenant_id for x in hooks)
                out.append(
                    f"  {hooks[0].schedule_id}..{hooks[-1].schedule_id} ({len(hooks)}) "
                    + " ".join(f"{t}:{n}" for t, n in sorted(tenants.items()))
                    + f" {hooks[0].describe()}"
                )
        out.append(f"faults ({len(self.faults)}):")
        out += [f"  {describe(f)}" for f in self.faults]
        return out


def draw_settings(rng: random.Random) -> NodeSettings:
    ttl = rng.choice([6.0, 9.0, 15.0, 30.0])
    return NodeSettings(
        lease_ttl_s=ttl,
        lease_safety_margin_s=round(rng.uniform(0.5, ttl / 3 - 0.2), 2),
        lookahead_s=rng.choice([1.0, 2.0, 5.0, 10.0]),
        clock_probe_interval_s=rng.choice([2.0, 5.0, 10.0]),
        clock_skew_bound_s=rng.choice([1.0, 2.0, 5.0]),
        change_poll_interval_s=rng.choices([1.0, 2.0, 5.0], [1, 2, 3])[0],
        catchup_grace_s=rng.choice([30.0, 60.0, 120.0]),
        attempt_lease_s=rng.choice([3.0, 5.0, 10.0, 30.0, 60.0]),
    )


def draw_task(rng: random.Random, attempt_lease_s: float) -> TaskSettings:
    return TaskSettings(
        max_attempts=rng.randint(3, 6),
        backoff_base_s=1.0,
        backoff_max_s=rng.choice([5.0, 15.0, 30.0]),
        timeout_s=max(120.0, 4 * attempt_lease_s),
    )


def draw_start(
    rng: random.Random, safety_s: float, dst: bool
) -> tuple[datetime, tuple[str, datetime] | None]:
    """A random instant of the year, or shortly before one of the DST transitions."""
    if not dst:
        offset = rng.uniform(0, 364 * 86400)
        return datetime(YEAR, 1, 1, tzinfo=UTC) + timedelta(seconds=round(offset, 3)), None
    zone = rng.choice(DST_ZONES)
    instant, _ = rng.choice(oracle.transitions(zone, YEAR))
    lead = rng.uniform(0.2, 0.7) * safety_s
    return instant - timedelta(seconds=round(lead, 3)), (zone, instant)


def derive(
    seed: int, scenario: str, *, nodes: int | None = None, days: float | None = None
) -> SimParams:
    """The run of ``seed`` under ``scenario`` (see :data:`simulations.scenarios.SCENARIOS`)."""
    from simulations import scenarios  # the builders need this module's types

    if scenario not in scenarios.SCENARIOS:
        raise ValueError(f"unknown scenario {scenario!r}; one of {', '.join(scenarios.SCENARIOS)}")
    rng = stream(seed, "params")
    settings = draw_settings(rng)
    task = draw_task(rng, settings.attempt_lease_s)
    count = nodes if nodes is not None else rng.randint(2, 4)
    safety_s = days * 86400 if days is not None else float(rng.randint(30, 120) * 60)
    dst = scenario == "dst" or (scenario == "random" and rng.random() < 0.35)
    start, transition = draw_start(rng, safety_s, dst)
    schedules = draw_workload(
        stream(seed, "workload"),
        rng.randint(8, 24),
        dst_zone=None if transition is None else transition[0],
    )
    node_ids = tuple(f"n{i}" for i in range(1, count + 1))
    built = scenarios.SCENARIOS[scenario](
        scenarios.Context(
            rng=stream(seed, f"faults:{scenario}"),
            nodes=node_ids,
            safety_s=safety_s,
            settings=settings,
            schedules=tuple(schedules),
            start=start,
            transition=transition,
            seed=seed,
            timeout_s=task.timeout_s,
        )
    )
    base = SimParams(
        seed=seed,
        scenario=scenario,
        start=start,
        nodes=node_ids,
        partitions=rng.choice([1, 2, 4, 8, 16]),
        safety_s=safety_s,
        liveness_s=0.0,
        settings=_with_lease(
            settings if built.workers is None else replace(settings, workers=built.workers),
            built.lease_ttl_s,
        ),
        task=task,
        ledger_latency_s=round(rng.uniform(0.0005, 0.005), 4),
        schedules=tuple(schedules) + tuple(built.schedules),
        faults=tuple(sorted(built.faults, key=lambda f: f.at_s)),
        handler=built.handler,
        dst_transition=transition,
        latency=tuple(built.latency),
        hook_timeout_s=built.hook_timeout_s,
        folding=built.folding,
    )
    from simulations.bound import liveness_s  # the bound derives from the params

    return _with_liveness(base, liveness_s(base))


def _with_lease(settings: NodeSettings, lease_ttl_s: float | None) -> NodeSettings:
    """``settings`` with the partition lease a scenario asks for (its drawn safety margin
    stays: it is under a third of any longer lease too)."""
    if lease_ttl_s is None or lease_ttl_s <= settings.lease_ttl_s:
        return settings
    return replace(settings, lease_ttl_s=lease_ttl_s)


def _with_liveness(params: SimParams, liveness: float) -> SimParams:
    return replace(params, liveness_s=liveness)
