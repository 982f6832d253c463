"""The ``nats`` handler: publish each execution to a NATS JetStream subject, acknowledged.

Settings (``docs/targets.md``, "nats"): ``url`` (``nats://`` or ``tls://``, optional
``user:password@`` or ``token@``), ``subject`` (no wildcards), optional ``stream`` (the
stream the subject must land in: ``Nats-Expected-Stream``), optional ``timeout_s`` (30 s).

**Once only, within the stream's duplicate window.** Every attempt publishes with
``Nats-Msg-Id`` = the execution id and waits for JetStream's acknowledgement; JetStream
drops a message whose id it has seen within the stream's ``duplicate_window`` (2 minutes by
default) and acknowledges it as a duplicate, which is a success here. A retry or redelivery
*after* the window is stored again: a second message with the same ``Nats-Msg-Id`` (and
``X-Carillon-Execution-Id``), for consumers to drop. So the window should cover the task
type's worst retry horizon. That is checked twice, by one comparison (:func:`window_short`):
when the task type is written through the API, which looks the stream up (bounded, off the
publish path, :meth:`NatsHandler.read_window`) and answers a warning the writer sees;
and at the first publish of each task type version (beside it: the publish does not wait),
which logs the same warning -- the backstop for a stream changed after the write
(``docs/targets.md``).

The message is the webhook's JSON body (the context and the payload); its headers carry the
context too: ``X-Carillon-Execution-Id``, ``-Schedule-Id``, ``-Tenant-Id``, ``-Planned-At``,
``-Attempt``, ``-Fencing-Token``.

**Where it runs.** nats-py on the node's broker bridge (:mod:`engine.handlers.brokers`), one
connection per vetted settings; nats-py reconnects it in the background after a broker
restart (forever, every quarter second, and only ever to the vetted address: servers a
cluster announces are never used, they were not vetted). While it is disconnected a publish
fails at once (``nats_disconnected``) rather than waiting in the client's buffer. The
attempt's timeout and any cancellation cancel the publish on the loop.

**SSRF**: as the redis kind: the host is resolved, every address vetted with
``--broker-allow-cidrs``, the client connects to the vetted address (``tls://`` keeps the
host name for the certificate).

**Failures.** ``ssrf_refused`` (permanent), ``dns_error``, ``nats_connection_error``,
``nats_disconnected``, ``timeout``, ``nats_no_responders`` (no stream takes the subject: a
stream being recovered after a restart, or none configured; bounded by the retry policy),
``nats_unavailable`` (transient), ``nats_auth_error``, ``nats_wrong_stream``,
``nats_payload_too_large``, ``nats_error`` (permanent).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import re
import ssl
from collections.abc import Mapping
from typing import Any, Final
from urllib.parse import ParseResult, unquote, urlparse

import msgspec
import nats
import nats.errors
import nats.js.errors
import trio
from nats.aio.client import Client as NatsClient
from nats.aio.client import Server
from nats.js import JetStreamContext

from engine.errors import InvalidField
from engine.handlers.base import (
    TIMEOUT_S_DEFAULT,
    ExecutionContext,
    HandlerOptions,
    HandlerResult,
    SettingsWarning,
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

__all__ = [
    "WINDOW_SHORT",
    "WINDOW_UNCHECKED",
    "NatsHandler",
    "NatsSettings",
    "NatsTarget",
    "parse_nats_url",
    "window_short",
    "window_unchecked",
]

log = logging.getLogger("carillon.brokers")

SUBJECT_CHARS_MAX: Final = 256
CONNECT_TIMEOUT_S: Final = 5
RECONNECT_WAIT_S: Final = 0.25
_SUBJECT: Final = re.compile(r"^[!-~]+$")
_STREAM: Final = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_EXPECTED_STREAM_MISMATCH: Final = 10060
WINDOW_SHORT: Final = "nats_duplicate_window_short"
"""The warning code: the stream's duplicate window is shorter than the retry horizon."""
WINDOW_UNCHECKED: Final = "nats_stream_unchecked"
"""The warning code: the stream's duplicate window could not be read (and why)."""


def window_short(
    task_type: str, stream: str, window_s: float, horizon_s: float
) -> SettingsWarning | None:
    """The warning that ``stream``'s duplicate window (``window_s``) is shorter than the
    task type's worst retry horizon (``horizon_s``, :func:`~engine.handlers.registry.
    retry_horizon_of`); ``None`` when it covers it. The one comparison: the answer to a
    task-type write and the log line of the first publish both come from here."""
    if window_s >= horizon_s:
        return None
    return SettingsWarning(
        WINDOW_SHORT,
        f"task type {task_type!r} publishes to NATS stream {stream!r}, whose duplicate window "
        f"({window_s:.0f} s) is shorter than the task type's worst retry horizon "
        f"({horizon_s:.0f} s): a retry or redelivery after the window is stored a second time "
        f"(same Nats-Msg-Id). Raise the stream's duplicate_window to at least "
        f"{math.ceil(horizon_s)} s, or lower the task type's max_attempts, backoff or timeout_s",
    )


