"""Catch-up after downtime: every missed fire is run or recorded, bounded."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from engine.core.catchup import catch_up
from engine.core.timetable import Timetable
from engine.model import CatchUpPolicy, ExecutionStatus

MINUTELY = Timetable.compile("* * * * *")
T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
QUEUED, SKIPPED = ExecutionStatus.QUEUED, ExecutionStatus.SKIPPED


def minutes(n: int) -> datetime:
    return T0 + timedelta(minutes=n)


def outcome(
    policy: CatchUpPolicy, **kwargs: float
) -> list[tuple[int, ExecutionStatus, str | None]]:
    # Down from 12:00 to 12:10:30; window 5 minutes, grace 60 s.
    result = catch_up(
        MINUTELY, minutes(0), minutes(10) + timedelta(seconds=30), policy=policy, window_s=300,
        grace_s=60, **kwargs,  # type: ignore[arg-type]
    )  # fmt: skip
    assert result.next_run_at == minutes(11)
    return [
        (int((f.planned_at - T0).total_seconds() // 60), f.status, f.reason) for f in result.fires
    ]


def test_latest_runs_the_most_recent_missed_fire_and_records_the_rest() -> None:
    assert outcome(CatchUpPolicy.LATEST) == [
        *[(m, SKIPPED, "catchup_window") for m in range(6)],
        *[(m, SKIPPED, "catchup_latest_only") for m in range(6, 9)],
        (9, QUEUED, None),
        (10, QUEUED, None),  # 30 s late is within the grace: not missed
    ]


def test_all_runs_each_missed_fire_in_the_window_up_to_a_maximum() -> None:
    assert outcome(CatchUpPolicy.ALL, max_runs=3) == [
        *[(m, SKIPPED, "catchup_window") for m in range(6)],
        (6, SKIPPED, "catchup_limit"),
        (7, QUEUED, None),
        (8, QUEUED, None),
        (9, QUEUED, None),
        (10, QUEUED, None),
    ]


def test_none_runs_no_missed_fire() -> None:
    assert outcome(CatchUpPolicy.NONE) == [
        *[(m, SKIPPED, "catchup_window") for m in range(6)],
        *[(m, SKIPPED, "catchup_none") for m in range(6, 10)],
        (10, QUEUED, None),
    ]


def test_nothing_missed_means_nothing_to_do() -> None:
    result = catch_up(MINUTELY, minutes(5), minutes(4), policy=CatchUpPolicy.LATEST, window_s=3600)
    assert (result.fires, result.next_run_at, result.bulk_skipped) == ([], minutes(5), None)


def test_a_long_outage_is_bounded_and_reported_as_a_range() -> None:
    every_second = Timetable.compile("* * * * * *")
    now = T0 + timedelta(days=7)
    result = catch_up(
        every_second, T0, now, policy=CatchUpPolicy.LATEST, window_s=3600, records_max=1000
    )
    assert result.bulk_skipped is not None
    start, until = result.bulk_skipped
    assert start == T0
    assert len(result.fires) <= 1000
    assert result.fires[0].planned_at == until
    assert result.fires[-1].planned_at == now
    assert result.next_run_at == now + timedelta(seconds=1)
    queued = [f for f in result.fires if f.status is QUEUED]
    # the newest missed fire (61 s old), then the 61 late ones within the grace
    assert queued[0].planned_at == now - timedelta(seconds=61)
    assert len(queued) == 62
