"""Ledger throughput against the raw asyncpg ceiling, and what retention costs.

Plans, claims and completes N executions (default 200,000) through ``PostgresLedger`` in
batches of 5,000 -- one fenced transaction and one bridge hop per call -- and, in the same run
and the same database, two references driven by plain asyncpg on a uvloop loop (no trio, no
bridge, no engine code around them):

* ``ceiling``: the minimal equivalent statements per batch: for plan, ``INSERT ... SELECT
  FROM unnest(...) ON CONFLICT DO NOTHING`` of the executions plus ``UPDATE ... FROM
  unnest(...)`` of the schedules' ``next_run_at``, in one transaction (what a plan must
  write); ``UPDATE ... FROM unnest(...)`` in autocommit for claim and complete. The target is
  engine >= 70 % of it.
* ``engine SQL``: the engine's own statements (``engine/ledger/postgres/sql.py``) in the same
  transactions, with every argument prepared beforehand. engine -> engine SQL is the cost of
  the engine's Python and the bridge; engine SQL -> ceiling is the cost of what the engine's
  SQL does beyond the minimal statement (fence check, schedule locks and advances, the
  checkpoint, the attempt history, returned rows, BEGIN/COMMIT for plan; claim and complete
  are single statements that check their fences themselves).

Fairness: every variant starts from the same state (executions and attempts truncated, the
tables vacuumed and analyzed, autovacuum off on the benchmark database's tables so that it
cannot fire inside one variant only), handles the same rows in the same batches over the same
indexes, and the order of the variants rotates from run to run. ANALYZE runs, untimed,
between plan, claim and complete of every variant alike.

Batches: the database is migrated with P = N / 5,000 partitions and the schedule ids are
picked so that each partition holds exactly 5,000 of them, so every call carries a full batch
of one partition (a planner writes one partition per transaction) and the 4 concurrent callers
work on different partitions, as four planners would. Every execution is planned one hour in
the past, so that it is startable at once.

Retention (``--no-retention`` skips it): ``executions_purge`` deleting N succeeded executions
(and their attempt rows) in batches of 5,000, then the VACUUM it leaves behind, against
detaching and dropping one day's partition holding the same rows in a table range-partitioned
by ``planned_at`` (built beside the real one just for this), and what that layout costs the
hot path (the ceiling statements on a 7-day partitioned table).

Usage: python benchmarks/bench_ledger.py [--quick] [--runs N] [--rows N] [--no-retention]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import secrets
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Final

import asyncpg
import trio
import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._report import machine, revision, summary, write_section
from engine.core.hashing import partition_of
from engine.ledger.bridge import open_bridge
from engine.ledger.database import resolve_database, url_with_database
from engine.ledger.params import (
    Completion,
    ExecutionsClaim,
    ExecutionsComplete,
    ExecutionsDue,
    ExecutionsPlan,
    ExecutionsPurge,
    Fence,
    LeasesAcquire,
    Outcome,
    PlannedExecution,
    ScheduleAdvance,
    SchedulesCreate,
    TaskTypesPut,
)
from engine.ledger.postgres import migrate_database, open_postgres_ledger, sql, sql_executions
from engine.ledger.postgres.rows import int_array, text_array, timestamptz_array
from engine.model import HandlerKind, Schedule, TaskType, execution_id

BATCH_ROWS: Final = 5_000
CALLERS: Final = (1, 4)
TENANTS: Final = 50
CREATE_BATCH: Final = 10_000
OWNER: Final = "bench-ledger"
LEASE_TTL_S: Final = 3_600.0
ATTEMPT_LEASE_S: Final = 3_600.0
TARGET: Final = 0.70
OPERATIONS: Final = ("plan", "claim", "complete")
VARIANTS: Final = ("engine", "engine SQL", "ceiling")
RETENTION_DAYS: Final = 7
BENCH_TABLES: Final = (
    "schedules",
    "executions",
    "execution_attempts",
    "planner_checkpoints",
    "partition_leases",
)

# --- the ceiling: minimal equivalent statements, written here, no engine code ----------------

CEILING_INSERT: Final = """
INSERT INTO {table} (execution_id, schedule_id, tenant_id, task_type, partition_id, planned_at,
                     status, attempt, enqueued_at, fencing_token)
SELECT u.execution_id, u.schedule_id, u.tenant_id, u.task_type, $6, u.planned_at, 'queued', 0,
       now(), $7
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::timestamptz[])
     AS u (execution_id, schedule_id, tenant_id, task_type, planned_at)
