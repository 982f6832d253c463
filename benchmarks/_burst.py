"""The top-of-minute burst shared by the benchmarks: its schedules, its poller, its figures.

``bench_burst.py`` runs it on one node in-process and on K ``carillon run`` processes,
``bench_peer.py`` beside a peer, ``bench_failover.py`` with a node killed mid-burst. Every
burst lives in a throwaway database (:func:`fresh_database`) of the resolved server: N
schedules over ``TENANTS`` tenants, all due at one instant T, the ``noop`` task type. The
figures come from the ledger afterwards (:func:`ledger_figures`), database clock throughout:

* ``lead_s``: T - max(enqueued_at) -- positive when the whole burst was durable before T;
* ``all_succeeded_s``: max(finished_at) - T, and ``executions_per_s`` = N / that;
* start delay (started_at - planned_at) p50 / p99 / max, and per tenant its p1 / p25 / p50 /
  p75 / p99 and Jain's index of the tenants' mean delays;
* the contended period, from T until the first tenant has all its executions started: each
  tenant's share of the starts in it, and Jain's index of (share / weight share) -- 1.0
  when every tenant got what its weight entitles it to;
* duplicates: executions with attempt > 1, extra rows per (schedule, planned_at), extra
  attempt rows per execution -- all must be 0.
"""

from __future__ import annotations

import asyncio
import math
import resource
import secrets
import time
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final

import asyncpg
import uvloop

from engine.config import BURST_PLAN_RATE_PER_S_DEFAULT
from engine.ledger.database import url_with_database
from engine.ledger.params import SchedulesCreate, TaskTypesPut, TenantsPut
from engine.ledger.postgres import PARTITIONS_DEFAULT, migrate_database, open_postgres_ledger
from engine.model import HandlerKind, Schedule, TaskType, Tenant

TENANTS: Final = 20
CREATE_BATCH: Final = 10_000
POLL_S: Final = 0.5
SLO_S: Final = 60.0
DELAY_QUANTILES: Final = (0.01, 0.25, 0.5, 0.75, 0.99)
"""Per-tenant start-delay quantiles kept for the box plot (whiskers p1 and p99)."""


def tenant_id(index: int) -> str:
    return f"tenant-{index:02d}"


def schedule_ids(n: int) -> list[str]:
    return [f"s{i:07d}" for i in range(n)]


def tenant_of(schedule_id: str) -> str:
    return tenant_id(int(schedule_id[1:]) % TENANTS)


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def jain(values: list[float]) -> float:
    """Jain's fairness index: (sum x)^2 / (n sum x^2); 1.0 when all are equal."""
    squares = sum(v * v for v in values)
    return sum(values) ** 2 / (len(values) * squares) if squares else 1.0


# --- the database ----------------------------------------------------------------------------


async def _execute(url: str, statements: tuple[str, ...]) -> None:
    connection = await asyncpg.connect(url)
    try:
        for statement in statements:
            await connection.execute(statement)
    finally:
        await connection.close()


def admin(url: str, *statements: str) -> None:
    uvloop.run(_execute(url, statements))


def fresh_database(server_url: str, prefix: str) -> tuple[str, str]:
    """Create ``<prefix><hex>`` on the server; its name and URL (drop it with ``admin``)."""
    name = f"{prefix}{secrets.token_hex(4)}"
    admin(server_url, f'CREATE DATABASE "{name}"')
    return name, url_with_database(server_url, name)


async def create_schedules(
    url: str, n: int, weights: Mapping[str, int] | None = None, settle_s: float = 0.0
) -> datetime:
    """Migrate, store the task type, the tenants' ``weights`` (when given) and N schedules
    due at one instant T, ``settle_s`` later than one node needs; returns T."""
    await migrate_database(url, partitions=PARTITIONS_DEFAULT)
    async with open_postgres_ledger(url) as ledger:
        now = await ledger.database_now()
        # Creating runs at ~10k rows/s here, loading at ~60k/s, and the node plans a burst
        # N / 5k s ahead of its instant (burst_plan_rate_per_s), plus the 5 s lookahead.
        lead = timedelta(seconds=8 + n / 5_000 + n / BURST_PLAN_RATE_PER_S_DEFAULT + settle_s)
        burst_at = (now + lead).replace(microsecond=0)
        expr = f"{burst_at.second} {burst_at.minute} {burst_at.hour} * * *"
        await ledger.task_types_put(
            TaskTypesPut(TaskType(name="noop", kind=HandlerKind.NOOP, allowed_tenants=("*",)))
        )
        for tenant, weight in sorted((weights or {}).items()):
            await ledger.tenants_put(TenantsPut(Tenant(tenant_id=tenant, weight=weight)))
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


# --- the poller ------------------------------------------------------------------------------

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

WAL_POSITION: Final = "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint"
"""The server's write-ahead log position in bytes: the difference of two readings is the WAL
written between them. The server's, not the database's: whatever else writes to the server
meanwhile (another database's tests, a checkpoint's full-page images) counts too, so on a
shared server the figure is an upper bound."""


async def _poll(url: str, n: int, burst_at: datetime, timeout_s: float) -> dict[str, float]:
    connection = await asyncpg.connect(url)
    peak_rss, succeeded = rss_mb(), 0
    figures: dict[str, float] = {}
    try:
        await asyncio.sleep(max((burst_at - datetime.now(UTC)).total_seconds(), 0.0))
        wal_at_t = await connection.fetchval(WAL_POSITION)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            peak_rss = max(peak_rss, rss_mb())
            if not await connection.fetchval(UNFINISHED):
                succeeded = await connection.fetchval(SUCCEEDED, burst_at)
                if succeeded >= n:
                    break
            await asyncio.sleep(POLL_S)
        if succeeded >= n:
            wal_bytes = await connection.fetchval(WAL_POSITION) - wal_at_t
            figures["wal_per_execution_b"] = wal_bytes / n
    finally:
        await connection.close()
    return figures | {"peak_rss_mb": peak_rss}


