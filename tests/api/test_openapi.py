"""The OpenAPI document: well-formed 3.1, and exactly the routes the app serves."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from starlette.routing import Mount, Route

from engine.api.app import endpoints
from engine.api.endpoint import Access
from engine.api.openapi import openapi_document
from engine.testing import ManualClock
from tests.api.support import START, Api, fake_metrics, memory_ledger, serve

_PLACEHOLDER = re.compile(r"{([a-z_]+)}")
METHODS = {"get", "put", "post", "delete", "patch", "head", "options", "trace"}


@pytest.fixture
async def document(memory_api: Api) -> dict[str, Any]:
    response = await memory_api.client.get("/openapi.json")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("application/json")
    body: dict[str, Any] = response.json()
    return body


def operations(document: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path, item in document["paths"].items():
        for method, operation in item.items():
            assert method in METHODS, (path, method)
            yield method.upper(), path, operation


def refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref":
                yield value
            else:
                yield from refs(value)
    elif isinstance(node, list):
        for value in node:
            yield from refs(value)


def resolve(document: dict[str, Any], ref: str) -> Any:
    assert ref.startswith("#/"), ref
    node: Any = document
    for part in ref[2:].split("/"):
        node = node[part.replace("~1", "/").replace("~0", "~")]
    return node


async def test_document_is_openapi_3_1_with_info(document: dict[str, Any]) -> None:
    assert document["openapi"] == "3.1.0"
    assert document["info"]["title"] == "Carillon"
    assert document["info"]["version"]
    assert document["components"]["securitySchemes"]["bearer"] == {
        "type": "http",
        "scheme": "bearer",
    }


async def test_every_ref_resolves(document: dict[str, Any]) -> None:
    found = list(refs(document))
    assert found
    for ref in found:
        assert isinstance(resolve(document, ref), dict), ref


JSON_SCHEMA_TYPES = {"object", "array", "string", "integer", "number", "boolean", "null"}


def schema_problems(schema: Any, where: str) -> Iterator[str]:
    """What is wrong with ``schema`` as a JSON Schema of the shape msgspec writes."""
    if not isinstance(schema, dict):
        yield f"{where}: not an object"
        return
    kinds = schema.get("type")
    for kind in kinds if isinstance(kinds, list) else [kinds] if kinds else []:
        if kind not in JSON_SCHEMA_TYPES:
            yield f"{where}: unknown type {kind!r}"
    if not ({"type", "$ref", "anyOf", "oneOf", "enum", "const"} & set(schema)) and schema:
        yield f"{where}: says nothing about its values"
    for keyword in ("anyOf", "oneOf"):
        for n, option in enumerate(schema.get(keyword, [])):
            yield from schema_problems(option, f"{where}/{keyword}/{n}")
    for name, sub in schema.get("properties", {}).items():
        yield from schema_problems(sub, f"{where}/properties/{name}")
    if "items" in schema:
        yield from schema_problems(schema["items"], f"{where}/items")
    extra = schema.get("additionalProperties")
    if isinstance(extra, dict):
        yield from schema_problems(extra, f"{where}/additionalProperties")
    for name in schema.get("required", []):
        if name not in schema.get("properties", {}):
            yield f"{where}: requires {name!r}, which it does not define"


async def test_every_component_schema_is_well_formed(document: dict[str, Any]) -> None:
    found = [
        problem
        for name, schema in document["components"]["schemas"].items()
        for problem in schema_problems(schema, name)
    ]
    assert found == []


async def test_operation_ids_are_unique(document: dict[str, Any]) -> None:
    ids = [operation["operationId"] for _, _, operation in operations(document)]
    assert len(ids) == len(set(ids))
    assert all(re.fullmatch(r"[a-z_]+", operation_id) for operation_id in ids)


async def test_every_operation_is_complete(document: dict[str, Any]) -> None:
    for method, path, operation in operations(document):
        where = f"{method} {path}"
        assert operation["summary"], where
        assert operation["tags"], where
        declared = {p["name"] for p in operation["parameters"] if p["in"] == "path"}
        assert declared == set(_PLACEHOLDER.findall(path)), where
        assert all(p["required"] for p in operation["parameters"] if p["in"] == "path"), where
        names = [(p["in"], p["name"]) for p in operation["parameters"]]
        assert len(names) == len(set(names)), where
        endpoint = {(e.method, e.path): e for e in endpoints()}[(method, path)]
        answers = {str(status) for status, _ in ((endpoint.status, ""), *endpoint.also)}
        assert {code for code in operation["responses"] if code.startswith("2")} <= answers
        for code, response in operation["responses"].items():
            assert response["description"], (where, code)
            if code not in answers:
                assert "application/problem+json" in response["content"], (where, code)
        if method in ("GET", "DELETE"):
            assert "requestBody" not in operation, where


@pytest.mark.parametrize("protected", [False, True], ids=["metrics-open", "metrics-protected"])
async def test_guarded_operations_declare_bearer_security_as_configured(protected: bool) -> None:
    """``/metrics`` is stated as the node serves it: open by default, admin-only (with the
    401 and 403 that brings) on a node run with ``--metrics-protected``."""
    clock = ManualClock(START)
    async with serve(
        memory_ledger(clock), clock, "memory", metrics_protected=protected, metrics=fake_metrics
    ) as api:
        document = (await api.client.get("/openapi.json")).json()
        metrics = await api.client.get("/metrics")
    assert metrics.status_code == (401 if protected else 200)
    open_paths = {e.path for e in endpoints() if e.access is Access.OPEN}
    if not protected:
        open_paths.add("/metrics")
    for method, path, operation in operations(document):
        if path in open_paths:
            assert "security" not in operation, (method, path)
            assert not {"401", "403", "429"} & set(operation["responses"]), (method, path)
        else:
            assert operation["security"] == [{"bearer": []}], (method, path)
            assert {"401", "429"} <= set(operation["responses"]), (method, path)
    assert ("403" in document["paths"]["/metrics"]["get"]["responses"]) is protected


async def test_put_documents_201_when_it_creates_and_200_when_it_replaces(
    memory_api: Api, document: dict[str, Any]
) -> None:
    responses = document["paths"]["/v1/schedules/{schedule_id}"]["put"]["responses"]
    body = {"cron_expr": "*/5 * * * *", "task_type": "noop"}
    created = await memory_api.client.put("/v1/schedules/p1", json=body, headers=memory_api.admin)
    replaced = await memory_api.client.put(
        "/v1/schedules/p1", json={**body, "enabled": False}, headers=memory_api.admin
    )
    assert (created.status_code, replaced.status_code) == (201, 200)
    for response in (responses["201"], responses["200"]):
        assert response["content"]["application/json"]["schema"] == {
            "$ref": "#/components/schemas/Schedule"
        }


async def test_readyz_documents_its_503_as_the_health_it_answers(
    document: dict[str, Any],
) -> None:
    responses = document["paths"]["/readyz"]["get"]["responses"]
    assert set(responses) == {"200", "503"}
    assert responses["503"]["content"] == responses["200"]["content"]


async def test_if_match_and_412_are_documented_only_where_routes_honour_them(
    document: dict[str, Any],
) -> None:
    with_412 = {
        (method, path) for method, path, op in operations(document) if "412" in op["responses"]
    }
    assert with_412 == {
        ("PUT", "/v1/schedules/{schedule_id}"),
        ("PATCH", "/v1/schedules/{schedule_id}"),
        ("DELETE", "/v1/schedules/{schedule_id}"),
    }


async def test_document_covers_exactly_the_apps_routes(
    memory_api: Api, document: dict[str, Any]
) -> None:
    served = set()
    for route in memory_api.app.routes:
        if isinstance(route, Mount) and route.path == "/ui":
            continue  # the operator console (HTML, tests/console): not part of the API
        assert isinstance(route, Route)
        for method in route.methods or ():
            if method != "HEAD":  # Starlette adds HEAD to every GET
                served.add((method, route.path))
    documented = {(method, path) for method, path, _ in operations(document)}
    assert documented == served
    assert documented == {(e.method, e.path) for e in endpoints()}


async def test_served_document_is_the_generated_one(document: dict[str, Any]) -> None:
    import msgspec

    generated = msgspec.json.decode(msgspec.json.encode(openapi_document(endpoints())))
    assert document == generated


async def test_request_bodies_are_documented_where_routes_read_them(
    document: dict[str, Any],
) -> None:
    by_route = {(e.method, e.path): e for e in endpoints()}
    for method, path, operation in operations(document):
        endpoint = by_route[(method, path)]
        assert ("requestBody" in operation) == (endpoint.body is not None), (method, path)
        assert str(endpoint.status) in operation["responses"], (method, path)


async def test_every_datetime_field_is_documented_as_date_time(document: dict[str, Any]) -> None:
    schemas = document["components"]["schemas"]

    def formats(component: str, field: str) -> list[str | None]:
        schema = schemas[component]["properties"][field]
        return [option.get("format") for option in schema.get("anyOf", [schema])]

    assert formats("Schedule", "next_run_at") == ["date-time", None]
    assert formats("Execution", "planned_at") == ["date-time"]
    assert formats("Attempt", "finished_at") == ["date-time"]
    assert formats("BackfillIn", "from") == ["date-time"]
    assert formats("PartitionView", "checkpoint_at") == ["date-time", None]
