"""The ledger contract for the API's own records: API tokens, console sessions, the audit of
dead-letter replays, and forged cursors.
"""

from __future__ import annotations

import hashlib
from datetime import timedelta

import msgspec
import pytest

from engine.errors import (
    AlreadyExists,
    InvalidField,
    NotFound,
)
from engine.ledger.common import encode_cursor
from engine.ledger.params import (
    BATCH_ROWS_MAX,
    PAGE_SIZE_MAX,
    AuditQuery,
    Completion,
    DeadLettersReplay,
    ExecutionsClaim,
    ExecutionsComplete,
    ExecutionsQuery,
    Fence,
    Outcome,
    SchedulesCreate,
    SchedulesList,
    SessionsCreate,
    TokensCreate,
    TokensRevoke,
)
from engine.model import (
    ApiToken,
    ExecutionStatus,
)
from engine.testing.ledger_contract.backend import (
    Backend,
    ids_in_partition,
    schedule,
)
from engine.testing.ledger_contract.support import claim_now, own


async def dead_lettered(
    backend: Backend, fence: Fence, schedule_ids: list[str], error_codes: list[str]
) -> list[str]:
    """Dead-letter one fire of each schedule with its error code, after as many failed
    attempts before it as its position in the list; their execution ids."""
    eids = await claim_now(backend, fence, schedule_ids, lease_s=30)
    for failures, (eid, code) in enumerate(zip(eids, error_codes, strict=True)):
        for attempt in range(1, failures + 1):
            await backend.ledger.executions_complete(
                ExecutionsComplete([fence], [Completion(eid, attempt, Outcome.FAILED)])
            )
            await backend.ledger.executions_claim(ExecutionsClaim([fence], [eid], 30, "n"))
        done = await backend.ledger.executions_complete(
            ExecutionsComplete(
                [fence], [Completion(eid, failures + 1, Outcome.DEAD_LETTER, error_code=code)]
            )
        )
        assert done.applied == [eid]
    return eids


async def test_a_replay_is_audited_with_who_why_which_attempt_and_error(
    backend: Backend,
) -> None:
    sids = ids_in_partition(3, 2, prefix="audit")
    await backend.ledger.schedules_create(SchedulesCreate([schedule(s) for s in sids]))
    fence = await own(backend, 3)
    first, second = await dead_lettered(backend, fence, sids, ["http_404", "http_410"])
    assert await backend.ledger.audit_list(AuditQuery()) == []
    before = await backend.ledger.database_now()
    replay = DeadLettersReplay([second, "nope:x"], "cli:alice@ops-1", "the endpoint is back")
    assert await backend.ledger.dead_letters_replay(replay) == [second]
    anonymous = DeadLettersReplay([first, second, first], actor="retention-test")
    assert await backend.ledger.dead_letters_replay(anonymous) == [first]
    assert await backend.ledger.dead_letters_replay(anonymous) == []  # nothing left: no event
    after = await backend.ledger.database_now()
    events = await backend.ledger.audit_list(AuditQuery())
    assert [(e.actor, e.action, e.target, e.details) for e in events] == [
        (
            "cli:alice@ops-1",
            "dead_letter.replay",
            second,
            {"reason": "the endpoint is back", "attempt": 2, "error_code": "http_410"},
        ),
        (
            "retention-test",
            "dead_letter.replay",
            first,
            {"reason": None, "attempt": 1, "error_code": "http_404"},
        ),
    ]
    assert events[0].event_id < events[1].event_id
    assert all(before <= e.at <= after for e in events)
    assert await backend.ledger.audit_list(AuditQuery(target=first)) == events[1:]
    assert await backend.ledger.audit_list(AuditQuery(action="dead_letter.replay")) == events
    assert await backend.ledger.audit_list(AuditQuery(action="schedule.delete")) == []
    assert await backend.ledger.audit_list(AuditQuery(limit=1)) == events[:1]
    watermark = AuditQuery(after_event_id=events[0].event_id)
    assert await backend.ledger.audit_list(watermark) == events[1:]
    assert await backend.ledger.audit_list(AuditQuery(after_event_id=events[1].event_id)) == []
    for limit in (0, PAGE_SIZE_MAX + 1):
        with pytest.raises(InvalidField):
            await backend.ledger.audit_list(AuditQuery(limit=limit))


