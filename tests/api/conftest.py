"""Fixtures of the API tests: the app on the memory ledger, and on real Postgres.

* ``api``: parametrised over the memory ledger and a fresh Postgres database (marked
  ``postgres``), for tests of what the routes do to the ledger.
* ``memory_api``: the memory ledger only, for tests of the HTTP layer itself (auth, limits,
  decoding) and for those that move the ledger's clock.

The authenticator always runs on a :class:`~engine.testing.ManualClock` (never trio's
``MockClock``, which must not drive real Postgres), so a test moves the token cache and the
rate limits forward with ``api.clock.advance``.

Tests marked ``slow`` (the long fuzz) are skipped unless the run selects them (``-m slow``;
the hook is in ``tests/conftest.py``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from engine.testing import ManualClock
from tests.api.support import START, Api, memory_ledger, prepare_ledger, serve
from tests.ledger.backends import postgres_backend


@pytest.fixture
async def memory_api() -> AsyncIterator[Api]:
    clock = ManualClock(START)
    ledger = memory_ledger(clock)
    await prepare_ledger(ledger)
    async with serve(ledger, clock, "memory") as api:
        yield api


@pytest.fixture(params=["memory", pytest.param("postgres", marks=pytest.mark.postgres)])
async def api(request: pytest.FixtureRequest) -> AsyncIterator[Api]:
    if request.param == "memory":
        clock = ManualClock(START)
        ledger = memory_ledger(clock)
        await prepare_ledger(ledger)
        async with serve(ledger, clock, "memory") as served:
            yield served
        return
    database_url = request.getfixturevalue("database_url")
    template = request.getfixturevalue("postgres_template")
    async with postgres_backend(database_url, template) as backend:
        await prepare_ledger(backend.ledger)
        async with serve(backend.ledger, ManualClock(START), "postgres") as served:
            yield served
