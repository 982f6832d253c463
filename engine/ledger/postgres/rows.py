"""Values in and out of SQL: rows to records, and batches to array literals.

Rows are read by column name, except executions -- the hot path -- which are read by
position in the order of :data:`~engine.ledger.postgres.sql.EXECUTION_COLUMNS`. asyncpg
returns ``timestamptz`` as aware UTC datetimes, which is what the records promise, so
instants pass through untouched.

A complete's batch goes in as *array literals* (:func:`text_array`, :func:`int_array`,
:func:`timestamptz_array`): one ``text`` parameter per column that the statement casts,
``$1::text::text[]``. asyncpg's binary array encoder makes one or two ``isinstance`` checks
against ``collections.abc`` classes for every element -- Python-level calls, about 0.3 us
each; measured, a complete of 5,000 rows spent 12-15 ms of client CPU encoding its six
arrays, 5.5-7 ms as literals -- and the server's time stays the same. (Only where the array
is unnested: an ``= ANY($1::text::text[])`` makes the claim's generic plan scan the table,
see :data:`~engine.ledger.postgres.sql_executions.EXECUTIONS_CLAIM`.)
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Final, TypeVar

import asyncpg
import msgspec

from engine.core.dst import DstGap, DstOverlap
from engine.ledger.params import Attempt, ChangeKind, NodeInfo, ScheduleChange, ScheduleGroup
from engine.model import (
    ApiToken,
    AuditEvent,
    CatchUpPolicy,
    ConsoleSession,
    Execution,
    ExecutionStatus,
    HandlerKind,
    Lease,
    OverlapPolicy,
    PlannerCheckpoint,
    Schedule,
    TaskType,
    Tenant,
)

Row = Mapping[str, Any]
T = TypeVar("T")


# Enum lookups by value: calling the enum class costs about a microsecond a field, which a
# planner loading a million schedules notices.
_CATCH_UP: Final = {member.value: member for member in CatchUpPolicy}
_DST_GAP: Final = {member.value: member for member in DstGap}
_DST_OVERLAP: Final = {member.value: member for member in DstOverlap}
_OVERLAP: Final = {member.value: member for member in OverlapPolicy}
_STATUS: Final = {member.value: member for member in ExecutionStatus}
_EXECUTION_COLUMN_COUNT: Final = 16


def schedule_from_row(row: Row) -> Schedule:
    # Values shared by many schedules are interned, so a million loaded schedules hold one
    # copy of each tenant, expression, zone and task type rather than a million.
    return Schedule(
        schedule_id=row["schedule_id"],
        tenant_id=sys.intern(row["tenant_id"]),
        cron_expr=sys.intern(row["cron_expr"]),
        timezone=sys.intern(row["timezone"]),
        task_type=sys.intern(row["task_type"]),
        payload=row["payload"],
        enabled=row["enabled"],
        next_run_at=row["next_run_at"],
        updated_at=row["updated_at"],
        version=row["version"],
        partition_id=row["partition_id"],
        catch_up=_CATCH_UP[row["catch_up"]],
        catch_up_window_s=row["catch_up_window_s"],
        dst_gap=_DST_GAP[row["dst_gap"]],
        dst_overlap=_DST_OVERLAP[row["dst_overlap"]],
        overlap=None if row["overlap"] is None else _OVERLAP[row["overlap"]],
    )


def execution_from_columns(row: asyncpg.Record, first: int = 0) -> Execution:
    """An execution from :data:`~engine.ledger.postgres.sql.EXECUTION_COLUMNS` starting at
    column ``first``, read by position: half the cost of reading by name, which shows in a
    burst (every execution is read twice, when fetched and when claimed)."""
    (
        execution_id_,
        schedule_id,
        tenant_id,
        task_type,
        planned_at,
        status,
        attempt,
        enqueued_at,
        not_before,
        started_at,
        finished_at,
        error_code,
        error_message,
        fencing_token,
        partition_id,
        attempt_expires_at,
    ) = row[first : first + _EXECUTION_COLUMN_COUNT]
    # Built with the twelve columns every row has; the four the hot path's rows -- fetched
    # (queued) and claimed (running) -- leave NULL are added only when one is set: msgspec
    # builds a struct from 16 keywords three times slower than from 12 (measured, msgspec
    # 0.22: 1.5 vs 0.45 us).
    execution = Execution(
        execution_id=execution_id_,
        schedule_id=schedule_id,
        tenant_id=tenant_id,
        task_type=task_type,
        planned_at=planned_at,
        status=_STATUS[status],
        attempt=attempt,
        enqueued_at=enqueued_at,
        started_at=started_at,
        fencing_token=fencing_token,
        partition_id=partition_id,
        attempt_expires_at=attempt_expires_at,
    )
    if not_before is None and finished_at is None and error_code is None and error_message is None:
        return execution
    return msgspec.structs.replace(
        execution,
        not_before=not_before,
        finished_at=finished_at,
        error_code=error_code,
        error_message=error_message,
    )


def attempt_from_row(row: Row) -> Attempt:
    return Attempt(
        attempt=row["attempt"],
        outcome=row["outcome"],
        started_at=row["started_at"],
        finished_at=row["finished_at"],
        error_code=row["error_code"],
        error_message=row["error_message"],
    )


def lease_from_row(row: Row) -> Lease:
    return Lease(
        partition_id=row["partition_id"],
        owner_id=row["owner_id"],
        fencing_token=row["fencing_token"],
        expires_at=row["expires_at"],
    )


def node_from_row(row: Row) -> NodeInfo:
    return NodeInfo(
        node_id=row["node_id"],
        region=row["region"],
        started_at=row["started_at"],
        last_seen_at=row["last_seen_at"],
        expires_at=row["expires_at"],
        clock_offset_s=row["clock_offset_s"],
        planner_lag_s={int(key): float(lag) for key, lag in row["planner_lag"].items()},
    )


def change_from_row(row: Row) -> ScheduleChange:
    return ScheduleChange(
        seq=row["seq"],
        schedule_id=row["schedule_id"],
        partition_id=row["partition_id"],
        kind=ChangeKind(row["kind"]),
        version=row["version"],
    )


def task_type_from_row(row: Row) -> TaskType:
    overlap = row["overlap"]
    return TaskType(
        name=row["name"],
        kind=HandlerKind(row["kind"]),
        settings=row["settings"],
        timeout_s=row["timeout_s"],
        max_concurrency=row["max_concurrency"],
        max_concurrency_cluster=row["max_concurrency_cluster"],
        max_attempts=row["max_attempts"],
        backoff_base_s=row["backoff_base_s"],
        backoff_max_s=row["backoff_max_s"],
        overlap=None if overlap is None else OverlapPolicy(overlap),
        tenant_id=row["tenant_id"],
        allowed_tenants=tuple(row["allowed_tenants"]),
        updated_at=row["updated_at"],
        version=row["version"],
    )


def tenant_from_row(row: Row) -> Tenant:
    return Tenant(
        tenant_id=row["tenant_id"],
        weight=row["weight"],
        concurrency_quota=row["concurrency_quota"],
        rate_per_s=row["rate_per_s"],
        burst=row["burst"],
        schedules_max=row["schedules_max"],
        updated_at=row["updated_at"],
        version=row["version"],
    )


def audit_event_from_row(row: Row) -> AuditEvent:
    return AuditEvent(
        event_id=row["event_id"],
        at=row["at"],
        actor=row["actor"],
        action=row["action"],
        target=row["target"],
        details=row["details"],
    )


def token_from_row(row: Row) -> ApiToken:
    return ApiToken(
        token_id=row["token_id"],
        scope=row["scope"],
        description=row["description"],
        created_at=row["created_at"],
        revoked_at=row["revoked_at"],
    )


def session_from_row(row: Row, scope: str) -> ConsoleSession:
    return ConsoleSession(
        token_id=row["token_id"],
        scope=scope,
        created_at=row["created_at"],
        last_seen_at=row["last_seen_at"],
        idle_timeout_s=row["idle_timeout_s"],
        expires_at=row["expires_at"],
        revoked_at=row["revoked_at"],
    )


def group_from_row(row: Row) -> ScheduleGroup:
    return ScheduleGroup(
        cron_expr=row["cron_expr"],
        timezone=row["timezone"],
        dst_gap=_DST_GAP[row["dst_gap"]],
        dst_overlap=_DST_OVERLAP[row["dst_overlap"]],
        tenant_id=row["tenant_id"],
        task_type=row["task_type"],
        count=row["count"],
        sample_schedule_id=row["sample_schedule_id"],
    )


def checkpoint_from_row(row: Row) -> PlannerCheckpoint:
    return PlannerCheckpoint(
        partition_id=row["partition_id"], last_evaluated_at=row["last_evaluated_at"]
    )


# --- results ---------------------------------------------------------------------------------


def in_order(wanted: Iterable[str], present: Iterable[str]) -> list[str]:
    """The ``wanted`` ids that are in ``present``, in ``wanted`` order, without repeats."""
    found = set(present)
    return [value for value in dict.fromkeys(wanted) if value in found]


# --- array literals -------------------------------------------------------------------------


def _quoted(value: str) -> str:
    """An array element in double quotes, its backslashes and double quotes escaped."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _nulls(count: int) -> str:
    return "{" + ",".join(["NULL"] * count) + "}"


