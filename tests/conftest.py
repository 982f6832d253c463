"""Shared fixtures: a throwaway database on whichever server the session resolves.

The server comes from :func:`engine.ledger.database.resolve_database` (``$CARILLON_DATABASE_URL``,
else the local server, else embedded PostgreSQL). The session creates one database with a
unique name, hands its URL to tests marked ``postgres``, and drops it at the end; tests never
touch a database they did not create.
"""

from __future__ import annotations

import asyncio
import os
import secrets
from collections.abc import AsyncIterator, Iterator

import asyncpg
import pytest
import trio

from engine.ledger.bridge import DatabaseBridge, open_bridge
from engine.ledger.database import ResolvedDatabase, resolve_database, url_with_database


async def _execute(url: str, statement: str) -> None:
    connection = await asyncpg.connect(url, timeout=10)
    try:
        await connection.execute(statement)
    finally:
        await connection.close()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``slow`` (the long fuzz, the long sweep, the game day) are skipped unless
    the run selects them: ``-m slow``."""
    if "slow" in (config.getoption("markexpr") or ""):
        return
    skip = pytest.mark.skip(reason="slow: select it with -m slow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def database_server() -> Iterator[ResolvedDatabase]:
    with resolve_database() as resolved:
        yield resolved


@pytest.fixture(scope="session")
def database_url(database_server: ResolvedDatabase) -> Iterator[str]:
    """The URL of a database created for this test session (tests using it: ``postgres``)."""
    name = f"carillon_test_{os.getpid()}_{secrets.token_hex(4)}"
    asyncio.run(_execute(database_server.url, f'CREATE DATABASE "{name}"'))
    try:
        yield url_with_database(database_server.url, name)
    finally:
        asyncio.run(_execute(database_server.url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@pytest.fixture
async def bridge() -> AsyncIterator[DatabaseBridge]:
    async with open_bridge() as opened:
        yield opened


@pytest.fixture
async def connection(
    bridge: DatabaseBridge, database_url: str
) -> AsyncIterator[asyncpg.Connection]:
    """One asyncpg connection living on the bridge's loop, closed even if the test is cancelled."""
    opened = await bridge.call(asyncpg.connect, database_url)
    try:
        yield opened
    finally:
        with trio.CancelScope(shield=True):
            await bridge.call(opened.close)


@pytest.fixture(scope="session")
def postgres_template(database_url: str) -> Iterator[str]:
    """A database migrated once per session, cloned by tests that need a fresh one."""
    from tests.ledger.backends import drop_template, make_template

    template = make_template(database_url)
    yield template
    drop_template(database_url, template)