async def test_a_replay_with_a_malformed_actor_or_reason_changes_nothing(
    backend: Backend,
) -> None:
    [sid] = ids_in_partition(7, 1, prefix="audit")
    await backend.ledger.schedules_create(SchedulesCreate([schedule(sid)]))
    fence = await own(backend, 7)
    [eid] = await dead_lettered(backend, fence, [sid], ["http_404"])
    bad = [
        DeadLettersReplay([eid], ""),
        DeadLettersReplay([eid], " ops"),
        DeadLettersReplay([eid], "ops\n"),
        DeadLettersReplay([eid], "x" * 201),
        DeadLettersReplay([eid], "ops", ""),
        DeadLettersReplay([eid], "ops", "  "),
        DeadLettersReplay([eid], "ops", "x" * 1001),
        DeadLettersReplay([eid], "ops", "nul\x00byte"),
        DeadLettersReplay([eid] * (BATCH_ROWS_MAX + 1), "ops"),
    ]
    for params in bad:
        with pytest.raises(InvalidField):
            await backend.ledger.dead_letters_replay(params)
    assert (await backend.ledger.executions_get(eid)).execution.status is (
        ExecutionStatus.DEAD_LETTER
    )
    assert await backend.ledger.audit_list(AuditQuery()) == []
    longest = DeadLettersReplay([eid], "a" * 200, "line one\nline two\t" + "r" * 980)
    assert await backend.ledger.dead_letters_replay(longest) == [eid]
    [event] = await backend.ledger.audit_list(AuditQuery(target=eid))
    assert (event.actor, event.details["reason"]) == (longest.actor, longest.reason)


@pytest.mark.parametrize(
    "parts",
    [
        ("\u0000",),
        ("2026-01-01T00:00:00Z", "\u0000"),
        ("0001-01-01T00:00:00+01:00", "x"),  # out of range once in UTC
        ("2026-01-01T00:00:00", "x"),  # naive
        ("yesterday", "x"),
        (1, 2),
    ],
)
async def test_forged_cursors_are_refused_as_malformed(
    backend: Backend, parts: tuple[object, ...]
) -> None:
    await backend.ledger.schedules_create(SchedulesCreate([schedule("s")]))
    cursor = encode_cursor(*parts)
    with pytest.raises(InvalidField, match="cursor is malformed"):
        await backend.ledger.schedules_list(SchedulesList(cursor=cursor))
    with pytest.raises(InvalidField, match="cursor"):
        await backend.ledger.executions_query(ExecutionsQuery(cursor=cursor))


def digest(secret: str) -> bytes:
    """What the API stores of a token's secret: its SHA-256."""
    return hashlib.sha256(secret.encode()).digest()


async def test_a_token_is_stored_as_its_hash_found_by_it_and_audited(backend: Backend) -> None:
    before = await backend.ledger.database_now()
    admin = await backend.ledger.tokens_create(
        TokensCreate(
            ApiToken(token_id="ops", scope="admin", description="on-call rotation"),
            digest("s1"),
            "cli:alice@ops-1",
        )
    )
    after = await backend.ledger.database_now()
    assert (admin.token_id, admin.scope, admin.description, admin.revoked_at) == (
        "ops",
        "admin",
        "on-call rotation",
        None,
    )
    assert admin.created_at is not None
    assert before <= admin.created_at <= after
    tenant = await backend.ledger.tokens_create(
        TokensCreate(ApiToken(token_id="acme-ci", scope="tenant:acme"), digest("s2"), "ops")
    )
    assert await backend.ledger.tokens_get_by_hash(digest("s1")) == admin
    assert await backend.ledger.tokens_get_by_hash(digest("s2")) == tenant
    assert await backend.ledger.tokens_list() == [tenant, admin]  # by token id
    with pytest.raises(NotFound):
        await backend.ledger.tokens_get_by_hash(digest("unknown"))
    with pytest.raises(InvalidField, match="32-byte"):
        await backend.ledger.tokens_get_by_hash(b"short")
    with pytest.raises(AlreadyExists, match="'ops'"):
        await backend.ledger.tokens_create(
            TokensCreate(ApiToken(token_id="ops", scope="admin"), digest("s3"), "ops")
        )
    with pytest.raises(AlreadyExists, match="secret"):
        await backend.ledger.tokens_create(
            TokensCreate(ApiToken(token_id="other", scope="admin"), digest("s1"), "ops")
        )
    assert await backend.ledger.tokens_list() == [tenant, admin]
    events = await backend.ledger.audit_list(AuditQuery(action="token.create"))
    assert [(e.actor, e.target, e.details) for e in events] == [
        ("cli:alice@ops-1", "ops", {"scope": "admin", "description": "on-call rotation"}),
        ("ops", "acme-ci", {"scope": "tenant:acme", "description": ""}),
    ]


