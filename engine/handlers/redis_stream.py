"""The ``redis`` handler: append each execution to a Redis stream, once per execution id.

Settings (``docs/targets.md``, "redis"): ``url`` (``redis://`` or ``rediss://``, optional
``user:password@``, optional ``/db``), ``stream`` (the stream's key), optional ``maxlen``
(approximate trimming, ``MAXLEN ~``), optional ``dedup_ttl_s`` (how long an execution id is
remembered; default a day, or the task type's worst retry horizon if longer; shorter than
that horizon is refused), optional ``timeout_s`` (30 s) and ``max_connections`` (64).

**Once only.** Every attempt runs one Lua script (``EVALSHA``; loaded again on
``NOSCRIPT``, as after a broker restart), which Redis runs atomically::

    GET dedup-key   -- seen: answer the entry id it holds, append nothing
    XADD stream [MAXLEN ~ n] * fields...
    SET dedup-key <entry id> EX dedup_ttl_s

so retries, redeliveries after a crash, and a publish whose answer was lost all find the
key and append nothing: a repeat is a success. The key is ``carillon:dedup:{tag}:<execution
id>``, ``tag`` being the stream's own hash tag or its name, so key and stream share a slot.
The key is written *after* the append: a script that fails (the stream key holds another
type, Redis is out of memory) leaves nothing behind, and the next attempt starts afresh.
The fields are the execution's context, as in the webhook's JSON body: ``execution_id``,
``schedule_id``, ``tenant_id``, ``task_type``, ``planned_at`` (RFC 3339 UTC), ``attempt``,
``fencing_token``, ``payload`` (the schedule's payload as JSON), and with tracing on
``traceparent`` (and ``tracestate``), the attempt's W3C trace context.

**Where it runs.** The client is redis-py's asyncio client on the node's broker bridge
(:mod:`engine.handlers.brokers`), pooled per vetted settings; the attempt's timeout and any
trio cancellation cancel the publish on the loop, and redis-py discards a connection
interrupted mid-command, so no slot is kept and no half-read answer is left on a pooled
connection. A connection broken by a broker restart is reconnected by the next command; a
command that fails on a connection error is sent once more at once (safe: the script is
idempotent), so a restart costs at most the attempt in flight.

**SSRF.** The host is resolved (answers cached 15 s) and every address goes through the
webhooks' guard (:mod:`engine.handlers.ssrf`) with the node's ``--broker-allow-cidrs``; the
client connects to the vetted address itself (for ``rediss``, the TLS name and certificate
check keep the host name).

**Failures.** ``ssrf_refused`` (permanent), ``dns_error``, ``redis_connection_error``,
``timeout``, ``redis_loading``, ``redis_readonly``, ``redis_oom``, ``redis_busy``
(transient), ``redis_auth_error``, ``redis_wrongtype``, ``redis_script_error``,
``redis_error`` (permanent), anything else unknown.
"""

from __future__ import annotations

import hashlib
import math
import re
import ssl
from collections.abc import Awaitable, Mapping
from typing import Any, Final, cast
from urllib.parse import unquote

import msgspec
from redis import exceptions as redis_errors
from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.connection import Connection, SSLConnection
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from engine.core.instants import format_utc
from engine.errors import InvalidField
from engine.handlers.base import (
    TIMEOUT_S_DEFAULT,
    ExecutionContext,
    HandlerOptions,
    HandlerResult,
    check_timeout_s,
    parse_settings,
)
from engine.handlers.brokers import (
    BrokerBridge,
    BrokerHost,
    BrokerPublisher,
    bracketed,
    split_broker_url,
)
from engine.handlers.ssrf import IPAddress
from engine.tracing import trace_headers

__all__ = [
    "DEDUP_KEY_PREFIX",
    "DEDUP_TTL_S_DEFAULT",
    "PUBLISH_SCRIPT",
    "RedisHandler",
    "RedisSettings",
    "dedup_key",
    "parse_redis_url",
]

DEDUP_KEY_PREFIX: Final = "carillon:dedup:"
DEDUP_TTL_S_DEFAULT: Final = 86400
"""An execution id is remembered a day, or the task type's worst retry horizon if longer."""
DEDUP_TTL_S_MAX: Final = 366 * 86400
MAXLEN_MAX: Final = 1_000_000_000
MAX_CONNECTIONS_DEFAULT: Final = 64
MAX_CONNECTIONS_MAX: Final = 1024
CONNECT_TIMEOUT_S: Final = 5.0
"""A connect's own bound (on the loop): every publish sharing the client waits for it."""
STREAM_CHARS_MAX: Final = 256
DB_MAX: Final = 1_000_000
_STREAM: Final = re.compile(rf"^[!-~]{{1,{STREAM_CHARS_MAX}}}$")

