"""Signing in and out of the console, and the checks every page makes first.

The session cookie holds the bearer token itself (``HttpOnly``: no script can read it;
``SameSite=Strict``: no other site's page sends it; ``Secure`` when served over https;
``Path=/ui``: the JSON API never sees it). Every request re-authenticates it through the
API's :class:`~engine.api.auth.Authenticator`, so a revoked token stops working in the
console exactly when it stops working in the API (within the token cache's 5 s), rate limits
apply the same, and any node behind a load balancer accepts the session: there is no
server-side state.

CSRF: every form carries a token that a POST must send back. For a session it is
``HMAC-SHA256(key = the bearer token, "carillon-console-csrf")``: bound to the session, the
same on every node, and computable only by whoever holds the token -- which another site's
page does not, since the cookie is HttpOnly and SameSite=Strict. The sign-in form, before
any session exists, uses a double-submit cookie of 32 random bytes instead.
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
from engine.api.auth import Principal
from engine.api.console.web import (
    NOTICES,
    PREFIX,
    ConsoleServices,
    Visit,
    html,
    read_form,
    safe_return_path,
    secured,
    see_other,
)
from engine.api.problems import Problem
from engine.errors import CarillonError

log = logging.getLogger("carillon.api.console")

SESSION_COOKIE: Final = "carillon_session"
LOGIN_COOKIE: Final = "carillon_login"
CSRF_FIELD: Final = "csrf"
_CSRF_CONTEXT: Final = b"carillon-console-csrf"

Page = Callable[[Visit], Awaitable[Response]]


def csrf_token(session_token: str) -> str:
    """The CSRF token of the session whose cookie holds ``session_token``."""
    return hmac.new(session_token.encode(), _CSRF_CONTEXT, hashlib.sha256).hexdigest()


def _client(request: Request) -> str:
    return request.client.host if request.client else "unknown"


def _set_cookie(request: Request, response: Response, name: str, value: str, path: str) -> None:
    response.set_cookie(
        name,
        value,
        path=path,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )


def _clear_cookie(response: Response, name: str, path: str) -> None:
    response.delete_cookie(name, path=path, httponly=True, samesite="strict")


def page_route(services: ConsoleServices, page: Page) -> Callable[[Request], Awaitable[Response]]:
    """The Starlette endpoint of ``page``: authenticate the cookie (no session: to the
    sign-in page), check a form's CSRF token, run the page, and show any problem as an
    error page with the problem's status."""

    async def serve(request: Request) -> Response:
        return secured(await _serve(services, page, request))

    return serve


async def _serve(services: ConsoleServices, page: Page, request: Request) -> Response:
    token = request.cookies.get(SESSION_COOKIE)
    if not token:
        return _to_login(request)
    try:
        principal = await services.auth.authenticate(f"Bearer {token}", _client(request))
    except Problem as problem:
        if problem.status == 401:
            response = _to_login(request)
            _clear_cookie(response, SESSION_COOKIE, PREFIX)
            return response
        return _error_page(problem, None)
    visit = Visit(request, principal, services, csrf_token(token), {})
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
        response: Response = html("error.html", problem.status, principal=None, **context)
    else:
        response = visit.page("error.html", problem.status, **context)
    response.headers.update(problem.headers)
    return response


def _to_login(request: Request) -> Response:
    wanted = request.url.path + ("?" + request.url.query if request.url.query else "")
    target = safe_return_path(wanted, "/overview") if request.method == "GET" else "/overview"
    return see_other("/login", {"next": PREFIX + target if target != "/overview" else None})


async def login_form(request: Request) -> Response:
    """The sign-in form, with a fresh double-submit token for its CSRF check."""
    return secured(_login_page(request, None, 200))


def _login_page(request: Request, error: str | None, status: int) -> Response:
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
    )
    _set_cookie(request, response, LOGIN_COOKIE, nonce, PREFIX + "/login")
    return response


def login_route(services: ConsoleServices) -> Callable[[Request], Awaitable[Response]]:
    async def login(request: Request) -> Response:
        return secured(await _login(services, request))

    return login


async def _login(services: ConsoleServices, request: Request) -> Response:
    try:
        form = await read_form(request)
    except Problem as problem:
        return _login_page(request, problem.detail, problem.status)
    sent = (form.get(CSRF_FIELD) or [""])[0]
    expected = request.cookies.get(LOGIN_COOKIE, "")
    if not expected or not hmac.compare_digest(sent.encode(), expected.encode()):
        return _login_page(
            request, "the sign-in form expired or cookies are blocked; try again", 403
        )
    token = (form.get("token") or [""])[0].strip()
    try:
        principal: Principal = await services.auth.authenticate(f"Bearer {token}", _client(request))
    except Problem as problem:
        detail = "that token is not valid (or was revoked)" if problem.status == 401 else ""
        return _login_page(request, detail or problem.detail, problem.status)
    except CarillonError as exc:
        failure = problems.from_error(exc)
        return _login_page(request, failure.detail, failure.status)
    log.info("console sign-in by token %s", principal.token_id)
    target = safe_return_path((form.get("next") or [""])[0], "/overview")
    response = see_other(target)
    _set_cookie(request, response, SESSION_COOKIE, token, PREFIX)
    _clear_cookie(response, LOGIN_COOKIE, PREFIX + "/login")
    return response


async def logout(visit: Visit) -> Response:
    response = see_other("/login", {"notice": "logged-out"})
    _clear_cookie(response, SESSION_COOKIE, PREFIX)
    return response
