"""Fixtures: the CLI pointed at a real API on a memory ledger, or on a fresh Postgres database.

The memory ledger runs on a :class:`ManualClock` that is also the API's monotonic clock, so
a test moves database time, rate limits and the token cache together, without sleeping.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime

import pytest

from engine.api.app import ApiContext
from engine.ledger.base import Ledger
from engine.testing import ManualClock
from tests.cli.harness import Cli, cli_runner, create_token, serving
from tests.ledger.backends import PARTITIONS, postgres_template_database, put_noop_task_type

START = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
"""The memory ledger's database time when a test starts."""
ENV_VARIABLES = ("CARILLON_URL", "CARILLON_TOKEN", "CARILLON_TOKEN_FILE")


@dataclass
class Api:
    """A running API: its URL, ledger, clock and an admin token. On the memory ledger the
    clock is also the database's; on Postgres it drives only the API's own timers."""

    url: str
    ledger: Ledger
    clock: ManualClock
    context: ApiContext
    admin_token: str

    async def token(self, *, tenant: str | None = None) -> str:
        """A new token: admin, or confined to ``tenant``."""
        return await create_token(self.ledger, tenant=tenant)


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """No test sees the developer's own CARILLON_URL or token."""
    for name in ENV_VARIABLES:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Cli:
    return cli_runner(capsys)


@pytest.fixture
async def api(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Api]:
    """The API on a memory ledger (with the ``noop`` task type), and the CLI pointed at it
    with an admin token."""
    from engine.ledger.memory import MemoryLedger

    clock = ManualClock(START)
    ledger = MemoryLedger(clock=clock, partition_count=PARTITIONS)
    await put_noop_task_type(ledger)
    admin = await create_token(ledger)
    async with serving(ledger, clock.monotonic) as (url, context):
        monkeypatch.setenv("CARILLON_URL", url)
        monkeypatch.setenv("CARILLON_TOKEN", admin)
        yield Api(url, ledger, clock, context, admin)


@pytest.fixture
async def database(database_url: str, postgres_template: str) -> AsyncIterator[str]:
    """A fresh, migrated Postgres database; yields its URL."""
    async with postgres_template_database(database_url, postgres_template) as fresh:
        yield fresh


@pytest.fixture
async def pg_api(database: str, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Api]:
    """The API on a Postgres ledger (with the ``noop`` task type), and the CLI pointed at it
    with an admin token; the :class:`ManualClock` drives the API's token cache."""
    from engine.ledger.postgres import open_postgres_ledger

    clock = ManualClock(START)
    async with open_postgres_ledger(database) as ledger:
        await put_noop_task_type(ledger)
        admin = await create_token(ledger)
        async with serving(ledger, clock.monotonic) as (url, context):
            monkeypatch.setenv("CARILLON_URL", url)
            monkeypatch.setenv("CARILLON_TOKEN", admin)
            yield Api(url, ledger, clock, context, admin)
