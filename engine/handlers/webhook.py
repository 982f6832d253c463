"""The ``webhook`` handler: POST the execution as JSON to a URL, classify the answer.

Settings: ``url`` (http or https, no credentials), optional ``secret`` (``whsec_…``: sign
with Standard Webhooks, :mod:`engine.handlers.signing`), optional ``timeout_s`` (default: the
node's ``webhook_timeout_s``).

Every attempt of an execution sends the same ``Idempotency-Key`` (the execution id) and the
same body apart from ``attempt`` and ``fencing_token``; receivers deduplicate on the key.

How the request is made, and why:

* **Through the node's shared client** (:mod:`engine.handlers.http_client`): keep-alive
  HTTP/1.1 connections pooled per vetted address, a DNS cache of at most 15 s, per-host and
  global connection limits. A handler built without a client uses
  :func:`~engine.handlers.http_client.default_client` (one per trio run).
* **SSRF guard before connecting.** The host is resolved (or taken from the client's short
  DNS cache), every address is vetted (:mod:`engine.handlers.ssrf`) on every delivery, and
  the request goes to a vetted *IP address*, over a new connection or one kept alive for
  that same address: the ``Host`` header and the TLS server name (SNI, and certificate
  verification) keep the original host name. The connection can therefore only go where the
  guard looked; a DNS answer that changes to a refused address (DNS rebinding) is refused at
  the next resolution, before anything is sent. Addresses are tried in resolver order on
  connection errors.
* **No proxies, no redirects.** The client never uses a proxy (a proxy would connect
  somewhere the guard never saw). A 3xx answer is a *permanent* failure ``http_3xx``: the
  redirect target was never vetted, following it would turn a POST into a GET on some
  status codes, and retrying the same URL yields the same redirect; the fix is to store the
  final URL.
* **Bounded.** One deadline (``timeout_s``) covers waiting for a connection slot,
  resolution, connection, TLS, upload and the response; at most ``response_body_max_bytes``
  of the response are read (raw, with ``Accept-Encoding: identity`` so nothing is
  decompressed) and used only in error text; a response cut at the cap discards its
  connection.
* **Faults are classified**: ``dns_error``, ``ssrf_refused`` (permanent), ``connect_error``
  (no address could be connected to; nothing was sent), ``network_error`` (the connection
  failed after it was made, so the request may have been processed), ``timeout``.

Status mapping: 2xx succeeded; 408, 425, 429 and 5xx transient, honouring ``Retry-After``
(seconds or an HTTP date); 3xx and other 4xx permanent; anything else unknown.
"""

from __future__ import annotations

import contextlib
import re
import ssl
from collections.abc import Mapping
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any, Final

import httpx
import msgspec
import trio

from engine import __version__
from engine.clock import Clock
from engine.core.instants import format_utc
from engine.errors import InvalidField
from engine.handlers.base import (
    ExecutionContext,
    HandlerOptions,
    HandlerResult,
    check_timeout_s,
    parse_settings,
)
from engine.handlers.http_client import (
    ConnectFailed,
    ExchangeFailed,
    Progress,
    ResolveFailed,
    WebhookClient,
    default_client,
)
from engine.handlers.signing import parse_secret, signature_headers
from engine.handlers.ssrf import AddressRefused, parse_allow_list
from engine.tracing import trace_headers

URL_CHARS_MAX: Final = 2048
RETRY_AFTER_S_MAX: Final = 24 * 3600.0
"""A ``Retry-After`` further away than this is read as this."""
EXCERPT_CHARS_MAX: Final = 500
_TRANSIENT_STATUSES: Final = frozenset({408, 425, 429})
_FRAMING_HEADERS: Final = frozenset(
    {"host", "content-length", "transfer-encoding", "connection", "keep-alive", "te",
     "trailer", "upgrade", "proxy-connection", "expect"}
)  # fmt: skip
"""Extra headers never sent: the client frames the message and owns the connection."""


