"""The OpenAPI 3.1 document, generated from the endpoint table and the msgspec schemas.

Nothing here is written by hand per route: paths, methods, parameters, bodies, responses and
security all come from :class:`~engine.api.endpoint.Endpoint` and the structs it names
(through ``msgspec.json.schema_components``), so the document is true by construction; a
test checks that it covers exactly the routes the app serves.
"""

from __future__ import annotations

import re
from typing import Any, Final

import msgspec
import msgspec.inspect

from engine import __version__
from engine.api.endpoint import Access, Endpoint
from engine.api.problems import PROBLEM_CONTENT_TYPE, ProblemBody
from engine.api.schemas import INSTANT_RULE, INSTANT_YEARS, NO_NUL, ExecutionId, Identifier

_PATH_PARAM: Final = re.compile(r"{([a-z_]+)}")
_REF: Final = "#/components/schemas/{name}"
_INSTANT: Final = {
    "type": "string",
    "format": "date-time",
    "pattern": INSTANT_YEARS,
    "description": INSTANT_RULE,
}
_QUERY_TYPES: Final = {
    "string": {"type": "string", "pattern": NO_NUL},
    "integer": {"type": "integer"},
    "boolean": {"type": "boolean"},
    "date-time": _INSTANT,
}
_PATH_TYPES: Final = {
    "schedule_id": Identifier,
    "tenant_id": Identifier,
    "name": Identifier,
    "execution_id": ExecutionId,
}
_ERRORS: Final = {
    400: "malformed request",
    401: "missing, unknown or revoked token",
    403: "the token's scope does not allow this",
    404: "no such record (or another tenant's)",
    409: "conflicts with the current state",
    412: "the version in If-Match is not the current one",
    413: "the body is over the route's limit",
    422: "a field is invalid",
    429: "rate limited: this token's rate, or (before a valid token) the client address's; "
    "see Retry-After",
    503: "the database is unreachable; retry shortly",
}


def openapi_document(
    endpoints: tuple[Endpoint, ...], *, metrics_protected: bool = False
) -> dict[str, Any]:
    """The document of ``endpoints``; ``metrics_protected``: whether this node asks an admin
    token for ``/metrics`` (its security is stated as configured)."""
    types: list[Any] = [ProblemBody]
    for endpoint in endpoints:
        types.extend(t for t in (endpoint.body, endpoint.response) if t is not None)
    schemas, components = msgspec.json.schema_components(types, ref_template=_REF)
    _mark_date_times(types, components)
    by_type = dict(zip(types, schemas, strict=True))
    paths: dict[str, dict[str, Any]] = {}
    for endpoint in endpoints:
        paths.setdefault(endpoint.path, {})[endpoint.method.lower()] = _operation(
            endpoint, by_type, guarded=guarded(endpoint, metrics_protected=metrics_protected)
        )
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Carillon",
            "version": __version__,
            "description": "A distributed cron engine. Errors are RFC 9457 problem details.",
        },
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }


def guarded(endpoint: Endpoint, *, metrics_protected: bool) -> bool:
    """Whether ``endpoint`` needs a token on a node so configured."""
    if endpoint.access is Access.METRICS:
        return metrics_protected
    return endpoint.access is not Access.OPEN


def error_statuses(endpoint: Endpoint, *, guarded: bool) -> set[int]:
    """The error statuses ``endpoint`` may answer (besides a 500, which is a bug)."""
    path_params = bool(_PATH_PARAM.findall(endpoint.path))
    statuses: set[int] = set()
    if guarded:
        statuses |= {401, 429, 503}
        if endpoint.access is not Access.TOKEN:
            statuses.add(403)
        else:  # another tenant's records, ids and filters are 404s
            statuses.add(404)
        if endpoint.method != "GET":
            statuses.add(409)
    if endpoint.body is not None:
        statuses |= {400, 413, 422}
    if endpoint.conditional:
        statuses |= {400, 412}
    if endpoint.query or path_params:
        statuses.add(422)
    if path_params or endpoint.access is Access.METRICS:  # a node may serve no metrics
        statuses.add(404)
    return statuses | set(endpoint.errors)


