"""Run one seed: deterministic trio, the world, then every checker; and the summary.

Determinism comes from three things: trio's ``MockClock(autojump_threshold=0)`` (time moves
only when every task waits), trio's deterministic scheduling hook
(``trio._core._run._ALLOW_DETERMINISTIC_SCHEDULING`` with its ``_r`` seeded from the run's
seed; trio is pinned to a minor range for it), and random streams derived from the seed for
everything else. Both hooks are restored afterwards, so a test process can run many seeds.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TextIO

import trio
import trio.testing
from trio._core import _run as trio_run

from engine.model import Execution
from simulations.bound import DelayBound, ahead_s, completion_s, load_bound, stale_s
from simulations.check_failover import FailoverChecker, FailoverReport
from simulations.check_fires import FireChecker, FireReport
from simulations.effects import Delivery
from simulations.expect import expect
from simulations.folding import folding
from simulations.leases import PRIMARY
from simulations.params import SimParams
from simulations.trace import Trace
from simulations.world import ErrorLog, World


@dataclass
class Result:
    params: SimParams
    digest: str
    events: int
    violations: list[str]
    fires: FireReport
    faults_injected: Counter[str]
    acquisitions: int
    accepted_writes: int
    refused_writes: int
    node_hours: float
    wall_s: float
    bound: DelayBound
    clock_beyond_s: float
    errors: list[str] = field(default_factory=list)
    tail: list[str] = field(default_factory=list)
    executions: list[Execution] = field(default_factory=list)
    """Every execution the ledger held at the end."""
    deliveries: list[Delivery] = field(default_factory=list)
    """Every handler start, in order."""
    failover: FailoverReport | None = None
    """The region failover's report, in a run that has one."""
    folded: int = 0
    """Attempts the nodes started without a recorded claim (their dispatchers' count, as
    the last pipeline of each node process kept it)."""

    @property
    def ok(self) -> bool:
        return not self.violations

    @property
    def node_hours_per_s(self) -> float:
        return self.node_hours / self.wall_s if self.wall_s > 0 else 0.0


@contextmanager
def deterministic_trio(seed: int) -> Iterator[None]:
    """trio's scheduler shuffles runnable tasks with ``_r``; seed it and turn it on."""
    flag = trio_run._ALLOW_DETERMINISTIC_SCHEDULING
    state = trio_run._r.getstate()
    # trio declares its test-only hook Final (it sets it once, in its own test suite); the
    # simulator is the one other writer and restores it below.
    trio_run._ALLOW_DETERMINISTIC_SCHEDULING = True  # type: ignore[misc]
    trio_run._r.seed(f"carillon-sim:{seed}:trio")
    try:
        yield
    finally:
        trio_run._ALLOW_DETERMINISTIC_SCHEDULING = flag  # type: ignore[misc]
        trio_run._r.setstate(state)


@contextmanager
def engine_errors_captured() -> Iterator[ErrorLog]:
    """Route the engine's log records of level ERROR to a collector, and drop the rest."""
    logger = logging.getLogger("carillon")
    saved = (logger.level, logger.propagate, list(logger.handlers))
    collector = ErrorLog()
    logger.setLevel(logging.ERROR)
    logger.propagate = False
    logger.handlers = [collector]
    try:
        yield collector
    finally:
        logger.setLevel(saved[0])
        logger.propagate = saved[1]
        logger.handlers = saved[2]


