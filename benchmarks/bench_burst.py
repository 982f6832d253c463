"""A top-of-minute burst: N executions due at the same instant, run by ``noop``.

Creates a throwaway database (``carillon_burst_<hex>``) on the resolved server, fills it with
N schedules (default 200,000) over 20 tenants, all due at the same instant T
(``benchmarks/_burst.py``: a 6-field daily expression whose ``next_run_at`` is T, far enough
ahead for creating and loading them), with the ``noop`` task type (default retry policy), and
runs it in several variants, each on its own database:

* **one node in-process** (PostgresLedger on the bridge, real clock, default ``NodeConfig``
  except its id, the log level, the worker count and the dispatch pacing), once per worker
  count with smoothing off (``--workers``, default 32 and 128); a second thread polls the
  database with plain asyncpg every 0.5 s until all N have succeeded or the timeout runs
  out, and samples the process's RSS;
* **paced** (``--rate`` R, ``--window`` W; 0: none): the first worker count with the
  dispatcher's rate R smoothed over W, equal weights;
* **paced, weighted**: the same, the tenants' weights stored in the ledger (``WEIGHTS``:
  tenants 0-4 weight 4, 5-9 weight 2, 10-19 weight 1); the dispatcher reads them there;
* **K nodes** (``--nodes``, default 2 and 3; empty: none): K ``carillon run`` processes with
  default settings sharing the database (``benchmarks/_nodes.py`` ``carillon_burst``, as
  ``bench_peer.py`` runs them); each process's peak RSS. The machine's 2 cores are shared
  with PostgreSQL, so this row shows what extra nodes cost there, not how Carillon scales.

Reported per variant, from the ledger (``_burst.ledger_figures``): lead before T, T until
all succeeded, executions/s end to end, start delay p50/p99/max, the share started within
60 s (the SLO figure), Jain's index of the tenants' mean delays, the contended period (T until
the first tenant's last start) with each tenant's share of its starts and Jain's index of
share / weight share, peak RSS, duplicates (must be 0); the starts per second since T. For
the one-node variants that are not paced, the CPU each execution cost from T until all had
succeeded, in this process and in PostgreSQL (``benchmarks/_cpu.py``), and the rate the
machine's cores would allow at that cost. For every variant whose executions all succeeded,
the WAL the server wrote per execution over the same window (``pg_current_wal_lsn()`` at T
and when the poller saw them all, ``_burst.WAL_POSITION``): the server's whole WAL, so
another database's writes meanwhile count too.

In the same run, after the first variant, the raw ceiling for the same ledger writes: plain
asyncpg on a uvloop loop (no trio, no bridge, no engine), the executions table emptied and
vacuumed, N rows in sequential batches of 5,000: an ``unnest`` insert of the executions, then
an ``unnest`` update claiming them (queued -> running), then one completing them (running ->
succeeded); an untimed ``ANALYZE executions`` before each update phase gives the planner the
table as it is (``benchmarks/_ceiling.py``). Its rows/s for the whole cycle is compared with
the engine's end-to-end rate (the engine plans before T, so claim + complete alone is given
too). Then two bounds from either side (``benchmarks/_ceiling.py``): the same-design ceiling,
the engine's own claim and complete statements in a bare loop at its largest batches (after T
against the engine's after T), and the physical reference, the same rows written once by
binary COPY into a table with no index. Each of these reports its WAL per row as well (its
timed loops only).

Targets: issue #5, >= 10,000 executions/s end to end with zero duplicates; issue #8, >= 20,000
executions/s end to end (32 workers, smoothing off), >= 50% of the raw ceiling measured in the
same run, every execution durable before T -- on a 2-core machine with PostgreSQL on it.
A full run writes its section of docs/benchmarks.md, plots under docs/img/ (``bench-burst-*``),
its headline figures to docs/bench-results/bench_burst.json and the Targets section;
``--quick`` and ``--no-docs`` (``make bench-profile``) write none of these.

Usage: python benchmarks/bench_burst.py [--quick] [--no-docs] [--no-ceiling] [--schedules N]
       [--runs K] [--workers 32,128] [--rate R] [--window W] [--nodes 2,3] [--timeout S]
"""

from __future__ import annotations