PUBLISH_SCRIPT: Final = """\
local seen = redis.call('GET', KEYS[1])
if seen then return {0, seen} end
local args = {'XADD', KEYS[2]}
if ARGV[2] ~= '0' then
  args[#args + 1] = 'MAXLEN'
  args[#args + 1] = '~'
  args[#args + 1] = ARGV[2]
end
args[#args + 1] = '*'
for i = 3, #ARGV do args[#args + 1] = ARGV[i] end
local id = redis.call(unpack(args))
redis.call('SET', KEYS[1], id, 'EX', ARGV[1])
return {1, id}
"""
"""KEYS: the dedup key, the stream. ARGV: the dedup TTL in seconds, MAXLEN (``0``: no
trimming), then field, value, field, value ... Answers ``{1, id}`` for an entry appended,
``{0, id}`` for an execution id already seen (``id``: the entry it appended)."""
_SCRIPT_SHA: Final = hashlib.sha1(PUBLISH_SCRIPT.encode()).hexdigest()


class RedisSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    url: str
    stream: str
    maxlen: int | None = None
    """Keep about this many entries (``XADD MAXLEN ~``: trimmed in whole nodes, so a few
    more may stay); ``None``: never trimmed."""
    dedup_ttl_s: int | None = None
    timeout_s: float = TIMEOUT_S_DEFAULT
    max_connections: int = MAX_CONNECTIONS_DEFAULT


class RedisTarget(msgspec.Struct, frozen=True, kw_only=True):
    """A parsed ``redis://`` URL."""

    tls: bool
    host: str
    port: int
    db: int
    username: str | None
    password: str | None

    @property
    def display(self) -> str:
        """The URL without its credentials: what error messages and logs show."""
        host = bracketed(self.host)
        return f"{'rediss' if self.tls else 'redis'}://{host}:{self.port}/{self.db}"


def parse_redis_url(text: str) -> RedisTarget:
    """``text`` as a Redis URL; :class:`InvalidField` saying what is wrong if it is not.

    The messages never repeat the URL: it may carry a password.
    """
    parts, host = split_broker_url(
        "redis", text, ("redis", "rediss"), "redis:// or rediss:// (TLS)"
    )
    port = parts.port
    if parts.query or parts.fragment:
        raise InvalidField(
            "redis handler: url must not have a query or fragment (TLS is the scheme rediss://, "
            "the database the path /0, everything else a setting of the handler)"
        )
    path = parts.path.strip("/")
    if path and not (path.isascii() and path.isdigit() and int(path) <= DB_MAX):
        raise InvalidField("redis handler: the url's path must be a database number, like /0")
    return RedisTarget(
        tls=parts.scheme == "rediss",
        host=host,
        port=port or 6379,
        db=int(path) if path else 0,
        username=unquote(parts.username) if parts.username else None,
        password=unquote(parts.password) if parts.password is not None else None,
    )


def check_stream(stream: str) -> str:
    if not isinstance(stream, str) or not _STREAM.match(stream):
        raise InvalidField(
            f"redis handler: stream must be 1-{STREAM_CHARS_MAX} printable ASCII characters "
            "without spaces, like 'orders:ticks'"
        )
    if stream.startswith(DEDUP_KEY_PREFIX):
        raise InvalidField(
            f"redis handler: stream must not start with {DEDUP_KEY_PREFIX!r} "
            "(the prefix of Carillon's deduplication keys)"
        )
    return stream


def hash_tag(key: str) -> str:
    """What Redis Cluster hashes of ``key``: the inside of its first non-empty ``{...}``,
    else the whole key."""
    start = key.find("{")
    if start >= 0:
        end = key.find("}", start + 1)
        if end > start + 1:
            return key[start + 1 : end]
    return key


def dedup_key(stream: str, execution_id: str) -> str:
    """The key that records ``execution_id`` as appended to ``stream`` (same hash slot)."""
    return f"{DEDUP_KEY_PREFIX}{{{hash_tag(stream)}}}:{execution_id}"


