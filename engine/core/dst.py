"""Turning a local wall-clock time into UTC instants, under a daylight-saving policy.

A cron expression matches *wall-clock* times. Most wall times exist exactly once, but around
a transition a wall time can be missing (spring-forward *gap*) or happen twice (fall-back
*overlap*). The policy says what a match there means:

* gap — ``shift``: fire once at the first instant after the gap; ``skip``: do not fire;
* overlap — ``first`` / ``last``: fire on that pass only; ``both``: fire on each pass;
* ``auto`` — the cronie/Vixie rule: a fixed-time schedule (no ``*`` in minute or hour)
  behaves as ``shift`` + ``first``, so a daily job runs once a day; a wildcard schedule as
  ``skip`` + ``both``, so an every-15-minutes job keeps following absolute time.

Classification relies on PEP 495 folds: in a gap, ``fold=0`` applies the offset from before
the transition, so the ``fold=0`` instant is *later* than the ``fold=1`` instant; in an
overlap it is the other way round. This works for every zone zoneinfo knows, including
30-minute (Lord Howe), 45-minute (Chatham) and midnight transitions (Santiago, Cairo).
"""

from __future__ import annotations

import enum
from datetime import UTC, datetime, timedelta
from typing import Final
from zoneinfo import ZoneInfo

import msgspec


class DstGap(enum.StrEnum):
    """What a wall time that does not exist (spring forward) resolves to."""

    AUTO = "auto"
    SHIFT = "shift"
    SKIP = "skip"


class DstOverlap(enum.StrEnum):
    """Which passes of a wall time that happens twice (fall back) fire."""

    AUTO = "auto"
    FIRST = "first"
    LAST = "last"
    BOTH = "both"


class Adjustment(enum.StrEnum):
    """Why a fire is not simply 'the only instant of its wall time'."""

    NONE = "none"
    SHIFTED = "shifted"
    """The wall time fell in a gap; the fire moved to the first instant after it."""
    FIRST_PASS = "first-pass"
    """The wall time happens twice; this is the first pass."""
    SECOND_PASS = "second-pass"
    """The wall time happens twice; this is the second pass."""


class WallResolution(msgspec.Struct, frozen=True):
    """One UTC instant a matching wall time resolved to."""

    instant: datetime
    adjustment: Adjustment


_ONE_SECOND: Final = timedelta(seconds=1)


def effective_policy(
    gap: DstGap, overlap: DstOverlap, *, fixed_time: bool
) -> tuple[DstGap, DstOverlap]:
    """Replace ``auto`` by the cronie rule for a fixed-time or a wildcard schedule."""
    if gap is DstGap.AUTO:
        gap = DstGap.SHIFT if fixed_time else DstGap.SKIP
    if overlap is DstOverlap.AUTO:
        overlap = DstOverlap.FIRST if fixed_time else DstOverlap.BOTH
    return gap, overlap


def fold_instants(wall: datetime, zone: ZoneInfo) -> tuple[datetime, datetime]:
    """The UTC instants of naive ``wall`` read with ``fold=0`` and with ``fold=1``."""
    first = wall.replace(tzinfo=zone, fold=0).astimezone(UTC)
    second = wall.replace(tzinfo=zone, fold=1).astimezone(UTC)
    return first, second


def is_repeated(wall: datetime, zone: ZoneInfo) -> bool:
    """True when naive ``wall`` happens twice in ``zone`` (a fall-back overlap)."""
    first, second = fold_instants(wall, zone)
    return first < second


def resolve_wall(
    wall: datetime, zone: ZoneInfo, gap: DstGap, overlap: DstOverlap
) -> tuple[WallResolution, ...]:
    """All instants naive ``wall`` fires at in ``zone`` under an effective (non-auto) policy.

    Returns zero (gap + skip), one, or two (overlap + both) instants, in order.
    """
    first, second = fold_instants(wall, zone)
    return resolve_folds(first, second, zone, gap, overlap)


def resolve_folds(
    first: datetime, second: datetime, zone: ZoneInfo, gap: DstGap, overlap: DstOverlap
) -> tuple[WallResolution, ...]:
    """:func:`resolve_wall` for a wall time whose :func:`fold_instants` are already known."""
    if first == second:
        return (WallResolution(first, Adjustment.NONE),)
    if first < second:
        passes = {
            DstOverlap.FIRST: ((first, Adjustment.FIRST_PASS),),
            DstOverlap.LAST: ((second, Adjustment.SECOND_PASS),),
            DstOverlap.BOTH: ((first, Adjustment.FIRST_PASS), (second, Adjustment.SECOND_PASS)),
        }[overlap]
        return tuple(WallResolution(instant, adj) for instant, adj in passes)
    if gap is DstGap.SKIP:
        return ()
    return (WallResolution(_gap_end(second, first, zone), Adjustment.SHIFTED),)


def _gap_end(low: datetime, high: datetime, zone: ZoneInfo) -> datetime:
    """The transition instant in ``(low, high]`` where the zone's offset changes.

    For a wall time inside a gap, ``low`` (the fold=1 reading) lies before the transition
    and ``high`` (the fold=0 reading) at or after it; the transition is the first instant
    that exists after the gap. Binary search to the second: transitions in the tz database
    fall on whole seconds.
    """
    before = low.astimezone(zone).utcoffset()
    while high - low > _ONE_SECOND:
        middle = low + (high - low) / 2
        middle = middle.replace(microsecond=0)
        if middle.astimezone(zone).utcoffset() == before:
            low = middle
        else:
            high = middle
    return high