import argparse
import math
import os
import random
import sys
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

import trio
import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import _plots
from benchmarks._burst import (
    SLO_S,
    TENANTS,
    admin,
    create_schedules,
    fresh_database,
    ledger_figures,
    poll_until_succeeded,
    tenant_id,
)
from benchmarks._ceiling import (
    CEILING_BATCH,
    SAME_DESIGN_CLAIM_BATCH,
    SAME_DESIGN_COMPLETE_BATCH,
    ceiling,
    physical_reference,
    same_design_ceiling,
)
from benchmarks._cpu import CpuSample, cores, cpu_figures
from benchmarks._nodes import carillon_burst
from benchmarks._report import (
    image_link,
    machine,
    revision,
    summary,
    write_results,
    write_section,
    write_targets,
)
from engine.clock import SystemClock
from engine.config import WORKERS_DEFAULT, LogLevel, NodeConfig
from engine.ledger.database import resolve_database
from engine.ledger.postgres import PARTITIONS_DEFAULT, open_postgres_ledger
from engine.node import Node

TARGET_PER_S: Final = 10_000.0
"""Issue #5's target, kept beside issue #8's (``_report.TARGETS``)."""
TARGET_8_PER_S: Final = 20_000.0
TARGET_8_CEILING: Final = 0.5
WEIGHT_CLASSES: Final = ((range(5), 4), (range(5, 10), 2), (range(10, TENANTS), 1))
"""The weighted variant's tenants, by index, and their weights."""
WEIGHTS: Final = {tenant_id(i): weight for tenants, weight in WEIGHT_CLASSES for i in tenants}
FLAME: Final = _plots.IMG / "bench-burst-flame.svg"


@dataclass(frozen=True)
class Variant:
    """One column of the report: a worker count, a dispatch pacing, weights, nodes."""

    workers: int
    rate_per_s: float = 0.0
    window_s: float = 0.0
    weighted: bool = False
    nodes: int = 0
    """0: one node in this process; K > 0: K ``carillon run`` processes, default settings."""

    @property
    def label(self) -> str:
        if self.nodes:
            return f"{self.nodes} nodes x {self.workers} workers, smoothing off"
        if not self.rate_per_s:
            return f"{self.workers} workers, smoothing off"
        pacing = f"{self.workers} workers, {self.rate_per_s:,.0f}/s over {self.window_s:g} s"
        return pacing + (", weights 4/2/1" if self.weighted else "")


def variants_of(args: argparse.Namespace) -> list[Variant]:
    variants = [Variant(int(w)) for w in args.workers.split(",")]
    if args.rate:
        paced = Variant(variants[0].workers, args.rate, args.window)
        variants += [paced, Variant(paced.workers, paced.rate_per_s, paced.window_s, True)]
    variants += [Variant(WORKERS_DEFAULT, nodes=int(k)) for k in args.nodes.split(",") if k]
    return variants


# --- the engine ------------------------------------------------------------------------------


async def engine_phase(
    url: str, n: int, burst_at: datetime, variant: Variant, timeout_s: float
) -> dict[str, Any]:
    config = NodeConfig(
        node_id=f"bench-burst-{os.getpid()}",
        log_level=LogLevel.WARNING,
        workers=variant.workers,
        dispatch_rate_per_s=variant.rate_per_s,
        dispatch_smoothing_window_s=variant.window_s,
        http="",
    )
    async with open_postgres_ledger(url) as ledger:
        node = Node(config, ledger, SystemClock(), random.Random(7))
        async with trio.open_nursery() as nursery:
            await nursery.start(node.run)
            await trio.sleep(max((burst_at - datetime.now(UTC)).total_seconds(), 0.0))
            before = CpuSample.now()
            polled = await trio.to_thread.run_sync(
                poll_until_succeeded, url, n, burst_at, timeout_s
            )
            after = CpuSample.now()
            nursery.cancel_scope.cancel()
    if variant.rate_per_s:
        return polled  # paced by design: its CPU per execution says nothing of a bound
    return polled | cpu_figures(before, after, n)


# --- one run ---------------------------------------------------------------------------------