ON CONFLICT DO NOTHING
"""

CEILING_CLAIM: Final = """
UPDATE {table} AS e
SET status = 'running', attempt = e.attempt + 1, started_at = now(), finished_at = NULL,
    attempt_expires_at = now() + make_interval(secs => $2), not_before = NULL,
    error_code = NULL, error_message = NULL, fencing_token = $3, claimed_by = $4
FROM unnest($1::text[]) AS u (execution_id)
WHERE e.execution_id = u.execution_id
  AND e.status IN ('queued', 'failed')
  AND e.startable_at <= now()
"""

CEILING_COMPLETE: Final = """
UPDATE {table} AS e
SET status = 'succeeded', finished_at = now(), not_before = NULL, attempt_expires_at = NULL,
    error_code = NULL, error_message = NULL
FROM unnest($1::text[], $2::integer[]) AS u (execution_id, attempt)
WHERE e.execution_id = u.execution_id AND e.attempt = u.attempt AND e.status = 'running'
"""


@dataclass(frozen=True)
class Batch:
    """One call's worth of rows (one partition), in every shape the variants need."""

    fence: Fence
    planned_at: datetime
    schedule_ids: list[str]
    tenant_ids: list[str]
    execution_ids: list[str]
    plan: ExecutionsPlan
    claim: ExecutionsClaim
    complete: ExecutionsComplete

    @property
    def size(self) -> int:
        return len(self.execution_ids)


@dataclass
class RunResult:
    seconds: dict[tuple[str, int, str], float] = field(default_factory=dict)
    """(variant, callers, operation) -> seconds for all rows."""
    statement_ms: dict[tuple[str, str], float] = field(default_factory=dict)
    """(operation, statement) -> ms per batch, engine SQL with one caller."""
    retention: dict[str, float] = field(default_factory=dict)


# --- workload -------------------------------------------------------------------------------


def balanced_schedule_ids(rows: int, partitions: int) -> list[list[str]]:
    """Schedule ids, exactly ``rows / partitions`` of them in each partition."""
    quota = rows // partitions
    buckets: list[list[str]] = [[] for _ in range(partitions)]
    full, n = 0, 0
    while full < partitions:
        schedule_id = f"s{n:07d}"
        n += 1
        bucket = buckets[partition_of(schedule_id, partitions)]
        if len(bucket) < quota:
            bucket.append(schedule_id)
            full += len(bucket) == quota
    return buckets


def make_batches(buckets: list[list[str]], fences: list[Fence], at: datetime) -> list[Batch]:
    batches = []
    for schedule_ids, fence in zip(buckets, fences, strict=True):
        tenants = [f"tenant-{int(s[1:]) % TENANTS:02d}" for s in schedule_ids]
        ids = [execution_id(s, at) for s in schedule_ids]
        fires = [
            PlannedExecution(s, t, "noop", at) for s, t in zip(schedule_ids, tenants, strict=True)
        ]
        advances = [ScheduleAdvance(s, at + timedelta(hours=1), 1) for s in schedule_ids]
        done = [Completion(i, 1, Outcome.SUCCEEDED) for i in ids]
        batches.append(
            Batch(
                fence=fence,
                planned_at=at,
                schedule_ids=schedule_ids,
                tenant_ids=tenants,
                execution_ids=ids,
                plan=ExecutionsPlan(fence, fires, advances, at),
                claim=ExecutionsClaim([fence], ids, ATTEMPT_LEASE_S, OWNER),
                complete=ExecutionsComplete([fence], done),
            )
        )
    return batches


async def prepare(url: str, buckets: list[list[str]]) -> tuple[list[Fence], datetime]:
    """Migrate, create the schedules through the ledger, take every partition's lease."""
    await migrate_database(url, partitions=len(buckets))
    async with open_postgres_ledger(url) as ledger:
        now = await ledger.database_now()
        planned_at = (now - timedelta(hours=1)).replace(second=0, microsecond=0)
        schedules = [
            Schedule(
                schedule_id=schedule_id,
                tenant_id=f"tenant-{int(schedule_id[1:]) % TENANTS:02d}",
                cron_expr="0 * * * *",
                task_type="noop",
                next_run_at=planned_at,
            )
            for bucket in buckets
            for schedule_id in bucket
        ]
        await ledger.task_types_put(
            TaskTypesPut(TaskType(name="noop", kind=HandlerKind.NOOP, allowed_tenants=("*",)))
        )
        for n in range(0, len(schedules), CREATE_BATCH):
            await ledger.schedules_create(SchedulesCreate(schedules[n : n + CREATE_BATCH]))
        leases = await ledger.leases_acquire(
            LeasesAcquire(OWNER, list(range(len(buckets))), LEASE_TTL_S)
        )
    if len(leases) != len(buckets):
        raise RuntimeError(f"took {len(leases)} leases of {len(buckets)}")
    return [Fence(lease.partition_id, OWNER, lease.fencing_token) for lease in leases], planned_at


