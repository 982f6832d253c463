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

from collections.abc import Callable
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
    check_batch(params.execution_ids, BATCH_ROWS_MAX, what="execution ids")
    actor = validate_actor(params.actor)
    reason = validate_reason(params.reason)
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
        await connection.execute(sql.AUDIT_LOCK)
        await connection.execute(sql.AUDIT_APPEND, actor, action.value, done, details)
    return done


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