def text_array(values: Sequence[str | None]) -> str:
    """``values`` as the literal of a ``text[]`` (cast ``$n::text::text[]``), ``None`` as
    ``NULL``. Every element is quoted, so any text survives: commas, braces, spaces, the word
    NULL, the empty string. (A NUL character is refused by the server, as it always was.)"""
    count = len(values)
    if not count:
        return "{}"
    if values.count(None) == count:
        return _nulls(count)
    try:
        joined = '","'.join(values)  # type: ignore[arg-type]  # a None raises TypeError
    except TypeError:
        return "{" + ",".join("NULL" if v is None else _quoted(v) for v in values) + "}"
    # The separators hold two double quotes each; any more, or a backslash, is in a value.
    if joined.count('"') != 2 * (count - 1) or "\\" in joined:
        return "{" + ",".join(_quoted(v) for v in values) + "}"  # type: ignore[arg-type]
    return '{"' + joined + '"}'


def int_array(values: Sequence[int]) -> str:
    """``values`` as the literal of an ``integer[]`` or ``bigint[]`` (cast
    ``$n::text::integer[]``)."""
    # int.__repr__, not str: a bool is written 0 or 1, as the binary encoder took it.
    return "{" + ",".join(map(int.__repr__, values)) + "}"


def timestamptz_array(values: Sequence[datetime | None]) -> str:
    """``values`` (aware datetimes) as the literal of a ``timestamptz[]`` (cast
    ``$n::text::timestamptz[]``): each in ISO 8601 in UTC, to the microsecond."""
    count = len(values)
    if values.count(None) == count:
        return _nulls(count) if count else "{}"
    return (
        "{"
        + ",".join(
            "NULL" if v is None else '"' + v.astimezone(UTC).isoformat() + '"' for v in values
        )
        + "}"
    )
