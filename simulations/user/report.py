"""What ``carillon simulate`` reports: per schedule, DST moves, bursts, violations.

Each column takes its numbers from the source that can answer it honestly:

* **expected fires, DST moves and bursts** come from the simulator's oracle
  (:mod:`simulations.oracle`), not from ``engine.core``'s timetables (which ``carillon
  preview`` and the forecast use): the point of the report is to set what the engine did
  beside an expectation that shares none of its code, so a DST rule applied wrongly shows up
  as a difference (and a violation) instead of agreeing with itself. The oracle also sees
  what a timetable never yields -- a wall time a ``skip`` policy drops;
* **what fired, when, and how late** comes from the run itself: the ledger's executions
  (status, skip reason) and the handler's starts (start delay).

The report covers the window ``(start, start + days]``; the run goes on for the liveness
tail (every fault healed, fires allowed to finish), and what is planned there is checked but
not listed. Nothing in it depends on the wall clock, so the same command prints the same
report.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Final
from zoneinfo import ZoneInfo

from engine.model import Execution, ExecutionStatus
from simulations import oracle
from simulations.runner import Result
from simulations.user.params import Request, transitions_between
from simulations.user.schedule_set import UserSchedule, UserSet
from simulations.workload import SimSchedule

BUSIEST_MINUTES: Final = 5
PEAK_GROUPS: Final = 3
"""Tenants and zones named per busy minute."""
_DAY: Final = timedelta(days=1)
OUTSIDE: Final = "outside the window"


@dataclass
class ScheduleRow:
    schedule: UserSchedule
    expected: int = 0
    succeeded: int = 0
    skipped: Counter[str] = field(default_factory=Counter)
    dead_letter: int = 0
    unfinished: int = 0
    first_fire: datetime | None = None
    """The planned instant of the first fire whose handler ran (local time)."""
    last_fire: datetime | None = None
    max_start_delay_s: float | None = None


@dataclass(frozen=True)
class Fired:
    instant: datetime
    status: str
    """``succeeded``, ``skipped/overlap`` ..., ``no execution``, or ``outside the window``
    (the other pass of a wall time whose first or last pass is in the window)."""


@dataclass(frozen=True)
class DstMove:
    """A wall time of a schedule that a DST transition moved, dropped or doubled."""

    schedule_id: str
    zone: str
    wall: datetime
    """Naive local wall time the expression matched."""
    kind: str
    """``gap`` (the wall time does not exist) or ``overlap`` (it happens twice)."""
    policy: str
    """The effective policy: ``shift``/``skip`` for a gap, ``first``/``last``/``both``."""
    auto: bool
    """Whether the policy came from ``auto`` (the cronie rule)."""
    transition: datetime
    before: str
    after: str
    """The zone's abbreviation and offset each side (``EST -05:00``)."""
    fires: tuple[Fired, ...]
    passes_not_fired: tuple[datetime, ...] = ()
    """Overlap passes the policy leaves out."""
    same_fire_as: str | None = None
    """A shifted wall time whose instant another wall time already fires at (one fire)."""


@dataclass(frozen=True)
class Burst:
    minute: datetime
    fires: int
    tenants: tuple[tuple[str, int], ...]
    zones: tuple[tuple[str, int], ...]
    max_start_delay_s: float | None


@dataclass
class Report:
    request: Request
    command: str
    parameters: list[str]
    rows: list[ScheduleRow]
    dst_moves: list[DstMove]
    bursts: list[Burst]
    busiest_second: tuple[datetime, int] | None
    result: Result
    disabled: tuple[str, ...]

    @property
    def violations(self) -> list[str]:
        return self.result.violations