# --- plain asyncpg helpers (uvloop, main thread) ----------------------------------------------


async def _execute(url: str, statements: tuple[str, ...]) -> None:
    connection = await asyncpg.connect(url)
    try:
        for statement in statements:  # one by one: VACUUM refuses a multi-statement string
            await connection.execute(statement)
    finally:
        await connection.close()


def admin(url: str, *statements: str) -> None:
    uvloop.run(_execute(url, statements))


def reset(url: str) -> None:
    """The starting state of every variant: no executions, clean and analyzed tables."""
    admin(
        url,
        "TRUNCATE executions, execution_attempts",
        "DELETE FROM planner_checkpoints",
        "VACUUM ANALYZE " + ", ".join(BENCH_TABLES),
    )


def rows_of(status: str) -> int:
    """The row count of a command tag such as ``UPDATE 5000``."""
    return int(status.rsplit(" ", 1)[1])


# --- the engine -----------------------------------------------------------------------------


async def engine_plan(ledger: Any, batch: Batch) -> int:
    return len((await ledger.executions_plan(batch.plan)).inserted)


async def engine_claim(ledger: Any, batch: Batch) -> int:
    return len(await ledger.executions_claim(batch.claim))


async def engine_complete(ledger: Any, batch: Batch) -> int:
    return len((await ledger.executions_complete(batch.complete)).applied)


ENGINE_CALLS: Final = {"plan": engine_plan, "claim": engine_claim, "complete": engine_complete}


async def spread_trio(
    call: Callable[[Batch], Awaitable[int]], batches: list[Batch], callers: int
) -> int:
    """Run ``call`` over the batches with ``callers`` tasks, one call in flight each."""
    pending = iter(batches)
    done = 0

    async def caller() -> None:
        nonlocal done
        for batch in pending:
            handled = await call(batch)  # not `done += await ...`: that reads done too early
            done += handled

    async with trio.open_nursery() as nursery:
        for _ in range(callers):
            nursery.start_soon(caller)
    return done


async def engine_phase(url: str, batches: list[Batch], callers: int) -> dict[str, float]:
    rows = sum(batch.size for batch in batches)
    seconds: dict[str, float] = {}
    async with (
        open_bridge() as bridge,
        open_postgres_ledger(url, pool_max=callers, bridge=bridge) as ledger,
    ):
        # Open the data pool's connections before timing, as the raw side does (executions_due
        # runs on the data pool; lease operations have a pool of their own).
        warm = ExecutionsDue(partition_ids=[0], before=batches[0].planned_at, limit=1)
        for _ in range(3):
            async with trio.open_nursery() as nursery:
                for _ in range(callers):
                    nursery.start_soon(ledger.executions_due, warm)
        for operation in OPERATIONS:
            call = ENGINE_CALLS[operation]
            hops = bridge.statistics().calls_started
            started = time.perf_counter()
            done = await spread_trio(functools.partial(call, ledger), batches, callers)
            seconds[operation] = time.perf_counter() - started
            hops = bridge.statistics().calls_started - hops
            if done != rows or hops != len(batches):
                raise RuntimeError(f"engine {operation}: {done} rows of {rows}, {hops} hops")
            await bridge.call(_execute, url, ("ANALYZE executions, execution_attempts",))
    return seconds


# --- the raw references -----------------------------------------------------------------------


