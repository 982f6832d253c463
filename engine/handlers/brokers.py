"""The broker bridge: the node's message-broker clients, on an asyncio loop of their own.

The broker clients Carillon uses (redis-py's asyncio client, nats-py, aio-pika) speak only
asyncio; the engine speaks trio. They run where asyncpg runs, behind the same primitive
(:mod:`engine.ledger.bridge`): a daemon thread with a uvloop event loop, which trio code
hands one coroutine per unit of work (one publish) and sleeps until it is done. It is a
*second* bridge, on its own thread (``carillon-broker-bridge``), so a slow broker never
queues behind the database's hops, nor the database behind a broker.

What it keeps, and the invariants:

* **Clients pooled per key.** A handler names its client by a key made from its *vetted*
  settings (kind, URL and credentials, the vetted address it connects to); every publish
  with the same key shares one client and its connections, whichever task type sent it.
  Connecting happens once per key even when many publishes ask at once: they all await the
  same connect. A connect that fails is forgotten, so the next publish connects anew.
* **Everything broker-side runs on the loop thread.** ``connect`` and ``op`` are called
  there, the client never leaves it; the trio side only sees results and exceptions,
  which propagate unchanged.
* **Cancellation reaches the asyncio side.** A trio cancellation (the attempt's timeout,
  the attempt abandoned, the node stopping) cancels the asyncio task of the publish, and the
  trio caller returns only once it has unwound (the bridge's rule): the client library
  gives the connection back (or discards it) in its own ``finally``, so no connection slot
  outlives its publish.
* **Re-established after a broker restart.** The client libraries reconnect a dropped
  connection themselves (each handler says how); a client whose connect failed, or which
  says it is no longer :meth:`~BrokerClient.usable` (closed for good), is replaced at the
  next publish.
* **Idle clients are closed**: one not used for ``idle_close_s`` (its settings changed, its
  host now resolves elsewhere) is closed at the next publish.
* **Shared by the kinds**: besides the bridge, what every broker kind does the same way
  lives here: the broker's host resolved and vetted (:class:`BrokerHost`), and the
  ``X-Carillon-*`` context headers a message carries (:func:`context_headers`).
* **Closed with the owner.** :meth:`BrokerBridge.aclose` closes every client and then the
  thread; a publish after that raises :class:`RuntimeError`. The pipeline owns the node's
  bridge, so a restarted pipeline starts with a fresh one (and fresh connections). The
  thread starts on the first publish: a node without broker task types runs none.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable, Iterable
from contextlib import asynccontextmanager
from typing import Any, Final, Protocol, TypeVar, cast
from urllib.parse import SplitResult, urlsplit

import msgspec
import trio

from engine.core.instants import format_utc
from engine.errors import InvalidField
from engine.handlers.base import ExecutionContext, HandlerResult
from engine.handlers.ssrf import AddressRefused, IPAddress, parse_allow_list, resolve, vet
from engine.handlers.webhook import URL_CHARS_MAX
from engine.ledger.bridge import BRIDGE_SHUTDOWN_TIMEOUT_S, DatabaseBridge, start_bridge
from engine.tracing import trace_headers

__all__ = [
    "THREAD_NAME",
    "BrokerBridge",
    "BrokerBridgeStatistics",
    "BrokerClient",
    "BrokerHost",
    "context_headers",
    "open_broker_bridge",
]

log = logging.getLogger("carillon.brokers")

THREAD_NAME: Final = "carillon-broker-bridge"
IDLE_CLOSE_S_DEFAULT: Final = 300.0
"""A client unused this long is closed (at the next publish through the bridge)."""
CLOSE_TIMEOUT_S: Final = 2.0
"""How long closing one client may take before it is abandoned."""
DNS_CACHE_S: Final = 15.0
"""How long a broker host's DNS answers are reused (they are vetted again at every use)."""
ALLOW_FLAG: Final = "--broker-allow-cidrs"
_WHO: Final = {"who": "Broker task types", "flag": ALLOW_FLAG}


class BrokerClient(Protocol):
    """What the bridge needs of a client (called on the loop thread)."""

    def usable(self) -> bool:
        """False once the client is closed for good (its library gave up reconnecting): the
        bridge then replaces it with a new one."""
        ...

    async def aclose(self) -> None: ...


ClientT = TypeVar("ClientT", bound=BrokerClient)
T = TypeVar("T")


