"""A top-of-minute burst of webhooks: N deliveries due at the same instant T, default settings.

The point is the defaults: "with the default settings, no flag needed". Each burst lives in
a throwaway database (``carillon_webhooks_<hex>``) of the resolved server: one task type
``hook`` (kind ``webhook``, default timeout and retry policy) whose URL is a local receiver,
and N schedules (default 20,000) over 20 tenants, all due at one instant T (a 6-field daily
expression whose ``next_run_at`` is T, far enough ahead for creating and loading them). The
receiver is ``benchmarks/webhook_receiver.py`` in its own process (uvloop, keep-alive
HTTP/1.1), answering ``200`` after a latency of 0, 50 or 250 ms (``--latencies``); it counts
the requests, the distinct ``Idempotency-Key`` values and the requests in flight (received,
not yet answered) at most. Variants, each on its own database:

* **one node in-process**: PostgresLedger on the bridge, real clock, ``NodeConfig`` at its
  defaults (1,000 workers, 256 webhook connections per host, 1,024 in all) apart from its
  id, the log level, ``webhook_allow_cidrs="127.0.0.0/8"`` (the SSRF guard refuses loopback
  otherwise) and no HTTP API; ``--runs`` times per latency, medians reported;
* **K nodes** (``--nodes``, default 2): K ``carillon run`` processes with default settings
  plus ``--webhook-allow-cidrs 127.0.0.0/8`` (``benchmarks/_nodes.py``), sharing the
  database, started once the schedules exist, T set late enough that they have shared the
  partitions by then; ``--node-runs`` times (default 1) per latency.

Reported per variant: deliveries/s (N / T until the last execution had succeeded in the
ledger: the last answer received and its completion written), T until all were delivered,
start delay p50/p99/max (``started_at - planned_at``, the ledger), the lead (T - the last
execution enqueued), peak requests in flight and peak connections at the receiver, the
node's peak RSS (in-process: the process's RSS sampled every 0.5 s from T; processes: each
one's VmHWM), the CPU each delivery cost from T until all had succeeded in the node (the
whole benchmark process for the in-process node -- its trio thread, its database thread, the
poller; the sum of the node processes otherwise) and in PostgreSQL (``benchmarks/_cpu.py``),
and duplicates two ways: the receiver's requests minus its distinct keys (and keys missing),
and the ledger's (``_burst.ledger_figures``: attempt > 1, extra rows per (schedule, instant),
extra attempt rows; every execution must have succeeded once). Beside them, over the same
window, the cores kept busy by the node, by the receiver and by everything else on the machine
(``/proc/stat`` less the node, the receiver and PostgreSQL): a shared machine's other load.

In the same run, after each one-node burst, the receiver's **ceiling**: the plain keep-alive
client of ``benchmarks/webhook_clients.py`` (``raw-uvloop``: an ``asyncio.Protocol`` per
connection on uvloop, no trio, no engine, in its own process) sending N webhook-shaped POSTs
to the same receiver at the same latency with as many in flight as the node may have
to one receiver (``webhook_connections_per_host``, 256), after a warm-up of that many.
Each variant's deliveries/s is given as a ratio of the median ceiling at its latency (the K
node columns against the same one-node ceiling: they may hold K times as many in flight).

Targets (one node, receiver latency 50 ms, N = 20,000): >= 3,000 deliveries/s; the burst
fully delivered within 10 s of T; >= 30 % of the receiver ceiling measured in the same run.
A full run writes its section of docs/benchmarks.md, its headline figures to
docs/bench-results/bench_webhooks.json and the Targets section; ``--quick`` (2,000
webhooks, 50 ms only, one run) and ``--no-docs`` write none of these.

Usage: python benchmarks/bench_webhooks.py [--quick] [--no-docs] [--webhooks N] [--runs K]
       [--latencies 0,50,250] [--nodes 2] [--node-runs K] [--timeout S] [--no-ceiling]
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final

import asyncpg
import trio
import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._burst import (
    CREATE_BATCH,
    TENANTS,
    admin,
    fresh_database,
    ledger_figures,
    poll_until_succeeded,
    schedule_ids,
    tenant_of,
)
from benchmarks._cpu import cores, cpu_s, postgres_cpu_s, process_cpu_s
from benchmarks._nodes import peak_rss_mb, start_nodes, stop_nodes, wait_balanced
from benchmarks._report import (
    machine,
    revision,
    summary,
    write_results,
    write_section,
    write_targets,
)
from benchmarks.webhook_clients import Job, run_candidate
from benchmarks.webhook_receiver import ReceiverProcess, raise_fd_limit, start_receiver
from engine.clock import SystemClock
from engine.config import (
    BURST_PLAN_RATE_PER_S_DEFAULT,
    WEBHOOK_CONNECTIONS_PER_HOST_DEFAULT,
    WORKERS_DEFAULT,
    LogLevel,
    NodeConfig,
)
from engine.ledger.database import resolve_database
from engine.ledger.params import SchedulesCreate, TaskTypesPut
from engine.ledger.postgres import PARTITIONS_DEFAULT, migrate_database, open_postgres_ledger
from engine.model import HandlerKind, Schedule, TaskType
from engine.node import Node

ALLOW: Final = "127.0.0.0/8"
TASK_TYPE: Final = "hook"
TARGET_LATENCY_MS: Final = 50.0
TARGET_PER_S: Final = 3_000.0
TARGET_DELIVERED_S: Final = 10.0
TARGET_WEBHOOKS: Final = 20_000
TARGET_CEILING: Final = 0.30
CEILING_CLIENT: Final = "raw-uvloop"
CEILING_IN_FLIGHT: Final = WEBHOOK_CONNECTIONS_PER_HOST_DEFAULT
"""The plain client's in-flight level: as many as one node may have open to one receiver."""
SETTLE_PER_EXTRA_NODE_S: Final = 30.0
"""As ``bench_burst``: T is set this much later per node process beyond the first, at
200,000 schedules (pro rata below, at least ``SETTLE_MIN_S``), so that the processes have
shared the partitions by T, as a running cluster has."""
SETTLE_MIN_S: Final = 3.0