class StatementClock:
    """Seconds spent awaiting each named statement (meaningful with one caller)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    async def __call__(self, label: str, pending: Awaitable[Any]) -> Any:
        started = time.perf_counter()
        result = await pending
        self.seconds[label] = self.seconds.get(label, 0.0) + time.perf_counter() - started
        return result


def _insert_args(b: Batch) -> tuple[Any, ...]:
    n = b.size
    return (
        b.execution_ids,
        b.schedule_ids,
        b.tenant_ids,
        ["noop"] * n,
        [b.planned_at] * n,
        b.fence.partition_id,
        b.fence.fencing_token,
    )


def _claim_args(b: Batch) -> tuple[Any, ...]:
    return (b.execution_ids, ATTEMPT_LEASE_S, b.fence.fencing_token, OWNER)


def _complete_args(b: Batch) -> tuple[Any, ...]:
    return (b.execution_ids, [1] * b.size)


CEILING: Final = {
    "plan": (CEILING_INSERT, _insert_args),
    "claim": (CEILING_CLAIM, _claim_args),
    "complete": (CEILING_COMPLETE, _complete_args),
}


async def ceiling_call(
    operation: str, conn: asyncpg.Connection, b: Batch, table: str = "executions"
) -> int:
    statement, arguments = CEILING[operation]
    return rows_of(await conn.execute(statement.format(table=table), *arguments(b)))


CEILING_ADVANCE: Final = """
UPDATE schedules AS s SET next_run_at = u.next_run_at
FROM unnest($1::text[], $2::timestamptz[]) AS u (schedule_id, next_run_at)
WHERE s.schedule_id = u.schedule_id
"""


async def ceiling_plan(conn: asyncpg.Connection, b: Batch, clock: StatementClock) -> int:
    # The SQL equivalent of a plan is two statements in one transaction: the unnest insert
    # of the executions and the unnest update of each schedule's next_run_at.
    async with conn.transaction():
        done = await ceiling_call("plan", conn, b)
        await conn.execute(
            CEILING_ADVANCE, b.schedule_ids, [b.planned_at + timedelta(minutes=1)] * b.size
        )
    return done


async def ceiling_claim(conn: asyncpg.Connection, b: Batch, clock: StatementClock) -> int:
    return await ceiling_call("claim", conn, b)


async def ceiling_complete(conn: asyncpg.Connection, b: Batch, clock: StatementClock) -> int:
    return await ceiling_call("complete", conn, b)


async def _fence(conn: asyncpg.Connection, b: Batch, clock: StatementClock) -> None:
    fence = b.fence
    await clock(
        "fence",
        conn.fetch(sql.FENCES_HOLDING, [fence.partition_id], [OWNER], [fence.fencing_token]),
    )


async def sql_plan(conn: asyncpg.Connection, b: Batch, clock: StatementClock) -> int:
    n = b.size
    transaction = conn.transaction()
    await clock("begin", transaction.start())
    await _fence(conn, b, clock)
    locked = await clock("lock schedules", conn.fetch(sql.SCHEDULES_LOCK_LIVE, b.schedule_ids))
    live = {row["schedule_id"] for row in locked}
    assert len(live) == n  # every schedule of the batch is live: no fire is filtered out
    rows = await clock(
        "insert executions",
        conn.fetch(
            sql.EXECUTIONS_INSERT_PLANNED,
            b.execution_ids,
            b.schedule_ids,
            b.tenant_ids,
            ["noop"] * n,
            [b.planned_at] * n,
            ["queued"] * n,
            [None] * n,
            [None] * n,
            b.fence.partition_id,
            b.fence.fencing_token,
        ),
    )
    await clock(
        "advance schedules",
        conn.fetch(
            sql.SCHEDULES_ADVANCE,
            b.schedule_ids,
            [b.planned_at + timedelta(hours=1)] * n,
            [1] * n,
        ),
    )
    await clock(
        "checkpoint", conn.execute(sql.CHECKPOINT_ADVANCE, b.fence.partition_id, b.planned_at)
    )
    await clock("commit", transaction.commit())
    return len(rows)


async def sql_claim(conn: asyncpg.Connection, b: Batch, clock: StatementClock) -> int:
    # One statement, fenced in itself, as the engine claims (autocommit).
    rows = await clock(
        "claim, fenced (returns rows)",
        conn.fetch(
            sql_executions.EXECUTIONS_CLAIM,
            b.execution_ids,
            ATTEMPT_LEASE_S,
            OWNER,
            [b.fence.partition_id],
            [OWNER],
            [b.fence.fencing_token],
        ),
    )
    return sum(1 for row in rows if row["execution_id"] is not None)


async def sql_complete(conn: asyncpg.Connection, b: Batch, clock: StatementClock) -> int:
    n = b.size
    rows = await clock(
        "complete + history, fenced",
        conn.fetch(
            sql_executions.EXECUTIONS_COMPLETE,
            text_array(b.execution_ids),
            int_array([1] * n),
            text_array(["succeeded"] * n),
            timestamptz_array([None] * n),
            text_array([None] * n),
            text_array([None] * n),
            [b.fence.partition_id],
            [OWNER],
            [b.fence.fencing_token],
        ),
    )
    return sum(1 for row in rows if row["execution_id"] is not None)


RawCall = Callable[[asyncpg.Connection, Batch, StatementClock], Awaitable[int]]
RAW_CALLS: Final[dict[str, dict[str, RawCall]]] = {
    "ceiling": {"plan": ceiling_plan, "claim": ceiling_claim, "complete": ceiling_complete},
    "engine SQL": {"plan": sql_plan, "claim": sql_claim, "complete": sql_complete},
}


async def spread_asyncio(
    call: RawCall,
    connections: list[asyncpg.Connection],
    batches: list[Batch],
    clock: StatementClock,
) -> int:
    pending = iter(batches)

    async def caller(connection: asyncpg.Connection) -> int:
        done = 0
        for batch in pending:
            done += await call(connection, batch, clock)
        return done

    return sum(await asyncio.gather(*(caller(c) for c in connections)))


async def raw_phase(
    url: str, batches: list[Batch], callers: int, variant: str
) -> tuple[dict[str, float], dict[tuple[str, str], float]]:
    """Seconds per operation, and (operation, statement) -> ms per batch."""
    rows = sum(batch.size for batch in batches)
    connections = [await asyncpg.connect(url) for _ in range(callers)]
    seconds: dict[str, float] = {}
    per_statement: dict[tuple[str, str], float] = {}
    try:
        for operation in OPERATIONS:
            clock = StatementClock()
            started = time.perf_counter()
            done = await spread_asyncio(RAW_CALLS[variant][operation], connections, batches, clock)
            seconds[operation] = time.perf_counter() - started
            if done != rows:
                raise RuntimeError(f"{variant} {operation}: {done} rows of {rows}")
            for label, spent in clock.seconds.items():
                per_statement[(operation, label)] = 1000 * spent / len(batches)
            await connections[0].execute("ANALYZE executions, execution_attempts")
    finally:
        for connection in connections:
            await connection.close()
    return seconds, per_statement


# --- retention --------------------------------------------------------------------------------

FILL_SUCCEEDED: Final = """
INSERT INTO {table} (execution_id, schedule_id, tenant_id, task_type, partition_id, planned_at,
                     status, attempt, enqueued_at, started_at, finished_at, fencing_token,
                     claimed_by)
