"""Schedule operations and the change feed (asyncio side; one coroutine per ledger method).

Every schedule write ends the same way, in its own transaction: take the change-feed
advisory lock, append its changes, NOTIFY (:func:`append_changes`; an operator's trigger
and backfill end so too, :mod:`~engine.ledger.postgres.audit`). The lock is held until
commit, so the next writer draws its ``seq`` only once this commit is visible: ``seq``
order is commit order, and a reader may keep the last ``seq`` it saw as a watermark.
Taking the lock last keeps the serialized section to one statement plus the commit.

Every create or update first key-share-locks the task types its schedules name
(:func:`_lock_task_types`): an unknown one is refused by name, and a known one cannot be
deleted until this transaction ends. A create then locks the rows of its tenants that have
a schedule quota and counts their schedules (:func:`_require_quotas`), so that concurrent
creates cannot take a tenant past its quota together. An update locks its row first; one
that disables the schedule skips its pending executions (pausing), like a delete, and one
that enables it -- or a create of a deleted id -- queues again the fires from now on that a
pause or delete skipped (:func:`revive_lifecycle_skips`).
"""

from __future__ import annotations

import itertools
import sys
from collections import Counter
from typing import Any, Final

import asyncpg

from engine.core.dst import DstGap, DstOverlap
from engine.core.hashing import partition_of
from engine.ledger.checks import check_limit
from engine.ledger.common import (
    changes_pruned,
    decode_id_cursor,
    encode_cursor,
    fires_among,
    not_found,
    quota_exceeded,
    schedules_exist,
    unknown_task_types,
    unusable_task_types,
    version_conflict,
)
from engine.ledger.params import (
    LIFECYCLE_SKIPS,
    PAGE_SIZE_MAX,
    SCHEDULE_DELETED,
    SCHEDULE_DELETED_MESSAGE,
    SCHEDULE_PAUSED,
    SCHEDULE_PAUSED_MESSAGE,
    ChangeKind,
    Page,
    PlannableSchedule,
    ScheduleChange,
    ScheduleChangesPrune,
    ScheduleChangesSince,
    ScheduleGroup,
    SchedulesCensus,
    SchedulesCreate,
    SchedulesDelete,
    SchedulesList,
    SchedulesPlannable,
    SchedulesUpdate,
)
from engine.ledger.postgres import sql, sql_api
from engine.ledger.postgres.rows import change_from_row, group_from_row, schedule_from_row
from engine.ledger.postgres.store import Store
from engine.model import (
    CatchUpPolicy,
    HandlerKind,
    Schedule,
    TaskType,
)

_CODE_POINT_MAX: Final = "\U0010ffff"


async def schedules_create(store: Store, params: SchedulesCreate) -> list[Schedule]:
    schedules = params.checked().schedules
    ids = [schedule.schedule_id for schedule in schedules]
    if not schedules:
        return []
    partitions = [partition_of(i, store.partition_count) for i in ids]
    async with store.transaction() as connection:
        await _lock_task_types(connection, schedules)
        tenants = [schedule.tenant_id for schedule in schedules]
        existing = await connection.fetch(sql.SCHEDULES_TAKEN_IDS, ids, tenants)
        if existing:
            raise schedules_exist([row["schedule_id"] for row in existing])
        await _require_quotas(connection, schedules)
        rows = await connection.fetch(sql.SCHEDULES_INSERT, *_columns(schedules, partitions))
        created = {row["schedule_id"]: schedule_from_row(row) for row in rows}
        if len(created) < len(ids):  # a concurrent create of the same id committed first
            raise schedules_exist(sorted(set(ids) - created.keys()))
        # A version above 1 is a deleted id created again (SCHEDULES_INSERT).
        recreated = [s for s in created.values() if s.version > 1 and s.enabled]
        if recreated:
            await revive_lifecycle_skips(connection, recreated)
        await append_changes(
            connection,
            ids,
            partitions,
            [ChangeKind.CREATED] * len(ids),
            [created[i].version for i in ids],  # > 1 for a deleted id created again
        )
    return [created[i] for i in ids]


