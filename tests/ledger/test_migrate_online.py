"""Online migrations: steps outside a transaction, resumable, batched, on a live ledger.

The machinery is in ``engine/ledger/postgres/migrate.py`` (its docstring says the rules);
version 11 is the first migration to use it. These tests move a ledger of a million
executions while it is written to, cut a run short and resume it, and run a batched data
step against real PostgreSQL.
"""

from __future__ import annotations

import asyncio
import time

import asyncpg
import pytest
import trio

from engine.ledger.params import ExecutionsQuery
from engine.ledger.postgres import migrate_database, open_postgres_ledger
from engine.ledger.postgres.migrate import (
    ONLINE_HEADER,
    Step,
    known_migrations,
    latest_version,
    migrate,
    parse_migration,
)
from engine.model import ExecutionStatus
from tests.ledger.backends import sql

ONLINE_INDEX = "executions_tenant_dead_letter_idx"
"""What version 11 builds, concurrently."""

LIVE_ROWS = 1_000_000


# --- parsing (no database) ------------------------------------------------------------------


def test_a_file_without_the_header_runs_whole_in_one_transaction() -> None:
    migration = parse_migration(3, "x", "-- comment\nCREATE TABLE a (b int);\nCREATE TABLE c ();")
    assert (migration.online, migration.steps) == (False, ())


def test_an_online_file_is_its_steps_each_one_statement() -> None:
    text = (
        f"{ONLINE_HEADER}\n-- why\n-- step\nCREATE INDEX CONCURRENTLY IF NOT EXISTS i ON t (a)\n"
        "-- step: repeat\n-- a comment inside\nUPDATE t SET a = 1 WHERE a IS NULL\n"
    )
    migration = parse_migration(12, "x", text)
    assert migration.online
    assert migration.steps == (
        Step("CREATE INDEX CONCURRENTLY IF NOT EXISTS i ON t (a)"),
        Step("-- a comment inside\nUPDATE t SET a = 1 WHERE a IS NULL", repeat=True),
    )


@pytest.mark.parametrize(
    "body",
    [
        "CREATE TABLE a ();\n-- step\nSELECT 1",  # SQL before the first step
        "-- step\n-- only a comment\n-- step\nSELECT 1",  # an empty step
        "SELECT 1",  # no step at all
    ],
)
def test_a_malformed_online_file_is_refused(body: str) -> None:
    with pytest.raises(AssertionError, match="online migration 12"):
        parse_migration(12, "x", f"{ONLINE_HEADER}\n{body}\n")


def test_version_11_is_online() -> None:
    version_11 = known_migrations()[10]
    assert (version_11.version, version_11.online) == (11, True)
    assert ONLINE_INDEX in version_11.steps[0].sql


# --- against PostgreSQL ---------------------------------------------------------------------


async def back_to_version_10(url: str) -> None:
    """The database as version 10 of Carillon left it (version 11 only adds the index)."""
    await sql(url, f"DROP INDEX {ONLINE_INDEX}")
    await sql(url, "DELETE FROM carillon_schema_migrations WHERE version = 11")


async def index_state(url: str) -> tuple[bool, bool] | None:
    """(valid, ready) of the online index, or None when it does not exist."""
    rows = await sql(
        url,
        "SELECT indisvalid, indisready FROM pg_index WHERE indexrelid = to_regclass($1)",
        ONLINE_INDEX,
    )
    return None if not rows else (rows[0][0], rows[0][1])


async def recorded_versions(url: str) -> list[int]:
    return [row[0] for row in await sql(url, "SELECT version FROM carillon_schema_migrations")]


async def test_a_run_cut_short_leaves_an_invalid_index_that_the_next_run_rebuilds(
    fresh_url: str,
) -> None:
    await migrate_database(fresh_url, partitions=4)
    # What a CREATE INDEX CONCURRENTLY cut short leaves: the index, marked invalid, and no
    # version recorded. IF NOT EXISTS alone would keep it as it is.
    await sql(fresh_url, "DELETE FROM carillon_schema_migrations WHERE version = 11")
    await sql(
        fresh_url,
        "UPDATE pg_index SET indisvalid = false WHERE indexrelid = to_regclass($1)",
        ONLINE_INDEX,
    )
    assert await index_state(fresh_url) == (False, True)
    with pytest.raises(Exception, match="version 10"):
        async with open_postgres_ledger(fresh_url):  # a node of this version waits for it
            pass

    report = await migrate_database(fresh_url)

    assert [m.version for m in report.applied] == [11]
    assert await index_state(fresh_url) == (True, True)
    assert await recorded_versions(fresh_url) == list(range(1, latest_version() + 1))