SELECT u.execution_id, u.schedule_id, u.tenant_id, 'noop', u.partition_id, $6::timestamptz,
       'succeeded', 1, $6, $6, $6 + interval '1 minute', u.fencing_token, 'bench-ledger'
FROM unnest($1::text[], $2::text[], $3::text[], $4::integer[], $5::bigint[])
     AS u (execution_id, schedule_id, tenant_id, partition_id, fencing_token)
"""

FILL_ATTEMPTS: Final = """
INSERT INTO {attempts} (execution_id, attempt, outcome, started_at, finished_at, claimed_by{extra})
SELECT execution_id, 1, 'succeeded', started_at, finished_at, claimed_by{extra}
FROM {table} WHERE status = 'succeeded'
"""


def day_layout(today: datetime) -> list[datetime]:
    """The starts of the partitioned table's days: six past days and ``today``."""
    return [today - timedelta(days=RETENTION_DAYS - 1 - n) for n in range(RETENTION_DAYS)]


async def build_partitioned(conn: asyncpg.Connection, days: list[datetime]) -> None:
    """``executions_by_day`` and ``attempts_by_day``: the real tables' columns, checks and
    indexes, range-partitioned by planned_at, one partition per day (primary keys must then
    include planned_at)."""
    await conn.execute(
        "CREATE TABLE executions_by_day (LIKE executions INCLUDING DEFAULTS INCLUDING "
        "GENERATED INCLUDING CONSTRAINTS) PARTITION BY RANGE (planned_at)"
    )
    await conn.execute("ALTER TABLE executions_by_day ADD PRIMARY KEY (execution_id, planned_at)")
    indexes = await conn.fetch(
        "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'executions' "
        "AND indexname <> 'executions_pkey'"
    )
    for row in indexes:
        await conn.execute(
            row["indexdef"]
            .replace(row["indexname"], row["indexname"] + "_by_day")
            .replace(" ON public.executions ", " ON public.executions_by_day ")
        )
    await conn.execute(
        "CREATE TABLE attempts_by_day (LIKE execution_attempts INCLUDING DEFAULTS INCLUDING "
        "CONSTRAINTS, planned_at timestamptz NOT NULL) PARTITION BY RANGE (planned_at)"
    )
    await conn.execute(
        "ALTER TABLE attempts_by_day ADD PRIMARY KEY (execution_id, attempt, planned_at)"
    )
    await conn.execute(
        "ALTER TABLE attempts_by_day ADD FOREIGN KEY (execution_id, planned_at) "
        "REFERENCES executions_by_day ON DELETE CASCADE"
    )
    for n, start in enumerate(days):
        bounds = f"FROM ('{start.isoformat()}') TO ('{(start + timedelta(days=1)).isoformat()}')"
        await conn.execute(
            f"CREATE TABLE executions_d{n} PARTITION OF executions_by_day FOR VALUES {bounds}"
        )
        await conn.execute(
            f"CREATE TABLE attempts_d{n} PARTITION OF attempts_by_day FOR VALUES {bounds}"
        )


