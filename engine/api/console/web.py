"""The console's HTTP machinery: templates, security headers, forms, and calls into the API.

Every page is an ``async def page(visit: Visit) -> Response`` wrapped by :func:`page_route`
(:mod:`engine.api.console.session`), which authenticates the session cookie and checks the
CSRF token of a form first. A page reads and changes the ledger *only* through the API's own
route handlers (:meth:`Visit.call`), so the console answers exactly what the JSON API would:
the same tenant checks, the same 404 for another tenant's record, the same validation.

Invariants
----------
* Every response carries :data:`SECURITY_HEADERS`: a Content-Security-Policy that allows
  scripts, styles and images from this origin only (no inline script, no inline style), no
  framing, no referrer, and ``no-store`` (pages hold tenants' data).
* Templates escape every value (Jinja2 ``autoescape``); nothing is marked safe but the
  markup the templates themselves write. Unknown template variables raise.
* Nothing reflected into a page is taken from the request unescaped, and notices shown
  after an action come from a fixed table, never from the URL.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import aclosing
from dataclasses import dataclass
from datetime import datetime, timedelta
from ipaddress import IPv4Network, IPv6Network, ip_address
from typing import Any, Final, Protocol
from urllib.parse import parse_qs, quote, urlencode

import jinja2
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response

from engine.api import problems, routes_admin, routes_executions, routes_schedules
from engine.api.auth import Authenticator, Principal
from engine.api.endpoint import Access, Call, Handler
from engine.config import CONSOLE_SESSION_IDLE_S_DEFAULT, CONSOLE_SESSION_LIFETIME_S_DEFAULT
from engine.core.instants import format_utc
from engine.ledger.base import Ledger

PREFIX: Final = "/ui"
FORM_BYTES_MAX: Final = 64 * 1024
"""Largest form body the console reads (a replay of a full page of ids fits many times)."""
FORM_FIELDS_MAX: Final = 2_000
CSP: Final = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
SECURITY_HEADERS: Final = {
    "Content-Security-Policy": CSP,
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cache-Control": "no-store",
}
NOTICES: Final = {
    "paused": "The schedule is paused; its queued runs were skipped.",
    "resumed": "The schedule is running again from its next fire.",
    "triggered": "A run was queued now, under an id of its own.",
    "replayed": "The dead letters were queued again under their own ids.",
    "replayed-none": "None of the selected executions was a dead letter any more.",
    "logged-out": "You are signed out.",
}
"""What a page may announce after an action: chosen by key, never echoed from the URL."""


_ACCESS: Final = {
    endpoint.handler: endpoint.access
    for module in (routes_schedules, routes_executions, routes_admin)
    for endpoint in module.ENDPOINTS
}
"""Who may call each API route the console uses: its endpoint's own setting."""


@dataclass(frozen=True, kw_only=True)
class ConsoleSettings:
    """How this node serves the console's sessions (``carillon run``'s ``console_*`` and
    ``trusted_proxies`` settings)."""

    insecure_cookie: bool = False
    """Send cookies without ``Secure`` on requests that are not https: plain-http
    development only (``make run``), since a browser then sends the session id unencrypted."""
    session_idle_s: float = CONSOLE_SESSION_IDLE_S_DEFAULT
    session_lifetime_s: float = CONSOLE_SESSION_LIFETIME_S_DEFAULT
    trusted_proxies: tuple[IPv4Network | IPv6Network, ...] = ()
    """Peers whose ``X-Forwarded-Proto`` says the scheme the browser used; others' is
    ignored."""

    def scheme(self, request: Request) -> str:
        """``https`` or ``http``: what the browser used, as far as this node can trust it --
        the connection's own scheme, or a trusted proxy's ``X-Forwarded-Proto``."""
        scheme = request.url.scheme
        forwarded = request.headers.get("x-forwarded-proto")
        if forwarded and self._from_trusted_proxy(request):
            claimed = forwarded.rsplit(",", 1)[-1].strip().lower()  # the nearest proxy's
            if claimed in ("http", "https"):
                scheme = claimed
        return "https" if scheme in ("https", "wss") else "http"

    def secure_cookies(self, request: Request) -> bool:
        """Whether cookies set in answer to ``request`` carry ``Secure``: always, unless the
        node was told to serve plain-http development and the browser did not use https."""
        return not self.insecure_cookie or self.scheme(request) == "https"

    def _from_trusted_proxy(self, request: Request) -> bool:
        if not self.trusted_proxies or request.client is None:
            return False
        try:
            peer = ip_address(request.client.host)
        except ValueError:
            return False
        return any(peer in network for network in self.trusted_proxies)


class ConsoleServices(Protocol):
    """What the console needs from the API's context (:class:`~engine.api.app.ApiContext`)."""

    @property
    def ledger(self) -> Ledger: ...
    @property
    def auth(self) -> Authenticator: ...
    @property
    def slo_target_s(self) -> float: ...
    @property
    def console(self) -> ConsoleSettings: ...


def _utc(value: datetime | None) -> str:
    if value is None:
        return "—"
    return format_utc(value.replace(microsecond=0)).replace("T", " ")


def _duration(seconds: float | None) -> str:
    """``850 ms``, ``12.3 s``, ``4 min 5 s``, ``3 h 20 min``, ``2 d 4 h``."""
    if seconds is None:
        return "—"
    sign, value = ("-" if seconds < 0 else ""), abs(seconds)
    if value < 1:
        return f"{sign}{value * 1000:.0f} ms"
    if value < 60:
        return f"{sign}{value:.1f} s"
    whole = int(value)
    for unit, size, sub, sub_size in (("d", 86400, "h", 3600), ("h", 3600, "min", 60)):
        if whole >= size:
            return f"{sign}{whole // size} {unit} {whole % size // sub_size} {sub}"
    return f"{sign}{whole // 60} min {whole % 60} s"


