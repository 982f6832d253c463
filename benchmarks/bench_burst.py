"""A top-of-minute burst on one node: N executions due at the same instant, run by ``noop``.

Creates a throwaway database (``carillon_burst_<hex>``) on the resolved server, fills it with
N schedules (default 200,000) over 20 tenants, all due at the same instant T (a 6-field daily
expression whose ``next_run_at`` is T, far enough ahead for creating and loading them), with
the ``noop`` task type (default retry policy). One real node runs in-process (PostgresLedger
on the bridge, real clock, default ``NodeConfig`` except its id, the log level, the worker
count and the dispatch pacing). A second thread polls the database with plain asyncpg every
0.5 s until all N have succeeded or the timeout runs out. Reported per configuration:

* ``lead_s``: T - max(enqueued_at) -- positive when the whole burst was durable before T;
* ``all_succeeded_s``: max(finished_at) - T (database clock), and ``executions_per_s`` =
  N / ``all_succeeded_s``, end to end;
* start delay (started_at - planned_at) p50 / p99 / max over all N, and per tenant: the p50
  of each, and Jain's fairness index of the tenants' mean delays (1.0: perfectly even);
* ``peak_rss_mb``: the process's VmRSS, sampled by the poller during the run;
* duplicates: executions with attempt > 1, extra rows per (schedule, planned_at), extra
  attempt rows per execution -- all must be 0;
* with pacing (``dispatch_rate_per_s`` R, smoothing window W): the starts per second since T,
  and the share started within 60 s of its instant (the SLO figure).

In the same run, after the engine, the raw ceiling for the same ledger writes: plain asyncpg
on a uvloop loop (no trio, no bridge, no engine), the executions table emptied and vacuumed,
N rows in sequential batches of 5,000: an ``unnest`` insert of the executions, then an
``unnest`` update claiming them (queued -> running), then one completing them (running ->
succeeded). Its rows/s for the whole cycle is compared with the engine's end-to-end rate (the
engine plans before T, so claim + complete alone is given too).

Target (issue #5): >= 10,000 executions/s end to end (200,000 in <= 20 s), zero duplicates,
on a 2-core machine with PostgreSQL on the same machine.

Usage: python benchmarks/bench_burst.py [--quick] [--schedules N] [--runs K]
       [--workers 32,128] [--rate R] [--window W] [--timeout S]
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import random
import resource
import secrets
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

from benchmarks._report import machine, revision, summary, write_section
from engine.clock import SystemClock
from engine.config import LogLevel, NodeConfig
from engine.core.hashing import partition_of
from engine.ledger.base import SchedulesCreate, TaskTypesPut
from engine.ledger.database import resolve_database, url_with_database
from engine.ledger.postgres import PARTITIONS_DEFAULT, migrate_database, open_postgres_ledger
from engine.model import HandlerKind, Schedule, TaskType, execution_id
from engine.node import Node

TENANTS: Final = 20
CREATE_BATCH: Final = 10_000
CEILING_BATCH: Final = 5_000
POLL_S: Final = 0.5
SLO_S: Final = 60.0
TARGET_PER_S: Final = 10_000.0

# --- the ceiling: minimal statements for the same writes, no engine code ----------------------

CEILING_INSERT: Final = """
INSERT INTO executions (execution_id, schedule_id, tenant_id, task_type, partition_id,
                        planned_at, status, attempt, enqueued_at, fencing_token)
SELECT u.execution_id, u.schedule_id, u.tenant_id, 'noop', u.partition_id, $5, 'queued', 0,
       now(), 1
FROM unnest($1::text[], $2::text[], $3::text[], $4::integer[])
     AS u (execution_id, schedule_id, tenant_id, partition_id)
ON CONFLICT DO NOTHING
"""

CEILING_CLAIM: Final = """
UPDATE executions AS e
SET status = 'running', attempt = e.attempt + 1, started_at = now(), finished_at = NULL,
    attempt_expires_at = now() + interval '60 seconds', not_before = NULL,
    error_code = NULL, error_message = NULL, fencing_token = 1, claimed_by = 'ceiling'