async def fill_old_day(conn: asyncpg.Connection, batches: list[Batch], at: datetime) -> None:
    """N succeeded executions planned at ``at``, with one attempt each, in both layouts."""
    columns = [
        [i for b in batches for i in (execution_id(s, at) for s in b.schedule_ids)],
        [s for b in batches for s in b.schedule_ids],
        [t for b in batches for t in b.tenant_ids],
        [b.fence.partition_id for b in batches for _ in b.schedule_ids],
        [b.fence.fencing_token for b in batches for _ in b.schedule_ids],
    ]
    for table, attempts, extra in (
        ("executions", "execution_attempts", ""),
        ("executions_by_day", "attempts_by_day", ", planned_at"),
    ):
        await conn.execute(FILL_SUCCEEDED.format(table=table), *columns, at)
        await conn.execute(FILL_ATTEMPTS.format(table=table, attempts=attempts, extra=extra))
    for table in ("executions", "execution_attempts", "executions_by_day", "attempts_by_day"):
        await conn.execute(f"VACUUM ANALYZE {table}")


async def hot_path(url: str, batches: list[Batch]) -> dict[str, float]:
    """Sequential ceiling seconds per operation on the plain and the partitioned table."""
    seconds: dict[str, float] = {}
    conn = await asyncpg.connect(url)
    try:
        for table in ("executions", "executions_by_day"):
            for operation in OPERATIONS:
                started = time.perf_counter()
                done = sum([await ceiling_call(operation, conn, b, table) for b in batches])
                seconds[f"{table} {operation}"] = time.perf_counter() - started
                if done != sum(b.size for b in batches):
                    raise RuntimeError(f"hot path on {table}, {operation}: {done} rows")
                await conn.execute(f"ANALYZE {table}")
    finally:
        await conn.close()
    return seconds


async def engine_purge(url: str, fences: list[Fence], before: datetime) -> tuple[int, int, float]:
    """(rows purged, calls, seconds): each partition purged in batches until one comes short."""
    async with open_postgres_ledger(url) as ledger:
        purged, calls = 0, 0
        started = time.perf_counter()
        for fence in fences:
            while True:
                n = await ledger.executions_purge(ExecutionsPurge(fence, before, BATCH_ROWS))
                purged, calls = purged + n, calls + 1
                if n < BATCH_ROWS:
                    break
        return purged, calls, time.perf_counter() - started


async def timed(url: str, statements: list[str], *, transaction: bool) -> float:
    conn = await asyncpg.connect(url)
    try:
        started = time.perf_counter()
        if transaction:
            async with conn.transaction():
                for statement in statements:
                    await conn.execute(statement)
        else:
            for statement in statements:
                await conn.execute(statement)
        return time.perf_counter() - started
    finally:
        await conn.close()


async def _prepare_retention(url: str, batches: list[Batch], days: list[datetime]) -> None:
    conn = await asyncpg.connect(url)
    try:
        await build_partitioned(conn, days)
        await fill_old_day(conn, batches, days[0] + timedelta(hours=1))
    finally:
        await conn.close()