async def test_revoked_token_is_still_found_with_revoked_at(backend: Backend) -> None:
    created = await backend.ledger.tokens_create(
        TokensCreate(ApiToken(token_id="ci", scope="tenant:acme"), digest("s"), "ops")
    )
    revoked = await backend.ledger.tokens_revoke(TokensRevoke("ci", "cli:bob@ops-2"))
    assert revoked.revoked_at is not None
    assert revoked == msgspec.structs.replace(created, revoked_at=revoked.revoked_at)
    assert await backend.ledger.tokens_get_by_hash(digest("s")) == revoked
    await backend.advance(0.01)
    assert await backend.ledger.tokens_revoke(TokensRevoke("ci", "ops")) == revoked  # once
    assert await backend.ledger.tokens_list() == [revoked]
    events = await backend.ledger.audit_list(AuditQuery(action="token.revoke"))
    assert [(e.actor, e.target, e.details) for e in events] == [
        ("cli:bob@ops-2", "ci", {"scope": "tenant:acme"})
    ]
    with pytest.raises(NotFound):
        await backend.ledger.tokens_revoke(TokensRevoke("nope", "ops"))
    with pytest.raises(InvalidField):
        await backend.ledger.tokens_revoke(TokensRevoke("ci", " ops"))
    with pytest.raises(AlreadyExists):  # a revoked token's id is never reused
        await backend.ledger.tokens_create(
            TokensCreate(ApiToken(token_id="ci", scope="admin"), digest("t"), "ops")
        )


SECRET_HASH = digest("secret")


@pytest.mark.parametrize(
    ("token", "token_hash", "actor", "match"),
    [
        (ApiToken(token_id="a b", scope="admin"), SECRET_HASH, "ops", "token id"),
        (ApiToken(token_id="t", scope="root"), SECRET_HASH, "ops", "scope"),
        (ApiToken(token_id="t", scope="Admin"), SECRET_HASH, "ops", "scope"),
        (ApiToken(token_id="t", scope="tenants:acme"), SECRET_HASH, "ops", "scope"),
        (ApiToken(token_id="t", scope="tenant:"), SECRET_HASH, "ops", "tenant id"),
        (ApiToken(token_id="t", scope="tenant:a:b"), SECRET_HASH, "ops", "tenant id"),
        (ApiToken(token_id="t", scope="admin", description="x" * 201), SECRET_HASH, "ops", "200"),
        (ApiToken(token_id="t", scope="admin", description="a\nb"), SECRET_HASH, "ops", "print"),
        (ApiToken(token_id="t", scope="admin"), SECRET_HASH[:31], "ops", "32-byte"),
        (ApiToken(token_id="t", scope="admin"), SECRET_HASH, "", "actor"),
    ],
)
async def test_malformed_tokens_are_refused_and_change_nothing(
    backend: Backend, token: ApiToken, token_hash: bytes, actor: str, match: str
) -> None:
    with pytest.raises(InvalidField, match=match):
        await backend.ledger.tokens_create(TokensCreate(token, token_hash, actor))
    assert await backend.ledger.tokens_list() == []
    assert await backend.ledger.audit_list(AuditQuery()) == []


