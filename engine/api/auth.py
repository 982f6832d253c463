"""Bearer tokens: minting, checking, scopes and per-token request rates.

A token reads ``crl_<token id>_<secret>``. The ledger keeps only its SHA-256 (a token carries
192 random bits, so a fast hash is safe: nobody brute-forces 2**192), looked up by an index,
so checking a token compares no secret in Python and leaks nothing through timing. The
embedded token id is for people (logs, ``carillon token revoke``); it is never trusted --
only the hash of the whole token is.

Scopes: ``admin`` sees and changes everything; ``tenant:<id>`` sees and changes only that
tenant's schedules, executions and dead letters, and gets 404 for anything else, exactly as
if it did not exist, so a tenant cannot probe another's ids.

Bounds: lookups are cached for :data:`TOKEN_CACHE_TTL_S` (a revoked token stops working
within that); each token has its own request rate
(:class:`~engine.core.token_bucket.TokenBucket`), and so does each client address that
presents no valid token. Forged tokens cannot hammer the database nor push valid tokens out:

* A token this node has not seen valid is looked up only after its client address's bucket
  gave a request (429 otherwise, with no lookup): a flood of distinct well-formed tokens
  from one address costs at most that bucket's burst, then its rate, in queries. A token
  seen valid (even if its cache entry has expired) is looked up again without it, so a
  flood from an address it shares (a proxy, a NAT) does not lock it out.
* Valid tokens (:data:`TOKEN_CACHE_ENTRIES`) and unknown or revoked ones
  (:data:`TOKEN_MISSES_CACHED`) are cached apart, each least recently used first out: no
  number of misses evicts a valid token.

Console sessions (:meth:`Authenticator.authenticate_session`) follow the same rules: the
cookie holds a random session id (:func:`new_session_id`), the ledger only its SHA-256, and a
node caches what ``sessions_touch`` answered for :data:`SESSION_CACHE_TTL_S`, valid sessions
and misses apart and bounded alike; a session never seen valid costs its address a request
before its lookup. A valid session acts as its token: the token's request rate applies.
"""

from __future__ import annotations

import hashlib
import secrets
from collections import OrderedDict
from collections.abc import Callable
from typing import Final, Generic, TypeVar

import msgspec

from engine.api.problems import Problem, forbidden, rate_limited, unauthorized
from engine.core.token_bucket import TokenBucket
from engine.errors import NotFound
from engine.ledger.base import Ledger
from engine.model import ApiToken, ConsoleSession

TOKEN_PREFIX: Final = "crl_"
TOKEN_ID_HEX: Final = 12
TOKEN_SECRET_BYTES: Final = 24
TOKEN_LENGTH_MAX: Final = 256
TOKEN_CACHE_TTL_S: Final = 5.0
TOKEN_CACHE_ENTRIES: Final = 10_000
"""Valid tokens whose lookups are kept (each about 300 bytes)."""
TOKEN_MISSES_CACHED: Final = 10_000
"""Unknown or revoked token hashes whose lookups are kept, apart from the valid ones."""
RATE_BUCKETS_MAX: Final = 10_000
SESSION_ID_PREFIX: Final = "cs_"
SESSION_ID_BYTES: Final = 32
"""A session id's random bytes (256 bits: a fast hash is safe, as for tokens)."""
SESSION_ID_LENGTH_MAX: Final = 64
SESSION_CACHE_TTL_S: Final = TOKEN_CACHE_TTL_S
"""How long a node trusts what it last learnt of a session (a session revoked on another
node, or by its token's revocation, stops working here within that)."""
SESSION_CACHE_ENTRIES: Final = 10_000
SESSION_MISSES_CACHED: Final = 10_000
ADMIN_SCOPE: Final = "admin"
TENANT_SCOPE_PREFIX: Final = "tenant:"


class Principal(msgspec.Struct, frozen=True):
    """Who is calling: a token's id and scope."""

    token_id: str
    scope: str

    @property
    def is_admin(self) -> bool:
        return self.scope == ADMIN_SCOPE

    @property
    def tenant_id(self) -> str | None:
        """The only tenant this principal may touch; ``None`` for an admin (every tenant)."""
        if self.scope.startswith(TENANT_SCOPE_PREFIX):
            return self.scope[len(TENANT_SCOPE_PREFIX) :]
        return None

    @property
    def actor(self) -> str:
        """How audited actions name this caller."""
        return f"token:{self.token_id}"

    def require_admin(self) -> None:
        if not self.is_admin:
            raise forbidden("this route needs an admin token")

    def can_see(self, tenant_id: str) -> bool:
        return self.is_admin or self.tenant_id == tenant_id

    def check_tenant(self, tenant_id: str, what: str) -> None:
        """For another tenant's record, raise the very error of one that does not exist:
        the ledgers' ``NotFound("<what> does not exist")``, so the 404 a tenant token gets
        is byte for byte the same either way."""
        if not self.can_see(tenant_id):
            raise NotFound(f"{what} does not exist")


