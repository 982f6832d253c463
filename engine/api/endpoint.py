"""One table of endpoints drives routing, auth, body limits, decoding and the OpenAPI document.

Each route is an :class:`Endpoint`: method, path, who may call it (:class:`Access`), the body
schema and its size limit, the query parameters, the response schema. :func:`asgi_route`
wraps its handler so that every route, without exception, authenticates and rate-limits the
caller, refuses an oversized body with 413 before reading past the limit, decodes the body
into its struct (400 for bad JSON, 422 for a bad shape), and turns every error into a problem
document. Because :mod:`engine.api.openapi` reads the same table, the document cannot
describe a route that does not exist, or miss one that does.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final, Protocol, TypeVar

import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from engine.api import problems
from engine.api.auth import Authenticator, Principal
from engine.api.problems import Problem
from engine.api.schedule_input import NUL_ESCAPE
from engine.api.schemas import INSTANT_MAX, INSTANT_MIN
from engine.core.instants import parse_instant
from engine.errors import CarillonError, ValidationError
from engine.ledger.base import Ledger
from engine.ledger.params import PAGE_SIZE_MAX

log = logging.getLogger("carillon.api")

BODY_BYTES_MAX: Final = 256 * 1024
"""Default body limit. One schedule with a full payload (64 KiB of compact UTF-8 JSON) fits
however its client escapes it: ``\\u`` escapes of non-ASCII text (Python's ``json.dumps``)
take at most three times the bytes, 192 KiB."""
BATCH_BODY_BYTES_MAX: Final = 8 * 1024 * 1024
"""The batch route's limit: a full batch (10,000 schedules) may average 838 bytes each -- a
schedule with every field set and a few hundred bytes of payload. Batches of larger
schedules are split by the client; the 413 says so."""
JSON: Final = "application/json"
_NUL: Final = "\x00"
E = TypeVar("E", bound=enum.Enum)


class Access(enum.Enum):
    OPEN = "open"
    """No token (health checks)."""
    TOKEN = "token"
    """Any valid token; tenant tokens see only their own tenant."""
    ADMIN = "admin"
    METRICS = "metrics"
    """Open, unless the node is configured to protect ``/metrics`` (then admin)."""


@dataclass(frozen=True)
class QueryParam:
    name: str
    kind: str
    """OpenAPI type: ``string``, ``integer``, ``date-time`` or ``boolean``."""
    description: str
    enum: tuple[str, ...] = ()
    minimum: int | None = None
    """An integer's bounds and default: :meth:`Call.query_int` holds to them, and the
    OpenAPI document states them."""
    maximum: int | None = None
    default: int | None = None


@dataclass(frozen=True)
class Raw:
    """A body sent as is (the metrics exposition, the cached OpenAPI document)."""

    body: bytes
    content_type: str


@dataclass(frozen=True)
class Reply:
    """A handler's answer: the value is encoded as JSON (``None``: no body)."""

    value: Any
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)


PAGE_SIZE_DEFAULT: Final = 100
LIMIT: Final = QueryParam(
    "limit",
    "integer",
    f"page size, 1..{PAGE_SIZE_MAX} (default {PAGE_SIZE_DEFAULT})",
    minimum=1,
    maximum=PAGE_SIZE_MAX,
    default=PAGE_SIZE_DEFAULT,
)
"""The page size of every listing."""


@dataclass
class Call:
    """What a handler gets: the request, its caller, its decoded body."""

    request: Request
    principal: Principal | None
    body: Any
    api: Any
    """The :class:`~engine.api.app.ApiContext` serving it."""

    def path(self, name: str) -> str:
        value: str = self.request.path_params[name]
        if _NUL in value:  # no id holds one, and PostgreSQL cannot even compare with it
            raise problems.not_found(f"no {name} contains a NUL character")
        return value

    @property
    def who(self) -> Principal:
        if self.principal is None:  # pragma: no cover - the table guarantees a principal
            raise RuntimeError("this route has no authenticated caller")
        return self.principal

    def query_str(self, name: str) -> str | None:
        value = self.request.query_params.get(name)
        if value is not None and _NUL in value:
            raise problems.invalid(f"query parameter {name!r} must not contain NUL characters")
        return value

    def query_int(self, param: QueryParam) -> int:
        """The integer parameter, within the bounds ``param`` declares; 422 otherwise."""
        name, low, high = param.name, param.minimum, param.maximum
        if param.default is None or low is None or high is None:  # pragma: no cover - a bug
            raise RuntimeError(f"query parameter {name!r} declares no default or bounds")
        text = self.request.query_params.get(name)
        if text is None:
            return param.default
        try:
            value = int(text)
        except ValueError:
            raise problems.invalid(f"query parameter {name!r} must be an integer") from None
        if not low <= value <= high:
            raise problems.invalid(f"query parameter {name!r} must be between {low} and {high}")
        return value

    def query_instant(self, name: str) -> datetime | None:
        text = self.request.query_params.get(name)
        if text is None:
            return None
        try:
            value = parse_instant(text, field=name)
        except OverflowError:  # an offset that moves it past year 1 or 9999
            raise problems.invalid(f"query parameter {name!r} is out of range") from None
        return check_instant(value, name)

    def query_enum(self, name: str, kind: type[E]) -> E | None:
        text = self.request.query_params.get(name)
        if text is None:
            return None
        try:
            return kind(text)
        except ValueError:
            choices = ", ".join(str(member.value) for member in kind)
            raise problems.invalid(f"query parameter {name!r} must be one of {choices}") from None