def _number(value: float) -> str:
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:,.2f}"


_TEMPLATES: Final = jinja2.Environment(
    loader=jinja2.PackageLoader("engine.api.console", "templates"),
    autoescape=True,
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)
_TEMPLATES.filters.update(utc=_utc, duration=_duration, number=_number)


def link(path: str, params: Mapping[str, Any] | None = None) -> str:
    """``path`` under the console with the given query (``None`` and empty values left out)."""
    query = {k: v for k, v in (params or {}).items() if v not in (None, "")}
    return PREFIX + path + ("?" + urlencode(query) if query else "")


def segment(value: str) -> str:
    """An id as one path segment (execution ids hold ``:``)."""
    return quote(value, safe="")


_TEMPLATES.globals.update(link=link, segment=segment)


def html(template: str, status: int = 200, **context: Any) -> HTMLResponse:
    """Render a template; the security headers are added by the route wrapper."""
    body = _TEMPLATES.get_template(template).render(**context)
    return HTMLResponse(body, status_code=status)


def secured(response: Response) -> Response:
    response.headers.update(SECURITY_HEADERS)
    return response


def see_other(path: str, params: Mapping[str, Any] | None = None) -> RedirectResponse:
    """303 to a console page (after a form: the browser then GETs it)."""
    return RedirectResponse(link(path, params), status_code=303)


def with_notice(path: str, notice: str) -> RedirectResponse:
    """303 to the console ``path`` (which may carry a query) announcing ``notice``."""
    separator = "&" if "?" in path else "?"
    return RedirectResponse(f"{PREFIX}{path}{separator}notice={notice}", status_code=303)


def safe_return_path(text: str | None, default: str) -> str:
    """A console path to return to after an action or a login; ``default`` for anything
    else, so that no form can send the browser to another site."""
    if (
        text
        and text.startswith(PREFIX + "/")
        and not text.startswith("//")
        and "\\" not in text
        and text.isprintable()
    ):
        return text.removeprefix(PREFIX)
    return default


async def read_form(request: Request) -> dict[str, list[str]]:
    """An ``application/x-www-form-urlencoded`` body, read up to :data:`FORM_BYTES_MAX`."""
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    body = b""
    async with aclosing(request.stream()) as stream:  # closed even when stopped early
        async for chunk in stream:
            body += chunk
            if len(body) > FORM_BYTES_MAX:
                raise problems.too_large(FORM_BYTES_MAX)
    if not body:
        return {}
    if content_type != "application/x-www-form-urlencoded":
        raise problems.bad_request("send the form as application/x-www-form-urlencoded")
    try:
        text = body.decode("utf-8")
        return parse_qs(text, keep_blank_values=True, max_num_fields=FORM_FIELDS_MAX)
    except (UnicodeDecodeError, ValueError):
        raise problems.bad_request("the form is not valid UTF-8 or has too many fields") from None


@dataclass
class Visit:
    """One authenticated page view: the request, who makes it, and the session's CSRF token."""

    request: Request
    principal: Principal
    services: ConsoleServices
    csrf: str
    form: dict[str, list[str]]

    @property
    def ledger(self) -> Ledger:
        return self.services.ledger

    def query(self, name: str) -> str | None:
        """A query parameter, stripped; ``None`` when absent or blank."""
        value = self.request.query_params.get(name, "").strip()
        return value or None

    def field(self, name: str) -> str | None:
        """A form field, stripped; ``None`` when absent or blank."""
        values = self.form.get(name) or [""]
        return values[0].strip() or None

    def fields(self, name: str) -> list[str]:
        return [value for value in self.form.get(name, []) if value]

    async def call(
        self,
        handler: Handler,
        *,
        query: Mapping[str, str | None] | None = None,
        path: Mapping[str, str] | None = None,
        body: Any = None,
    ) -> Any:
        """What the API route ``handler`` answers for this visit's caller: it runs with the
        caller's principal, the given query and path parameters and decoded body, after the
        access check of its :class:`~engine.api.endpoint.Endpoint`, exactly as behind
        ``/v1``; its problems propagate to the page wrapper."""
        access = _ACCESS.get(handler)
        if access is None:  # pragma: no cover - a page calling something that is no route
            raise RuntimeError(f"{handler.__qualname__} is not an API route's handler")
        if access is not Access.TOKEN:
            self.principal.require_admin()  # as the route's wrapper would: 403 for a tenant
        scope = {
            "type": "http",
            "method": self.request.method,
            "path": self.request.url.path,
            "headers": [],
            "query_string": urlencode(
                {k: v for k, v in (query or {}).items() if v is not None}
            ).encode(),
            "path_params": dict(path or {}),
        }
        reply = await handler(Call(Request(scope), self.principal, body, self.services))
        return reply.value

    def page(self, template: str, status: int = 200, **context: Any) -> HTMLResponse:
        """A page in the console's layout: navigation, who is signed in, the notice."""
        notice = NOTICES.get(self.query("notice") or "")
        return html(
            template,
            status,
            principal=self.principal,
            csrf=self.csrf,
            notice=notice,
            here=self.request.url.path,
            back=self.request.url.path
            + ("?" + self.request.url.query if self.request.url.query else ""),
            **context,
        )


def window(now: datetime, hours: float) -> tuple[datetime, datetime]:
    """``[now - hours, now)`` on whole minutes (so buckets line up with clock minutes)."""
    end = now.replace(second=0, microsecond=0) + timedelta(minutes=1)
    return end - timedelta(hours=hours), end