async def schedules_update(store: Store, params: SchedulesUpdate) -> Schedule:
    schedule = params.checked().schedule
    async with store.transaction() as connection:
        await _lock_task_types(connection, [schedule])
        # Whether this pauses or resumes it, read under the row lock the update then holds.
        current = await connection.fetchrow(sql.SCHEDULE_GET_FOR_UPDATE, schedule.schedule_id)
        pausing = current is not None and current["enabled"] and not schedule.enabled
        resuming = current is not None and not current["enabled"] and schedule.enabled
        row = await connection.fetchrow(
            sql.SCHEDULE_UPDATE,
            schedule.schedule_id,
            *_user_fields(schedule),
            params.expected_version,
        )
        if row is None:
            current = await connection.fetchrow(sql.SCHEDULE_GET, schedule.schedule_id)
            if current is None:
                raise not_found("schedule", schedule.schedule_id)
            raise version_conflict(
                "schedule", schedule.schedule_id, current["version"], params.expected_version
            )
        updated = schedule_from_row(row)
        if pausing:
            await connection.execute(
                sql.EXECUTIONS_SKIP_PENDING,
                updated.schedule_id,
                SCHEDULE_PAUSED,
                SCHEDULE_PAUSED_MESSAGE,
            )
        elif resuming:
            await revive_lifecycle_skips(connection, [updated])
        await append_changes(
            connection,
            [updated.schedule_id],
            [row["partition_id"]],
            [ChangeKind.UPDATED],
            [updated.version],
        )
    return updated


async def schedules_delete(store: Store, params: SchedulesDelete) -> Schedule:
    async with store.transaction() as connection:
        row = await connection.fetchrow(sql.SCHEDULE_GET_FOR_UPDATE, params.schedule_id)
        if row is None:
            raise not_found("schedule", params.schedule_id)
        deleted = schedule_from_row(row)
        expected = params.expected_version
        if expected is not None and deleted.version != expected:
            raise version_conflict("schedule", params.schedule_id, deleted.version, expected)
        # Order matters: the schedule is marked deleted first, and pending executions are
        # skipped by a later statement that sees everything planned before (sql.py).
        await connection.execute(sql.SCHEDULE_SOFT_DELETE, params.schedule_id)
        await connection.execute(
            sql.EXECUTIONS_SKIP_PENDING,
            params.schedule_id,
            SCHEDULE_DELETED,
            SCHEDULE_DELETED_MESSAGE,
        )
        await append_changes(
            connection,
            [deleted.schedule_id],
            [row["partition_id"]],
            [ChangeKind.DELETED],
            [deleted.version],
        )
    return deleted


async def schedules_get(store: Store, schedule_id: str) -> Schedule:
    async with store.connection() as connection:
        row = await connection.fetchrow(sql.SCHEDULE_GET, schedule_id)
    if row is None:
        raise not_found("schedule", schedule_id)
    return schedule_from_row(row)


async def schedules_get_many(store: Store, schedule_ids: list[str]) -> dict[str, Schedule]:
    if not schedule_ids:
        return {}
    check_limit(len(schedule_ids), PAGE_SIZE_MAX, field="schedule_ids")
    async with store.connection() as connection:
        rows = await connection.fetch(sql.SCHEDULES_GET_MANY, schedule_ids)
    return {row["schedule_id"]: schedule_from_row(row) for row in rows}


async def schedules_list(store: Store, params: SchedulesList) -> Page[Schedule]:
    params = params.checked()
    limit = params.limit
    after = None if params.cursor is None else decode_id_cursor(params.cursor)
    filters: list[Any] = [
        value
        for value in (params.tenant_id, params.task_type, params.enabled, params.partition_id)
        if value is not None
    ]
    if after is not None:
        filters.append(after)
    prefix = params.id_prefix
    if prefix:
        # Every id (an identifier: ASCII) that starts with the prefix sorts below this bound.
        filters += [prefix, prefix + _CODE_POINT_MAX, prefix]
    query = sql.schedules_list(
        tenant=params.tenant_id is not None,
        task_type=params.task_type is not None,
        enabled=params.enabled is not None,
        partition=params.partition_id is not None,
        after=after is not None,
        prefix=bool(prefix),
    )
    async with store.connection() as connection:
        rows = await connection.fetch(query, *filters, limit + 1)
    items = [schedule_from_row(row) for row in rows[:limit]]
    more = len(rows) > limit
    return Page(items=items, next_cursor=encode_cursor(items[-1].schedule_id) if more else None)