def check_instant(value: datetime, name: str) -> datetime:
    """``value``, if it has a UTC offset and lies in [:data:`INSTANT_MIN`,
    :data:`INSTANT_MAX`); 422 otherwise."""
    if value.tzinfo is None:
        raise problems.invalid(f"{name!r} needs a UTC offset (e.g. 2026-03-08T07:00:00Z)")
    try:
        in_range = INSTANT_MIN <= value < INSTANT_MAX
    except OverflowError:
        in_range = False
    if not in_range:
        raise problems.invalid(
            f"{name!r} must lie between {INSTANT_MIN.year} and {INSTANT_MAX.year}"
        )
    return value


Handler = Callable[[Call], Awaitable[Reply]]


@dataclass(frozen=True)
class Endpoint:
    method: str
    path: str
    handler: Handler
    summary: str
    access: Access = Access.TOKEN
    body: type | None = None
    response: Any = None
    """The response body's type, for the OpenAPI document (``None``: no body)."""
    status: int = 200
    also: tuple[tuple[int, str], ...] = ()
    """Other statuses the handler answers with the same body type, and when (``PUT`` answers
    201 when it created, 200 when it replaced)."""
    conditional: bool = False
    """The handler honours ``If-Match`` (400 when malformed, 412 when it does not match)."""
    body_bytes_max: int = BODY_BYTES_MAX
    too_large: str = ""
    """What the 413 adds to its detail (how to stay under the limit)."""
    query: tuple[QueryParam, ...] = ()
    tag: str = "schedules"
    errors: tuple[int, ...] = ()
    """Error statuses beyond those its access, body and parameters imply (a token route
    that refuses some callers with 403 by what they ask)."""


class ApiServices(Protocol):
    """What the wrapper needs from the app: the ledger, the authenticator, and whether
    ``/metrics`` is protected."""

    @property
    def ledger(self) -> Ledger: ...
    @property
    def auth(self) -> Authenticator: ...
    @property
    def metrics_protected(self) -> bool: ...


def asgi_route(endpoint: Endpoint, api: ApiServices) -> Route:
    """The Starlette route serving ``endpoint`` with its checks around the handler."""

    async def serve(request: Request) -> Response:
        try:
            principal = await _authenticate(endpoint, api, request)
            body = await _read_body(endpoint, request)
            reply = await endpoint.handler(Call(request, principal, body, api))
        except Problem as problem:
            return problem_response(problem, request.url.path)
        except CarillonError as exc:
            if not isinstance(exc, ValidationError):
                log.info("%s %s: %s", request.method, request.url.path, exc)
            return problem_response(problems.from_error(exc), request.url.path)
        except Exception:
            log.exception("%s %s failed", request.method, request.url.path)
            return problem_response(problems.INTERNAL, request.url.path)
        if reply.value is None:
            return Response(status_code=reply.status, headers=reply.headers)
        if isinstance(reply.value, Raw):
            return Response(reply.value.body, reply.status, reply.headers, reply.value.content_type)
        return Response(
            msgspec.json.encode(reply.value),
            status_code=reply.status,
            headers=reply.headers,
            media_type=JSON,
        )

    return Route(endpoint.path, serve, methods=[endpoint.method], name=endpoint.summary)


def problem_response(problem: Problem, instance: str | None = None) -> Response:
    return Response(
        problems.encode_problem(problem, instance),
        status_code=problem.status,
        headers=problem.headers,
        media_type=problems.PROBLEM_CONTENT_TYPE,
    )


async def _authenticate(endpoint: Endpoint, api: ApiServices, request: Request) -> Principal | None:
    if endpoint.access is Access.OPEN or (
        endpoint.access is Access.METRICS and not api.metrics_protected
    ):
        return None
    client = request.client.host if request.client else "unknown"
    principal = await api.auth.authenticate(request.headers.get("authorization"), client)
    if endpoint.access in (Access.ADMIN, Access.METRICS):
        principal.require_admin()
    return principal


async def _read_body(endpoint: Endpoint, request: Request) -> Any:
    if endpoint.body is None:
        return None
    limit = endpoint.body_bytes_max
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            if int(declared) > limit:
                raise problems.too_large(limit, endpoint.too_large)
        except ValueError:
            raise problems.bad_request("the Content-Length header is not a number") from None
    chunks: list[bytes] = []
    size = 0
    # Closed explicitly: stopping at the limit must not leave the generator to the collector.
    async with aclosing(request.stream()) as stream:
        async for chunk in stream:
            size += len(chunk)
            if size > limit:
                raise problems.too_large(limit, endpoint.too_large)
            chunks.append(chunk)
    raw = b"".join(chunks)
    if not raw.strip():
        raw = b"{}"
    try:
        body: Any = msgspec.json.decode(raw, type=endpoint.body)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise problems.decode_error(exc) from None
    except UnicodeDecodeError:  # msgspec raises it for invalid UTF-8 inside a string
        raise problems.bad_request("the body is not valid UTF-8") from None
    except RecursionError:
        raise problems.bad_request("the body nests arrays or objects too deeply") from None
    if NUL_ESCAPE.search(raw):
        # No field may hold one (ids, reasons, payloads), and PostgreSQL stores none.
        raise problems.invalid("the body must not contain NUL characters (\\u0000)")
    return body