class BrokerBridgeStatistics(msgspec.Struct, frozen=True, kw_only=True):
    """Counters of a :class:`BrokerBridge` (read on the trio side; a snapshot)."""

    started: bool
    """Whether the loop thread runs (it starts with the first publish)."""
    clients: int
    """Clients held now (connected or connecting)."""
    connects: int
    """Clients made (each a connect, successful or not)."""
    closed: int
    """Clients closed: idle, failed to connect, or at shutdown."""
    in_use: int
    """Publishes running on the loop now."""


class _Entry:
    """One pooled client (loop thread only)."""

    __slots__ = ("client", "last_used", "users")

    def __init__(self, client: asyncio.Future[BrokerClient], now: float) -> None:
        self.client = client
        self.users = 0
        self.last_used = now


class BrokerBridge:
    """The node's broker clients on their own asyncio loop (see the module docstring).

    Made by :func:`open_broker_bridge`; bound to the trio run that made it.
    """

    def __init__(
        self,
        *,
        idle_close_s: float = IDLE_CLOSE_S_DEFAULT,
        thread_name: str = THREAD_NAME,
        shutdown_timeout_s: float = BRIDGE_SHUTDOWN_TIMEOUT_S,
    ) -> None:
        self._idle_close_s = idle_close_s
        self._thread_name = thread_name
        self._shutdown_timeout_s = shutdown_timeout_s
        self._bridge: DatabaseBridge | None = None
        self._closed = False
        # Written on the loop thread only; read from trio as snapshots (ints, one dict).
        self._clients: dict[Hashable, _Entry] = {}
        self._closing: set[asyncio.Task[None]] = set()
        self._connects = 0
        self._closes = 0
        self._in_use = 0

    @property
    def closed(self) -> bool:
        """Whether :meth:`aclose` has begun: publishes are refused from then on."""
        return self._closed

    def statistics(self) -> BrokerBridgeStatistics:
        return BrokerBridgeStatistics(
            started=self._bridge is not None,
            clients=len(self._clients),
            connects=self._connects,
            closed=self._closes,
            in_use=self._in_use,
        )

    async def run(
        self,
        key: Hashable,
        connect: Callable[[], Awaitable[ClientT]],
        op: Callable[[ClientT], Awaitable[T]],
    ) -> T:
        """``await op(client)`` on the loop thread, with the client pooled under ``key``
        (made by ``await connect()`` there if there is none).

        A checkpoint. Exceptions from ``connect`` and ``op`` propagate unchanged; a
        cancellation cancels them and returns once they have unwound. ``connect`` must bound
        its own time (a connect timeout): publishes that share it wait for it. Raises
        :class:`RuntimeError` once the bridge is closed.
        """
        return await self._started().call(self._run, key, connect, op)

    async def run_unpooled(self, op: Callable[[], Awaitable[T]]) -> T:
        """``await op()`` on the loop thread, outside the pool: for a one-off exchange (a
        look at a broker when a task type is written) that makes and closes its own
        connection, so no client lingers after it. Exceptions and cancellation as
        :meth:`run`; :class:`RuntimeError` once the bridge is closed."""
        return await self._started().call(op)

    def _started(self) -> DatabaseBridge:
        """The loop thread, started now if it is not yet."""
        if self._closed:
            raise RuntimeError("the broker bridge is closed")
        bridge = self._bridge
        if bridge is None:
            bridge = self._bridge = start_bridge(
                thread_name=self._thread_name, shutdown_timeout_s=self._shutdown_timeout_s
            )
        return bridge

    async def aclose(self) -> None:
        """Close every client, then the loop thread. Idempotent; shielded from cancellation."""
        if self._closed:
            return
        self._closed = True
        bridge = self._bridge
        if bridge is None:
            return
        with trio.CancelScope(shield=True):
            with contextlib.suppress(RuntimeError):
                await bridge.call(self._close_all)
            await bridge.aclose()

    # --- loop thread -------------------------------------------------------------------

    async def _run(
        self,
        key: Hashable,
        connect: Callable[[], Awaitable[ClientT]],
        op: Callable[[ClientT], Awaitable[T]],
    ) -> T:
        loop = asyncio.get_running_loop()
        self._close_idle(loop.time())
        entry = self._entry(key, connect)
        entry.users += 1
        self._in_use += 1
        try:
            # Shielded: a cancelled publish leaves the shared connect to the others.
            # The entry under this key was made by a connect of this key's client type.
            client = cast(ClientT, await asyncio.shield(entry.client))
            if not client.usable():
                # Closed for good (its library gave up on it): replace it, once.
                self._discard(key, entry)
                entry.users -= 1
                entry = self._entry(key, connect)
                entry.users += 1
                client = cast(ClientT, await asyncio.shield(entry.client))
            return await op(client)
        finally:
            entry.users -= 1
            self._in_use -= 1
            entry.last_used = loop.time()

    def _entry(self, key: Hashable, connect: Callable[[], Awaitable[BrokerClient]]) -> _Entry:
        entry = self._clients.get(key)
        if entry is None:
            loop = asyncio.get_running_loop()
            connecting = loop.create_task(self._connect(key, connect))
            connecting.add_done_callback(_retrieve)
            entry = self._clients[key] = _Entry(connecting, loop.time())
            self._connects += 1
        return entry

    def _discard(self, key: Hashable, entry: _Entry) -> None:
        """Close ``entry``'s client in the background, if it is still the one under ``key``."""
        if self._clients.get(key) is entry:
            del self._clients[key]
            task = asyncio.get_running_loop().create_task(self._close_one(entry))
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    async def _connect(
        self, key: Hashable, connect: Callable[[], Awaitable[ClientT]]
    ) -> BrokerClient:
        try:
            return await connect()
        except BaseException:
            # Forget it, so the next publish connects anew (a broker that was down).
            entry = self._clients.get(key)
            if entry is not None and entry.client is asyncio.current_task():
                del self._clients[key]
                self._closes += 1
            raise

    def _close_idle(self, now: float) -> None:
        idle = [
            key
            for key, entry in self._clients.items()
            if entry.users == 0 and now - entry.last_used >= self._idle_close_s
        ]
        for key in idle:
            self._discard(key, self._clients[key])

    async def _close_one(self, entry: _Entry) -> None:
        self._closes += 1
        future = entry.client
        if not future.done():
            future.cancel()
            return
        if future.cancelled() or future.exception() is not None:
            return
        try:
            await asyncio.wait_for(future.result().aclose(), CLOSE_TIMEOUT_S)
        except Exception as exc:  # a client that cannot close cleanly is dropped anyway
            log.warning("closing a broker client failed: %s", type(exc).__name__)

    async def _close_all(self) -> None:
        entries = list(self._clients.values())
        self._clients.clear()
        await asyncio.gather(*(self._close_one(entry) for entry in entries))
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)


