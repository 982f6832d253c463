"""Signing in and out of the console, and the checks every page makes first.

Signing in with an API token opens a server-side session (:meth:`~engine.ledger.base.Ledger.
sessions_create`): the cookie holds a random session id, never the token, and the ledger
only the id's SHA-256 and the id of the token it acts as. A session ends when unused for
``session_idle_s``, ``session_lifetime_s`` after sign-in, at sign-out (revoked in the ledger,
so a copied cookie is useless from then on), or when its token is revoked. Every request
checks it through the API's :class:`~engine.api.auth.Authenticator` (cached for a few
seconds, bounded, rate-limited like tokens), so any node behind a load balancer serves any
session.

The cookie is ``HttpOnly`` (no script reads it), ``SameSite=Strict`` (no other site's page
sends it; the sign-in's redirect is same-site, so Strict costs nothing there), ``Path=/ui``
(the JSON API never sees it) and ``Secure`` unless the node was started for plain-http
development (:attr:`~engine.api.console.web.ConsoleSettings.insecure_cookie`) and the request
did not come over https.

CSRF: every form carries a token that a POST must send back. For a session it is
``HMAC-SHA256(key = the session id, "carillon-console-csrf")``: bound to the session, the
same on every node, and computable only by whoever holds the session id -- which another
site's page does not, since the cookie is HttpOnly and SameSite=Strict. The sign-in form,
before any session exists, uses a double-submit cookie of 32 random bytes instead.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
from collections.abc import Awaitable, Callable
from typing import Final

from starlette.requests import Request
from starlette.responses import Response

from engine.api import problems
from engine.api.auth import (
    SESSION_ID_LENGTH_MAX,
    SESSION_ID_PREFIX,
    Principal,
    hash_token,
    new_session_id,
)
from engine.api.console.web import (
    NOTICES,
    PREFIX,
    ConsoleServices,
    ConsoleSettings,
    Visit,
    html,
    read_form,
    safe_return_path,
    secured,
    see_other,
)
from engine.api.problems import Problem
from engine.errors import CarillonError, NotFound
from engine.ledger.params import SessionsCreate

log = logging.getLogger("carillon.api.console")

SESSION_COOKIE: Final = "carillon_session"
LOGIN_COOKIE: Final = "carillon_login"
CSRF_FIELD: Final = "csrf"
_CSRF_CONTEXT: Final = b"carillon-console-csrf"

Page = Callable[[Visit], Awaitable[Response]]


def csrf_token(session_id: str) -> str:
    """The CSRF token of the session whose cookie holds ``session_id``."""
    return hmac.new(session_id.encode(), _CSRF_CONTEXT, hashlib.sha256).hexdigest()


def _client(request: Request) -> str:
    return request.client.host if request.client else "unknown"


def _set_cookie(
    settings: ConsoleSettings,
    request: Request,
    response: Response,
    name: str,
    value: str,
    path: str,
) -> None:
    response.set_cookie(
        name,
        value,
        path=path,
        httponly=True,
        samesite="strict",
        secure=settings.secure_cookies(request),
    )


def _clear_cookie(
    settings: ConsoleSettings, request: Request, response: Response, name: str, path: str
) -> None:
    response.delete_cookie(
        name,
        path=path,
        httponly=True,
        samesite="strict",
        secure=settings.secure_cookies(request),
    )


def page_route(services: ConsoleServices, page: Page) -> Callable[[Request], Awaitable[Response]]:
    """The Starlette endpoint of ``page``: authenticate the cookie (no session: to the
    sign-in page), check a form's CSRF token, run the page, and show any problem as an
    error page with the problem's status."""

    async def serve(request: Request) -> Response:
        return secured(await _serve(services, page, request))

    return serve


async def _serve(services: ConsoleServices, page: Page, request: Request) -> Response:
    session_id = request.cookies.get(SESSION_COOKIE)
    if not session_id:
        return _to_login(request)
    try:
        principal = await services.auth.authenticate_session(session_id, _client(request))
    except Problem as problem:
        if problem.status == 401:
            response = _to_login(request)
            _clear_cookie(services.console, request, response, SESSION_COOKIE, PREFIX)
            return response
        return _error_page(problem, None)
    except CarillonError as exc:
        return _error_page(problems.from_error(exc), None)
    visit = Visit(request, principal, services, csrf_token(session_id), {})
    try:
        if request.method == "POST":
            visit.form = await read_form(request)
            sent = visit.field(CSRF_FIELD) or ""
            if not hmac.compare_digest(sent.encode(), visit.csrf.encode()):
                raise problems.Problem(
                    403,
                    "csrf",
                    "The form was refused",
                    "the form did not come from this console's session (it may be from "
                    "before you signed in again); reload the page and try again",
                )
        return await page(visit)
    except Problem as problem:
        return _error_page(problem, visit)
    except CarillonError as exc:
        return _error_page(problems.from_error(exc), visit)
    except Exception:
        log.exception("%s %s failed", request.method, request.url.path)
        return _error_page(problems.INTERNAL, visit)