def window_unchecked(task_type: str, where: str, why: str, horizon_s: float) -> SettingsWarning:
    """The warning that the duplicate window of the stream ``where`` names could not be
    read, because of ``why``: nothing is known about the once-only guarantee's bound."""
    return SettingsWarning(
        WINDOW_UNCHECKED,
        f"task type {task_type!r} publishes to {where}, whose duplicate window could not be "
        f"read ({why}): whether it covers the task type's worst retry horizon "
        f"({horizon_s:.0f} s) is not checked. Make sure the stream's duplicate_window is at "
        f"least {math.ceil(horizon_s)} s",
    )


class NatsSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    url: str
    subject: str
    stream: str | None = None
    """The stream the subject must land in (``Nats-Expected-Stream``); any, if left out."""
    timeout_s: float = TIMEOUT_S_DEFAULT


class NatsTarget(msgspec.Struct, frozen=True, kw_only=True):
    """A parsed ``nats://`` URL."""

    tls: bool
    host: str
    port: int
    user: str | None
    password: str | None
    token: str | None

    @property
    def display(self) -> str:
        """The URL without its credentials: what error messages and logs show."""
        host = bracketed(self.host)
        return f"{'tls' if self.tls else 'nats'}://{host}:{self.port}"


def parse_nats_url(text: str) -> NatsTarget:
    """``text`` as a NATS URL; :class:`InvalidField` saying what is wrong (never the URL,
    which may carry credentials)."""
    parts, host = split_broker_url("nats", text, ("nats", "tls"), "nats:// or tls://")
    port = parts.port
    if parts.path.strip("/") or parts.query or parts.fragment:
        raise InvalidField("nats handler: url must be only nats://[credentials@]host[:port]")
    user = unquote(parts.username) if parts.username else None
    password = unquote(parts.password) if parts.password is not None else None
    return NatsTarget(
        tls=parts.scheme == "tls",
        host=host,
        port=port or 4222,
        user=user if password is not None else None,
        password=password,
        token=user if password is None else None,
    )


def check_subject(subject: str) -> str:
    if (
        not isinstance(subject, str)
        or not 0 < len(subject) <= SUBJECT_CHARS_MAX
        or not _SUBJECT.match(subject)
        or any(token == "" for token in subject.split("."))
    ):
        raise InvalidField(
            f"nats handler: subject must be 1-{SUBJECT_CHARS_MAX} printable ASCII characters "
            "without spaces, in tokens separated by dots, like 'orders.ticks'"
        )
    if any(token in ("*", ">") for token in subject.split(".")):
        raise InvalidField(
            "nats handler: subject must not contain wildcards ('*', '>'): a publish names one "
            "subject"
        )
    return subject


class _Client:
    """A connected nats-py client and its JetStream context (on the broker bridge's loop)."""

    def __init__(self, nc: NatsClient, js: JetStreamContext) -> None:
        self.nc = nc
        self.js = js

    def usable(self) -> bool:
        return not self.nc.is_closed  # closed: nats-py stopped reconnecting it

    async def aclose(self) -> None:
        await self.nc.close()


