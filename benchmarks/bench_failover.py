"""Failover during a burst: SIGKILL the node owning the most partitions, measure the recovery.

Creates a throwaway database (``carillon_failover_<hex>``) on the resolved server with N
schedules (default 50,000) over 20 tenants, all due at one instant T (as in
``bench_burst.py``), whose ``noop`` takes ``--handler-delay`` (default 0.05 s) per execution
so that the burst lasts a while, and starts K ``carillon run`` processes on it (default 3; default
settings except the node id, ``--lease-ttl`` and no HTTP API). Once the partitions are
balanced and T has passed by ``--kill-after`` seconds (mid-burst), it SIGKILLs the node that
owns the most partitions -- no graceful hand-back: the others must notice its leases expire.
A poller (plain asyncpg, database clock) then records:

* ``rto_leases_s``: kill -> every partition of the victim owned again by a live node;
* ``rto_resume_s``: kill -> the first execution of those partitions started after the kill
  (their queued executions resume);
* ``all_done_s``: kill -> every execution of the burst succeeded;
* ``delayed``: executions of the victim's partitions started after the kill, and their
  start delay p50 / max (planned -> started);
* ``in_flight``: executions the victim had claimed but not finished: they are redelivered
  when their attempt lease (``--attempt-lease``, default 60 s) runs out -- the price of
  at-least-once, bounded and counted here;
* duplicates: rows per execution id are 1 by the primary key; ``redelivered`` counts
  executions started more than once (attempt > 1). An idempotent sink would record each
  once (the chaos test, ``docs/chaos.md``, checks that at a real webhook sink).

Target (issue #8): RTO <= lease TTL + 2 s (the later of the two RTOs, in every run). A full
run also draws docs/img/bench-failover.png (executions succeeded per second around the kill),
writes docs/bench-results/bench_failover.json and rebuilds the Targets section.

Usage: python benchmarks/bench_failover.py [--quick] [--schedules N] [--runs K] [--nodes K]
       [--lease-ttl S] [--kill-after S] [--timeout S]
"""

from __future__ import annotations

import argparse
import math
import os
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

import asyncpg
import trio
import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import _plots
from benchmarks._burst import admin, create_schedules
from benchmarks._nodes import LEASES, start_nodes, stop_nodes, wait_balanced
from benchmarks._report import (
    image_link,
    machine,
    revision,
    summary,
    write_results,
    write_section,
    write_targets,
)
from engine.ledger.database import resolve_database, url_with_database

POLL_S: Final = 0.1
SLOW_NOOP: Final = (
    """UPDATE task_types SET settings = '{{"delay_s": {delay_s}}}' WHERE name = 'noop'"""
)
"""Each execution takes a moment, so that the burst is still running when the node dies."""
NOW: Final = "SELECT now()"
UNFINISHED: Final = """
SELECT EXISTS (SELECT 1 FROM executions WHERE status IN ('queued', 'failed'))
    OR EXISTS (SELECT 1 FROM executions WHERE status = 'running')
"""
FIRST_RESUMED: Final = """
SELECT min(started_at) FROM executions WHERE partition_id = ANY($1) AND started_at > $2
"""
FIGURES: Final = """
SELECT count(*) FILTER (WHERE partition_id = ANY($1) AND started_at > $2) AS delayed,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM started_at - planned_at))
           FILTER (WHERE partition_id = ANY($1) AND started_at > $2) AS delayed_p50_s,
       max(extract(epoch FROM started_at - planned_at))
           FILTER (WHERE partition_id = ANY($1) AND started_at > $2) AS delayed_max_s,
       count(*) FILTER (WHERE attempt > 1) AS redelivered,
       count(*) FILTER (WHERE status = 'succeeded') AS succeeded,
       max(extract(epoch FROM started_at - planned_at)) AS delay_max_s
FROM executions
"""
SUCCEEDED_PER_SECOND: Final = """
SELECT floor(extract(epoch FROM finished_at - $1))::integer AS second, count(*) AS succeeded
FROM executions WHERE status = 'succeeded' GROUP BY 1 ORDER BY 1
"""
"""Executions succeeded per second, counted from the kill (negative: before it)."""


@dataclass
class Run:
    figures: dict[str, float] = field(default_factory=dict)
    succeeded_per_s: list[tuple[int, int]] = field(default_factory=list)


def start_failover_nodes(
    url: str, k: int, lease_ttl_s: float, attempt_lease_s: float, logs: Path
) -> list[subprocess.Popen[bytes]]:
    margin = max(0.5, lease_ttl_s / 10)
    options = [
        "--lease-ttl", str(lease_ttl_s), "--lease-safety-margin", str(margin),
        "--attempt-lease", str(attempt_lease_s),
    ]  # fmt: skip
    return start_nodes(url, k, logs, name="failover", options=options)