_CATCH_UP: Final = {member.value: member for member in CatchUpPolicy}
_DST_GAP: Final = {member.value: member for member in DstGap}
_DST_OVERLAP: Final = {member.value: member for member in DstOverlap}


async def schedules_plannable(store: Store, params: SchedulesPlannable) -> list[PlannableSchedule]:
    limit = params.checked().limit
    async with store.connection() as connection:
        rows = await connection.fetch(
            sql.SCHEDULES_PLANNABLE, params.partition_id, params.after or "", limit
        )
    # By position, and with the values many schedules share interned: a load reads a
    # million of these, and the planner keeps the strings.
    intern = sys.intern
    return [
        PlannableSchedule(
            schedule_id,
            intern(tenant_id),
            intern(task_type),
            version,
            next_run_at,
            intern(cron_expr),
            intern(timezone),
            _DST_GAP[dst_gap],
            _DST_OVERLAP[dst_overlap],
            _CATCH_UP[catch_up],
            window_s,
        )
        for (
            schedule_id,
            tenant_id,
            task_type,
            version,
            next_run_at,
            cron_expr,
            timezone,
            dst_gap,
            dst_overlap,
            catch_up,
            window_s,
        ) in rows
    ]


async def schedule_changes(store: Store, params: ScheduleChangesSince) -> list[ScheduleChange]:
    limit = params.checked().limit
    async with store.connection() as connection:
        rows = await connection.fetch(sql.CHANGES_SINCE, params.after_seq, limit)
    pruned_through: int = rows[0]["through"]
    if params.after_seq < pruned_through:
        raise changes_pruned(params.after_seq, pruned_through)
    return [change_from_row(row) for row in rows if row["seq"] is not None]


async def schedule_changes_head(store: Store, _: None) -> int:
    """The newest committed ``seq``, or the newest pruned one (0 when neither)."""
    async with store.connection() as connection:
        newest: int = await connection.fetchval(sql.CHANGES_NEWEST)
    return newest


async def schedule_changes_prune(store: Store, params: ScheduleChangesPrune) -> int:
    params = params.checked()
    limit, before = params.limit, params.before
    async with store.connection() as connection:
        pruned: int = await connection.fetchval(sql.CHANGES_PRUNE, before, limit)
    return pruned


# --- helpers ---------------------------------------------------------------------------------


# --- schedule count and census ----------------------------------------------------------------


async def schedules_count(store: Store, tenant_id: str) -> int:
    async with store.connection() as connection:
        count: int = await connection.fetchval(sql_api.SCHEDULES_COUNT, tenant_id)
    return count


async def schedules_census(store: Store, params: SchedulesCensus) -> list[ScheduleGroup]:
    limit = params.checked().limit
    async with store.connection() as connection:
        if params.tenant_id is None:
            rows = await connection.fetch(sql_api.SCHEDULES_CENSUS, limit)
        else:
            rows = await connection.fetch(
                sql_api.SCHEDULES_CENSUS_OF_TENANT, limit, params.tenant_id
            )
    return [group_from_row(row) for row in rows]


# --- the change feed and what schedule writes share ------------------------------------------


async def append_changes(
    connection: asyncpg.Connection,
    schedule_ids: list[str],
    partition_ids: list[int],
    kinds: list[ChangeKind],
    versions: list[int],
) -> None:
    await connection.execute(sql.CHANGES_LOCK)
    await connection.fetchrow(
        sql.CHANGES_APPEND, schedule_ids, partition_ids, [str(k) for k in kinds], versions
    )


