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

_PATH_PARAM: Final = re.compile(r"{([a-z_]+)}")
_REF: Final = "#/components/schemas/{name}"
_QUERY_TYPES: Final = {
    "string": {"type": "string"},
    "integer": {"type": "integer"},
    "boolean": {"type": "boolean"},
    "date-time": {"type": "string", "format": "date-time"},
}
_ERRORS: Final = {
    "400": "malformed request",
    "401": "missing, unknown or revoked token",
    "403": "the token's scope does not allow this",
    "404": "no such record (or another tenant's)",
    "409": "conflicts with the current state",
    "412": "the version in If-Match is not the current one",
    "413": "the body is over the route's limit",
    "422": "a field is invalid",
    "429": "rate limited; see Retry-After",
    "503": "the database is unreachable; retry shortly",
}


def openapi_document(endpoints: tuple[Endpoint, ...]) -> dict[str, Any]:
    types: list[Any] = [ProblemBody]
    for endpoint in endpoints:
        types.extend(t for t in (endpoint.body, endpoint.response) if t is not None)
    schemas, components = msgspec.json.schema_components(types, ref_template=_REF)
    _mark_date_times(types, components)
    by_type = dict(zip(types, schemas, strict=True))
    paths: dict[str, dict[str, Any]] = {}
    for endpoint in endpoints:
        paths.setdefault(endpoint.path, {})[endpoint.method.lower()] = _operation(endpoint, by_type)
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


def _operation(endpoint: Endpoint, by_type: dict[Any, Any]) -> dict[str, Any]:
    parameters: list[dict[str, Any]] = [
        {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
        for name in _PATH_PARAM.findall(endpoint.path)
    ]
    for param in endpoint.query:
        schema: dict[str, Any] = dict(_QUERY_TYPES[param.kind])
        if param.enum:
            schema["enum"] = list(param.enum)
        parameters.append(
            {"name": param.name, "in": "query", "description": param.description, "schema": schema}
        )
    problem = {PROBLEM_CONTENT_TYPE: {"schema": by_type[ProblemBody]}}
    success: dict[str, Any] = {"description": "success"}
    if endpoint.response is not None:
        success["content"] = {"application/json": {"schema": by_type[endpoint.response]}}
    elif endpoint.path == "/metrics":
        success["content"] = {"text/plain": {"schema": {"type": "string"}}}
    elif endpoint.path == "/openapi.json":
        success["content"] = {"application/json": {"schema": {"type": "object"}}}
    operation: dict[str, Any] = {
        "operationId": _operation_id(endpoint),
        "summary": endpoint.summary,
        "tags": [endpoint.tag],
        "parameters": parameters,
        "responses": {
            str(endpoint.status): success,
            **{code: {"description": text, "content": problem} for code, text in _ERRORS.items()},
        },
    }
    if endpoint.body is not None:
        operation["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": by_type[endpoint.body]}},
        }
    if endpoint.access is not Access.OPEN:
        operation["security"] = [{"bearer": []}]
    return operation


def _operation_id(endpoint: Endpoint) -> str:
    module = endpoint.handler.__module__.rsplit(".", 1)[-1].removeprefix("routes_")
    return f"{module}_{endpoint.handler.__name__}"


def _mark_date_times(types: list[Any], components: dict[str, Any]) -> None:
    """Add ``format: date-time`` to every datetime field: msgspec writes it only for
    datetimes annotated ``tz=True``, and clients generate better code with it."""
    seen: set[type] = set()
    pending = list(msgspec.inspect.multi_type_info(types))
    while pending:
        info = pending.pop()
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


def _is_date_time(info: msgspec.inspect.Type) -> bool:
    if isinstance(info, msgspec.inspect.UnionType):
        return any(isinstance(t, msgspec.inspect.DateTimeType) for t in info.types)
    return isinstance(info, msgspec.inspect.DateTimeType)


def _set_format(schema: dict[str, Any]) -> None:
    for option in schema.get("anyOf", [schema]):
        if option.get("type") == "string":
            option["format"] = "date-time"
