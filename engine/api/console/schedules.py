"""The schedules pages: search and filter, one schedule in depth, pause, resume, run now.

Every read and action is the ``/v1/schedules`` route's own handler (:meth:`Visit.call`):
the listing is a page of the schedules' primary key (by id, a cursor to the next page), an
id prefix a range of it, a tenant a range of ``schedules_tenant_live_idx``; a schedule page
reads the schedule, its preview, and its executions in a window of
``executions_schedule_idx`` sized to show its last few dozen fires.

DST: a schedule page shows the zone's next clock changes and the schedule's fires around
them. A change is found by sampling the zone's UTC offset every :data:`PROBE_STEP` and
bisecting the first difference to the second; zones change their offset at most a few
times a year and never twice within a day, so the daily probe misses none.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final
from zoneinfo import ZoneInfo

import msgspec
from starlette.responses import Response

from engine.api import problems, routes_executions, routes_schedules
from engine.api.console.web import Visit, safe_return_path, segment, with_notice
from engine.api.schemas import Preview, PreviewFire, ReasonIn
from engine.core.instants import format_utc
from engine.core.zones import load_zone
from engine.ledger.params import Page
from engine.model import Execution, Schedule

PAGE_ROWS: Final = 50
LIST_FILTERS: Final = ("id_prefix", "tenant_id", "task_type", "enabled")
NEXT_FIRES: Final = 10
AROUND_TRANSITION: Final = timedelta(hours=3)
"""Fires this close to a DST transition are shown beside it."""
RECENT_FIRES: Final = 40
"""How many of its latest fires the window of a schedule's recent executions aims at."""
RECENT_WINDOW_MIN: Final = timedelta(hours=1)
RECENT_WINDOW_MAX: Final = timedelta(days=35)
RECENT_ROWS: Final = 100
ACTIONS: Final = {
    "pause": (routes_schedules.pause, "paused"),
    "resume": (routes_schedules.resume, "resumed"),
    "trigger": (routes_schedules.trigger, "triggered"),
}


def filters(visit: Visit) -> dict[str, str | None]:
    return {name: visit.query(name) for name in LIST_FILTERS}


async def schedules(visit: Visit) -> Response:
    chosen = filters(visit)
    query = {**chosen, "cursor": visit.query("cursor"), "limit": str(PAGE_ROWS)}
    page: Page[Schedule] = await visit.call(routes_schedules.listing, query=query)
    return visit.page(
        "schedules.html",
        schedules=page.items,
        filters=chosen,
        next_cursor=page.next_cursor,
        paged=visit.query("cursor") is not None,
    )


def recent_window(fires: list[PreviewFire], now: datetime) -> timedelta:
    """How far back a schedule's recent executions are read: long enough for about
    :data:`RECENT_FIRES` of its fires, judged from the spacing of its next ones."""
    if len(fires) < 2:
        return RECENT_WINDOW_MAX
    spacing = (fires[-1].planned_at - fires[0].planned_at) / (len(fires) - 1)
    return min(max(spacing * RECENT_FIRES, RECENT_WINDOW_MIN), RECENT_WINDOW_MAX)


async def _around(
    visit: Visit, schedule_id: str, transition: Transition
) -> tuple[Transition, list[PreviewFire]]:
    """The schedule's fires within :data:`AROUND_TRANSITION` of ``transition``."""
    preview: Preview = await visit.call(
        routes_schedules.preview,
        path={"schedule_id": schedule_id},
        query={"after": format_utc(transition.at - AROUND_TRANSITION), "count": "8"},
    )
    end = transition.at + AROUND_TRANSITION
    return transition, [fire for fire in preview.fires if fire.planned_at < end]


