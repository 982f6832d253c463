"""``/v1/schedules``: create, read, change, delete, pause, resume, trigger, backfill, preview.

Writes go to the ledger; the owning node hears of them through the change feed within about
a second, whichever node served the request. Versions are exposed as ``ETag`` headers
(``"3"``); ``PATCH``, ``PUT`` and ``DELETE`` honour ``If-Match`` and answer 412 when the
schedule changed meanwhile. A tenant token works only on its own tenant's schedules and gets
404 for any other, exactly as for a schedule that does not exist.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Final

from engine.api import problems
from engine.api.endpoint import (
    BATCH_BODY_BYTES_MAX,
    LIMIT,
    Call,
    Endpoint,
    QueryParam,
    Reply,
    check_instant,
)
from engine.api.schedule_input import (
    apply_patch,
    paused,
    replace_with_spec,
    resumed,
    schedule_from_spec,
    timetable_of,
)
from engine.api.schemas import (
    INSTANT_MAX,
    BackfillIn,
    BackfillResult,
    BatchResult,
    Preview,
    PreviewFire,
    ReasonIn,
    ScheduleBatch,
    SchedulePatch,
    ScheduleSpec,
)
from engine.core.instants import format_local
from engine.core.timetable import FIRES_PER_CALL_MAX, Fire, Timetable
from engine.errors import CarillonError, InvalidField, NotFound, VersionConflict
from engine.ledger.params import (
    BATCH_ROWS_MAX,
    Backfilled,
    ExecutionsBackfill,
    ExecutionsTrigger,
    Page,
    SchedulesCreate,
    SchedulesDelete,
    SchedulesList,
    SchedulesUpdate,
)
from engine.model import DEFAULT_TENANT, Execution, Schedule

VERSION_MAX: Final = 2**63 - 1
"""The largest version the ledger can store (a bigint): an If-Match above it never matches."""
PREVIEW_COUNT_DEFAULT: Final = 10


def _etag(schedule: Schedule) -> dict[str, str]:
    return {"ETag": f'"{schedule.version}"'}


def _if_match(call: Call) -> int | None:
    header = call.request.headers.get("if-match")
    if header is None:
        return None
    text = header.strip().removeprefix("W/").strip('"')
    if not (text.isascii() and text.isdigit()):  # int() refuses some Unicode digits ("²")
        raise problems.bad_request('If-Match must be a version ETag such as "3"')
    version = int(text)
    if version > VERSION_MAX:
        raise VersionConflict(f"no schedule is at version {text}")
    return version


def _tenant_for(call: Call, requested: str | None) -> str:
    """The tenant a new schedule goes to: the token's own, or for an admin the one asked."""
    own = call.who.tenant_id
    if own is None:
        return DEFAULT_TENANT if requested is None else requested
    if requested is not None and requested != own:
        raise problems.not_found(f"tenant {requested!r} not found")
    return own


async def _visible(call: Call, schedule_id: str) -> Schedule:
    """The schedule, if the caller may see it; otherwise the very 404 of a schedule that
    does not exist."""
    schedule: Schedule = await call.api.ledger.schedules_get(schedule_id)
    call.who.check_tenant(schedule.tenant_id, f"schedule {schedule_id!r}")
    return schedule


async def create(call: Call) -> Reply:
    spec: ScheduleSpec = call.body
    now = await call.api.ledger.database_now()
    schedule_id = call.api.new_id() if spec.schedule_id is None else spec.schedule_id
    schedule = schedule_from_spec(
        spec, schedule_id=schedule_id, tenant_id=_tenant_for(call, spec.tenant_id), now=now
    )
    (stored,) = await call.api.ledger.schedules_create(SchedulesCreate([schedule]))
    headers = _etag(stored) | {"Location": f"/v1/schedules/{stored.schedule_id}"}
    return Reply(stored, 201, headers)