async def uvloop_sleep(seconds: float) -> None:
    import asyncio

    await asyncio.sleep(seconds)


async def _measure(
    url: str,
    processes: list[subprocess.Popen[bytes]],
    burst_at: datetime,
    kill_after_s: float,
    timeout_s: float,
) -> Run:
    connection = await asyncpg.connect(url)
    try:
        if not await wait_balanced(connection, len(processes), 60.0):
            raise SystemExit("the nodes did not share the partitions in time")
        now = await connection.fetchval(NOW)
        await uvloop_sleep(max(0.0, (burst_at - now).total_seconds() + kill_after_s))
        rows = await connection.fetch(LEASES)
        owned: dict[str, list[int]] = {}
        for row in rows:
            if row["live"] and row["owner_id"]:
                owned.setdefault(row["owner_id"], []).append(row["partition_id"])
        victim = max(owned, key=lambda owner: len(owned[owner]))
        partitions = owned[victim]
        process = processes[int(victim.rsplit("-", 1)[1])]
        process.send_signal(signal.SIGKILL)
        killed_at: datetime = await connection.fetchval(NOW)
        while process.poll() is None:
            await uvloop_sleep(0.01)
        # Counted once the victim is gone, so the claims it made up to the kill are in; no
        # other node can touch these rows before the victim's leases expire.
        in_flight = await connection.fetchval(
            "SELECT count(*) FROM executions WHERE status = 'running' AND partition_id = ANY($1)",
            partitions,
        )
        reowned_at = resumed_at = done_at = None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and (done_at is None or reowned_at is None):
            now = await connection.fetchval(NOW)
            if reowned_at is None:
                live = {
                    r["partition_id"]
                    for r in await connection.fetch(LEASES)
                    if r["live"] and r["owner_id"] not in (None, victim)
                }
                if set(partitions) <= live:
                    reowned_at = now
            if resumed_at is None:
                resumed_at = await connection.fetchval(FIRST_RESUMED, partitions, killed_at)
            if done_at is None and not await connection.fetchval(UNFINISHED):
                done_at = now
            await uvloop_sleep(POLL_S)
        figures = dict(await connection.fetchrow(FIGURES, partitions, killed_at))
        series = await connection.fetch(SUCCEEDED_PER_SECOND, killed_at)
    finally:
        await connection.close()

    def since_kill(at: datetime | None) -> float:
        return float("nan") if at is None else (at - killed_at).total_seconds()

    measured = {
        "victim_partitions": float(len(partitions)),
        "in_flight": float(in_flight),
        "rto_leases_s": since_kill(reowned_at),
        "rto_resume_s": since_kill(resumed_at),
        "all_done_s": since_kill(done_at),
        **{k: float(v) if v is not None else float("nan") for k, v in figures.items()},
    }
    return Run(measured, [(row["second"], row["succeeded"]) for row in series])