def dedup_ttl_s(requested: int | None, retry_horizon_s: float) -> int:
    """The dedup TTL to use: ``requested``, or the default; :class:`InvalidField` when
    ``requested`` is shorter than the task type's worst retry horizon."""
    horizon = math.ceil(retry_horizon_s)
    if requested is None:
        return min(max(DEDUP_TTL_S_DEFAULT, horizon), DEDUP_TTL_S_MAX)
    if isinstance(requested, bool) or not 1 <= requested <= DEDUP_TTL_S_MAX:
        raise InvalidField(
            f"redis handler: dedup_ttl_s must be 1-{DEDUP_TTL_S_MAX} seconds, got {requested!r}"
        )
    if requested < horizon:
        raise InvalidField(
            f"redis handler: dedup_ttl_s ({requested} s) is less than this task type's worst "
            f"retry horizon ({horizon} s: its attempts, timeouts, redeliveries and backoffs), so "
            "a late retry could append the same execution twice. Raise dedup_ttl_s to at least "
            f"{horizon}, or leave it out (default: {max(DEDUP_TTL_S_DEFAULT, horizon)})"
        )
    return requested


class _TlsConnection(SSLConnection):
    """A TLS connection to a vetted address that checks the certificate of the host name
    (against the system's trust store, or ``tls_context``'s)."""

    def __init__(
        self, *, tls_name: str, tls_context: ssl.SSLContext | None = None, **kwargs: Any
    ) -> None:
        self._tls_name = tls_name
        self._tls_context = tls_context
        super().__init__(**kwargs)

    def _connection_arguments(self) -> Mapping[str, Any]:
        arguments = {**super()._connection_arguments(), "server_hostname": self._tls_name}
        if self._tls_context is not None:
            arguments["ssl"] = self._tls_context
        return arguments


class _Client:
    """A pooled redis-py client (lives on the broker bridge's loop)."""

    def __init__(self, redis: Redis, pool: BlockingConnectionPool) -> None:
        self.redis = redis
        self.pool = pool

    def usable(self) -> bool:
        return True  # redis-py reconnects each connection on its next command

    async def aclose(self) -> None:
        await self.redis.aclose()
        await self.pool.disconnect()

    def in_use(self) -> int:
        """Connections taken out of the pool now (for tests: a cancelled publish gives its
        connection back)."""
        return len(self.pool._in_use_connections)


async def connections_in_use(client: _Client) -> int:
    """:meth:`_Client.in_use`, as a bridge operation."""
    return client.in_use()


