"""The execution listings on a large ledger: what ``GET /v1/executions`` costs at 5M rows.

Any change to the indexes of ``executions`` (issue #27: fewer of them, partial ones, a
separate history table) must leave these listings no slower than today, so this measures
today's on a ledger shaped like real history and keeps it for the comparison:

* **build** (in a scratch database, ``carillon_listing_<hex>``, migrated as a node would
  find it): N executions (default 5,000,000; ``--rows``) of S schedules (default N / 50)
  over T tenants (default S / 50), written by one ``INSERT ... SELECT generate_series`` --
  not through the engine: minutes matter. The schedules are created through the ledger.
  Tenants own schedules unevenly (Zipf weights ``1 / rank^0.7``: the biggest of 2,000 holds
  3 % of them, the median one 0.03 %); 2 % of the schedules fire hourly, 8 % every 6 hours,
  90 % daily, each at its own minute, over a window ending now (~29 days at the defaults),
  plus a horizon into the future that holds 0.5 % of the rows, queued. Of the past fires,
  ~97 % succeeded at the first attempt, 2 % failed once then succeeded (one ``failed`` row
  in ``execution_attempts``) and 0.5 % were dead-lettered after 5 attempts (4 ``failed``
  rows and a ``dead-letter`` row). Ids are the engine's (``schedule_id:planned_at``, checked
  against :func:`engine.model.execution_id` on a sample). Rows are inserted in planned
  order, as a planner inserts them, so one schedule's rows lie on different heap pages. The
  indexes of ``executions`` and ``execution_attempts`` are dropped for the load and built
  again from their own definitions afterwards (faster; a freshly built B-tree is denser than
  one grown by inserts, which favours every layout measured this way alike); then
  ``VACUUM ANALYZE``.
* **timing**: the engine's own listing (``PostgresLedger.executions_query``, the statement
  of ``engine/ledger/postgres/sql.py`` ``executions_query`` behind ``GET /v1/executions``
  and ``GET /v1/dead-letters``), called from trio through the bridge, page size 100 (the
  API's default), ``--samples`` times per kind over random keys (a uniformly random
  schedule; the tenant of another random schedule, so tenants are picked in proportion to
  their schedules), the kinds interleaved, on one pooled connection; ``--rounds`` times
  (default 3) over the same keys. A deep page resumes from the cursor of the key's row 90 %
  of the way through its history. p50 / p95 / p99 in ms per kind, each the median over the
  rounds; and how many calls ran a custom plan and how many the generic one, read from the
  connection's ``pg_prepared_statements`` (PostgreSQL plans a prepared statement for its
  values five times, then settles on the generic plan if its estimate is no worse).
* **plans**: ``EXPLAIN (ANALYZE, BUFFERS)`` of each kind, for the busiest schedule and the
  biggest tenant, run as a prepared statement: its custom plan and its generic plan (one
  when they are alike).
* **sizes** of both tables and each of their indexes.

``--keep`` keeps the database; ``--reuse NAME`` times a kept one again without building
(a changed index layout, migrated onto the same data, compared with the same rows). A full
run writes its section of docs/benchmarks.md and docs/bench-results/bench_listing.json;
``--quick`` (20,000 rows) and ``--no-docs`` write neither.

Usage: python benchmarks/bench_listing.py [--quick] [--no-docs] [--rows N] [--samples K]
       [--rounds R] [--keep] [--reuse NAME] [--seed N]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import secrets
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final

import asyncpg
import trio
import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._report import machine, revision, summary, write_results, write_section
from engine.api.endpoint import PAGE_SIZE_DEFAULT
from engine.core.hashing import partition_of
from engine.ledger.common import decode_planned_cursor, encode_planned_cursor
from engine.ledger.database import resolve_database, url_with_database
from engine.ledger.params import ExecutionsQuery, SchedulesCreate, TaskTypesPut
from engine.ledger.postgres import (
    PARTITIONS_DEFAULT,
    migrate_database,
    open_postgres_ledger,
    sql,
)
from engine.model import (
    MAX_ATTEMPTS_DEFAULT,
    ExecutionStatus,
    HandlerKind,
    Schedule,
    TaskType,
    execution_id,
)

ROWS_DEFAULT: Final = 5_000_000
ROWS_QUICK: Final = 20_000
PER_SCHEDULE: Final = 50
"""Executions per schedule on average (N / S), and schedules per tenant (S / T)."""
ZIPF_S: Final = 0.7
CLASSES: Final = (
    (1, 60, "{m} * * * *"),
    (4, 360, "{m} {h6}-23/6 * * *"),
    (45, 1440, "{m} {h} * * *"),
)
"""(schedules in every 50, period in minutes, cron): hourly, every 6 hours, daily."""
FUTURE_SHARE: Final = 0.005
DEAD_PER_MILLE: Final = 5
RETRIED_PER_MILLE: Final = 20
PAGE: Final = PAGE_SIZE_DEFAULT
"""The API's page size when a request names none."""
DEPTH: Final = 0.9
CREATE_BATCH: Final = 10_000
PREFIX: Final = "carillon_listing_"
DEAD = str(ExecutionStatus.DEAD_LETTER)
QUEUED = str(ExecutionStatus.QUEUED)