def retention(url: str, batches: list[Batch], fences: list[Fence]) -> dict[str, float]:
    """Purge through the ledger (then VACUUM) against dropping a day partition of the same
    rows; and the hot-path price of the partitioned layout."""
    rows = sum(b.size for b in batches)
    today = batches[0].planned_at.replace(hour=0, minute=0, second=0, microsecond=0)
    days = day_layout(today)
    reset(url)
    uvloop.run(_prepare_retention(url, batches, days))
    result = {f"hot {k}": v for k, v in uvloop.run(hot_path(url, batches)).items()}
    purged, calls, seconds = trio.run(engine_purge, url, fences, days[1])
    if purged != rows:
        raise RuntimeError(f"purged {purged} rows of {rows}")
    result |= {"purge_s": seconds, "purge_calls": calls}
    vacuum = ["VACUUM executions", "VACUUM execution_attempts"]
    result["vacuum_s"] = uvloop.run(timed(url, vacuum, transaction=False))
    drop = [
        "ALTER TABLE attempts_by_day DETACH PARTITION attempts_d0",
        "DROP TABLE attempts_d0",
        "ALTER TABLE executions_by_day DETACH PARTITION executions_d0",
        "DROP TABLE executions_d0",
    ]
    result["drop_s"] = uvloop.run(timed(url, drop, transaction=True))
    return result


# --- one run, the report ----------------------------------------------------------------------


def rotated(items: tuple[str, ...], shift: int) -> list[str]:
    shift %= len(items)
    return list(items[shift:] + items[:shift])