def build(request: Request, user_set: UserSet, result: Result) -> Report:
    """The report of a finished run of ``user_set``."""
    start, end = request.start, request.end
    by_schedule: dict[str, list[Execution]] = defaultdict(list)
    for e in result.executions:
        by_schedule[e.schedule_id].append(e)
    first_start: dict[tuple[str, datetime], datetime] = {}
    for d in result.deliveries:
        key = (d.schedule_id, d.planned_at)
        first_start[key] = min(first_start.get(key, d.started_at), d.started_at)
    delays = {key: (at - key[1]).total_seconds() for key, at in first_start.items()}
    rows: list[ScheduleRow] = []
    moves: list[DstMove] = []
    due: list[tuple[datetime, UserSchedule]] = []
    for schedule in user_set.schedules:
        sid = schedule.sim.schedule_id
        expected = oracle.fires(*schedule.sim.timing(), start, end)
        due += [(instant, schedule) for instant in expected]
        executions = {e.planned_at: e for e in by_schedule[sid]}
        rows.append(_row(schedule, len(expected), executions, delays, start, end))
        moves += dst_moves(schedule.sim, start, end, executions)
    minutes, second = bursts(due, delays)
    return Report(
        request=request,
        command=request.command(user_set.format),
        parameters=result.params.lines(schedules=False),
        rows=rows,
        dst_moves=sorted(moves, key=lambda m: (m.transition, m.schedule_id, m.wall)),
        bursts=minutes,
        busiest_second=second,
        result=result,
        disabled=user_set.disabled,
    )


def _row(
    schedule: UserSchedule,
    expected: int,
    executions: dict[datetime, Execution],
    delays: dict[tuple[str, datetime], float],
    start: datetime,
    end: datetime,
) -> ScheduleRow:
    row = ScheduleRow(schedule, expected=expected)
    ran: list[datetime] = []
    for planned, e in sorted(executions.items()):
        if not start < planned <= end:
            continue
        if e.status is ExecutionStatus.SUCCEEDED:
            row.succeeded += 1
        elif e.status is ExecutionStatus.SKIPPED:
            row.skipped[e.error_code or "?"] += 1
        elif e.status is ExecutionStatus.DEAD_LETTER:
            row.dead_letter += 1
        else:
            row.unfinished += 1
        delay = delays.get((e.schedule_id, planned))
        if delay is not None:
            ran.append(planned)
            row.max_start_delay_s = max(row.max_start_delay_s or 0.0, delay)
    if ran:
        zone = ZoneInfo(schedule.sim.timezone)
        row.first_fire = ran[0].astimezone(zone)
        row.last_fire = ran[-1].astimezone(zone)
    return row


def status_of(execution: Execution | None) -> str:
    if execution is None:
        return "no execution"
    if execution.error_code:
        return f"{execution.status}/{execution.error_code}"
    return str(execution.status)


# --- DST moves -------------------------------------------------------------------------------


def dst_moves(
    sim: SimSchedule, start: datetime, end: datetime, executions: dict[datetime, Execution]
) -> list[DstMove]:
    """Every wall time of ``sim`` in the window that a transition of its zone moved,
    dropped or doubled, with what became of each resulting fire."""
    zone = ZoneInfo(sim.timezone)
    cron = oracle.CronOracle(sim.cron_expr)
    moves: list[DstMove] = []
    for at in transitions_between(sim.timezone, start - _DAY, end + _DAY):
        day = at.astimezone(zone).date()
        claimed: dict[datetime, str] = {}
        for wall in cron.walls(day - _DAY, day + _DAY):
            move = _move(sim, zone, cron, wall, at, claimed)
            if move is None or not _in_window(move, start, end):
                continue
            fires = tuple(
                Fired(f.instant, status_of(executions.get(f.instant)))
                if start < f.instant <= end
                else f
                for f in move.fires
            )
            moves.append(replace(move, fires=fires))
    return moves