USER_AGENT: Final = f"carillon/{__version__}"
"""The version of the code running, not of whatever distribution metadata is installed."""


class WebhookSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    url: str
    secret: str | None = None
    previous_secret: str | None = None
    """A secret being rotated out: requests are signed with it too until
    ``previous_secret_until`` (``POST /v1/task-types/{name}:rotate-secret`` sets both)."""
    previous_secret_until: str | None = None
    """When the overlap of a rotation ends (RFC 3339, UTC)."""
    timeout_s: float | None = None
    headers: dict[str, str] = msgspec.field(default_factory=dict)
    """Extra request headers (an API key, a routing tag). They cannot replace the headers
    Carillon sets itself (the idempotency, context and signature headers)."""


def _retiring_secret(parsed: WebhookSettings) -> tuple[bytes | None, datetime]:
    """The key of a secret being rotated out and when its overlap ends, checked together."""
    if parsed.previous_secret is None and parsed.previous_secret_until is None:
        return None, datetime.min.replace(tzinfo=UTC)
    if parsed.previous_secret is None or parsed.previous_secret_until is None:
        raise InvalidField(
            "webhook handler: previous_secret and previous_secret_until go together (a "
            "secret being rotated out, and when its overlap ends)"
        )
    if parsed.secret is None:
        raise InvalidField("webhook handler: a previous_secret needs a secret to rotate to")
    try:
        until = datetime.fromisoformat(parsed.previous_secret_until)
    except ValueError:
        raise InvalidField(
            "webhook handler: previous_secret_until must be an RFC 3339 instant such as "
            "'2026-12-03T12:00:00Z'"
        ) from None
    if until.tzinfo is None:
        raise InvalidField("webhook handler: previous_secret_until needs a UTC offset ('Z')")
    return parse_secret(parsed.previous_secret), until


HEADERS_MAX: Final = 32
_HEADER_NAME: Final = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,100}$")


def check_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """Valid extra headers, or :class:`InvalidField` saying which is not."""
    if len(headers) > HEADERS_MAX:
        raise InvalidField(f"webhook handler: at most {HEADERS_MAX} extra headers")
    for name, value in headers.items():
        if not _HEADER_NAME.match(name):
            raise InvalidField(f"webhook handler: {name!r} is not a valid header name")
        if any(ch in value for ch in "\r\n\0") or len(value) > 4096:
            raise InvalidField(f"webhook handler: the value of header {name!r} is not allowed")
    return dict(headers)


def parse_webhook_url(text: str) -> httpx.URL:
    """``text`` as an absolute http(s) URL without credentials; :class:`InvalidField` if not."""
    if len(text) > URL_CHARS_MAX:
        raise InvalidField(f"webhook handler: url is longer than {URL_CHARS_MAX} characters")
    try:
        url = httpx.URL(text)
    except httpx.InvalidURL as error:
        raise InvalidField(f"webhook handler: url {text!r} is not a valid URL ({error})") from None
    if url.scheme not in ("http", "https"):
        raise InvalidField(
            f"webhook handler: url must start with http:// or https://, got {url.scheme!r}"
        )
    if not url.host:
        raise InvalidField(f"webhook handler: url {text!r} names no host")
    if url.userinfo:
        raise InvalidField(
            "webhook handler: url must not carry credentials (user:password@); "
            "authenticate the receiver with the task type's secret instead"
        )
    return url


def display_url(url: httpx.URL) -> str:
    """The URL without its query and fragment, which may hold tokens, for error messages."""
    return str(url.copy_with(query=None, fragment=None))


def parse_retry_after(value: str | None, clock: Clock) -> float | None:
    """Seconds to wait from a ``Retry-After`` value (delta-seconds or HTTP date), or ``None``."""
    if value is None:
        return None
    text = value.strip()
    if text.isascii() and text.isdigit():
        return min(float(text), RETRY_AFTER_S_MAX)
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # "-0000": RFC 9110 dates are GMT
        when = when.replace(tzinfo=UTC)
    return min(max((when - clock.now()).total_seconds(), 0.0), RETRY_AFTER_S_MAX)


