"""The ledger backends Carillon's contract run uses (engine/testing/ledger_contract/).

* ``memory``: :func:`~engine.testing.ledger_contract.memory_backend`, a MemoryLedger on a
  ManualClock; ``advance`` moves that clock.
* ``postgres``: :class:`PostgresLedger` on a fresh database cloned from a migrated template
  (``CREATE DATABASE ... TEMPLATE``), dropped after the test. Postgres judges expiry by its
  own ``now()``, so the clone gets an injected one (:data:`CLOCK_SCHEMA`): the server's
  clock plus a shift that ``advance`` moves -- nothing sleeps.

Both start with the task type :data:`NOOP` stored, since schedules may only name existing
task types.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Final
from urllib.parse import urlsplit

import asyncpg
import trio

from engine.ledger.database import url_with_database as with_database
from engine.testing.ledger_contract.backend import (
    NOOP,
    PARTITIONS,
    START,
    Backend,
    ids_in_partition,
    memory_backend,
    put_noop_task_type,
    schedule,
)

__all__ = [
    "NOOP",
    "PARTITIONS",
    "START",
    "Backend",
    "drop_template",
    "ids_in_partition",
    "make_template",
    "memory_backend",
    "postgres_backend",
    "postgres_template_database",
    "put_noop_task_type",
    "run_sql",
    "schedule",
    "sql",
]


async def _admin(url: str, *statements: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(url)
    try:
        for statement in statements:
            await conn.execute(statement)
    finally:
        await conn.close()


def make_template(database_url: str) -> str:
    """Migrate a template database once per session; returns its name."""
    from engine.ledger.postgres.migrate import migrate

    template = f"{urlsplit(database_url).path.lstrip('/')}_tpl"

    async def build() -> None:
        import asyncpg

        await _admin(database_url, f'CREATE DATABASE "{template}"')
        conn = await asyncpg.connect(with_database(database_url, template))
        try:
            await migrate(conn, partitions=PARTITIONS)
        finally:
            await conn.close()

    asyncio.run(build())
    return template


def drop_template(database_url: str, template: str) -> None:
    asyncio.run(_admin(database_url, f'DROP DATABASE IF EXISTS "{template}" WITH (FORCE)'))


@asynccontextmanager
async def postgres_template_database(database_url: str, template: str) -> AsyncIterator[str]:
    """A fresh, migrated database cloned from ``template``; yields its URL, drops it after."""
    name = f"{template}_{secrets.token_hex(4)}"
    await trio.to_thread.run_sync(
        asyncio.run, _admin(database_url, f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
    )
    try:
        yield with_database(database_url, name)
    finally:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(
                asyncio.run, _admin(database_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            )


CLOCK_SCHEMA: Final = "carillon_test_clock"
"""Where a test database's injected clock lives: ``now()`` and ``clock_timestamp()`` that
shadow the server's (the schema comes before ``pg_catalog`` on the database's search path)
and read the server's clock plus ``shift.seconds``."""

_CLOCK_INSTALL: Final = (
    f"CREATE SCHEMA {CLOCK_SCHEMA}",
    f"CREATE TABLE {CLOCK_SCHEMA}.shift (seconds double precision NOT NULL)",
    f"INSERT INTO {CLOCK_SCHEMA}.shift VALUES (0)",
    f"""CREATE FUNCTION {CLOCK_SCHEMA}.now() RETURNS timestamptz LANGUAGE sql STABLE AS $$
        SELECT pg_catalog.now() + make_interval(secs => (SELECT seconds FROM {CLOCK_SCHEMA}.shift))
    $$""",
    f"""CREATE FUNCTION {CLOCK_SCHEMA}.clock_timestamp() RETURNS timestamptz LANGUAGE sql
    VOLATILE AS $$
        SELECT pg_catalog.clock_timestamp()
            + make_interval(secs => (SELECT seconds FROM {CLOCK_SCHEMA}.shift))
    $$""",
    f'SET search_path = {CLOCK_SCHEMA}, pg_catalog, "$user", public',
)

_NOW_DEFAULTS: Final = """
SELECT format('ALTER TABLE %I.%I ALTER COLUMN %I SET DEFAULT now()',
              table_schema, table_name, column_name)
FROM information_schema.columns
WHERE table_schema = 'public' AND column_default IN ('now()', 'pg_catalog.now()')
"""
"""The columns whose default is the server's ``now()``: bound when the migration ran, so
set again under the injected one."""


async def install_clock(url: str) -> None:
    """Give the database at ``url`` the injected clock: every new connection's ``now()``
    (and each column default's) reads it from then on."""
    conn = await asyncpg.connect(url, timeout=10)
    try:
        for statement in _CLOCK_INSTALL:
            await conn.execute(statement)
        for (alter,) in await conn.fetch(_NOW_DEFAULTS):
            await conn.execute(alter)
        name = urlsplit(url).path.lstrip("/")
        await conn.execute(
            f'ALTER DATABASE "{name}" SET search_path = {CLOCK_SCHEMA}, pg_catalog, "$user", public'
        )
    finally:
        await conn.close()


async def shift_clock(url: str, seconds: float) -> None:
    """Move the injected clock of the database at ``url`` on by ``seconds``."""
    await sql(url, f"UPDATE {CLOCK_SCHEMA}.shift SET seconds = seconds + $1", seconds)


@asynccontextmanager
async def postgres_backend(database_url: str, template: str) -> AsyncIterator[Backend]:
    """A PostgresLedger on a fresh database with the injected clock."""
    from engine.ledger.postgres import open_postgres_ledger

    async with postgres_template_database(database_url, template) as url:
        await trio.to_thread.run_sync(asyncio.run, install_clock(url))

        async def advance(seconds: float) -> None:
            await shift_clock(url, seconds)

        async with open_postgres_ledger(url) as ledger:
            await put_noop_task_type(ledger)
            yield Backend("postgres", ledger, advance)


# --- helpers shared by the ledger tests -----------------------------------------------------


async def run_sql(url: str, statement: str, *args: Any) -> list[asyncpg.Record]:
    connection = await asyncpg.connect(url, timeout=10)
    try:
        rows: list[asyncpg.Record] = await connection.fetch(statement, *args)
        return rows
    finally:
        await connection.close()


async def sql(url: str, statement: str, *args: Any) -> list[asyncpg.Record]:
    """Run one statement on a connection of its own (asyncio in a worker thread)."""
    return await trio.to_thread.run_sync(asyncio.run, run_sql(url, statement, *args))
