"""The webhook client: one per node, keep-alive HTTP/1.1 on trio streams, and HTTP/2
(:mod:`engine.handlers.http2`) where an https receiver chooses it by ALPN.

Why this client: measured with ``benchmarks/webhook_clients.py`` (10,000 POSTs, 1,000 in
flight, a local receiver answering after 0 or 50 ms, medians of 3 alternating runs on the
2-core reference machine; client CPU per request):

=====================================  ===================  ===================
candidate                              0 ms                 50 ms
=====================================  ===================  ===================
new httpx client per request (before)  1,076/s, 923 µs      926/s, 956 µs
one shared httpx pool                  244/s, 4,098 µs      122/s, 7,872 µs
aiohttp on a uvloop thread + bridge    7,355/s, 137 µs      5,714/s, 150 µs
h11 on trio streams, own pool          7,712/s, 122 µs      6,706/s, 127 µs
=====================================  ===================  ===================

A second series (aiohttp-bridge against h11-trio only) gave 5,617 vs 6,364/s at 0 ms and
6,620 vs 6,181/s at 50 ms, with h11 again cheaper per request (127 vs 155 µs, 123 vs
130 µs). h11 on trio costs the least CPU per delivery in every series, needs no new
dependency and no second thread, and cancellation is plain trio.

Then h11 itself went: its general state machine was a quarter of a node's CPU per delivery,
and the client needs one request shape and one answer at a time. The bytes are now written
and read by :mod:`engine.handlers.http1` (checked against h11 in its tests): the whole
``webhook`` candidate -- SSRF vetting, headers, pool -- went from 230 to 104 µs per request
at 0 ms, and from 4,336 to 9,601 requests/s (256 in flight, alternating runs of the same
revision pair).

What it guarantees:

* **Connections only to vetted addresses.** Every delivery resolves the URL's host through
  a small DNS cache and vets *every* address with the SSRF guard
  (:func:`engine.handlers.ssrf.vet`), the cached answer included, before any connection is
  picked. Idle connections are pooled under the key (scheme, host name, port, vetted IP
  address, TLS server name, TLS context), so a pooled connection is only ever reused for an
  address that passed the guard for this very delivery. A DNS answer that changes to an
  internal address is refused at the next resolution, before anything is sent; idle
  connections to addresses the new answer no longer names are closed.
* **DNS answers are cached for at most** :data:`DNS_CACHE_S` **(15 s)**. ``getaddrinfo``
  returns no TTL, so the cap is ours: short enough that a receiver's DNS failover (record
  TTLs are typically 30-300 s) is followed within seconds, long enough that a burst to one
  receiver costs one lookup per 15 s instead of one per delivery. Concurrent deliveries to a
  host share one lookup; a failed lookup is remembered for :data:`DNS_FAILURE_CACHE_S`.
* **TLS as before:** SNI and certificate verification use the URL's host name (the
  connection goes to the vetted IP). Handshakes are saved twice: a kept-alive connection
  needs none, and a new connection to the same key offers the last TLS session (resumption,
  still bound to the same server name and context).
* **Limits.** At most ``connections_per_host`` connections (open, busy or idle) per (host,
  port), the node's ``webhook_connections_per_host`` (default 256), and
  ``connections_total`` overall, ``webhook_connections_total`` (default 1,024); a delivery over a
  limit waits for a slot within its deadline. Per host, because one slow or failing receiver
  must not take every connection of the node away from the others, and because a receiver
  that slows down would otherwise be answered with ever more connections (every waiting
  worker opening one) just when it can least take them. Globally, because each connection is
  a file descriptor (the node's limit is shared with its database pool and API), an
  ephemeral port, and kernel plus TLS buffers (tens of KiB); the default stays far below
  common descriptor limits. Idle connections are closed after ``idle_timeout_s`` (15 s), and
  when a new connection would pass a limit, the least recently used idle one goes first.
* **No proxies, no redirects** (this client never follows anything; the handler classifies
  a 3xx), **no decompression** (``Accept-Encoding: identity``), at most ``body_max_bytes``
  of a response kept; a response not read to its end (over the cap, or cut off) discards its
  connection rather than returning it to the pool.
* **Faults are errors, never hangs or leaks.** The caller bounds each delivery with one
  deadline (trio cancel scope); cancellation at any point closes the connection in use and
  frees its slots. Connection failures raise :class:`ConnectFailed`; failures after the
  connection was made (reset, closed before a complete answer, a malformed answer) raise
  :class:`ExchangeFailed`. A reused keep-alive connection is checked before use (a pending
  EOF, reset or stray byte discards it). If sending the request on a reused connection fails
  -- the request was provably not delivered whole, so the receiver cannot have acted on it
  -- it is sent once more on a new connection. Once the request has been sent, nothing is
  retried here: a connection dropped before the answer may have been processed, and the
  handler reports it as a transient failure for the retry policy (the idempotency key makes
  that safe).
* **HTTP/2 where the receiver offers it.** ALPN offers ``h2`` then ``http/1.1`` (the default
  TLS context; a context given by the caller keeps its own ALPN). A receiver that chooses
  ``h2`` gets shared connections (:class:`~engine.handlers.http2.H2Connection`), pooled
  under the same vetted key: each holds one per-host and one total connection slot for its
  life and carries as many deliveries at once as the receiver's ``MAX_CONCURRENT_STREAMS``;
  a new one is opened only when every stream of the others is taken. Until a key's protocol
  is known (its first https connection), one connection is opened at a time to it and the
  other deliveries wait for it, so a burst to a new receiver does not open a connection per
  delivery before learning it speaks HTTP/2. A stream the receiver provably did not process
  (``REFUSED_STREAM``, above a GOAWAY's last stream id) is sent once more on another
  connection, like a request whose send failed on a reused HTTP/1.1 connection. Idle HTTP/2
  connections are reaped like idle HTTP/1.1 ones; a DNS answer that drops an address
  retires the connections to it (their streams finish, no new ones start).

Use :func:`open_webhook_client` for the node's client (it also runs the idle reaper) and
pass it to :class:`engine.handlers.webhook.WebhookHandler`; handlers built without one use
:func:`default_client`, one per trio run, closed when the run ends.
"""

