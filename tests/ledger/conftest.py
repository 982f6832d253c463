"""The ``backend`` fixture: every contract test (engine/testing/ledger_contract/, run by the
``test_contract_*`` modules here) runs on the memory ledger and on Postgres; ``fresh_url``:
an empty database of a test's own (the migration tests watch one go from empty to migrated)."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import pytest
import trio

from engine.ledger.database import url_with_database
from tests.ledger.backends import Backend, memory_backend, postgres_backend, sql


@pytest.fixture(params=["memory", pytest.param("postgres", marks=pytest.mark.postgres)])
async def backend(request: pytest.FixtureRequest) -> AsyncIterator[Backend]:
    if request.param == "memory":
        async with memory_backend() as opened:
            yield opened
    else:
        database_url = request.getfixturevalue("database_url")
        template = request.getfixturevalue("postgres_template")
        async with postgres_backend(database_url, template) as opened:
            yield opened


@pytest.fixture
async def fresh_url(database_url: str) -> AsyncIterator[str]:
    """An empty database of this test's own, dropped after it."""
    name = f"{urlsplit(database_url).path.lstrip('/')}_m{secrets.token_hex(4)}"
    await sql(database_url, f'CREATE DATABASE "{name}"')
    try:
        yield url_with_database(database_url, name)
    finally:
        with trio.CancelScope(shield=True):
            await sql(database_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