FROM unnest($1::text[]) AS u (execution_id)
WHERE e.execution_id = u.execution_id
  AND e.status IN ('queued', 'failed')
  AND e.startable_at <= now()
"""

CEILING_COMPLETE: Final = """
UPDATE executions AS e
SET status = 'succeeded', finished_at = now(), not_before = NULL, attempt_expires_at = NULL,
    error_code = NULL, error_message = NULL
FROM unnest($1::text[], $2::integer[]) AS u (execution_id, attempt)
WHERE e.execution_id = u.execution_id AND e.attempt = u.attempt AND e.status = 'running'
"""


@dataclass(frozen=True)
class Variant:
    """One row of the report: a worker count and a dispatch pacing."""

    workers: int
    rate_per_s: float = 0.0
    window_s: float = 0.0

    @property
    def label(self) -> str:
        if not self.rate_per_s:
            return f"{self.workers} workers, smoothing off"
        return f"{self.workers} workers, {self.rate_per_s:,.0f}/s over {self.window_s:g} s"


# --- helpers ---------------------------------------------------------------------------------


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


async def _execute(url: str, statements: tuple[str, ...]) -> None:
    connection = await asyncpg.connect(url)
    try:
        for statement in statements:
            await connection.execute(statement)
    finally:
        await connection.close()


def admin(url: str, *statements: str) -> None:
    uvloop.run(_execute(url, statements))


def schedule_ids(n: int) -> list[str]:
    return [f"s{i:07d}" for i in range(n)]


def tenant_of(schedule_id: str) -> str:
    return f"tenant-{int(schedule_id[1:]) % TENANTS:02d}"


# --- the engine ------------------------------------------------------------------------------


async def create_schedules(url: str, n: int) -> datetime:
    """Migrate, store the task type and N schedules due at one instant T; returns T."""
    await migrate_database(url, partitions=PARTITIONS_DEFAULT)
    async with open_postgres_ledger(url) as ledger:
        now = await ledger.database_now()
        # Creating runs at ~10k rows/s here, loading at ~60k/s, and the node plans a burst
        # N / 10k s ahead of its instant (burst_plan_rate_per_s), plus the 5 s lookahead.
        lead = timedelta(seconds=8 + n / 5_000 + n / 10_000)
        burst_at = (now + lead).replace(microsecond=0)
        expr = f"{burst_at.second} {burst_at.minute} {burst_at.hour} * * *"
        await ledger.task_types_put(TaskTypesPut(TaskType(name="noop", kind=HandlerKind.NOOP)))
        ids = schedule_ids(n)
        for first in range(0, n, CREATE_BATCH):
            batch = [
                Schedule(
                    schedule_id=sid,
                    tenant_id=tenant_of(sid),
                    cron_expr=expr,
                    timezone="UTC",
                    task_type="noop",
                    next_run_at=burst_at,
                )
                for sid in ids[first : first + CREATE_BATCH]
            ]
            await ledger.schedules_create(SchedulesCreate(batch))
    return burst_at


UNFINISHED: Final = """
SELECT EXISTS (SELECT 1 FROM executions WHERE status IN ('queued', 'failed'))
    OR EXISTS (SELECT 1 FROM executions WHERE status = 'running')
