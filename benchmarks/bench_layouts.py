"""What each execution costs PostgreSQL after T, under candidate layouts of the ledger.

The design instrument behind ``docs/ledger.md``, "What each execution writes, and the layout
that halves it": for each candidate index layout of ``executions`` and each way of writing
an attempt, the WAL and the database CPU one execution costs, measured side by side in one run.

Each variant gets a scratch database migrated to today's schema, then changed into the
candidate layout (indexes dropped, or the "split" layout below), and N queued executions
planned an hour ago (the insert's WAL is measured too: what planning pays before T). After an
untimed ``VACUUM ANALYZE`` and a ``CHECKPOINT`` (every variant starts with the same full-page
image state), the after-T writes run in batches of 1,000 over two connections, as the node's
two claimers and two completion writers do:

* ``recorded``: a claim (queued -> running) then a completion (running -> succeeded), today's
  path for every execution;
* ``folded``: one write from queued to succeeded (the claim folded into the completion).

The statements are the minimal ones (``benchmarks/_ceiling.py``'s kind, with the engine's
``status || ''`` form so only the primary key is used), not the engine's fenced ones: the
layouts are compared, not the engine. WAL comes from ``EXPLAIN (ANALYZE, WAL)`` of every
statement, so it is this run's alone even on a shared server; CPU is read from ``/proc`` for
the two backends only. The share of updates that were HOT comes from ``pg_stat_user_tables``.

Layouts (today's ``executions`` has nine indexes; see ``docs/ledger.md``, "Schema"):

* ``today``;
* one index dropped at a time: the per-tenant due index, the listing-by-schedule index and the
  retention index, then those three together;
* ``lean``: the primary key, the due index and the partial indexes on running and dead-letter
  rows only (no listing index at all: the issue's "lean" candidate, listing queries excluded);
* ``split``: the due indexes and the ones on running and dead-letter rows move to a small
  ``execution_queue`` table (a row per execution not finished: insert when planned, delete
  when finished), so no index of ``executions`` depends on a column an attempt changes and its
  updates can be HOT (``fillfactor`` 40 leaves the room); retention reads ``(partition_id,
  planned_at)``. The listing indexes stay.

Usage: python benchmarks/bench_layouts.py [--rows N] [--rounds R] [--quick] [--no-docs]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import secrets
import statistics
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final

import asyncpg
import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._burst import url_with_database
from benchmarks._report import machine, revision, write_section
from engine.core.hashing import partition_of
from engine.ledger.database import resolve_database
from engine.ledger.postgres import PARTITIONS_DEFAULT
from engine.ledger.postgres.migrate import migrate
from engine.model import execution_id

BATCH: Final = 1_000
PLAN_BATCH: Final = 5_000
CONNECTIONS: Final = 2
TENANTS: Final = 200
SPLIT: Final = "split"

TENANT_DUE: Final = "executions_tenant_startable_idx"
BY_SCHEDULE: Final = "executions_schedule_idx"
RETENTION: Final = "executions_retention_idx"
BY_TENANT: Final = "executions_tenant_idx"
ON_STATUS: Final = (
    "executions_startable_idx",
    TENANT_DUE,
    "executions_running_expiry_idx",
    RETENTION,
    "executions_dead_letter_idx",
    "executions_running_task_type_idx",
)
"""Every index of today's executions whose key or predicate holds a column an attempt changes."""

LAYOUTS: Final[dict[str, tuple[str, ...] | str]] = {
    "today": (),
    "without the per-tenant due index": (TENANT_DUE,),
    "without the listing-by-schedule index": (BY_SCHEDULE,),
    "without the retention index": (RETENTION,),
    "without those three": (TENANT_DUE, BY_SCHEDULE, RETENTION),
    "lean (no listing indexes)": (TENANT_DUE, BY_SCHEDULE, RETENTION, BY_TENANT),
    "split (queue table, HOT history)": SPLIT,
}

SPLIT_SCHEMA: Final = """
CREATE TABLE execution_queue (
    execution_id text PRIMARY KEY, partition_id integer NOT NULL, tenant_id text NOT NULL,
    startable_at timestamptz NOT NULL);
CREATE INDEX execution_queue_due_idx ON execution_queue (startable_at, execution_id);
CREATE INDEX execution_queue_tenant_idx ON execution_queue (tenant_id, startable_at, execution_id);
ALTER TABLE execution_queue SET (autovacuum_enabled = false);
CREATE INDEX executions_purge_idx ON executions (partition_id, planned_at);
ALTER TABLE executions SET (fillfactor = 40);
"""

