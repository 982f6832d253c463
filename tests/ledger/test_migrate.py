"""Schema migrations and ``carillon migrate``, against real PostgreSQL.

Each test gets a database of its own on the session's server (created and dropped here), so
that it can watch a database go from empty to migrated.
"""

from __future__ import annotations

import asyncio
import secrets
from typing import Any
from urllib.parse import urlsplit

import asyncpg
import pytest
import trio

from engine.cli import main
from engine.errors import ConfigError, InvalidField
from engine.ledger.database import DATABASE_URL_ENV, url_with_database
from engine.ledger.postgres import (
    PARTITIONS_DEFAULT,
    MigrationReport,
    migrate_database,
    open_postgres_ledger,
    read_migration_status,
)
from engine.ledger.postgres.migrate import known_migrations, latest_version
from engine.ledger.postgres.sql import MIGRATION_RECORD, MIGRATIONS_TABLE_CREATE
from tests.ledger.backends import run_sql, sql

pytestmark = pytest.mark.postgres

KNOWN = [(migration.version, migration.name) for migration in known_migrations()]
"""Every migration this code ships, as (version, name): 1 is ``initial``."""


async def lease_rows(url: str) -> list[tuple[int, str | None, int]]:
    rows = await sql(
        url, "SELECT partition_id, owner_id, fencing_token FROM partition_leases ORDER BY 1"
    )
    return [(row[0], row[1], row[2]) for row in rows]


# --- migrate ----------------------------------------------------------------------------------


async def test_a_fresh_database_gets_the_schema_and_64_free_partitions(fresh_url: str) -> None:
    report = await migrate_database(fresh_url)

    assert [m.version for m in report.applied] == [m.version for m in known_migrations()]
    assert (report.schema_version, report.partition_count) == (latest_version(), 64)
    assert report.partitions_created == PARTITIONS_DEFAULT == 64
    assert await lease_rows(fresh_url) == [(p, None, 0) for p in range(64)]
    recorded = await sql(fresh_url, "SELECT version, name FROM carillon_schema_migrations")
    assert [(row[0], row[1]) for row in recorded] == KNOWN
    async with open_postgres_ledger(fresh_url) as ledger:
        settings = await ledger.cluster_get()
    assert (settings.partition_count, settings.active_region, settings.region_epoch) == (
        64,
        "default",
        1,
    )


async def test_running_again_changes_nothing(fresh_url: str) -> None:
    await migrate_database(fresh_url, partitions=8)

    again = await migrate_database(fresh_url)
    same = await migrate_database(fresh_url, partitions=8)

    for report in (again, same):
        assert (report.applied, report.partition_count, report.partitions_created) == ([], 8, 0)
    assert len(await lease_rows(fresh_url)) == 8


async def apply_by_hand(url: str, up_to: int) -> None:
    """Bring an empty database to schema version ``up_to`` as an older Carillon would have."""

    async def run() -> None:
        connection = await asyncpg.connect(url)
        try:
            await connection.execute(MIGRATIONS_TABLE_CREATE)
            for migration in known_migrations()[:up_to]:
                async with connection.transaction():
                    await connection.execute(migration.sql)
                    await connection.execute(
                        MIGRATION_RECORD,
                        migration.version,
                        migration.name,
                        migration.checksum,
                    )
        finally:
            await connection.close()

    await trio.to_thread.run_sync(asyncio.run, run())


async def test_version_4_keeps_the_data_of_a_version_3_database(fresh_url: str) -> None:
    await apply_by_hand(fresh_url, 3)
    await sql(
        fresh_url,
        "INSERT INTO tenants (tenant_id, weight, updated_at, version) VALUES ('acme', 2, now(), 1)",
    )
    await sql(
        fresh_url,
        "INSERT INTO schedule_changes (schedule_id, partition_id, kind, version) "
        "VALUES ('s', 0, 'deleted', 3)",
    )
    await sql(
        fresh_url,
        "INSERT INTO nodes (node_id, region, started_at, last_seen_at, expires_at) "
        "VALUES ('n1', 'eu', now(), now(), now())",
    )

    report = await migrate_database(fresh_url, partitions=4)

    assert [m.name for m in report.applied] == [name for version, name in KNOWN if version > 3]
    assert report.applied[0].name == "api"
    tenant = await sql(fresh_url, "SELECT weight, schedules_max FROM tenants")
    assert [(row[0], row[1]) for row in tenant] == [(2, None)]
    node = await sql(fresh_url, "SELECT node_id, clock_offset_s FROM nodes")
    assert [(row[0], row[1]) for row in node] == [("n1", None)]
    await sql(
        fresh_url,
        "INSERT INTO schedule_changes (schedule_id, partition_id, kind, version) "
        "VALUES ('s', 0, 'executions_added', 3)",
    )
    kinds = await sql(fresh_url, "SELECT kind FROM schedule_changes ORDER BY seq")
    assert [row[0] for row in kinds] == ["deleted", "executions_added"]
    with pytest.raises(asyncpg.CheckViolationError, match="schedule_changes_kind_check"):
        await sql(
            fresh_url,
            "INSERT INTO schedule_changes (schedule_id, partition_id, kind, version) "
            "VALUES ('s', 0, 'renamed', 4)",
        )