def classify_response(
    status: int, headers: Mapping[str, str], excerpt: str, *, url: str, clock: Clock
) -> HandlerResult:
    """The outcome of an HTTP answer (see the module docstring for the mapping)."""
    if 200 <= status < 300:
        return HandlerResult.succeeded()
    code = f"http_{status}"
    said = f"POST {url} answered HTTP {status}" + (f": {excerpt}" if excerpt else "")
    if 300 <= status < 400:
        target = _redirect_target(headers.get("location"))
        return HandlerResult.permanent(
            code,
            f"POST {url} answered HTTP {status}, a redirect to {target}; webhooks do not follow "
            "redirects (the target was never vetted), so store the final URL in the task type",
        )
    if status in _TRANSIENT_STATUSES or 500 <= status < 600:
        retry_after_s = parse_retry_after(headers.get("retry-after"), clock)
        return HandlerResult.transient(code, said, retry_after_s=retry_after_s)
    if 400 <= status < 500:
        return HandlerResult.permanent(code, said)
    return HandlerResult.unknown(code, said)


async def read_capped(response: httpx.Response, limit_bytes: int) -> bytes:
    """At most ``limit_bytes`` of the raw body of an httpx response; closed after that.

    (The handler no longer reads through httpx; this stays for callers that still do.)

    Stopping early leaves httpx's nested stream generators suspended, and trio warns about
    every generator collected unfinished; so once the cap is reached the response is closed
    and iteration resumed, which makes every level see the closed connection and finish.
    """
    received = bytearray()
    chunks = response.aiter_raw()
    async for chunk in chunks:
        received += chunk[: max(limit_bytes - len(received), 0)]
        if len(received) >= limit_bytes:
            break
    else:
        return bytes(received)
    await response.aclose()
    with contextlib.suppress(httpx.HTTPError, httpx.StreamError):
        async for _ in chunks:  # only what was already buffered; then the closed socket ends it
            pass
    return bytes(received)


def excerpt_of(body: bytes) -> str:
    text = " ".join(body.decode("utf-8", errors="replace").split())
    return text if len(text) <= EXCERPT_CHARS_MAX else text[: EXCERPT_CHARS_MAX - 1] + "…"


def request_body(context: ExecutionContext) -> bytes:
    """The JSON body: the context, ``planned_at`` in RFC 3339 UTC."""
    return msgspec.json.encode(
        {
            "execution_id": context.execution_id,
            "schedule_id": context.schedule_id,
            "tenant_id": context.tenant_id,
            "task_type": context.task_type,
            "planned_at": format_utc(context.planned_at),
            "attempt": context.attempt,
            "fencing_token": context.fencing_token,
            "payload": context.payload,
        }
    )


