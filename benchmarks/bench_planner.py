"""One node, many schedules: cold-start load, memory, and a 200k burst planned ahead of time.

Creates a throwaway database on the resolved server (never touching other data), fills it
with N schedules over 50 tenants (mixed ``H`` expressions spread over the hour, plus M
schedules all due at the same instant T), starts one real node (PostgresLedger on the
bridge), and reports:

* load time: node start until every planner has its partition's schedules in its heap;
* RSS of the process after loading (the whole process: engine, driver, Python);
* the burst: how long planning the M executions due at T took, and the lead time -- how long
  before T the last of them was durable (positive: all were in the ledger before T);
* steady-state CPU while the spread schedules fire.

Targets (issue #4): load <= 20 s, RSS <= 600 MB, burst durable before T, for N = 1,000,000 and
M = 200,000 on a 2-core machine with Postgres on the same machine.

Usage: python benchmarks/bench_planner.py [--quick] [--schedules N] [--burst M] [--runs K]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import resource
import secrets
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._report import machine, revision, summary, write_section
from engine.clock import SystemClock
from engine.config import LogLevel, NodeConfig
from engine.core.timetable import TimetableCache
from engine.ledger.base import SchedulesCreate, TaskTypesPut
from engine.ledger.database import resolve_database, url_with_database
from engine.ledger.postgres import migrate_database, open_postgres_ledger
from engine.model import HandlerKind, Schedule, TaskType
from engine.node import Node

SPREAD = ["H * * * *", "H/15 * * * *", "H H * * *", "H/5 * * * *", "H H(8-18) * * MON-FRI"]
ZONES = ["UTC", "Europe/Berlin", "America/New_York", "Asia/Tokyo"]
TENANTS = 50
CREATE_BATCH = 10_000


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def _admin(url: str, statement: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(url)
    try:
        await conn.execute(statement)
    finally:
        await conn.close()


def make_schedules(
    first: int, count: int, burst: int, burst_at: datetime, now: datetime, cache: TimetableCache
) -> list[Schedule]:
    """Schedules number ``first`` .. ``first + count - 1`` (made per batch, to keep memory flat)."""
    burst_expr = f"{burst_at.second} {burst_at.minute} {burst_at.hour} * * *"
    schedules = []
    for n in range(first, first + count):
        sid = f"s{n:07d}"
        if n < burst:
            expr, zone, first = burst_expr, "UTC", burst_at
        else:
            expr, zone = SPREAD[n % len(SPREAD)], ZONES[n % len(ZONES)]
            first = cache.get(expr, zone, schedule_id=sid).next_fire(now).planned_at
        schedules.append(
            Schedule(
                schedule_id=sid,
                tenant_id=f"tenant-{n % TENANTS:02d}",
                cron_expr=expr,
                timezone=zone,
                task_type="noop",
                next_run_at=first,
            )
        )
    return schedules


async def one_run(server_url: str, total: int, burst: int, steady_s: float) -> dict[str, float]:
    name = f"carillon_bench_{secrets.token_hex(4)}"
    await trio.to_thread.run_sync(asyncio.run, _admin(server_url, f'CREATE DATABASE "{name}"'))
    url = url_with_database(server_url, name)
    try:
        await migrate_database(url, partitions=64)
        async with open_postgres_ledger(url, pool_max=4) as ledger:
            now = await ledger.database_now()
            # The burst instant: far enough ahead for creating and loading the schedules
            # (about 25k rows/s to create, 60k/s to load) and for the burst's own lead.
            lead = timedelta(seconds=10 + total / 15_000 + burst / 10_000)
            burst_at = (now + lead).replace(microsecond=0)
            cache = TimetableCache()
            create_s = 0.0
            await ledger.task_types_put(TaskTypesPut(TaskType(name="noop", kind=HandlerKind.NOOP)))
            for n in range(0, total, CREATE_BATCH):
                batch = make_schedules(n, min(CREATE_BATCH, total - n), burst, burst_at, now, cache)
                started = time.perf_counter()
                await ledger.schedules_create(SchedulesCreate(batch))
                create_s += time.perf_counter() - started
            del batch, cache
            config = NodeConfig(node_id=f"bench-{os.getpid()}", log_level=LogLevel.WARNING, http="")
            node = Node(config, ledger, SystemClock(), random.Random(7))
            rss_before = rss_mb()
            results: dict[str, float] = {"create_rows_per_s": total / create_s}
            async with trio.open_nursery() as nursery:
                started = time.perf_counter()
                await nursery.start(node.run)
                while sum(p.schedules for p in node.planners.statistics().planners) < total or (
                    len(node.table) < 64
                ):
                    await trio.sleep(0.05)
                results["load_s"] = time.perf_counter() - started
                results["rss_mb"] = rss_mb()
                results["rss_growth_mb"] = results["rss_mb"] - rss_before
                wait = (burst_at - await ledger.database_now()).total_seconds() + 3
                await trio.sleep(max(wait, 0))
                cpu_before, wall_before = cpu_s(), time.perf_counter()
                steady_from = await ledger.database_now()
                await trio.sleep(steady_s)
                results["steady_cpu_pct"] = (
                    100 * (cpu_s() - cpu_before) / (time.perf_counter() - wall_before)
                )
                steady_to = await ledger.database_now()
                nursery.cancel_scope.cancel()
            stats = await burst_figures(url, burst_at, steady_from, steady_to)
            results.update(stats)
            results["burst_planned"] = stats["burst_rows"]
        return results
    finally:
        await trio.to_thread.run_sync(
            asyncio.run, _admin(server_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        )


async def burst_figures(
    url: str, burst_at: datetime, steady_from: datetime, steady_to: datetime
) -> dict[str, float]:
    import asyncpg

    async def query() -> tuple[asyncpg.Record, int]:
        conn = await asyncpg.connect(url)
        try:
            burst = await conn.fetchrow(
                "SELECT count(*) AS n, min(enqueued_at) AS first, max(enqueued_at) AS last "
                "FROM executions WHERE planned_at = $1",
                burst_at,
            )
            steady = await conn.fetchval(
                "SELECT count(*) FROM executions WHERE planned_at > $1 AND planned_at <= $2",
                steady_from,
                steady_to,
            )
            return burst, steady
        finally:
            await conn.close()

    row, steady = await trio.to_thread.run_sync(asyncio.run, query())
    first: datetime = row["first"].astimezone(UTC)
    last: datetime = row["last"].astimezone(UTC)
    return {
        "burst_rows": float(row["n"]),
        "burst_plan_s": (last - first).total_seconds(),
        "burst_lead_s": (burst_at - last).total_seconds(),
        "steady_planned_per_s": steady / (steady_to - steady_from).total_seconds(),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run; docs are not written")
    parser.add_argument("--schedules", type=int, default=1_000_000)
    parser.add_argument("--burst", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--steady", type=float, default=30.0, help="seconds of steady state")
    args = parser.parse_args()
    if args.quick:
        args.schedules, args.burst, args.runs, args.steady = 4_000, 1_000, 1, 1.0
    with resolve_database() as database:
        runs = [
            trio.run(one_run, database.url, args.schedules, args.burst, args.steady)
            for _ in range(args.runs)
        ]
    keys = ["load_s", "rss_mb", "rss_growth_mb", "burst_plan_s", "burst_lead_s",
            "steady_cpu_pct", "steady_planned_per_s", "create_rows_per_s"]  # fmt: skip
    lines = [
        "## Planner at scale (`benchmarks/bench_planner.py`)",
        "",
        f"Machine: {machine()}; revision {revision()}; {args.runs} runs; one node, 64 "
        f"partitions, {args.schedules:,} schedules over {TENANTS} tenants, {args.burst:,} of "
        "them due at the same instant; PostgreSQL on the same machine.",
        "",
        "| figure | median | min | max |",
        "|---|---:|---:|---:|",
    ]
    for key in keys:
        median, low, high = summary([run[key] for run in runs])
        lines.append(f"| {key} | {median:,.2f} | {low:,.2f} | {high:,.2f} |")
    complete = all(run["burst_rows"] == args.burst for run in runs)
    lines += [
        "",
        f"Every burst execution was planned: {'yes' if complete else 'NO'}. "
        "`burst_lead_s` > 0 means the whole burst was durable before its instant.",
    ]
    report = "\n".join(lines)
    print(report)
    if not args.quick:
        write_section("bench_planner", report)
    return 0 if complete else 1


if __name__ == "__main__":
    raise SystemExit(main())
