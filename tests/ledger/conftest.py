"""The ``backend`` fixture: every contract test (engine/testing/ledger_contract/, run by the
``test_contract_*`` modules here) runs on the memory ledger and on Postgres."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.ledger.backends import Backend, memory_backend, postgres_backend


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