def one_run(server_url: str, rows: int, index: int, with_retention: bool) -> RunResult:
    name = f"carillon_bench_{secrets.token_hex(4)}"
    admin(server_url, f'CREATE DATABASE "{name}"')
    url = url_with_database(server_url, name)
    result = RunResult()
    try:
        buckets = balanced_schedule_ids(rows, rows // BATCH_ROWS)
        fences, planned_at = trio.run(prepare, url, buckets)
        batches = make_batches(buckets, fences, planned_at)
        admin(url, *(f"ALTER TABLE {t} SET (autovacuum_enabled = false)" for t in BENCH_TABLES))
        for callers in CALLERS:
            for variant in rotated(VARIANTS, index):
                reset(url)
                if variant == "engine":
                    seconds = trio.run(engine_phase, url, batches, callers)
                else:
                    seconds, statements = uvloop.run(raw_phase(url, batches, callers, variant))
                    if variant == "engine SQL" and callers == 1:
                        result.statement_ms = statements
                for operation, spent in seconds.items():
                    result.seconds[(variant, callers, operation)] = spent
                    print(
                        f"  run {index + 1} {variant:>10} x{callers} {operation:>8}: "
                        f"{rows / spent:>9,.0f} rows/s",
                        file=sys.stderr,
                    )
        if with_retention:
            result.retention = retention(url, batches, fences)
    finally:
        admin(server_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    return result


def _spread(samples: list[float], digits: int = 0, scale: float = 1.0) -> str:
    median, low, high = summary([s * scale for s in samples])
    return f"{median:,.{digits}f} ({low:,.{digits}f}-{high:,.{digits}f})"


def throughput_table(runs: list[RunResult], rows: int) -> tuple[list[str], bool]:
    lines = [
        "| operation | callers | engine rows/s | engine SQL rows/s | ceiling rows/s "
        "| engine / ceiling | engine / engine SQL | ≥ 70 % |",
        "|---|---:|---:|---:|---:|---:|---:|:-:|",
    ]
    met = True
    for callers in CALLERS:
        for operation in OPERATIONS:

            def rates(variant: str, op: str = operation, c: int = callers) -> list[float]:
                return [rows / run.seconds[(variant, c, op)] for run in runs]

            engine, engine_sql, ceiling = rates("engine"), rates("engine SQL"), rates("ceiling")
            to_ceiling = [e / c for e, c in zip(engine, ceiling, strict=True)]
            to_sql = [e / s for e, s in zip(engine, engine_sql, strict=True)]
            ok = summary(to_ceiling)[0] >= TARGET
            met &= ok
            lines.append(
                f"| {operation} | {callers} | {_spread(engine)} | {_spread(engine_sql)} "
                f"| {_spread(ceiling)} | {_spread(to_ceiling, 0, 100)} % "
                f"| {_spread(to_sql, 0, 100)} % | {'yes' if ok else '**no**'} |"
            )
    return lines, met


def statement_lines(runs: list[RunResult]) -> list[str]:
    lines = [
        "Where one call's database time goes (`engine SQL`, one caller; ms per batch of "
        f"{BATCH_ROWS:,}, median over the runs):",
        "",
        "| operation | statement | ms |",
        "|---|---|---:|",
    ]
    for operation in OPERATIONS:
        labels = [label for (op, label) in runs[0].statement_ms if op == operation]
        for label in labels:
            median = summary([run.statement_ms[(operation, label)] for run in runs])[0]
            lines.append(f"| {operation} | {label} | {median:.1f} |")
    return lines


def retention_lines(runs: list[RunResult], rows: int) -> list[str]:
    def samples(key: str) -> list[float]:
        return [run.retention[key] for run in runs]

    purge, vacuum, drop = samples("purge_s"), samples("vacuum_s"), samples("drop_s")
    both = [p + v for p, v in zip(purge, vacuum, strict=True)]
    calls = int(runs[0].retention["purge_calls"])
    lines = [
        f"Retention of {rows:,} succeeded executions (one attempt row each), median (min-max):",
        "",
        "| method | seconds | rows/s |",
        "|---|---:|---:|",
        f"| `executions_purge`, batches of {BATCH_ROWS:,} ({calls} fenced calls) "
        f"| {_spread(purge, 2)} | {_spread([rows / s for s in purge])} |",
        f"| `VACUUM` of executions and attempts afterwards | {_spread(vacuum, 2)} | |",
        f"| purge + VACUUM | {_spread(both, 2)} | {_spread([rows / s for s in both])} |",
        "| `DETACH PARTITION` + `DROP TABLE` of one day (executions and attempts, "
        f"one transaction) | {_spread(drop, 3)} | {_spread([rows / s for s in drop])} |",
        "",
        f"What the day-partitioned layout ({RETENTION_DAYS} daily partitions, primary key "
        "`(execution_id, planned_at)`) costs the hot path: the ceiling statements, one caller, "
        f"{rows:,} new rows, both tables holding the old day's {rows:,} rows:",
        "",
        "| operation | plain table rows/s | partitioned by day rows/s | partitioned / plain |",
        "|---|---:|---:|---:|",
    ]
    for operation in OPERATIONS:
        plain = [rows / s for s in samples(f"hot executions {operation}")]
        parted = [rows / s for s in samples(f"hot executions_by_day {operation}")]
        ratio = [b / a for a, b in zip(plain, parted, strict=True)]
        lines.append(
            f"| {operation} | {_spread(plain)} | {_spread(parted)} | {_spread(ratio, 0, 100)} % |"
        )
    return lines


def report(runs: list[RunResult], rows: int) -> str:
    table, met = throughput_table(runs, rows)
    lines = [
        "## Ledger throughput (`benchmarks/bench_ledger.py`)",
        "",
        f"Machine: {machine()}; revision {revision()}; {len(runs)} runs; {rows:,} executions "
        f"planned, claimed and completed in batches of {BATCH_ROWS:,}, each call one partition "
        f"({rows // BATCH_ROWS} partitions x {BATCH_ROWS:,} schedules); PostgreSQL on the same "
        "machine. Rows/s: median (min-max) over the runs; ratios are taken per run, then "
        "summarised the same way.",
        "",
        "`engine`: `PostgresLedger` called from trio, one bridge hop per call (checked). "
        "`engine SQL`: the engine's own statements and transactions run by plain asyncpg on "
        "uvloop, arguments prepared beforehand. `ceiling`: the minimal equivalent statement "
        "(`INSERT ... SELECT FROM unnest(...) ON CONFLICT DO NOTHING`, `UPDATE ... FROM "
        "unnest(...)`) by plain asyncpg, autocommit. With 4 callers, each has its own "
        "connection and one call in flight.",
        "",
        *table,
        "",
        f"Target (engine >= 70 % of the ceiling for every operation): "
        f"{'met' if met else 'NOT met'}. Where the gaps come from and what would close them: "
        "[ledger.md](ledger.md#speed).",
        "",
        *statement_lines(runs),
    ]
    if runs[0].retention:
        lines += ["", *retention_lines(runs, rows)]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run; docs are not written")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--rows", type=int, default=200_000, help="a multiple of 5,000")
    parser.add_argument("--no-retention", action="store_true", help="skip the retention part")
    args = parser.parse_args()
    if args.quick:
        args.rows, args.runs = 10_000, 1
    if args.rows < BATCH_ROWS or args.rows % BATCH_ROWS:
        parser.error(f"--rows must be a positive multiple of {BATCH_ROWS}")
    with resolve_database() as database:
        runs = [
            one_run(database.url, args.rows, n, not args.no_retention) for n in range(args.runs)
        ]
    text = report(runs, args.rows)
    print(text)
    if not args.quick:
        write_section("bench_ledger", text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