PLAN: Final = """
INSERT INTO executions (execution_id, schedule_id, tenant_id, task_type, partition_id,
                        planned_at, status, attempt, enqueued_at, fencing_token)
SELECT u.e, u.s, u.t, 'noop', u.p, $5, 'queued', 0, now(), 1
FROM unnest($1::text[], $2::text[], $3::text[], $4::integer[]) AS u (e, s, t, p)
"""
PLAN_QUEUE: Final = """
INSERT INTO execution_queue
SELECT u.e, u.p, u.t, $4 FROM unnest($1::text[], $3::text[], $2::integer[]) AS u (e, t, p)
"""
CLAIM: Final = """
UPDATE executions AS e
SET status = 'running', attempt = e.attempt + 1, started_at = now(), finished_at = NULL,
    attempt_expires_at = now() + interval '60 seconds', not_before = NULL,
    error_code = NULL, error_message = NULL, fencing_token = 2, claimed_by = 'node-1'
WHERE e.execution_id = ANY($1::text[]) AND e.status || '' IN ('queued', 'failed')
  AND e.startable_at <= now()
"""
COMPLETE: Final = """
UPDATE executions AS e
SET status = 'succeeded', finished_at = now(), not_before = NULL, attempt_expires_at = NULL,
    error_code = NULL, error_message = NULL, fencing_token = 2
WHERE e.execution_id = ANY($1::text[]) AND e.attempt = 1 AND e.status || '' = 'running'
"""
FINISH: Final = """
UPDATE executions AS e
SET status = 'succeeded', attempt = e.attempt + 1, started_at = now(), finished_at = now(),
    not_before = NULL, attempt_expires_at = NULL, error_code = NULL, error_message = NULL,
    fencing_token = 2, claimed_by = 'node-1'
WHERE e.execution_id = ANY($1::text[]) AND e.attempt = 0
  AND e.status || '' IN ('queued', 'failed')
"""
DEQUEUE: Final = "DELETE FROM execution_queue WHERE execution_id = ANY($1::text[])"
MODES: Final = ("recorded", "folded")


@dataclass(frozen=True)
class Result:
    layout: str
    mode: str
    rate: float
    postgres_us: float
    wal_after: float
    wal_plan: float
    fpi_after: float
    """Full-page images after T per 1,000 executions: every checkpoint on the server (another
    session's ``DROP DATABASE`` asks for one) makes the next write to each page log it whole."""
    hot: float


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Wal:
    """WAL written by this run's statements: bytes, and how many were full-page images."""

    bytes: int = 0
    fpi: int = 0

    async def add(self, connection: asyncpg.Connection, statement: str, *args: Any) -> None:
        plan = await connection.fetchval(
            "EXPLAIN (ANALYZE, WAL, TIMING OFF, COSTS OFF, FORMAT JSON) " + statement, *args
        )
        node = json.loads(plan)[0]["Plan"]
        self.bytes += int(node.get("WAL Bytes", 0))
        self.fpi += int(node.get("WAL FPI", 0))


