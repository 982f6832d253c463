"""Execution rows decoded by position: every column lands in its field, NULL or not.

``execution_from_columns`` takes a shorter constructor call when the four columns the hot
path leaves NULL are NULL; both calls must build the same execution.
"""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

from engine.ledger.postgres.rows import execution_from_columns
from engine.model import Execution, ExecutionStatus

T0 = datetime(2026, 3, 8, 7, tzinfo=UTC)


def test_every_column_lands_in_its_field_whichever_are_null() -> None:
    for not_before, finished_at, error_code, error_message, started_at in itertools.product(
        (None, T0 + timedelta(seconds=5)),
        (None, T0 + timedelta(seconds=9)),
        (None, "http_503"),
        (None, "unavailable"),
        (None, T0 + timedelta(seconds=1)),
    ):
        expected = Execution(
            execution_id="s1:2026-03-08T07:00:00Z",
            schedule_id="s1",
            tenant_id="acme",
            task_type="hook",
            planned_at=T0,
            status=ExecutionStatus.RUNNING,
            attempt=2,
            enqueued_at=T0 - timedelta(seconds=3),
            not_before=not_before,
            started_at=started_at,
            finished_at=finished_at,
            error_code=error_code,
            error_message=error_message,
            fencing_token=7,
            partition_id=12,
            attempt_expires_at=None if started_at is None else T0 + timedelta(minutes=1),
        )
        columns = (
            expected.execution_id,
            expected.schedule_id,
            expected.tenant_id,
            expected.task_type,
            expected.planned_at,
            "running",
            expected.attempt,
            expected.enqueued_at,
            not_before,
            started_at,
            finished_at,
            error_code,
            error_message,
            expected.fencing_token,
            expected.partition_id,
            expected.attempt_expires_at,
        )
        assert execution_from_columns(columns) == expected
        assert execution_from_columns((3, [1], *columns), 2) == expected