def poll_until_succeeded(url: str, n: int, burst_at: datetime, timeout_s: float) -> dict[str, Any]:
    """Runs in its own thread and uvloop loop: from T, poll every 0.5 s until all N have
    succeeded or ``timeout_s`` has passed; samples this process's RSS meanwhile. With all N
    succeeded, also the WAL the server wrote per execution from T until it saw them all
    (``wal_per_execution_b``, :data:`WAL_POSITION`)."""
    return uvloop.run(_poll(url, n, burst_at, timeout_s))


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
       percentile_cont($2::float8[]) WITHIN GROUP (
           ORDER BY extract(epoch FROM started_at - planned_at)) AS quantiles,
       avg(extract(epoch FROM started_at - planned_at)) AS mean
FROM executions WHERE planned_at = $1 GROUP BY tenant_id ORDER BY tenant_id
"""

CONTENDED: Final = """
WITH cut AS (
    SELECT min(last_started) AS at FROM (
        SELECT max(started_at) AS last_started FROM executions
        WHERE planned_at = $1 GROUP BY tenant_id
    ) AS per_tenant
)
SELECT e.tenant_id, count(*) AS starts, extract(epoch FROM cut.at - $1) AS until_s
FROM executions AS e, cut
WHERE e.planned_at = $1 AND e.started_at <= cut.at
GROUP BY e.tenant_id, cut.at ORDER BY e.tenant_id
"""
"""Starts per tenant from T until the first tenant has had all its executions started: the
period in which every tenant still had work waiting, so the shares are the dispatcher's."""

STARTS_PER_SECOND: Final = """
SELECT floor(extract(epoch FROM started_at - $1))::integer AS second, count(*) AS starts
FROM executions WHERE planned_at = $1 AND started_at IS NOT NULL GROUP BY 1 ORDER BY 1
"""


def contended_figures(
    tenants: list[str], rows: list[asyncpg.Record], weights: Mapping[str, int] | None
) -> dict[str, Any]:
    """Each tenant's share of the contended starts; Jain's index of share / weight share
    over ``tenants`` (every tenant of the burst, a tenant without starts counting 0)."""
    starts = dict.fromkeys(tenants, 0.0) | {r["tenant_id"]: float(r["starts"]) for r in rows}
    total = sum(starts.values())
    weight = {t: float((weights or {}).get(t, 1)) for t in starts}
    weight_total = sum(weight.values())
    if not total or not weight_total:
        return {}
    shares = {t: s / total for t, s in starts.items()}
    ratios = [shares[t] / (weight[t] / weight_total) for t in starts]
    return {
        "contended_s": float(rows[0]["until_s"]),
        "tenant_share": shares,
        "share_jain": jain(ratios),
    }


async def ledger_figures(
    url: str,
    n: int,
    burst_at: datetime,
    timeout_s: float,
    weights: Mapping[str, int] | None = None,
) -> dict[str, Any]:
    """The burst's figures (module docstring), from the ledger once the burst has run;
    ``weights``: the tenants' weights, when not all 1."""
    connection = await asyncpg.connect(url)
    try:
        row = await connection.fetchrow(FIGURES, burst_at, SLO_S)
        extra_attempts = await connection.fetchval(EXTRA_ATTEMPTS)
        tenants = await connection.fetch(PER_TENANT, burst_at, list(DELAY_QUANTILES))
        contended = await connection.fetch(CONTENDED, burst_at)
        starts = await connection.fetch(STARTS_PER_SECOND, burst_at)
    finally:
        await connection.close()
    done = row["succeeded"] == n
    # When the timeout ran out first, the rate is what succeeded over the timeout.
    elapsed_s = (
        (row["last_finished"].astimezone(UTC) - burst_at).total_seconds() if done else timeout_s
    )
    last_enqueued = row["last_enqueued"]
    quantiles = {
        r["tenant_id"]: [float(q or 0.0) for q in r["quantiles"] or [0.0] * len(DELAY_QUANTILES)]
        for r in tenants
    }
    return {
        "rows": float(row["rows"]),
        "succeeded_share": row["succeeded"] / n,
        "lead_s": (burst_at - last_enqueued.astimezone(UTC)).total_seconds()
        if last_enqueued
        else -math.inf,
        "all_succeeded_s": elapsed_s if done else math.inf,
        "executions_per_s": row["succeeded"] / max(elapsed_s, 1e-3),
        "delay_p50_s": float(row["delay_p50"] or 0.0),
        "delay_p99_s": float(row["delay_p99"] or 0.0),
        "delay_max_s": float(row["delay_max"] or 0.0),
        "within_slo": row["within_slo"] / n,
        "duplicates": float(row["retried"] + row["duplicate_rows"] + extra_attempts),
        "tenant_delay_q": quantiles,
        "tenant_p50_s": {t: q[DELAY_QUANTILES.index(0.5)] for t, q in quantiles.items()},
        "jain": jain([float(r["mean"] or 0.0) for r in tenants]),
        "starts_per_s": [(r["second"], r["starts"]) for r in starts],
        **contended_figures(list(quantiles), contended, weights),
    }