def one_variant(
    server_url: str, n: int, variant: Variant, timeout_s: float, with_ceiling: bool, logs: Path
) -> dict[str, Any]:
    if variant.nodes:
        result = carillon_burst(
            server_url,
            n,
            variant.nodes,
            timeout_s,
            logs,
            prefix="carillon_burst_",
            settle_s=SETTLE_PER_EXTRA_NODE_S * (variant.nodes - 1) * min(n / 200_000, 1.0),
        )
    else:
        weights = WEIGHTS if variant.weighted else None
        name, url = fresh_database(server_url, "carillon_burst_")
        try:
            burst_at = trio.run(create_schedules, url, n, weights)
            result = trio.run(engine_phase, url, n, burst_at, variant, timeout_s)
            result |= uvloop.run(ledger_figures(url, n, burst_at, timeout_s, weights))
            if with_ceiling:
                result |= uvloop.run(ceiling(url, n, burst_at))
                result |= uvloop.run(same_design_ceiling(url, n, burst_at))
                result |= uvloop.run(physical_reference(url, n, burst_at))
                rate = result["executions_per_s"]
                result["ratio"] = rate / result["ceiling_cycle_per_s"]
                result["same_design_ratio"] = rate / result["same_design_per_s"]
                result["physical_ratio"] = rate / result["physical_per_s"]
        finally:
            admin(server_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    print(
        f"  {variant.label}: {result['executions_per_s']:,.0f} executions/s, "
        f"all succeeded after {result['all_succeeded_s']:.2f} s, lead {result['lead_s']:.2f} s",
        file=sys.stderr,
    )
    return result


# --- the report ------------------------------------------------------------------------------

Results = dict[Variant, list[dict[str, Any]]]


def _spread(samples: list[float], digits: int = 2) -> str:
    median, low, high = summary(samples)
    if low == high:
        return f"{median:,.{digits}f}".replace("inf", "timeout")
    return f"{median:,.{digits}f} ({low:,.{digits}f}-{high:,.{digits}f})".replace("inf", "timeout")


SETTLE_PER_EXTRA_NODE_S: Final = 30.0
"""How much later T is set, per node process beyond the first, at 200,000 schedules (pro rata
below): K processes start one after the other, so the partitions move -- each move a
hand-back and a load -- before they settle. A production cluster is running long before a
burst; T must not fall inside its start-up."""

ROWS: Final = (
    ("lead before T (s)", "lead_s", 2),
    ("nodes: partitions shared, lead before T (s)", "balanced_lead_s", 1),
    ("T until all succeeded (s)", "all_succeeded_s", 2),
    ("share succeeded (by the timeout)", "succeeded_share", 4),
    ("executions/s end to end", "executions_per_s", 0),
    ("start delay p50 (s)", "delay_p50_s", 2),
    ("start delay p99 (s)", "delay_p99_s", 2),
    ("start delay max (s)", "delay_max_s", 2),
    (f"share started within {SLO_S:g} s", "within_slo", 4),
    ("Jain's index of tenant mean delays (equal weights)", "jain", 4),
    ("contended period: T until the first tenant's last start (s)", "contended_s", 2),
    ("Jain's index of start share / weight share, contended period", "share_jain", 4),
    ("peak RSS (MB)", "peak_rss_mb", 0),
    ("CPU per execution after T, node process (µs)", "node_cpu_us", 0),
    ("CPU per execution after T, PostgreSQL (µs)", "postgres_cpu_us", 0),
    ("executions/s the cores allow at that CPU cost", "cpu_bound_per_s", 0),
    ("WAL per execution after T, the whole server (bytes)", "wal_per_execution_b", 0),
    ("duplicates", "duplicates", 0),
    ("raw ceiling rows/s, insert+claim+complete", "ceiling_cycle_per_s", 0),
    ("raw ceiling rows/s, claim+complete", "ceiling_claim_complete_per_s", 0),
    ("raw ceiling WAL per row, insert+claim+complete (bytes)", "ceiling_cycle_wal_b", 0),
    ("raw ceiling WAL per row, claim+complete (bytes)", "ceiling_claim_complete_wal_b", 0),
    ("engine / ceiling (cycle)", "ratio", 2),
    (
        "same-design ceiling rows/s, the engine's claim+complete in a bare loop",
        "same_design_per_s",
        0,
    ),
    ("engine / same-design ceiling (after T)", "same_design_ratio", 2),
    ("same-design ceiling WAL per row (bytes)", "same_design_wal_b", 0),
    ("physical reference rows/s, binary COPY into an unindexed table", "physical_per_s", 0),
    ("engine / physical reference", "physical_ratio", 3),
    ("physical reference WAL per row (bytes)", "physical_wal_b", 0),
)


def _rss_per_process(runs: list[dict[str, Any]]) -> str:
    per_process = zip(*(run["rss_mb"] for run in runs), strict=True)
    return " / ".join(f"{summary(list(p))[0]:.0f}" for p in per_process)


def figure_table(variants: list[Variant], results: Results) -> str:
    lines = [
        "| figure | " + " | ".join(v.label for v in variants) + " |",
        "|---|" + "---:|" * len(variants),
    ]
    for title, key, digits in ROWS:
        cells = []
        for variant in variants:
            samples = [run[key] for run in results[variant] if key in run]
            if key == "jain" and variant.weighted:
                samples = []  # unequal weights mean unequal delays by design
            cells.append(_spread(samples, digits) if samples else "")
        if any(cells):
            lines.append(f"| {title} | " + " | ".join(cells) + " |")
    if any(v.nodes for v in variants):
        cells = [_rss_per_process(results[v]) if v.nodes else "" for v in variants]
        lines.append("| peak RSS per node process (MB) | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def tenant_line(runs: list[dict[str, Any]]) -> str:
    """The median over the runs of each tenant's p50 start delay, as min / median / max."""
    tenants = sorted(runs[0]["tenant_p50_s"])
    medians = [summary([run["tenant_p50_s"].get(t, 0.0) for run in runs])[0] for t in tenants]
    low, mid, high = min(medians), summary(medians)[0], max(medians)
    return (
        f"per-tenant p50 start delay over {len(tenants)} tenants {low:.2f} / {mid:.2f} / "
        f"{high:.2f} s (min / median / max)"
    )


def starts_histogram(run: dict[str, Any], per_line: int = 10) -> list[str]:
    """Starts per second since T (one run), ``per_line`` seconds to a line."""
    counts = dict(run["starts_per_s"])
    if not counts:
        return ["(no starts)"]
    first, last = min(counts), max(counts)
    lines = []
    for start in range(first, last + 1, per_line):
        cells = [f"{counts.get(s, 0):>6,}" for s in range(start, min(start + per_line, last + 1))]
        lines.append(f"T+{start:>3}s: " + " ".join(cells))
    return lines


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run with the median executions/s (the upper one of an even count)."""
    return sorted(runs, key=lambda run: run["executions_per_s"])[len(runs) // 2]


def class_shares(runs: list[dict[str, Any]]) -> list[tuple[str, float, float]]:
    """Per weight class: its label, the median over the runs of its share of the contended
    starts, and its share of the total weight."""
    total_weight = sum(WEIGHTS.values())
    classes = []
    for tenants, weight in WEIGHT_CLASSES:
        ids = [tenant_id(i) for i in tenants]
        shares = [sum(run.get("tenant_share", {}).get(t, 0.0) for t in ids) for run in runs]
        label = f"weight {weight} (tenants {tenants.start}-{tenants.stop - 1})"
        classes.append((label, summary(shares)[0], weight * len(ids) / total_weight))
    return classes


def weights_table(variant: Variant, runs: list[dict[str, Any]]) -> list[str]:
    lines = [
        f"Weighted tenants ({variant.label}): each class's share of the executions started in "
        "the contended period (T until the first tenant's last start: every tenant still had "
        "work waiting), median over the runs, beside its share of the total weight:",
        "",
        "| weight class | share of weight | share of starts | starts / weight |",
        "|---|---:|---:|---:|",
    ]
    for label, share, weight_share in class_shares(runs):
        lines.append(f"| {label} | {weight_share:.3f} | {share:.3f} | {share / weight_share:.2f} |")
    jains = [run["share_jain"] for run in runs if "share_jain" in run]
    if jains:
        lines += [
            "",
            f"Jain's index across the {TENANTS} tenants of (share of starts / share of weight): "
            f"{_spread(jains, 4)} (1.0: every tenant got exactly its weight's share).",
        ]
    return lines


def verdicts(args: argparse.Namespace, variants: list[Variant], results: Results) -> list[str]:
    """The targets of issues #5 and #8, met or not, in this run."""
    base = variants[0]
    off = [v for v in variants if not v.rate_per_s and not v.nodes]
    rate_met = all(
        summary([r["executions_per_s"] for r in results[v]])[0] >= TARGET_PER_S for v in off
    )
    clean = all(r["duplicates"] == 0 and r["rows"] == args.schedules for r in _all(results))
    leads = [r["lead_s"] for r in _all(results)]
    base_rate = summary([r["executions_per_s"] for r in results[base]])[0]
    ratios = [r["ratio"] for r in results[base] if "ratio" in r]

    def met(ok: bool) -> str:
        return "met" if ok else "**not met**"

    lines = [
        f"Target (issue #5; >= {TARGET_PER_S:,.0f} executions/s end to end with smoothing off, "
        f"zero duplicates): {met(rate_met and clean)}.",
        "",
        f"Targets (issue #8), this run: >= {TARGET_8_PER_S:,.0f} executions/s end to end "
        f"({base.label}): {met(base_rate >= TARGET_8_PER_S)} ({base_rate:,.0f}/s, median); ",
    ]
    if ratios:
        ratio = summary(ratios)[0]
        lines[-1] += (
            f">= {TARGET_8_CEILING:.0%} of the raw ceiling (cycle) measured in the same run: "
            f"{met(ratio >= TARGET_8_CEILING)} ({ratio:.0%}, median); "
        )
    lines[-1] += (
        f"zero duplicates in every variant and run: {met(clean)}; every execution durable "
        f"before T (lead > 0 in every run): {met(min(leads) > 0)} (least {min(leads):.2f} s)."
    )
    return lines


def cpu_note(variant: Variant, runs: list[dict[str, Any]]) -> list[str]:
    """What the cores allow at the CPU each execution cost in ``variant``, against the target:
    the bound no scheduling of that work can beat on this machine."""
    runs = [run for run in runs if "cpu_bound_per_s" in run]
    if not runs:
        return []
    node = summary([run["node_cpu_us"] for run in runs])[0]
    server = summary([run["postgres_cpu_us"] for run in runs])[0]
    bound = summary([run["cpu_bound_per_s"] for run in runs])[0]
    rate = summary([run["executions_per_s"] for run in runs])[0]
    budget_us = cores() * 1e6 / TARGET_8_PER_S
    return [
        f"CPU budget ({variant.label}, median over the runs): from T until all had succeeded, "
        f"each execution cost {node:.0f} µs of CPU in the node process (its trio thread, its "
        f"database thread and the benchmark's poller) and {server:.0f} µs in PostgreSQL (every "
        f"`postgres` process). On this machine's {cores()} cores no scheduling of that work "
        f"can run more than {bound:,.0f} executions/s; the engine ran {rate:,.0f}/s, "
        f"{rate / bound:.0%} of that bound. {TARGET_8_PER_S:,.0f}/s on {cores()} cores leaves "
        f"{budget_us:.0f} µs of CPU per execution for the node and the database together.",
        "",
    ]


def nodes_note(variants: list[Variant], results: Results) -> str:
    late = sum(not r["balanced"] for v in variants if v.nodes for r in results[v])
    note = (
        "The node columns: K `carillon run` processes with default settings "
        f"({WORKERS_DEFAULT} workers each, smoothing off, no HTTP API) sharing the database, "
        "started once the schedules exist, with T set "
        f"{SETTLE_PER_EXTRA_NODE_S:g} s later per extra process (at 200,000 schedules) so "
        "that they have shared the partitions by T, as a running cluster has (each process's "
        "start moves partitions, and each move is a hand-back and a load); peak RSS per "
        "process. "
        "**The machine has 2 cores, "
        "shared with PostgreSQL: the extra nodes compete for the same CPUs, so these columns "
        "show what running more nodes costs here, not how Carillon scales out.**"
    )
    if late:
        note += f" In {late} of these bursts the nodes had not shared the partitions by T."
    return note


def _all(results: Results) -> list[dict[str, Any]]:
    return [run for runs in results.values() for run in runs]


def report(
    args: argparse.Namespace, variants: list[Variant], results: Results, images: dict[str, Path]
) -> tuple[str, bool]:
    base = variants[0]
    clean = all(r["duplicates"] == 0 and r["rows"] == args.schedules for r in _all(results))
    lines = [
        "## Burst execution (`benchmarks/bench_burst.py`)",
        "",
        f"Machine: {machine()}; revision {revision()}; {args.runs} runs; {PARTITIONS_DEFAULT} "
        f"partitions, {args.schedules:,} `noop` schedules over {TENANTS} tenants all due at the "
        "same instant T, a fresh database per variant and run; one node in-process with default "
        "settings but the worker count and the dispatch pacing, unless the column says nodes; "
        "PostgreSQL on the same machine. Median (min-max) over the runs.",
        "",
        figure_table(variants, results),
        "",
        *image_link(images.get("rate"), "Starts per second since T, each variant (median run)"),
        "Fairness, equal weights: "
        + "; ".join(f"{v.label}: {tenant_line(results[v])}" for v in variants if not v.weighted)
        + ".",
        "",
        *image_link(images.get("tenants"), "Start delay per tenant, paced, equal weights"),
    ]
    for variant in variants:
        if variant.weighted:
            lines += [*weights_table(variant, results[variant]), ""]
            lines += image_link(images.get("weights"), "Share of starts vs share of weight")
    if any(v.nodes for v in variants):
        lines += [nodes_note(variants, results), ""]
    lines += [
        *verdicts(args, variants, results),
        "",
        *cpu_note(base, results[base]),
        f"The raw ceiling (plain asyncpg, uvloop, sequential batches of {CEILING_BATCH:,}) runs "
        f"after the engine in the same run, on the {base.label} database emptied (TRUNCATE) and "
        "vacuumed. `ANALYZE executions` runs, untimed, before its claim and before its complete "
        "phase, so that the planner sees the table as it is (autovacuum is off on this server: "
        "without it, the statistics of the empty table apply). With them, the first five "
        "batches of each phase still hash-join against all N rows (PostgreSQL's own cost "
        "estimate, custom plans); the later ones probe the primary key (`benchmarks/_ceiling.py`).",
        "",
        "Two more bounds, in the same run and on the same database: the **same-design ceiling** "
        "runs the engine's own claim and complete statements (`EXECUTIONS_CLAIM`, "
        "`EXECUTIONS_COMPLETE`, fenced, parameters encoded as the ledger encodes them) in a bare "
        f"loop on one connection, claims of {SAME_DESIGN_CLAIM_BATCH:,} and completions of "
        f"{SAME_DESIGN_COMPLETE_BATCH:,} (the dispatcher's and the completion writer's largest "
        "batches), after the N rows were inserted untimed: the most this write design allows "
        "after T, compared with the engine's rate after T. The **physical reference** writes "
        f"the same N rows once, by binary COPY in batches of {CEILING_BATCH:,}, into a table "
        "shaped like `executions` with no index and no key: what this machine's PostgreSQL "
        "stores per second with none of our design in the way.",
        "",
        "WAL per execution (or per row) is the difference of `pg_current_wal_lsn()` over the "
        "window measured (after T for the engine, from T until the poller saw every execution "
        "succeed; the timed loops for the references) divided by N. It is the server's WAL, "
        "not the database's: on a shared server another session's writes meanwhile count too, "
        "so read it as an upper bound, and the lowest run as the closest.",
    ]
    if FLAME.exists():
        lines += [
            "",
            "Flame graph of a one-node burst (`make bench-profile`, py-spy, the whole run):",
        ]
        lines += ["", *image_link(FLAME, "py-spy flame graph of the burst")]
    for variant in variants:
        if variant.rate_per_s and not variant.weighted:
            lines += [
                "",
                f"Starts per second since T, {variant.label} (run 1):",
                "",
                "```",
                *starts_histogram(results[variant][0]),
                "```",
            ]
    return "\n".join(lines), clean


# --- plots, results, main ----------------------------------------------------------------------


def draw_plots(variants: list[Variant], results: Results) -> dict[str, Path]:
    series = {v.label: median_run(results[v])["starts_per_s"] for v in variants}
    drawn = {"rate": _plots.draw(_plots.burst_rate, "bench-burst-rate.png", series)}
    paced = [v for v in variants if v.rate_per_s and not v.weighted]
    if paced:
        quantiles = median_run(results[paced[0]])["tenant_delay_q"]
        title = f"Start delay per tenant, {paced[0].label} (median run)"
        drawn["tenants"] = _plots.draw(
            _plots.burst_tenants, "bench-burst-tenants.png", quantiles, title
        )
    weighted = [v for v in variants if v.weighted]
    if weighted:
        classes = class_shares(results[weighted[0]])
        drawn["weights"] = _plots.draw(_plots.burst_weights, "bench-burst-weights.png", classes)
    return {name: path for name, path in drawn.items() if path is not None}


def save_results(args: argparse.Namespace, variants: list[Variant], results: Results) -> None:
    base = results[variants[0]]
    per_run = list(zip(*(results[v] for v in variants), strict=True))
    figures = {
        "executions_per_s": [r["executions_per_s"] for r in base],
        "all_succeeded_s": [r["all_succeeded_s"] for r in base],
        "delay_p99_s": [r["delay_p99_s"] for r in base],
        "ceiling_cycle_per_s": [r["ceiling_cycle_per_s"] for r in base if "ratio" in r],
        "ceiling_ratio": [r["ratio"] for r in base if "ratio" in r],
        "same_design_per_s": [r["same_design_per_s"] for r in base if "ratio" in r],
        "same_design_ratio": [r["same_design_ratio"] for r in base if "ratio" in r],
        "physical_per_s": [r["physical_per_s"] for r in base if "ratio" in r],
        "physical_ratio": [r["physical_ratio"] for r in base if "ratio" in r],
        "wal_per_execution_b": [
            r["wal_per_execution_b"] for r in base if "wal_per_execution_b" in r
        ],
        "same_design_wal_b": [r["same_design_wal_b"] for r in base if "ratio" in r],
        "duplicates": [sum(r["duplicates"] for r in run) for run in per_run],
        "lead_s": [min(r["lead_s"] for r in run) for run in per_run],
    }
    for variant in variants:
        if variant.weighted:
            figures["weighted_share_jain"] = [
                r.get("share_jain", math.nan) for r in results[variant]
            ]
    context = {
        "schedules": args.schedules,
        "runs": args.runs,
        "base_variant": variants[0].label,
        "variants": [v.label for v in variants],
    }
    write_results("bench_burst", figures, context)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run; docs are not written")
    parser.add_argument(
        "--no-docs", action="store_true", help="print only: no docs, plots or results JSON"
    )
    parser.add_argument("--no-ceiling", action="store_true", help="skip the raw ceiling")
    parser.add_argument("--schedules", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--workers", default="32,128", help="comma-separated worker counts")
    parser.add_argument("--rate", type=float, default=5_000.0, help="paced rows (0: none)")
    parser.add_argument("--window", type=float, default=10.0, help="smoothing window, s")
    parser.add_argument("--nodes", default="2,3", help="node-process counts ('': none)")
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds after T")
    args = parser.parse_args()
    if args.quick:
        args.schedules, args.runs, args.workers, args.timeout = 2_000, 1, "32", 30.0
        args.rate, args.window, args.nodes = 2_000.0, 1.0, "2"
    variants = variants_of(args)
    results: Results = {v: [] for v in variants}
    logs = Path(os.environ.get("CARILLON_BENCH_LOGS", "/tmp")) / f"burst-{os.getpid()}"
    logs.mkdir(parents=True, exist_ok=True)
    with resolve_database() as database:
        for _ in range(args.runs):
            for index, variant in enumerate(variants):
                with_ceiling = index == 0 and not args.no_ceiling
                results[variant].append(
                    one_variant(
                        database.url, args.schedules, variant, args.timeout, with_ceiling, logs
                    )
                )
    full = not (args.quick or args.no_docs)
    images = draw_plots(variants, results) if full else {}
    text, clean = report(args, variants, results, images)
    print(text)
    if full:
        write_section("bench_burst", text)
        save_results(args, variants, results)
        write_targets()
    return 0 if clean else 1  # a missed rate target is a figure; a lost or repeated run is not


if __name__ == "__main__":
    raise SystemExit(main())
