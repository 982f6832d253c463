"""Cron syntax: what is accepted, what it means, and how bad input is refused."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime

import pytest

from engine.core.cron import parse_cron, uses_hash
from engine.core.timetable import Timetable
from engine.errors import InvalidCronExpression, ScheduleNeverFires

START = datetime(2026, 1, 1, tzinfo=UTC)


def first_fires(expression: str, count: int = 3, **kwargs: str) -> list[str]:
    timetable = Timetable.compile(expression, "UTC", **kwargs)  # type: ignore[arg-type]
    return [fire.planned_at.isoformat() for fire in timetable.fires(START, count)]


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        (
            "0 9 * * MON-FRI",
            ["2026-01-01T09:00:00+00:00", "2026-01-02T09:00:00+00:00", "2026-01-05T09:00:00+00:00"],
        ),
        (
            "0 0 1 JAN,JUL *",
            ["2026-07-01T00:00:00+00:00", "2027-01-01T00:00:00+00:00", "2027-07-01T00:00:00+00:00"],
        ),
        (
            "*/20 10-11 * * *",
            ["2026-01-01T10:00:00+00:00", "2026-01-01T10:20:00+00:00", "2026-01-01T10:40:00+00:00"],
        ),
        # Vixie rule: both day fields restricted -> either matches (the 13th OR a Friday).
        (
            "0 0 13 * 5",
            ["2026-01-02T00:00:00+00:00", "2026-01-09T00:00:00+00:00", "2026-01-13T00:00:00+00:00"],
        ),
        (
            "0 0 * * 7",
            ["2026-01-04T00:00:00+00:00", "2026-01-11T00:00:00+00:00", "2026-01-18T00:00:00+00:00"],
        ),
        # Six fields: seconds first.
        (
            "15 */30 * * * *",
            ["2026-01-01T00:00:15+00:00", "2026-01-01T00:30:15+00:00", "2026-01-01T01:00:15+00:00"],
        ),
        (
            "0 0 29 2 *",
            ["2028-02-29T00:00:00+00:00", "2032-02-29T00:00:00+00:00", "2036-02-29T00:00:00+00:00"],
        ),
    ],
)
def test_standard_syntax_fires_where_cron_would(expression: str, expected: list[str]) -> None:
    assert first_fires(expression) == expected


@pytest.mark.parametrize(
    ("macro", "equivalent"),
    [
        ("@yearly", "0 0 1 1 *"),
        ("@annually", "0 0 1 1 *"),
        ("@monthly", "0 0 1 * *"),
        ("@weekly", "0 0 * * 0"),
        ("@daily", "0 0 * * *"),
        ("@midnight", "0 0 * * *"),
        ("@hourly", "0 * * * *"),
        ("@HOURLY", "0 * * * *"),
    ],
)
def test_macros_mean_their_five_field_form(macro: str, equivalent: str) -> None:
    assert parse_cron(macro).expression == equivalent
    assert first_fires(macro) == first_fires(equivalent)


def test_fixed_time_means_no_star_in_minute_or_hour() -> None:
    assert parse_cron("30 2 * * *").fixed_time
    assert parse_cron("0 1-3 * * *").fixed_time
    assert parse_cron("@daily").fixed_time
    assert not parse_cron("*/15 2 * * *").fixed_time
    assert not parse_cron("0 * * * *").fixed_time
    assert not parse_cron("@hourly").fixed_time
    assert parse_cron("H H * * *", hash_key="a").fixed_time


def test_h_is_stable_for_a_schedule_id() -> None:
    first = parse_cron("H H * * *", hash_key="invoice-42").expression
    again = parse_cron("H H * * *", hash_key="invoice-42").expression
    assert first == again
    # Pinned: the hash must never change between releases, or schedules would move.
    assert first == parse_cron("H H * * *", hash_key="invoice-42").expression
    minute, hour = (int(part) for part in first.split()[:2])
    assert 0 <= minute <= 59
    assert 0 <= hour <= 23


def test_h_pins_known_values() -> None:
    assert parse_cron("H H * * *", hash_key="invoice-42").expression == "47 17 * * *"
    assert parse_cron("H/15 * * * *", hash_key="invoice-42").expression == "2,17,32,47 * * * *"


def test_h_spreads_schedules_over_the_hour() -> None:
    minutes = Counter(
        int(parse_cron("H * * * *", hash_key=f"tenant-{n}").expression.split()[0])
        for n in range(6000)
    )
    assert len(minutes) == 60
    # 100 per minute on average; a uniform hash stays well within 2x of that.
    assert max(minutes.values()) < 200
    assert min(minutes.values()) > 50


@pytest.mark.parametrize(
    ("expression", "check"),
    [
        ("H(0-29) * * * *", lambda m: 0 <= int(m) <= 29),
        (
            "H(10-19)/5 * * * *",
            lambda m: [int(x) for x in m.split(",")][1] - int(m.split(",")[0]) == 5,
        ),
        ("H,30 * * * *", lambda m: "30" in m.split(",")),
    ],
)
def test_h_forms(expression: str, check: object) -> None:
    minute = parse_cron(expression, hash_key="s1").expression.split()[0]
    assert callable(check)
    assert check(minute)


def test_h_in_seconds_field_of_six_field_expression() -> None:
    spec = parse_cron("H H * * * *", hash_key="s1")
    assert spec.has_seconds
    assert all(part.isdigit() for part in spec.expression.split()[:2])


def test_day_names_containing_h_are_not_the_h_token() -> None:
    assert not uses_hash("0 9 * * THU")
    assert parse_cron("0 9 * * THU").expression == "0 9 * * THU"
    assert uses_hash("H 9 * * THU")


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("", "empty"),
        ("* * * *", "expected 5 fields"),
        ("* * * * * * *", "got 7"),
        ("61 * * * *", "minute field '61'"),
        ("0 24 * * *", "hour field '24'"),
        ("0 0 32 * *", "day-of-month field '32'"),
        ("0 0 * 13 *", "month field '13'"),
        ("0 0 * * 8", "day-of-week field '8'"),
        ("0 0 * * FOO", "day-of-week field 'FOO'"),
        ("@reboot", "not supported"),
        ("@fortnightly", "unknown macro"),
        ("H * * * *", "give the schedule id"),
        ("0 0 H * *", "only in the second, minute and hour"),
        ("H(50-10) * * * *", "range 50-10"),
        ("H(0-70) * * * *", "within 0-59"),
        ("H/x * * * *", "not a valid H form"),
        ("* " * 200, "limit is 256"),
    ],
)
def test_bad_expressions_are_refused_with_a_useful_message(expression: str, message: str) -> None:
    with pytest.raises(InvalidCronExpression, match=message):
        parse_cron(expression, hash_key=None if "give" in message else "s1")


@pytest.mark.parametrize("expression", ["0 0 30 2 *", "0 0 31 4 *", "0 0 31 2,4,6,9,11 *"])
def test_expressions_that_never_fire_are_refused_at_validation(expression: str) -> None:
    with pytest.raises(ScheduleNeverFires, match="never fires"):
        parse_cron(expression)


def test_whitespace_is_normalised() -> None:
    assert parse_cron("  0   9 *\t* * ").expression == "0 9 * * *"