def _move(
    sim: SimSchedule,
    zone: ZoneInfo,
    cron: oracle.CronOracle,
    wall: datetime,
    at: datetime,
    claimed: dict[datetime, str],
) -> DstMove | None:
    """What the transition at ``at`` does to ``wall``; ``None`` if it does nothing."""
    first = wall.replace(tzinfo=zone, fold=0).astimezone(UTC)
    second = wall.replace(tzinfo=zone, fold=1).astimezone(UTC)
    if first == second or not min(first, second) <= at <= max(first, second):
        return None  # an ordinary wall time, or one of another transition
    is_gap = first > second  # fold=0 reads the offset from before the gap: the later one
    gap, overlap = oracle.effective(sim.cron_expr, sim.dst_gap, sim.dst_overlap)
    instants = oracle.resolve(wall, zone, gap, overlap)
    return DstMove(
        schedule_id=sim.schedule_id,
        zone=sim.timezone,
        wall=wall,
        kind="gap" if is_gap else "overlap",
        policy=gap if is_gap else overlap,
        auto=(sim.dst_gap if is_gap else sim.dst_overlap) == "auto",
        transition=at,
        before=_offset_text(at - timedelta(seconds=1), zone),
        after=_offset_text(at, zone),
        fires=tuple(Fired(i, OUTSIDE) for i in instants),
        passes_not_fired=() if is_gap else tuple(i for i in (first, second) if i not in instants),
        same_fire_as=_same_fire(cron, zone, wall, instants, claimed),
    )


def _same_fire(
    cron: oracle.CronOracle,
    zone: ZoneInfo,
    wall: datetime,
    instants: list[datetime],
    claimed: dict[datetime, str],
) -> str | None:
    """The wall time (``HH:MM``) whose fire a shifted one merges with: equal instants are
    one fire."""
    if len(instants) != 1 or instants[0].astimezone(zone).replace(tzinfo=None) == wall:
        return None
    local = instants[0].astimezone(zone).replace(tzinfo=None)
    if cron.matches_day(local.date()) and local.hour in cron.hours and local.minute in cron.minutes:
        return local.strftime("%H:%M")  # a wall time that fires there anyway
    earlier = claimed.setdefault(instants[0], wall.strftime("%H:%M"))
    return None if earlier == wall.strftime("%H:%M") else earlier


def _in_window(move: DstMove, start: datetime, end: datetime) -> bool:
    instants = [f.instant for f in move.fires] + list(move.passes_not_fired) or [move.transition]
    return any(start < i <= end for i in instants)


def _offset_text(instant: datetime, zone: ZoneInfo) -> str:
    local = instant.astimezone(zone)
    offset = local.strftime("%z")
    return f"{local.tzname()} {offset[:3]}:{offset[3:]}"


# --- bursts ----------------------------------------------------------------------------------


def bursts(
    due: list[tuple[datetime, UserSchedule]], delays: dict[tuple[str, datetime], float]
) -> tuple[list[Burst], tuple[datetime, int] | None]:
    """The :data:`BUSIEST_MINUTES` minutes with the most fires due (earliest first among
    equals), and the busiest single second."""
    if not due:
        return [], None
    per_minute: dict[datetime, list[tuple[datetime, UserSchedule]]] = {}
    per_second: Counter[datetime] = Counter()
    for instant, schedule in due:
        per_minute.setdefault(instant.replace(second=0, microsecond=0), []).append(
            (instant, schedule)
        )
        per_second[instant] += 1
    top = sorted(per_minute.items(), key=lambda item: (-len(item[1]), item[0]))
    minutes = []
    for minute, fires in top[:BUSIEST_MINUTES]:
        tenants = Counter(s.sim.tenant_id for _, s in fires)
        zones = Counter(s.sim.timezone for _, s in fires)
        started = [delays[k] for i, s in fires if (k := (s.sim.schedule_id, i)) in delays]
        minutes.append(
            Burst(
                minute=minute,
                fires=len(fires),
                tenants=_top(tenants),
                zones=_top(zones),
                max_start_delay_s=max(started) if started else None,
            )
        )
    second, count = min(per_second.items(), key=lambda item: (-item[1], item[0]))
    return minutes, (second, count)


def _top(counts: Counter[str]) -> tuple[tuple[str, int], ...]:
    return tuple(sorted(counts.items(), key=lambda item: (-item[1], item[0]))[:PEAK_GROUPS])
