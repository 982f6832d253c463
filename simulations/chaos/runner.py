"""One chaos run from start to finish: set up, fire, break things, heal, collect, check.

1. A private PostgreSQL (:mod:`~simulations.chaos.postgres`), ``carillon migrate``, the audit
   triggers (:mod:`~simulations.chaos.audit`), an admin token (``carillon token create``).
2. The webhook sink (:mod:`~simulations.chaos.sink`) and ``nodes`` ``carillon run``
   processes (:mod:`~simulations.chaos.nodes`).
3. Through the API: a webhook task type aimed at the sink, and the schedules in batches.
4. ``t0`` is the first fire instant a few seconds after creation; fires from ``t0`` on are
   checked. The faults strike just after burst instants: the SIGKILL at ``t0``; the SIGSTOP,
   then the PostgreSQL restart, each at the first burst after the run has *settled* (every
   fire so far succeeded and delivered). The window ends ``window_s`` after ``t0`` or
   :data:`~simulations.chaos.config.HEALED_PERIODS` periods after the database restart,
   whichever is later, so that it closes on a healed cluster.
5. Wait until every checked fire has succeeded and reached the sink, or until the last fire
   is older than the bound; stop the nodes and the sink; read the ledger, the triggers'
   logs, the sink's file and the node logs; run the checkers.

Everything started is stopped, and the database removed, whatever happens (Ctrl-C included);
the work directory (logs, sink file) is kept when the run fails or when asked to.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import httpx

from simulations.chaos import audit
from simulations.chaos.checks import (
    Figure,
    Freeze,
    attempt_leases,
    check_fencing,
    check_fires,
    check_handler_starts,
    lease_epochs,
)
from simulations.chaos.config import HEALED_PERIODS, ChaosConfig, StartDelayBound
from simulations.chaos.faults import Cluster, Faults, Timeline, sleep_until
from simulations.chaos.nodes import NodeSettings, stop_all
from simulations.chaos.postgres import PrivatePostgres
from simulations.chaos.sink import SinkProcess, read_deliveries
from simulations.chaos.workload import (
    Api,
    ScheduleSpec,
    execution_id,
    first_fire_after,
    make_schedules,
)
from simulations.chaos.zombie import ZombieRecord, check_zombie

DATABASE: Final = "carillon"
FIRST_FIRE_MARGIN_S: Final = 3.0
"""The first checked fire is at least this long after the schedules were created."""
DRAIN_POLL_S: Final = 1.0
SETTLE_MARGIN_S: Final = 1.0
"""The next fault strikes at a burst at least this far off when the run has settled."""


@dataclass
class RunResult:
    config: ChaosConfig
    t0: float
    window: tuple[float, float]
    bound: StartDelayBound
    timeline: list[tuple[float, str]]
    figures: list[Figure]
    details: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    workdir: Path | None = None

    @property
    def violations(self) -> list[Figure]:
        return [figure for figure in self.figures if figure.ok is False]


def _carillon(*args: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CARILLON_")}
    done = subprocess.run(
        [sys.executable, "-m", "engine", *args], capture_output=True, text=True, env=env,
        timeout=120,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"carillon {args[0]} failed: {done.stderr.strip()}")


def run(config: ChaosConfig, *, workdir: Path | None = None, quiet: bool = False) -> RunResult:
    keep = workdir is not None
    work = workdir or Path(tempfile.mkdtemp(prefix="carillon-chaos-"))
    work.mkdir(parents=True, exist_ok=True)
    failed = True
    try:
        result = _run(config, work, quiet)
        failed = bool(result.violations)
        result.workdir = work if (keep or failed) else None
        return result
    finally:
        if failed and not keep:
            print(f"chaos: logs kept in {work}", file=sys.stderr)
        elif not keep:
            shutil.rmtree(work, ignore_errors=True)


@dataclass
class _Stage:
    """What the set-up built: the database, the sink, the nodes and the schedules."""

    postgres: PrivatePostgres
    url: str
    sink: SinkProcess
    cluster: Cluster
    specs: list[ScheduleSpec]
    created: float
    """When the schedules were created (no fire before this is expected)."""


def _set_up(config: ChaosConfig, work: Path, stack: contextlib.ExitStack) -> _Stage:
    postgres = stack.enter_context(PrivatePostgres())
    postgres.create_database(DATABASE)
    url = postgres.database_url(DATABASE)
    _carillon("migrate", "--database-url", url, "--partitions", str(config.partitions))
    postgres.psql(DATABASE, audit.INSTALL_SQL)
    token_file = work / "admin-token"
    _carillon("token", "create", "--admin", "--database-url", url, "--save", str(token_file))
    sink = SinkProcess(work)
    stack.callback(sink.stop)
    settings = NodeSettings(
        url, config.lease_ttl_s, config.lease_safety_margin_s, config.attempt_lease_s
    )
    cluster = Cluster(settings, work, config.nodes)
    stack.callback(lambda: stop_all(cluster.ever))
    cluster.start()
    api = Api(str(cluster.running[-1].api_url), token_file)
    stack.callback(api.close)
    api.put_webhook_task_type(sink.url, config)
    specs = make_schedules(config)
    created = time.time()
    api.create_schedules(specs, config)
    return _Stage(postgres, url, sink, cluster, specs, created)


def _run(config: ChaosConfig, work: Path, quiet: bool) -> RunResult:
    began = time.monotonic()
    with contextlib.ExitStack() as stack:
        stage = _set_up(config, work, stack)
        timings = {"setup_s": time.monotonic() - began}
        t0 = first_fire_after(time.time() + FIRST_FIRE_MARGIN_S, config.period_s)
        timeline = Timeline(t0, quiet)
        timeline.note(
            f"{config.schedules} schedules every {config.period_s} s on {config.nodes} nodes; "
            "fires from t0 are checked"
        )
        faults = Faults(config, stage.cluster, stage.postgres, stage.url, timeline)
        worst_s = StartDelayBound.of(config).total_s
        offset = config.fault_offset_s
        faults.kill_and_restart(stage.cluster.running[0], t0 + offset)
        at = _settle(config, stage, t0, worst_s, timeline)
        zombie = faults.pause(stage.cluster.running[1], at + offset)
        at = _settle(config, stage, t0, worst_s, timeline)
        if config.slow_receiver_ms > 0:
            faults.slow_receiver(stage.sink, at + offset)
            at = _settle(config, stage, t0, worst_s, timeline)
        outage = faults.restart_postgres(at + offset)
        end = max(t0 + config.window_s, at + HEALED_PERIODS * config.period_s)
        window = (float(t0), float(end))
        bound = StartDelayBound.of(config, outage)
        _drain(config, stage, window, bound.total_s, timeline)
        timings["window_and_drain_s"] = time.time() - t0
        _dump_state(stage, work, window)
        stop_all(stage.cluster.ever)
        stage.sink.stop()
        timeline.note("nodes and sink stopped; checking")
        figures, details = _check(stage, window, bound, zombie)
        timings["total_s"] = time.monotonic() - began
        return RunResult(config, t0, window, bound, timeline.events, figures, details, timings)
    raise AssertionError("unreachable")


def _dump_state(stage: _Stage, work: Path, window: tuple[float, float]) -> None:
    """For a post-mortem: every running node's ``/metrics``, the lease table, and the checked
    executions that have not succeeded, written to the work directory before anything stops."""
    for node in stage.cluster.running:
        if node.alive and node.api_url is not None:
            with contextlib.suppress(httpx.HTTPError):
                text = httpx.get(f"{node.api_url}/metrics", timeout=5).text
                (work / f"metrics-{node.node_id}.txt").write_text(text)
    with (work / "ledger-state.txt").open("w") as out:
        for row in audit.fetch(stage.url, "SELECT * FROM partition_leases ORDER BY 1"):
            out.write(f"lease {dict(row)}\n")
        for row in audit.fetch(stage.url, "SELECT * FROM nodes ORDER BY 1"):
            out.write(f"node {dict(row)}\n")
        for row in audit.fetch(
            stage.url,
            "SELECT * FROM executions WHERE status <> 'succeeded' "
            "AND planned_at >= to_timestamp($1) AND planned_at < to_timestamp($2) "
            "ORDER BY planned_at, execution_id",
            *window,
        ):
            out.write(f"missing {dict(row)}\n")


def _check(
    stage: _Stage, window: tuple[float, float], bound: StartDelayBound, zombie: ZombieRecord
) -> tuple[list[Figure], dict[str, Any]]:
    """Read the ledger, the triggers' logs, the sink's file and the zombie's log; check."""
    data = audit.read_all(stage.url, *window)
    epochs = lease_epochs(data.leases)
    deliveries = read_deliveries(stage.sink.path)
    fires, fire_details = check_fires(
        stage.specs, window, stage.created, data.executions, deliveries, bound.total_s
    )
    fencing, fence_details = check_fencing(data.writes, epochs)
    freeze = Freeze(zombie.node_id, zombie.resumed_wall, stage.cluster.settings.workers)
    in_lease, in_lease_details = check_handler_starts(
        deliveries, attempt_leases(data.writes), data.partition_of, epochs, freeze
    )
    zombie_log = list(stage.cluster.by_id(zombie.node_id).log_records())
    zombie_figures, zombie_details = check_zombie(zombie, epochs, data.writes, zombie_log)
    details = {
        "fires": fire_details,
        "fencing": fence_details | in_lease_details,
        "zombie": zombie_details,
    }
    return fires + fencing + in_lease + zombie_figures, details


