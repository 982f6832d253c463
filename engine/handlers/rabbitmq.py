"""The ``rabbitmq`` handler: publish each execution to a RabbitMQ exchange, confirmed.

Settings (``docs/targets.md``, "rabbitmq"): ``url`` (``amqp://`` or ``amqps://``, optional
``user:password@``, optional ``/vhost``), ``exchange`` (``""``, the default: the default
exchange, which routes by queue name), ``routing_key``, optional ``mandatory`` (true),
``headers`` (extra message headers) and ``timeout_s`` (30 s).

**Once per attempt, deduplicated by the consumer.** Every attempt publishes one persistent
message (``delivery_mode`` 2) with ``message_id`` = the execution id, on a channel in
publisher-confirm mode, and waits for the broker's confirm: an ack is a success, a nack a
transient failure (the retry publishes again). RabbitMQ has no broker-side deduplication, so
a retry whose first publish was stored after all (its confirm lost with the connection), or
a redelivery after a node crashed mid-publish, stores a second message with the same
``message_id``: consumers drop repeats by ``message_id`` (the recipe in
``docs/targets.md``, "rabbitmq"). With ``mandatory`` (the default) a message no queue takes
comes back (``basic.return``, ``NO_ROUTE``) and the attempt fails for good
(``rabbitmq_unroutable``); without it RabbitMQ drops such a message and confirms it.

The body is the webhook's JSON body (the context and the payload, ``content_type``
``application/json``); the headers carry the context too (``X-Carillon-Execution-Id``,
``-Schedule-Id``, ``-Tenant-Id``, ``-Planned-At``, ``-Attempt``, ``-Fencing-Token``) after
the task type's own ``headers``, which may not use those names.

**Where it runs.** aio-pika on the node's broker bridge (:mod:`engine.handlers.brokers`):
one connection per vetted settings, shared by every task type with them, and on it a few
confirm-mode channels per exchange (the broker closes a channel for one publish's error,
failing all in flight on it: other exchanges' publishes are not among them). Publishes share
a channel (confirms are matched by delivery tag), but never two with the same
``message_id`` at once, since the client matches a returned message to its publish by
``message_id``: a second concurrent publish of an execution takes another channel. A
channel the broker closed (a missing exchange, a refused permission) is replaced at the next
publish; a connection that dropped (a broker restart, a forced close) fails the publishes in
flight (transient) and is replaced by a new one at the next publish, by the bridge. The
attempt's timeout and any cancellation cancel the publish on the loop.

**SSRF**: as the other broker kinds (:class:`~engine.handlers.brokers.BrokerHost`): the
host is resolved, every address vetted with ``--broker-allow-cidrs``, the client connects to
the vetted address (``amqps://`` keeps the host name for the certificate).

**Failures.** ``ssrf_refused`` (permanent), ``dns_error``, ``rabbitmq_connection_error``
(refused, reset, closed by the broker), ``timeout``, ``rabbitmq_nack``,
``rabbitmq_channel_closed`` (transient), ``rabbitmq_unroutable``, ``rabbitmq_auth_error``,
``rabbitmq_access_refused``, ``rabbitmq_not_found`` (no such exchange),
``rabbitmq_precondition_failed`` (a message above the broker's size limit), ``rabbitmq_error``
(permanent).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import secrets
import ssl
from collections.abc import AsyncIterator, Mapping
from typing import Any, Final
from urllib.parse import unquote

import aio_pika
import aio_pika.abc
import aiormq
import aiormq.connection
import aiormq.exceptions
import msgspec
import pamqp.exceptions
from pamqp import commands as spec
from yarl import URL

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
    context_headers,
    split_broker_url,
)
from engine.handlers.ssrf import IPAddress
from engine.handlers.webhook import request_body

log = logging.getLogger("carillon.brokers")

__all__ = [
    "RabbitmqHandler",
    "RabbitmqSettings",
    "RabbitmqTarget",
    "parse_rabbitmq_url",
]

NAME_BYTES_MAX: Final = 255
"""AMQP's short strings: exchange names and routing keys."""
HEADERS_MAX: Final = 32
HEADER_VALUE_CHARS_MAX: Final = 4096
CONNECT_TIMEOUT_S: Final = 5.0
"""A connect's own bound (on the loop): every publish sharing the connection waits for it."""
NO_ROUTE: Final = 312
_EXCHANGE: Final = re.compile(r"^[A-Za-z0-9_.:-]{0,255}$")
_HEADER_NAME: Final = re.compile(r"^[!-~]{1,128}$")
_RESERVED_HEADER_PREFIX: Final = "x-carillon-"
_PERSISTENT: Final = 2


class RabbitmqSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    url: str
    routing_key: str
    exchange: str = ""
    """``""``: the default exchange (the routing key names the queue)."""
    mandatory: bool = True
    """A message no queue takes is returned (a permanent failure), not dropped."""
    headers: dict[str, str] = msgspec.field(default_factory=dict)
    timeout_s: float = TIMEOUT_S_DEFAULT


class RabbitmqTarget(msgspec.Struct, frozen=True, kw_only=True):
    """A parsed ``amqp://`` URL."""

    tls: bool
    host: str
    port: int
    vhost: str
    user: str | None
    password: str | None

    @property
    def display(self) -> str:
        """The URL without its credentials: what error messages and logs show."""
        host = bracketed(self.host)
        vhost = "" if self.vhost == "/" else self.vhost
        return f"{'amqps' if self.tls else 'amqp'}://{host}:{self.port}/{vhost}"


def parse_rabbitmq_url(text: str) -> RabbitmqTarget:
    """``text`` as an AMQP URL; :class:`InvalidField` saying what is wrong (never the URL,
    which may carry credentials)."""
    parts, host = split_broker_url("rabbitmq", text, ("amqp", "amqps"), "amqp:// or amqps:// (TLS)")
    port = parts.port
    if parts.query or parts.fragment:
        raise InvalidField(
            "rabbitmq handler: url must not have a query or fragment (TLS is the scheme "
            "amqps://, the virtual host the path, everything else a setting of the handler)"
        )
    path = parts.path[1:] if parts.path.startswith("/") else parts.path
    if "/" in path:
        raise InvalidField(
            "rabbitmq handler: the url's path is the virtual host, with any '/' in its name "
            "written %2F (amqp://host/%2F is the vhost '/')"
        )
    vhost = unquote(path) if path else "/"
    if len(vhost.encode()) > NAME_BYTES_MAX:
        raise InvalidField(f"rabbitmq handler: the virtual host is over {NAME_BYTES_MAX} bytes")
    return RabbitmqTarget(
        tls=parts.scheme == "amqps",
        host=host,
        port=port or (5671 if parts.scheme == "amqps" else 5672),
        vhost=vhost,
        user=unquote(parts.username) if parts.username else None,
        password=unquote(parts.password) if parts.password is not None else None,
    )


def check_exchange(exchange: str) -> str:
    if not isinstance(exchange, str) or not _EXCHANGE.match(exchange):
        raise InvalidField(
            f"rabbitmq handler: exchange must be 0-{NAME_BYTES_MAX} letters, digits, '-', '_', "
            "'.' or ':' (an exchange name; '' for the default exchange)"
        )
    return exchange


def check_routing_key(routing_key: str, exchange: str) -> str:
    if len(routing_key.encode()) > NAME_BYTES_MAX:
        raise InvalidField(f"rabbitmq handler: routing_key must be at most {NAME_BYTES_MAX} bytes")
    if not exchange and not routing_key:
        raise InvalidField(
            "rabbitmq handler: routing_key must name a queue when exchange is the default "
            "exchange ('')"
        )
    return routing_key


def check_headers(headers: Mapping[str, str]) -> dict[str, str]:
    if len(headers) > HEADERS_MAX:
        raise InvalidField(f"rabbitmq handler: at most {HEADERS_MAX} extra headers")
    for name, value in headers.items():
        if not _HEADER_NAME.match(name):
            raise InvalidField(
                f"rabbitmq handler: header name {name!r} must be 1-128 printable ASCII "
                "characters without spaces"
            )
        if name.lower().startswith(_RESERVED_HEADER_PREFIX):
            raise InvalidField(
                f"rabbitmq handler: header {name!r} is reserved: Carillon sets the X-Carillon-* "
                "headers itself"
            )
        if len(value) > HEADER_VALUE_CHARS_MAX:
            raise InvalidField(
                f"rabbitmq handler: the value of header {name!r} is over "
                f"{HEADER_VALUE_CHARS_MAX} characters"
            )
    return dict(headers)


class _Channel:
    """A confirm-mode channel and the message ids being published on it now."""

    def __init__(self, channel: aio_pika.abc.AbstractChannel) -> None:
        self.channel = channel
        self.in_flight: set[str] = set()

    def open(self) -> bool:
        return not self.channel.is_closed


