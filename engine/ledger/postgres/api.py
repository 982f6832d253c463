"""The HTTP API's ledger operations (asyncio side; one coroutine per ledger method): API
tokens, executions an operator adds (trigger, backfill), the schedule count and census.

None is fenced: they are operators' actions and reads that any node may serve. The writes
are audited in their own transaction, like a dead-letter replay (:mod:`~engine.ledger.
postgres.audit`), and trigger and backfill also append an ``executions_added`` change to the
schedule feed, so the node owning the schedule's partition hears of them within a second.
The statements, and the order their locks are taken in, are in :mod:`~engine.ledger.
postgres.sql_api`; the quota check that ``schedules_create`` runs is in :mod:`~engine.
ledger.postgres.schedules`.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import asyncpg

from engine.errors import AlreadyExists, NotFound
from engine.ledger.base import (
    CENSUS_GROUPS_MAX,
    LIFECYCLE_SKIPS,
    SESSIONS_PURGED_MAX,
    Backfilled,
    ChangeKind,
    ExecutionsBackfill,
    ExecutionsBucket,
    ExecutionsStats,
    ExecutionsTrigger,
    ScheduleGroup,
    SchedulesCensus,
    SessionsCreate,
    TokensCreate,
    TokensRevoke,
)
from engine.ledger.common import (
    backfill_audit_details,
    backfill_in_future,
    backfill_instants,
    check_session_hash,
    check_sessions_create,
    check_stats,
    check_token_hash,
    no_session,
    not_purged,
    session_token_unusable,
    token_audit_details,
    token_hash_taken,
    token_id_taken,
    trigger_audit_details,
    trigger_ids_taken,
    trigger_instants,
)
from engine.ledger.postgres import sql, sql_api
from engine.ledger.postgres.rows import (
    check_limit,
    execution_from_columns,
    group_from_row,
    in_order,
    session_from_row,
    token_from_row,
)
from engine.ledger.postgres.schedules import append_changes
from engine.ledger.postgres.store import Store
from engine.model import (
    ApiToken,
    AuditAction,
    ConsoleSession,
    Execution,
    execution_id,
    validate_actor,
    validate_api_token,
    validate_reason,
)

# --- API tokens -------------------------------------------------------------------------------


async def tokens_create(store: Store, params: TokensCreate) -> ApiToken:
    token = validate_api_token(params.token)
    token_hash = check_token_hash(params.token_hash)
    actor = validate_actor(params.actor)
    async with store.transaction() as connection:
        row = await connection.fetchrow(
            sql_api.TOKEN_INSERT, token.token_id, token_hash, token.scope, token.description
        )
        if row is None:
            if await connection.fetchval(sql_api.TOKEN_ID_TAKEN, token.token_id):
                raise token_id_taken(token.token_id)
            raise token_hash_taken()
        stored = token_from_row(row)
        details = token_audit_details(stored, created=True)
        await _audit(connection, actor, AuditAction.TOKEN_CREATE, stored.token_id, details)
    return stored


async def tokens_get_by_hash(store: Store, token_hash: bytes) -> ApiToken:
    check_token_hash(token_hash)
    async with store.connection() as connection:
        row = await connection.fetchrow(sql_api.TOKEN_BY_HASH, token_hash)
    if row is None:
        raise NotFound("no token has this secret")
    return token_from_row(row)


async def tokens_list(store: Store, _: None) -> list[ApiToken]:
    async with store.connection() as connection:
        rows = await connection.fetch(sql_api.TOKENS_LIST)
    return [token_from_row(row) for row in rows]


async def tokens_revoke(store: Store, params: TokensRevoke) -> ApiToken:
    actor = validate_actor(params.actor)
    async with store.transaction() as connection:
        row = await connection.fetchrow(sql_api.TOKEN_REVOKE, params.token_id)
        if row is None:
            current = await connection.fetchrow(sql_api.TOKEN_GET, params.token_id)
            if current is None:
                raise NotFound(f"token {params.token_id!r} does not exist")
            return token_from_row(current)  # revoked already: unchanged, no second event
        revoked = token_from_row(row)
        await connection.execute(sql_api.SESSIONS_REVOKE_FOR_TOKEN, params.token_id)
        details = token_audit_details(revoked, created=False)
        await _audit(connection, actor, AuditAction.TOKEN_REVOKE, revoked.token_id, details)
    return revoked


# --- console sessions ----------------------------------------------------------------------------


async def sessions_create(store: Store, params: SessionsCreate) -> ConsoleSession:
    check_sessions_create(params)
    async with store.transaction() as connection:
        await connection.execute(sql_api.SESSIONS_PURGE, SESSIONS_PURGED_MAX)
        scope = await connection.fetchval(sql_api.SESSION_TOKEN_LOCK, params.token_id)
        if scope is None:
            raise session_token_unusable(params.token_id)
        row = await connection.fetchrow(
            sql_api.SESSION_INSERT,
            params.session_hash,
            params.token_id,
            float(params.idle_timeout_s),
            float(params.lifetime_s),
        )
        if row is None:
            raise AlreadyExists("a session with this id exists already")
    return session_from_row(row, scope)


async def sessions_touch(store: Store, session_hash: bytes) -> ConsoleSession:
    check_session_hash(session_hash)
    async with store.connection() as connection:
        row = await connection.fetchrow(sql_api.SESSION_TOUCH, session_hash)
    if row is None:
        raise no_session()
    return session_from_row(row, row["scope"])


async def sessions_revoke(store: Store, session_hash: bytes) -> None:
    check_session_hash(session_hash)
    async with store.connection() as connection:
        await connection.execute(sql_api.SESSION_REVOKE, session_hash)


# --- operator-added executions ------------------------------------------------------------------


async def executions_trigger(store: Store, params: ExecutionsTrigger) -> Execution:
    actor = validate_actor(params.actor)
    reason = validate_reason(params.reason)
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
        await _audit(connection, actor, AuditAction.SCHEDULE_TRIGGER, key, details)
        await _note_added(connection, schedule_id, schedule)
    return execution


async def executions_backfill(store: Store, params: ExecutionsBackfill) -> Backfilled:
    instants = backfill_instants(params)
    actor = validate_actor(params.actor)
    reason = validate_reason(params.reason)
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
        await _audit(connection, actor, AuditAction.SCHEDULE_BACKFILL, schedule_id, details)
        if inserted:
            await _note_added(connection, schedule_id, schedule)
    return Backfilled(inserted, horizon, skipped)


# --- schedule count and census --------------------------------------------------------------


async def schedules_count(store: Store, tenant_id: str) -> int:
    async with store.connection() as connection:
        count: int = await connection.fetchval(sql_api.SCHEDULES_COUNT, tenant_id)
    return count


async def schedules_census(store: Store, params: SchedulesCensus) -> list[ScheduleGroup]:
    limit = check_limit(params.limit, CENSUS_GROUPS_MAX)
    async with store.connection() as connection:
        if params.tenant_id is None:
            rows = await connection.fetch(sql_api.SCHEDULES_CENSUS, limit)
        else:
            rows = await connection.fetch(
                sql_api.SCHEDULES_CENSUS_OF_TENANT, limit, params.tenant_id
            )
    return [group_from_row(row) for row in rows]


# --- execution statistics ---------------------------------------------------------------------


async def executions_stats(store: Store, params: ExecutionsStats) -> list[ExecutionsBucket]:
    start = check_stats(params)
    end = start + timedelta(seconds=params.bucket_s * params.buckets)
    arguments: list[Any] = [start, end, params.bucket_s, float(params.on_time_s)]
    query = sql_api.EXECUTIONS_STATS
    if params.tenant_id is not None:
        query = sql_api.EXECUTIONS_STATS_OF_TENANT
        arguments.append(params.tenant_id)
    async with store.connection() as connection:
        rows = await connection.fetch(query, *arguments)
    planned: dict[int, asyncpg.Record] = {}
    happened: dict[int, asyncpg.Record] = {}
    for row in rows:
        if 0 <= row["bucket"] < params.buckets:
            (happened if row["happened"] else planned)[row["bucket"]] = row
    buckets = []
    for index in range(params.buckets):
        p, h = planned.get(index), happened.get(index)
        buckets.append(
            ExecutionsBucket(
                planned=p["planned"] if p else 0,
                started=p["started"] if p else 0,
                on_time=p["on_time"] if p else 0,
                dead_letters=p["dead_letters"] if p else 0,
                plan_lag_s_max=p["plan_lag_s_max"] if p else 0.0,
                starts=h["planned"] if h else 0,
                skips=h["started"] if h else 0,
            )
        )
    return buckets


# --- helpers ---------------------------------------------------------------------------------


async def _lock_schedule(connection: asyncpg.Connection, schedule_id: str) -> asyncpg.Record:
    """Share-lock the live schedule executions are added to; ``NotFound`` if there is none."""
    row: asyncpg.Record | None = await connection.fetchrow(
        sql_api.SCHEDULE_LOCK_FOR_ADD, schedule_id
    )
    if row is None:
        raise NotFound(f"schedule {schedule_id!r} does not exist")
    return row


async def _audit(
    connection: asyncpg.Connection,
    actor: str,
    action: AuditAction,
    target: str,
    details: dict[str, Any],
) -> None:
    """Append one audit event (the audit lock is then held to commit)."""
    await connection.execute(sql.AUDIT_LOCK)
    await connection.execute(sql.AUDIT_APPEND, actor, action.value, [target], [details])


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
