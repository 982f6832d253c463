"""One node, a million schedules: cold load, memory per schedule, steady CPU and planner lag.

Creates a throwaway database ``carillon_scale_<hex>`` on the resolved server (never touching
other data; dropped afterwards), fills it with N schedules over 50 tenants (mixed ``H``
expressions in four zones, spread over the hour) plus, optionally, M schedules all due at
the same instant T, starts one real node in a child process (PostgresLedger on the
bridge, 64 partitions) and reports:

* create rate: schedules written per second of wall time, by ``CREATORS`` child processes
  through the ledger's batch create (``schedules_create``, 10,000 a call);
* cold load: node start until every planner holds its partition's schedules;
* memory: RSS before the node starts, once loaded, and at the end; bytes per schedule from
  the RSS growth over the load, and the planners' own structures (entries, plan heap)
  measured by a deep ``sys.getsizeof`` of ``SIZE_SAMPLE_PARTITIONS`` partitions, scaled to
  N -- an estimate;
* the burst (``--burst``, 0 for none): how long planning the M executions took and how long
  before T the last was durable;
* steady state, after the load and the burst (if any) have run: CPU of the node's process,
  executions planned per second, their start delay p99 (the node runs ``STARTS_SETTLE_S``
  past the window so that its last fires can start), and each partition's planner lag (the
  ``carillon_planner_lag_seconds`` gauges, computed by :func:`engine.node.partition_gauges`)
  sampled every second: p50, p99 and max over partitions x seconds.

Every run uses fresh processes: ``CREATORS`` children write the schedules, then one new child
runs the node, so its RSS is the node's alone -- not the leftovers of building N schedules or
of an earlier run (freed memory stays with a Python process and would be reused).

Targets (issue #8), for N = 1,000,000 on a 2-core machine with PostgreSQL on it: RSS with
every schedule loaded <= 400 MB, cold load <= 15 s. Several sizes run smallest first
(by default ``--schedules 1000000 5000000``: the issue asks for 5M "if memory allows"), the
burst at the smallest only; each runs only if the memory it would need, estimated from
the bytes per schedule measured at a smaller size of the same invocation (else
``BYTES_PER_SCHEDULE_PRIOR``), fits in MemAvailable with headroom; otherwise the report says
it was skipped and why.

A full run also draws docs/img/bench-scale.png (RSS and cold load per size), writes
docs/bench-results/bench_scale.json and rebuilds the Targets section of docs/benchmarks.md.

Usage: python benchmarks/bench_scale.py [--quick] [--schedules N [N ...]] [--burst M]
       [--runs K] [--steady S] [--partitions P]
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import random
import secrets
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from datetime import datetime, timedelta
from multiprocessing import get_context
from pathlib import Path
from typing import Final

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import _plots
from benchmarks._cpu import cpu_s
from benchmarks._report import (
    image_link,
    machine,
    revision,
    summary,
    write_results,
    write_section,
    write_targets,
)
from benchmarks._scale import (
    MB,
    STARTS_SETTLE_S,
    TENANTS,
    database_figures,
    make_schedules,
    mem_available_mb,
    memory_needed_mb,
    planner_bytes_per_schedule,
    quantile,
    rss_mb,
    rss_peak_mb,
    wait_burst_done,
)
from engine.clock import SystemClock
from engine.config import LogLevel, NodeConfig
from engine.core.timetable import TimetableCache
from engine.ledger.database import resolve_database, url_with_database
from engine.ledger.params import SchedulesCreate, TaskTypesPut
from engine.ledger.postgres import POOL_MAX_DEFAULT, migrate_database, open_postgres_ledger
from engine.model import HandlerKind, TaskType
from engine.node import Node, partition_gauges

TARGET_SCHEDULES: Final = 1_000_000
SIZES_DEFAULT: Final = (TARGET_SCHEDULES, 5_000_000)
LOAD_TARGET_S: Final = 15.0
RSS_TARGET_MB: Final = 400.0
DATABASE_PREFIX: Final = "carillon_scale_"
CREATORS: Final = 2
"""Child processes writing schedules (one per core of the reference machine)."""
CREATE_BATCH: Final = 10_000
LAG_SAMPLE_S: Final = 1.0
BURST_MARGIN_S: Final = 10.0
CREATE_RATE_MIN_PER_S: Final = 10_000.0
LOAD_RATE_MIN_PER_S: Final = 10_000.0
PLAN_RATE_MIN_PER_S: Final = 10_000.0
"""Pessimistic rates that place T late enough for the node to load and plan the burst."""
BURST_DRAIN_S_MAX: Final = 300.0
"""The most the steady window waits for the burst to finish running."""
BYTES_PER_SCHEDULE_PRIOR: Final = 400.0
"""RSS growth per schedule at 1,000,000 (docs/benchmarks.md); used for the memory check of a
size when no smaller size ran in the same invocation."""


async def _admin(url: str, statement: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(url)
    try:
        await conn.execute(statement)
    finally:
        await conn.close()


async def _create(url: str, first: int, stop: int, burst: int, burst_at: datetime | None) -> None:
    async with open_postgres_ledger(url, pool_max=2) as ledger:
        now = await ledger.database_now()
        cache = TimetableCache()
        for n in range(first, stop, CREATE_BATCH):
            batch = make_schedules(n, min(stop, n + CREATE_BATCH), burst, burst_at, now, cache)
            await ledger.schedules_create(SchedulesCreate(batch))


def create_range(url: str, first: int, stop: int, burst: int, burst_at: datetime | None) -> None:
    """Child process: create schedules number ``first`` .. ``stop - 1``."""
    trio.run(_create, url, first, stop, burst, burst_at)


def create_all(
    pool: ProcessPoolExecutor,
    url: str,
    first: int,
    stop: int,
    burst: int,
    burst_at: datetime | None,
) -> float:
    """Create schedules ``first`` .. ``stop - 1`` split over the creators; wall seconds."""
    if stop <= first:
        return 0.0
    started = time.perf_counter()
    step = -(-(stop - first) // CREATORS)
    futures = [
        pool.submit(create_range, url, lo, min(stop, lo + step), burst, burst_at)
        for lo in range(first, stop, step)
    ]
    for future in futures:
        future.result()
    return time.perf_counter() - started


async def sample_steady(node: Node, steady_s: float) -> dict[str, float]:
    """CPU and every partition's planner lag, sampled each LAG_SAMPLE_S for ``steady_s``."""
    lags: list[float] = []
    cpu_before, wall_before = cpu_s(), time.perf_counter()
    deadline = trio.current_time() + steady_s
    tick = trio.current_time()
    while tick < deadline:
        partitions = partition_gauges(node.planners.statistics().planners, node.clock_monitor.now())
        lags.extend(p.planner_lag_s for p in partitions)
        tick += LAG_SAMPLE_S
        await trio.sleep_until(min(tick, deadline))
    return {
        "steady_cpu_pct": 100 * (cpu_s() - cpu_before) / (time.perf_counter() - wall_before),
        "lag_p50_s": quantile(lags, 0.5),
        "lag_p99_s": quantile(lags, 0.99),
        "lag_max_s": max(lags, default=float("nan")),
        "lag_samples": float(len(lags)),
    }