def _operation(endpoint: Endpoint, by_type: dict[Any, Any], *, guarded: bool) -> dict[str, Any]:
    parameters: list[dict[str, Any]] = [
        {"name": name, "in": "path", "required": True, "schema": _path_schema(name)}
        for name in _PATH_PARAM.findall(endpoint.path)
    ]
    for param in endpoint.query:
        schema: dict[str, Any] = dict(_QUERY_TYPES[param.kind])
        if param.enum:
            schema = {"type": "string", "enum": list(param.enum)}
        for keyword in ("minimum", "maximum", "default"):
            if getattr(param, keyword) is not None:
                schema[keyword] = getattr(param, keyword)
        parameters.append(
            {"name": param.name, "in": "query", "description": param.description, "schema": schema}
        )
    problem = {PROBLEM_CONTENT_TYPE: {"schema": by_type[ProblemBody]}}
    content: dict[str, Any] | None = None
    if endpoint.response is not None:
        content = {"application/json": {"schema": by_type[endpoint.response]}}
    elif endpoint.path == "/metrics":
        content = {"text/plain": {"schema": {"type": "string"}}}
    elif endpoint.path == "/openapi.json":
        content = {"application/json": {"schema": {"type": "object"}}}
    responses: dict[str, Any] = {}
    for status, text in ((endpoint.status, "success"), *endpoint.also):
        responses[str(status)] = {"description": text}
        if content is not None:
            responses[str(status)]["content"] = content
    for status in sorted(error_statuses(endpoint, guarded=guarded)):
        responses.setdefault(str(status), {"description": _ERRORS[status], "content": problem})
    operation: dict[str, Any] = {
        "operationId": _operation_id(endpoint),
        "summary": endpoint.summary,
        "tags": [endpoint.tag],
        "parameters": parameters,
        "responses": dict(sorted(responses.items())),
    }
    if endpoint.body is not None:
        operation["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": by_type[endpoint.body]}},
        }
    if guarded:
        operation["security"] = [{"bearer": []}]
    return operation


def _path_schema(name: str) -> dict[str, Any]:
    kind = _PATH_TYPES.get(name)
    schema: dict[str, Any] = (
        {"type": "string", "minLength": 1} if kind is None else msgspec.json.schema(kind)
    )
    return schema


def _operation_id(endpoint: Endpoint) -> str:
    module = endpoint.handler.__module__.rsplit(".", 1)[-1].removeprefix("routes_")
    return f"{module}_{endpoint.handler.__name__}"


def _mark_date_times(types: list[Any], components: dict[str, Any]) -> None:
    """Add ``format: date-time`` to every datetime field: msgspec writes it only for
    datetimes annotated ``tz=True``, and clients generate better code with it."""
    seen: set[type] = set()
    pending = list(msgspec.inspect.multi_type_info(types))
    while pending:
        info = _unwrap(pending.pop())
        if isinstance(info, msgspec.inspect.StructType):
            if info.cls in seen:
                continue
            seen.add(info.cls)
            properties = components.get(info.cls.__name__, {}).get("properties", {})
            for field in info.fields:
                if _is_date_time(field.type) and field.encode_name in properties:
                    _set_format(properties[field.encode_name])
                pending.append(field.type)
        elif isinstance(info, msgspec.inspect.UnionType):
            pending.extend(info.types)
        elif isinstance(info, msgspec.inspect.ListType | msgspec.inspect.DictType):
            pending.append(
                info.item_type if isinstance(info, msgspec.inspect.ListType) else info.value_type
            )


def _unwrap(info: msgspec.inspect.Type) -> msgspec.inspect.Type:
    """The type a ``Meta`` annotation (constraints, a description) wraps."""
    while isinstance(info, msgspec.inspect.Metadata):
        info = info.type
    return info


def _is_date_time(info: msgspec.inspect.Type) -> bool:
    info = _unwrap(info)
    if isinstance(info, msgspec.inspect.UnionType):
        return any(isinstance(_unwrap(t), msgspec.inspect.DateTimeType) for t in info.types)
    return isinstance(info, msgspec.inspect.DateTimeType)


def _set_format(schema: dict[str, Any]) -> None:
    for option in schema.get("anyOf", [schema]):
        if option.get("type") == "string":
            option["format"] = "date-time"
