"""The operator console at ``/ui``: server-rendered pages over the API's own routes.

Every node serves it beside the JSON API, with the same tokens and the same rules: a page
reads and acts only through the ``/v1`` route handlers (:meth:`~engine.api.console.web.
Visit.call`), so a tenant token sees exactly what it sees through the API, and another
tenant's record is a 404 here too. Pages are HTML rendered on the server (Jinja2, escaping
everything), charts are inline SVG computed on the server (:mod:`~engine.api.console.
charts`), and the small stylesheet and script ship inside the package: the console works
offline and reads fully without JavaScript (the script only adds "select all").

Security (see :mod:`~engine.api.console.session` and :mod:`~engine.api.console.web`): the
session cookie holds a random session id, never the token (HttpOnly, SameSite=Strict,
Secure unless the node serves plain-http development); the ledger keeps only its hash, with
idle and absolute expiry, revoked at sign-out and with its token, and every request checks
it; every form carries a CSRF token; every response carries
a strict Content-Security-Policy and refuses framing; no page renders a task type's settings
(they may hold webhook secrets) or a token.

Modules: ``web`` (templates, headers, forms, route calls), ``session`` (sign-in, the page
wrapper), ``cluster`` (overview, forecast, nodes and partitions), ``schedules`` (and the
zone's clock changes), ``executions`` (and dead letters), ``charts`` (pure SVG geometry).
"""

from __future__ import annotations

import hashlib
from importlib import resources
from typing import Final

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import BaseRoute, Mount, Route

from engine.api.console import cluster, executions, schedules, session
from engine.api.console.web import PREFIX, ConsoleServices, link, secured

STATIC_FILES: Final = {"console.css": "text/css", "console.js": "text/javascript"}


def _static() -> dict[str, tuple[bytes, str, str]]:
    """The shipped assets, read once: name -> (body, content type, ETag)."""
    folder = resources.files("engine.api.console") / "static"
    assets = {}
    for name, content_type in STATIC_FILES.items():
        body = (folder / name).read_bytes()
        etag = '"' + hashlib.sha256(body).hexdigest()[:16] + '"'
        assets[name] = (body, f"{content_type}; charset=utf-8", etag)
    return assets


_ASSETS: Final = _static()


async def _asset(request: Request) -> Response:
    found = _ASSETS.get(request.path_params["name"])
    if found is None:
        return secured(Response("not found", 404, media_type="text/plain"))
    body, content_type, etag = found
    if request.headers.get("if-none-match") == etag:
        return secured(Response(status_code=304, headers={"ETag": etag}))
    response = secured(Response(body, media_type=content_type, headers={"ETag": etag}))
    response.headers["Cache-Control"] = "public, max-age=3600"
    return response


async def _home(request: Request) -> Response:
    return secured(RedirectResponse(link("/overview"), status_code=303))


def mount(services: ConsoleServices) -> Mount:
    """The console's routes under :data:`~engine.api.console.web.PREFIX`."""

    def page(path: str, handler: session.Page, method: str = "GET") -> Route:
        return Route(path, session.page_route(services, handler), methods=[method])

    routes: list[BaseRoute] = [
        Route("/", _home, methods=["GET"]),
        Route("/static/{name}", _asset, methods=["GET"]),
        Route("/login", session.login_form_route(services), methods=["GET"]),
        Route("/login", session.login_route(services), methods=["POST"]),
        page("/logout", session.logout, "POST"),
        page("/overview", cluster.overview),
        page("/forecast", cluster.forecast),
        page("/schedules", schedules.schedules),
        page("/schedules/{schedule_id}", schedules.schedule),
        page("/schedules/{schedule_id}/{action}", schedules.act, "POST"),
        page("/executions", executions.executions),
        page("/executions/{execution_id}", executions.execution),
        page("/dead-letters", executions.dead_letters),
        page("/dead-letters/replay", executions.replay, "POST"),
        page("/cluster", cluster.cluster),
    ]
    return Mount(PREFIX, routes=routes)