Timings = dict[str, list[float]]
"""One round of timing: per kind, ms per call; and per kind, rows returned and plans run."""

# --- the ledger's shape ------------------------------------------------------------------------


@dataclass(frozen=True)
class Shape:
    rows: int
    schedules: int
    tenants: int
    seed: int

    @property
    def rate_per_min(self) -> float:
        """Fires per minute of all the schedules together (a class's share is of every 50
        schedules, so it is exact when ``schedules`` is a multiple of 50)."""
        return sum(self.schedules * share / 50 / period for share, period, _ in CLASSES)

    @property
    def span_min(self) -> int:
        """Minutes from the first fire to the end of the future horizon."""
        return max(round(self.rows / self.rate_per_min), 60)

    @property
    def future_min(self) -> int:
        return max(round(self.span_min * FUTURE_SHARE), 1)


def schedule_plan(shape: Shape) -> list[tuple[str, str, int, int, int, str]]:
    """Per schedule: (id, tenant, partition, period in minutes, phase in minutes, cron)."""
    rng = random.Random(shape.seed)
    weights = [1 / (rank + 1) ** ZIPF_S for rank in range(shape.tenants)]
    owners = rng.choices(range(shape.tenants), weights=weights, k=shape.schedules)
    plan = []
    for n, owner in enumerate(owners):
        slot, bound = n % 50, 0
        for share, period, cron in CLASSES:  # noqa: B007 - the class found is used below
            bound += share
            if slot < bound:
                break
        phase = rng.randrange(period)
        schedule_id = f"s{n:07d}"
        expr = cron.format(m=phase % 60, h=phase // 60 % 24, h6=phase // 60 % 6)
        plan.append(
            (
                schedule_id,
                f"tenant-{owner:04d}",
                partition_of(schedule_id, PARTITIONS_DEFAULT),
                period,
                phase,
                expr,
            )
        )
    return plan


FIRES: Final = """
CREATE TEMPORARY TABLE listing_fires AS
SELECT s.schedule_id, s.tenant_id, s.partition_id, f.at,
       abs(hashtext(s.schedule_id || ':' || f.k)::bigint) % 1000 AS r
FROM listing_plan AS s
CROSS JOIN LATERAL generate_series(0, ($2::integer - s.phase - 1) / s.period) AS g (k)
CROSS JOIN LATERAL (
    SELECT g.k, $1::timestamptz + make_interval(mins => s.phase + g.k * s.period) AS at
) AS f
WHERE f.at >= $1::timestamptz + make_interval(mins => $2::integer - $3::integer)
"""
"""Every fire of every schedule: ``$1`` the grid's origin (midnight), ``$2`` the minutes from
it to the end of the future horizon, ``$3`` the span; ``r`` a fixed draw in [0, 1000)."""

LOAD: Final = f"""
INSERT INTO executions (
    execution_id, schedule_id, tenant_id, task_type, partition_id, planned_at, status,
    attempt, enqueued_at, started_at, finished_at, error_code, error_message, fencing_token,
    claimed_by)
SELECT execution_id, schedule_id, tenant_id, 'noop', partition_id, at, status, attempt,
       least(at, $1) - interval '1 minute', started_at,
       started_at + interval '200 milliseconds',
       CASE WHEN status = '{DEAD}' THEN 'http_503' END,
       CASE WHEN status = '{DEAD}' THEN 'Service Unavailable' END,
       1, CASE WHEN started_at IS NOT NULL THEN 'node-' || r % 3 END
FROM (
    SELECT f.*,
           f.schedule_id || ':' || to_char(f.at AT TIME ZONE 'UTC',
                                           'YYYY-MM-DD"T"HH24:MI:SS"Z"') AS execution_id,
           CASE WHEN f.at > $1 THEN '{QUEUED}' WHEN f.r < {DEAD_PER_MILLE} THEN '{DEAD}'
                ELSE 'succeeded' END AS status,
           CASE WHEN f.at > $1 THEN 0 WHEN f.r < {DEAD_PER_MILLE} THEN {MAX_ATTEMPTS_DEFAULT}
                WHEN f.r < {DEAD_PER_MILLE + RETRIED_PER_MILLE} THEN 2 ELSE 1 END AS attempt,
           CASE WHEN f.at <= $1 THEN f.at + make_interval(secs => 0.05 + f.r / 2000.0
               + 10 * (CASE WHEN f.r < {DEAD_PER_MILLE} THEN {MAX_ATTEMPTS_DEFAULT - 1}
                            WHEN f.r < {DEAD_PER_MILLE + RETRIED_PER_MILLE} THEN 1
                            ELSE 0 END))
           END AS started_at
    FROM listing_fires AS f
) AS fire
ORDER BY at, schedule_id
"""
"""The executions, in planned order: queued after ``$1`` (now), else succeeded (attempt 1,
or 2 after a failure, 10 s later) or dead-lettered after the default number of attempts,
10 s apart."""

HISTORY: Final = f"""
INSERT INTO execution_attempts (
    execution_id, attempt, outcome, started_at, finished_at, error_code, error_message,
    claimed_by)
SELECT e.execution_id, a.n,
       CASE WHEN e.status = '{DEAD}' AND a.n = e.attempt THEN '{DEAD}' ELSE 'failed' END,
       e.planned_at + make_interval(secs => 0.05 + 10 * (a.n - 1)),
       e.planned_at + make_interval(secs => 0.25 + 10 * (a.n - 1)),
       'http_503', 'Service Unavailable', e.claimed_by
FROM executions AS e
CROSS JOIN LATERAL generate_series(
    1, CASE WHEN e.status = '{DEAD}' THEN e.attempt ELSE e.attempt - 1 END) AS a (n)
WHERE e.attempt > 1
ORDER BY e.planned_at, e.execution_id, a.n
"""
"""The history the engine keeps: every attempt that did not succeed (a succeeded one lives
on the execution row only)."""

INDEXES: Final = """
SELECT c.relname AS table_name, i.relname AS index_name, pg_get_indexdef(i.oid) AS definition,
       x.indisprimary AS primary_key
FROM pg_index AS x
JOIN pg_class AS i ON i.oid = x.indexrelid
JOIN pg_class AS c ON c.oid = x.indrelid
WHERE c.relname = ANY($1::text[])
ORDER BY c.relname, x.indisprimary DESC, i.relname
"""

LOADED_TABLES: Final = ("executions", "execution_attempts")


@dataclass
class Build:
    """What building the ledger took, and how it came out."""

    seconds: dict[str, float] = field(default_factory=dict)
    built_at: str = ""
    statuses: dict[str, int] = field(default_factory=dict)
    attempts: int = 0
    first: datetime | None = None
    last: datetime | None = None


async def create_schedules(url: str, plan: list[tuple[str, str, int, int, int, str]]) -> None:
    """Migrate, store the task type and the schedules (through the ledger, as an API would)."""
    await migrate_database(url, partitions=PARTITIONS_DEFAULT)
    async with open_postgres_ledger(url) as ledger:
        await ledger.task_types_put(
            TaskTypesPut(TaskType(name="noop", kind=HandlerKind.NOOP, allowed_tenants=("*",)))
        )
        for first in range(0, len(plan), CREATE_BATCH):
            batch = [
                Schedule(schedule_id=sid, tenant_id=tenant, cron_expr=cron, task_type="noop")
                for sid, tenant, _, _, _, cron in plan[first : first + CREATE_BATCH]
            ]
            await ledger.schedules_create(SchedulesCreate(batch))


async def load(url: str, shape: Shape, plan: list[tuple[str, str, int, int, int, str]]) -> Build:
    """The executions and their history, written in bulk with the indexes dropped."""
    build = Build()
    connection = await asyncpg.connect(url)
    try:
        await connection.execute("SET maintenance_work_mem = '512MB'")
        await connection.execute("SET work_mem = '256MB'")
        await connection.execute("SET synchronous_commit = off")  # a bulk load; nothing waits
        now = (await connection.fetchval("SELECT now()")).replace(second=0, microsecond=0)
        end = now + timedelta(minutes=shape.future_min)
        start = end - timedelta(minutes=shape.span_min)
        origin = start.replace(hour=0, minute=0)
        to_end = round((end - origin).total_seconds() / 60)
        indexes = await connection.fetch(INDEXES, list(LOADED_TABLES))
        await connection.execute(
            "CREATE TEMPORARY TABLE listing_plan (schedule_id text, tenant_id text, "
            "partition_id integer, period integer, phase integer)"
        )
        await connection.copy_records_to_table("listing_plan", records=[row[:5] for row in plan])

        started = time.perf_counter()
        async with connection.transaction():
            for row in indexes:
                if row["primary_key"]:
                    await connection.execute(
                        f"ALTER TABLE {row['table_name']} DROP CONSTRAINT {row['index_name']}"
                    )
                else:
                    await connection.execute(f"DROP INDEX {row['index_name']}")
            await connection.execute(FIRES, origin, to_end, shape.span_min)
            await connection.execute(LOAD, now)
            await connection.execute(HISTORY)
        build.seconds["load"] = time.perf_counter() - started

        started = time.perf_counter()
        for row in indexes:
            if row["primary_key"]:
                columns = row["definition"].split(" USING btree ", 1)[1]
                await connection.execute(
                    f"ALTER TABLE {row['table_name']} ADD CONSTRAINT {row['index_name']} "
                    f"PRIMARY KEY {columns}"
                )
            else:
                await connection.execute(row["definition"])
        build.seconds["indexes"] = time.perf_counter() - started
    finally:
        await connection.close()
    return build


async def finish_build(url: str, build: Build) -> None:
    """VACUUM ANALYZE, the shape as built, and the ids checked against the engine's."""
    connection = await asyncpg.connect(url)
    try:
        started = time.perf_counter()
        for table in (*LOADED_TABLES, "schedules"):
            await connection.execute(f"VACUUM ANALYZE {table}")
        build.seconds["vacuum analyze"] = time.perf_counter() - started
        build.built_at = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
        note = json.dumps({"built_at": build.built_at, "seconds": build.seconds})
        name = await connection.fetchval("SELECT current_database()")
        # Kept with the database, for a later --reuse to report how it was built.
        await connection.execute(f"COMMENT ON DATABASE \"{name}\" IS '{note}'")
        await describe(connection, build)
        sample = await connection.fetch(
            "SELECT execution_id, schedule_id, planned_at FROM executions "
            "TABLESAMPLE SYSTEM (1) REPEATABLE (7) LIMIT 2000"
        )
        for row in sample:
            expected = execution_id(row["schedule_id"], row["planned_at"])
            if row["execution_id"] != expected:
                raise RuntimeError(f"id {row['execution_id']!r} is not the engine's {expected!r}")
    finally:
        await connection.close()


async def describe(connection: asyncpg.Connection, build: Build) -> None:
    """The ledger as it is (and, kept with the database, when and how fast it was built)."""
    note = await connection.fetchval(
        "SELECT shobj_description(oid, 'pg_database') FROM pg_database "
        "WHERE datname = current_database()"
    )
    if note and not build.built_at:
        kept = json.loads(note)
        build.built_at, build.seconds = kept["built_at"], kept["seconds"]
    rows = await connection.fetch("SELECT status, count(*) FROM executions GROUP BY status")
    build.statuses = {row["status"]: row["count"] for row in rows}
    build.attempts = await connection.fetchval("SELECT count(*) FROM execution_attempts")
    build.first, build.last = await connection.fetchrow(
        "SELECT min(planned_at), max(planned_at) FROM executions"
    )


# --- the listings --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Key:
    """What one sample lists: a schedule, a tenant, and the deep pages' cursors."""

    schedule_id: str
    tenant_id: str
    schedule_cursor: str
    tenant_cursor: str
    dead_cursor: str


@dataclass(frozen=True)
class Kind:
    label: str
    request: str
    """The HTTP request it serves."""
    query: Callable[[Key], ExecutionsQuery]


KINDS: Final = (
    Kind(
        "by schedule, first page",
        "GET /v1/executions?schedule_id=S",
        lambda k: ExecutionsQuery(schedule_id=k.schedule_id, limit=PAGE),
    ),
    Kind(
        "by schedule, deep page",
        "GET /v1/executions?schedule_id=S&cursor=C",
        lambda k: ExecutionsQuery(schedule_id=k.schedule_id, cursor=k.schedule_cursor, limit=PAGE),
    ),
    Kind(
        "by schedule, status=dead-letter",
        "GET /v1/dead-letters?schedule_id=S",
        lambda k: ExecutionsQuery(
            schedule_id=k.schedule_id, status=ExecutionStatus.DEAD_LETTER, limit=PAGE
        ),
    ),
    Kind(
        "by schedule, status=queued",
        "GET /v1/executions?schedule_id=S&status=queued",
        lambda k: ExecutionsQuery(
            schedule_id=k.schedule_id, status=ExecutionStatus.QUEUED, limit=PAGE
        ),
    ),
    Kind(
        "by tenant, first page",
        "GET /v1/executions?tenant_id=T",
        lambda k: ExecutionsQuery(tenant_id=k.tenant_id, limit=PAGE),
    ),
    Kind(
        "by tenant, deep page",
        "GET /v1/executions?tenant_id=T&cursor=C",
        lambda k: ExecutionsQuery(tenant_id=k.tenant_id, cursor=k.tenant_cursor, limit=PAGE),
    ),
    Kind(
        "by tenant, status=dead-letter",
        "GET /v1/dead-letters?tenant_id=T",
        lambda k: ExecutionsQuery(
            tenant_id=k.tenant_id, status=ExecutionStatus.DEAD_LETTER, limit=PAGE
        ),
    ),
    Kind(
        "by tenant, status=queued",
        "GET /v1/executions?tenant_id=T&status=queued",
        lambda k: ExecutionsQuery(tenant_id=k.tenant_id, status=ExecutionStatus.QUEUED, limit=PAGE),
    ),
    Kind(
        "dead letters, first page",
        "GET /v1/dead-letters",
        lambda k: ExecutionsQuery(status=ExecutionStatus.DEAD_LETTER, limit=PAGE),
    ),
    Kind(
        "dead letters, deep page",
        "GET /v1/dead-letters?cursor=C",
        lambda k: ExecutionsQuery(
            status=ExecutionStatus.DEAD_LETTER, cursor=k.dead_cursor, limit=PAGE
        ),
    ),
)

DEEP_ROW: Final = """
SELECT planned_at, execution_id FROM (
    SELECT planned_at, execution_id, row_number() OVER (ORDER BY planned_at, execution_id) AS n,
           count(*) OVER () AS total
    FROM executions WHERE {where}
) AS listed
WHERE n = greatest(1, floor({depth} * total)::bigint)
"""
"""The row a client reaches ``depth`` of the way through a listing: its cursor resumes there."""


async def deep_cursor(connection: asyncpg.Connection, where: str, *arguments: Any) -> str:
    row = await connection.fetchrow(DEEP_ROW.format(where=where, depth=DEPTH), *arguments)
    if row is None:  # nothing listed at all: any cursor lists nothing after it
        return encode_planned_cursor(datetime.now(UTC), "")
    return encode_planned_cursor(row["planned_at"], row["execution_id"])


async def pick_keys(url: str, samples: int, seed: int) -> tuple[list[Key], Key]:
    """``samples`` random keys, and the heaviest one (the busiest schedule, the biggest
    tenant) for the plans."""
    rng = random.Random(seed)
    connection = await asyncpg.connect(url)
    try:
        schedules = await connection.fetch(
            "SELECT schedule_id, tenant_id FROM schedules WHERE deleted_at IS NULL "
            "ORDER BY schedule_id"
        )
        busiest = await connection.fetchval(
            "SELECT schedule_id FROM executions GROUP BY schedule_id "
            "ORDER BY count(*) DESC, schedule_id LIMIT 1"
        )
        biggest = await connection.fetchval(
            "SELECT tenant_id FROM executions GROUP BY tenant_id "
            "ORDER BY count(*) DESC, tenant_id LIMIT 1"
        )
        dead = await deep_cursor(connection, f"status = '{DEAD}'")
        by_schedule: dict[str, str] = {}
        by_tenant: dict[str, str] = {}

        async def key(schedule_id: str, tenant_id: str) -> Key:
            if schedule_id not in by_schedule:
                by_schedule[schedule_id] = await deep_cursor(
                    connection, "schedule_id = $1", schedule_id
                )
            if tenant_id not in by_tenant:
                by_tenant[tenant_id] = await deep_cursor(connection, "tenant_id = $1", tenant_id)
            return Key(schedule_id, tenant_id, by_schedule[schedule_id], by_tenant[tenant_id], dead)

        keys = [
            await key(rng.choice(schedules)["schedule_id"], rng.choice(schedules)["tenant_id"])
            for _ in range(samples)
        ]
        return keys, await key(busiest, biggest)
    finally:
        await connection.close()


async def time_listings(url: str, keys: list[Key]) -> Timings:
    """Milliseconds per call of each kind, through ``PostgresLedger`` (the bridge, the pool,
    the prepared statements, the rows decoded), the kinds interleaved in a rotating order; a
    first round untimed. One pooled connection, so that its plan cache can be read after:
    how often each statement ran a custom plan and how often the generic one."""
    timings: Timings = {kind.label: [] for kind in KINDS}
    rows: dict[str, int] = {kind.label: 0 for kind in KINDS}
    async with open_postgres_ledger(url, pool_max=1) as ledger:
        for n, key in enumerate([keys[0], *keys]):
            for shift in range(len(KINDS)):
                kind = KINDS[(n + shift) % len(KINDS)]
                query = kind.query(key)
                started = time.perf_counter()
                page = await ledger.executions_query(query)
                spent = time.perf_counter() - started
                if n:
                    timings[kind.label].append(1000 * spent)
                    rows[kind.label] += len(page.items)
        counts = await ledger._run(_plan_counts, None)  # the pool's one connection
    for kind in KINDS:
        statement = statement_of(kind.query(keys[0]))[0]
        custom, generic = counts.get(statement.strip(), (0, 0))
        timings[f"{kind.label} rows"] = [rows[kind.label] / len(keys)]
        timings[f"{kind.label} plans"] = [custom, generic]
    return timings


async def _plan_counts(store: Any, _: None) -> dict[str, tuple[int, int]]:
    """Per prepared statement of a pooled connection: (custom plans, generic plans) run."""
    async with store.connection() as connection:
        rows = await connection.fetch(
            "SELECT statement, custom_plans, generic_plans FROM pg_prepared_statements"
        )
    return {row["statement"].strip(): (row["custom_plans"], row["generic_plans"]) for row in rows}


# --- plans and sizes ----------------------------------------------------------------------------

PREPARED: Final = "listing_plan_probe"


def _literal(value: Any) -> str:
    if isinstance(value, datetime):
        return f"'{value.isoformat()}'::timestamptz"
    if isinstance(value, int):
        return str(value)
    return "'" + str(value).replace("'", "''") + "'::text"


def statement_of(query: ExecutionsQuery) -> tuple[str, list[str], list[Any]]:
    """The engine's statement for ``query`` (as ``executions_query`` builds it), its
    parameters' types and values."""
    after = None if query.cursor is None else decode_planned_cursor(query.cursor)
    types: list[str] = []
    values: list[Any] = []
    for value in (query.schedule_id, query.tenant_id):
        if value is not None:
            types.append("text")
            values.append(str(value))
    if after is not None:
        types += ["timestamptz", "text"]
        values += list(after)
    types.append("bigint")
    values.append(query.limit + 1)
    statement = sql.executions_query(
        schedule=query.schedule_id is not None,
        tenant=query.tenant_id is not None,
        status=query.status,
        planned_from=False,
        planned_to=False,
        after=after is not None,
    )
    return statement, types, values


PLAN_MODES: Final = (("custom", "force_custom_plan"), ("generic", "force_generic_plan"))


async def explain(url: str, heaviest: Key) -> dict[str, list[tuple[str, str]]]:
    """Each kind's plans for the heaviest key, run as a prepared statement: the custom plan
    (made for the values given; a connection's first five executions of a statement get one)
    and the generic one (made for any values; later executions get it when its estimated cost
    is no worse). One plan when both are alike."""
    plans: dict[str, list[tuple[str, str]]] = {}
    connection = await asyncpg.connect(url)
    try:
        for kind in KINDS:
            statement, types, values = statement_of(kind.query(heaviest))
            found: list[tuple[str, str]] = []
            for label, mode in PLAN_MODES:
                await connection.execute(f"SET plan_cache_mode = {mode}")
                await connection.execute(f"PREPARE {PREPARED} ({', '.join(types)}) AS {statement}")
                lines = await connection.fetch(
                    f"EXPLAIN (ANALYZE, BUFFERS) EXECUTE {PREPARED} "
                    f"({', '.join(map(_literal, values))})"
                )
                await connection.execute(f"DEALLOCATE {PREPARED}")
                found.append((label, "\n".join(line[0] for line in lines)))
            if plan_shape(found[0][1]) == plan_shape(found[1][1]):
                found = [("custom and generic alike", found[0][1])]
            plans[kind.label] = found
    finally:
        await connection.close()
    return plans


def plan_shape(plan: str) -> list[str]:
    """The nodes of a plan, without their figures, conditions or values."""
    return [
        line.split("  (cost", 1)[0].strip().removeprefix("->").strip()
        for line in plan.splitlines()
        if "(cost=" in line
    ]


SIZES: Final = """
SELECT c.relname AS name, coalesce(t.relname, c.relname) AS table_name,
       c.relkind = 'i' AS is_index, pg_relation_size(c.oid) AS bytes,
       coalesce(pg_get_indexdef(c.oid), '') AS definition
FROM pg_class AS c
LEFT JOIN pg_index AS x ON x.indexrelid = c.oid
LEFT JOIN pg_class AS t ON t.oid = x.indrelid
WHERE coalesce(t.relname, c.relname) = ANY($1::text[]) AND c.relkind IN ('r', 'i')
ORDER BY table_name DESC, is_index, name
"""


async def sizes(url: str) -> list[tuple[str, str, bool, int, str]]:
    connection = await asyncpg.connect(url)
    try:
        rows = await connection.fetch(SIZES, list(LOADED_TABLES))
        return [tuple(row.values()) for row in rows]
    finally:
        await connection.close()


# --- the report -----------------------------------------------------------------------------------


def percentile(samples: list[float], q: float) -> float:
    """The ``q`` quantile (0..1), nearest rank."""
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def _mb(value: int) -> str:
    return f"{value / 2**20:,.1f}"


def report(
    args: argparse.Namespace,
    name: str,
    build: Build,
    rounds: list[Timings],
    plans: dict[str, list[tuple[str, str]]],
    relations: list[tuple[str, str, bool, int, str]],
    heaviest: Key,
    loads: tuple[tuple[float, ...], tuple[float, ...]],
) -> str:
    total = sum(build.statuses.values())
    statuses = ", ".join(
        f"{status} {count:,} ({count / total:.1%})"
        for status, count in sorted(build.statuses.items(), key=lambda item: -item[1])
    )
    span = ""
    if build.first and build.last:
        span = (
            f", planned from {build.first:%Y-%m-%d %H:%M} to {build.last:%Y-%m-%d %H:%M} UTC "
            f"({(build.last - build.first).total_seconds() / 86_400:.1f} days)"
        )
    built = f"built {build.built_at or 'earlier'}"
    if build.seconds:
        built += " in " + ", ".join(f"{k} {v:,.0f} s" for k, v in build.seconds.items())
    if args.reuse:
        built += ", timed again here (`--reuse`)"
    before, after = loads
    lines = [
        f"## Listing queries on a {rows_label(total)}-execution ledger "
        "(`benchmarks/bench_listing.py`)",
        "",
        f"Machine: {machine()}; revision {revision()}; PostgreSQL on the same machine. "
        "**The machine is shared: other sessions' builds, tests and benchmarks ran on it "
        f"during this run** (load average {_load(before)} at the start, {_load(after)} at the "
        "end, over 1 / 5 / 15 min): read the figures as today's order of magnitude, and compare "
        "a layout with today's on the same data in one sitting (`--reuse`).",
        "",
        f"Ledger: {total:,} executions of {args.schedules_built:,} schedules over "
        f"{args.tenants_built:,} tenants{span}: {statuses}; {build.attempts:,} rows of attempt "
        f"history. Database `{name}`, {built}. Tenants own schedules unevenly (Zipf, "
        f"1 / rank^{ZIPF_S}); 2 % of the schedules fire hourly, 8 % every 6 hours, 90 % daily; "
        "rows inserted in planned order (the module docstring has the whole shape).",
        "",
        f"Each call is `PostgresLedger.executions_query` from trio (bridge, pooled connection, "
        f"prepared statement, rows decoded), page size {PAGE}, over {args.samples:,} random "
        "keys per kind (a random schedule; the tenant of another random schedule, so tenants "
        "in proportion to their schedules), the kinds interleaved, on one pooled connection, "
        f"in {len(rounds)} round{'s' if len(rounds) > 1 else ''} over the same keys (a new "
        "connection each). A deep page "
        f"resumes at the key's row {DEPTH:.0%} of the way through its listing. ms per call: "
        "each percentile's median over the rounds (min-max); *plans* is how many of the "
        "calls of the first round ran a custom plan (made for the values) and how many the "
        "generic one (read from `pg_prepared_statements` of that connection; two kinds that "
        "differ only in the status filtered share one statement, and so their counts):",
        "",
        "| kind | request | rows returned (mean) | p50 ms | p95 ms | p99 ms "
        "| plans: custom / generic |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    first = rounds[0]
    for kind in KINDS:
        returned = first[f"{kind.label} rows"][0]
        custom, generic = first[f"{kind.label} plans"]
        cells = [_spread([percentile(r[kind.label], q) for r in rounds]) for q in (0.5, 0.95, 0.99)]
        lines.append(
            f"| {kind.label} | `{kind.request}` | {returned:,.1f} | {' | '.join(cells)} "
            f"| {custom:,.0f} / {generic:,.0f} |"
        )
    lines += [
        "",
        "Sizes (after `VACUUM ANALYZE`):",
        "",
        "| relation | of table | MB | definition |",
        "|---|---|---:|---|",
    ]
    for relation, table, is_index, size, definition in relations:
        shown = definition.split(" USING ", 1)[-1] if is_index else "(heap)"
        lines.append(f"| `{relation}` | {table} | {_mb(size)} | `{shown}` |")
    heap = sum(size for _, table, is_index, size, _ in relations if table == "executions")
    lines += [
        "",
        f"`executions` with its indexes: {_mb(heap)} MB, {heap / max(total, 1):,.0f} bytes "
        "per execution.",
        "",
        "<details><summary>Plans: <code>EXPLAIN (ANALYZE, BUFFERS)</code> of each kind for "
        f"the busiest schedule (<code>{heaviest.schedule_id}</code>) and the biggest tenant "
        f"(<code>{heaviest.tenant_id}</code>), run as a prepared statement: the custom plan "
        "and the generic one, or one plan where both are alike</summary>",
        "",
    ]
    for kind in KINDS:
        for label, plan in plans[kind.label]:
            lines += [f"{kind.label} ({label}):", "", "```", plan, "```", ""]
    lines += [
        "</details>",
        "",
        "Reproduce: `make bench-listing` (build and timing; `LISTING_ARGS='--rows N'` for "
        "another size). "
        "`python benchmarks/bench_listing.py --keep` keeps the database and prints how to time "
        "it again (`--reuse NAME`), e.g. after migrating it to another index layout.",
    ]
    return "\n".join(lines)


def rows_label(rows: int) -> str:
    """5M for 5,000,007 (within 1 % of a whole number of millions); else the number."""
    millions = round(rows / 1_000_000)
    if millions and abs(rows - millions * 1_000_000) <= rows / 100:
        return f"{millions}M"
    return f"{rows:,}"


def _spread(samples: list[float]) -> str:
    median, low, high = summary(samples)
    return f"{median:.2f}" if low == high else f"{median:.2f} ({low:.2f}-{high:.2f})"


def _load(values: tuple[float, ...]) -> str:
    return " / ".join(f"{value:.2f}" for value in values)


def save_results(args: argparse.Namespace, total: int, rounds: list[Timings]) -> None:
    """Each kind's percentiles, one value per round."""
    figures: dict[str, list[float]] = {}
    for kind in KINDS:
        slug = kind.label.replace(", ", "_").replace(" ", "_").replace("=", "_")
        for q in (0.5, 0.95, 0.99):
            figures[f"{slug}_p{round(q * 100)}_ms"] = [percentile(r[kind.label], q) for r in rounds]
    context = {
        "rows": total,
        "samples": args.samples,
        "rounds": len(rounds),
        "page": PAGE,
        "depth": DEPTH,
    }
    write_results("bench_listing", figures, context)


# --- main ---------------------------------------------------------------------------------------


def admin(url: str, *statements: str) -> None:
    async def run() -> None:
        connection = await asyncpg.connect(url)
        try:
            for statement in statements:
                await connection.execute(statement)
        finally:
            await connection.close()

    uvloop.run(run())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run; docs are not written")
    parser.add_argument("--no-docs", action="store_true", help="print only")
    parser.add_argument("--rows", type=int, default=ROWS_DEFAULT)
    parser.add_argument("--schedules", type=int, help=f"default rows / {PER_SCHEDULE}")
    parser.add_argument("--tenants", type=int, help=f"default schedules / {PER_SCHEDULE}")
    parser.add_argument("--samples", type=int, default=300, help="calls per kind and round")
    parser.add_argument("--rounds", type=int, default=3, help="timings of the same keys")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--keep", action="store_true", help="keep the database")
    parser.add_argument("--reuse", metavar="NAME", help="time a kept database; no build")
    args = parser.parse_args()
    if args.quick:
        args.rows, args.samples, args.rounds = ROWS_QUICK, 20, 1
    args.schedules = args.schedules or max(args.rows // PER_SCHEDULE, 1)
    args.tenants = args.tenants or max(args.schedules // PER_SCHEDULE, 1)
    if min(args.rows, args.schedules, args.tenants, args.samples, args.rounds) < 1:
        parser.error("--rows, --schedules, --tenants, --samples and --rounds must be positive")
    if args.reuse and not args.reuse.startswith(PREFIX):
        parser.error(f"--reuse takes a database this benchmark kept ({PREFIX}...)")
    shape = Shape(args.rows, args.schedules, args.tenants, args.seed)
    load_before = os.getloadavg()
    with resolve_database() as database:
        name = args.reuse or f"{PREFIX}{secrets.token_hex(4)}"
        url = url_with_database(database.url, name)
        keep = args.keep or bool(args.reuse)
        if args.reuse and not uvloop.run(_count(database.url, DATABASE_EXISTS, name)):
            parser.error(f"no database {name!r} on {database.redacted_url} to reuse")
        if not args.reuse:
            admin(database.url, f'CREATE DATABASE "{name}"')
        try:
            build = Build()
            if args.reuse:
                uvloop.run(_describe(url, build))
            else:
                plan = schedule_plan(shape)
                started = time.perf_counter()
                trio.run(create_schedules, url, plan)
                seconds = time.perf_counter() - started
                build = uvloop.run(load(url, shape, plan))
                build.seconds = {"schedules": seconds, **build.seconds}
                uvloop.run(finish_build(url, build))
            total = sum(build.statuses.values())
            print(f"ledger {name}: {total:,} executions; timing", file=sys.stderr)
            keys, heaviest = uvloop.run(pick_keys(url, args.samples, args.seed))
            args.schedules_built = uvloop.run(_count(url, "SELECT count(*) FROM schedules"))
            args.tenants_built = uvloop.run(
                _count(url, "SELECT count(DISTINCT tenant_id) FROM schedules")
            )
            rounds = []
            for n in range(args.rounds):
                rounds.append(trio.run(time_listings, url, keys))
                print(f"  round {n + 1} of {args.rounds} timed", file=sys.stderr)
            plans = uvloop.run(explain(url, heaviest))
            relations = uvloop.run(sizes(url))
        finally:
            if not keep:
                admin(database.url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        text = report(
            args, name, build, rounds, plans, relations, heaviest, (load_before, os.getloadavg())
        )
        print(text)
        if keep:
            print(
                f"\nKept database {name}. Time it again: python benchmarks/bench_listing.py "
                f"--reuse {name}\nDrop it: psql {database.redacted_url} -c "
                f"'DROP DATABASE \"{name}\" WITH (FORCE)'",
                file=sys.stderr,
            )
    if not (args.quick or args.no_docs):
        write_section("bench_listing", text)
        save_results(args, total, rounds)
    return 0


async def _describe(url: str, build: Build) -> None:
    connection = await asyncpg.connect(url)
    try:
        await describe(connection, build)
    finally:
        await connection.close()


DATABASE_EXISTS: Final = "SELECT count(*) FROM pg_database WHERE datname = $1"


async def _count(url: str, query: str, *arguments: Any) -> int:
    connection = await asyncpg.connect(url)
    try:
        value: int = await connection.fetchval(query, *arguments)
        return value
    finally:
        await connection.close()


if __name__ == "__main__":
    raise SystemExit(main())
