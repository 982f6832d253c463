"""Dead-letter replay and purge, and the audit trail they write (asyncio side).

A replay is an operator's action, not fenced (any node may serve it), and audited: in one
transaction the dead letters are put back to ``queued`` and one ``audit_events`` row per
replayed execution is appended, so the trail has a row exactly for each replay that
happened. A purge deletes dead letters (with their history, after moving their schedules'
purge horizon on) and appends one row per deleted execution the same way. The trail is
append-only (a trigger refuses updates and deletes, see
``migrations/0003_audit_and_caps.sql``), and ``event_id`` follows commit order: writers take
the audit advisory lock right before drawing ids and hold it to commit, like the schedule
change feed, so a reader may page with the last ``event_id`` it saw as a watermark.
"""

from __future__ import annotations

from typing import Any

from engine.ledger.base import (
    BATCH_ROWS_MAX,
    PAGE_SIZE_MAX,
    AuditQuery,
    DeadLettersPurge,
    DeadLettersReplay,
    replay_audit_details,
)
from engine.ledger.common import dead_letter_purge_details
from engine.ledger.postgres import sql, sql_executions
from engine.ledger.postgres.rows import audit_event_from_row, check_batch, check_limit, unique
from engine.ledger.postgres.store import Store
from engine.model import AuditAction, AuditEvent, validate_actor, validate_reason


async def dead_letters_replay(store: Store, params: DeadLettersReplay) -> list[str]:
    check_batch(params.execution_ids, BATCH_ROWS_MAX, what="execution ids")
    actor = validate_actor(params.actor)
    reason = validate_reason(params.reason)
    ids = unique(params.execution_ids)
    if not ids:
        return []
    async with store.transaction() as connection:
        rows = await connection.fetch(sql_executions.DEAD_LETTERS_REPLAY, ids)
        if not rows:
            return []
        by_id = {row["execution_id"]: row for row in rows}
        replayed = [value for value in ids if value in by_id]
        details = [
            replay_audit_details(reason, by_id[key]["attempt"], by_id[key]["error_code"])
            for key in replayed
        ]
        await connection.execute(sql.AUDIT_LOCK)
        await connection.execute(
            sql.AUDIT_APPEND, actor, AuditAction.DEAD_LETTER_REPLAY.value, replayed, details
        )
    return replayed


async def dead_letters_purge(store: Store, params: DeadLettersPurge) -> list[str]:
    check_batch(params.execution_ids, BATCH_ROWS_MAX, what="execution ids")
    actor = validate_actor(params.actor)
    reason = validate_reason(params.reason)
    ids = unique(params.execution_ids)
    if not ids:
        return []
    async with store.transaction() as connection:
        rows = await connection.fetch(sql_executions.DEAD_LETTERS_PURGE_SELECT, ids)
        if not rows:
            return []
        by_id = {row["execution_id"]: row for row in rows}
        purged = [value for value in ids if value in by_id]
        await connection.fetchval(sql.EXECUTIONS_DELETE, purged)
        details = [
            dead_letter_purge_details(
                reason, by_id[key]["attempt"], by_id[key]["error_code"], by_id[key]["schedule_id"]
            )
            for key in purged
        ]
        await connection.execute(sql.AUDIT_LOCK)
        await connection.execute(
            sql.AUDIT_APPEND, actor, AuditAction.DEAD_LETTER_PURGE.value, purged, details
        )
    return purged


async def audit_list(store: Store, params: AuditQuery) -> list[AuditEvent]:
    limit = check_limit(params.limit, PAGE_SIZE_MAX)
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
