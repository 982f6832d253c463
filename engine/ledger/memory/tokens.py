"""API tokens and console sessions, in memory (the twin of :mod:`engine.ledger.postgres.
tokens`). The ledger never sees a secret or a session id, only their SHA-256; a session acts
as the token it was opened with and ends when that token is revoked.
"""

from __future__ import annotations

from datetime import timedelta

import msgspec
import trio

from engine.errors import AlreadyExists, NotFound
from engine.ledger.checks import check_session_hash, check_token_hash
from engine.ledger.common import (
    no_session,
    session_token_unusable,
    session_valid,
    token_audit_details,
)
from engine.ledger.memory.state import MemoryState
from engine.ledger.params import SESSIONS_PURGED_MAX, SessionsCreate, TokensCreate, TokensRevoke
from engine.model import ApiToken, AuditAction, ConsoleSession


class TokenMethods(MemoryState):
    """API tokens and the console sessions opened with them."""

    # API tokens ----------------------------------------------------------------------------

    async def tokens_create(self, params: TokensCreate) -> ApiToken:
        await trio.lowlevel.checkpoint()
        params = params.checked()
        token, token_hash, actor = params.token, params.token_hash, params.actor
        now = self._now()
        stored = self._tokens.create(
            msgspec.structs.replace(token, created_at=now, revoked_at=None), token_hash
        )
        details = token_audit_details(stored, created=True)
        self._audit.append(now, actor, AuditAction.TOKEN_CREATE.value, token.token_id, details)
        return stored

    async def tokens_get_by_hash(self, token_hash: bytes) -> ApiToken:
        await trio.lowlevel.checkpoint()
        return self._tokens.by_hash(check_token_hash(token_hash))

    async def tokens_list(self) -> list[ApiToken]:
        await trio.lowlevel.checkpoint()
        return self._tokens.rows()

    async def tokens_revoke(self, params: TokensRevoke) -> ApiToken:
        await trio.lowlevel.checkpoint()
        actor = params.checked().actor
        token = self._tokens.get(params.token_id)
        if token.revoked_at is not None:
            return token
        now = self._now()
        revoked = msgspec.structs.replace(token, revoked_at=now)
        self._tokens.replace(revoked)
        for key, session in self._sessions.items():
            if session.token_id == token.token_id and session.revoked_at is None:
                self._sessions[key] = msgspec.structs.replace(session, revoked_at=now)
        details = token_audit_details(revoked, created=False)
        self._audit.append(now, actor, AuditAction.TOKEN_REVOKE.value, token.token_id, details)
        return revoked

    # console sessions ------------------------------------------------------------------------

    async def sessions_create(self, params: SessionsCreate) -> ConsoleSession:
        await trio.lowlevel.checkpoint()
        params = params.checked()
        now = self._now()
        ended = sorted(
            (s.expires_at, key) for key, s in self._sessions.items() if s.expires_at <= now
        )
        for _, key in ended[:SESSIONS_PURGED_MAX]:
            del self._sessions[key]
        try:
            token = self._tokens.get(params.token_id)
        except NotFound:
            raise session_token_unusable(params.token_id) from None
        if token.revoked_at is not None:
            raise session_token_unusable(params.token_id)
        if params.session_hash in self._sessions:
            raise AlreadyExists("a session with this id exists already")
        session = ConsoleSession(
            token_id=token.token_id,
            scope=token.scope,
            created_at=now,
            last_seen_at=now,
            idle_timeout_s=float(params.idle_timeout_s),
            expires_at=now + timedelta(seconds=params.lifetime_s),
        )
        self._sessions[params.session_hash] = session
        return session

    async def sessions_touch(self, session_hash: bytes) -> ConsoleSession:
        await trio.lowlevel.checkpoint()
        check_session_hash(session_hash)
        now = self._now()
        session = self._sessions.get(session_hash)
        if session is None or not session_valid(session, now):
            raise no_session()
        if self._tokens.get(session.token_id).revoked_at is not None:
            raise no_session()
        touched = msgspec.structs.replace(session, last_seen_at=now)
        self._sessions[session_hash] = touched
        return touched

    async def sessions_revoke(self, session_hash: bytes) -> None:
        await trio.lowlevel.checkpoint()
        check_session_hash(session_hash)
        now = self._now()
        session = self._sessions.get(session_hash)
        if session is not None and session_valid(session, now):
            self._sessions[session_hash] = msgspec.structs.replace(session, revoked_at=now)