from __future__ import annotations

import contextlib
import logging
import select
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Final

import msgspec
import trio

from engine.config import WEBHOOK_CONNECTIONS_PER_HOST_DEFAULT, WEBHOOK_CONNECTIONS_TOTAL_DEFAULT
from engine.errors import ConfigError
from engine.handlers.http1 import MalformedAnswer, ResponseReader, encode_request
from engine.handlers.http2 import H2Connection
from engine.handlers.http_wire import (
    RECEIVE_BYTES,
    RESPONSE_HEAD_BYTES_MAX,
    ConnectFailed,
    ExchangeFailed,
    ResolveFailed,
    StreamRefused,
    WebhookResponse,
    describe,
)
from engine.handlers.ssrf import IPAddress, IPNetwork, resolve, vet

__all__ = [
    "DNS_CACHE_S",
    "ConnectFailed",
    "ExchangeFailed",
    "Progress",
    "ResolveFailed",
    "WebhookClient",
    "WebhookClientConfig",
    "WebhookClientStatistics",
    "WebhookResponse",
    "default_client",
    "open_webhook_client",
]

log = logging.getLogger("carillon.webhook")

DNS_CACHE_S: Final = 15.0
"""Longest time a DNS answer is used (vetted again on every use)."""
DNS_FAILURE_CACHE_S: Final = 2.0
"""How long a failed lookup is remembered (deliveries waiting on it share the failure)."""
DNS_CACHE_ENTRIES: Final = 4096
TLS_SESSIONS_MAX: Final = 4096
REAP_INTERVAL_S: Final = 1.0


class WebhookClientConfig(msgspec.Struct, frozen=True, kw_only=True):
    """The node's webhook client settings (see the module docstring for the reasons)."""

    connections_per_host: int = WEBHOOK_CONNECTIONS_PER_HOST_DEFAULT
    """Most connections open at once to one (host, port): busy, idle or connecting."""
    connections_total: int = WEBHOOK_CONNECTIONS_TOTAL_DEFAULT
    """Most connections open at once to all receivers together."""
    idle_timeout_s: float = 15.0
    """An idle kept-alive connection is closed after this long."""
    dns_cache_s: float = DNS_CACHE_S
    """Longest time a DNS answer is used before the host is resolved (and vetted) again."""

    def __post_init__(self) -> None:
        problems = []
        if not 1 <= self.connections_per_host <= 65_536:
            problems.append("connections_per_host must be between 1 and 65536")
        if not 1 <= self.connections_total <= 1_000_000:
            problems.append("connections_total must be between 1 and 1000000")
        if not 0 <= self.idle_timeout_s <= 3600:
            problems.append("idle_timeout_s must be between 0 and 3600")
        if not 0 <= self.dns_cache_s <= 300:
            problems.append("dns_cache_s must be between 0 and 300")
        if problems:
            raise ConfigError("; ".join(problems))