async def test_a_batched_step_commits_batch_by_batch_and_resumes_where_it_stopped(
    fresh_url: str,
) -> None:
    await migrate_database(fresh_url, partitions=4)
    await sql(
        fresh_url,
        "INSERT INTO executions (execution_id, schedule_id, tenant_id, task_type, partition_id, "
        "planned_at, status, enqueued_at) SELECT 's' || g || ':t', 's' || g, 'acme', 'noop', "
        "g % 4, now(), 'succeeded', now() FROM generate_series(1, 5000) AS g",
    )
    move = (
        "UPDATE executions SET error_message = 'moved' WHERE execution_id IN ("
        "SELECT execution_id FROM executions WHERE error_message IS NULL LIMIT 1000)"
    )
    version_12 = parse_migration(
        12, "move", f"{ONLINE_HEADER}\n-- step: repeat\n{move}\n-- step\nSELECT 1\n"
    )
    await sql(fresh_url, move)  # a run cut short after its first batch

    async def run() -> int:
        connection = await asyncpg.connect(fresh_url)
        try:
            before = await connection.fetchval("SELECT txid_current()")
            await migrate(connection, migrations=[*known_migrations(), version_12])
            return int(await connection.fetchval("SELECT txid_current()")) - int(before)
        finally:
            await connection.close()

    transactions = await trio.to_thread.run_sync(asyncio.run, run())

    moved = await sql(fresh_url, "SELECT count(*) FROM executions WHERE error_message = 'moved'")
    assert moved[0][0] == 5000
    # Four batches of the remaining 4,000 rows, each committed on its own (a transaction id
    # each), then one that changed nothing, and the version's record.
    assert transactions >= 5
    assert 12 in await recorded_versions(fresh_url)


async def test_a_live_ledger_of_a_million_executions_moves_while_it_is_written(
    fresh_url: str,
) -> None:
    """Version 11 on a ledger of 1,000,000 executions left at version 10: the index builds
    while another connection keeps inserting and updating executions, none of which waits
    for it; afterwards a tenant's dead letters are listed through the new index."""
    await migrate_database(fresh_url, partitions=16)
    await back_to_version_10(fresh_url)
    await sql(
        fresh_url,
        "INSERT INTO executions (execution_id, schedule_id, tenant_id, task_type, partition_id, "
        "planned_at, status, attempt, enqueued_at, finished_at) "
        "SELECT 's' || (g % 20000) || ':' || g, 's' || (g % 20000), 'tenant-' || (g % 500), "
        "'noop', g % 16, now() - make_interval(secs => g), "
        "CASE WHEN g % 200 = 0 THEN 'dead-letter' ELSE 'succeeded' END, 1, now(), now() "
        f"FROM generate_series(1, {LIVE_ROWS}) AS g",
    )
    await sql(fresh_url, "ANALYZE executions")

    migrating = trio.Event()
    migrated = trio.Event()
    writes: list[tuple[float, float]] = []  # (start, seconds) of each write
    build_locks: set[str] = set()  # the modes the index build held on executions

    async def writer() -> None:
        async def run() -> None:
            connection = await asyncpg.connect(fresh_url)
            try:
                n = 0
                while not migrated.is_set() or n < 5:
                    n += 1
                    ids = [f"live{n}-{k}" for k in range(100)]
                    started = time.monotonic()
                    async with connection.transaction():
                        await connection.execute(
                            "INSERT INTO executions (execution_id, schedule_id, tenant_id, "
                            "task_type, partition_id, planned_at, status, enqueued_at) "
                            "SELECT id, 'live', 'tenant-1', 'noop', 0, now(), 'queued', now() "
                            "FROM unnest($1::text[]) AS id",
                            ids,
                        )
                        await connection.execute(
                            "UPDATE executions SET status = 'dead-letter', finished_at = now() "
                            "WHERE execution_id = ANY($1::text[])",
                            ids,
                        )
                    writes.append((started, time.monotonic() - started))
                    await asyncio.sleep(0.005)
            finally:
                await connection.close()

        await migrating.wait()
        await trio.to_thread.run_sync(asyncio.run, run())

    async def watcher() -> None:
        async def run() -> None:
            connection = await asyncpg.connect(fresh_url)
            try:
                while not migrated.is_set():
                    rows = await connection.fetch(
                        "SELECT l.mode FROM pg_locks AS l JOIN pg_stat_activity AS a "
                        "ON a.pid = l.pid WHERE l.relation = 'executions'::regclass "
                        "AND a.query ILIKE 'CREATE INDEX%'"
                    )
                    build_locks.update(row["mode"] for row in rows)
                    await asyncio.sleep(0.005)
            finally:
                await connection.close()

        await migrating.wait()
        await trio.to_thread.run_sync(asyncio.run, run())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(writer)
        nursery.start_soon(watcher)
        await trio.sleep(0.2)  # both connected and under way
        migrating.set()
        await trio.sleep(0.2)
        began = time.monotonic()
        report = await migrate_database(fresh_url)
        ended = time.monotonic()
        migrated.set()

    assert [m.version for m in report.applied] == [11]
    assert await index_state(fresh_url) == (True, True)
    # The build held only SHARE UPDATE EXCLUSIVE on the table, which no insert, update or
    # delete waits for (a plain CREATE INDEX holds SHARE, which stops them all until it
    # ends), and the writes went on meanwhile.
    assert build_locks == {"ShareUpdateExclusiveLock"}, build_locks
    during = [seconds for started, seconds in writes if began <= started <= ended]
    assert during, (ended - began, len(writes))
    async with open_postgres_ledger(fresh_url) as ledger:
        page = await ledger.executions_query(
            ExecutionsQuery(tenant_id="tenant-1", status=ExecutionStatus.DEAD_LETTER, limit=10)
        )
        assert len(page.items) == 10
    plan = await sql(
        fresh_url,
        "EXPLAIN SELECT * FROM executions WHERE status = 'dead-letter' AND tenant_id = 'tenant-7' "
        "ORDER BY planned_at, execution_id LIMIT 100",
    )
    assert ONLINE_INDEX in "\n".join(row[0] for row in plan)
