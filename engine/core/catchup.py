"""What to do with fires that were missed while nobody planned a schedule.

A planner taking over a partition (or restarting) finds schedules whose ``next_run_at`` is
in the past. Fires more than ``grace_s`` old are *missed*; younger ones are merely late and
run normally. Each missed fire is recorded -- never silently dropped:

* older than the schedule's catch-up window: ``skipped``, reason ``catchup_window``;
* within the window, by policy: ``all`` runs each (at most ``max_runs``, the oldest beyond
  that skipped with ``catchup_limit``); ``latest`` runs only the most recent (the others
  ``catchup_latest_only``); ``none`` runs none (``catchup_none``).

The work is bounded: at most about ``records_max`` fires are enumerated. When more were
missed (a per-second schedule after a week's outage), the oldest are skipped as one range,
reported in ``bulk_skipped``, and only the most recent ones are resolved one by one.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Final

import msgspec

from engine.core.timetable import Timetable
from engine.model import CatchUpPolicy, ExecutionStatus

CATCHUP_GRACE_S_DEFAULT: Final = 60.0
CATCHUP_RUNS_MAX_DEFAULT: Final = 100
CATCHUP_RECORDS_MAX_DEFAULT: Final = 1_000


class MissedFire(msgspec.Struct, frozen=True):
    planned_at: datetime
    status: ExecutionStatus
    """``queued`` (run it now) or ``skipped``."""
    reason: str | None = None


class CatchUp(msgspec.Struct, frozen=True):
    fires: list[MissedFire]
    """Missed (and late) fires in planned order: run or record each."""
    next_run_at: datetime
    """The first fire after the ones resolved here."""
    bulk_skipped: tuple[datetime, datetime] | None = None
    """Set when more than ``records_max`` fires were missed: every fire in ``[from, until)``
    was skipped without a record of its own (the planner logs and counts the range)."""


def catch_up(
    timetable: Timetable,
    next_run_at: datetime,
    now: datetime,
    *,
    policy: CatchUpPolicy,
    window_s: float,
    grace_s: float = CATCHUP_GRACE_S_DEFAULT,
    max_runs: int = CATCHUP_RUNS_MAX_DEFAULT,
    records_max: int = CATCHUP_RECORDS_MAX_DEFAULT,
) -> CatchUp:
    """Resolve the fires from ``next_run_at`` (a fire instant) up to ``now`` inclusive."""
    window_start = now - timedelta(seconds=window_s)
    late_from = now - timedelta(seconds=grace_s)
    past: list[datetime] = []
    bulk_from: datetime | None = None
    at = next_run_at
    while at <= now:
        past.append(at)
        if len(past) <= records_max:
            at = timetable.next_fire(at).planned_at
            continue
        # Too many missed fires to record one by one: skip what we have seen in bulk and
        # jump towards ``now`` so that about half the record budget covers the newest ones.
        bulk_from = bulk_from or past[0]
        spacing = (past[-1] - past[0]) / (len(past) - 1)
        jump_to = max(now - spacing * (records_max // 2), at + (now - at) / 2)
        past = []
        at = timetable.next_fire(jump_to).planned_at
    late = [p for p in past if p >= late_from]
    missed = [p for p in past if p < late_from]
    in_window = [p for p in missed if p >= window_start]
    fires = [
        MissedFire(p, ExecutionStatus.SKIPPED, "catchup_window") for p in missed if p < window_start
    ]
    fires += _apply_policy(in_window, policy, max_runs)
    fires += [MissedFire(p, ExecutionStatus.QUEUED) for p in late]
    bulk_until = past[0] if past else at
    return CatchUp(
        fires=fires,
        next_run_at=at,
        bulk_skipped=(bulk_from, bulk_until) if bulk_from is not None else None,
    )


def _apply_policy(
    in_window: list[datetime], policy: CatchUpPolicy, max_runs: int
) -> list[MissedFire]:
    queued, skipped = ExecutionStatus.QUEUED, ExecutionStatus.SKIPPED
    if not in_window:
        return []
    if policy is CatchUpPolicy.NONE:
        return [MissedFire(p, skipped, "catchup_none") for p in in_window]
    if policy is CatchUpPolicy.LATEST:
        *older, newest = in_window
        return [MissedFire(p, skipped, "catchup_latest_only") for p in older] + [
            MissedFire(newest, queued)
        ]
    cut = max(0, len(in_window) - max_runs)
    return [MissedFire(p, skipped, "catchup_limit") for p in in_window[:cut]] + [
        MissedFire(p, queued) for p in in_window[cut:]
    ]