def _retrieve(future: asyncio.Future[BrokerClient]) -> None:
    """Mark a failed connect's exception as seen: every waiter got it, or gave up waiting."""
    if not future.cancelled():
        future.exception()


@asynccontextmanager
async def open_broker_bridge(
    *, idle_close_s: float = IDLE_CLOSE_S_DEFAULT
) -> AsyncIterator[BrokerBridge]:
    """A :class:`BrokerBridge` for the block; its clients and thread are closed on exit."""
    brokers = BrokerBridge(idle_close_s=idle_close_s)
    try:
        yield brokers
    finally:
        await brokers.aclose()


class BrokerHost:
    """A broker kind's host, resolved and vetted like a webhook's (:mod:`engine.handlers.ssrf`)
    with the node's ``--broker-allow-cidrs``: the client connects to the vetted address
    itself, never to the name, so a DNS answer cannot change between the check and the
    connect. Answers are cached :data:`DNS_CACHE_S` and vetted again at every use."""

    def __init__(self, host: str, port: int, allow_cidrs: Iterable[str]) -> None:
        self.host = host
        self.port = port
        self._allow = parse_allow_list(allow_cidrs)
        self._literal: IPAddress | None
        try:
            self._literal = ipaddress.ip_address(host)
        except ValueError:
            self._literal = None
        self._resolved: tuple[float, list[IPAddress]] | None = None

    async def addresses(self) -> list[IPAddress]:
        """The host's vetted addresses; :class:`~engine.handlers.ssrf.AddressRefused` when
        one is not allowed, :class:`OSError` when the name does not resolve."""
        if self._literal is not None:
            return vet(self.host, [self._literal], self._allow, **_WHO)
        now = trio.current_time()
        cached = self._resolved
        if cached is None or cached[0] <= now:
            addresses = await resolve(self.host, self.port)
            cached = self._resolved = (now + DNS_CACHE_S, addresses)
        return vet(self.host, cached[1], self._allow, **_WHO)

    async def address(self) -> IPAddress | HandlerResult:
        """The address to connect to, or the attempt's failure: ``ssrf_refused``
        (permanent), ``dns_error`` (transient)."""
        try:
            return (await self.addresses())[0]
        except AddressRefused as refused:
            return HandlerResult.permanent("ssrf_refused", str(refused))
        except OSError as error:
            return HandlerResult.transient("dns_error", f"could not resolve {self.host}: {error}")


