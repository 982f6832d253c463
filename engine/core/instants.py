"""RFC 3339 text for instants: the one format Carillon writes and reads.

Written instants are UTC with a ``Z`` suffix and whole seconds unless the instant has a
fraction; read instants must carry an offset (``Z`` or ``+hh:mm``), since a naive timestamp
means different instants on different hosts.
"""

from __future__ import annotations

import functools
from datetime import UTC, datetime

from engine.errors import InvalidField


def format_utc(instant: datetime) -> str:
    """``2026-03-08T07:00:00Z`` for an aware datetime (converted to UTC)."""
    if instant.tzinfo is None:
        raise InvalidField(f"{instant.isoformat()} has no UTC offset")
    return _format_utc(instant)


@functools.lru_cache(maxsize=4096)
def _format_utc(instant: datetime) -> str:
    # Cached: a burst formats the same planned instant for every one of its executions.
    # Aware datetimes hash and compare by their UTC instant, which is all the text depends on.
    text = instant.astimezone(UTC).replace(tzinfo=None).isoformat()
    return f"{text}Z"


def format_local(instant: datetime) -> str:
    """``2026-03-08T03:00:00-04:00``: the instant in its own zone, with its offset."""
    return instant.isoformat()


def parse_instant(text: str, *, field: str = "timestamp") -> datetime:
    """Parse RFC 3339 text with an offset into an aware UTC datetime."""
    try:
        value = datetime.fromisoformat(text.strip())
    except ValueError:
        raise InvalidField(
            f"{field} {text!r} is not an RFC 3339 timestamp such as 2026-03-08T07:00:00Z"
        ) from None
    if value.tzinfo is None:
        raise InvalidField(f"{field} {text!r} has no UTC offset; add Z or an offset such as +02:00")
    return value.astimezone(UTC)