SESSION_IDLE_S = 1.2
"""A session's idle timeout in these tests: waits of a third of it keep it alive with room
to spare on a loaded machine, and its expiry costs real Postgres little waiting."""


async def token_for_sessions(backend: Backend, token_id: str, scope: str = "admin") -> None:
    await backend.ledger.tokens_create(
        TokensCreate(ApiToken(token_id=token_id, scope=scope), digest(token_id), "ops")
    )


def open_session(
    name: str, token_id: str, idle_s: float = SESSION_IDLE_S, lifetime_s: float = 3600.0
) -> SessionsCreate:
    return SessionsCreate(digest("session:" + name), token_id, idle_s, lifetime_s)


async def test_a_console_session_is_stored_as_its_hash_and_acts_as_its_token(
    backend: Backend,
) -> None:
    await token_for_sessions(backend, "acme-ops", "tenant:acme")
    before = await backend.ledger.database_now()
    opened = await backend.ledger.sessions_create(open_session("a", "acme-ops"))
    after = await backend.ledger.database_now()
    assert (opened.token_id, opened.scope, opened.idle_timeout_s, opened.revoked_at) == (
        "acme-ops",
        "tenant:acme",
        SESSION_IDLE_S,
        None,
    )
    assert before <= opened.created_at <= after
    assert opened.last_seen_at == opened.created_at
    assert opened.expires_at == opened.created_at + timedelta(hours=1)
    await backend.advance(0.3)
    touched = await backend.ledger.sessions_touch(digest("session:a"))
    assert touched == msgspec.structs.replace(opened, last_seen_at=touched.last_seen_at)
    assert touched.last_seen_at > opened.last_seen_at
    with pytest.raises(NotFound):
        await backend.ledger.sessions_touch(digest("session:unknown"))
    with pytest.raises(NotFound):  # the token's own hash is no session
        await backend.ledger.sessions_touch(digest("acme-ops"))
    with pytest.raises(AlreadyExists):
        await backend.ledger.sessions_create(open_session("a", "acme-ops"))
    for malformed in (b"short", digest("x")[:31]):
        with pytest.raises(InvalidField, match="32-byte"):
            await backend.ledger.sessions_touch(malformed)
        with pytest.raises(InvalidField, match="32-byte"):
            await backend.ledger.sessions_revoke(malformed)
    assert await backend.ledger.sessions_touch(digest("session:a")) is not None


@pytest.mark.parametrize(
    ("idle_s", "lifetime_s"),
    [(0.0, 60.0), (-1.0, 60.0), (61.0, 60.0), (60.0, 31 * 86_400.0), (float("nan"), 60.0)],
)
async def test_a_session_with_impossible_durations_is_refused(
    backend: Backend, idle_s: float, lifetime_s: float
) -> None:
    await token_for_sessions(backend, "ops")
    with pytest.raises(InvalidField, match="idle_timeout_s"):
        await backend.ledger.sessions_create(open_session("a", "ops", idle_s, lifetime_s))
    with pytest.raises(NotFound):
        await backend.ledger.sessions_touch(digest("session:a"))


async def test_no_session_is_opened_with_an_unknown_or_revoked_token(backend: Backend) -> None:
    with pytest.raises(NotFound, match="'ghost'"):
        await backend.ledger.sessions_create(open_session("a", "ghost"))
    await token_for_sessions(backend, "old")
    await backend.ledger.tokens_revoke(TokensRevoke("old", "ops"))
    with pytest.raises(NotFound, match="'old'"):
        await backend.ledger.sessions_create(open_session("b", "old"))
    for name in ("a", "b"):
        with pytest.raises(NotFound):
            await backend.ledger.sessions_touch(digest("session:" + name))