async def put(call: Call) -> Reply:
    spec: ScheduleSpec = call.body
    schedule_id = call.path("schedule_id")
    if spec.schedule_id is not None and spec.schedule_id != schedule_id:
        raise problems.invalid("schedule_id in the body differs from the one in the path")
    expected = _if_match(call)
    now = await call.api.ledger.database_now()
    try:
        current: Schedule | None = await call.api.ledger.schedules_get(schedule_id)
    except NotFound:
        current = None
    if current is None or not call.who.can_see(current.tenant_id):
        # Absent to the caller: a create. Another tenant's id (live or deleted) is refused
        # by the ledger as taken, exactly as by POST (docs/api.md, "One namespace of ids").
        if expected is not None:
            raise VersionConflict(f"schedule {schedule_id!r} does not exist")
        schedule = schedule_from_spec(
            spec, schedule_id=schedule_id, tenant_id=_tenant_for(call, spec.tenant_id), now=now
        )
        (stored,) = await call.api.ledger.schedules_create(SchedulesCreate([schedule]))
        return Reply(stored, 201, _etag(stored))
    return await _update(call, current, replace_with_spec(current, spec, now=now), expected)


async def get(call: Call) -> Reply:
    schedule = await _visible(call, call.path("schedule_id"))
    return Reply(schedule, 200, _etag(schedule))


async def patch(call: Call) -> Reply:
    current = await _visible(call, call.path("schedule_id"))
    expected = _if_match(call)
    now = await call.api.ledger.database_now()
    wanted = apply_patch(current, call.body, now=now)
    return await _update(call, current, wanted, expected)


async def delete(call: Call) -> Reply:
    schedule_id = call.path("schedule_id")
    await _visible(call, schedule_id)
    await call.api.ledger.schedules_delete(SchedulesDelete(schedule_id, _if_match(call)))
    return Reply(None, 204)


async def listing(call: Call) -> Reply:
    tenant = call.query_str("tenant_id")
    own = call.who.tenant_id
    if own is not None:
        if tenant not in (None, own):
            raise problems.not_found(f"tenant {tenant!r} not found")
        tenant = own
    enabled_text = call.query_str("enabled")
    if enabled_text not in (None, "true", "false"):
        raise problems.invalid("query parameter 'enabled' must be true or false")
    page: Page[Schedule] = await call.api.ledger.schedules_list(
        SchedulesList(
            tenant_id=tenant,
            task_type=call.query_str("task_type"),
            enabled=None if enabled_text is None else enabled_text == "true",
            cursor=call.query_str("cursor"),
            limit=call.query_int(LIMIT),
            id_prefix=call.query_str("id_prefix"),
        )
    )
    return Reply(page)


async def batch(call: Call) -> Reply:
    body: ScheduleBatch = call.body
    now = await call.api.ledger.database_now()
    schedules: list[Schedule] = []
    errors: list[str] = []
    for index, spec in enumerate(body.schedules):
        try:
            schedules.append(
                schedule_from_spec(
                    spec,
                    schedule_id=call.api.new_id() if spec.schedule_id is None else spec.schedule_id,
                    tenant_id=_tenant_for(call, spec.tenant_id),
                    now=now,
                )
            )
        except (InvalidField, ValueError) as exc:
            errors.append(f"schedules[{index}]: {exc}")
        except problems.Problem as problem:
            errors.append(f"schedules[{index}]: {problem.detail}")
    if errors:
        raise problems.invalid(
            f"{len(errors)} of {len(body.schedules)} schedules are invalid; none was created",
            errors=errors[:100],
        )
    ids = [schedule.schedule_id for schedule in schedules]
    if len(set(ids)) != len(ids):
        raise problems.invalid("the batch names the same schedule_id more than once")
    stored = await call.api.ledger.schedules_create(SchedulesCreate(schedules))
    return Reply(BatchResult(len(stored), [s.schedule_id for s in stored]), 201)


async def pause(call: Call) -> Reply:
    current = await _visible(call, call.path("schedule_id"))
    if not current.enabled:
        return Reply(current, 200, _etag(current))
    return await _update(call, current, paused(current), None)