"""
"""Cheap while the burst runs: each stops at the first entry of a small partial index. (A
count there was not: without vacuum, every poll re-read the heap behind every dead index
entry of the burst -- measured as a fifth of the database's CPU.)"""

SUCCEEDED: Final = """
SELECT count(*) FROM executions WHERE planned_at = $1 AND status = 'succeeded'
"""


async def _poll(url: str, n: int, burst_at: datetime, timeout_s: float) -> dict[str, float]:
    connection = await asyncpg.connect(url)
    peak_rss, succeeded = rss_mb(), 0
    try:
        await asyncio.sleep(max((burst_at - datetime.now(UTC)).total_seconds(), 0.0))
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            peak_rss = max(peak_rss, rss_mb())
            if not await connection.fetchval(UNFINISHED):
                succeeded = await connection.fetchval(SUCCEEDED, burst_at)
                if succeeded >= n:
                    break
            await asyncio.sleep(POLL_S)
    finally:
        await connection.close()
    return {"peak_rss_mb": peak_rss}


def poll_until_succeeded(url: str, n: int, burst_at: datetime, timeout_s: float) -> dict[str, Any]:
    """Runs in its own thread and uvloop loop: from T, poll every 0.5 s until all N have
    succeeded or ``timeout_s`` has passed; samples the process's RSS meanwhile."""
    return uvloop.run(_poll(url, n, burst_at, timeout_s))


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
            polled = await trio.to_thread.run_sync(
                poll_until_succeeded, url, n, burst_at, timeout_s
            )
            nursery.cancel_scope.cancel()
    return polled


# --- figures from the ledger ------------------------------------------------------------------

FIGURES: Final = """
SELECT count(*) AS rows,
       count(*) FILTER (WHERE status = 'succeeded') AS succeeded,
       max(enqueued_at) AS last_enqueued,
       max(finished_at) AS last_finished,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM started_at - planned_at))
           AS delay_p50,
       percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM started_at - planned_at))
           AS delay_p99,
       max(extract(epoch FROM started_at - planned_at)) AS delay_max,
       count(*) FILTER (WHERE started_at - planned_at <= make_interval(secs => $2))
           AS within_slo,
       count(*) FILTER (WHERE attempt > 1) AS retried,
       count(*) - count(DISTINCT (schedule_id, planned_at)) AS duplicate_rows
FROM executions WHERE planned_at = $1
"""

EXTRA_ATTEMPTS: Final = """
SELECT coalesce(sum(n - 1), 0) FROM (
    SELECT count(*) AS n FROM execution_attempts GROUP BY execution_id HAVING count(*) > 1
) AS repeated
"""

PER_TENANT: Final = """
SELECT tenant_id,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM started_at - planned_at))
           AS p50,
       avg(extract(epoch FROM started_at - planned_at)) AS mean
FROM executions WHERE planned_at = $1 GROUP BY tenant_id ORDER BY tenant_id
"""

STARTS_PER_SECOND: Final = """
SELECT floor(extract(epoch FROM started_at - $1))::integer AS second, count(*) AS starts
FROM executions WHERE planned_at = $1 AND started_at IS NOT NULL GROUP BY 1 ORDER BY 1
"""


def jain(values: list[float]) -> float:
    """Jain's fairness index: (sum x)^2 / (n sum x^2); 1.0 when all are equal."""
    squares = sum(v * v for v in values)
    return sum(values) ** 2 / (len(values) * squares) if squares else 1.0


async def ledger_figures(url: str, n: int, burst_at: datetime, timeout_s: float) -> dict[str, Any]:
    connection = await asyncpg.connect(url)
    try:
        row = await connection.fetchrow(FIGURES, burst_at, SLO_S)
        extra_attempts = await connection.fetchval(EXTRA_ATTEMPTS)
        tenants = await connection.fetch(PER_TENANT, burst_at)
        starts = await connection.fetch(STARTS_PER_SECOND, burst_at)
    finally:
        await connection.close()
    done = row["succeeded"] == n
    # When the timeout ran out first, the rate is what succeeded over the timeout.
    elapsed_s = (
        (row["last_finished"].astimezone(UTC) - burst_at).total_seconds() if done else timeout_s
    )
    return {
        "rows": float(row["rows"]),
        "succeeded_share": row["succeeded"] / n,
        "lead_s": (burst_at - row["last_enqueued"].astimezone(UTC)).total_seconds(),
        "all_succeeded_s": elapsed_s if done else math.inf,
        "executions_per_s": row["succeeded"] / max(elapsed_s, 1e-3),
        "delay_p50_s": float(row["delay_p50"] or 0.0),
        "delay_p99_s": float(row["delay_p99"] or 0.0),
        "delay_max_s": float(row["delay_max"] or 0.0),
        "within_slo": row["within_slo"] / n,
        "duplicates": float(row["retried"] + row["duplicate_rows"] + extra_attempts),
        "tenant_p50_s": {r["tenant_id"]: float(r["p50"] or 0.0) for r in tenants},
        "jain": jain([float(r["mean"] or 0.0) for r in tenants]),
        "starts_per_s": [(r["second"], r["starts"]) for r in starts],
    }


# --- the raw ceiling -------------------------------------------------------------------------


async def _ceiling(url: str, n: int, burst_at: datetime) -> dict[str, float]:
    ids = schedule_ids(n)
    partitions = [partition_of(sid, PARTITIONS_DEFAULT) for sid in ids]
    batches = [
        (
            [execution_id(sid, burst_at) for sid in ids[i : i + CEILING_BATCH]],
            ids[i : i + CEILING_BATCH],
            [tenant_of(sid) for sid in ids[i : i + CEILING_BATCH]],
            partitions[i : i + CEILING_BATCH],
        )
        for i in range(0, n, CEILING_BATCH)
    ]
    connection = await asyncpg.connect(url)
    try:
        # The engine started on an empty executions table; so does the ceiling.
        await connection.execute("TRUNCATE executions, execution_attempts")
        await connection.execute("VACUUM ANALYZE executions, execution_attempts")
        seconds: dict[str, float] = {}
        for phase in ("insert", "claim", "complete"):
            done = 0
            started = time.perf_counter()
            for exec_ids, sids, tenants, parts in batches:
                if phase == "insert":
                    tag = await connection.execute(
                        CEILING_INSERT, exec_ids, sids, tenants, parts, burst_at
                    )
                elif phase == "claim":
                    tag = await connection.execute(CEILING_CLAIM, exec_ids)
                else:
                    tag = await connection.execute(CEILING_COMPLETE, exec_ids, [1] * len(exec_ids))
                done += int(tag.rsplit(" ", 1)[1])
            seconds[phase] = time.perf_counter() - started
            if done != n:
                raise RuntimeError(f"ceiling {phase}: {done} rows of {n}")
    finally:
        await connection.close()
    cycle = seconds["insert"] + seconds["claim"] + seconds["complete"]
    return {
        "ceiling_cycle_per_s": n / cycle,
        "ceiling_claim_complete_per_s": n / (seconds["claim"] + seconds["complete"]),
    }


# --- one run, the report ----------------------------------------------------------------------


def one_variant(
    server_url: str, n: int, variant: Variant, timeout_s: float, ceiling: bool
) -> dict[str, Any]:
    name = f"carillon_burst_{secrets.token_hex(4)}"
    admin(server_url, f'CREATE DATABASE "{name}"')
    url = url_with_database(server_url, name)
    try:
        burst_at = trio.run(create_schedules, url, n)
        result = trio.run(engine_phase, url, n, burst_at, variant, timeout_s)
        result |= uvloop.run(ledger_figures(url, n, burst_at, timeout_s))
        if ceiling:
            result |= uvloop.run(_ceiling(url, n, burst_at))
            result["ratio"] = result["executions_per_s"] / result["ceiling_cycle_per_s"]
    finally:
        admin(server_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    print(
        f"  {variant.label}: {result['executions_per_s']:,.0f} executions/s, "
        f"all succeeded after {result['all_succeeded_s']:.2f} s, lead {result['lead_s']:.2f} s",
        file=sys.stderr,
    )
    return result


def _spread(samples: list[float], digits: int = 2) -> str:
    median, low, high = summary(samples)
    if low == high:
        return f"{median:,.{digits}f}".replace("inf", "timeout")
    return f"{median:,.{digits}f} ({low:,.{digits}f}-{high:,.{digits}f})".replace("inf", "timeout")


ROWS: Final = (
    ("lead before T (s)", "lead_s", 2),
    ("T until all succeeded (s)", "all_succeeded_s", 2),
    ("share succeeded (by the timeout)", "succeeded_share", 4),
    ("executions/s end to end", "executions_per_s", 0),
    ("start delay p50 (s)", "delay_p50_s", 2),
    ("start delay p99 (s)", "delay_p99_s", 2),
    ("start delay max (s)", "delay_max_s", 2),
    (f"share started within {SLO_S:g} s", "within_slo", 4),
    ("Jain's index of tenant mean delays", "jain", 4),
    ("peak RSS (MB)", "peak_rss_mb", 0),
    ("duplicates", "duplicates", 0),
    ("raw ceiling rows/s, insert+claim+complete", "ceiling_cycle_per_s", 0),
    ("raw ceiling rows/s, claim+complete", "ceiling_claim_complete_per_s", 0),
    ("engine / ceiling (cycle)", "ratio", 2),
)


def figure_table(variants: list[Variant], results: dict[Variant, list[dict[str, Any]]]) -> str:
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


def report(
    args: argparse.Namespace, variants: list[Variant], results: dict[Variant, list[dict[str, Any]]]
) -> tuple[str, bool]:
    base = variants[0]
    met = all(
        summary([run["executions_per_s"] for run in results[v]])[0] >= TARGET_PER_S
        for v in variants
        if not v.rate_per_s
    )
    clean = all(
        run["duplicates"] == 0 and run["rows"] == args.schedules
        for v in variants
        for run in results[v]
    )
    lines = [
        "## Burst execution (`benchmarks/bench_burst.py`)",
        "",
        f"Machine: {machine()}; revision {revision()}; {args.runs} runs; one node in-process, "
        f"{PARTITIONS_DEFAULT} partitions, {args.schedules:,} `noop` schedules over {TENANTS} "
        "tenants all due at the same instant T; default node settings but the worker count and "
        "the dispatch pacing; PostgreSQL on the same machine (shared with other benchmarks). "
        "Median (min-max) over the runs.",
        "",
        figure_table(variants, results),
        "",
        "Fairness: " + "; ".join(f"{v.label}: {tenant_line(results[v])}" for v in variants) + ".",
        "",
        f"Target (>= {TARGET_PER_S:,.0f} executions/s end to end with smoothing off, zero "
        f"duplicates): {'met' if met and clean else 'NOT met'}. The raw ceiling (plain asyncpg, "
        f"uvloop, sequential batches of {CEILING_BATCH:,}) runs after the engine in the same "
        f"run, on the {base.label} database emptied and vacuumed.",
    ]
    for variant in variants:
        if variant.rate_per_s:
            lines += [
                "",
                f"Starts per second since T, {variant.label} (run 1):",
                "",
                "```",
                *starts_histogram(results[variant][0]),
                "```",
            ]
    return "\n".join(lines), clean


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run; docs are not written")
    parser.add_argument("--schedules", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--workers", default="32,128", help="comma-separated worker counts")
    parser.add_argument("--rate", type=float, default=5_000.0, help="paced row (0: none)")
    parser.add_argument("--window", type=float, default=10.0, help="smoothing window, s")
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds after T")
    args = parser.parse_args()
    if args.quick:
        args.schedules, args.runs, args.workers, args.timeout = 2_000, 1, "32", 30.0
        args.rate, args.window = 2_000.0, 1.0
    variants = [Variant(int(w)) for w in args.workers.split(",")]
    if args.rate:
        variants.append(Variant(variants[0].workers, args.rate, args.window))
    results: dict[Variant, list[dict[str, Any]]] = {v: [] for v in variants}
    with resolve_database() as database:
        for _ in range(args.runs):
            for index, variant in enumerate(variants):
                results[variant].append(
                    one_variant(database.url, args.schedules, variant, args.timeout, index == 0)
                )
    text, clean = report(args, variants, results)
    print(text)
    if not args.quick:
        write_section("bench_burst", text)
    return 0 if clean else 1  # a missed rate target is a figure; a lost or repeated run is not


if __name__ == "__main__":
    raise SystemExit(main())
