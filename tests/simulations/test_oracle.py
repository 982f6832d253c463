"""The simulator's independent expectation agrees with the documented DST table.

Every row of the worked examples in ``docs/time.md`` that the oracle's cron subset covers,
computed by brute force over local wall times: if the oracle drifted from the documented
semantics, the simulator would judge the engine against the wrong truth.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from simulations import oracle

ROWS = [
    # zone, local day, expression, gap, overlap, fires (UTC, "DD HH:MM")
    ("America/New_York", "2026-03-08", "30 2 * * *", "auto", "auto", ["08 07:00"]),
    ("America/New_York", "2026-03-08", "30 2 * * *", "skip", "auto", []),
    ("America/New_York", "2026-11-01", "30 1 * * *", "auto", "auto", ["01 05:30"]),
    ("America/New_York", "2026-11-01", "30 1 * * *", "auto", "last", ["01 06:30"]),
    ("America/New_York", "2026-11-01", "30 1 * * *", "auto", "both", ["01 05:30", "01 06:30"]),
    ("Europe/London", "2026-03-29", "30 1 * * *", "auto", "auto", ["29 01:00"]),
    ("Europe/London", "2026-10-25", "30 1 * * *", "auto", "auto", ["25 00:30"]),
    ("Europe/London", "2026-10-25", "30 1 * * *", "auto", "last", ["25 01:30"]),
    ("Australia/Lord_Howe", "2026-10-04", "15 2 * * *", "auto", "auto", ["03 15:30"]),
    ("Australia/Lord_Howe", "2026-10-04", "15,30 2 * * *", "shift", "auto", ["03 15:30"]),
    ("Australia/Lord_Howe", "2026-04-05", "45 1 * * *", "auto", "auto", ["04 14:45"]),
    ("Australia/Lord_Howe", "2026-04-05", "45 1 * * *", "auto", "both", ["04 14:45", "04 15:15"]),
    ("America/Santiago", "2026-09-06", "0 0 * * *", "auto", "auto", ["06 04:00"]),
    ("America/Santiago", "2026-09-06", "0 0 * * *", "skip", "auto", []),
    ("America/Santiago", "2026-04-04", "30 23 * * *", "auto", "auto", ["05 02:30"]),
    ("America/Santiago", "2026-04-04", "30 23 * * *", "auto", "last", ["05 03:30"]),
    ("Africa/Cairo", "2026-04-24", "0 0 * * *", "auto", "auto", ["23 22:00"]),
    ("Pacific/Chatham", "2026-09-27", "0 3 * * *", "auto", "auto", ["26 14:00"]),
]


def _local_day(zone: str, day: str) -> tuple[datetime, datetime]:
    """The UTC span of the local calendar day ``day`` in ``zone`` (generously)."""
    from zoneinfo import ZoneInfo

    start = datetime.fromisoformat(day).replace(tzinfo=ZoneInfo(zone)).astimezone(UTC)
    return start - timedelta(hours=2), start + timedelta(hours=26)


@pytest.mark.parametrize(("zone", "day", "expression", "gap", "overlap", "expected"), ROWS)
def test_the_oracle_reproduces_the_documented_dst_table(
    zone: str, day: str, expression: str, gap: str, overlap: str, expected: list[str]
) -> None:
    after, until = _local_day(zone, day)
    found = oracle.fires(expression, zone, gap, overlap, after, until)
    local_day = datetime.fromisoformat(day).date()
    from zoneinfo import ZoneInfo

    on_day = [f for f in found if f.astimezone(ZoneInfo(zone)).date() == local_day]
    assert [f.strftime("%d %H:%M") for f in on_day] == expected


def test_wildcard_schedules_follow_absolute_time_through_both_transitions() -> None:
    spring = oracle.fires(
        "*/30 * * * *",
        "America/New_York",
        "auto",
        "auto",
        datetime(2026, 3, 8, 6, 0, tzinfo=UTC),
        datetime(2026, 3, 8, 7, 30, tzinfo=UTC),
    )
    assert [f.strftime("%H:%M") for f in spring] == ["06:30", "07:00", "07:30"]
    autumn = oracle.fires(
        "0,30 * * * *",
        "America/New_York",
        "auto",
        "auto",
        datetime(2026, 11, 1, 4, 50, tzinfo=UTC),
        datetime(2026, 11, 1, 7, 0, tzinfo=UTC),
    )
    assert [f.strftime("%H:%M") for f in autumn] == ["05:00", "05:30", "06:00", "06:30", "07:00"]


def test_the_oracle_reads_the_cron_subset_the_workload_uses() -> None:
    weekdays = oracle.CronOracle("*/10 9-17 * * MON-FRI")
    assert weekdays.minutes == {0, 10, 20, 30, 40, 50}
    assert weekdays.hours == set(range(9, 18))
    assert weekdays.weekdays == {1, 2, 3, 4, 5}
    assert not weekdays.fixed_time
    assert oracle.CronOracle("45 1,2,3 * * *").fixed_time
    vixie = oracle.CronOracle("0 0 13 * 5")  # the 13th, and every Friday
    assert vixie.matches_day(datetime(2026, 3, 13).date())  # a Friday the 13th
    assert vixie.matches_day(datetime(2026, 3, 6).date())  # a Friday
    assert vixie.matches_day(datetime(2026, 4, 13).date())  # a Monday the 13th
    assert not vixie.matches_day(datetime(2026, 4, 14).date())


def test_the_transitions_of_2026_are_found() -> None:
    assert oracle.transitions("Europe/London", 2026) == (
        (datetime(2026, 3, 29, 1, 0, tzinfo=UTC), 3600.0),
        (datetime(2026, 10, 25, 1, 0, tzinfo=UTC), -3600.0),
    )
    assert [delta for _, delta in oracle.transitions("Australia/Lord_Howe", 2026)] == [
        -1800.0,
        1800.0,
    ]