class WebhookHandler:
    """POSTs each attempt to one URL; build it with :func:`engine.handlers.build_handler`.

    ``client`` is the node's shared :class:`~engine.handlers.http_client.WebhookClient`;
    without one, deliveries use :func:`~engine.handlers.http_client.default_client`.
    ``ssl_context`` replaces the client's trust store (connections made with it are pooled
    apart).
    """

    def __init__(
        self,
        settings: Mapping[str, Any],
        *,
        options: HandlerOptions,
        clock: Clock,
        ssl_context: ssl.SSLContext | None = None,
        client: WebhookClient | None = None,
    ) -> None:
        parsed = parse_settings("webhook", settings, WebhookSettings)
        self._url = parse_webhook_url(parsed.url)
        self._display_url = display_url(self._url)
        self._key = None if parsed.secret is None else parse_secret(parsed.secret)
        self._retiring, self._retiring_until = _retiring_secret(parsed)
        self._extra_headers = check_headers(parsed.headers)
        timeout_s = options.webhook_timeout_s if parsed.timeout_s is None else parsed.timeout_s
        self.timeout_s = check_timeout_s("webhook", timeout_s)
        self._allow = parse_allow_list(options.webhook_allow_cidrs)
        self._body_max_bytes = options.response_body_max_bytes
        self._clock = clock
        self._ssl_context = ssl_context
        self._client = client
        self._scheme = self._url.scheme
        self._host = self._url.raw_host.decode("ascii")
        self._port = self._url.port or (443 if self._scheme == "https" else 80)
        self._target = self._url.raw_path
        self._host_header = self._url.netloc.decode("ascii")

    def __repr__(self) -> str:
        return f"WebhookHandler(url={self._display_url!r}, signed={self._key is not None})"

    async def run(self, context: ExecutionContext) -> HandlerResult:
        progress = Progress()
        with trio.move_on_after(self.timeout_s):
            return await self._deliver(context, progress)
        where = "" if progress.address is None else f" to {progress.address}"
        return HandlerResult.transient(
            "timeout",
            f"POST {self._display_url}{where}: no complete answer within {self.timeout_s:g} s "
            f"(timed out {progress.phase})",
        )

    def _headers(self, context: ExecutionContext, body: bytes) -> list[tuple[str, str]]:
        own = {
            "Host": self._host_header,
            "Content-Type": "application/json",
            "User-Agent": USER_AGENT,
            "Accept-Encoding": "identity",
            "Idempotency-Key": context.execution_id,
            "X-Carillon-Execution-Id": context.execution_id,
            "X-Carillon-Schedule-Id": context.schedule_id,
            "X-Carillon-Planned-At": format_utc(context.planned_at),
            "X-Carillon-Attempt": str(context.attempt),
            "X-Carillon-Fencing-Token": str(context.fencing_token),
        }
        traced = trace_headers()  # the attempt's trace context (none when tracing is off)
        if traced:
            own |= traced
        if self._key is not None:
            now = self._clock.now()
            timestamp = int(now.timestamp())
            retiring = self._retiring
            if retiring is not None and now >= self._retiring_until:
                retiring = None  # the rotation's overlap is over
            own |= signature_headers(
                self._key, context.execution_id, timestamp, body, retiring=retiring
            )
        if not self._extra_headers:
            return list(own.items())
        taken = {name.lower() for name in own} | _FRAMING_HEADERS
        extra = [(n, v) for n, v in self._extra_headers.items() if n.lower() not in taken]
        return extra + list(own.items())

    async def _deliver(self, context: ExecutionContext, progress: Progress) -> HandlerResult:
        client = self._client or default_client()
        body = request_body(context)
        try:
            response = await client.post(
                scheme=self._scheme,
                host=self._host,
                port=self._port,
                target=self._target,
                headers=self._headers(context, body),
                body=body,
                allow=self._allow,
                body_max_bytes=self._body_max_bytes,
                ssl_context=self._ssl_context,
                progress=progress,
            )
        except AddressRefused as refused:
            return HandlerResult.permanent("ssrf_refused", str(refused))
        except ResolveFailed as error:
            return HandlerResult.transient(
                "dns_error", f"could not resolve {self._host} for {self._display_url}: {error}"
            )
        except ConnectFailed as error:
            return HandlerResult.transient(
                "connect_error", f"could not connect to {self._display_url}: {error}"
            )
        except ExchangeFailed as error:
            return HandlerResult.transient(
                "network_error", f"POST {self._display_url} to {progress.address}: {error}"
            )
        return classify_response(
            response.status,
            response.headers,
            excerpt_of(response.body),
            url=self._display_url,
            clock=self._clock,
        )


def _redirect_target(location: str | None) -> str:
    if not location:
        return "nowhere (no Location header)"
    try:
        return display_url(httpx.URL(location))
    except httpx.InvalidURL:
        return "an invalid Location"