async def test_version_6_keeps_each_task_type_usable_by_the_tenants_using_it(
    fresh_url: str,
) -> None:
    """Before version 6 every tenant could name every task type. After it, each existing
    task type is granted to the tenants whose live schedules or unfinished runs name it, and
    to the default tenant; finished runs and deleted schedules grant nothing."""
    await apply_by_hand(fresh_url, 5)
    for name, kind in (("hook", "webhook"), ("sh", "shell"), ("idle", "noop")):
        await sql(
            fresh_url,
            "INSERT INTO task_types (name, kind, updated_at, version) VALUES ($1, $2, now(), 1)",
            name,
            kind,
        )
    schedules = [("a1", "acme", "hook", "NULL"), ("g1", "globex", "hook", "now()")]
    schedules += [("i1", "initech", "sh", "NULL")]
    for schedule_id, tenant, task_type, deleted_at in schedules:
        await sql(
            fresh_url,
            "INSERT INTO schedules (schedule_id, tenant_id, cron_expr, timezone, task_type, "
            "enabled, created_at, updated_at, version, partition_id, catch_up, "
            "catch_up_window_s, dst_gap, dst_overlap, deleted_at) VALUES ($1, $2, '* * * * *', "
            f"'UTC', $3, true, now(), now(), 1, 0, 'none', 0, 'auto', 'auto', {deleted_at})",
            schedule_id,
            tenant,
            task_type,
        )
    runs = [("u1", "umbrella", "sh", "dead-letter"), ("q1", "hooli", "hook", "queued")]
    runs += [("r1", "stark", "hook", "failed"), ("s1", "wayne", "idle", "succeeded")]
    for schedule_id, tenant, task_type, status in runs:
        await sql(
            fresh_url,
            "INSERT INTO executions (execution_id, schedule_id, tenant_id, task_type, "
            "partition_id, planned_at, status, enqueued_at) "
            "VALUES ($1 || ':x', $1, $2, $3, 0, now(), $4, now())",
            schedule_id,
            tenant,
            task_type,
            status,
        )

    report = await migrate_database(fresh_url, partitions=4)

    assert [m.name for m in report.applied] == [name for version, name in KNOWN if version > 5]
    grants = await sql(
        fresh_url, "SELECT name, tenant_id, allowed_tenants FROM task_types ORDER BY name"
    )
    assert [(row[0], row[1], row[2]) for row in grants] == [
        ("hook", None, ["acme", "default", "hooli", "stark"]),
        ("idle", None, ["default"]),
        ("sh", None, ["default", "initech", "umbrella"]),
    ]
    with pytest.raises(asyncpg.CheckViolationError, match="code_kinds_granted_by_name"):
        await sql(fresh_url, "UPDATE task_types SET allowed_tenants = '{*}' WHERE name = 'sh'")
    with pytest.raises(asyncpg.CheckViolationError, match="owned_or_shared"):
        await sql(fresh_url, "UPDATE task_types SET tenant_id = 'acme' WHERE name = 'idle'")


async def test_a_single_partition_cluster_is_allowed(fresh_url: str) -> None:
    report = await migrate_database(fresh_url, partitions=1)

    assert report.partition_count == 1
    assert await lease_rows(fresh_url) == [(0, None, 0)]


async def test_concurrent_runs_all_succeed_and_apply_each_version_once(fresh_url: str) -> None:
    reports: list[MigrationReport] = []

    async def one() -> None:
        reports.append(await migrate_database(fresh_url, partitions=16))

    async with trio.open_nursery() as nursery:
        for _ in range(4):
            nursery.start_soon(one)

    assert len(reports) == 4
    assert sorted(len(report.applied) for report in reports) == [0, 0, 0, latest_version()]
    assert {report.partition_count for report in reports} == {16}
    assert sum(report.partitions_created for report in reports) == 16
    recorded = await sql(fresh_url, "SELECT version FROM carillon_schema_migrations")
    assert [row[0] for row in recorded] == [version for version, _ in KNOWN]


async def test_a_different_partition_count_is_refused_and_changes_nothing(fresh_url: str) -> None:
    await migrate_database(fresh_url, partitions=16)

    with pytest.raises(ConfigError, match="the partition count is fixed at 16"):
        await migrate_database(fresh_url, partitions=32)

    assert len(await lease_rows(fresh_url)) == 16
    assert [
        row[0] for row in await sql(fresh_url, "SELECT partition_count FROM cluster_settings")
    ] == [16]


@pytest.mark.parametrize("partitions", [0, -1, 4097])
async def test_partition_counts_outside_1_to_4096_are_invalid(
    fresh_url: str, partitions: int
) -> None:
    with pytest.raises(InvalidField, match="between 1 and 4096"):
        await migrate_database(fresh_url, partitions=partitions)

    assert (await read_migration_status(fresh_url)).applied == []