def context_headers(context: ExecutionContext) -> dict[str, str]:
    """The execution's context as the message headers every broker kind sends (the
    webhook's, plus the tenant): ``X-Carillon-Execution-Id``, ``-Schedule-Id``,
    ``-Tenant-Id``, ``-Planned-At`` (RFC 3339 UTC), ``-Attempt``, ``-Fencing-Token``; and
    with tracing on ``traceparent`` (and ``tracestate``), the attempt's W3C trace context."""
    return {
        "X-Carillon-Execution-Id": context.execution_id,
        "X-Carillon-Schedule-Id": context.schedule_id,
        "X-Carillon-Tenant-Id": context.tenant_id,
        "X-Carillon-Planned-At": format_utc(context.planned_at),
        "X-Carillon-Attempt": str(context.attempt),
        "X-Carillon-Fencing-Token": str(context.fencing_token),
        **trace_headers(),
    }


class BrokerPublisher:
    """What every broker kind's handler does around its own publish: the attempt's timeout,
    the node's bridge, the vetted address, and its failures classified. A kind supplies
    its pool key, its connect coroutine and its publish (run on the bridge's loop), what a
    timeout says, and how its client's errors classify (:meth:`_failure`)."""

    kind: str
    timeout_s: float
    _brokers: BrokerBridge | None
    _host: BrokerHost

    async def run(self, context: ExecutionContext) -> HandlerResult:
        with trio.move_on_after(self.timeout_s):
            return await self._publish(context)
        return HandlerResult.transient("timeout", self._timed_out())

    async def _publish(self, context: ExecutionContext) -> HandlerResult:
        brokers = self._brokers
        if brokers is None:
            return HandlerResult.unknown(
                "setup_error", f"the {self.kind} handler was built without the node's broker bridge"
            )
        address = await self._host.address()
        if isinstance(address, HandlerResult):
            return address
        try:
            await brokers.run(self._key(address), self._connector(address), self._op(context))
        except Exception as error:
            failure = self._failure(error)
            if failure is None:
                raise
            return failure
        return HandlerResult.succeeded()

    def _timed_out(self) -> str:
        """The message of an attempt whose publish outlived its timeout."""
        raise NotImplementedError

    def _key(self, address: IPAddress) -> Hashable:
        """The bridge's pool key: the vetted settings and ``address``."""
        raise NotImplementedError

    def _connector(self, address: IPAddress) -> Any:
        """The coroutine that connects a client to ``address`` (on the bridge's loop)."""
        raise NotImplementedError

    def _op(self, context: ExecutionContext) -> Any:
        """The publish of ``context`` with a connected client (on the bridge's loop)."""
        raise NotImplementedError

    def _failure(self, error: Exception) -> HandlerResult | None:
        """The attempt's result for a failed publish, or None for an error that is not the
        broker's (a bug: it propagates to the handler wall)."""
        raise NotImplementedError


def split_broker_url(
    kind: str, text: object, schemes: tuple[str, str], said: str
) -> tuple[SplitResult, str]:
    """``text`` split as a URL of one of ``schemes`` (plain, then TLS; ``said``: how a refusal
    names them) with a host and a valid port, and that host; :class:`InvalidField` saying
    what is wrong, never repeating the URL (it may carry credentials). What the path and the
    query may hold is each kind's own check."""
    if not isinstance(text, str) or len(text) > URL_CHARS_MAX:
        raise InvalidField(f"{kind} handler: url must be a string of at most {URL_CHARS_MAX} chars")
    try:
        parts = urlsplit(text)
        parts.port  # noqa: B018 -- raises ValueError for a port out of range
    except ValueError as error:
        raise InvalidField(f"{kind} handler: url is not a valid URL ({error})") from None
    if parts.scheme not in schemes:
        raise InvalidField(
            f"{kind} handler: url must start with {said}, "
            f"got {parts.scheme + '://' if parts.scheme else 'no scheme'}"
        )
    if not parts.hostname:
        raise InvalidField(f"{kind} handler: url names no host")
    return parts, parts.hostname


def bracketed(host: str) -> str:
    """``host`` as a URL shows it: an IPv6 address in brackets."""
    return f"[{host}]" if ":" in host else host