async def run_node(
    url: str, ledger_total: int, burst_at: datetime | None, steady_s: float
) -> dict[str, float]:
    """Start the node, wait for the load, the burst and the steady window; its figures."""
    # The pool a `carillon run` node opens (POOL_MAX_DEFAULT), so the figures are a default
    # node's (docs/benchmarks.md, "Cold load of 1,000,000 schedules and the ledger pool", on
    # why it matters).
    async with open_postgres_ledger(url) as ledger:
        config = NodeConfig(node_id=f"scale-{os.getpid()}", log_level=LogLevel.WARNING, http="")
        node = Node(config, ledger, SystemClock(), random.Random(7))
        partitions = (await ledger.cluster_get()).partition_count
        results = {"rss_before_mb": rss_mb()}
        async with trio.open_nursery() as nursery:
            started, cpu_before = time.perf_counter(), cpu_s()
            await nursery.start(node.run)
            while (
                sum(p.schedules for p in node.planners.statistics().planners) < ledger_total
                or len(node.table) < partitions
            ):
                await trio.sleep(0.05)
            results["load_s"] = time.perf_counter() - started
            results["load_cpu_s"] = cpu_s() - cpu_before
            results["rss_loaded_mb"] = rss_mb()
            per_partition = [p.schedules for p in node.planners.statistics().planners]
            results["partition_min"] = float(min(per_partition))
            results["partition_max"] = float(max(per_partition))
            results["heap_bytes_per_schedule"] = planner_bytes_per_schedule(node)
            if burst_at is not None:
                wait = (burst_at - await ledger.database_now()).total_seconds()
                await trio.sleep(max(wait, 0))
                await trio.to_thread.run_sync(wait_burst_done, url, burst_at, BURST_DRAIN_S_MAX)
            steady_from = await ledger.database_now()
            results.update(await sample_steady(node, steady_s))
            steady_to = await ledger.database_now()
            results["rss_end_mb"] = rss_mb()
            results["rss_peak_mb"] = rss_peak_mb()
            await trio.sleep(STARTS_SETTLE_S)
            stopped_at = await ledger.database_now()
            nursery.cancel_scope.cancel()
    figures = await trio.to_thread.run_sync(
        database_figures, url, burst_at, steady_from, steady_to, stopped_at
    )
    return results | figures


