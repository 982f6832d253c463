"""The checks a ledger call's input passes before anything is read or written, written once.

The parameter objects of :mod:`engine.ledger.params` check themselves with these
(``checked()``), and both backends call ``params.checked()`` first, so a malformed input is
refused by the same rule with the same message whichever backend serves it. The few checks
that need the cluster's settings (partition ranges, routing an id to a fenced partition)
take them as arguments. ``InvalidField`` is the only error raised here.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Final, TypeVar

from engine.core.hashing import partition_of
from engine.errors import InvalidField
from engine.model import IDENTIFIER_LENGTH_MAX, parse_execution_id

T = TypeVar("T")

DURATION_S_MAX: Final = 366 * 24 * 3600.0
"""Longest lease, attempt lease or heartbeat TTL accepted (keeps expiry instants in range)."""
TOKEN_HASH_BYTES: Final = 32
"""Length of a token's or session's hash: the SHA-256 of its secret, computed by the caller."""


def utc(value: datetime, *, field: str) -> datetime:
    """``value`` in UTC; ``InvalidField`` if it is naive (a naive time means different
    instants on different hosts)."""
    if value.tzinfo is None or value.utcoffset() is None:
        raise InvalidField(f"{field} {value.isoformat()} has no UTC offset")
    return value.astimezone(UTC)


def utc_or_none(value: datetime | None, *, field: str) -> datetime | None:
    return None if value is None else utc(value, field=field)


def check_limit(limit: int, maximum: int, *, field: str = "limit") -> int:
    """``limit`` if ``1 <= limit <= maximum``; ``InvalidField`` otherwise."""
    if not 1 <= limit <= maximum:
        raise InvalidField(f"{field} must be between 1 and {maximum}, got {limit}")
    return limit


def check_batch(rows: int, maximum: int, *, field: str) -> None:
    """``InvalidField`` if a write carries more than ``maximum`` rows in ``field``."""
    if rows > maximum:
        raise InvalidField(f"{field} carries {rows} rows; at most {maximum} per call")


def check_duration(value: float, *, field: str) -> float:
    """A positive, finite number of seconds up to :data:`DURATION_S_MAX`."""
    if not (math.isfinite(value) and 0 < value <= DURATION_S_MAX):
        raise InvalidField(
            f"{field} must be a positive number of seconds up to {DURATION_S_MAX:.0f}, got {value}"
        )
    return value


def check_wait_timeout(timeout_s: float) -> float:
    """How long a wait may last: zero or more seconds."""
    if not timeout_s >= 0:
        raise InvalidField(f"timeout_s must be zero or more seconds, got {timeout_s}")
    return timeout_s


def check_not_empty(value: str, *, field: str) -> str:
    if not value:
        raise InvalidField(f"{field} must not be empty")
    return value


def check_digest(value: bytes, name: str, of: str) -> bytes:
    """``value`` if it is :data:`TOKEN_HASH_BYTES` bytes: a SHA-256 digest of ``of``."""
    if not isinstance(value, bytes) or len(value) != TOKEN_HASH_BYTES:
        size = len(value) if isinstance(value, bytes) else type(value).__name__
        raise InvalidField(f"a {name} is the {TOKEN_HASH_BYTES}-byte SHA-256 of {of}, got {size}")
    return value


def check_token_hash(token_hash: bytes) -> bytes:
    """``token_hash`` if it is :data:`TOKEN_HASH_BYTES` bytes (a SHA-256 digest)."""
    return check_digest(token_hash, "token hash", "the secret")


def check_session_hash(session_hash: bytes) -> bytes:
    """``session_hash`` if it is :data:`TOKEN_HASH_BYTES` bytes (a SHA-256 digest)."""
    return check_digest(session_hash, "session hash", "the session id")


def check_id_prefix(prefix: str | None) -> str | None:
    """A schedule listing's ``id_prefix``: ``None`` or at most an identifier's length."""
    if prefix is not None and len(prefix) > IDENTIFIER_LENGTH_MAX:
        raise InvalidField(
            f"id_prefix is {len(prefix)} characters long; no id is longer than "
            f"{IDENTIFIER_LENGTH_MAX}"
        )
    return prefix


def check_clock_offset(offset_s: float | None) -> float | None:
    """A node's reported clock offset: ``None`` or a finite number of seconds."""
    if offset_s is None:
        return None
    if isinstance(offset_s, bool) or not isinstance(offset_s, int | float):
        raise InvalidField(f"clock_offset_s must be a number of seconds, got {offset_s!r}")
    if not math.isfinite(offset_s):
        raise InvalidField(f"clock_offset_s must be a finite number of seconds, got {offset_s}")
    return float(offset_s)