class RedisHandler(BrokerPublisher):
    """Appends each execution to one stream once; build it with
    :func:`engine.handlers.build_handler`."""

    kind = "redis"

    def __init__(
        self,
        settings: Mapping[str, Any],
        *,
        options: HandlerOptions,
        retry_horizon_s: float = 0.0,
        brokers: BrokerBridge | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        parsed = parse_settings("redis", settings, RedisSettings)
        self._ssl_context = ssl_context
        """Replaces the system's trust store for ``rediss`` (clients made with it are pooled
        apart)."""
        self._target = parse_redis_url(parsed.url)
        self._stream = check_stream(parsed.stream)
        if parsed.maxlen is not None and not 1 <= parsed.maxlen <= MAXLEN_MAX:
            raise InvalidField(f"redis handler: maxlen must be 1-{MAXLEN_MAX}, or left out")
        self._maxlen = parsed.maxlen or 0
        self.dedup_ttl_s = dedup_ttl_s(parsed.dedup_ttl_s, retry_horizon_s)
        self.timeout_s = check_timeout_s("redis", parsed.timeout_s)
        if not 1 <= parsed.max_connections <= MAX_CONNECTIONS_MAX:
            raise InvalidField(
                f"redis handler: max_connections must be 1-{MAX_CONNECTIONS_MAX}, "
                f"got {parsed.max_connections}"
            )
        self._max_connections = parsed.max_connections
        self._host = BrokerHost(self._target.host, self._target.port, options.broker_allow_cidrs)
        self._brokers = brokers

    def __repr__(self) -> str:
        return f"RedisHandler(url={self._target.display!r}, stream={self._stream!r})"

    # -- the attempt ----------------------------------------------------------------------

    def _timed_out(self) -> str:
        return (
            f"XADD to {self._stream!r} on {self._target.display}: no answer within "
            f"{self.timeout_s:g} s"
        )

    def _failure(self, error: Exception) -> HandlerResult | None:
        if isinstance(error, redis_errors.RedisError):
            return self._classify(error)
        if isinstance(error, OSError):
            return HandlerResult.transient(
                "redis_connection_error", f"{self._target.display}: {type(error).__name__}"
            )
        return None

    def _key(self, address: IPAddress) -> tuple[object, ...]:
        target = self._target
        return (
            "redis",
            target.tls,
            target.host,
            str(address),
            target.port,
            target.db,
            target.username,
            target.password,
            self._max_connections,
            id(self._ssl_context) if self._ssl_context is not None else None,
        )

    def _connector(self, address: IPAddress) -> Any:
        target = self._target
        max_connections = self._max_connections
        ssl_context = self._ssl_context

        async def connect() -> _Client:
            # No I/O here: redis-py connects on the first command.
            tls: dict[str, Any] = {}
            connection_class: type[Connection] = Connection
            if target.tls:
                connection_class = _TlsConnection
                tls = {
                    "tls_name": target.host,
                    "tls_context": ssl_context,
                    "ssl_cert_reqs": ssl.CERT_REQUIRED,
                }
            pool = BlockingConnectionPool(
                connection_class=connection_class,
                max_connections=max_connections,
                timeout=None,  # the attempt's deadline bounds the wait for a slot
                host=str(address),
                port=target.port,
                db=target.db,
                username=target.username,
                password=target.password,
                socket_connect_timeout=CONNECT_TIMEOUT_S,
                retry=Retry(NoBackoff(), 1),
                health_check_interval=0,
                **tls,
            )
            return _Client(Redis(connection_pool=pool), pool)

        return connect

    def _op(self, context: ExecutionContext) -> Any:
        keys = (dedup_key(self._stream, context.execution_id), self._stream)
        args: tuple[str | int | float | bytes, ...] = (
            self.dedup_ttl_s,
            self._maxlen,
            "execution_id",
            context.execution_id,
            "schedule_id",
            context.schedule_id,
            "tenant_id",
            context.tenant_id,
            "task_type",
            context.task_type,
            "planned_at",
            format_utc(context.planned_at),
            "attempt",
            context.attempt,
            "fencing_token",
            context.fencing_token,
            "payload",
            msgspec.json.encode(context.payload),
            # The attempt's W3C trace context when tracing is on (engine/tracing.py).
            *(item for header in trace_headers().items() for item in header),
        )

        async def publish(client: _Client) -> object:
            # redis-py types its commands for both of its clients; these are the asyncio one's.
            redis = client.redis
            try:
                return await cast(Awaitable[object], redis.evalsha(_SCRIPT_SHA, 2, *keys, *args))
            except redis_errors.NoScriptError:
                # A new or restarted server: load the script, then run it.
                await cast(Awaitable[str], redis.script_load(PUBLISH_SCRIPT))
                return await cast(Awaitable[object], redis.evalsha(_SCRIPT_SHA, 2, *keys, *args))

        return publish

    def _classify(self, error: redis_errors.RedisError) -> HandlerResult:
        where = f"{self._target.display} stream {self._stream!r}"
        text = f"{where}: {error}"
        if isinstance(
            error,
            redis_errors.AuthenticationError
            | redis_errors.AuthorizationError
            | redis_errors.AuthenticationWrongNumberOfArgsError
            | redis_errors.NoPermissionError,
        ):
            return HandlerResult.permanent("redis_auth_error", text)
        if isinstance(error, redis_errors.TimeoutError):
            return HandlerResult.transient("timeout", text)
        if isinstance(error, redis_errors.BusyLoadingError):
            return HandlerResult.transient("redis_loading", text)
        if isinstance(error, redis_errors.ConnectionError):
            return HandlerResult.transient("redis_connection_error", text)
        if isinstance(error, redis_errors.ReadOnlyError):
            return HandlerResult.transient("redis_readonly", text)
        if isinstance(error, redis_errors.OutOfMemoryError):
            return HandlerResult.transient("redis_oom", text)
        if isinstance(error, redis_errors.ResponseError):
            message = str(error)
            if "WRONGTYPE" in message:
                return HandlerResult.permanent(
                    "redis_wrongtype",
                    f"{where}: the key holds another type than a stream (or the dedup key "
                    f"another type than a string): {error}",
                )
            if message.startswith(("BUSY", "TRYAGAIN", "MASTERDOWN", "CLUSTERDOWN", "LOADING")):
                return HandlerResult.transient("redis_busy", text)
            if "script" in message.lower() or message.startswith("NOSCRIPT"):
                return HandlerResult.permanent("redis_script_error", text)
            return HandlerResult.permanent("redis_error", text)
        return HandlerResult.unknown("redis_error", text)
