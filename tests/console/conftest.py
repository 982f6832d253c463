"""Fixtures of the console tests: the app on the memory ledger (and on real Postgres), and a
browser-like client per signed-in token.

* ``console``: parametrised over the memory ledger and a fresh Postgres database (marked
  ``postgres``), for pages whose reads and writes go to the ledger;
* ``memory_console``: the memory ledger only, for the HTTP layer (sessions, CSRF, headers)
  and for tests that move the ledger's clock.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from engine.testing import ManualClock
from tests.api.support import START, memory_ledger, prepare_ledger, serve
from tests.console.support import Console
from tests.ledger.backends import postgres_backend


@pytest.fixture
async def memory_console() -> AsyncIterator[Console]:
    clock = ManualClock(START)
    ledger = memory_ledger(clock)
    await prepare_ledger(ledger)
    async with serve(ledger, clock, "memory") as api:
        console = Console(api)
        yield console
        await console.close()


@pytest.fixture(params=["memory", pytest.param("postgres", marks=pytest.mark.postgres)])
async def console(request: pytest.FixtureRequest) -> AsyncIterator[Console]:
    if request.param == "memory":
        clock = ManualClock(START)
        ledger = memory_ledger(clock)
        await prepare_ledger(ledger)
        async with serve(ledger, clock, "memory") as api:
            console = Console(api)
            yield console
            await console.close()
        return
    database_url = request.getfixturevalue("database_url")
    template = request.getfixturevalue("postgres_template")
    async with postgres_backend(database_url, template) as backend:
        await prepare_ledger(backend.ledger)
        async with serve(backend.ledger, ManualClock(START), "postgres") as api:
            console = Console(api)
            yield console
            await console.close()
