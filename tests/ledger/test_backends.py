"""The contract's backends let time pass on the ledger's clock without waiting."""

from __future__ import annotations

from datetime import timedelta

import pytest
import trio

from engine.ledger.params import AuditQuery, TokensCreate
from engine.model import ApiToken
from tests.ledger.backends import START, memory_backend, postgres_backend


async def test_the_memory_backend_moves_its_manual_clock_exactly() -> None:
    async with memory_backend() as backend:
        assert backend.clock_stands_still
        assert await backend.ledger.database_now() == START
        await backend.advance(90.5)
        assert await backend.ledger.database_now() == START + timedelta(seconds=90.5)
        with pytest.raises(ValueError, match="backwards"):
            await backend.advance(-1)


@pytest.mark.postgres
async def test_the_postgres_backend_shifts_the_servers_now_and_its_defaults_at_once(
    database_url: str, postgres_template: str
) -> None:
    """An hour passes on the database's clock in no time; rows stamped by a column default
    (``DEFAULT now()``, bound when the migration ran) read the injected clock too."""
    async with postgres_backend(database_url, postgres_template) as backend:
        assert not backend.clock_stands_still
        before = await backend.ledger.database_now()
        began = trio.current_time()
        await backend.advance(3600)
        after = await backend.ledger.database_now()
        assert trio.current_time() - began < 30
        assert timedelta(hours=1) <= after - before < timedelta(hours=1, seconds=30)
        token = ApiToken(token_id="t1", scope="admin")
        await backend.ledger.tokens_create(TokensCreate(token, b"\x01" * 32, "test"))
        [event] = await backend.ledger.audit_list(AuditQuery())
        assert event.at >= after  # audit_events.at DEFAULT now()