class WebhookClientStatistics(msgspec.Struct, frozen=True, kw_only=True):
    """Counters of a :class:`WebhookClient` (:meth:`WebhookClient.statistics`)."""

    requests: int
    """Requests sent (a resend after a failed send on a reused connection counts twice)."""
    connections_opened: int
    """TCP connections made (TLS handshakes included when https)."""
    connections_reused: int
    """Requests sent on a kept-alive connection."""
    connections_open: int
    connections_idle: int
    stale_discarded: int
    """Idle connections found closed (or unreadable) by the receiver when taken."""
    resent: int
    """Requests sent again, on another connection, when provably not processed: the send
    failed on a reused HTTP/1.1 connection, or an HTTP/2 receiver refused the stream
    (``REFUSED_STREAM``, or a GOAWAY below it)."""
    dns_lookups: int
    tls_sessions_resumed: int
    http2_connections_opened: int = 0
    """Of ``connections_opened``, those whose receiver chose HTTP/2 (ALPN ``h2``)."""
    http2_connections_open: int = 0


class Progress:
    """Where a delivery is, for the message of a timeout: ``phase`` and ``address``."""

    __slots__ = ("address", "phase")

    def __init__(self) -> None:
        self.phase = "resolving the host"
        self.address: IPAddress | None = None


PoolKey = tuple[str, str, int, IPAddress, str | None, ssl.SSLContext | None]
"""(scheme, host name, port, vetted address, TLS server name, TLS context)."""
HostKey = tuple[str, int]


class _Connection:
    __slots__ = ("host", "idle_since", "key", "socket", "stream")

    def __init__(
        self,
        key: PoolKey,
        host: _Host,
        stream: trio.SocketStream | trio.SSLStream[trio.SocketStream],
        socket: trio.socket.SocketType,
    ) -> None:
        self.key = key
        self.host = host
        self.stream = stream
        self.socket = socket
        self.idle_since = 0.0


class _Host:
    """Per (host, port): the connection slots and the idle connections, oldest first."""

    __slots__ = ("idle", "open", "slots")

    def __init__(self, limit: int) -> None:
        self.slots = trio.Semaphore(limit)
        self.open = 0
        self.idle: dict[_Connection, None] = {}


class _DnsEntry:
    __slots__ = ("addresses", "error", "expires_at")

    def __init__(
        self, addresses: list[IPAddress], error: OSError | None, expires_at: float
    ) -> None:
        self.addresses = addresses
        self.error = error
        self.expires_at = expires_at


class _Message:
    """One delivery's request, as given to :meth:`WebhookClient.post`."""

    __slots__ = ("body", "body_max_bytes", "headers", "target")

    def __init__(
        self, target: bytes, headers: list[tuple[str, str]], body: bytes, body_max_bytes: int
    ) -> None:
        self.target = target
        self.headers = headers
        self.body = body
        self.body_max_bytes = body_max_bytes


class _SendFailed(Exception):
    """Sending the request failed: the receiver never got all of it."""


def _looks_alive(sock: trio.socket.SocketType) -> bool:
    """Whether an idle HTTP/1.1 connection is still usable: nothing may be readable on it.

    Readable means the receiver closed it (EOF), reset it, or sent bytes nobody asked for;
    any of these makes it unusable. ``poll``, not ``select``: descriptors may pass 1024.
    """
    poller = select.poll()
    try:
        poller.register(sock.fileno(), select.POLLIN | select.POLLPRI)
        return not poller.poll(0)
    except (OSError, ValueError):
        return False


def default_ssl_context() -> ssl.SSLContext:
    """The system's trust store (``SSL_CERT_FILE``/``SSL_CERT_DIR`` honoured); ALPN offers
    HTTP/2, then HTTP/1.1."""
    import httpx  # the same CA bundle choice as before the client was ours

    context = httpx.create_ssl_context(trust_env=True)
    context.set_alpn_protocols(["h2", "http/1.1"])
    return context


