"""The same top-of-minute burst on Carillon and on a peer, APScheduler 4, in the same run.

Each run, three sides one after another, each on a throwaway database
(``carillon_peer_<hex>``) of the resolved server, N schedules (default 20,000) due at one
instant T, a task that does no work:

* **Carillon, 1 node** and **Carillon, 2 nodes**: ``carillon run`` processes with default
  settings (``benchmarks/_nodes.py``) on schedules made as ``bench_burst.py`` makes them
  (``create_schedules``: 20 tenants, the ``noop`` task type, T some seconds ahead); the nodes
  start once the schedules exist and share the partitions before T. Figures from the ledger
  (``bench_burst.ledger_figures``): a run's time is its ``started_at``, "all ran" is the last
  ``finished_at`` (durable completion); duplicates are extra executions per (schedule,
  instant), redeliveries (attempt > 1) and extra attempt rows -- every handler delivery has
  an attempt row, so this counts deliveries beyond the first.
* **APScheduler 4** (``benchmarks/peers/``, its own environment ``.bench-peers/venv`` with
  pinned versions, created here when missing): two scheduler processes sharing its
  SQLAlchemy/asyncpg PostgreSQL data store and asyncpg event broker, T a whole minute (a
  whole second with ``--quick``); the task records each run into a table with
  ``clock_timestamp()``, and the database counts duplicates (``benchmarks/peers/drive.py``).

Reported per side, median (min-max) over the runs: time to add the schedules, the lead left
before T, T until all ran, executions/s (N / that), start delay p50/p99/max (run time - T),
duplicates, each process's peak RSS; and per run, then summarised the same way, the ratios
Carillon / peer of executions/s and peer / Carillon of the time until all ran.

Target (issue #8): Carillon >= 10x the peer's throughput on the same burst. If the peer's
environment cannot be made or its run fails, the report says why and Carillon still runs.

Usage: python benchmarks/bench_peer.py [--quick] [--runs K] [--schedules N] [--timeout S]
       [--peer-timeout S]
"""

from __future__ import annotations

import argparse
import math
import os
import secrets
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

import asyncpg
import trio
import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._nodes import peak_rss_mb, start_nodes, stop_nodes, wait_balanced
from benchmarks._report import machine, revision, summary, write_section
from benchmarks.bench_burst import admin, create_schedules, ledger_figures, poll_until_succeeded
from benchmarks.peers.drive import SCHEDULERS, PeerConfig, peer_burst
from benchmarks.peers.make_venv import PeerUnavailable, ensure_venv, pinned_version
from engine.config import LEASE_TTL_S_DEFAULT, WORKERS_DEFAULT
from engine.ledger.database import resolve_database, url_with_database
from engine.ledger.postgres import PARTITIONS_DEFAULT

TARGET_RATIO: Final = 10.0
PEER: Final = "apscheduler"
Results = dict[str, list[dict[str, Any]]]


def fresh_database(server_url: str) -> tuple[str, str]:
    name = f"carillon_peer_{secrets.token_hex(4)}"
    admin(server_url, f'CREATE DATABASE "{name}"')
    return name, url_with_database(server_url, name)


async def _balanced_before(url: str, k: int, burst_at: datetime) -> bool:
    connection = await asyncpg.connect(url)
    try:
        until_t = (burst_at - datetime.now(UTC)).total_seconds()
        return await wait_balanced(connection, k, max(until_t, 0.0))
    finally:
        await connection.close()