def run_simulation(params: SimParams, *, trace_file: TextIO | None = None) -> Result:
    trace = Trace(trace_file)
    world = World(params, trace)
    started = time.perf_counter()
    with (
        deterministic_trio(params.seed),
        engine_errors_captured() as errors,
        folding(params.folding),
    ):
        trio.run(world.main, clock=trio.testing.MockClock(autojump_threshold=0))
    wall_s = time.perf_counter() - started
    expectation = expect(
        world.api.history,
        world.ended_at,
        stale_s=stale_s(params),
        completion_s=completion_s(params),
        ahead_s=ahead_s(params),
    )
    load = load_bound(params) if params.latency else None
    bound = DelayBound(params, world.disruptions, load)
    fires = FireChecker(params, expectation, bound, world.sinks).check(world.executions)
    violations = list(fires.violations) + world.violations + world.monitor.violations
    failover = None
    if world.failover is not None:
        failover = FailoverChecker(
            params, world.failover, world.failover_log, world.region_of
        ).check(
            world.sinks.deliveries,
            world.monitor.claims.get(PRIMARY, {}),
            world.monitor.trust_in(PRIMARY),
            world.monitor.stale_epoch_acquisitions,
        )
        violations += failover.violations
    for host in world.hosts.values():
        violations += host.deaths
    violations += [f"engine error: {record}" for record in errors.records]
    return Result(
        params=params,
        digest=trace.digest,
        events=trace.events,
        violations=violations,
        fires=fires,
        faults_injected=world.faults_injected,
        acquisitions=world.monitor.acquisitions,
        accepted_writes=world.monitor.accepted_writes,
        refused_writes=world.monitor.refused_writes,
        node_hours=sum(h.up_s for h in world.hosts.values()) / 3600,
        wall_s=wall_s,
        errors=errors.records,
        tail=trace.tail(),
        bound=bound,
        clock_beyond_s=world.clock_beyond_s,
        executions=world.executions,
        deliveries=world.sinks.deliveries,
        failover=failover,
        folded=sum(node.dispatcher.statistics().folded for node in world.nodes_built),
    )


def summary(result: Result, *, violations_shown: int = 30) -> list[str]:
    """The lines ``python -m simulations run`` prints after the run."""
    f = result.fires
    bound = result.bound
    faults = ", ".join(f"{k} {v}" for k, v in sorted(result.faults_injected.items())) or "none"
    lines = [
        f"fires expected {f.expected}  executions {f.executions}  "
        + "  ".join(f"{k} {v}" for k, v in sorted(f.statuses.items())),
        f"skipped by reason: {dict(sorted(f.skip_reasons.items()))}",
        f"deliveries {f.deliveries} (handler starts)  effects {f.effects} (idempotent sink)  "
        f"repeat deliveries {f.repeat_deliveries} (naive sink)  duplicate effects "
        f"{sum('duplicate effect' in v for v in result.violations)}  misses {f.misses}",
        f"stale-token requests {f.stale_token_deliveries} (a fencing-aware sink would refuse)",
        f"max start delay {f.max_start_delay_s:.3f}s (in healthy periods "
        f"{f.max_healthy_delay_s:.3f}s; healthy bound {bound.healthy_s:.1f}s, "
        f"recovery {bound.recovery_s:.1f}s)",
        *(
            []
            if bound.load is None
            else [
                f"workers {bound.load.workers} a node: largest queue allowance "
                f"{bound.load.max_queue_s:.1f}s, safety phase drained {bound.load.drained_s:.0f}s "
                f"after the heal (bound), longest completion {bound.load.completion_s:.0f}s"
            ]
        ),
        f"faults injected: {faults}",
        f"node wall clocks beyond the skew bound for {result.clock_beyond_s:.0f} "
        "node-seconds (no excuse for delay: the engine runs on the database's time)",
        f"leases acquired {result.acquisitions}  fenced writes accepted {result.accepted_writes}  "
        f"refused {result.refused_writes} (zombie and late writes fenced off)",
        *([] if result.failover is None else result.failover.lines()),
        *(
            [f"folded starts {result.folded} (claims written with their completions)"]
            if result.params.folding
            else []
        ),
        f"trace {result.events} events, hash {result.digest}",
        f"simulated {result.node_hours:.1f} node-hours in {result.wall_s:.2f}s wall: "
        f"{result.node_hours_per_s:.1f} node-hours per wall-second",
        f"violations: {len(result.violations)}",
    ]
    lines += [f"  {v}" for v in result.violations[:violations_shown]]
    if len(result.violations) > violations_shown:
        lines.append(f"  ... and {len(result.violations) - violations_shown} more")
    return lines