class WebhookClient:
    """A pool of kept-alive connections and a DNS cache; one per node.

    Made by :func:`open_webhook_client` (or :func:`default_client`); bound to the trio run
    that made it. :meth:`post` is the one operation.
    """

    def __init__(self, config: WebhookClientConfig) -> None:
        self.config = config
        self._ssl_context: ssl.SSLContext | None = None
        self._hosts: dict[HostKey, _Host] = {}
        self._total_slots = trio.Semaphore(config.connections_total)
        self._open_total = 0
        self._idle: dict[PoolKey, list[_Connection]] = {}
        self._idle_order: dict[_Connection, None] = {}
        self._busy: set[_Connection] = set()
        self._h2_pools: dict[PoolKey, list[H2Connection]] = {}
        """HTTP/2 connections taking streams, by key (each shared by many deliveries)."""
        self._h2_open: dict[H2Connection, PoolKey] = {}
        """Every HTTP/2 connection not ended yet (those retired from the pools included)."""
        self._speaks_h2: dict[PoolKey, bool] = {}
        """What each key's receiver chose by ALPN on the last connection (absent: not known
        yet). Where it chose HTTP/2, or may (https, not known yet), a delivery waits for a
        connection being opened, or for a free stream, rather than opening one of its own:
        a burst to a new receiver opens one connection first, not one per delivery."""
        self._h2_opening: dict[PoolKey, trio.Event] = {}
        self._dns: dict[HostKey, _DnsEntry] = {}
        self._dns_pending: dict[HostKey, trio.Event] = {}
        self._tls_sessions: dict[PoolKey, ssl.SSLSession] = {}
        self._closed = False
        self._reaper_scope = trio.CancelScope()
        self._kept = trio.Event()
        """Set when a DNS answer is kept: the reaper has something to look after again."""
        self._requests = 0
        self._opened = 0
        self._reused = 0
        self._stale = 0
        self._resent = 0
        self._lookups = 0
        self._resumed = 0
        self._h2_opened = 0

    @property
    def ssl_context(self) -> ssl.SSLContext:
        """The default TLS context (built on first use: loading the CA bundle costs ms)."""
        if self._ssl_context is None:
            self._ssl_context = default_ssl_context()
        return self._ssl_context

    def statistics(self) -> WebhookClientStatistics:
        return WebhookClientStatistics(
            requests=self._requests,
            connections_opened=self._opened,
            connections_reused=self._reused,
            connections_open=self._open_total,
            connections_idle=len(self._idle_order),
            stale_discarded=self._stale,
            resent=self._resent,
            dns_lookups=self._lookups,
            tls_sessions_resumed=self._resumed,
            http2_connections_opened=self._h2_opened,
            http2_connections_open=len(self._h2_open),
        )

    # --- the one operation -------------------------------------------------------------

    async def post(
        self,
        *,
        scheme: str,
        host: str,
        port: int,
        target: bytes,
        headers: list[tuple[str, str]],
        body: bytes,
        allow: tuple[IPNetwork, ...],
        body_max_bytes: int,
        ssl_context: ssl.SSLContext | None = None,
        progress: Progress | None = None,
    ) -> WebhookResponse:
        """POST ``body`` to ``target`` on ``host``, through a vetted address.

        ``headers`` must include ``Host``; ``Content-Length`` is added. Addresses are tried
        in resolver order while connecting fails. Raises
        :class:`~engine.handlers.ssrf.AddressRefused` (nothing was sent),
        :class:`ResolveFailed`,
        :class:`ConnectFailed` (no address could be connected to; the message names each),
        :class:`ExchangeFailed`; bound it with a cancel scope.
        """
        if self._closed:
            raise RuntimeError("the webhook client is closed")
        progress = progress or Progress()
        try:
            resolved = await self._resolve(host, port)
        except OSError as error:
            raise ResolveFailed(str(error) or type(error).__name__) from None
        addresses = vet(host, resolved, allow)
        if scheme == "https":
            context: ssl.SSLContext | None = ssl_context or self.ssl_context
            server_name: str | None = host
        else:
            context = server_name = None
        message = _Message(target, headers, body, body_max_bytes)
        failures: list[str] = []
        for address in addresses:
            progress.address = address
            key: PoolKey = (scheme, host, port, address, server_name, context)
            try:
                return await self._post_to(key, message, progress)
            except ConnectFailed as error:
                failures.append(f"{address}: {error}")
        raise ConnectFailed("; ".join(failures))

    async def _post_to(
        self, key: PoolKey, message: _Message, progress: Progress
    ) -> WebhookResponse:
        host = self._host(key[1], key[2])
        resent = False
        while True:
            try:
                return await self._exchange(key, host, message, progress, fresh=resent)
            except StreamRefused as refused:
                # Provably not processed (a GOAWAY, REFUSED_STREAM, a reused HTTP/1.1
                # connection found dead while sending): once more, on another connection.
                if resent:
                    raise ExchangeFailed(f"sending the request failed twice: {refused}") from None
                resent = True
                self._resent += 1

    async def _exchange(
        self, key: PoolKey, host: _Host, message: _Message, progress: Progress, *, fresh: bool
    ) -> WebhookResponse:
        """One exchange: on a shared HTTP/2 connection with a free stream, or on a connection
        of this delivery's own (a kept-alive one unless ``fresh``, or a new one)."""
        while True:
            shared = await self._shared_connection(key, host, progress)
            if shared is not None:
                return await self._exchange_h2(shared, key, message, progress)
            progress.phase = "waiting for a connection slot"
            await host.slots.acquire()
            try:
                await self._total_slots.acquire()
            except BaseException:
                host.slots.release()
                raise
            shared = self._h2_available(key)  # opened while this one waited for a slot
            if shared is None and key not in self._h2_opening:
                # The slots go with the connection: given back after this exchange
                # (HTTP/1.1), or when the connection ends (HTTP/2, shared).
                return await self._exchange_own(key, host, message, progress, fresh=fresh)
            self._release_slots(host)
            if shared is not None:
                return await self._exchange_h2(shared, key, message, progress)
            # Another delivery is opening an HTTP/2 connection to this receiver: wait for it.

    async def _shared_connection(
        self, key: PoolKey, host: _Host, progress: Progress
    ) -> H2Connection | None:
        """An HTTP/2 connection of ``key`` with a free stream, waiting for one (or for the
        connection being opened) when this key speaks HTTP/2 and no slot is free for a new
        connection; ``None``: take a slot (and a kept-alive or new connection)."""
        while True:
            shared = self._h2_available(key)
            if shared is not None:
                return shared
            if not self._may_share(key):
                return None
            pending = self._h2_opening.get(key)
            if pending is not None:
                progress.phase = "waiting for a connection being opened"
                await pending.wait()
                continue
            busy = self._h2_pools.get(key)
            if not busy or (host.slots.value and self._total_slots.value):
                return None  # room for another connection
            progress.phase = "waiting for a free HTTP/2 stream"
            if not await busy[0].wait_available():
                self._retire(busy[0])  # it will take no stream again

    def _may_share(self, key: PoolKey) -> bool:
        """Whether ``key``'s receiver speaks HTTP/2, or may (https, not known yet)."""
        return self._speaks_h2.get(key, key[0] == "https")

    def _h2_available(self, key: PoolKey) -> H2Connection | None:
        for connection in self._h2_pools.get(key, ()):
            if connection.available():
                return connection
        return None

    def _release_slots(self, host: _Host) -> None:
        self._total_slots.release()
        host.slots.release()

    async def _exchange_own(
        self, key: PoolKey, host: _Host, message: _Message, progress: Progress, *, fresh: bool
    ) -> WebhookResponse:
        """One exchange on a connection of this delivery's own (it holds the slots): a
        kept-alive one, or a new one -- which becomes a shared one if it speaks HTTP/2."""
        slots_held = True
        try:
            connection = None if fresh else self._take_idle(key)
            reused = connection is not None
            if connection is None:
                progress.phase = "connecting"
                opening = trio.Event() if self._may_share(key) else None
                if opening is not None:
                    self._h2_opening[key] = opening  # no other is (see _exchange)
                try:
                    opened = await self._connect(key, host)
                finally:
                    if opening is not None and self._h2_opening.get(key) is opening:
                        del self._h2_opening[key]
                        opening.set()
                if isinstance(opened, H2Connection):
                    slots_held = False  # the connection's now, until it ends
                    return await self._exchange_h2(opened, key, message, progress)
                connection = opened
            return await self._exchange_h1(connection, reused, key, host, message, progress)
        finally:
            if slots_held:
                self._release_slots(host)

    async def _exchange_h1(
        self,
        connection: _Connection,
        reused: bool,
        key: PoolKey,
        host: _Host,
        message: _Message,
        progress: Progress,
    ) -> WebhookResponse:
        try:
            request = encode_request(message.target, message.headers, message.body)
        except ValueError as error:
            raise ExchangeFailed(f"the request cannot be sent: {error}") from None
        self._busy.add(connection)
        keep = False
        try:
            try:
                progress.phase = "sending the request"
                await self._send(connection, request)
            except _SendFailed as failed:
                if not reused:
                    raise ExchangeFailed(f"sending the request failed: {failed}") from None
                # The request never left whole: it cannot have been processed.
                raise StreamRefused(f"a kept-alive connection failed: {failed}") from None
            progress.phase = "waiting for the answer"
            response, keep = await self._receive(connection, message.body_max_bytes)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as error:
            raise ExchangeFailed(describe(error)) from None
        except MalformedAnswer as error:
            raise ExchangeFailed(str(error)) from None
        finally:
            self._busy.discard(connection)
            if keep and not self._closed:
                self._release(connection)
            else:
                self._discard(connection)
        return response

    async def _exchange_h2(
        self, connection: H2Connection, key: PoolKey, message: _Message, progress: Progress
    ) -> WebhookResponse:
        authority = next(
            (value for name, value in message.headers if name.lower() == "host"), key[1]
        )
        progress.phase = "waiting for the answer"
        self._requests += 1
        try:
            return await connection.request(
                scheme=key[0],
                authority=authority,
                path=message.target.decode("ascii"),
                headers=message.headers,
                body=message.body,
                body_max_bytes=message.body_max_bytes,
            )
        except ValueError as error:
            raise ExchangeFailed(f"the request cannot be sent over HTTP/2: {error}") from None

    # --- connections -------------------------------------------------------------------

    def _host(self, name: str, port: int) -> _Host:
        host = self._hosts.get((name, port))
        if host is None:
            host = self._hosts[(name, port)] = _Host(self.config.connections_per_host)
        return host

    def _take_idle(self, key: PoolKey) -> _Connection | None:
        pool = self._idle.get(key)
        now = trio.current_time()
        while pool:
            connection = pool.pop()  # the most recently used: the others may time out
            if not pool:
                del self._idle[key]
            del self._idle_order[connection]
            del connection.host.idle[connection]
            if now - connection.idle_since < self.config.idle_timeout_s and _looks_alive(
                connection.socket
            ):
                self._reused += 1
                return connection
            self._stale += 1
            self._close(connection)
        return None

    async def _connect(self, key: PoolKey, host: _Host) -> _Connection | H2Connection:
        """A new connection for ``key`` (it takes the slots the caller holds): HTTP/1.1, or
        a started, pooled HTTP/2 connection when the receiver chose ``h2`` by ALPN."""
        scheme, _, port, address, server_name, context = key
        shared: H2Connection | None = None
        # Make room first, so that neither limit is ever passed: over a limit there is
        # always an idle connection to close, since this delivery holds a slot and none.
        if host.open >= self.config.connections_per_host and host.idle:
            self._evict(next(iter(host.idle)))
        if self._open_total >= self.config.connections_total and self._idle_order:
            self._evict(next(iter(self._idle_order)))
        host.open += 1
        self._open_total += 1
        sock = trio.socket.socket(
            trio.socket.AF_INET6 if address.version == 6 else trio.socket.AF_INET,
            trio.socket.SOCK_STREAM,
        )
        try:
            try:
                await sock.connect((str(address), port))
            except OSError as error:
                raise ConnectFailed(describe(error)) from None
            stream: trio.SocketStream | trio.SSLStream[trio.SocketStream]
            stream = trio.SocketStream(sock)
            if scheme == "https":
                assert context is not None
                tls = trio.SSLStream(
                    stream, context, server_hostname=server_name, https_compatible=True
                )
                session = self._tls_sessions.get(key)
                if session is not None:
                    with contextlib.suppress(ValueError, AttributeError):
                        tls.session = session
                try:
                    await tls.do_handshake()
                except (trio.BrokenResourceError, OSError) as error:
                    raise ConnectFailed(describe(error)) from None
                if tls.session_reused:
                    self._resumed += 1
                stream = tls
                if tls.selected_alpn_protocol() == "h2":
                    shared = H2Connection(tls)
                    await shared.start()  # ConnectFailed (transport closed) if not HTTP/2
        except BaseException:
            sock.close()
            host.open -= 1
            self._open_total -= 1
            raise
        self._opened += 1
        if scheme == "https":
            self._speaks_h2[key] = shared is not None
            if len(self._speaks_h2) > TLS_SESSIONS_MAX:
                del self._speaks_h2[next(iter(self._speaks_h2))]
        if shared is None:
            return _Connection(key, host, stream, sock)
        self._share(shared, key, host)
        if isinstance(stream, trio.SSLStream):
            self._remember_session(key, stream)
        return shared

    # --- shared (HTTP/2) connections ---------------------------------------------------

    def _share(self, connection: H2Connection, key: PoolKey, host: _Host) -> None:
        """Pool a started HTTP/2 connection; it holds the slots of the delivery that opened
        it (one per host, one in total) until it ends."""
        self._h2_opened += 1
        self._h2_pools.setdefault(key, []).append(connection)
        self._h2_open[connection] = key
        connection.idle_since = trio.current_time()
        trio.lowlevel.spawn_system_task(
            self._run_shared, connection, key, host, name="carillon-webhook-http2"
        )

    async def _run_shared(self, connection: H2Connection, key: PoolKey, host: _Host) -> None:
        """The connection's reader, until it ends; then its slots are given back."""
        try:
            await connection.run()
        except Exception as error:  # run() returns at its end; never crash the node for it
            log.error("an HTTP/2 connection to %s ended in error: %s", key[1], describe(error))
        finally:
            connection.close()
            self._retire(connection)
            self._h2_open.pop(connection, None)
            host.open -= 1
            self._open_total -= 1
            self._release_slots(host)

    def _retire(self, connection: H2Connection) -> None:
        """Take ``connection`` out of its pool (no new stream); its streams go on."""
        key = self._h2_open.get(connection)
        if key is None:
            return
        pool = self._h2_pools.get(key)
        if pool is not None and connection in pool:
            pool.remove(connection)
            if not pool:
                del self._h2_pools[key]

    async def _send(self, connection: _Connection, request: bytes) -> None:
        self._requests += 1
        try:
            await connection.stream.send_all(request)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as error:
            raise _SendFailed(describe(error)) from None

    async def _receive(
        self, connection: _Connection, body_max_bytes: int
    ) -> tuple[WebhookResponse, bool]:
        """The answer, and whether the connection may be kept for the next request."""
        reader = ResponseReader(body_max_bytes, RESPONSE_HEAD_BYTES_MAX)
        stream = connection.stream
        while not reader.feed(await stream.receive_some(RECEIVE_BYTES)):
            pass  # b"" is the end of a close-delimited answer, or a cut (MalformedAnswer)
        reusable = reader.reusable
        if reusable and isinstance(stream, trio.SSLStream):
            self._remember_session(connection.key, stream)
        response = WebhookResponse(status=reader.status, headers=reader.headers, body=reader.body)
        return response, reusable

    def _remember_session(self, key: PoolKey, stream: trio.SSLStream[trio.SocketStream]) -> None:
        session = stream.session
        if session is None or self._tls_sessions.get(key) is session:
            return
        if len(self._tls_sessions) >= TLS_SESSIONS_MAX:
            del self._tls_sessions[next(iter(self._tls_sessions))]
        self._tls_sessions[key] = session

    def _release(self, connection: _Connection) -> None:
        connection.idle_since = trio.current_time()
        self._idle.setdefault(connection.key, []).append(connection)
        self._idle_order[connection] = None
        connection.host.idle[connection] = None

    def _evict(self, connection: _Connection) -> None:
        """Close an idle connection."""
        pool = self._idle[connection.key]
        pool.remove(connection)
        if not pool:
            del self._idle[connection.key]
        del self._idle_order[connection]
        del connection.host.idle[connection]
        self._close(connection)

    def _discard(self, connection: _Connection) -> None:
        """Close a connection that was in use."""
        self._busy.discard(connection)
        self._close(connection)

    def _close(self, connection: _Connection) -> None:
        """Close at once (no TLS close_notify: nothing waits on a receiver going away)."""
        if connection.socket.fileno() == -1:
            return
        connection.socket.close()
        connection.host.open -= 1
        self._open_total -= 1

    def close_idle(self) -> int:
        """Close every idle connection (TLS sessions are kept for resumption); how many."""
        idle = list(self._idle_order)
        for connection in idle:
            self._evict(connection)
        return len(idle)

    def reap_idle(self) -> int:
        """Close idle connections past ``idle_timeout_s``; return how many."""
        limit = trio.current_time() - self.config.idle_timeout_s
        expired = [c for c in self._idle_order if c.idle_since <= limit]
        for connection in expired:
            self._evict(connection)
        for shared in list(self._h2_open):
            if not shared.in_flight and shared.idle_since <= limit:
                shared.close()  # its reader ends, then gives its slots back
                self._retire(shared)
        for name, host in list(self._hosts.items()):
            if not host.open and host.slots.value == self.config.connections_per_host:
                del self._hosts[name]
        now = trio.current_time()
        for name, entry in list(self._dns.items()):
            if entry.expires_at <= now:
                del self._dns[name]
        return len(expired)

    # --- DNS ---------------------------------------------------------------------------

    async def _resolve(self, host: str, port: int) -> list[IPAddress]:
        """``host``'s addresses, from the cache if fresh; one lookup at a time per host."""
        name = (host, port)
        while True:
            entry = self._dns.get(name)
            if entry is not None and entry.expires_at > trio.current_time():
                break
            pending = self._dns_pending.get(name)
            if pending is not None:
                await pending.wait()
                continue
            pending = self._dns_pending[name] = trio.Event()
            try:
                entry = await self._lookup(host, port)
            finally:
                del self._dns_pending[name]
                pending.set()
            break
        if entry.error is not None:
            raise type(entry.error)(*entry.error.args)
        return entry.addresses

    async def _lookup(self, host: str, port: int) -> _DnsEntry:
        self._lookups += 1
        try:
            addresses = await resolve(host, port)
        except OSError as error:
            ttl = min(self.config.dns_cache_s, DNS_FAILURE_CACHE_S)
            entry = _DnsEntry([], error, trio.current_time() + ttl)
        else:
            entry = _DnsEntry(addresses, None, trio.current_time() + self.config.dns_cache_s)
        previous = self._dns.pop((host, port), None)
        if len(self._dns) >= DNS_CACHE_ENTRIES:
            del self._dns[next(iter(self._dns))]
        self._dns[(host, port)] = entry
        self._kept.set()
        if previous is not None and previous.addresses != entry.addresses:
            # The answer changed: idle connections to addresses it no longer names go.
            for connection in [c for c in self._idle_order if c.key[1:3] == (host, port)]:
                if connection.key[3] not in entry.addresses:
                    self._evict(connection)
            for shared, key in list(self._h2_open.items()):
                if key[1:3] == (host, port) and key[3] not in entry.addresses:
                    self._retire(shared)  # its streams finish; then it is idle and reaped
        return entry

    # --- life ----------------------------------------------------------------------------

    async def run_reaper(self) -> None:
        """Close expired idle connections every second, until cancelled; while the client
        keeps nothing (no connection, host or DNS answer), wait for its next lookup instead
        (a node without webhooks does not wake for this every second)."""
        while True:
            if not (self._idle_order or self._h2_open or self._hosts or self._dns):
                self._kept = trio.Event()
                await self._kept.wait()
            await trio.sleep(REAP_INTERVAL_S)
            self.reap_idle()

    def close(self) -> None:
        """Close every connection; deliveries still running fail (their sockets close)."""
        self._closed = True
        self._reaper_scope.cancel()
        for connection in list(self._idle_order):
            self._evict(connection)
        for connection in list(self._busy):
            self._discard(connection)
        for shared in list(self._h2_open):
            shared.close()  # open streams fail; its reader ends and gives its slots back
            self._retire(shared)


