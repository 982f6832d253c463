"""Properties of next-fire computation, checked by hypothesis around real transitions."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from croniter import croniter
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.core.dst import Adjustment, DstGap, DstOverlap, fold_instants
from engine.core.timetable import Timetable, TimetableCache

ZONES = [
    "UTC",
    "America/New_York",
    "Europe/London",
    "Australia/Lord_Howe",
    "Pacific/Chatham",
    "America/Santiago",
    "Africa/Cairo",
    "America/Havana",
    "Asia/Kolkata",
]
EXPRESSIONS = [
    "* * * * *",
    "*/7 * * * *",
    "0,30 * * * *",
    "15 * * * *",
    "30 2 * * *",
    "30 1 * * *",
    "0 0 * * *",
    "45 23 * * *",
    "*/20 0-3 * * *",
    "0 1-3 * * 0",
    "10 */5 * * * *",
    "0 0 29 2 *",
    "@hourly",
    "0 9 * * MON-FRI",
]


def _transitions(zone: ZoneInfo) -> list[datetime]:
    found = []
    step = timedelta(hours=1)
    instant = datetime(2025, 1, 1, tzinfo=UTC)
    offset = instant.astimezone(zone).utcoffset()
    while instant < datetime(2028, 1, 1, tzinfo=UTC):
        instant += step
        current = instant.astimezone(zone).utcoffset()
        if current != offset:
            found.append(instant)
            offset = current
    return found


TRANSITIONS = {
    name: _transitions(ZoneInfo(name)) or [datetime(2026, 6, 1, tzinfo=UTC)] for name in ZONES
}
CACHE = TimetableCache()


@st.composite
def cases(draw: st.DrawFn) -> tuple[Timetable, datetime]:
    zone = draw(st.sampled_from(ZONES))
    expression = draw(st.sampled_from(EXPRESSIONS))
    gap = draw(st.sampled_from(list(DstGap)))
    overlap = draw(st.sampled_from(list(DstOverlap)))
    near = draw(st.sampled_from(TRANSITIONS[zone]))
    seconds = draw(st.integers(min_value=-4 * 3600, max_value=4 * 3600))
    micros = draw(st.sampled_from([0, 0, 1, 500_000, 999_999]))
    after = near + timedelta(seconds=seconds, microseconds=micros)
    timetable = CACHE.get(expression, zone, dst_gap=gap, dst_overlap=overlap)
    return timetable, after


PROPERTY_SETTINGS = settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


@PROPERTY_SETTINGS
@given(cases())
def test_next_fire_is_strictly_later_and_aware_utc(case: tuple[Timetable, datetime]) -> None:
    timetable, after = case
    fire = timetable.next_fire(after)
    assert fire.planned_at > after
    assert fire.planned_at.tzinfo is UTC
    assert fire.planned_at.microsecond == 0


@PROPERTY_SETTINGS
@given(cases(), st.floats(min_value=0.0, max_value=1.0, exclude_max=True))
def test_next_fire_is_constant_until_it_happens(
    case: tuple[Timetable, datetime], fraction: float
) -> None:
    timetable, after = case
    fire = timetable.next_fire(after)
    # timedelta * float rounds to the microsecond: keep ``between`` inside [after, fire).
    between = min(
        after + (fire.planned_at - after) * fraction, fire.planned_at - timedelta(microseconds=1)
    )
    between = max(between, after)
    assert timetable.next_fire(between) == fire
    just_before = fire.planned_at - timedelta(microseconds=1)
    if just_before >= after:
        assert timetable.next_fire(just_before) == fire


@PROPERTY_SETTINGS
@given(cases())
def test_fires_are_strictly_increasing(case: tuple[Timetable, datetime]) -> None:
    timetable, after = case
    planned = [fire.planned_at for fire in timetable.fires(after, 6)]
    assert planned == sorted(set(planned))


@PROPERTY_SETTINGS
@given(cases())
def test_fires_are_real_local_times_that_match_or_were_shifted(
    case: tuple[Timetable, datetime],
) -> None:
    timetable, after = case
    zone = timetable.zone
    for fire in timetable.fires(after, 4):
        local = fire.planned_at.astimezone(zone)
        # The local reading of the instant round-trips: it is not a non-existent wall time.
        assert (
            local.replace(tzinfo=None).replace(tzinfo=zone, fold=local.fold).astimezone(UTC)
            == fire.planned_at
        )
        assert (
            croniter.match(
                timetable.spec.expression, fire.wall, second_at_beginning=timetable.spec.has_seconds
            )
            if timetable.spec.has_seconds
            else croniter.match(timetable.spec.expression, fire.wall)
        )
        first, second = fold_instants(fire.wall, zone)
        if fire.adjustment is Adjustment.SHIFTED:
            assert first > second  # the matched wall time is in a gap
            assert timetable.dst_gap is DstGap.SHIFT
        elif fire.adjustment is Adjustment.NONE:
            assert first == second == fire.planned_at
        else:
            assert first < second
            assert fire.planned_at == (
                first if fire.adjustment is Adjustment.FIRST_PASS else second
            )


WILDCARD = ["* * * * *", "*/7 * * * *", "0,30 * * * *", "15 * * * *", "*/20 0-3 * * *"]


@settings(max_examples=60, deadline=None)
@given(
    st.sampled_from(WILDCARD),
    st.sampled_from(ZONES[1:]),
    st.integers(min_value=-3 * 3600, max_value=3 * 3600),
    st.data(),
)
def test_wildcard_schedules_match_a_brute_force_scan_of_real_minutes(
    expression: str, zone_name: str, seconds: int, data: st.DataObject
) -> None:
    # The auto policy for a wildcard schedule follows absolute time: it fires at exactly the
    # real minutes whose local wall-clock reading matches the expression.
    near = data.draw(st.sampled_from(TRANSITIONS[zone_name]))
    start = (near + timedelta(seconds=seconds)).replace(second=0, microsecond=0)
    zone = ZoneInfo(zone_name)
    timetable = CACHE.get(expression, zone_name)
    window = timedelta(hours=3)
    expected = [
        minute
        for minute in (
            start + timedelta(minutes=n) for n in range(1, int(window.total_seconds() // 60))
        )
        if croniter.match(expression, minute.astimezone(zone).replace(tzinfo=None))
    ]
    actual = []
    after = start
    while True:
        fire = timetable.next_fire(after)
        if fire.planned_at >= start + window:
            break
        actual.append(fire.planned_at)
        after = fire.planned_at
    assert actual == expected