def carillon_burst(server_url: str, n: int, k: int, timeout_s: float, logs: Path) -> dict[str, Any]:
    name, url = fresh_database(server_url)
    processes = []
    try:
        started = time.perf_counter()
        burst_at = trio.run(create_schedules, url, n)
        result: dict[str, Any] = {
            "setup_s": time.perf_counter() - started,
            "setup_lead_s": (burst_at - datetime.now(UTC)).total_seconds(),
        }
        processes = start_nodes(url, k, logs, name=f"carillon-{k}")
        result["balanced"] = uvloop.run(_balanced_before(url, k, burst_at))
        poll_until_succeeded(url, n, burst_at, timeout_s)
        result["rss_mb"] = [peak_rss_mb(process.pid) for process in processes]
        stop_nodes(processes)
        figures = uvloop.run(ledger_figures(url, n, burst_at, timeout_s))
    finally:
        stop_nodes(processes)  # a no-op for nodes already stopped
        admin(server_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    return result | {
        "planned_lead_s": figures["lead_s"],
        "all_ran_s": figures["all_succeeded_s"],
        "ran_share": figures["succeeded_share"],
        **{key: figures[key] for key in ("executions_per_s", "duplicates")},
        **{key: figures[key] for key in ("delay_p50_s", "delay_p99_s", "delay_max_s")},
    }


def apscheduler_burst(
    python: Path, server_url: str, n: int, config: PeerConfig, timeout_s: float, logs: Path
) -> dict[str, Any]:
    name, url = fresh_database(server_url)
    try:
        return peer_burst(python, url, n, config, timeout_s, logs)
    finally:
        admin(server_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def one_run(
    server_url: str, args: argparse.Namespace, python: Path | None, config: PeerConfig, logs: Path
) -> dict[str, dict[str, Any] | str]:
    """One run of every side; a side that failed is the reason instead of its figures."""
    n = args.schedules
    run: dict[str, dict[str, Any] | str] = {}
    for k in (1, 2):
        figures = carillon_burst(server_url, n, k, args.timeout, logs)
        run[f"carillon-{k}"] = figures
        print(f"  Carillon, {k} node(s): {_line(figures)}", file=sys.stderr)
    if python is None:
        return run
    try:
        run[PEER] = apscheduler_burst(python, server_url, n, config, args.peer_timeout, logs)
    # The peer is third-party code in another environment: whatever stops it is reported
    # as the reason, beside Carillon's figures, never as a traceback.
    except Exception as error:
        run[PEER] = f"{type(error).__name__}: {error}"
    peer = run[PEER]
    print(f"  APScheduler: {_line(peer) if isinstance(peer, dict) else peer}", file=sys.stderr)
    return run


def _line(figures: dict[str, Any]) -> str:
    return (
        f"{figures['executions_per_s']:,.0f} executions/s, all ran {figures['all_ran_s']:.2f} s "
        f"after T, {figures['duplicates']:.0f} duplicates, setup {figures['setup_s']:.1f} s"
    )


def add_ratios(run: dict[str, dict[str, Any] | str]) -> None:
    peer = run.get(PEER)
    if not isinstance(peer, dict):
        return
    for k in (1, 2):
        side = run[f"carillon-{k}"]
        assert isinstance(side, dict)
        side["rate_ratio"] = side["executions_per_s"] / max(peer["executions_per_s"], 1e-9)
        finite = math.isfinite(side["all_ran_s"]) and math.isfinite(peer["all_ran_s"])
        side["time_ratio"] = peer["all_ran_s"] / side["all_ran_s"] if finite else math.nan


# --- the report --------------------------------------------------------------------------------


def _cell(samples: list[float], digits: int) -> str:
    if any(math.isnan(s) for s in samples):
        return "n/a"
    median, low, high = summary(samples)
    text = (
        f"{median:,.{digits}f}"
        if low == high
        else f"{median:,.{digits}f} ({low:,.{digits}f}-{high:,.{digits}f})"
    )
    return text.replace("inf", "timeout")


ROWS: Final = (
    ("setup: tables and schedules (s)", "setup_s", 1),
    ("setup done, lead before T (s)", "setup_lead_s", 1),
    ("executions planned, lead before T (s)", "planned_lead_s", 2),
    ("T until all ran (s)", "all_ran_s", 2),
    ("share ran (by the timeout)", "ran_share", 4),
    ("executions/s", "executions_per_s", 0),
    ("start delay p50 (s)", "delay_p50_s", 2),
    ("start delay p99 (s)", "delay_p99_s", 2),
    ("start delay max (s)", "delay_max_s", 2),
    ("duplicates", "duplicates", 0),
    ("jobs not ending in success (peer's outcomes)", "not_success", 0),
    ("jobs left in the peer's data store", "jobs_left", 0),
    ("Carillon / APScheduler, executions/s", "rate_ratio", 1),
    ("APScheduler / Carillon, T until all ran", "time_ratio", 1),
)


def figure_table(sides: list[tuple[str, str]], results: Results) -> str:
    lines = ["| figure | " + " | ".join(t for _, t in sides) + " |", "|---|" + "---:|" * len(sides)]
    for title, key, digits in ROWS:
        cells = []
        for side, _ in sides:
            samples = [run[key] for run in results[side] if key in run]
            cells.append(_cell(samples, digits) if samples else "")
        if any(cells):
            lines.append(f"| {title} | " + " | ".join(cells) + " |")
    rss = []
    for side, _ in sides:
        per_process = zip(*(run["rss_mb"] for run in results[side]), strict=True)
        rss.append(" / ".join(f"{summary(list(p))[0]:.0f}" for p in per_process))
    lines.append("| peak RSS per process (MB) | " + " | ".join(rss) + " |")
    return "\n".join(lines)


def configuration(version: str, c: PeerConfig) -> list[str]:
    return [
        "Both sides: the same PostgreSQL server on the same machine, a fresh database per "
        "side and run, the sides one after another, the schedules created before the "
        f"processes start, a task doing no work, CPython {sys.version.split()[0]}, asyncpg "
        "0.32 and uvloop 0.23.",
        "",
        "* **Carillon**: `carillon run` processes with default settings "
        f"({PARTITIONS_DEFAULT} partitions, {WORKERS_DEFAULT} workers per node, lease TTL "
        f"{LEASE_TTL_S_DEFAULT:g} s, burst-aware planning ahead of T) and no HTTP API; the "
        "`noop` task type; daily 6-field cron schedules over 20 tenants, created through "
        "the ledger in batches of 10,000 (`bench_burst.create_schedules`). A run's time is "
        "its `started_at`; all ran = the last durable completion (`finished_at`); its "
        "ledger writes a claim, a completion and an attempt row per run.",
        f"* **APScheduler {version}** with SQLAlchemy 2.0.58 (the series it was released "
        "against; every version pinned in `benchmarks/peers/requirements-apscheduler.txt`, "
        "installed into `.bench-peers/venv`): `SQLAlchemyDataStore` on asyncpg and "
        "`AsyncpgEventBroker`, the documented set-up for several schedulers on one store; "
        f"{SCHEDULERS} `AsyncScheduler` processes, role `both`, on the uvloop loop (anyio's "
        "option; Carillon's database thread runs on it too).",
        f"  * `max_concurrent_jobs` {c.max_concurrent_jobs}, the default: 20 and 500 were no "
        "faster in a trial at 2,000 schedules (nor were the schedules spread over 20 tasks).",
        f"  * `lease_duration` {c.lease_duration_s:g} s, the default: no process fails here, "
        "so no lease runs out; 100 schedules per acquisition is fixed in this version.",
        "  * The task: `max_running_jobs=None` (the default, 1, would run the burst one job "
        "at a time), `misfire_grace_time` None (the default: no late run is dropped), "
        "coalescing `latest`, no job results kept, clean-up every 15 min (defaults).",
        f"  * Schedules: a `CronTrigger` daily at T (UTC), T a whole "
        f"{'minute' if c.whole_minute else 'second (a smoke run)'}, added through "
        f"`AsyncScheduler.add_schedule`, {c.add_concurrency} calls at a time.",
        "  * The task's body: one INSERT (schedule id, fire time, `clock_timestamp()`) "
        "through an asyncpg pool of up to 8 connections per process -- the run's only "
        "durable trace, as APScheduler deletes a finished job. A run's time is that "
        "INSERT; all ran = the last schedule's first run; duplicates = rows - distinct "
        "(schedule, fire time).",
        "",
        "Where the peer's time goes: each job costs its own transactions (insert, acquire, "
        "release) and four NOTIFY events that every scheduler receives; while a burst runs, "
        "most of its connections wait on the row lock of the task's `running_jobs` counter, "
        "which every job release updates (`pg_stat_activity`, sampled in a trial).",
    ]


def report(
    args: argparse.Namespace, config: PeerConfig, results: Results, failures: list[str]
) -> tuple[str, bool]:
    versions = {run["version"] for run in results[PEER]}
    version = ", ".join(sorted(versions)) or pinned_version("apscheduler")
    sides = [("carillon-1", "Carillon, 1 node"), ("carillon-2", "Carillon, 2 nodes")]
    if results[PEER]:
        sides.append((PEER, f"APScheduler {version}, {SCHEDULERS} schedulers"))
    clean = all(
        run["duplicates"] == 0 and run["ran_share"] == 1.0
        for side in ("carillon-1", "carillon-2")
        for run in results[side]
    )
    lines = [
        "## Beside a peer: APScheduler 4 (`benchmarks/bench_peer.py`)",
        "",
        f"Machine: {machine()}; revision {revision()}; runs: {args.runs}; "
        f"{args.schedules:,} schedules all due at one instant T on each side, run by a task "
        "doing no work; median (min-max) over the runs (ratios per run, then the same).",
        "",
        figure_table(sides, results),
        "",
    ]
    if results[PEER]:
        ratio = summary(
            [run["rate_ratio"] for run in results["carillon-2"] if "rate_ratio" in run]
        )[0]
        verdict = "met" if ratio >= TARGET_RATIO else "NOT met"
        lines.append(
            f"Target (Carillon >= {TARGET_RATIO:g}x the peer's executions/s, two processes "
            f"each): {verdict} ({ratio:,.1f}x)."
        )
    else:
        lines.append(
            f"Target (Carillon >= {TARGET_RATIO:g}x the peer's executions/s): not measured."
        )
    if failures:
        lines.append("APScheduler unavailable or failed: " + "; ".join(failures) + ".")
    late = sum(
        not run["balanced"] for side in ("carillon-1", "carillon-2") for run in results[side]
    )
    if late:
        lines.append(f"In {late} Carillon burst(s) the nodes had not shared the partitions by T.")
    lines += ["", *configuration(version, config)]
    return "\n".join(lines), clean


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run; docs are not written")
    parser.add_argument("--schedules", type=int, default=20_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=180.0, help="Carillon, s after T")
    parser.add_argument("--peer-timeout", type=float, default=900.0, help="peer, s after T")
    args = parser.parse_args()
    if args.quick:
        args.schedules, args.runs, args.timeout, args.peer_timeout = 2_000, 1, 60.0, 120.0
    config = PeerConfig(whole_minute=not args.quick)  # smoke runs need not wait for a minute
    logs = Path(os.environ.get("CARILLON_BENCH_LOGS", "/tmp")) / f"peer-{os.getpid()}"
    logs.mkdir(parents=True, exist_ok=True)
    failures: list[str] = []
    python: Path | None = None
    try:
        python = ensure_venv()
    except PeerUnavailable as error:
        failures.append(str(error))
    results: Results = {"carillon-1": [], "carillon-2": [], PEER: []}
    with resolve_database() as database:
        for index in range(args.runs):
            run = one_run(database.url, args, python, config, logs)
            add_ratios(run)
            for side, figures in run.items():
                if isinstance(figures, dict):
                    results[side].append(figures)
                else:
                    failures.append(f"run {index + 1}: {figures}")
    text, clean = report(args, config, results, failures)
    print(text)
    if not args.quick:
        write_section("bench_peer", text)
    return 0 if clean else 1  # the ratio is a figure; a lost or repeated Carillon run is not


if __name__ == "__main__":
    raise SystemExit(main())