@asynccontextmanager
async def open_webhook_client(
    config: WebhookClientConfig | None = None,
) -> AsyncIterator[WebhookClient]:
    """The node's webhook client for the duration of the block; closes every connection.

    The idle reaper runs as a trio system task (not in a nursery of this block), so an
    exception from the block comes out as itself, not wrapped in an exception group.
    """
    client = WebhookClient(config or WebhookClientConfig())
    trio.lowlevel.spawn_system_task(_reap_until_closed, client, name="carillon-webhook-reaper")
    try:
        yield client
    finally:
        client.close()


_DEFAULT: Final[trio.lowlevel.RunVar[WebhookClient]] = trio.lowlevel.RunVar(
    "carillon_webhook_client"
)


def default_client() -> WebhookClient:
    """The webhook client of handlers built without one: one per trio run, made on first
    use and closed when the run ends (by the system task that reaps its idle connections)."""
    try:
        return _DEFAULT.get()
    except LookupError:
        pass
    client = WebhookClient(WebhookClientConfig())
    _DEFAULT.set(client)
    trio.lowlevel.spawn_system_task(_reap_until_closed, client, name="carillon-webhook-client")
    return client


async def _reap_until_closed(client: WebhookClient) -> None:
    """Reap idle connections until the client closes, or the run ends (then close it)."""
    try:
        with client._reaper_scope:
            await client.run_reaper()
    finally:
        client.close()
