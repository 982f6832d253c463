"""A minimal dispatchable item for the fair-queue tests: what the queue reads of an execution."""

from __future__ import annotations

from datetime import UTC, datetime

import msgspec

from engine.model import ExecutionStatus

T0 = datetime(2026, 1, 1, tzinfo=UTC)


class Item(msgspec.Struct, frozen=True):
    execution_id: str
    tenant_id: str
    task_type: str = "noop"
    planned_at: datetime = T0
    not_before: datetime | None = None
    status: ExecutionStatus = ExecutionStatus.QUEUED