def node_phase(
    url: str, ledger_total: int, burst_at: datetime | None, steady_s: float
) -> dict[str, float]:
    """Child process, a fresh one per run: :func:`run_node`."""
    return trio.run(run_node, url, ledger_total, burst_at, steady_s)


def one_run(
    server_url: str, total: int, burst: int, steady_s: float, partitions: int
) -> dict[str, float]:
    """Create a database, fill it, measure a node on it, drop it."""
    name = f"{DATABASE_PREFIX}{secrets.token_hex(4)}"
    asyncio.run(_admin(server_url, f'CREATE DATABASE "{name}"'))
    url = url_with_database(server_url, name)
    try:
        trio.run(_prepare, url, partitions)
        with ProcessPoolExecutor(CREATORS, mp_context=get_context("spawn")) as pool:
            spread_s = create_all(pool, url, burst, total, burst, None)
            spread = total - burst
            create_rate = spread / spread_s if spread >= CREATE_BATCH else CREATE_RATE_MIN_PER_S
            burst_at = None
            burst_s = 0.0
            if burst:
                lead_s = (
                    BURST_MARGIN_S
                    + burst / create_rate
                    + total / LOAD_RATE_MIN_PER_S
                    + burst / PLAN_RATE_MIN_PER_S
                )
                now = trio.run(_database_now, url)
                burst_at = (now + timedelta(seconds=lead_s)).replace(microsecond=0)
                burst_s = create_all(pool, url, 0, burst, burst, burst_at)
        with ProcessPoolExecutor(1, mp_context=get_context("spawn")) as node_process:
            results = node_process.submit(node_phase, url, total, burst_at, steady_s).result()
        results["create_rows_per_s"] = total / (spread_s + burst_s)
        growth_mb = results["rss_loaded_mb"] - results["rss_before_mb"]
        results["rss_bytes_per_schedule"] = growth_mb * MB / total
        results["load_rows_per_s"] = total / results["load_s"]
        return results
    finally:
        asyncio.run(_admin(server_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


async def _prepare(url: str, partitions: int) -> None:
    await migrate_database(url, partitions=partitions)
    async with open_postgres_ledger(url, pool_max=1) as ledger:
        await ledger.task_types_put(
            TaskTypesPut(TaskType(name="noop", kind=HandlerKind.NOOP, allowed_tenants=("*",)))
        )


async def _database_now(url: str) -> datetime:
    async with open_postgres_ledger(url, pool_max=1) as ledger:
        return await ledger.database_now()


FIGURES: Final = [
    ("create_rows_per_s", "create, schedules/s", ",.0f"),
    ("load_s", "cold load, s", ".2f"),
    ("load_cpu_s", "cold load, CPU s of the node's process", ".2f"),
    ("load_rows_per_s", "cold load, schedules/s", ",.0f"),
    ("partition_min", "schedules per partition, fewest", ",.0f"),
    ("partition_max", "schedules per partition, most", ",.0f"),
    ("rss_before_mb", "RSS before the node started, MB", ",.1f"),
    ("rss_loaded_mb", "RSS with every schedule loaded, MB", ",.1f"),
    ("rss_end_mb", "RSS at the end of the steady window, MB", ",.1f"),
    ("rss_peak_mb", "peak RSS (VmHWM), MB", ",.1f"),
    ("rss_bytes_per_schedule", "bytes per schedule (RSS growth over the load / N)", ",.0f"),
    ("heap_bytes_per_schedule", "bytes per schedule in planner structures (estimate)", ",.0f"),
    ("burst_plan_s", "burst: first to last execution durable, s", ".2f"),
    ("burst_lead_s", "burst: last durable before T, s", ".2f"),
    ("steady_cpu_pct", "steady CPU, % of one core", ".1f"),
    ("steady_planned_per_s", "steady executions planned/s", ",.1f"),
    ("steady_start_delay_p99_s", "steady start delay p99, s", ".3f"),
    ("lag_p50_s", "planner lag p50, s", ".3f"),
    ("lag_p99_s", "planner lag p99, s", ".3f"),
    ("lag_max_s", "planner lag max, s", ".3f"),
    ("lag_samples", "planner lag samples (partitions x seconds)", ",.0f"),
]


def catch_up_note(runs: list[dict[str, float]], steady_s: float) -> list[str]:
    """Why a size's steady rows describe a catch-up, when they do: the planners were still
    behind by more than the window at its median (the fires missed while the schedules were
    created and loaded), so the window's own fires were not planned in it."""
    lags = [run["lag_p50_s"] for run in runs if "lag_p50_s" in run]
    if not lags or summary(lags)[0] <= steady_s:
        return []
    return [
        "",
        f"Not a steady state: through the {steady_s:.0f} s window the planners were still "
        f"writing the fires missed while the schedules were created and loaded (planner lag "
        f"p50 {summary(lags)[0]:,.0f} s), so the window's own fires were not planned in it. "
        "The steady rows of this size describe that catch-up.",
    ]


def size_report(total: int, burst: int, runs: list[dict[str, float]], steady_s: float) -> list[str]:
    """The figures table for one size, and its targets table at TARGET_SCHEDULES."""
    lines = [
        f"### {total:,} schedules",
        "",
        "| figure | median | min | max |",
        "|---|---:|---:|---:|",
    ]
    for key, label, spec in FIGURES:
        if all(key in run for run in runs):
            values = [run[key] for run in runs if not math.isnan(run[key])]
            cells = [f"{v:{spec}}" for v in summary(values)] if values else ["n/a"] * 3
            lines.append(f"| {label} | {' | '.join(cells)} |")
    lines += catch_up_note(runs, steady_s)
    if burst:
        complete = all(run["burst_rows"] == burst for run in runs)
        lines += ["", f"Every burst execution was planned: {'yes' if complete else 'NO'}."]
        if not complete:
            counts = " / ".join(f"{run['burst_rows']:,.0f}" for run in runs)
            lines += ["", f"Burst executions planned, each run: {counts} of {burst:,}."]
    lines += ["", "| target | median (worst run) | met? |", "|---|---:|:-:|"]
    for label, key, limit, unit in [
        ("RSS with every schedule loaded", "rss_loaded_mb", RSS_TARGET_MB, "MB"),
        ("cold load", "load_s", LOAD_TARGET_S, "s"),
    ]:
        median, _, worst = summary([run[key] for run in runs])
        verdict = "met" if median <= limit else "not met"
        if total != TARGET_SCHEDULES:
            verdict = f"n/a (target is for {TARGET_SCHEDULES:,})"
        lines.append(
            f"| {label} <= {limit:,.0f} {unit} | {median:,.1f} ({worst:,.1f}) {unit} | {verdict} |"
        )
    return lines


def fits(total: int, bytes_per_schedule: float, measured_at: int | None) -> str | None:
    """None when ``total`` schedules fit in memory now, else why the size is skipped."""
    need_mb = memory_needed_mb(total, bytes_per_schedule)
    available_mb = mem_available_mb()
    if need_mb <= available_mb:
        return None
    source = f"measured at {measured_at:,}" if measured_at else "the prior estimate"
    return (
        f"### {total:,} schedules\n\nSkipped: it would need about {need_mb:,.0f} MB "
        f"({bytes_per_schedule:,.0f} bytes per schedule, {source}, with headroom), and "
        f"MemAvailable is {available_mb:,.0f} MB."
    )


def header(args: argparse.Namespace, load_averages: tuple[float, float]) -> list[str]:
    burst = "no burst"
    if args.burst:
        burst = f"{args.burst:,} of them due at one instant T"
        if len(args.schedules) > 1:
            burst += f" at {min(args.schedules):,} (none at the larger sizes)"
    return [
        "## Scale: one node, a million schedules (`benchmarks/bench_scale.py`)",
        "",
        f"Machine: {machine()}; revision {revision()}; {args.runs} runs per size; one node with "
        f"default settings (a ledger pool of {POOL_MAX_DEFAULT} connections), in a fresh process "
        f"each run, {args.partitions} partitions, schedules over {TENANTS} "
        f"tenants (`H` expressions in four zones, spread over the hour), {burst}; created by "
        f"{CREATORS} processes; PostgreSQL on the same machine. Steady state: "
        f"{args.steady:.0f} s after the load (and the burst, where there is one), planner lag "
        "sampled every "
        f"{LAG_SAMPLE_S:.0f} s per partition. MB = 2^20 bytes. A target is met when the "
        "median over the runs meets it. Load average (1 min) "
        f"{load_averages[0]:.2f} at the start, {load_averages[1]:.2f} at the end.",
        "",
    ]


def draw_plot(measured: dict[int, list[dict[str, float]]]) -> Path | None:
    sizes = [
        (
            total,
            summary([run["rss_loaded_mb"] for run in runs]),
            summary([run["load_s"] for run in runs]),
        )
        for total, runs in sorted(measured.items())
    ]
    return _plots.draw(_plots.scale, "bench-scale.png", sizes, RSS_TARGET_MB, LOAD_TARGET_S)


RESULT_FIGURES: Final = ("rss_loaded_mb", "load_s", "rss_peak_mb", "create_rows_per_s")
"""Kept in docs/bench-results/bench_scale.json per size, as ``<figure>@<schedules>``."""


def save_results(args: argparse.Namespace, measured: dict[int, list[dict[str, float]]]) -> None:
    figures = {
        f"{key}@{total}": [run[key] for run in runs]
        for total, runs in measured.items()
        for key in RESULT_FIGURES
    }
    context = {"schedules": sorted(measured), "runs": args.runs, "burst": args.burst}
    write_results("bench_scale", figures, context)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run; docs are not written")
    parser.add_argument("--schedules", type=int, nargs="+", default=list(SIZES_DEFAULT))
    parser.add_argument(
        "--burst",
        type=int,
        default=200_000,
        help="schedules due at T at the smallest size; 0: none",
    )
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--steady", type=float, default=60.0, help="seconds of steady state")
    parser.add_argument("--partitions", type=int, default=64)
    args = parser.parse_args()
    if args.quick:
        args.schedules, args.runs, args.steady = [4_000], 1, 2.0
        args.burst = min(args.burst, 1_000)
    bytes_per_schedule, measured_at = BYTES_PER_SCHEDULE_PRIOR, None
    sections: list[str] = []
    measured: dict[int, list[dict[str, float]]] = {}
    ok = True
    load_at_start = os.getloadavg()[0]
    with resolve_database() as database:
        for total in sorted(args.schedules):
            # The burst at the smallest size only: it measures planning ahead, which does not
            # change with the schedules around it, and at 5M its T would come ~9 min after the
            # start of the run (the schedules are created first), tripling the run's length.
            burst = min(args.burst, total) if total == min(args.schedules) else 0
            skipped = fits(total, bytes_per_schedule, measured_at)
            if skipped is not None:
                if len(args.schedules) > 1:
                    print(skipped, flush=True)
                sections += [skipped, ""]
                continue
            runs = [
                one_run(database.url, total, burst, args.steady, args.partitions)
                for _ in range(args.runs)
            ]
            measured[total] = runs
            ok = ok and all(run["burst_rows"] == burst for run in runs if burst)
            bytes_per_schedule = max(run["rss_bytes_per_schedule"] for run in runs)
            measured_at = total
            lines = size_report(total, burst, runs, args.steady)
            if len(args.schedules) > 1:  # figures of a size as soon as it is done
                print("\n".join(lines), flush=True)
            sections += [*lines, ""]
    image = draw_plot(measured) if measured and not args.quick else None
    lines = header(args, (load_at_start, os.getloadavg()[0]))
    report = "\n".join([*lines, *image_link(image, "RSS and cold load per size"), *sections])
    print(report)
    if not args.quick:
        write_section("bench_scale", report)
        save_results(args, measured)
        write_targets()
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