async def test_a_session_left_unused_for_its_idle_timeout_ends_and_use_keeps_it_open(
    backend: Backend,
) -> None:
    await token_for_sessions(backend, "ops")
    await backend.ledger.sessions_create(open_session("busy", "ops"))
    await backend.ledger.sessions_create(open_session("idle", "ops"))
    for _ in range(4):  # 1.6 s in all, more than the idle timeout, used every 0.4 s
        await backend.advance(SESSION_IDLE_S / 3)
        await backend.ledger.sessions_touch(digest("session:busy"))
    with pytest.raises(NotFound):
        await backend.ledger.sessions_touch(digest("session:idle"))
    await backend.advance(SESSION_IDLE_S + 0.1)
    with pytest.raises(NotFound):
        await backend.ledger.sessions_touch(digest("session:busy"))
    await backend.ledger.sessions_revoke(digest("session:busy"))  # ended already: no error


async def test_a_session_ends_at_its_lifetime_however_busy(backend: Backend) -> None:
    await token_for_sessions(backend, "ops")
    await backend.ledger.sessions_create(open_session("a", "ops", SESSION_IDLE_S, 1.5))
    for _ in range(2):
        await backend.advance(0.5)
        await backend.ledger.sessions_touch(digest("session:a"))
    await backend.advance(0.6)  # 1.6 s after it opened, 0.6 s after its last use
    with pytest.raises(NotFound):
        await backend.ledger.sessions_touch(digest("session:a"))


async def test_signing_out_ends_that_session_for_good(backend: Backend) -> None:
    await token_for_sessions(backend, "ops")
    await backend.ledger.sessions_create(open_session("laptop", "ops"))
    await backend.ledger.sessions_create(open_session("phone", "ops"))
    await backend.ledger.sessions_revoke(digest("session:laptop"))
    with pytest.raises(NotFound):
        await backend.ledger.sessions_touch(digest("session:laptop"))
    await backend.ledger.sessions_revoke(digest("session:laptop"))  # twice: no error
    await backend.ledger.sessions_revoke(digest("session:unknown"))
    assert (await backend.ledger.sessions_touch(digest("session:phone"))).token_id == "ops"
    with pytest.raises(AlreadyExists):  # a revoked session's id is not reused
        await backend.ledger.sessions_create(open_session("laptop", "ops"))


async def test_revoking_a_token_ends_its_sessions_and_only_those(backend: Backend) -> None:
    await token_for_sessions(backend, "alice")
    await token_for_sessions(backend, "bob", "tenant:acme")
    for name, token_id in (("a1", "alice"), ("a2", "alice"), ("b1", "bob")):
        await backend.ledger.sessions_create(open_session(name, token_id))
    await backend.ledger.tokens_revoke(TokensRevoke("alice", "ops"))
    for name in ("a1", "a2"):
        with pytest.raises(NotFound):
            await backend.ledger.sessions_touch(digest("session:" + name))
    assert (await backend.ledger.sessions_touch(digest("session:b1"))).scope == "tenant:acme"
    with pytest.raises(NotFound):
        await backend.ledger.sessions_create(open_session("a3", "alice"))


async def test_sessions_past_their_lifetime_are_forgotten_by_the_next_sign_in(
    backend: Backend,
) -> None:
    await token_for_sessions(backend, "ops")
    await backend.ledger.sessions_create(open_session("old", "ops", 0.5, 0.5))
    await backend.ledger.sessions_create(open_session("revoked", "ops", 0.5, 0.5))
    await backend.ledger.sessions_revoke(digest("session:revoked"))
    await backend.ledger.sessions_create(open_session("current", "ops"))
    with pytest.raises(AlreadyExists):
        await backend.ledger.sessions_create(open_session("old", "ops"))
    await backend.advance(0.6)
    # Past their lifetime, both rows are deleted by the next create: their hashes are free.
    await backend.ledger.sessions_create(open_session("next", "ops"))
    for name in ("old", "revoked"):
        reopened = await backend.ledger.sessions_create(open_session(name, "ops"))
        assert reopened.revoked_at is None
    with pytest.raises(AlreadyExists):  # a live session is not forgotten
        await backend.ledger.sessions_create(open_session("current", "ops"))