class _Transport(aiormq.connection.TransportFactory):
    """Opens the connection's socket to the vetted address (``url``'s host), checking the TLS
    certificate of ``tls_name``; keeps the socket, so closing the client closes it even when
    the client library does not (it leaves the socket of a connection the broker closed)."""

    def __init__(self, tls_name: str | None) -> None:
        self.tls_name = tls_name
        self.writer: asyncio.StreamWriter | None = None

    async def create(
        self, url: URL, **kwargs: Any
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        provider = kwargs.pop("ssl_context_provider")
        tls: dict[str, Any] = {}
        if self.tls_name is not None:
            tls = {"ssl": await provider.get_context(), "server_hostname": self.tls_name}
        try:
            reader, writer = await asyncio.open_connection(
                host=url.host, port=url.port, **tls, **kwargs
            )
        except OSError as error:
            raise aiormq.exceptions.AMQPConnectionError(*error.args) from error
        self.writer = writer
        return reader, writer

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


class _Client:
    """A connection and its confirm-mode channels (on the broker bridge's loop)."""

    def __init__(
        self, connection: aio_pika.abc.AbstractConnection, transport: _Transport, name: str
    ) -> None:
        self.connection = connection
        self.transport = transport
        self.name = name
        self.channels: dict[str, list[_Channel]] = {}
        """By exchange: the broker closes a channel for an error of one publish (a missing
        exchange, a refused permission), failing every publish in flight on it, so those of
        other exchanges (other task types) never share one."""
        self._opening = asyncio.Lock()
        self.exchanges_seen: set[str] = set()
        """Exchanges found to exist (once per connection, before a channel publishes to
        them)."""

    def usable(self) -> bool:
        # Dropped (a broker restart, a forced close): aio-pika's plain connection does not
        # come back, so the bridge replaces it.
        return self.connection.connected.is_set() and not self.connection.is_closed

    async def aclose(self) -> None:
        try:
            await self.connection.close()
        finally:
            self.transport.close()

    @contextlib.asynccontextmanager
    async def failing_when_closed(self) -> AsyncIterator[None]:
        """Run the block, failing it with :class:`~aiormq.exceptions.AMQPConnectionError` as
        soon as the connection closes: the client library leaves a publish whose connection
        dropped under it waiting for a write that never comes."""
        transport = self.connection.transport
        if transport is None or transport.connection.is_closed:
            raise aiormq.exceptions.AMQPConnectionError("the connection is closed")
        closing: asyncio.Future[Any] = transport.connection.closing
        current = asyncio.current_task()
        assert current is not None
        closed_under = False

        def closed(_: asyncio.Future[Any]) -> None:
            nonlocal closed_under
            closed_under = True
            current.cancel()

        closing.add_done_callback(closed)
        try:
            yield
        except asyncio.CancelledError:
            if not closed_under:
                raise
            current.uncancel()
            raise aiormq.exceptions.AMQPConnectionError(
                "the connection closed during the publish"
            ) from None
        finally:
            closing.remove_done_callback(closed)

    async def _check_exchange(self, exchange: str) -> None:
        """Raise :class:`~aiormq.exceptions.ChannelNotFoundEntity` if ``exchange`` does not
        exist: asked on a channel of its own, used for nothing else. A publish to a missing
        exchange would have the broker close the publishing channel, and the client library
        may still write other publishes on it after the close, which the broker answers by
        closing the whole connection (``504 CHANNEL_ERROR``): every task type's publishes on
        it would fail."""
        channel = await self.connection.channel(publisher_confirms=False)
        try:
            await channel.declare_exchange(exchange, passive=True)
        finally:
            if not channel.is_closed:
                await channel.close()

    async def channel_for(self, exchange: str, message_id: str) -> _Channel:
        """An open channel for publishing to ``exchange`` that is not publishing
        ``message_id`` now (opened if there is none)."""
        channels = self.channels[exchange] = [
            c for c in self.channels.get(exchange, []) if c.open()
        ]
        for channel in channels:
            if message_id not in channel.in_flight:
                return channel
        async with self._opening:
            if exchange and exchange not in self.exchanges_seen:
                await self._check_exchange(exchange)
                self.exchanges_seen.add(exchange)
            channels = self.channels[exchange] = [
                c for c in self.channels.get(exchange, []) if c.open()
            ]
            for channel in channels:  # opened meanwhile by another publish
                if message_id not in channel.in_flight:
                    return channel
            opened = _Channel(
                await self.connection.channel(publisher_confirms=True, on_return_raises=True)
            )
            channels.append(opened)
            return opened


async def connection_name(client: _Client) -> str:
    """The name the client's connection gave the broker, as a bridge operation (tests find
    the connection broker-side by it)."""
    return client.name


class RabbitmqHandler(BrokerPublisher):
    """Publishes each attempt to one exchange with one routing key; build it with
    :func:`engine.handlers.build_handler`."""

    kind = "rabbitmq"

    def __init__(
        self,
        settings: Mapping[str, Any],
        *,
        options: HandlerOptions,
        brokers: BrokerBridge | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        parsed = parse_settings("rabbitmq", settings, RabbitmqSettings)
        self._target = parse_rabbitmq_url(parsed.url)
        self._exchange = check_exchange(parsed.exchange)
        self._routing_key = check_routing_key(parsed.routing_key, self._exchange)
        self._mandatory = parsed.mandatory
        self._headers = check_headers(parsed.headers)
        self.timeout_s = check_timeout_s("rabbitmq", parsed.timeout_s)
        self._ssl_context = ssl_context
        """Replaces the system's trust store for ``amqps`` (clients made with it are pooled
        apart)."""
        self._host = BrokerHost(self._target.host, self._target.port, options.broker_allow_cidrs)
        self._brokers = brokers

    def __repr__(self) -> str:
        return (
            f"RabbitmqHandler(url={self._target.display!r}, exchange={self._exchange!r}, "
            f"routing_key={self._routing_key!r})"
        )

    @property
    def _where(self) -> str:
        exchange = repr(self._exchange) if self._exchange else "the default exchange"
        return f"{self._target.display} {exchange} routing key {self._routing_key!r}"

    def _timed_out(self) -> str:
        return f"publish to {self._where}: no confirm within {self.timeout_s:g} s"

    def _failure(self, error: Exception) -> HandlerResult | None:
        if isinstance(
            error, aiormq.exceptions.AMQPError | aiormq.exceptions.ChannelInvalidStateError
        ):
            return self._classify(error)
        if isinstance(error, pamqp.exceptions.AMQPInternalError):
            # The broker closed the connection while it opened (a vhost the user may not
            # use: 530 NOT_ALLOWED): the client reports the close frame as unexpected.
            return self._refused_open(error)
        if isinstance(error, OSError | TimeoutError):
            code = "timeout" if isinstance(error, TimeoutError) else "rabbitmq_connection_error"
            return HandlerResult.transient(code, f"{self._where}: {type(error).__name__}")
        return None

    def _key(self, address: IPAddress) -> tuple[object, ...]:
        target = self._target
        return (
            "rabbitmq",
            target.tls,
            target.host,
            str(address),
            target.port,
            target.vhost,
            target.user,
            target.password,
            id(self._ssl_context) if self._ssl_context is not None else None,
        )

    def _connector(self, address: IPAddress) -> Any:
        target = self._target
        ssl_context = self._ssl_context

        async def connect() -> _Client:
            _quiet_unretrieved_amqp_errors(asyncio.get_running_loop())
            url = URL.build(
                scheme="amqps" if target.tls else "amqp",
                host=str(address),
                port=target.port,
                user=target.user or "guest",
                password=target.password if target.password is not None else "guest",
                path="/" + target.vhost,
            )
            context = None
            if target.tls:
                context = ssl_context or ssl.create_default_context()
            connection = aio_pika.Connection(url, ssl_context=context)
            transport = _Transport(target.host if target.tls else None)
            connection.kwargs["transport_factory"] = transport
            # What the broker's connection list shows: which connection is Carillon's.
            name = f"carillon {secrets.token_hex(4)}"
            connection.kwargs["client_properties"] = {"connection_name": name}
            try:
                await connection.connect(timeout=CONNECT_TIMEOUT_S)
            except BaseException:
                await _abandon(connection)  # a failed connect may leave its socket open
                transport.close()
                raise
            return _Client(connection, transport, name)

        return connect

    def _op(self, context: ExecutionContext) -> Any:
        body = request_body(context)
        message_id = context.execution_id
        properties = spec.Basic.Properties(
            content_type="application/json",
            delivery_mode=_PERSISTENT,
            message_id=message_id,
            headers={**self._headers, **context_headers(context)},
        )
        exchange = self._exchange
        routing_key = self._routing_key
        mandatory = self._mandatory

        async def publish(client: _Client) -> None:
            async with client.failing_when_closed():
                channel = await client.channel_for(exchange, message_id)
                channel.in_flight.add(message_id)
                try:
                    underlay = await channel.channel.get_underlay_channel()
                    await underlay.basic_publish(
                        body,
                        exchange=exchange,
                        routing_key=routing_key,
                        properties=properties,
                        mandatory=mandatory,
                    )
                finally:
                    channel.in_flight.discard(message_id)

        return publish

    def _refused_open(self, error: pamqp.exceptions.AMQPInternalError) -> HandlerResult:
        close = next((arg for arg in error.args if isinstance(arg, spec.Connection.Close)), None)
        if close is None:
            return HandlerResult.permanent(
                "rabbitmq_error", f"{self._where}: {type(error).__name__}"
            )
        text = f"{self._where}: the broker refused the connection ({close.reply_code} "
        text += f"{close.reply_text})"
        if close.reply_code == 403:
            return HandlerResult.permanent("rabbitmq_auth_error", text)
        if close.reply_code == 530:
            return HandlerResult.permanent("rabbitmq_access_refused", text)
        if close.reply_code in (320, 541):  # CONNECTION_FORCED, INTERNAL_ERROR: shutting down
            return HandlerResult.transient("rabbitmq_connection_error", text)
        return HandlerResult.permanent("rabbitmq_error", text)

    def _classify(
        self, error: aiormq.exceptions.AMQPError | aiormq.exceptions.ChannelInvalidStateError
    ) -> HandlerResult:
        where = self._where
        text = f"{where}: {type(error).__name__}" + (f": {error}" if str(error) else "")
        errors = aiormq.exceptions
        if isinstance(error, errors.PublishError):
            frame = error.frame
            code = getattr(frame, "reply_code", None)
            reason = getattr(frame, "reply_text", "") or "returned"
            return HandlerResult.permanent(
                "rabbitmq_unroutable",
                f"{where}: the message was returned unroutable ({code} {reason}): no queue is "
                "bound for the routing key (the publish is mandatory)",
            )
        if isinstance(error, errors.DeliveryError):
            return HandlerResult.transient(
                "rabbitmq_nack", f"{where}: the broker did not accept the message (nack)"
            )
        if isinstance(error, errors.ProbableAuthenticationError | errors.AuthenticationError):
            return HandlerResult.permanent(
                "rabbitmq_auth_error", f"{where}: the broker refused the credentials"
            )
        if isinstance(error, errors.ConnectionNotAllowed | errors.ChannelAccessRefused):
            return HandlerResult.permanent("rabbitmq_access_refused", text)
        if isinstance(error, errors.ChannelNotFoundEntity):
            return HandlerResult.permanent(
                "rabbitmq_not_found", f"{where}: the exchange does not exist: {error}"
            )
        if isinstance(error, errors.ChannelPreconditionFailed):
            return HandlerResult.permanent("rabbitmq_precondition_failed", text)
        if isinstance(error, errors.ChannelInvalidStateError | errors.ChannelClosed):
            return HandlerResult.transient("rabbitmq_channel_closed", text)
        if isinstance(error, errors.AMQPConnectionError):
            return HandlerResult.transient("rabbitmq_connection_error", text)
        return HandlerResult.permanent("rabbitmq_error", text)


async def _abandon(connection: aio_pika.abc.AbstractConnection) -> None:
    with contextlib.suppress(Exception):  # one that never opened has nothing to close
        await connection.close()


def _quiet_unretrieved_amqp_errors(loop: asyncio.AbstractEventLoop) -> None:
    """Install, on the broker bridge's loop (once, unless it has a handler of its own), an
    exception handler that logs at debug level the "Future exception was never retrieved"
    of aiormq's internal futures: when the broker closes a connection, aiormq rejects them
    all with the close's error, which every publish in flight already got and reported (as
    ``rabbitmq_connection_error``). Everything else goes to the loop's default handler."""
    if loop.get_exception_handler() is not None:
        return

    def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        error = context.get("exception")
        if isinstance(error, aiormq.exceptions.AMQPError) and "never retrieved" in str(
            context.get("message", "")
        ):
            log.debug("aiormq: %s: %s", context.get("message"), type(error).__name__)
            return
        loop.default_exception_handler(context)

    loop.set_exception_handler(handler)