@dataclass(frozen=True)
class Variant:
    latency_ms: float
    nodes: int = 0
    """0: one node in this process; K > 0: K ``carillon run`` processes."""

    @property
    def label(self) -> str:
        who = f"{self.nodes} nodes" if self.nodes else "1 node"
        return f"{who}, {self.latency_ms:g} ms"


# --- the schedules -------------------------------------------------------------------------


async def create_webhooks(url: str, n: int, hook_url: str, base_lead_s: float) -> datetime:
    """Migrate; store the ``hook`` webhook task type and N schedules due at one instant T,
    far enough ahead for creating them and for a node to load and plan them; returns T."""
    await migrate_database(url, partitions=PARTITIONS_DEFAULT)
    async with open_postgres_ledger(url) as ledger:
        now = await ledger.database_now()
        lead = timedelta(seconds=base_lead_s + n / 5_000 + n / BURST_PLAN_RATE_PER_S_DEFAULT)
        burst_at = (now + lead).replace(microsecond=0)
        expr = f"{burst_at.second} {burst_at.minute} {burst_at.hour} * * *"
        await ledger.task_types_put(
            TaskTypesPut(
                TaskType(
                    name=TASK_TYPE,
                    kind=HandlerKind.WEBHOOK,
                    settings={"url": hook_url},
                    allowed_tenants=("*",),
                )
            )
        )
        ids = schedule_ids(n)
        for first in range(0, n, CREATE_BATCH):
            batch = [
                Schedule(
                    schedule_id=sid,
                    tenant_id=tenant_of(sid),
                    cron_expr=expr,
                    timezone="UTC",
                    task_type=TASK_TYPE,
                    next_run_at=burst_at,
                )
                for sid in ids[first : first + CREATE_BATCH]
            ]
            await ledger.schedules_create(SchedulesCreate(batch))
    return burst_at


# --- CPU over the burst ------------------------------------------------------------------------