def check_planner_lags(lags: dict[int, float], partition_count: int) -> dict[int, float]:
    """A node's reported planner lags: partition ids in range, finite seconds >= 0."""
    checked: dict[int, float] = {}
    for partition_id, lag_s in lags.items():
        if isinstance(partition_id, bool) or not isinstance(partition_id, int):
            raise InvalidField(f"planner_lag_s keys are partition ids, got {partition_id!r}")
        if not 0 <= partition_id < partition_count:
            raise InvalidField(
                f"planner_lag_s names partition {partition_id}, outside 0..{partition_count - 1}"
            )
        if (
            isinstance(lag_s, bool)
            or not isinstance(lag_s, int | float)
            or not (math.isfinite(lag_s) and lag_s >= 0)
        ):
            raise InvalidField(f"planner_lag_s must be seconds >= 0, got {lag_s!r}")
        checked[partition_id] = float(lag_s)
    return checked


def check_partitions(partition_ids: Iterable[int], partition_count: int) -> list[int]:
    """The distinct ids, sorted; ``InvalidField`` for one outside the cluster."""
    distinct = sorted(set(partition_ids))
    unknown = [p for p in distinct if not 0 <= p < partition_count]
    if unknown:
        raise InvalidField(
            f"partition(s) {unknown} do not exist; this cluster has partitions "
            f"0-{partition_count - 1}"
        )
    return distinct


def check_schedules_routed(
    schedule_ids: Iterable[str], fenced: Iterable[int], partition_count: int
) -> None:
    """``InvalidField`` unless every schedule id belongs to a fenced partition."""
    allowed = set(fenced)
    for schedule_id in unique(schedule_ids):
        partition = partition_of(schedule_id, partition_count)
        if partition not in allowed:
            raise InvalidField(
                f"schedule {schedule_id!r} belongs to partition {partition}, "
                f"which is not fenced by this call ({sorted(allowed)})"
            )


def check_executions_routed(
    execution_ids: list[str],
    fenced: Iterable[int],
    partition_count: int,
    partition_of_execution: Callable[[str, int], int] | None = None,
) -> None:
    """``InvalidField`` unless every execution id is well formed (checked first, for all of
    them) and belongs to a fenced partition: a misrouted id is refused before anything is
    read. ``partition_of_execution`` may be a cached version of the rule (the hot path)."""
    locate = partition_of_execution or execution_partition
    partitions = [locate(value, partition_count) for value in execution_ids]
    allowed = set(fenced)
    for value, partition in zip(execution_ids, partitions, strict=True):
        if partition not in allowed:
            schedule_id = parse_execution_id(value)[0]
            raise InvalidField(
                f"execution of schedule {schedule_id!r} belongs to partition {partition}, "
                f"which is not fenced by this call ({sorted(allowed)})"
            )


def execution_partition(execution_id: str, partition_count: int) -> int:
    """The partition of an execution: its schedule's; ``InvalidField`` for an id no plan
    could have made."""
    return partition_of(parse_execution_id(execution_id)[0], partition_count)


def unique(values: Iterable[T]) -> list[T]:
    """``values`` without repeats, first occurrence kept, order kept."""
    return list(dict.fromkeys(values))