async def one(server_url: str, layout: str, mode: str, n: int) -> Result:
    name = "carillon_layouts_" + secrets.token_hex(4)
    admin = await asyncpg.connect(server_url)
    await admin.execute(f'CREATE DATABASE "{name}"')
    url = url_with_database(server_url, name)
    connections: list[asyncpg.Connection] = []
    try:
        main = await asyncpg.connect(url)
        connections.append(main)
        await migrate(main, partitions=PARTITIONS_DEFAULT)
        change = LAYOUTS[layout]
        split = change == SPLIT
        for index in ON_STATUS if split else change:
            await main.execute(f"DROP INDEX {index}")
        if split:
            await main.execute(SPLIT_SCHEMA)
        await main.execute("ALTER TABLE executions SET (autovacuum_enabled = false)")
        at = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=1)
        rng = random.Random(n)
        schedules = [f"sch_{i:08x}{rng.randrange(1 << 32):08x}" for i in range(n)]
        ids = [execution_id(s, at) for s in schedules]
        tenants = [f"tenant-{i % TENANTS}" for i in range(n)]
        partitions = [partition_of(s, PARTITIONS_DEFAULT) for s in schedules]
        wal_plan = Wal()
        for i in range(0, n, PLAN_BATCH):
            part = slice(i, i + PLAN_BATCH)
            await wal_plan.add(
                main, PLAN, ids[part], schedules[part], tenants[part], partitions[part], at
            )
            if split:
                await wal_plan.add(main, PLAN_QUEUE, ids[part], partitions[part], tenants[part], at)
        await main.execute("VACUUM ANALYZE executions")
        if split:
            await main.execute("VACUUM ANALYZE execution_queue")
        await main.execute("CHECKPOINT")
        writers = [await asyncpg.connect(url) for _ in range(CONNECTIONS)]
        connections.extend(writers)
        pids = [await w.fetchval("SELECT pg_backend_pid()") for w in writers]
        batches = [ids[i : i + BATCH] for i in range(0, n, BATCH)]
        rng.shuffle(batches)
        wal_after = Wal()

        async def write(connection: asyncpg.Connection, mine: list[list[str]]) -> None:
            for batch in mine:
                if mode == "folded":
                    await wal_after.add(connection, FINISH, batch)
                else:
                    await wal_after.add(connection, CLAIM, batch)
                    await wal_after.add(connection, COMPLETE, batch)
                if split:
                    await wal_after.add(connection, DEQUEUE, batch)

        cpu_before = sum(_cpu_s(pid) for pid in pids)
        started = time.perf_counter()
        await asyncio.gather(*(write(w, batches[k::CONNECTIONS]) for k, w in enumerate(writers)))
        elapsed = time.perf_counter() - started
        cpu = sum(_cpu_s(pid) for pid in pids) - cpu_before
        for w in writers:
            await w.execute("SELECT pg_stat_force_next_flush()")
        await asyncio.sleep(1.0)
        stats = await main.fetchrow(
            "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = 'executions'"
        )
        finished = await main.fetchval("SELECT count(*) FROM executions WHERE status = 'succeeded'")
        if finished != n:
            raise RuntimeError(f"{layout}/{mode}: {finished} of {n} executions succeeded")
        return Result(
            layout,
            mode,
            rate=n / elapsed,
            postgres_us=cpu / n * 1e6,
            wal_after=wal_after.bytes / n,
            wal_plan=wal_plan.bytes / n,
            fpi_after=wal_after.fpi / n * 1000,
            hot=stats["n_tup_hot_upd"] / max(stats["n_tup_upd"], 1),
        )
    finally:
        for connection in connections:
            await connection.close()
        await admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
        await admin.close()


async def run_all(server_url: str, n: int, rounds: int) -> list[Result]:
    keys = [(layout, mode) for layout in LAYOUTS for mode in MODES]
    results: list[Result] = []
    for r in range(rounds):
        for layout, mode in keys if r % 2 == 0 else keys[::-1]:  # ABBA across rounds
            result = await one(server_url, layout, mode, n)
            print(
                f"  round {r + 1}: {layout}, {mode}: {result.postgres_us:.1f} us, "
                f"WAL {result.wal_after:.0f} B after T ({result.fpi_after:.0f} FPI per 1,000)",
                flush=True,
            )
            results.append(result)
    return results


def report(n: int, rounds: int, results: list[Result]) -> str:
    def median(layout: str, mode: str, field: str) -> float:
        return statistics.median(
            getattr(r, field) for r in results if r.layout == layout and r.mode == mode
        )

    base_wal = median("today", "recorded", "wal_after") + median("today", "recorded", "wal_plan")
    base_cpu = median("today", "recorded", "postgres_us")
    lines = [
        f"{n:,} executions per variant, batches of {BATCH:,} over {CONNECTIONS} connections, "
        f"medians of {rounds} rounds in ABBA order; revision {revision()}, "
        f"{datetime.now(UTC):%Y-%m-%d}; {machine()}; shared machine (CPU figures are noisy, "
        "WAL figures are exact per statement).",
        "",
        "| layout | attempt written | PostgreSQL CPU after T (µs) | WAL after T (B) "
        "| full-page images after T per 1,000 | WAL planning (B) | WAL both, of today's recorded "
        "| HOT updates |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for layout in LAYOUTS:
        for mode in MODES:
            wal_after = median(layout, mode, "wal_after")
            wal_plan = median(layout, mode, "wal_plan")
            cpu = median(layout, mode, "postgres_us")
            lines.append(
                f"| {layout} | {mode} | {cpu:.1f} ({cpu / base_cpu:.2f}) | {wal_after:,.0f} "
                f"| {median(layout, mode, 'fpi_after'):.0f} | {wal_plan:,.0f} "
                f"| {(wal_after + wal_plan) / base_wal:.2f} "
                f"| {median(layout, mode, 'hot'):.0%} |"
            )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="smoke run; docs are not written")
    parser.add_argument("--no-docs", action="store_true", help="print only: no docs")
    args = parser.parse_args()
    if args.quick:
        args.rows, args.rounds = 2_000, 1
    with resolve_database() as database:
        results = uvloop.run(run_all(database.url, args.rows, args.rounds))
    text = report(args.rows, args.rounds, results)
    print(text)
    if not (args.quick or args.no_docs):
        write_section("bench_layouts", text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