def _machine_busy_s() -> float | None:
    """CPU seconds the whole machine has spent busy (all cores; idle and iowait excluded)."""
    try:
        fields = [int(f) for f in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None
    busy = sum(fields[:8]) - fields[3] - fields[4]  # user..steal, less idle and iowait
    return busy / os.sysconf("SC_CLK_TCK")


def _pids_cpu_s(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            total += process_cpu_s(Path(f"/proc/{pid}/stat").read_text())
        except OSError:
            continue
    return total


@dataclass(frozen=True)
class Window:
    """CPU seconds so far: the node (this process, or the node processes), PostgreSQL, the
    receiver, the whole machine; and the wall clock. Two of them make the burst's figures."""

    wall_s: float
    node_s: float
    postgres_s: float | None
    receiver_s: float
    machine_s: float | None

    @classmethod
    def now(cls, node_pids: list[int] | None, receiver_pid: int) -> Window:
        node = cpu_s() if node_pids is None else _pids_cpu_s(node_pids)
        return cls(
            time.monotonic(), node, postgres_cpu_s(), _pids_cpu_s([receiver_pid]), _machine_busy_s()
        )


def window_figures(before: Window, after: Window, n: int) -> dict[str, float]:
    """Per delivery: the node's and PostgreSQL's CPU (µs); over the window: the cores the
    receiver and everything else on the machine kept busy (``other_cores``: the load this
    benchmark did not make -- other work on a shared machine)."""
    wall = max(after.wall_s - before.wall_s, 1e-3)
    node = after.node_s - before.node_s
    figures = {
        "node_cpu_us": node / n * 1e6,
        "node_cores": node / wall,
        "receiver_cores": (after.receiver_s - before.receiver_s) / wall,
    }
    if figures["node_cpu_us"] > 0:
        figures["node_core_bound_per_s"] = 1e6 / figures["node_cpu_us"]
    server = None
    if before.postgres_s is not None and after.postgres_s is not None:
        server = after.postgres_s - before.postgres_s
        figures["postgres_cpu_us"] = server / n * 1e6
    if before.machine_s is not None and after.machine_s is not None and server is not None:
        ours = node + server + (after.receiver_s - before.receiver_s)
        figures["other_cores"] = max((after.machine_s - before.machine_s - ours) / wall, 0.0)
    return figures


# --- one node in this process ----------------------------------------------------------------


async def in_process_phase(
    url: str, n: int, burst_at: datetime, timeout_s: float, receiver_pid: int
) -> dict[str, Any]:
    config = NodeConfig(
        node_id=f"bench-webhooks-{os.getpid()}",
        log_level=LogLevel.WARNING,
        webhook_allow_cidrs=ALLOW,
        http="",
    )
    async with open_postgres_ledger(url) as ledger:
        node = Node(config, ledger, SystemClock(), random.Random(7))
        async with trio.open_nursery() as nursery:
            await nursery.start(node.run)
            await trio.sleep(max((burst_at - datetime.now(UTC)).total_seconds(), 0.0))
            before = Window.now(None, receiver_pid)
            polled = await trio.to_thread.run_sync(
                poll_until_succeeded, url, n, burst_at, timeout_s
            )
            after = Window.now(None, receiver_pid)
            nursery.cancel_scope.cancel()
    return polled | window_figures(before, after, n)


# --- K node processes ------------------------------------------------------------------------


async def _balanced_before(url: str, k: int, burst_at: datetime) -> bool:
    connection = await asyncpg.connect(url)
    try:
        until_t = (burst_at - datetime.now(UTC)).total_seconds()
        return await wait_balanced(connection, k, max(until_t, 0.0))
    finally:
        await connection.close()


def processes_phase(
    url: str, n: int, k: int, burst_at: datetime, timeout_s: float, logs: Path, receiver_pid: int
) -> dict[str, Any]:
    processes = start_nodes(
        url, k, logs, name=f"webhooks-{k}", options=("--webhook-allow-cidrs", ALLOW)
    )
    try:
        result: dict[str, Any] = {"balanced": uvloop.run(_balanced_before(url, k, burst_at))}
        result["balanced_lead_s"] = (burst_at - datetime.now(UTC)).total_seconds()
        time.sleep(max((burst_at - datetime.now(UTC)).total_seconds(), 0.0))
        pids = [process.pid for process in processes]
        before = Window.now(pids, receiver_pid)
        poll_until_succeeded(url, n, burst_at, timeout_s)
        after = Window.now(pids, receiver_pid)
        result |= window_figures(before, after, n)
        result["rss_mb"] = [peak_rss_mb(pid) for pid in pids]
        result["peak_rss_mb"] = max(result["rss_mb"])
        for process in processes:
            if process.poll() is not None:
                raise RuntimeError(f"a node process ended early (code {process.returncode})")
    finally:
        stop_nodes(processes)
    return result


# --- one burst, one ceiling ------------------------------------------------------------------


def one_burst(
    server_url: str,
    n: int,
    variant: Variant,
    receiver: ReceiverProcess,
    timeout_s: float,
    base_lead_s: float,
    logs: Path,
) -> dict[str, Any]:
    receiver.set_latency(variant.latency_ms)
    receiver.reset()
    name, url = fresh_database(server_url, "carillon_webhooks_")
    try:
        lead_s = base_lead_s
        if variant.nodes:
            settle = SETTLE_PER_EXTRA_NODE_S * (variant.nodes - 1) * min(n / 200_000, 1.0)
            lead_s += max(settle, SETTLE_MIN_S)
        burst_at = trio.run(create_webhooks, url, n, receiver.url("/hook"), lead_s)
        if variant.nodes:
            result = processes_phase(
                url, n, variant.nodes, burst_at, timeout_s, logs, receiver.process.pid
            )
        else:
            result = trio.run(in_process_phase, url, n, burst_at, timeout_s, receiver.process.pid)
        seen = receiver.stats()
        result |= uvloop.run(ledger_figures(url, n, burst_at, timeout_s))
    finally:
        admin(server_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    result |= {
        "deliveries_per_s": result["executions_per_s"],
        "all_delivered_s": result["all_succeeded_s"],
        "requests": float(seen["requests"]),
        "unique_keys": float(seen["unique_keys"]),
        "receiver_duplicates": float(seen["requests"] - seen["unique_keys"]),
        "missing_keys": float(n - seen["unique_keys"]),
        "peak_in_flight": float(seen["peak_in_flight"]),
        "peak_connections": float(seen["peak_connections"]),
        "connections": float(seen["connections"]),
    }
    print(
        f"  {variant.label}: {result['deliveries_per_s']:,.0f} deliveries/s, all delivered "
        f"{result['all_delivered_s']:.2f} s after T, lead {result['lead_s']:.2f} s, peak in "
        f"flight {seen['peak_in_flight']}, receiver {seen['requests']} requests / "
        f"{seen['unique_keys']} keys",
        file=sys.stderr,
        flush=True,
    )
    return result


def receiver_ceiling(receiver: ReceiverProcess, n: int, latency_ms: float) -> dict[str, Any]:
    """The plain keep-alive client's requests/s against the receiver, at ``latency_ms`` with
    ``CEILING_IN_FLIGHT`` in flight, N requests after a warm-up of that many."""
    receiver.set_latency(latency_ms)
    receiver.reset()
    tag = f"ceiling-{latency_ms:g}-{time.monotonic_ns()}"
    job = Job(receiver.url("/hook"), n, CEILING_IN_FLIGHT, 120.0, tag)
    result = run_candidate(CEILING_CLIENT, job, timeout_s=600.0)
    seen = receiver.stats()
    figures = {
        "ceiling_per_s": float(result["rate"]),
        "ceiling_client_cpu_us": float(result["cpu_us"]),
        "ceiling_errors": float(result["errors"]),
        "ceiling_peak_in_flight": float(seen["peak_in_flight"]),
    }
    print(
        f"  ceiling, {latency_ms:g} ms: {result['rate']:,.0f} requests/s "
        f"({CEILING_IN_FLIGHT} in flight, {result['errors']} errors)",
        file=sys.stderr,
        flush=True,
    )
    return figures


# --- the report ------------------------------------------------------------------------------

Results = dict[Variant, list[dict[str, Any]]]
Ceilings = dict[float, list[dict[str, Any]]]


def _spread(samples: list[float], digits: int) -> str:
    median, low, high = summary(samples)
    if low == high:
        return f"{median:,.{digits}f}".replace("inf", "timeout")
    return f"{median:,.{digits}f} ({low:,.{digits}f}-{high:,.{digits}f})".replace("inf", "timeout")


ROWS: Final = (
    ("deliveries/s (N / T until the last delivery succeeded)", "deliveries_per_s", 0),
    ("T until all delivered (s)", "all_delivered_s", 2),
    ("share delivered (by the timeout)", "succeeded_share", 4),
    ("start delay p50 (s)", "delay_p50_s", 2),
    ("start delay p99 (s)", "delay_p99_s", 2),
    ("start delay max (s)", "delay_max_s", 2),
    ("lead before T (s)", "lead_s", 2),
    ("peak requests in flight at the receiver", "peak_in_flight", 0),
    ("peak connections at the receiver", "peak_connections", 0),
    ("peak RSS, node (MB)", "peak_rss_mb", 0),
    ("CPU per delivery after T, node (µs)", "node_cpu_us", 0),
    ("CPU per delivery after T, PostgreSQL (µs)", "postgres_cpu_us", 0),
    ("deliveries/s one core allows at the node's CPU cost", "node_core_bound_per_s", 0),
    ("cores busy from T until all delivered: node", "node_cores", 2),
    ("cores busy from T until all delivered: receiver", "receiver_cores", 2),
    (
        "cores busy from T until all delivered: other work (not node, receiver, PostgreSQL)",
        "other_cores",
        2,
    ),
    ("receiver: requests", "requests", 0),
    ("receiver: distinct Idempotency-Keys", "unique_keys", 0),
    ("receiver: duplicate requests (requests - keys)", "receiver_duplicates", 0),
    ("ledger: duplicates (attempt > 1, extra rows, extra attempts)", "duplicates", 0),
    ("receiver ceiling, plain keep-alive client (requests/s)", "ceiling_per_s", 0),
    ("deliveries/s / receiver ceiling", "ratio", 2),
)


def attach_ratios(variants: list[Variant], results: Results, ceilings: Ceilings) -> None:
    """Each burst's ceiling and ratio: a one-node run against the ceiling measured right after
    it; a K-node run against the median ceiling at its latency."""
    for variant in variants:
        measured = ceilings.get(variant.latency_ms, [])
        if not measured:
            continue
        median = summary([c["ceiling_per_s"] for c in measured])[0]
        for index, run in enumerate(results[variant]):
            own = measured[index] if not variant.nodes and index < len(measured) else None
            ceiling = own["ceiling_per_s"] if own else median
            run["ceiling_per_s"] = ceiling
            run["ratio"] = run["deliveries_per_s"] / ceiling if ceiling else float("nan")


def figure_table(variants: list[Variant], results: Results) -> str:
    lines = [
        "| figure | " + " | ".join(v.label for v in variants) + " |",
        "|---|" + "---:|" * len(variants),
    ]
    for title, key, digits in ROWS:
        cells = []
        for variant in variants:
            samples = [run[key] for run in results[variant] if key in run]
            cells.append(_spread(samples, digits) if samples else "")
        if any(cells):
            lines.append(f"| {title} | " + " | ".join(cells) + " |")
    if any(v.nodes for v in variants):
        cells = []
        for variant in variants:
            runs = results[variant]
            if not variant.nodes or not runs:
                cells.append("")
                continue
            per_process = zip(*(run["rss_mb"] for run in runs), strict=True)
            cells.append(" / ".join(f"{summary(list(p))[0]:.0f}" for p in per_process))
        lines.append("| peak RSS per node process (MB) | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _median(runs: list[dict[str, Any]], key: str) -> float | None:
    samples = [run[key] for run in runs if key in run]
    return summary(samples)[0] if samples else None


def verdicts(n: int, variants: list[Variant], results: Results) -> list[str]:
    target = next((v for v in variants if not v.nodes and v.latency_ms == TARGET_LATENCY_MS), None)
    if target is None:
        return [f"Targets: not measured (no one-node variant at {TARGET_LATENCY_MS:g} ms)."]
    runs = results[target]
    rate = _median(runs, "deliveries_per_s") or 0.0
    delivered = _median(runs, "all_delivered_s")
    ratio = _median(runs, "ratio")

    def met(ok: bool) -> str:
        return "met" if ok else "**not met**"

    parts = [
        f">= {TARGET_PER_S:,.0f} deliveries/s: {met(rate >= TARGET_PER_S)} ({rate:,.0f}/s)",
    ]
    if n == TARGET_WEBHOOKS and delivered is not None:
        parts.append(
            f"the {TARGET_WEBHOOKS:,} burst fully delivered within {TARGET_DELIVERED_S:g} s of "
            f"T: {met(delivered <= TARGET_DELIVERED_S)} ({delivered:.2f} s)"
        )
    else:
        parts.append(
            f"the {TARGET_WEBHOOKS:,} burst fully delivered within {TARGET_DELIVERED_S:g} s of "
            f"T: n/a (this run had {n:,} webhooks; {delivered or 0:.2f} s)"
        )
    if ratio is not None:
        parts.append(
            f">= {TARGET_CEILING:.0%} of the receiver ceiling measured in the same run: "
            f"{met(ratio >= TARGET_CEILING)} ({ratio:.0%})"
        )
    return [
        f"Targets ({target.label}, default settings, median over the runs): "
        + "; ".join(parts)
        + "."
    ]


def starts_line(runs: list[dict[str, Any]], per_line: int = 10) -> list[str]:
    """Starts per second since T of the median run (by deliveries/s)."""
    run = sorted(runs, key=lambda r: r["deliveries_per_s"])[len(runs) // 2]
    counts = dict(run["starts_per_s"])
    if not counts:
        return ["(no starts)"]
    first, last = min(counts), max(counts)
    lines = []
    for start in range(first, last + 1, per_line):
        cells = [f"{counts.get(s, 0):>6,}" for s in range(start, min(start + per_line, last + 1))]
        lines.append(f"T+{start:>3}s: " + " ".join(cells))
    return lines


def _runs(count: int) -> str:
    return f"{count} run" + ("" if count == 1 else "s")


def report(
    args: argparse.Namespace,
    variants: list[Variant],
    results: Results,
    elapsed_s: float,
    start: tuple[float, float, float],
) -> tuple[str, bool]:
    all_runs = [run for runs in results.values() for run in runs]
    clean = all(
        run["duplicates"] == 0
        and run["receiver_duplicates"] == 0
        and run["missing_keys"] == 0
        and run["succeeded_share"] == 1.0
        for run in all_runs
    )
    load = os.getloadavg()
    lines = [
        "## Webhook bursts (`benchmarks/bench_webhooks.py`)",
        "",
        f"Machine: {machine()}; revision {revision()}; {args.webhooks:,} webhooks over "
        f"{TENANTS} tenants all due at the same instant T, a fresh database per burst, "
        f"{PARTITIONS_DEFAULT} partitions; the receiver (`benchmarks/webhook_receiver.py`, "
        "uvloop, its own process) answers 200 after the column's latency. **Default settings** "
        f"({WORKERS_DEFAULT:,} workers, {WEBHOOK_CONNECTIONS_PER_HOST_DEFAULT} webhook "
        "connections per host, 1,024 in all, smoothing off) plus `--webhook-allow-cidrs "
        f"{ALLOW}` and no HTTP API: one node in-process ({_runs(args.runs)}, median (min-max)), "
        f"and {args.nodes or 'no'} node processes (`carillon run`, {_runs(args.node_runs)}). "
        "PostgreSQL, the receiver and the nodes share the machine's cores. The ceiling: the "
        f"plain keep-alive client of `benchmarks/webhook_clients.py` (`{CEILING_CLIENT}`, "
        f"uvloop, no trio, no engine) with {CEILING_IN_FLIGHT} in flight, {args.webhooks:,} "
        "requests at the same latency, measured right after each one-node burst (the node "
        "columns are divided by the median ceiling at their latency: with K nodes up to K x "
        f"{CEILING_IN_FLIGHT} may be in flight). Load average (1 / 5 / 15 min) at the start "
        f"{start[0]:.2f} / {start[1]:.2f} / {start[2]:.2f}, at the end {load[0]:.2f} / "
        f"{load[1]:.2f} / {load[2]:.2f}; the whole run took {elapsed_s / 60:.1f} min.",
        "",
        figure_table(variants, results),
        "",
        "At 0 ms the receiver answers each request in the callback that read it, so it never "
        "holds more than one: the peak connections show the node's concurrency there. The "
        "node's CPU (in-process: the whole benchmark process, the poller included) covers T "
        "until all had succeeded; one core at that cost bounds a node's trio thread. The "
        "cores busy with other work are the machine's busy time (`/proc/stat`) less the node, "
        "the receiver and PostgreSQL: the load this benchmark did not make.",
        "",
        *verdicts(args.webhooks, variants, results),
        "",
        f"Zero duplicates and nothing lost in every burst (receiver and ledger): "
        f"{'yes' if clean else '**no**'}.",
    ]
    for variant in variants:
        if not variant.nodes and variant.latency_ms == TARGET_LATENCY_MS and results[variant]:
            lines += [
                "",
                f"Starts per second since T, {variant.label} (median run):",
                "",
                "```",
                *starts_line(results[variant]),
                "```",
            ]
    if any(not r.get("balanced", True) for r in all_runs):
        lines += ["", "In some node-process bursts the nodes had not shared the partitions by T."]
    return "\n".join(lines), clean


def save_results(args: argparse.Namespace, variants: list[Variant], results: Results) -> None:
    figures: dict[str, list[float]] = {}
    every_burst: list[float] = []  # whatever its variant: the Targets section's "every run"
    for variant in variants:
        runs = results[variant]
        suffix = f"@{variant.nodes or 1}n{variant.latency_ms:g}ms"
        for key in (
            "deliveries_per_s",
            "all_delivered_s",
            "delay_p50_s",
            "delay_p99_s",
            "peak_in_flight",
            "peak_rss_mb",
            "node_cpu_us",
            "postgres_cpu_us",
            "node_cores",
            "other_cores",
            "ceiling_per_s",
            "ratio",
        ):
            samples = [run[key] for run in runs if key in run]
            if samples:
                figures[key + suffix] = samples
        duplicates = [
            run["duplicates"] + run["receiver_duplicates"] + run["missing_keys"] for run in runs
        ]
        figures["duplicates" + suffix] = duplicates
        every_burst += duplicates
    figures["duplicates"] = every_burst
    context = {
        "webhooks": args.webhooks,
        "runs": args.runs,
        "node_runs": args.node_runs,
        "latencies_ms": args.latencies,
        "variants": [v.label for v in variants],
        "ceiling_client": CEILING_CLIENT,
        "ceiling_in_flight": CEILING_IN_FLIGHT,
        "cores": cores(),
    }
    write_results("bench_webhooks", figures, context)


# --- main ------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run; docs are not written")
    parser.add_argument("--no-docs", action="store_true", help="print only: no docs or JSON")
    parser.add_argument("--no-ceiling", action="store_true", help="skip the receiver ceiling")
    parser.add_argument("--webhooks", type=int, default=TARGET_WEBHOOKS)
    parser.add_argument("--runs", type=int, default=3, help="one-node runs per latency")
    parser.add_argument("--latencies", default="0,50,250", help="receiver latencies, ms")
    parser.add_argument("--nodes", default="2", help="node-process counts ('': none)")
    parser.add_argument("--node-runs", type=int, default=1, help="runs per node-process count")
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds after T")
    args = parser.parse_args()
    base_lead_s = 8.0
    if args.quick:
        args.webhooks, args.runs, args.latencies, args.node_runs = 2_000, 1, "50", 1
        args.timeout, base_lead_s = 30.0, 3.0
    latencies = [float(text) for text in args.latencies.split(",") if text.strip()]
    node_counts = [int(k) for k in args.nodes.split(",") if k.strip()]
    one_node = [Variant(latency) for latency in latencies]
    several = [Variant(latency, k) for k in node_counts for latency in latencies]
    variants = one_node + several
    results: Results = {v: [] for v in variants}
    ceilings: Ceilings = {}
    logs = Path(os.environ.get("CARILLON_BENCH_LOGS", "/tmp")) / f"webhooks-{os.getpid()}"
    logs.mkdir(parents=True, exist_ok=True)
    raise_fd_limit()
    started, load_at_start = time.monotonic(), os.getloadavg()
    receiver = start_receiver()
    try:
        with resolve_database() as database:
            for run_index in range(args.runs):
                # Alternate the latencies' order so that a drift weighs on each alike.
                order = one_node if run_index % 2 == 0 else one_node[::-1]
                for variant in order:
                    results[variant].append(
                        one_burst(
                            database.url,
                            args.webhooks,
                            variant,
                            receiver,
                            args.timeout,
                            base_lead_s,
                            logs,
                        )
                    )
                    if not args.no_ceiling:
                        ceilings.setdefault(variant.latency_ms, []).append(
                            receiver_ceiling(receiver, args.webhooks, variant.latency_ms)
                        )
            for _ in range(args.node_runs):
                for variant in several:
                    results[variant].append(
                        one_burst(
                            database.url,
                            args.webhooks,
                            variant,
                            receiver,
                            args.timeout,
                            base_lead_s,
                            logs,
                        )
                    )
    finally:
        receiver.stop()
    attach_ratios(variants, results, ceilings)
    text, clean = report(args, variants, results, time.monotonic() - started, load_at_start)
    print(text)
    if not (args.quick or args.no_docs):
        write_section("bench_webhooks", text)
        save_results(args, variants, results)
        write_targets()
    return 0 if clean else 1  # a missed rate target is a figure; a lost or repeated one is not


if __name__ == "__main__":
    raise SystemExit(main())
