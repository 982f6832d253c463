"""The independent expectation: which instants a cron schedule fires at, by brute force.

Written from the documented semantics (``docs/time.md``), sharing no code with the engine's
``Timetable``/``dst``/croniter: it walks the *local* calendar day by day, lists the wall
times the expression matches, and resolves each with :mod:`zoneinfo`:

* a wall time that exists once is that instant;
* a wall time in a spring-forward **gap** fires at the first instant after the gap
  (``shift``; found by bisecting for the offset change) or not at all (``skip``);
* a wall time in a fall-back **overlap** fires on the first pass, the last, or both;
* ``auto`` is the cronie rule: *fixed-time* expressions (no ``*`` in the minute or hour
  field) behave as ``shift`` + ``first``; *wildcard* ones as ``skip`` + ``both``;
* wall times resolving to the same instant are one fire.

The subset of cron modelled is the one the workload uses: five fields; ``*``, numbers,
ranges, steps and lists; month and weekday names; weekday 7 = Sunday; the Vixie rule (a day
matches if either day field does when both are restricted). No ``H``, ``L``, ``#`` or
seconds field.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta
from typing import Final
from zoneinfo import ZoneInfo

_MONTHS: Final = {
    name: number
    for number, name in enumerate(
        ["JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"],
        start=1,
    )
}
_WEEKDAYS: Final = {
    name: number for number, name in enumerate(["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"])
}
_NONE: Final[dict[str, int]] = {}
_FIELDS: Final = (
    (0, 59, _NONE),
    (0, 23, _NONE),
    (1, 31, _NONE),
    (1, 12, _MONTHS),
    (0, 7, _WEEKDAYS),
)


def _value(text: str, names: dict[str, int]) -> int:
    return names[text.upper()] if text.upper() in names else int(text)


def parse_field(text: str, low: int, high: int, names: dict[str, int]) -> frozenset[int]:
    """The values one cron field matches."""
    values: set[int] = set()
    for item in text.split(","):
        base, _, step_text = item.partition("/")
        step = int(step_text) if step_text else 1
        if base == "*":
            first, last = low, high
        elif "-" in base:
            a, b = base.split("-")
            first, last = _value(a, names), _value(b, names)
        else:
            first = _value(base, names)
            last = high if step_text else first
        if not low <= first <= last <= high or step < 1:
            raise ValueError(f"cron field {text!r} is outside {low}-{high}")
        values.update(range(first, last + 1, step))
    return frozenset(values)


class CronOracle:
    """A parsed five-field expression: which local wall times it matches."""

    def __init__(self, expression: str) -> None:
        fields = expression.split()
        if len(fields) != 5:
            raise ValueError(f"the oracle models five-field expressions, not {expression!r}")
        parsed = [
            parse_field(f, lo, hi, names)
            for f, (lo, hi, names) in zip(fields, _FIELDS, strict=True)
        ]
        self.minutes, self.hours, self.days, self.months, weekdays = parsed
        self.weekdays = frozenset(d % 7 for d in weekdays)
        self.days_restricted = fields[2] != "*"
        self.weekdays_restricted = fields[4] != "*"
        self.fixed_time = "*" not in fields[0] and "*" not in fields[1]

    def matches_day(self, day: date) -> bool:
        if day.month not in self.months:
            return False
        by_day = day.day in self.days
        by_weekday = (day.isoweekday() % 7) in self.weekdays
        if self.days_restricted and self.weekdays_restricted:
            return by_day or by_weekday
        return by_day and by_weekday

    def walls(self, first: date, last: date) -> Iterator[datetime]:
        """Matching naive wall times on the local days ``first``..``last``, in order."""
        day = first
        while day <= last:
            if self.matches_day(day):
                for hour in sorted(self.hours):
                    for minute in sorted(self.minutes):
                        # a naive *wall* time, resolved to instants by resolve()
                        yield datetime(day.year, day.month, day.day, hour, minute)  # noqa: DTZ001
            day += timedelta(days=1)


def _offset_s(instant: datetime, zone: ZoneInfo) -> float:
    offset = instant.astimezone(zone).utcoffset()
    assert offset is not None
    return offset.total_seconds()


def gap_end(early: datetime, late: datetime, zone: ZoneInfo) -> datetime:
    """The first instant in ``(early, late]`` with ``late``'s offset: where the gap ends."""
    target = _offset_s(late, zone)
    low, high = early, late  # invariant: offset(low) != target, offset(high) == target
    while high - low > timedelta(seconds=1):
        middle = low + (high - low) / 2
        middle = middle.replace(microsecond=0)
        if middle <= low:
            break
        if _offset_s(middle, zone) == target:
            high = middle
        else:
            low = middle
    return high