def new_token() -> tuple[str, str, bytes]:
    """A fresh token: ``(token id, the token to show once, its hash to store)``."""
    token_id = secrets.token_hex(TOKEN_ID_HEX // 2)
    token = f"{TOKEN_PREFIX}{token_id}_{secrets.token_urlsafe(TOKEN_SECRET_BYTES)}"
    return token_id, token, hash_token(token)


def hash_token(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def new_session_id() -> tuple[str, bytes]:
    """A fresh console session id (for the cookie) and its hash (for the ledger)."""
    session_id = SESSION_ID_PREFIX + secrets.token_urlsafe(SESSION_ID_BYTES)
    return session_id, hash_token(session_id)


def scope_of(*, admin: bool, tenant_id: str | None) -> str:
    if admin == (tenant_id is not None):
        raise ValueError("a token is either admin or for one tenant")
    return ADMIN_SCOPE if admin else TENANT_SCOPE_PREFIX + str(tenant_id)


class RateLimiter:
    """One token bucket per key (token id or client address), the least recently used
    forgotten beyond :data:`RATE_BUCKETS_MAX` (a forgotten key starts with a full bucket)."""

    def __init__(
        self, rate_per_s: float, burst: int, monotonic: Callable[[], float], *, whose: str
    ) -> None:
        self._rate_per_s = rate_per_s
        self._burst = burst
        self._monotonic = monotonic
        self._limit = f"{whose} {rate_per_s:g}/s with a burst of {burst}; that rate"
        """What a 429 says of this limit."""
        self._buckets: OrderedDict[str, TokenBucket] = OrderedDict()
        self.refused = 0

    def check(self, key: str) -> None:
        """Take one request from ``key``'s bucket; 429 with ``Retry-After`` if it is empty."""
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = TokenBucket(self._rate_per_s, self._burst)
            if len(self._buckets) > RATE_BUCKETS_MAX:
                self._buckets.popitem(last=False)
        else:
            self._buckets.move_to_end(key)
        now_s = self._monotonic()
        if not bucket.take(now_s):
            self.refused += 1
            raise rate_limited(max(1, int(bucket.wait_s(now_s) + 0.999)), self._limit)


class Authenticator:
    """Turns an ``Authorization`` header into a :class:`Principal`, or a 401/429 problem."""

    def __init__(
        self,
        ledger: Ledger,
        monotonic: Callable[[], float],
        *,
        token_rate_per_s: float,
        token_burst: int,
        anonymous_rate_per_s: float,
        anonymous_burst: int,
    ) -> None:
        self._ledger = ledger
        self._monotonic = monotonic
        self._valid = _Lookups[ApiToken | None](TOKEN_CACHE_ENTRIES)
        """Hashes of tokens found valid, with their record (kept after expiry: seen valid)."""
        self._misses = _Lookups[ApiToken | None](TOKEN_MISSES_CACHED)
        """Hashes found unknown or revoked, with their record (``None``: unknown)."""
        self._sessions = _Lookups[ConsoleSession | None](SESSION_CACHE_ENTRIES)
        """Hashes of sessions found valid (kept after expiry: seen valid)."""
        self._session_misses = _Lookups[ConsoleSession | None](SESSION_MISSES_CACHED)
        """Hashes of sessions found unknown or ended."""
        self.token_rates = RateLimiter(
            token_rate_per_s, token_burst, monotonic, whose="this token's requests are limited to"
        )
        self.anonymous_rates = RateLimiter(
            anonymous_rate_per_s,
            anonymous_burst,
            monotonic,
            whose="requests without a valid token are limited per client address to",
        )

    async def authenticate(self, authorization: str | None, client: str) -> Principal:
        """The caller, rate-limited; 401 for a missing, malformed, unknown or revoked token;
        429 when ``client`` sent too many requests without a valid token."""
        charged = False
        try:
            token_hash = hash_token(_bearer(authorization))
            found, fresh = self._cached(token_hash)
            if not fresh:
                if found is None:  # never seen valid: the address pays before the database
                    self.anonymous_rates.check(client)
                    charged = True
                found = await self._lookup(token_hash)
            if found is None:
                raise unauthorized("the token is not valid")
            if found.revoked_at is not None:
                raise unauthorized("the token was revoked")
        except Problem as problem:
            if problem.status == 401 and not charged:
                self.anonymous_rates.check(client)
            raise
        self.token_rates.check(found.token_id)
        return Principal(found.token_id, found.scope)

    async def authenticate_session(self, session_id: str, client: str) -> Principal:
        """The console session's token, rate-limited like the token itself; 401 for a
        malformed, unknown, revoked or expired session (or one whose token was revoked); 429
        when ``client`` sent too many requests without a valid token or session."""
        charged = False
        try:
            if not session_id.startswith(SESSION_ID_PREFIX) or len(session_id) > (
                SESSION_ID_LENGTH_MAX
            ):
                raise unauthorized("the session is not valid")
            session_hash = hash_token(session_id)
            found = self._sessions.get(session_hash)
            now = self._monotonic()
            session: ConsoleSession | None
            if found is not None and found[0] > now:
                session = found[1]
            else:
                missed = self._session_misses.get(session_hash)
                if missed is not None and missed[0] > now:
                    raise unauthorized("the session has ended")
                if found is None:  # never seen valid: the address pays before the database
                    self.anonymous_rates.check(client)
                    charged = True
                session = await self._touch(session_hash)
            if session is None:
                raise unauthorized("the session has ended")
        except Problem as problem:
            if problem.status == 401 and not charged:
                self.anonymous_rates.check(client)
            raise
        self.token_rates.check(session.token_id)
        return Principal(session.token_id, session.scope)

    def forget_session(self, session_id: str) -> None:
        """Forget what this node knows of a session (it was just signed out here): its next
        use is looked up."""
        session_hash = hash_token(session_id)
        self._sessions.pop(session_hash)
        self._session_misses.pop(session_hash)

    def forget(self) -> None:
        """Drop cached lookups (after this node revoked a token, say)."""
        self._valid.clear()
        self._misses.clear()
        self._sessions.clear()
        self._session_misses.clear()

    async def _touch(self, session_hash: bytes) -> ConsoleSession | None:
        try:
            session: ConsoleSession | None = await self._ledger.sessions_touch(session_hash)
        except NotFound:
            session = None
        expires = self._monotonic() + SESSION_CACHE_TTL_S
        if session is not None:
            self._session_misses.pop(session_hash)
            self._sessions.put(session_hash, (expires, session))
        else:
            self._sessions.pop(session_hash)
            self._session_misses.put(session_hash, (expires, None))
        return session

    def _cached(self, token_hash: bytes) -> tuple[ApiToken | None, bool]:
        """What is known of ``token_hash``: its record (``None``: not known valid) and whether
        that is fresh enough to answer without a lookup."""
        now = self._monotonic()
        valid = self._valid.get(token_hash)
        if valid is not None:
            return valid[1], valid[0] > now
        missed = self._misses.get(token_hash)
        if missed is not None and missed[0] > now:
            return missed[1], True
        return None, False

    async def _lookup(self, token_hash: bytes) -> ApiToken | None:
        try:
            token: ApiToken | None = await self._ledger.tokens_get_by_hash(token_hash)
        except NotFound:
            token = None
        expires = self._monotonic() + TOKEN_CACHE_TTL_S
        if token is not None and token.revoked_at is None:
            self._misses.pop(token_hash)
            self._valid.put(token_hash, (expires, token))
        else:  # unknown, or revoked: never seen valid from here on
            self._valid.pop(token_hash)
            self._misses.put(token_hash, (expires, token))
        return token


_Record = TypeVar("_Record")


class _Lookups(Generic[_Record]):
    """Lookups by hash, at most ``entries``, the least recently used forgotten first."""

    def __init__(self, entries: int) -> None:
        self._entries = entries
        self._by_hash: OrderedDict[bytes, tuple[float, _Record]] = OrderedDict()

    def get(self, token_hash: bytes) -> tuple[float, _Record] | None:
        """``(expires at, record)``, or ``None`` if not kept."""
        found = self._by_hash.get(token_hash)
        if found is not None:
            self._by_hash.move_to_end(token_hash)
        return found

    def put(self, token_hash: bytes, lookup: tuple[float, _Record]) -> None:
        self._by_hash[token_hash] = lookup
        self._by_hash.move_to_end(token_hash)
        if len(self._by_hash) > self._entries:
            self._by_hash.popitem(last=False)

    def pop(self, token_hash: bytes) -> None:
        self._by_hash.pop(token_hash, None)

    def clear(self) -> None:
        self._by_hash.clear()


def _bearer(authorization: str | None) -> str:
    if not authorization:
        raise unauthorized("send a token: Authorization: Bearer crl_...")
    scheme, _, token = authorization.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise unauthorized("the Authorization header must be 'Bearer <token>'")
    if len(token) > TOKEN_LENGTH_MAX or not token.startswith(TOKEN_PREFIX):
        raise unauthorized("the token is not valid")
    return token