async def test_a_schema_newer_than_this_code_is_refused(fresh_url: str) -> None:
    await migrate_database(fresh_url)
    newer = latest_version() + 1
    await sql(
        fresh_url,
        "INSERT INTO carillon_schema_migrations (version, name, checksum) VALUES ($1, $2, $3)",
        newer,
        "from_the_future",
        "x",
    )

    with pytest.raises(ConfigError, match=f"schema is at version {newer}, newer than"):
        await migrate_database(fresh_url)
    with pytest.raises(ConfigError, match="upgrade Carillon"):
        async with open_postgres_ledger(fresh_url):
            pass


async def test_status_lists_applied_and_pending_versions(fresh_url: str) -> None:
    before = await read_migration_status(fresh_url)
    assert (before.applied, before.schema_version, before.partition_count) == ([], 0, None)
    assert [(m.version, m.name) for m in before.pending] == KNOWN

    await migrate_database(fresh_url, partitions=4)
    after = await read_migration_status(fresh_url)

    assert [(a.version, a.name, a.modified) for a in after.applied] == [
        (version, name, False) for version, name in KNOWN
    ]
    assert after.applied[0].applied_at.utcoffset() is not None
    assert (after.pending, after.schema_version, after.partition_count) == (
        [],
        latest_version(),
        4,
    )


async def test_the_ledger_refuses_a_database_that_was_not_migrated(fresh_url: str) -> None:
    with pytest.raises(ConfigError, match="carillon migrate"):
        async with open_postgres_ledger(fresh_url):
            pass


async def test_an_unreachable_server_is_unavailable_not_a_crash(unused_port_url: str) -> None:
    from engine.errors import LedgerUnavailable

    with pytest.raises(LedgerUnavailable):
        await migrate_database(unused_port_url)


@pytest.fixture
def unused_port_url() -> str:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"postgresql://postgres@127.0.0.1:{port}/postgres"


# --- carillon migrate ---------------------------------------------------------------------------


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["migrate", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture
def cli_url(database_url: str) -> Any:
    """A fresh database for the (synchronous) CLI tests."""
    name = f"{urlsplit(database_url).path.lstrip('/')}_c{secrets.token_hex(4)}"
    asyncio.run(run_sql(database_url, f'CREATE DATABASE "{name}"'))
    try:
        yield url_with_database(database_url, name)
    finally:
        asyncio.run(run_sql(database_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


def test_cli_applies_then_reports_up_to_date_then_shows_status(
    cli_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_cli(capsys, "--database-url", cli_url, "--partitions", "4")
    assert (code, err) == (0, "")
    assert "applied 0001_initial" in out
    assert f"schema version {latest_version()}; 4 partitions" in out

    code, out, err = run_cli(capsys, "--database-url", cli_url)
    assert (code, err) == (0, "")
    assert f"schema up to date at version {latest_version()}" in out

    code, out, err = run_cli(capsys, "--database-url", cli_url, "--status")
    assert (code, err) == (0, "")
    latest = latest_version()
    assert f"schema version: {latest} (this Carillon: {latest})" in out
    assert "partitions: 4" in out
    assert "0001_initial" in out
    assert "pending: none" in out


def test_cli_uses_the_environment_url_when_no_flag_is_given(
    cli_url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(DATABASE_URL_ENV, cli_url)

    code, out, _ = run_cli(capsys, "--status")

    assert code == 0
    assert "$CARILLON_DATABASE_URL" in out
    assert "pending:\n  0001_initial" in out


def test_cli_refuses_a_partition_change_on_one_line(
    cli_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_cli(capsys, "--database-url", cli_url, "--partitions", "4")[0] == 0

    code, out, err = run_cli(capsys, "--database-url", cli_url, "--partitions", "8")

    assert (code, out) == (1, "")
    assert err.startswith("carillon: error: the partition count is fixed at 4")
    assert err.count("\n") == 1


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["--partitions", "0"], 2, "the partition count must be between 1 and 4096"),
        (["--database-url", "http://example.com/db"], 1, "malformed database URL"),
        (["--partitions", "many"], 2, "invalid int value"),
    ],
)
def test_cli_bad_input_ends_with_one_error_line(
    capsys: pytest.CaptureFixture[str], args: list[str], code: int, message: str
) -> None:
    got, out, err = run_cli(capsys, *args)

    assert (got, out) == (code, "")
    assert err.startswith("carillon")
    assert message in err
    assert err.count("\n") == 1
    assert "Traceback" not in err


def test_cli_reports_an_unreachable_server_on_one_line(
    unused_port_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_cli(capsys, "--database-url", unused_port_url)

    assert (code, out) == (1, "")
    assert err.startswith("carillon: error: the database at postgresql://")
    assert "unavailable" in err
    assert err.count("\n") == 1