def resolve(wall: datetime, zone: ZoneInfo, gap: str, overlap: str) -> list[datetime]:
    """The UTC instants naive ``wall`` fires at, under effective ``gap``/``overlap``."""
    first = wall.replace(tzinfo=zone, fold=0).astimezone(UTC)
    second = wall.replace(tzinfo=zone, fold=1).astimezone(UTC)
    if first == second:
        return [first]
    exists = [i for i in (first, second) if i.astimezone(zone).replace(tzinfo=None) == wall]
    if len(exists) == 2:  # an overlap: the wall time happens twice
        early, late = sorted(exists)
        return {"first": [early], "last": [late], "both": [early, late]}[overlap]
    if gap == "skip":  # a gap: the wall time does not exist
        return []
    early, late = sorted((first, second))
    return [gap_end(early, late, zone)]


def effective(expression: str, gap: str, overlap: str) -> tuple[str, str]:
    """``auto`` replaced by the cronie rule."""
    fixed = CronOracle(expression).fixed_time
    if gap == "auto":
        gap = "shift" if fixed else "skip"
    if overlap == "auto":
        overlap = "first" if fixed else "both"
    return gap, overlap


@functools.lru_cache(maxsize=4096)
def fires(
    expression: str, zone_name: str, gap: str, overlap: str, after: datetime, until: datetime
) -> tuple[datetime, ...]:
    """Every instant in ``(after, until]`` the schedule fires at, in order (aware UTC)."""
    oracle = CronOracle(expression)
    zone = ZoneInfo(zone_name)
    gap, overlap = effective(expression, gap, overlap)
    first_day = after.astimezone(zone).date() - timedelta(days=1)
    last_day = until.astimezone(zone).date() + timedelta(days=1)
    found: set[datetime] = set()
    for wall in oracle.walls(first_day, last_day):
        for instant in resolve(wall, zone, gap, overlap):
            if after < instant <= until:
                found.add(instant)
    return tuple(sorted(found))


def next_fire(expression: str, zone_name: str, gap: str, overlap: str, after: datetime) -> datetime:
    """The first fire strictly after ``after`` (searching up to about a year ahead)."""
    horizon = after
    for days in (2, 40, 400):
        horizon = after + timedelta(days=days)
        found = fires(expression, zone_name, gap, overlap, after, horizon)
        if found:
            return found[0]
    raise ValueError(f"{expression!r} does not fire within a year after {after.isoformat()}")


@functools.lru_cache(maxsize=64)
def transitions(zone_name: str, year: int) -> tuple[tuple[datetime, float], ...]:
    """The zone's offset changes in ``year``: (UTC instant, seconds the clocks move)."""
    zone = ZoneInfo(zone_name)
    found = []
    at = datetime(year, 1, 1, tzinfo=UTC)
    end = datetime(year + 1, 1, 1, tzinfo=UTC)
    step = timedelta(hours=1)
    while at < end:
        before, after = _offset_s(at, zone), _offset_s(at + step, zone)
        if before != after:
            instant = gap_end(at, at + step, zone)
            found.append((instant, after - before))
        at += step
    return tuple(found)