async def revive_lifecycle_skips(
    connection: asyncpg.Connection, schedules: list[Schedule]
) -> list[str]:
    """Queue again the fires of ``schedules`` (just resumed or re-created, rows locked) from
    now on that a pause or delete skipped before they started, where each schedule's
    timetable still has them (:func:`~engine.ledger.common.fires_among`)."""
    by_id = {schedule.schedule_id: schedule for schedule in schedules}
    rows = await connection.fetch(
        sql.EXECUTIONS_LIFECYCLE_SKIPPED, list(by_id), list(LIFECYCLE_SKIPS)
    )
    if not rows:
        return []
    ids: list[str] = []
    tenants: list[str] = []
    task_types: list[str] = []
    for schedule_id, group in itertools.groupby(rows, key=lambda row: row["schedule_id"]):
        schedule = by_id[schedule_id]
        mine = [row for row in group if row["tenant_id"] == schedule.tenant_id]
        fires = fires_among(schedule, (row["planned_at"] for row in mine))
        for row in mine:
            if row["planned_at"] in fires:
                ids.append(row["execution_id"])
                tenants.append(schedule.tenant_id)
                task_types.append(schedule.task_type)
    if not ids:
        return []
    revived = await connection.fetch(
        sql.EXECUTIONS_REVIVE, ids, tenants, task_types, list(LIFECYCLE_SKIPS)
    )
    return [row["execution_id"] for row in revived]


async def _require_quotas(connection: asyncpg.Connection, schedules: list[Schedule]) -> None:
    """Lock the rows of the schedules' tenants that have a quota (sql_api.TENANT_QUOTAS_LOCK)
    and raise ``QuotaExceeded`` for the first, by id, that the schedules -- all new -- would
    take past it."""
    asked = Counter(schedule.tenant_id for schedule in schedules)
    quotas = await connection.fetch(sql_api.TENANT_QUOTAS_LOCK, sorted(asked))
    if not quotas:
        return
    limits = {row["tenant_id"]: row["schedules_max"] for row in quotas}
    rows = await connection.fetch(sql_api.SCHEDULES_COUNT_BY_TENANT, list(limits))
    counts = {row["tenant_id"]: row["count"] for row in rows}
    for tenant_id in sorted(limits):
        count = counts.get(tenant_id, 0)
        if count + asked[tenant_id] > limits[tenant_id]:
            raise quota_exceeded(tenant_id, limits[tenant_id], count, asked[tenant_id])


async def _lock_task_types(connection: asyncpg.Connection, schedules: list[Schedule]) -> None:
    """Key-share-lock the task types the schedules name; ``InvalidField`` naming any that
    does not exist or that the schedule's tenant may not use."""
    names = sorted({schedule.task_type for schedule in schedules})
    found = {
        row["name"]: TaskType(
            name=row["name"],
            kind=HandlerKind.NOOP,  # only who may use it is read here
            tenant_id=row["tenant_id"],
            allowed_tenants=tuple(row["allowed_tenants"]),
        )
        for row in await connection.fetch(sql.TASK_TYPES_LOCK, names)
    }
    unknown = unusable_task_types(schedules, found)
    if unknown:
        raise unknown_task_types(unknown)


def _user_fields(schedule: Schedule) -> tuple[Any, ...]:
    """The replaceable fields, in the order of sql.SCHEDULE_UPDATE's $2..$13."""
    return (
        schedule.tenant_id,
        schedule.cron_expr,
        schedule.timezone,
        schedule.task_type,
        schedule.payload,
        schedule.enabled,
        schedule.next_run_at,
        str(schedule.catch_up),
        float(schedule.catch_up_window_s),
        str(schedule.dst_gap),
        str(schedule.dst_overlap),
        None if schedule.overlap is None else str(schedule.overlap),
    )


def _columns(schedules: list[Schedule], partitions: list[int]) -> list[list[Any]]:
    """Column arrays in the order of sql.SCHEDULES_INSERT's unnest."""
    rows = []
    for schedule, partition in zip(schedules, partitions, strict=True):
        fields = _user_fields(schedule)
        rows.append((schedule.schedule_id, *fields[:7], partition, *fields[7:]))
    return [list(column) for column in zip(*rows, strict=True)]