async def resume(call: Call) -> Reply:
    current = await _visible(call, call.path("schedule_id"))
    if current.enabled:
        return Reply(current, 200, _etag(current))
    now = await call.api.ledger.database_now()
    return await _update(call, current, resumed(current, now=now), None)


async def trigger(call: Call) -> Reply:
    schedule = await _visible(call, call.path("schedule_id"))
    body: ReasonIn = call.body
    execution: Execution = await call.api.ledger.executions_trigger(
        ExecutionsTrigger(schedule.schedule_id, call.who.actor, body.reason)
    )
    return Reply(execution, 201, {"Location": f"/v1/executions/{execution.execution_id}"})


async def backfill(call: Call) -> Reply:
    schedule = await _visible(call, call.path("schedule_id"))
    body: BackfillIn = call.body
    for name, value in (("from", body.from_), ("to", body.to)):
        check_instant(value, name)
    if body.to <= body.from_:
        raise problems.invalid("'to' must be after 'from'")
    now = await call.api.ledger.database_now()
    if body.to > now + timedelta(seconds=1):
        raise problems.invalid(
            "a backfill covers the past: 'to' must not be in the future (future fires are "
            "planned by the engine)"
        )
    # 'to' may lie up to a second ahead (a client's clock); fires after now are not past.
    planned = _occurrences(schedule, body.from_, min(body.to, now + timedelta(microseconds=1)))
    done: Backfilled = await call.api.ledger.executions_backfill(
        ExecutionsBackfill(schedule.schedule_id, planned, call.who.actor, body.reason)
    )
    inserted = done.inserted
    return Reply(
        BackfillResult(
            len(planned), len(inserted), inserted, done.skipped_purged, done.purged_through
        ),
        201,
    )


async def preview(call: Call) -> Reply:
    schedule = await _visible(call, call.path("schedule_id"))
    count = call.query_int(_COUNT)
    after = call.query_instant("after") or await call.api.ledger.database_now()
    timetable = timetable_of(schedule)
    fires = _fires_before_instant_max(timetable, after, count)
    return Reply(
        Preview(
            schedule.schedule_id,
            schedule.timezone,
            [
                PreviewFire(
                    fire.planned_at,
                    format_local(fire.local(timetable.zone)),
                    str(fire.adjustment),
                )
                for fire in fires
            ],
        )
    )


def _fires_before_instant_max(timetable: Timetable, after: datetime, count: int) -> list[Fire]:
    """Up to ``count`` fires after ``after`` and before :data:`INSTANT_MAX`, where the API's
    instants end (fewer when there are fewer: a yearly schedule has 10,000 fires in no
    century, and the calendar itself ends at year 9999)."""
    fires: list[Fire] = []
    while len(fires) < count:
        try:
            fire = timetable.next_fire(after)
        except CarillonError:
            raise
        except (OverflowError, ValueError):  # the next fire would be after year 9999
            break
        if fire.planned_at >= INSTANT_MAX:
            break
        fires.append(fire)
        after = fire.planned_at
    return fires


def _occurrences(schedule: Schedule, start: datetime, end: datetime) -> list[datetime]:
    """The fires in ``[start, end)``; 422 beyond :data:`BATCH_ROWS_MAX`."""
    timetable = timetable_of(schedule)
    planned: list[datetime] = []
    fire = timetable.next_fire(start - timedelta(microseconds=1))
    while fire.planned_at < end:
        if len(planned) == BATCH_ROWS_MAX:
            raise problems.invalid(
                f"the range holds more than {BATCH_ROWS_MAX} fires; backfill it in smaller ranges"
            )
        planned.append(fire.planned_at)
        fire = timetable.next_fire(fire.planned_at)
    return planned


