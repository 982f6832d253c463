"""One definition of "may this execution start?": the model's, which PostgreSQL mirrors.

:func:`engine.model.startable_at` is the definition; the memory ledger, the dispatcher's queue
and the due cursor call it. PostgreSQL cannot call Python: its generated column
``executions.startable_at``, read under ``status IN ('queued', 'failed')`` by the due read and
the claim, must say the same. These tests pin the column, the due read and the claim to the
model on a grid of rows -- every status, planned and retry instants before, at and after the
instant asked about, and no retry instant at all -- written straight into a real database.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from datetime import datetime, timedelta

import pytest

from engine.ledger.base import Ledger
from engine.ledger.params import ExecutionsClaim, ExecutionsDue, Fence, LeasesAcquire, due_cursor
from engine.ledger.postgres import open_postgres_ledger
from engine.model import (
    STARTABLE_AT_ONCE,
    Execution,
    ExecutionStatus,
    execution_id,
    is_startable,
    startable_at,
)
from tests.ledger.backends import ids_in_partition, postgres_template_database, sql

pytestmark = pytest.mark.postgres

HOUR = timedelta(hours=1)
OFFSETS = (-2 * HOUR, -HOUR, HOUR, 2 * HOUR)
"""Planned and retry instants around the reference instant: an hour apart, so the claim,
judged by the database's moving ``now()``, sees the same grid as the instant read before it."""


@pytest.fixture
async def url(database_url: str, postgres_template: str) -> AsyncIterator[str]:
    async with postgres_template_database(database_url, postgres_template) as opened:
        yield opened


def grid(now: datetime, schedule_ids: list[str]) -> list[Execution]:
    """One row per status, planned instant and retry instant (or none), each of its own
    schedule (ids of partition 0), around ``now``."""
    rows = []
    cases = itertools.product(ExecutionStatus, OFFSETS, (None, *OFFSETS))
    for schedule_id, (status, planned, retry) in zip(schedule_ids, cases, strict=False):
        planned_at = now + planned
        rows.append(
            Execution(
                execution_id=execution_id(schedule_id, planned_at),
                schedule_id=schedule_id,
                tenant_id="acme",
                task_type="noop",
                planned_at=planned_at,
                status=status,
                attempt=0 if status is ExecutionStatus.QUEUED else 1,
                enqueued_at=now,
                not_before=None if retry is None else now + retry,
                attempt_expires_at=now + HOUR if status is ExecutionStatus.RUNNING else None,
                finished_at=now if status.is_terminal else None,
                partition_id=0,
            )
        )
    return rows


async def write(url: str, rows: list[Execution]) -> None:
    await sql(
        url,
        """
        INSERT INTO executions (execution_id, schedule_id, tenant_id, task_type, partition_id,
                                planned_at, status, attempt, not_before, attempt_expires_at,
                                enqueued_at, finished_at)
        SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::integer[],
                             $6::timestamptz[], $7::text[], $8::integer[], $9::timestamptz[],
                             $10::timestamptz[], $11::timestamptz[], $12::timestamptz[])
        """,
        [row.execution_id for row in rows],
        [row.schedule_id for row in rows],
        [row.tenant_id for row in rows],
        [row.task_type for row in rows],
        [row.partition_id for row in rows],
        [row.planned_at for row in rows],
        [str(row.status) for row in rows],
        [row.attempt for row in rows],
        [row.not_before for row in rows],
        [row.attempt_expires_at for row in rows],
        [row.enqueued_at for row in rows],
        [row.finished_at for row in rows],
    )


async def grid_in(url: str, ledger: Ledger) -> tuple[datetime, list[Execution]]:
    now = await ledger.database_now()
    count = len(ExecutionStatus) * len(OFFSETS) * (len(OFFSETS) + 1)
    rows = grid(now, ids_in_partition(0, count))
    assert len(rows) == count
    await write(url, rows)
    return now, rows


async def test_the_startable_at_column_is_the_models_startable_at(url: str) -> None:
    async with open_postgres_ledger(url) as ledger:
        _, rows = await grid_in(url, ledger)
    stored = {
        record["execution_id"]: (record["startable_at"], record["at_once"])
        for record in await sql(
            url,
            "SELECT execution_id, startable_at, startable_at = '-infinity' AS at_once "
            "FROM executions WHERE status IN ('queued', 'failed')",
        )
    }
    for row in rows:
        expected = startable_at(row)
        if expected is None:
            assert row.execution_id not in stored, row
        elif expected == STARTABLE_AT_ONCE:
            assert stored[row.execution_id][1], row
        else:
            assert stored[row.execution_id] == (expected, False), row


async def test_the_due_read_returns_what_the_model_says_may_start_in_its_order(url: str) -> None:
    async with open_postgres_ledger(url) as ledger:
        now, rows = await grid_in(url, ledger)
        for offset in (-3 * HOUR, *OFFSETS, 3 * HOUR, timedelta(0)):
            before = now + offset
            due = await ledger.executions_due(ExecutionsDue([0], before, limit=1_000))
            expected = sorted(
                (row for row in rows if is_startable(row, before)),
                key=lambda row: (due_cursor(row).startable_at, row.execution_id),
            )
            assert [e.execution_id for e in due] == [e.execution_id for e in expected], offset
            assert [due_cursor(e) for e in due] == [due_cursor(e) for e in expected]


async def test_a_claim_starts_exactly_what_the_model_says_may_start_now(url: str) -> None:
    async with open_postgres_ledger(url) as ledger:
        now, rows = await grid_in(url, ledger)
        (lease,) = await ledger.leases_acquire(LeasesAcquire("n1", [0], ttl_s=60))
        fence = Fence(0, "n1", lease.fencing_token)
        claimed = await ledger.executions_claim(
            ExecutionsClaim([fence], [row.execution_id for row in rows], 60, "n1")
        )
    expected = {row.execution_id for row in rows if is_startable(row, now)}
    assert {e.execution_id for e in claimed} == expected
    # The grid holds every case: some start, some wait, and a retry without an instant
    # starts at once.
    assert 0 < len(expected) < len(rows)
    assert any(
        row.status is ExecutionStatus.FAILED
        and row.not_before is None
        and row.execution_id in expected
        for row in rows
    )
