"""The ledger backends the contract suite runs against, behind one small interface.

* ``memory``: :class:`MemoryLedger` on a :class:`ManualClock`; ``advance`` moves its clock.
* ``postgres``: :class:`PostgresLedger` on a fresh database cloned from a migrated template
  (``CREATE DATABASE ... TEMPLATE``), dropped after the test; ``advance`` really waits, since
  Postgres judges expiry by its own ``now()``.

Both start with the task type :data:`NOOP` stored, since schedules may only name existing
task types.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

import asyncpg
import trio

from engine.core.hashing import partition_of
from engine.ledger.base import Ledger
from engine.ledger.database import url_with_database as with_database
from engine.ledger.params import TaskTypesPut
from engine.model import HandlerKind, Schedule, TaskType
from engine.testing import ManualClock

PARTITIONS = 8
START = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
NOOP = TaskType(name="noop", kind=HandlerKind.NOOP, allowed_tenants=("*",))
"""The task type the suites' schedules name."""


async def put_noop_task_type(ledger: Ledger) -> None:
    """Store :data:`NOOP` (again): needed before creating schedules of task type ``noop``."""
    await ledger.task_types_put(TaskTypesPut(NOOP))


@dataclass
class Backend:
    name: str
    ledger: Ledger
    clock: ManualClock | None

    async def advance(self, seconds: float) -> None:
        """Let ``seconds`` pass on the ledger's clock."""
        if self.clock is not None:
            self.clock.advance(seconds)
            await trio.lowlevel.checkpoint()
        else:
            await trio.sleep(seconds)


@asynccontextmanager
async def memory_backend() -> AsyncIterator[Backend]:
    from engine.ledger.memory import MemoryLedger

    clock = ManualClock(START)
    ledger = MemoryLedger(clock=clock, partition_count=PARTITIONS)
    await put_noop_task_type(ledger)
    yield Backend("memory", ledger, clock)


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


@asynccontextmanager
async def postgres_backend(database_url: str, template: str) -> AsyncIterator[Backend]:
    from engine.ledger.postgres import open_postgres_ledger

    async with (
        postgres_template_database(database_url, template) as url,
        open_postgres_ledger(url) as ledger,
    ):
        await put_noop_task_type(ledger)
        yield Backend("postgres", ledger, None)


# --- helpers shared by the ledger tests -----------------------------------------------------


def ids_in_partition(partition: int, count: int, prefix: str = "s") -> list[str]:
    """``count`` schedule ids that hash to ``partition`` (of :data:`PARTITIONS`)."""
    found: list[str] = []
    n = 0
    while len(found) < count:
        candidate = f"{prefix}-{n}"
        if partition_of(candidate, PARTITIONS) == partition:
            found.append(candidate)
        n += 1
    return found


def schedule(schedule_id: str, **overrides: Any) -> Schedule:
    """A minutely ``noop`` schedule of tenant ``acme``, with ``overrides``."""
    fields: dict[str, Any] = {
        "schedule_id": schedule_id,
        "tenant_id": "acme",
        "cron_expr": "* * * * *",
        "task_type": "noop",
    }
    fields.update(overrides)
    return Schedule(**fields)


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