def one_run(server_url: str, n: int, k: int, args: argparse.Namespace, logs: Path) -> Run:
    name = f"carillon_failover_{secrets.token_hex(4)}"
    admin(server_url, f"CREATE DATABASE {name}")
    url = url_with_database(server_url, name)
    processes: list[subprocess.Popen[bytes]] = []
    try:
        burst_at = trio.run(create_schedules, url, n)
        admin(url, SLOW_NOOP.format(delay_s=args.handler_delay))
        processes = start_failover_nodes(url, k, args.lease_ttl, args.attempt_lease, logs)
        return uvloop.run(_measure(url, processes, burst_at, args.kill_after, args.timeout))
    finally:
        stop_nodes(processes)
        admin(server_url, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def _cell(samples: list[float], digits: int = 2) -> str:
    median, low, high = summary(samples)
    return f"{median:,.{digits}f} ({low:,.{digits}f}-{high:,.{digits}f})"


def rto_s(run: Run) -> float:
    """The run's RTO: the later of its partitions owned again and its executions resuming
    (infinite if either did not happen before the timeout)."""
    both = (run.figures["rto_leases_s"], run.figures["rto_resume_s"])
    return math.inf if any(math.isnan(s) for s in both) else max(both)


def report(
    args: argparse.Namespace, runs: list[Run], image: Path | None = None
) -> tuple[str, bool]:
    def column(name: str) -> list[float]:
        return [run.figures[name] for run in runs]

    target = args.lease_ttl + 2.0
    rto = max(rto_s(run) for run in runs)
    complete = all(run.figures["succeeded"] == args.schedules for run in runs)
    lines = [
        "## Failover during a burst (`benchmarks/bench_failover.py`)",
        "",
        f"{machine()}; revision {revision()}; {datetime.now(UTC):%Y-%m-%d}.",
        f"{args.schedules:,} executions due at one instant (a `noop` of {args.handler_delay:g} s "
        f"each), {args.nodes} `carillon run` "
        f"processes (lease TTL {args.lease_ttl:g} s, attempt lease {args.attempt_lease:g} s, "
        f"default settings otherwise); "
        f"{args.kill_after:g} s after the instant the node owning the most partitions is "
        f"SIGKILLed. Median (min-max) over {len(runs)} runs, database clock:",
        "",
        "| figure | value |",
        "|---|---|",
        f"| partitions of the victim | {_cell(column('victim_partitions'), 0)} |",
        f"| RTO: its partitions owned again (s) | {_cell(column('rto_leases_s'))} |",
        f"| RTO: its queued executions resume (s) | {_cell(column('rto_resume_s'))} |",
        f"| kill -> whole burst succeeded (s) | {_cell(column('all_done_s'))} |",
        f"| executions of its partitions started after the kill | {_cell(column('delayed'), 0)} |",
        f"| their start delay p50 / max (s) | {_cell(column('delayed_p50_s'))} / "
        f"{_cell(column('delayed_max_s'))} |",
        f"| claimed by the victim, in flight at the kill (redelivered after the attempt "
        f"lease) | {_cell(column('in_flight'), 0)} |",
        f"| executions started more than once | {_cell(column('redelivered'), 0)} |",
        f"| succeeded / expected | {_cell(column('succeeded'), 0)} / {args.schedules:,} |",
        "",
        *image_link(image, "Executions succeeded per second around the kill (median run)"),
        f"Target RTO <= lease TTL + 2 s = {target:g} s: "
        f"{'**met**' if rto <= target else '**not met**'} (worst run: {rto:.2f} s). Every "
        f"execution {'succeeded' if complete else 'did NOT succeed'}; the executions the "
        "victim had claimed wait for their attempt lease before another node runs them "
        "(at-least-once: the same id, so an idempotent receiver applies them once).",
    ]
    return "\n".join(lines), complete


def draw_plot(runs: list[Run]) -> Path | None:
    """Succeeded per second around the kill, of the run with the median RTO."""
    run = sorted(runs, key=rto_s)[len(runs) // 2]
    return _plots.draw(
        _plots.failover,
        "bench-failover.png",
        run.succeeded_per_s,
        run.figures["rto_leases_s"],
        run.figures["rto_resume_s"],
    )


def save_results(args: argparse.Namespace, runs: list[Run]) -> None:
    figures = {
        "rto_s": [rto_s(run) for run in runs],
        **{
            key: [run.figures[key] for run in runs]
            for key in ("rto_leases_s", "rto_resume_s", "all_done_s", "redelivered")
        },
    }
    context = {
        "schedules": args.schedules,
        "runs": args.runs,
        "nodes": args.nodes,
        "lease_ttl_s": args.lease_ttl,
        "rto_limit_s": args.lease_ttl + 2.0,
    }
    write_results("bench_failover", figures, context)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run; docs are not written")
    parser.add_argument("--schedules", type=int, default=50_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--lease-ttl", type=float, default=15.0)
    parser.add_argument("--kill-after", type=float, default=1.0, help="seconds after T")
    parser.add_argument(
        "--attempt-lease", type=float, default=60.0, help="the nodes' attempt lease (default 60)"
    )
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds after the kill")
    parser.add_argument(
        "--handler-delay", type=float, default=0.05, help="seconds each noop execution takes"
    )
    args = parser.parse_args()
    if args.quick:
        args.schedules, args.runs, args.lease_ttl, args.timeout = 2_000, 1, 3.0, 120.0
        args.handler_delay, args.attempt_lease = 0.2, 5.0
    logs = Path(os.environ.get("CARILLON_BENCH_LOGS", "/tmp")) / f"failover-{os.getpid()}"
    logs.mkdir(parents=True, exist_ok=True)
    with resolve_database() as database:
        runs = [
            one_run(database.url, args.schedules, args.nodes, args, logs) for _ in range(args.runs)
        ]
    image = None if args.quick else draw_plot(runs)
    text, complete = report(args, runs, image)
    print(text)
    if not args.quick:
        write_section("bench_failover", text)
        save_results(args, runs)
        write_targets()
    return 0 if complete else 1


if __name__ == "__main__":
    raise SystemExit(main())
