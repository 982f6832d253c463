"""From what a client sends to a valid :class:`~engine.model.Schedule`.

Everything a schedule write needs is checked here, before the ledger is touched, and every
failure is a :class:`~engine.errors.ValidationError` whose message says how to fix it: the
ids, the cron expression with its zone and DST policy (compiled, so an expression that never
fires is refused), the payload's size and content, the catch-up window.

``next_run_at`` -- where the owning planner resumes -- is the next fire after now when a
schedule is created, when its timing (expression, zone, DST policy) changes, and when it is
resumed: a schedule paused for a week does not fire a week of runs when resumed. Any other
change keeps it, so editing a payload never skips or repeats a fire.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Final

import msgspec

from engine.api.schemas import SchedulePatch, ScheduleSpec
from engine.core.timetable import Timetable
from engine.errors import InvalidField
from engine.model import (
    CATCH_UP_WINDOW_S_MAX,
    Schedule,
    check_payload_size,
    validate_identifier,
)

NUL_ESCAPE: Final = re.compile(rb"(?<!\\)(?:\\\\)*\\u0000")
"""``\\u0000`` in JSON text, unless its backslash is itself escaped (the text ``\\u0000``):
the only way JSON carries a NUL character."""
_TIMING: Final = ("cron_expr", "timezone", "dst_gap", "dst_overlap")


def schedule_from_spec(
    spec: ScheduleSpec, *, schedule_id: str, tenant_id: str, now: datetime
) -> Schedule:
    """A new schedule (version and partition are the ledger's to set)."""
    schedule = Schedule(
        schedule_id=validate_identifier(schedule_id, kind="schedule id"),
        tenant_id=validate_identifier(tenant_id, kind="tenant id"),
        cron_expr=spec.cron_expr,
        task_type=validate_identifier(spec.task_type, kind="task type"),
        timezone=spec.timezone,
        payload=spec.payload,
        enabled=spec.enabled,
        catch_up=spec.catch_up,
        catch_up_window_s=spec.catch_up_window_s,
        dst_gap=spec.dst_gap,
        dst_overlap=spec.dst_overlap,
        overlap=spec.overlap,
    )
    return msgspec.structs.replace(schedule, next_run_at=_check(schedule).next_fire(now).planned_at)


def replace_with_spec(current: Schedule, spec: ScheduleSpec, *, now: datetime) -> Schedule:
    """``current`` with every user field replaced by ``spec`` (a ``PUT``)."""
    if spec.tenant_id is not None and spec.tenant_id != current.tenant_id:
        raise InvalidField(
            f"schedule {current.schedule_id!r} belongs to tenant {current.tenant_id!r}; a "
            "schedule cannot move between tenants (delete it and create it in the other)"
        )
    wanted = msgspec.structs.replace(
        schedule_from_spec(
            spec, schedule_id=current.schedule_id, tenant_id=current.tenant_id, now=now
        ),
        # the ledger's fields, so that an unchanged PUT compares equal to what is stored
        version=current.version,
        updated_at=current.updated_at,
        partition_id=current.partition_id,
    )
    return _keep_next_run(current, wanted, now)


def apply_patch(current: Schedule, patch: SchedulePatch, *, now: datetime) -> Schedule:
    """``current`` with the fields ``patch`` sets (a ``PATCH``)."""
    changes = {
        name: value
        for name in patch.__struct_fields__
        if (value := getattr(patch, name)) is not msgspec.UNSET
    }
    if "task_type" in changes:
        validate_identifier(changes["task_type"], kind="task type")
    wanted = msgspec.structs.replace(current, **changes)
    return _keep_next_run(current, wanted, now)


def paused(current: Schedule) -> Schedule:
    return msgspec.structs.replace(current, enabled=False)


def resumed(current: Schedule, *, now: datetime) -> Schedule:
    """Enabled again, resuming at the next fire after now (nothing fires for the pause)."""
    timetable = _check(current)
    return msgspec.structs.replace(
        current, enabled=True, next_run_at=timetable.next_fire(now).planned_at
    )


def timetable_of(schedule: Schedule) -> Timetable:
    return Timetable.compile(
        schedule.cron_expr,
        schedule.timezone,
        dst_gap=schedule.dst_gap,
        dst_overlap=schedule.dst_overlap,
        schedule_id=schedule.schedule_id,
    )


def _keep_next_run(current: Schedule, wanted: Schedule, now: datetime) -> Schedule:
    timetable = _check(wanted)
    retimed = any(getattr(current, name) != getattr(wanted, name) for name in _TIMING)
    if retimed or (wanted.enabled and not current.enabled) or current.next_run_at is None:
        return msgspec.structs.replace(wanted, next_run_at=timetable.next_fire(now).planned_at)
    return msgspec.structs.replace(wanted, next_run_at=current.next_run_at)


def _check(schedule: Schedule) -> Timetable:
    check_payload_size(schedule.payload)
    if NUL_ESCAPE.search(msgspec.json.encode(schedule.payload)):
        raise InvalidField("payload must not contain NUL characters (\\u0000)")
    window = schedule.catch_up_window_s
    if not 0 < window <= CATCH_UP_WINDOW_S_MAX:
        raise InvalidField(
            f"catch_up_window_s must be more than 0 and at most {CATCH_UP_WINDOW_S_MAX:g} "
            f"seconds (7 days), got {window!r}"
        )
    return timetable_of(schedule)