class NatsHandler(BrokerPublisher):
    """Publishes each attempt to one subject; build it with
    :func:`engine.handlers.build_handler`."""

    kind = "nats"

    def __init__(
        self,
        settings: Mapping[str, Any],
        *,
        options: HandlerOptions,
        retry_horizon_s: float = 0.0,
        brokers: BrokerBridge | None = None,
        task_type: str = "",
    ) -> None:
        parsed = parse_settings("nats", settings, NatsSettings)
        self._target = parse_nats_url(parsed.url)
        self._subject = check_subject(parsed.subject)
        if parsed.stream is not None and not _STREAM.match(parsed.stream):
            raise InvalidField(
                "nats handler: stream must be 1-64 letters, digits, '-' or '_' (a stream name)"
            )
        self._stream = parsed.stream
        self.timeout_s = check_timeout_s("nats", parsed.timeout_s)
        self._retry_horizon_s = retry_horizon_s
        self._host = BrokerHost(self._target.host, self._target.port, options.broker_allow_cidrs)
        self._brokers = brokers
        self._task_type = task_type
        self._window_checked = False
        """Set on the broker bridge's loop by the first acknowledged publish."""
        self._checks: set[asyncio.Task[None]] = set()

    def __repr__(self) -> str:
        return f"NatsHandler(url={self._target.display!r}, subject={self._subject!r})"

    def _timed_out(self) -> str:
        return (
            f"publish to {self._subject!r} on {self._target.display}: no acknowledgement "
            f"within {self.timeout_s:g} s"
        )

    def _failure(self, error: Exception) -> HandlerResult | None:
        if isinstance(error, nats.errors.Error):
            return self._classify(error)
        if isinstance(error, OSError):
            return HandlerResult.transient(
                "nats_connection_error", f"{self._target.display}: {type(error).__name__}"
            )
        return None

    async def _check_window(self, client: _Client, stream: str) -> None:
        """On the loop, beside the publish that started it: read the stream's duplicate
        window and warn when it is shorter than the retry horizon, or could not be read."""
        try:
            info = await client.js.stream_info(stream)
        except (TimeoutError, nats.errors.Error) as error:
            unread = window_unchecked(
                self._task_type,
                f"NATS stream {stream!r}",
                type(error).__name__,
                self._retry_horizon_s,
            )
            log.warning("%s", unread.message)
            return
        window_s = info.config.duplicate_window or 0.0
        short = window_short(self._task_type, stream, window_s, self._retry_horizon_s)
        if short is not None:
            log.warning("%s", short.message)

    @property
    def lookup_key(self) -> tuple[object, ...]:
        """What :meth:`read_window` depends on: task types equal in it share one lookup."""
        return (self._target, self._subject, self._stream)

    async def read_window(self, timeout_s: float) -> tuple[str, float] | str:
        """The name and duplicate window of the stream this task type publishes to, looked
        up now, or why they could not be: for the answer to a task-type write
        (:meth:`window_warnings`). Off the publish path, on a connection of its own (made
        through the bridge's loop and closed at once), to the vetted address only.

        Bounded by ``timeout_s``, and raises nothing a broker does: an address the node
        refuses, a server down, no such stream, no answer in time are each a reason.
        """
        with trio.move_on_after(timeout_s):
            return await self._read_window(timeout_s)
        return f"no answer within {timeout_s:g} s"

    def window_warnings(self, found: tuple[str, float] | str) -> list[SettingsWarning]:
        """What the answer to a write of this task type says of what :meth:`read_window`
        ``found``: a :func:`window_short` warning when the window is shorter than the retry
        horizon, a :func:`window_unchecked` one saying why when it could not be read."""
        if isinstance(found, str):
            where = (
                f"NATS stream {self._stream!r}"
                if self._stream is not None
                else f"the stream of NATS subject {self._subject!r} on {self._target.display}"
            )
            return [window_unchecked(self._task_type, where, found, self._retry_horizon_s)]
        stream, window_s = found
        short = window_short(self._task_type, stream, window_s, self._retry_horizon_s)
        return [] if short is None else [short]

    async def _read_window(self, timeout_s: float) -> tuple[str, float] | str:
        """The stream's name and duplicate window, or why they could not be read."""
        brokers = self._brokers
        if brokers is None:
            return "this server has no broker bridge to look with"
        address = await self._host.address()
        if isinstance(address, HandlerResult):
            return address.error_message or str(address.error_code)
        connect = self._connector(address)
        stream, subject = self._stream, self._subject

        async def read() -> tuple[str, float]:
            client = await connect()
            try:
                js = client.nc.jetstream(timeout=timeout_s)
                name = stream or await js.find_stream_name_by_subject(subject)
                info = await js.stream_info(name)
                return name, info.config.duplicate_window or 0.0
            finally:
                await _abandon(client.nc)

        try:
            return await brokers.run_unpooled(read)
        except nats.js.errors.NotFoundError:
            if stream is None:
                return f"no stream takes the subject {subject!r}"
            return f"there is no stream {stream!r}"
        except Exception as error:
            failure = self._failure(error)
            if failure is None:  # not the broker's: a bug, but the task type is stored
                log.exception("looking up the stream of task type %r failed", self._task_type)
                return type(error).__name__
            return failure.error_message or type(error).__name__

    def _key(self, address: IPAddress) -> tuple[object, ...]:
        target = self._target
        return (
            "nats",
            target.tls,
            target.host,
            str(address),
            target.port,
            target.user,
            target.password,
            target.token,
        )

    def _connector(self, address: IPAddress) -> Any:
        target = self._target
        host = f"[{address}]" if address.version == 6 else str(address)
        server = f"{'tls' if target.tls else 'nats'}://{host}:{target.port}"
        display = target.display

        def only_the_vetted(servers: list[Server], info: dict[str, Any]) -> tuple[Server, float]:
            # Never a server the cluster announced: only the address that was vetted.
            mine = next((s for s in servers if s.uri.netloc == f"{host}:{target.port}"), None)
            chosen = mine or Server(uri=_uri(server))
            return chosen, RECONNECT_WAIT_S

        async def on_error(error: Exception) -> None:
            log.debug("nats %s: %s", display, type(error).__name__)

        async def connect() -> _Client:
            tls: dict[str, Any] = {}
            if target.tls:
                tls = {"tls": ssl.create_default_context(), "tls_hostname": target.host}
            # The first connect fails at once (refused, bad credentials: the publish's
            # failure); only a connection once made is re-established, forever, in the
            # background. nats-py reads these two options whenever it loses a connection.
            nc = NatsClient()
            try:
                await nc.connect(
                    servers=[server],
                    user=target.user,
                    password=target.password,
                    token=target.token,
                    connect_timeout=CONNECT_TIMEOUT_S,
                    allow_reconnect=False,
                    max_reconnect_attempts=1,
                    reconnect_time_wait=RECONNECT_WAIT_S,  # type: ignore[arg-type]  # a float works
                    reconnect_to_server_handler=only_the_vetted,
                    error_cb=on_error,
                    name="carillon",
                    **tls,
                )
            except BaseException:
                await _abandon(nc)  # a failed connect leaves its socket open otherwise
                raise
            nc.options["allow_reconnect"] = True
            nc.options["max_reconnect_attempts"] = -1
            return _Client(nc, nc.jetstream())

        return connect

    def _op(self, context: ExecutionContext) -> Any:
        subject = self._subject
        body = request_body(context)
        headers = {
            "Nats-Msg-Id": context.execution_id,
            "Content-Type": "application/json",
            **context_headers(context),
        }
        expected = self._stream
        timeout_s = self.timeout_s

        async def publish(client: _Client) -> bool:
            if not client.nc.is_connected:
                raise nats.errors.ConnectionReconnectingError()
            ack = await client.js.publish(
                subject, body, timeout=timeout_s, stream=expected, headers=dict(headers)
            )
            if not self._window_checked:
                # Once per handler, and off the publish's path: the answer (or a STREAM.INFO
                # the user may not send, which only times out) never delays an attempt.
                self._window_checked = True
                check = asyncio.get_running_loop().create_task(
                    self._check_window(client, ack.stream)
                )
                self._checks.add(check)
                check.add_done_callback(self._checks.discard)
            return bool(ack.duplicate)

        return publish

    def _classify(self, error: nats.errors.Error) -> HandlerResult:
        where = f"{self._target.display} subject {self._subject!r}"
        text = f"{where}: {type(error).__name__}" + (f": {error}" if str(error) else "")
        if isinstance(error, nats.js.errors.NoStreamResponseError | nats.errors.NoRespondersError):
            return HandlerResult.transient(
                "nats_no_responders",
                f"{where}: no JetStream stream answered for the subject (a stream recovering "
                "after a restart, or none configured for it)",
            )
        if isinstance(error, nats.errors.TimeoutError):
            return HandlerResult.transient("timeout", text)
        if isinstance(
            error, nats.errors.ConnectionReconnectingError | nats.errors.ConnectionClosedError
        ):
            return HandlerResult.transient("nats_disconnected", text)
        if isinstance(error, nats.errors.AuthorizationError):
            return HandlerResult.permanent("nats_auth_error", text)
        if isinstance(
            error,
            nats.errors.NoServersError
            | nats.errors.StaleConnectionError
            | nats.errors.UnexpectedEOF
            | nats.errors.OutboundBufferLimitError,
        ):
            return HandlerResult.transient("nats_connection_error", text)
        if isinstance(error, nats.errors.MaxPayloadError):
            return HandlerResult.permanent("nats_payload_too_large", text)
        if isinstance(error, nats.js.errors.APIError):
            if error.err_code == _EXPECTED_STREAM_MISMATCH:
                return HandlerResult.permanent(
                    "nats_wrong_stream",
                    f"{where}: the subject is not in the stream {self._stream!r}: {error}",
                )
            if isinstance(error, nats.js.errors.ServiceUnavailableError) or (
                error.code is not None and error.code >= 500
            ):
                return HandlerResult.transient("nats_unavailable", text)
            return HandlerResult.permanent("nats_error", text)
        if "authorization" in str(error).lower() or "permissions" in str(error).lower():
            return HandlerResult.permanent("nats_auth_error", text)
        return HandlerResult.unknown("nats_error", text)


async def _abandon(nc: NatsClient) -> None:
    with contextlib.suppress(Exception):
        await nc.close()


def _uri(server: str) -> ParseResult:
    return urlparse(server)