def _error_page(problem: Problem, visit: Visit | None) -> Response:
    context = {"title": problem.title, "detail": problem.detail, "code": problem.status}
    if visit is None:
        response: Response = html(
            "error.html", problem.status, principal=None, notice=None, **context
        )
    else:
        response = visit.page("error.html", problem.status, **context)
    response.headers.update(problem.headers)
    return response


def _to_login(request: Request) -> Response:
    wanted = request.url.path + ("?" + request.url.query if request.url.query else "")
    target = safe_return_path(wanted, "/overview") if request.method == "GET" else "/overview"
    return see_other("/login", {"next": PREFIX + target if target != "/overview" else None})


def login_form_route(services: ConsoleServices) -> Callable[[Request], Awaitable[Response]]:
    async def login_form(request: Request) -> Response:
        """The sign-in form, with a fresh double-submit token for its CSRF check."""
        return secured(_login_page(services.console, request, None, 200))

    return login_form


def _login_page(
    settings: ConsoleSettings, request: Request, error: str | None, status: int
) -> Response:
    nonce = secrets.token_hex(32)
    wanted = safe_return_path(request.query_params.get("next"), "/overview")
    response = html(
        "login.html",
        status,
        principal=None,
        csrf=nonce,
        error=error,
        next=PREFIX + wanted,
        notice=NOTICES.get(request.query_params.get("notice", "")),
        plain_http=settings.scheme(request) == "http" and settings.secure_cookies(request),
    )
    _set_cookie(settings, request, response, LOGIN_COOKIE, nonce, PREFIX + "/login")
    return response


def login_route(services: ConsoleServices) -> Callable[[Request], Awaitable[Response]]:
    async def login(request: Request) -> Response:
        return secured(await _login(services, request))

    return login


async def _login(services: ConsoleServices, request: Request) -> Response:
    settings = services.console
    try:
        form = await read_form(request)
    except Problem as problem:
        return _login_page(settings, request, problem.detail, problem.status)
    sent = (form.get(CSRF_FIELD) or [""])[0]
    expected = request.cookies.get(LOGIN_COOKIE, "")
    if not expected or not hmac.compare_digest(sent.encode(), expected.encode()):
        return _login_page(
            settings, request, "the sign-in form expired or cookies are blocked; try again", 403
        )
    token = (form.get("token") or [""])[0].strip()
    session_id, session_hash = new_session_id()
    try:
        principal: Principal = await services.auth.authenticate(f"Bearer {token}", _client(request))
        await services.ledger.sessions_create(
            SessionsCreate(
                session_hash,
                principal.token_id,
                settings.session_idle_s,
                settings.session_lifetime_s,
            )
        )
    except Problem as problem:
        detail = "that token is not valid (or was revoked)" if problem.status == 401 else ""
        return _login_page(settings, request, detail or problem.detail, problem.status)
    except NotFound:  # the token was revoked between the two calls
        return _login_page(settings, request, "that token is not valid (or was revoked)", 401)
    except CarillonError as exc:
        failure = problems.from_error(exc)
        return _login_page(settings, request, failure.detail, failure.status)
    try:  # the session this sign-in replaces, if any
        await _end_session(services, request.cookies.get(SESSION_COOKIE))
    except CarillonError as exc:  # it still ends when idle; the new one is open
        log.warning("console sign-in could not end the session it replaces: %s", exc)
    log.info("console sign-in by token %s", principal.token_id)
    target = safe_return_path((form.get("next") or [""])[0], "/overview")
    response = see_other(target)
    _set_cookie(settings, request, response, SESSION_COOKIE, session_id, PREFIX)
    _clear_cookie(settings, request, response, LOGIN_COOKIE, PREFIX + "/login")
    return response


async def logout(visit: Visit) -> Response:
    """Sign out: the session is revoked in the ledger (its cookie is useless from now on,
    wherever it was copied to), then the cookie is cleared."""
    await _end_session(visit.services, visit.request.cookies.get(SESSION_COOKIE))
    log.info("console sign-out by token %s", visit.principal.token_id)
    response = see_other("/login", {"notice": "logged-out"})
    _clear_cookie(visit.services.console, visit.request, response, SESSION_COOKIE, PREFIX)
    return response


async def _end_session(services: ConsoleServices, session_id: str | None) -> None:
    """Revoke the session whose cookie holds ``session_id`` (nothing for a malformed one)."""
    if not session_id or not session_id.startswith(SESSION_ID_PREFIX):
        return
    if len(session_id) > SESSION_ID_LENGTH_MAX:
        return
    await services.ledger.sessions_revoke(hash_token(session_id))
    services.auth.forget_session(session_id)
