"""The records Carillon stores and passes around (msgspec Structs, immutable).

Instants are aware UTC datetimes everywhere; time zones matter only when a cron expression is
turned into instants (:mod:`engine.core.timetable`).

An execution is identified by ``"{schedule_id}:{planned_at}"`` (``planned_at`` in RFC 3339
UTC, :func:`execution_id`). Every node computes the same id for the same planned fire, so
the ledger can deduplicate re-planning and the id doubles as the idempotency key sent to the
handler: the queue may deliver twice, the effect happens once.
"""

from __future__ import annotations

import enum
import re
from datetime import datetime
from typing import Any, Final

import msgspec

from engine.core.dst import DstGap, DstOverlap
from engine.core.instants import format_utc, parse_instant
from engine.errors import InvalidField

IDENTIFIER_LENGTH_MAX: Final = 128
PAYLOAD_BYTES_MAX: Final = 64 * 1024
"""Largest JSON-encoded payload a schedule may carry."""
CATCH_UP_WINDOW_S_DEFAULT: Final = 3600.0
CATCH_UP_WINDOW_S_MAX: Final = 7 * 24 * 3600.0

_IDENTIFIER: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._~-]*$")


class ExecutionStatus(enum.StrEnum):
    """Where an execution is in its life (``docs/ledger.md`` draws the state machine)."""

    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    """The attempt failed; a retry is queued for ``not_before`` unless retries are exhausted."""
    DEAD_LETTER = "dead-letter"
    SKIPPED = "skipped"
    """Deliberately not run (catch-up or overlap policy); ``error_code`` says why."""

    @property
    def is_terminal(self) -> bool:
        return self in _TERMINAL


_TERMINAL: Final = frozenset(
    {ExecutionStatus.SUCCEEDED, ExecutionStatus.DEAD_LETTER, ExecutionStatus.SKIPPED}
)


class CatchUpPolicy(enum.StrEnum):
    """What a planner does with fires missed while nobody owned the schedule's partition.

    Only fires within the schedule's ``catch_up_window_s`` are considered; older ones are
    recorded as skipped with the reason ``catchup_window``.
    """

    NONE = "none"
    """Run none of the missed fires; record them as skipped."""
    LATEST = "latest"
    """Run the most recent missed fire once; record the others as skipped (the default)."""
    ALL = "all"
    """Run every missed fire within the window, each under its own id."""


class OverlapPolicy(enum.StrEnum):
    """What happens when a fire is due while the schedule's previous run is still going."""

    ALLOW = "allow"
    """Run it concurrently (the default)."""
    SKIP = "skip"
    """Record the new fire as skipped with the reason ``overlap``."""
    BUFFER_ONE = "buffer_one"
    """Run it right after the running one finishes; further fires meanwhile are skipped."""


class Schedule(msgspec.Struct, frozen=True, kw_only=True):
    """A cron schedule owned by a tenant."""

    schedule_id: str
    tenant_id: str
    cron_expr: str
    task_type: str
    timezone: str = "UTC"
    payload: dict[str, Any] = msgspec.field(default_factory=dict)
    enabled: bool = True
    next_run_at: datetime | None = None
    """The next planned instant, materialised by the owning planner; ``None`` until planned."""
    updated_at: datetime | None = None
    version: int = 1
    """Incremented on every update; updates carrying an older version are refused."""
    partition_id: int | None = None
    """Assigned by the ledger: ``partition_of(schedule_id, partition_count)``."""
    catch_up: CatchUpPolicy = CatchUpPolicy.LATEST
    catch_up_window_s: float = CATCH_UP_WINDOW_S_DEFAULT
    dst_gap: DstGap = DstGap.AUTO
    dst_overlap: DstOverlap = DstOverlap.AUTO
    overlap: OverlapPolicy = OverlapPolicy.ALLOW


class Execution(msgspec.Struct, frozen=True, kw_only=True):
    """One planned fire of a schedule and what became of it."""

    execution_id: str
    schedule_id: str
    tenant_id: str
    task_type: str
    planned_at: datetime
    status: ExecutionStatus = ExecutionStatus.QUEUED
    attempt: int = 0
    """Attempts started so far; only the current attempt may complete the execution."""
    enqueued_at: datetime | None = None
    not_before: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    error_code: str | None = None
    error_message: str | None = None
    fencing_token: int | None = None
    """The fencing token of the lease under which it was last written."""
    partition_id: int | None = None
    """The partition of its schedule, assigned by the ledger."""
    attempt_expires_at: datetime | None = None
    """While running: when the attempt lease expires and the execution may be re-queued."""


class Lease(msgspec.Struct, frozen=True, kw_only=True):
    """Ownership of one partition, valid until ``expires_at`` by the database's clock."""

    partition_id: int
    owner_id: str | None
    fencing_token: int
    """Incremented on every acquisition, never reused; every fenced write carries it."""
    expires_at: datetime | None


class PlannerCheckpoint(msgspec.Struct, frozen=True, kw_only=True):
    """How far a partition's planner has durably planned."""

    partition_id: int
    last_evaluated_at: datetime


def validate_identifier(value: str, *, kind: str) -> str:
    """Check a schedule, tenant or task-type id: 1-128 of ``A-Z a-z 0-9 . _ ~ -``.

    Colons are excluded so an execution id splits unambiguously at its first colon.
    """
    if not 1 <= len(value) <= IDENTIFIER_LENGTH_MAX or not _IDENTIFIER.match(value):
        raise InvalidField(
            f"{kind} {value!r} is invalid: use 1-{IDENTIFIER_LENGTH_MAX} characters from "
            "letters, digits and . _ ~ -, starting with a letter or digit"
        )
    return value


def execution_id(schedule_id: str, planned_at: datetime) -> str:
    """The deterministic id of the fire of ``schedule_id`` at ``planned_at``."""
    return f"{schedule_id}:{format_utc(planned_at)}"


def parse_execution_id(value: str) -> tuple[str, datetime]:
    """Split an execution id back into ``(schedule_id, planned_at)``."""
    schedule_id, sep, instant = value.partition(":")
    if not sep or not schedule_id:
        raise InvalidField(f"execution id {value!r} is not of the form schedule_id:planned_at")
    return validate_identifier(schedule_id, kind="schedule id"), parse_instant(
        instant, field="execution id instant"
    )


def check_payload_size(payload: dict[str, Any]) -> int:
    """The JSON size of ``payload`` in bytes; :class:`InvalidField` above the limit."""
    size = len(msgspec.json.encode(payload))
    if size > PAYLOAD_BYTES_MAX:
        raise InvalidField(
            f"payload is {size} bytes of JSON; the limit is {PAYLOAD_BYTES_MAX} bytes "
            "(store large data elsewhere and pass a reference)"
        )
    return size
