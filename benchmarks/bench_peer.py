"""The same top-of-minute burst on Carillon and on a peer, APScheduler 4, in the same run.

Each run, three sides one after another, each on a throwaway database
(``carillon_peer_<hex>``) of the resolved server, N schedules (default 20,000) due at one
instant T, a task that does no work:

* **Carillon, 1 node** and **Carillon, 2 nodes**: ``carillon run`` processes with default
  settings (``benchmarks/_nodes.py`` ``carillon_burst``, which ``bench_burst.py`` runs too)
  on the burst's schedules (``_burst.create_schedules``: 20 tenants, the ``noop`` task
  type, T some seconds ahead); the nodes start once the schedules exist and share the
  partitions before T. Figures from the ledger (``_burst.ledger_figures``): a run's time is
  its ``started_at``, "all ran" is the last ``finished_at`` (durable completion); duplicates
  are extra executions per (schedule, instant), redeliveries (attempt > 1) and extra
  attempt rows -- every handler delivery has an attempt row, so this counts deliveries
  beyond the first.
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
A full run also draws docs/img/bench-peer.png, writes docs/bench-results/bench_peer.json
and rebuilds the Targets section of docs/benchmarks.md.

Usage: python benchmarks/bench_peer.py [--quick] [--runs K] [--schedules N] [--timeout S]
       [--peer-timeout S]
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path
from typing import Any, Final

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import _plots
from benchmarks._burst import admin, fresh_database
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
from benchmarks.peers.drive import SCHEDULERS, PeerConfig, peer_burst
from benchmarks.peers.make_venv import PeerUnavailable, ensure_venv, pinned_version
from engine.config import LEASE_TTL_S_DEFAULT, WORKERS_DEFAULT
from engine.ledger.database import resolve_database
from engine.ledger.postgres import PARTITIONS_DEFAULT

TARGET_RATIO: Final = 10.0
PEER: Final = "apscheduler"
Results = dict[str, list[dict[str, Any]]]


CARILLON_KEPT: Final = (
    "setup_s", "setup_lead_s", "balanced", "rss_mb", "executions_per_s", "duplicates",
    "delay_p50_s", "delay_p99_s", "delay_max_s",
)  # fmt: skip
CARILLON_RENAMED: Final = {
    "lead_s": "planned_lead_s",
    "all_succeeded_s": "all_ran_s",
    "succeeded_share": "ran_share",
}


def carillon_side(server_url: str, n: int, k: int, timeout_s: float, logs: Path) -> dict[str, Any]:
    """``_nodes.carillon_burst``, its figures named as the peer's are."""
    figures = carillon_burst(server_url, n, k, timeout_s, logs, prefix="carillon_peer_")
    kept = {key: figures[key] for key in CARILLON_KEPT}
    return kept | {new: figures[old] for old, new in CARILLON_RENAMED.items()}


def apscheduler_burst(
    python: Path, server_url: str, n: int, config: PeerConfig, timeout_s: float, logs: Path
) -> dict[str, Any]:
    name, url = fresh_database(server_url, "carillon_peer_")
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
        figures = carillon_side(server_url, n, k, args.timeout, logs)
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
        "the ledger in batches of 10,000 (`benchmarks/_burst.py`). A run's time is "
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
    args: argparse.Namespace,
    config: PeerConfig,
    results: Results,
    failures: list[str],
    image: Path | None = None,
) -> tuple[str, bool]:
    versions = {run["version"] for run in results[PEER]}
    version = ", ".join(sorted(versions)) or pinned_version("apscheduler")
    sides = list(SIDES)
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
        *image_link(image, "Executions/s of each side, log scale"),
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


SIDES: Final = (("carillon-1", "Carillon, 1 node"), ("carillon-2", "Carillon, 2 nodes"))


def draw_plot(results: Results) -> Path | None:
    sides = [(title, key) for key, title in SIDES]
    if results[PEER]:
        sides.append((f"APScheduler, {SCHEDULERS} schedulers", PEER))
    rates = [
        (title, summary([run["executions_per_s"] for run in results[key]]))
        for title, key in sides
        if results[key]
    ]
    return _plots.draw(_plots.peer, "bench-peer.png", rates)


def save_results(args: argparse.Namespace, results: Results) -> None:
    figures = {
        f"{side}_executions_per_s": [run["executions_per_s"] for run in runs]
        for side, runs in results.items()
    }
    figures["rate_ratio"] = [
        run["rate_ratio"] for run in results["carillon-2"] if "rate_ratio" in run
    ]
    context = {"schedules": args.schedules, "runs": args.runs, "ratio_of": "carillon-2"}
    write_results("bench_peer", figures, context)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run; docs are not written")
    parser.add_argument("--schedules", type=int, default=20_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=180.0, help="Carillon, s after T")
    parser.add_argument("--peer-timeout", type=float, default=900.0, help="peer, s after T")
    args = parser.parse_args()
    if args.quick:
        # 500: the peer's T is set by a guessed setup rate (2,000 left it ~20 s idle before T).
        args.schedules, args.runs, args.timeout, args.peer_timeout = 500, 1, 60.0, 120.0
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
    image = None if args.quick else draw_plot(results)
    text, clean = report(args, config, results, failures, image)
    print(text)
    if not args.quick:
        write_section("bench_peer", text)
        save_results(args, results)
        write_targets()
    return 0 if clean else 1  # the ratio is a figure; a lost or repeated Carillon run is not


if __name__ == "__main__":
    raise SystemExit(main())
