"""Explicit DST tables: each zone's 2026 transitions, both directions, every policy.

Expected instants were worked out by hand from the zone rules (see docs/time.md); the
transition instants themselves are pinned in ``test_transitions_are_where_the_tables_assume``.
"""

from __future__ import annotations

import itertools
from datetime import UTC, datetime

import pytest

from engine.core.dst import Adjustment, DstGap, DstOverlap
from engine.core.timetable import Timetable

NONE = Adjustment.NONE
SHIFTED = Adjustment.SHIFTED
FIRST = Adjustment.FIRST_PASS
SECOND = Adjustment.SECOND_PASS


def utc(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def fires(
    expression: str,
    zone: str,
    after: str,
    count: int,
    gap: DstGap = DstGap.AUTO,
    overlap: DstOverlap = DstOverlap.AUTO,
) -> list[tuple[datetime, Adjustment]]:
    timetable = Timetable.compile(expression, zone, dst_gap=gap, dst_overlap=overlap)
    return [(fire.planned_at, fire.adjustment) for fire in timetable.fires(utc(after), count)]


@pytest.mark.parametrize(
    ("zone", "before", "after"),
    [
        ("America/New_York", "2026-03-08T01:59:59-05:00", "2026-03-08T03:00:00-04:00"),
        ("America/New_York", "2026-11-01T01:59:59-04:00", "2026-11-01T01:00:00-05:00"),
        ("Europe/London", "2026-03-29T00:59:59+00:00", "2026-03-29T02:00:00+01:00"),
        ("Europe/London", "2026-10-25T01:59:59+01:00", "2026-10-25T01:00:00+00:00"),
        ("Australia/Lord_Howe", "2026-10-04T01:59:59+10:30", "2026-10-04T02:30:00+11:00"),
        ("Australia/Lord_Howe", "2026-04-05T01:59:59+11:00", "2026-04-05T01:30:00+10:30"),
        ("Pacific/Chatham", "2026-09-27T02:44:59+12:45", "2026-09-27T03:45:00+13:45"),
        ("Pacific/Chatham", "2026-04-05T03:44:59+13:45", "2026-04-05T02:45:00+12:45"),
        ("America/Santiago", "2026-09-05T23:59:59-04:00", "2026-09-06T01:00:00-03:00"),
        ("America/Santiago", "2026-04-04T23:59:59-03:00", "2026-04-04T23:00:00-04:00"),
        ("Africa/Cairo", "2026-04-23T23:59:59+02:00", "2026-04-24T01:00:00+03:00"),
        ("Africa/Cairo", "2026-10-29T23:59:59+03:00", "2026-10-29T23:00:00+02:00"),
        ("America/Havana", "2026-03-07T23:59:59-05:00", "2026-03-08T01:00:00-04:00"),
        ("America/Havana", "2026-11-01T00:59:59-04:00", "2026-11-01T00:00:00-05:00"),
    ],
)
def test_transitions_are_where_the_tables_assume(zone: str, before: str, after: str) -> None:
    from zoneinfo import ZoneInfo

    one_second_before = datetime.fromisoformat(before)
    transition = datetime.fromisoformat(after)
    assert (transition - one_second_before).total_seconds() == 1
    assert transition.astimezone(ZoneInfo(zone)).isoformat() == after
    assert one_second_before.astimezone(ZoneInfo(zone)).isoformat() == before


# (expression, zone, after, gap, overlap, expected fires)
GAP_CASES = [
    # New York, 02:00 -> 03:00 on 8 March.
    (
        "30 2 * * *",
        "America/New_York",
        "2026-03-08T00:00",
        DstGap.AUTO,
        DstOverlap.AUTO,
        [("2026-03-08T07:00", SHIFTED), ("2026-03-09T06:30", NONE)],
    ),
    (
        "30 2 * * *",
        "America/New_York",
        "2026-03-08T00:00",
        DstGap.SKIP,
        DstOverlap.AUTO,
        [("2026-03-09T06:30", NONE), ("2026-03-10T06:30", NONE)],
    ),
    (
        "30 30 2 * * *",
        "America/New_York",
        "2026-03-08T00:00",
        DstGap.SHIFT,
        DstOverlap.AUTO,
        [("2026-03-08T07:00", SHIFTED), ("2026-03-09T06:30:30", NONE)],
    ),
    (
        "*/30 * * * *",
        "America/New_York",
        "2026-03-08T06:00",
        DstGap.AUTO,
        DstOverlap.AUTO,
        [("2026-03-08T06:30", NONE), ("2026-03-08T07:00", NONE), ("2026-03-08T07:30", NONE)],
    ),
    (
        "*/30 * * * *",
        "America/New_York",
        "2026-03-08T06:00",
        DstGap.SHIFT,
        DstOverlap.AUTO,
        [("2026-03-08T06:30", NONE), ("2026-03-08T07:00", SHIFTED), ("2026-03-08T07:30", NONE)],
    ),
    # London, 01:00 -> 02:00 on 29 March.
    (
        "30 1 * * *",
        "Europe/London",
        "2026-03-28T12:00",
        DstGap.AUTO,
        DstOverlap.AUTO,
        [("2026-03-29T01:00", SHIFTED), ("2026-03-30T00:30", NONE)],
    ),
    (
        "30 1 * * *",
        "Europe/London",
        "2026-03-28T12:00",
        DstGap.SKIP,
        DstOverlap.AUTO,
        [("2026-03-30T00:30", NONE)],
    ),
    # Lord Howe, 02:00 -> 02:30 on 4 October (a 30-minute shift).
    (
        "15 2 * * *",
        "Australia/Lord_Howe",
        "2026-10-03T12:00",
        DstGap.AUTO,
        DstOverlap.AUTO,
        [("2026-10-03T15:30", SHIFTED), ("2026-10-04T15:15", NONE)],
    ),
    (
        "15 2 * * *",
        "Australia/Lord_Howe",
        "2026-10-03T12:00",
        DstGap.SKIP,
        DstOverlap.AUTO,
        [("2026-10-04T15:15", NONE)],
    ),
    (
        "15,30 2 * * *",
        "Australia/Lord_Howe",
        "2026-10-03T12:00",
        DstGap.SHIFT,
        DstOverlap.AUTO,
        [("2026-10-03T15:30", SHIFTED), ("2026-10-04T15:15", NONE)],
    ),
    (
        "*/15 * * * *",
        "Australia/Lord_Howe",
        "2026-10-03T15:00",
        DstGap.AUTO,
        DstOverlap.AUTO,
        [("2026-10-03T15:15", NONE), ("2026-10-03T15:30", NONE), ("2026-10-03T15:45", NONE)],
    ),
    # Chatham, 02:45 -> 03:45 on 27 September (a 45-minute zone).
    (
        "0 3 * * *",
        "Pacific/Chatham",
        "2026-09-26T00:00",
        DstGap.AUTO,
        DstOverlap.AUTO,
        [("2026-09-26T14:00", SHIFTED), ("2026-09-27T13:15", NONE)],
    ),
    # Santiago, midnight gap: 00:00 -> 01:00 on 6 September.
    (
        "0 0 * * *",
        "America/Santiago",
        "2026-09-05T12:00",
        DstGap.AUTO,
        DstOverlap.AUTO,
        [("2026-09-06T04:00", SHIFTED), ("2026-09-07T03:00", NONE)],
    ),
    (
        "0 0 * * *",
        "America/Santiago",
        "2026-09-05T12:00",
        DstGap.SKIP,
        DstOverlap.AUTO,
        [("2026-09-07T03:00", NONE)],
    ),
    # Cairo, midnight gap: 00:00 -> 01:00 on 24 April.
    (
        "0 0 * * *",
        "Africa/Cairo",
        "2026-04-23T12:00",
        DstGap.AUTO,
        DstOverlap.AUTO,
        [("2026-04-23T22:00", SHIFTED), ("2026-04-24T21:00", NONE)],
    ),
    # Havana, midnight gap: 00:00 -> 01:00 on 8 March.
    (
        "0 0 * * *",
        "America/Havana",
        "2026-03-07T12:00",
        DstGap.AUTO,
        DstOverlap.AUTO,
        [("2026-03-08T05:00", SHIFTED), ("2026-03-09T04:00", NONE)],
    ),
    (
        "0 0 * * *",
        "America/Havana",
        "2026-03-07T12:00",
        DstGap.SKIP,
        DstOverlap.AUTO,
        [("2026-03-09T04:00", NONE)],
    ),
]

OVERLAP_CASES = [
    # New York, 01:00-02:00 happens twice on 1 November.
    (
        "30 1 * * *",
        "America/New_York",
        "2026-11-01T00:00",
        DstGap.AUTO,
        DstOverlap.AUTO,
        [("2026-11-01T05:30", FIRST), ("2026-11-02T06:30", NONE)],
    ),
    (
        "30 1 * * *",
        "America/New_York",
        "2026-11-01T00:00",
        DstGap.AUTO,
        DstOverlap.LAST,
        [("2026-11-01T06:30", SECOND), ("2026-11-02T06:30", NONE)],
    ),
    (
        "30 1 * * *",
        "America/New_York",
        "2026-11-01T00:00",
        DstGap.AUTO,
        DstOverlap.BOTH,
        [("2026-11-01T05:30", FIRST), ("2026-11-01T06:30", SECOND), ("2026-11-02T06:30", NONE)],
    ),
    (
        "0,30 * * * *",
        "America/New_York",
        "2026-11-01T04:45",
        DstGap.AUTO,
        DstOverlap.AUTO,
        [
            ("2026-11-01T05:00", FIRST),
            ("2026-11-01T05:30", FIRST),
            ("2026-11-01T06:00", SECOND),
            ("2026-11-01T06:30", SECOND),
            ("2026-11-01T07:00", NONE),
        ],
    ),
    (
        "0,30 * * * *",
        "America/New_York",
        "2026-11-01T04:45",
        DstGap.AUTO,
        DstOverlap.FIRST,
        [("2026-11-01T05:00", FIRST), ("2026-11-01T05:30", FIRST), ("2026-11-01T07:00", NONE)],
    ),
    (
        "0,30 * * * *",
        "America/New_York",
        "2026-11-01T04:45",
        DstGap.AUTO,
        DstOverlap.LAST,
        [("2026-11-01T06:00", SECOND), ("2026-11-01T06:30", SECOND), ("2026-11-01T07:00", NONE)],
    ),
    # Asked from inside the repeated hour (a node restarting at 01:40 EDT, first pass).
    (
        "30 1 * * *",
        "America/New_York",
        "2026-11-01T05:40",
        DstGap.AUTO,
        DstOverlap.AUTO,
        [("2026-11-02T06:30", NONE)],
    ),
    (
        "30 1 * * *",
        "America/New_York",
        "2026-11-01T05:40",
        DstGap.AUTO,
        DstOverlap.BOTH,
        [("2026-11-01T06:30", SECOND), ("2026-11-02T06:30", NONE)],
    ),
    (
        "0,30 * * * *",
        "America/New_York",
        "2026-11-01T05:40",
        DstGap.AUTO,
        DstOverlap.AUTO,
        [("2026-11-01T06:00", SECOND), ("2026-11-01T06:30", SECOND), ("2026-11-01T07:00", NONE)],
    ),
    (
        "0,30 * * * *",
        "America/New_York",
        "2026-11-01T06:10",
        DstGap.AUTO,
        DstOverlap.AUTO,
        [("2026-11-01T06:30", SECOND), ("2026-11-01T07:00", NONE)],
    ),
    (
        "0,30 * * * *",
        "America/New_York",
        "2026-11-01T06:10",
        DstGap.AUTO,
        DstOverlap.FIRST,
        [("2026-11-01T07:00", NONE)],
    ),
    # London, 01:00-02:00 twice on 25 October.
    (
        "30 1 * * *",
        "Europe/London",
        "2026-10-24T12:00",
        DstGap.AUTO,
        DstOverlap.AUTO,
        [("2026-10-25T00:30", FIRST), ("2026-10-26T01:30", NONE)],
    ),
    (
        "30 1 * * *",
        "Europe/London",
        "2026-10-24T12:00",
        DstGap.AUTO,
        DstOverlap.LAST,
        [("2026-10-25T01:30", SECOND), ("2026-10-26T01:30", NONE)],
    ),
    # Lord Howe, 01:30-02:00 twice on 5 April (30 minutes repeated).
    (
        "45 1 * * *",
        "Australia/Lord_Howe",
        "2026-04-04T00:00",
        DstGap.AUTO,
        DstOverlap.AUTO,
        [("2026-04-04T14:45", FIRST), ("2026-04-05T15:15", NONE)],
    ),
    (
        "45 1 * * *",
        "Australia/Lord_Howe",
        "2026-04-04T00:00",
        DstGap.AUTO,
        DstOverlap.BOTH,
        [("2026-04-04T14:45", FIRST), ("2026-04-04T15:15", SECOND), ("2026-04-05T15:15", NONE)],
    ),
    # Chatham, 02:45-03:45 twice on 5 April.
    (
        "0 3 * * *",
        "Pacific/Chatham",
        "2026-04-04T00:00",
        DstGap.AUTO,
        DstOverlap.AUTO,
        [("2026-04-04T13:15", FIRST), ("2026-04-05T14:15", NONE)],
    ),
    (
        "0 3 * * *",
        "Pacific/Chatham",
        "2026-04-04T00:00",
        DstGap.AUTO,
        DstOverlap.LAST,
        [("2026-04-04T14:15", SECOND), ("2026-04-05T14:15", NONE)],
    ),
    # Santiago, 23:00-24:00 twice on 4 April.
    (
        "30 23 * * *",
        "America/Santiago",
        "2026-04-04T12:00",
        DstGap.AUTO,
        DstOverlap.AUTO,
        [("2026-04-05T02:30", FIRST), ("2026-04-06T03:30", NONE)],
    ),
    (
        "30 23 * * *",
        "America/Santiago",
        "2026-04-04T12:00",
        DstGap.AUTO,
        DstOverlap.LAST,
        [("2026-04-05T03:30", SECOND), ("2026-04-06T03:30", NONE)],
    ),
    # Cairo, 23:00-24:00 twice on 29 October.
    (
        "30 23 * * *",
        "Africa/Cairo",
        "2026-10-29T12:00",
        DstGap.AUTO,
        DstOverlap.BOTH,
        [("2026-10-29T20:30", FIRST), ("2026-10-29T21:30", SECOND), ("2026-10-30T21:30", NONE)],
    ),
    # Havana, 00:00-01:00 twice on 1 November.
    (
        "30 0 * * *",
        "America/Havana",
        "2026-10-31T12:00",
        DstGap.AUTO,
        DstOverlap.AUTO,
        [("2026-11-01T04:30", FIRST), ("2026-11-02T05:30", NONE)],
    ),
    (
        "30 0 * * *",
        "America/Havana",
        "2026-10-31T12:00",
        DstGap.AUTO,
        DstOverlap.LAST,
        [("2026-11-01T05:30", SECOND), ("2026-11-02T05:30", NONE)],
    ),
]


@pytest.mark.parametrize(
    ("expression", "zone", "after", "gap", "overlap", "expected"), GAP_CASES + OVERLAP_CASES
)
def test_fires_around_transitions_follow_the_policy(
    expression: str,
    zone: str,
    after: str,
    gap: DstGap,
    overlap: DstOverlap,
    expected: list[tuple[str, Adjustment]],
) -> None:
    wanted = [(utc(instant), adjustment) for instant, adjustment in expected]
    assert fires(expression, zone, after, len(wanted), gap, overlap) == wanted


def test_fixed_time_schedule_fires_once_per_day_through_both_transitions() -> None:
    # The cronie rule: a daily job neither disappears in spring nor doubles in autumn.
    timetable = Timetable.compile("30 1 * * *", "America/New_York")
    start = utc("2026-01-01T00:00")
    year = timetable.fires(start, 365)
    local_days = [fire.local(timetable.zone).date() for fire in year]
    assert len(set(local_days)) == 365


def test_wildcard_schedule_follows_absolute_time_through_the_overlap() -> None:
    # Every 15 minutes means every 15 real minutes, including the repeated hour.
    timetable = Timetable.compile("*/15 * * * *", "America/New_York")
    night = timetable.fires(utc("2026-11-01T04:00"), 16)
    gaps = {(b.planned_at - a.planned_at).total_seconds() for a, b in itertools.pairwise(night)}
    assert gaps == {900}