async def schedule(visit: Visit) -> Response:
    schedule_id = visit.request.path_params["schedule_id"]
    path = {"schedule_id": schedule_id}
    found: Schedule = await visit.call(routes_schedules.get, path=path)
    now = await visit.ledger.database_now()
    preview: Preview = await visit.call(
        routes_schedules.preview, path=path, query={"count": str(NEXT_FIRES)}
    )
    transitions = [
        await _around(visit, schedule_id, transition)
        for transition in next_transitions(load_zone(found.timezone), now)
    ]
    since = now - recent_window(preview.fires, now)
    recent: Page[Execution] = await visit.call(
        routes_executions.list_executions,
        query={
            "schedule_id": schedule_id,
            "planned_from": format_utc(since),
            "limit": str(RECENT_ROWS),
        },
    )
    return visit.page(
        "schedule.html",
        schedule=found,
        payload=msgspec.json.format(msgspec.json.encode(found.payload), indent=2).decode(),
        fires=preview.fires,
        transitions=transitions,
        recent=list(reversed(recent.items)),
        recent_more=recent.next_cursor is not None,
        since=since,
        now=now,
        delay=start_delay_s,
    )


def start_delay_s(execution: Execution) -> float | None:
    """How long after its planned instant the execution's current attempt started."""
    if execution.started_at is None:
        return None
    return (execution.started_at - execution.planned_at).total_seconds()


async def act(visit: Visit) -> Response:
    """``POST /ui/schedules/{id}/{pause|resume|trigger}``, then back where the form was."""
    schedule_id = visit.request.path_params["schedule_id"]
    action = ACTIONS.get(visit.request.path_params["action"])
    if action is None:
        raise problems.not_found("no such action: use pause, resume or trigger")
    handler, notice = action
    body = reason_body(visit)
    await visit.call(handler, path={"schedule_id": schedule_id}, body=body)
    back = safe_return_path(visit.field("back"), f"/schedules/{segment(schedule_id)}")
    return with_notice(back, notice)


def reason_body(visit: Visit) -> ReasonIn:
    """The form's ``reason``, checked as the API checks a body (length)."""
    fields: dict[str, Any] = {"reason": visit.field("reason")}
    try:
        return msgspec.convert(fields, ReasonIn)
    except msgspec.ValidationError as exc:
        raise problems.decode_error(exc) from None


# --- the zone's clock changes --------------------------------------------------------------

PROBE_STEP: Final = timedelta(days=1)
HORIZON: Final = timedelta(days=400)
"""How far ahead transitions are looked for: every zone with DST has one within a year."""


@dataclass(frozen=True)
class Transition:
    at: datetime
    """The first UTC instant of the new offset."""
    before: timedelta
    after: timedelta

    @property
    def kind(self) -> str:
        """``gap`` (clocks jump forward: some wall times never happen) or ``overlap``
        (clocks fall back: some wall times happen twice)."""
        return "gap" if self.after > self.before else "overlap"

    @property
    def change(self) -> str:
        minutes = int((self.after - self.before).total_seconds() // 60)
        sign = "+" if minutes > 0 else "-"
        return f"{sign}{abs(minutes) // 60}:{abs(minutes) % 60:02d}"


def _offset(zone: ZoneInfo, instant: datetime) -> timedelta:
    offset = instant.astimezone(zone).utcoffset()
    return offset if offset is not None else timedelta(0)


def next_transitions(zone: ZoneInfo, after: datetime, count: int = 2) -> list[Transition]:
    """The next ``count`` offset changes of ``zone`` after ``after``, within :data:`HORIZON`."""
    found: list[Transition] = []
    low = after.astimezone(UTC)
    end = low + HORIZON
    low_offset = _offset(zone, low)
    while len(found) < count and low < end:
        high = low + PROBE_STEP
        high_offset = _offset(zone, high)
        if high_offset != low_offset:
            first, last = low, high
            while last - first > timedelta(seconds=1):
                middle = first + (last - first) / 2
                if _offset(zone, middle) == low_offset:
                    first = middle
                else:
                    last = middle
            found.append(Transition(last.replace(microsecond=0), low_offset, high_offset))
        low, low_offset = high, high_offset
    return found
