"""Operators' actions and the audit trail they write (asyncio side; one coroutine per ledger
method): running a schedule now, backfilling past fires, replaying and purging dead letters.

None is fenced: any node may serve them. Trigger and backfill share-lock their schedule,
insert, audit and append an ``executions_added`` change to the schedule feed, so the node
owning the schedule's partition hears of them within a second (the statements, and the
order their locks are taken in, are in :mod:`~engine.ledger.postgres.sql_api`).

A replay is audited: in one transaction the dead letters are put back to ``queued`` and one
``audit_events`` row per replayed execution is appended, so the trail has a row exactly for
each replay that happened. A purge deletes dead letters (with their history, after moving
their schedules' purge horizon on) and appends one row per deleted execution the same way.
The trail is append-only (a trigger refuses updates and deletes, see
``migrations/0003_audit_and_caps.sql``), and ``event_id`` follows commit order: writers take
the audit advisory lock right before drawing ids and hold it to commit, like the schedule
change feed, so a reader may page with the last ``event_id`` it saw as a watermark.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import asyncpg

from engine.ledger.checks import unique
from engine.ledger.common import (
    backfill_audit_details,
    backfill_in_future,
    dead_letter_purge_details,
    not_found,
    not_purged,
    replay_audit_details,
    trigger_audit_details,
    trigger_ids_taken,
    trigger_instants,
)
from engine.ledger.params import (
    LIFECYCLE_SKIPS,
    AuditQuery,
    Backfilled,
    ChangeKind,
    DeadLettersPurge,
    DeadLettersReplay,
    ExecutionsBackfill,
    ExecutionsTrigger,
)
from engine.ledger.postgres import sql, sql_api, sql_executions
from engine.ledger.postgres.rows import audit_event_from_row, execution_from_columns, in_order
from engine.ledger.postgres.schedules import append_changes
from engine.ledger.postgres.store import Store
from engine.model import AuditAction, AuditEvent, Execution, execution_id


async def dead_letters_replay(store: Store, params: DeadLettersReplay) -> list[str]:
    return await _dead_letters_each(
        store,
        params,
        sql_executions.DEAD_LETTERS_REPLAY,
        AuditAction.DEAD_LETTER_REPLAY,
        lambda reason, row: replay_audit_details(reason, row["attempt"], row["error_code"]),
    )


async def dead_letters_purge(store: Store, params: DeadLettersPurge) -> list[str]:
    return await _dead_letters_each(
        store,
        params,
        sql_executions.DEAD_LETTERS_PURGE_SELECT,
        AuditAction.DEAD_LETTER_PURGE,
        lambda reason, row: dead_letter_purge_details(
            reason, row["attempt"], row["error_code"], row["schedule_id"]
        ),
        then=sql.EXECUTIONS_DELETE,
    )


async def _dead_letters_each(
    store: Store,
    params: DeadLettersReplay | DeadLettersPurge,
    select: str,
    action: AuditAction,
    details_of: Callable[[str | None, Any], dict[str, Any]],
    *,
    then: str | None = None,
) -> list[str]:
    """Act on the dead letters among ``params.execution_ids`` that ``select`` locks and
    returns (and changes), ``then`` run over their ids, each audited as ``action``: the ids
    acted on, in the order asked."""
    params = params.checked()
    actor, reason = params.actor, params.reason
    ids = unique(params.execution_ids)
    if not ids:
        return []
    async with store.transaction() as connection:
        rows = await connection.fetch(select, ids)
        if not rows:
            return []
        by_id = {row["execution_id"]: row for row in rows}
        done = [value for value in ids if value in by_id]
        if then is not None:
            await connection.fetchval(then, done)
        details = [details_of(reason, by_id[key]) for key in done]
        await append_audit_events(connection, actor, action, done, details)
    return done


async def audit_list(store: Store, params: AuditQuery) -> list[AuditEvent]:
    limit = params.checked().limit
    arguments: list[Any] = [
        value
        for value in (params.target, params.action, params.after_event_id)
        if value is not None
    ]
    query = sql.audit_list(
        target=params.target is not None,
        action=params.action is not None,
        after=params.after_event_id is not None,
    )
    async with store.connection() as connection:
        rows = await connection.fetch(query, *arguments, limit)
    return [audit_event_from_row(row) for row in rows]


# --- operators' added executions: trigger and backfill ---------------------------------------


async def executions_trigger(store: Store, params: ExecutionsTrigger) -> Execution:
    params = params.checked()
    actor, reason = params.actor, params.reason
    schedule_id = params.schedule_id
    async with store.transaction() as connection:
        schedule = await _lock_schedule(connection, schedule_id)
        copied = (schedule_id, schedule["tenant_id"], schedule["task_type"])
        for at in trigger_instants(schedule["now"]):
            # Taken only by a run triggered or backfilled at this very microsecond: move on.
            key = execution_id(schedule_id, at)
            row = await connection.fetchrow(
                sql_api.EXECUTION_INSERT_TRIGGERED, [key], [at], *copied, schedule["partition_id"]
            )
            if row is not None:
                break
        else:
            raise trigger_ids_taken(schedule_id)
        execution = execution_from_columns(row)
        details = trigger_audit_details(schedule_id, reason)
        await append_audit(connection, actor, AuditAction.SCHEDULE_TRIGGER, key, details)
        await _note_added(connection, schedule_id, schedule)
    return execution


async def executions_backfill(store: Store, params: ExecutionsBackfill) -> Backfilled:
    params = params.checked()
    instants, actor, reason = params.planned_at, params.actor, params.reason
    schedule_id = params.schedule_id
    async with store.transaction() as connection:
        schedule = await _lock_schedule(connection, schedule_id)
        if not instants:
            horizon = await connection.fetchval(sql_api.PURGE_MARK_GET, schedule_id)
            return Backfilled([], horizon)
        future = backfill_in_future(instants, schedule["now"])
        if future is not None:
            raise future
        # Locked (created if need be) before anything is inserted: a purge of this
        # schedule's executions waits for this transaction, or has already moved it on.
        horizon = await connection.fetchval(sql_api.PURGE_MARK_LOCK, schedule_id)
        kept = not_purged(instants, horizon)
        skipped = len(instants) - len(kept)
        ids = [execution_id(schedule_id, at) for at in kept]
        rows = await connection.fetch(
            sql_api.EXECUTIONS_INSERT_ADDED,
            ids,
            kept,
            schedule_id,
            schedule["tenant_id"],
            schedule["task_type"],
            schedule["partition_id"],
        )
        added = {row["execution_id"] for row in rows}
        rest = [key for key in ids if key not in added]
        if rest:  # fires a pause or delete skipped before they started: queued again
            revived = await connection.fetch(
                sql.EXECUTIONS_REVIVE,
                rest,
                [schedule["tenant_id"]] * len(rest),
                [schedule["task_type"]] * len(rest),
                list(LIFECYCLE_SKIPS),
            )
            added.update(row["execution_id"] for row in revived)
        inserted = in_order(ids, added)
        details = backfill_audit_details(len(inserted), instants, reason, skipped)
        await append_audit(connection, actor, AuditAction.SCHEDULE_BACKFILL, schedule_id, details)
        if inserted:
            await _note_added(connection, schedule_id, schedule)
    return Backfilled(inserted, horizon, skipped)


# --- helpers ---------------------------------------------------------------------------------


async def append_audit_events(
    connection: asyncpg.Connection,
    actor: str,
    action: AuditAction,
    targets: list[str],
    details: list[dict[str, Any]],
) -> None:
    """Append one audit event per target (the audit lock is then held to commit, so
    ``event_id`` follows commit order)."""
    await connection.execute(sql.AUDIT_LOCK)
    await connection.execute(sql.AUDIT_APPEND, actor, action.value, targets, details)


async def append_audit(
    connection: asyncpg.Connection,
    actor: str,
    action: AuditAction,
    target: str,
    details: dict[str, Any],
) -> None:
    """Append one audit event."""
    await append_audit_events(connection, actor, action, [target], [details])


async def _lock_schedule(connection: asyncpg.Connection, schedule_id: str) -> asyncpg.Record:
    """Share-lock the live schedule executions are added to; ``NotFound`` if there is none."""
    row: asyncpg.Record | None = await connection.fetchrow(
        sql_api.SCHEDULE_LOCK_FOR_ADD, schedule_id
    )
    if row is None:
        raise not_found("schedule", schedule_id)
    return row


async def _note_added(
    connection: asyncpg.Connection, schedule_id: str, schedule: asyncpg.Record
) -> None:
    """Append the ``executions_added`` change (after the audit event: sql_api's lock order)."""
    await append_changes(
        connection,
        [schedule_id],
        [schedule["partition_id"]],
        [ChangeKind.EXECUTIONS_ADDED],
        [schedule["version"]],
    )
