"""API tokens and console sessions (asyncio side; one coroutine per ledger method).

The ledger never sees a secret or a session id, only their SHA-256 (``bytea``, unique). A
token is never deleted: revoking it sets ``revoked_at`` and, in the same transaction, revokes
every console session opened with it. Creating and revoking tokens are audited
(:func:`~engine.ledger.postgres.audit.append_audit`). The statements, and the order their
locks are taken in, are in :mod:`~engine.ledger.postgres.sql_api`.
"""

from __future__ import annotations

from engine.errors import AlreadyExists, NotFound
from engine.ledger.checks import check_session_hash, check_token_hash
from engine.ledger.common import (
    NO_TOKEN_WITH_HASH,
    no_session,
    not_found,
    session_token_unusable,
    token_audit_details,
    token_hash_taken,
    token_id_taken,
)
from engine.ledger.params import SESSIONS_PURGED_MAX, SessionsCreate, TokensCreate, TokensRevoke
from engine.ledger.postgres import sql_api
from engine.ledger.postgres.audit import append_audit
from engine.ledger.postgres.rows import session_from_row, token_from_row
from engine.ledger.postgres.store import Store
from engine.model import ApiToken, AuditAction, ConsoleSession

# --- API tokens -------------------------------------------------------------------------------


async def tokens_create(store: Store, params: TokensCreate) -> ApiToken:
    params = params.checked()
    token, token_hash, actor = params.token, params.token_hash, params.actor
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
        await append_audit(connection, actor, AuditAction.TOKEN_CREATE, stored.token_id, details)
    return stored


async def tokens_get_by_hash(store: Store, token_hash: bytes) -> ApiToken:
    check_token_hash(token_hash)
    async with store.connection() as connection:
        row = await connection.fetchrow(sql_api.TOKEN_BY_HASH, token_hash)
    if row is None:
        raise NotFound(NO_TOKEN_WITH_HASH)
    return token_from_row(row)


async def tokens_list(store: Store, _: None) -> list[ApiToken]:
    async with store.connection() as connection:
        rows = await connection.fetch(sql_api.TOKENS_LIST)
    return [token_from_row(row) for row in rows]


async def tokens_revoke(store: Store, params: TokensRevoke) -> ApiToken:
    actor = params.checked().actor
    async with store.transaction() as connection:
        row = await connection.fetchrow(sql_api.TOKEN_REVOKE, params.token_id)
        if row is None:
            current = await connection.fetchrow(sql_api.TOKEN_GET, params.token_id)
            if current is None:
                raise not_found("token", params.token_id)
            return token_from_row(current)  # revoked already: unchanged, no second event
        revoked = token_from_row(row)
        await connection.execute(sql_api.SESSIONS_REVOKE_FOR_TOKEN, params.token_id)
        details = token_audit_details(revoked, created=False)
        await append_audit(connection, actor, AuditAction.TOKEN_REVOKE, revoked.token_id, details)
    return revoked


# --- console sessions ----------------------------------------------------------------------------


async def sessions_create(store: Store, params: SessionsCreate) -> ConsoleSession:
    params = params.checked()
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