def _settle(
    config: ChaosConfig, stage: _Stage, t0: float, timeout_s: float, timeline: Timeline
) -> float:
    """After a fault: let two lease cycles pass (the lost node's return is rebalanced), then
    wait until every fire planned so far has succeeded and reached the sink, so that the next
    fault meets no execution this one delayed. Returns the next burst instant (the next
    fault's); gives up waiting after ``timeout_s`` (the checks then report what is late)."""
    time.sleep(2 * config.renew_interval_s)
    cutoff = time.time()
    expected = {execution_id(s.schedule_id, t) for s in stage.specs for t in s.fires(t0, cutoff)}
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        done = audit.count_succeeded(stage.url, t0, cutoff) >= len(expected)
        if done and expected <= stage.sink.keys():
            timeline.note(f"settled: the {len(expected):,} fires so far succeeded and arrived")
            break
        time.sleep(DRAIN_POLL_S)
    else:
        timeline.note(f"not settled after {timeout_s:.0f} s; going on")
    return first_fire_after(
        time.time() + SETTLE_MARGIN_S + max(-config.fault_offset_s, 0.0), config.period_s
    )


def _drain(
    config: ChaosConfig,
    stage: _Stage,
    window: tuple[float, float],
    bound_s: float,
    timeline: Timeline,
) -> None:
    """Wait for the end of the window, then until every checked fire succeeded and was
    delivered -- or until the last fire is older than the bound (then the checks report)."""
    expected = {execution_id(s.schedule_id, t) for s in stage.specs for t in s.fires(*window)}
    sleep_until(window[1])
    timeline.note("end of the checked window; waiting for the last fires")
    last_fire = window[1] - config.period_s
    deadline = max(last_fire + bound_s, window[1]) + 2 * DRAIN_POLL_S
    while time.time() < deadline:
        succeeded = audit.count_succeeded(stage.url, *window)
        if succeeded >= len(expected) and expected <= stage.sink.keys():
            timeline.note(f"all {len(expected)} checked fires succeeded and were delivered")
            return
        time.sleep(DRAIN_POLL_S)
    timeline.note("the bound has passed for every checked fire; checking what arrived")
