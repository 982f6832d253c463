"""What should have fired: the independent expectation, from the schedules' histories.

For every schedule, each revision recorded by the API client (create, payload change,
retime, pause, resume, delete) starts a *segment* in which one definition is in force. The
oracle (:mod:`simulations.oracle`) lists the segment's instants; each (schedule, instant)
gets a kind:

* ``REQUIRED`` -- must have succeeded by the end of the run, or be recorded as skipped for a
  reason the policies allow, or be a dead letter its handler's failures justify;
* ``OPTIONAL`` -- may or may not exist: the documented edges of a change. A change made while
  the planner had not reached an instant yet (``next_run_at`` ``n0`` read just before it)
  drops the old definition's instants from ``n0`` on; a planner that has not heard of a
  retime yet may still write the old definition's instants for a while (``stale_s``); and
  instants within the completion allowance of the end need not have finished;
* ``NO_RUN`` -- instants of a paused or deleted schedule that were (or may have been)
  planned before the pause: they may exist, but only as skipped, and never run.

Any execution at an instant that is none of these is a fire that should not exist.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from simulations import oracle
from simulations.driver import Revision
from simulations.workload import SimSchedule


class Kind(enum.IntEnum):
    NO_RUN = 1
    OPTIONAL = 2
    REQUIRED = 3


@dataclass
class Expectation:
    kinds: dict[tuple[str, datetime], Kind] = field(default_factory=dict)
    definition: dict[tuple[str, datetime], tuple[SimSchedule, datetime]] = field(
        default_factory=dict
    )
    """The definition an instant belongs to (for its catch-up and overlap policies), and
    when that definition came into force."""
    stopped_at: dict[str, set[datetime]] = field(default_factory=dict)
    """When each schedule was paused or deleted (the skips those changes write)."""

    def mark(
        self, key: tuple[str, datetime], kind: Kind, schedule: SimSchedule, since: datetime
    ) -> None:
        if kind > self.kinds.get(key, 0):
            self.kinds[key] = kind
            self.definition[key] = (schedule, since)

    @property
    def required(self) -> list[tuple[str, datetime]]:
        return sorted(k for k, kind in self.kinds.items() if kind is Kind.REQUIRED)


def _fires(schedule: SimSchedule, after: datetime, until: datetime) -> tuple[datetime, ...]:
    if until <= after:
        return ()
    return oracle.fires(*schedule.timing(), after, until)


def expect(
    history: dict[str, list[Revision]],
    end: datetime,
    *,
    stale_s: float,
    completion_s: float,
    ahead_s: float,
) -> Expectation:
    """The expectation for a run that ended at ``end``; instants up to ``ahead_s`` after it
    may have been planned already (lookahead)."""
    out = Expectation()
    cutoff = end - timedelta(seconds=completion_s)
    horizon = end + timedelta(seconds=ahead_s)
    stale = timedelta(seconds=stale_s)
    for schedule_id in sorted(history):
        revisions = history[schedule_id]
        for index, revision in enumerate(revisions):
            if revision.action in ("pause", "delete"):
                out.stopped_at.setdefault(schedule_id, set()).add(revision.at)
            schedule = revision.schedule
            if schedule is None:
                continue
            following = revisions[index + 1] if index + 1 < len(revisions) else None
            until = horizon if following is None else following.at
            # A change drops the instants the planner had not reached (documented): those
            # from the next_run_at it read just before the change on are optional.
            dropped_from = until
            if following is not None and following.action != "payload":
                dropped_from = following.next_run_before or revision.at
            for instant in _fires(schedule, revision.at, until):
                required = instant <= cutoff and instant < dropped_from
                kind = Kind.REQUIRED if required else Kind.OPTIONAL
                out.mark((schedule_id, instant), kind, schedule, revision.at)
            if following is not None:
                _edge(out, schedule_id, schedule, revision.at, following, horizon, stale, cutoff)
    return out


def _edge(
    out: Expectation,
    schedule_id: str,
    old: SimSchedule,
    since: datetime,
    change: Revision,
    horizon: datetime,
    stale: timedelta,
    cutoff: datetime,
) -> None:
    """The instants around ``change`` that the old definition may or may not produce."""
    if change.action == "payload":
        return  # same timing: the segments simply continue
    at = change.at
    planned_up_to = change.next_run_before or since
    for instant in _fires(old, at, min(at + stale, horizon)):
        key = (schedule_id, instant)
        if change.action in ("pause", "delete"):
            out.mark(key, Kind.NO_RUN, old, since)
        elif instant < planned_up_to and instant <= cutoff:
            out.mark(key, Kind.REQUIRED, old, since)  # queued before the change: it runs
        else:
            out.mark(key, Kind.OPTIONAL, old, since)