async def _update(call: Call, current: Schedule, wanted: Schedule, expected: int | None) -> Reply:
    """Write ``wanted`` over ``current`` -- unless nothing changed: then nothing is written
    and the version stays, so repeating a ``PUT`` or ``PATCH`` is free and idempotent."""
    if wanted == current:
        if expected is not None and expected != current.version:
            raise VersionConflict(
                f"schedule {current.schedule_id!r} is at version {current.version}, not "
                f"{expected}; re-read it and apply the change again"
            )
        return Reply(current, 200, _etag(current))
    stored = await call.api.ledger.schedules_update(
        SchedulesUpdate(wanted, current.version if expected is None else expected)
    )
    return Reply(stored, 200, _etag(stored))


_ID = "/v1/schedules/{schedule_id}"
_LIST_QUERY: Final = (
    QueryParam("tenant_id", "string", "only this tenant's (a tenant token: its own)"),
    QueryParam("task_type", "string", "only this task type's"),
    QueryParam("enabled", "boolean", "only enabled (true) or paused (false) schedules"),
    QueryParam("id_prefix", "string", "only the ids that start with it"),
    QueryParam("cursor", "string", "next_cursor of the previous page"),
    LIMIT,
)
_COUNT: Final = QueryParam(
    "count",
    "integer",
    f"how many, 1..{FIRES_PER_CALL_MAX} (default {PREVIEW_COUNT_DEFAULT})",
    minimum=1,
    maximum=FIRES_PER_CALL_MAX,
    default=PREVIEW_COUNT_DEFAULT,
)

ENDPOINTS: Final = (
    Endpoint(
        "POST",
        "/v1/schedules",
        create,
        "Create a schedule",
        body=ScheduleSpec,
        response=Schedule,
        status=201,
    ),
    Endpoint(
        "GET",
        "/v1/schedules",
        listing,
        "List schedules",
        response=Page[Schedule],
        query=_LIST_QUERY,
    ),
    Endpoint(
        "POST",
        "/v1/schedules:batch",
        batch,
        "Create up to 10,000 schedules, all or none",
        body=ScheduleBatch,
        response=BatchResult,
        status=201,
        body_bytes_max=BATCH_BODY_BYTES_MAX,
        too_large=f"a batch holds at most {BATCH_ROWS_MAX} schedules and "
        f"{BATCH_BODY_BYTES_MAX} bytes of JSON; send smaller batches",
    ),
    Endpoint(
        "POST",
        _ID + ":pause",
        pause,
        "Pause a schedule (its queued runs are skipped)",
        body=ReasonIn,
        response=Schedule,
    ),
    Endpoint(
        "POST",
        _ID + ":resume",
        resume,
        "Resume a schedule from its next fire",
        body=ReasonIn,
        response=Schedule,
    ),
    Endpoint(
        "POST",
        _ID + ":trigger",
        trigger,
        "Run a schedule now, under an id of its own",
        body=ReasonIn,
        response=Execution,
        status=201,
    ),
    Endpoint(
        "POST",
        _ID + ":backfill",
        backfill,
        "Plan the fires in [from, to) under their normal ids (never duplicates a run)",
        body=BackfillIn,
        response=BackfillResult,
        status=201,
    ),
    Endpoint(
        "GET",
        _ID + "/preview",
        preview,
        "The next fires of a schedule",
        response=Preview,
        query=(
            _COUNT,
            QueryParam("after", "date-time", "fires after this instant (default now)"),
        ),
    ),
    Endpoint(
        "PUT",
        _ID,
        put,
        "Create or replace a schedule under a client-chosen id",
        body=ScheduleSpec,
        response=Schedule,
        also=((201, "created"),),
        conditional=True,
    ),
    Endpoint("GET", _ID, get, "Read a schedule", response=Schedule),
    Endpoint(
        "PATCH",
        _ID,
        patch,
        "Change some fields of a schedule",
        body=SchedulePatch,
        response=Schedule,
        conditional=True,
    ),
    Endpoint(
        "DELETE",
        _ID,
        delete,
        "Delete a schedule (its queued runs are skipped)",
        status=204,
        conditional=True,
    ),
)
