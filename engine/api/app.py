"""The API application: the endpoint table, the shared context, and the open routes.

:func:`create_app` builds a Starlette app from every module's ``ENDPOINTS`` plus the open
routes (``/healthz``, ``/readyz``, ``/metrics``, ``/openapi.json``), and mounts the operator
console (:mod:`engine.api.console`) at ``/ui``. It holds no state of
its own beyond caches: any node answers any request the same way, because every read and
write goes to the ledger.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

import msgspec
import trio
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Match, Route

from engine.api import (
    console,
    problems,
    routes_admin,
    routes_executions,
    routes_manifests,
    routes_schedules,
)
from engine.api.auth import Authenticator
from engine.api.console.web import ConsoleSettings
from engine.api.endpoint import (
    Access,
    Call,
    Endpoint,
    Raw,
    Reply,
    asgi_route,
    problem_response,
)
from engine.api.schemas import Health
from engine.config import SLO_TARGET_S_DEFAULT
from engine.errors import CarillonError
from engine.handlers.base import HandlerOptions
from engine.handlers.brokers import BrokerBridge
from engine.ledger.base import Ledger

READY_PROBE_TIMEOUT_S: Final = 2.0
BROKER_LOOKUP_TIMEOUT_S: Final = 2.0
"""The longest a task-type write waits on a look at its broker (a warning says if it ran
out)."""
SCHEDULE_ID_PREFIX: Final = "sch_"
ANONYMOUS_RATE_PER_S: Final = 5.0
ANONYMOUS_BURST: Final = 20


class ApiConfig(msgspec.Struct, frozen=True, kw_only=True):
    bind: str = "127.0.0.1:8080"
    """``HOST:PORT`` to listen on (port 0: any free port)."""
    shutdown_grace_s: float = 5.0
    """How long in-flight requests may finish after shutdown starts."""


def _new_schedule_id() -> str:
    return SCHEDULE_ID_PREFIX + secrets.token_hex(8)


@dataclass
class ApiContext:
    """Everything a route may use. ``metrics`` renders the node's exposition."""

    ledger: Ledger
    auth: Authenticator
    metrics_protected: bool = False
    metrics: Callable[[str | None], tuple[bytes, str]] | None = None
    new_id: Callable[[], str] = _new_schedule_id
    stopping: bool = False
    """Set when the node starts shutting down: ``/readyz`` turns 503 at once."""
    openapi: bytes = b""
    extra_checks: dict[str, Callable[[], str | None]] = field(default_factory=dict)
    """Readiness checks: name -> ``None`` when fine, else what is wrong."""
    slo_target_s: float = SLO_TARGET_S_DEFAULT
    """The start SLO the console's overview judges first attempts by (the node's own)."""
    console: ConsoleSettings = field(default_factory=ConsoleSettings)
    """How the console's sessions are served (cookies, expiry, trusted proxies)."""
    brokers: BrokerBridge | None = None
    """The broker bridge through which a task-type write looks at its broker (a ``nats``
    stream's duplicate window); the API server opens one while it runs, if none is given.
    ``None``: writes do not look, and their answers say so."""
    handler_options: HandlerOptions = field(default_factory=HandlerOptions)
    """The node's handler policy: a look at a broker goes only where a publish may
    (``--broker-allow-cidrs``)."""
    broker_lookup_timeout_s: float = BROKER_LOOKUP_TIMEOUT_S


async def healthz(call: Call) -> Reply:
    return Reply(Health("ok"))


async def readyz(call: Call) -> Reply:
    api: ApiContext = call.api
    checks: dict[str, str] = {}
    checks["node"] = "stopping" if api.stopping else "ok"
    with trio.move_on_after(READY_PROBE_TIMEOUT_S) as scope:
        try:
            await api.ledger.cluster_get()
            checks["database"] = "ok"
        except CarillonError as exc:
            checks["database"] = str(exc)
    if scope.cancelled_caught:
        checks["database"] = f"no answer within {READY_PROBE_TIMEOUT_S:g} s"
    for name, check in api.extra_checks.items():
        checks[name] = check() or "ok"
    ready = all(value == "ok" for value in checks.values())
    return Reply(Health("ready" if ready else "not ready", checks), 200 if ready else 503)


async def metrics(call: Call) -> Reply:
    api: ApiContext = call.api
    if api.metrics is None:
        raise problems.not_found("this process serves no metrics")
    body, content_type = api.metrics(call.request.headers.get("accept"))
    return Reply(Raw(body, content_type))


async def openapi(call: Call) -> Reply:
    api: ApiContext = call.api
    return Reply(Raw(api.openapi, "application/json"))


OPEN_ENDPOINTS: Final = (
    Endpoint(
        "GET",
        "/healthz",
        healthz,
        "The process is alive",
        access=Access.OPEN,
        response=Health,
        tag="operations",
    ),
    Endpoint(
        "GET",
        "/readyz",
        readyz,
        "Ready for traffic: database reachable, schema current, not shutting down",
        access=Access.OPEN,
        response=Health,
        also=((503, "not ready: the failing check is named"),),
        tag="operations",
    ),
    Endpoint(
        "GET",
        "/metrics",
        metrics,
        "Prometheus metrics of this node",
        access=Access.METRICS,
        tag="operations",
    ),
    Endpoint(
        "GET",
        "/openapi.json",
        openapi,
        "This API's OpenAPI 3.1 document",
        access=Access.OPEN,
        tag="operations",
    ),
)


def endpoints() -> tuple[Endpoint, ...]:
    """Every endpoint the API serves, in routing order."""
    return (
        *OPEN_ENDPOINTS,
        *routes_schedules.ENDPOINTS,
        *routes_executions.ENDPOINTS,
        *routes_admin.ENDPOINTS,
        *routes_manifests.ENDPOINTS,
    )


def create_app(context: ApiContext) -> Starlette:
    from engine.api.openapi import openapi_document

    document = openapi_document(endpoints(), metrics_protected=context.metrics_protected)
    context.openapi = msgspec.json.encode(document)
    return Starlette(
        routes=[
            *(asgi_route(endpoint, context) for endpoint in endpoints()),
            console.mount(context),  # the operator console at /ui, on the same routes
        ],
        exception_handlers={HTTPException: _http_exception},  # 404/405 as problems
    )


async def _http_exception(request: Request, exc: Exception) -> Response:
    status = exc.status_code if isinstance(exc, HTTPException) else 500
    if status == 405:
        inner = exc.headers if isinstance(exc, HTTPException) else None  # the console's
        allowed = _allowed_methods(request) or (inner or {}).get("Allow", "")
        problem = problems.Problem(
            405,
            "method-not-allowed",
            "Method not allowed",
            f"{request.method} is not allowed on {request.url.path}; it allows {allowed}",
            headers={"Allow": allowed},
        )
    elif status == 404:
        problem = problems.not_found(f"no route {request.url.path}; see /openapi.json")
    else:
        problem = problems.Problem(status, "http-error", "HTTP error", str(exc))
    return problem_response(problem, request.url.path)


def _allowed_methods(request: Request) -> str:
    """Every method some route serves on the request's path (RFC 9110's ``Allow``). Each
    endpoint is a route of its own, so the one the router tried knows only its own method."""
    methods: set[str] = set()
    scope = {**request.scope, "method": "GET"}
    routes = request.app.routes if isinstance(request.app, Starlette) else []
    for route in routes:
        if isinstance(route, Route) and route.matches(scope)[0] is not Match.NONE:
            methods |= route.methods or set()
    return ", ".join(sorted(methods))
