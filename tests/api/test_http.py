"""The HTTP layer every route shares: decoding, body limits, unknown routes and methods,
probes, and a database that is down -- always answered with a problem document."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest

from engine.api.app import endpoints
from engine.api.endpoint import BATCH_BODY_BYTES_MAX, BODY_BYTES_MAX, Access, Endpoint
from engine.testing import FaultyLedger, ManualClock
from tests.api.support import (
    PROBLEM,
    START,
    Api,
    assert_problem,
    memory_ledger,
    prepare_ledger,
    serve,
    stream_request,
)
from tests.api.test_auth import concrete, label

WITH_BODY = [e for e in endpoints() if e.body is not None]
NORMAL_BODY = [e for e in WITH_BODY if e.body_bytes_max == BODY_BYTES_MAX]


def pieces(total: int, size: int = 16 * 1024) -> list[bytes]:
    """``total`` bytes of JSON whitespace in pieces of ``size``."""
    return [b" " * min(size, total - sent) for sent in range(0, total, size)]


async def streamed(api: Api, method: str, path: str, total: int) -> dict[str, object]:
    """Send ``total`` bytes with no Content-Length; the problem it gets, checked as one."""
    response = await stream_request(api.app, method, path, api.admin, pieces(total))
    assert response.headers["content-type"].startswith(PROBLEM)
    body: dict[str, object] = json.loads(response.body)
    assert body["status"] == response.status_code
    return body


@pytest.mark.parametrize("endpoint", WITH_BODY, ids=label)
async def test_body_that_is_not_json_gets_400(memory_api: Api, endpoint: Endpoint) -> None:
    response = await memory_api.client.request(
        endpoint.method, concrete(endpoint.path), content=b"{not json", headers=memory_api.admin
    )
    assert_problem(response, 400, "bad-request")


@pytest.mark.parametrize("endpoint", WITH_BODY, ids=label)
async def test_body_of_the_wrong_shape_gets_422(memory_api: Api, endpoint: Endpoint) -> None:
    for body in (b"[]", b'"text"', b"42", b"null", b'{"no_such_field": 1}'):
        response = await memory_api.client.request(
            endpoint.method, concrete(endpoint.path), content=body, headers=memory_api.admin
        )
        assert_problem(response, 422, "invalid-field")


async def test_body_that_is_not_utf8_gets_400(memory_api: Api) -> None:
    response = await memory_api.client.post(
        "/v1/schedules", content=b'{"cron_expr": "\xff"}', headers=memory_api.admin
    )
    assert_problem(response, 400, "bad-request")


@pytest.mark.parametrize("depth", [990, 5000, 40_000])
async def test_body_nested_too_deeply_gets_400(memory_api: Api, depth: int) -> None:
    nested = b"[" * depth + b"]" * depth
    body = b'{"cron_expr": "* * * * *", "task_type": "noop", "payload": {"a": ' + nested + b"}}"
    response = await memory_api.client.post("/v1/schedules", content=body, headers=memory_api.admin)
    assert_problem(response, 400, "bad-request")


async def test_body_nested_900_deep_is_accepted(api: Api) -> None:
    nested = b"[" * 900 + b"]" * 900
    body = b'{"cron_expr": "* * * * *", "task_type": "noop", "payload": {"a": ' + nested + b"}}"
    response = await api.client.post("/v1/schedules", content=body, headers=api.admin)
    assert response.status_code == 201, response.text


async def test_non_numeric_content_length_gets_400(memory_api: Api) -> None:
    response = await memory_api.client.post(
        "/v1/schedules",
        content=b"{}",
        headers={**memory_api.admin, "Content-Length": "abc"},
    )
    assert_problem(response, 400, "bad-request")


@pytest.mark.parametrize("endpoint", NORMAL_BODY, ids=label)
async def test_body_over_the_limit_with_content_length_gets_413(
    memory_api: Api, endpoint: Endpoint
) -> None:
    response = await memory_api.client.request(
        endpoint.method,
        concrete(endpoint.path),
        content=b" " * (BODY_BYTES_MAX + 1),
        headers=memory_api.admin,
    )
    body = assert_problem(response, 413, "payload-too-large")
    assert str(BODY_BYTES_MAX) in body["detail"]


@pytest.mark.parametrize("endpoint", NORMAL_BODY, ids=label)
async def test_streamed_body_over_the_limit_without_content_length_gets_413(
    memory_api: Api, endpoint: Endpoint
) -> None:
    body = await streamed(memory_api, endpoint.method, concrete(endpoint.path), BODY_BYTES_MAX + 1)
    assert body["status"] == 413
    assert body["type"] == "urn:carillon:problem:payload-too-large"


async def test_body_of_exactly_the_limit_is_read(memory_api: Api) -> None:
    response = await memory_api.client.post(
        "/v1/schedules", content=b" " * BODY_BYTES_MAX, headers=memory_api.admin
    )
    # Whitespace is an empty body: it is decoded (and lacks the required fields).
    assert_problem(response, 422, "invalid-field")


async def test_batch_over_its_limit_gets_413_with_and_without_content_length(
    memory_api: Api,
) -> None:
    response = await memory_api.client.post(
        "/v1/schedules:batch",
        content=b" " * (BATCH_BODY_BYTES_MAX + 1),
        headers=memory_api.admin,
    )
    body = assert_problem(response, 413, "payload-too-large")
    assert str(BATCH_BODY_BYTES_MAX) in body["detail"]
    streamed_body = await streamed(
        memory_api, "POST", "/v1/schedules:batch", BATCH_BODY_BYTES_MAX + 1
    )
    assert streamed_body["status"] == 413


async def test_batch_between_the_two_limits_is_read(memory_api: Api) -> None:
    response = await memory_api.client.post(
        "/v1/schedules:batch", content=b" " * (BODY_BYTES_MAX * 4), headers=memory_api.admin
    )
    assert_problem(response, 422, "invalid-field")
    streamed_body = await streamed(memory_api, "POST", "/v1/schedules:batch", BODY_BYTES_MAX * 4)
    assert streamed_body["status"] == 422


async def test_oversized_streamed_body_is_refused_for_a_tenant_token_too(memory_api: Api) -> None:
    response = await stream_request(
        memory_api.app,
        "POST",
        "/v1/schedules",
        memory_api.tenant("acme"),
        pieces(BODY_BYTES_MAX * 2),
    )
    assert response.status_code == 413


@pytest.mark.parametrize(
    "path", ["/nope", "/v1", "/v1/schedule", "/v1/schedules/a/b/c", "/v2/schedules"]
)
async def test_unknown_route_gets_404_problem_with_or_without_a_token(
    memory_api: Api, path: str
) -> None:
    for headers in ({}, memory_api.admin):
        response = await memory_api.client.get(path, headers=headers)
        body = assert_problem(response, 404, "not-found")
        assert "/openapi.json" in body["detail"]


@pytest.mark.parametrize(
    ("method", "path", "allowed"),
    [
        ("DELETE", "/v1/schedules", "GET, HEAD, POST"),
        ("PUT", "/v1/schedules", "GET, HEAD, POST"),
        ("GET", "/v1/schedules:batch", "POST"),
        ("POST", "/v1/executions", "GET, HEAD"),
        ("DELETE", "/v1/cluster", "GET, HEAD"),
        ("POST", "/healthz", "GET, HEAD"),
        ("OPTIONS", "/v1/schedules", "GET, HEAD, POST"),
        ("PATCH", "/v1/task-types/noop", "DELETE, GET, HEAD, PUT"),
        ("POST", "/v1/schedules/s1", "DELETE, GET, HEAD, PATCH, PUT"),
    ],
)
async def test_wrong_method_gets_405_problem_with_an_allow_header(
    memory_api: Api, method: str, path: str, allowed: str
) -> None:
    """RFC 9110: a 405 lists every method the resource supports, whichever route of the
    path the router tried first."""
    response = await memory_api.client.request(method, path, headers=memory_api.admin)
    body = assert_problem(response, 405, "method-not-allowed")
    assert method in body["detail"]
    assert response.headers["allow"] == allowed


async def test_head_is_served_like_get_without_a_body(memory_api: Api) -> None:
    response = await memory_api.client.head("/v1/schedules", headers=memory_api.admin)
    assert response.status_code == 200
    assert response.content == b""


# --- probes ----------------------------------------------------------------------------------


async def test_healthz_and_readyz_answer_200_when_all_is_well(api: Api) -> None:
    health = await api.client.get("/healthz")
    assert (health.status_code, health.json()) == (200, {"status": "ok", "checks": {}})
    ready = await api.client.get("/readyz")
    assert ready.status_code == 200
    assert ready.json() == {"status": "ready", "checks": {"node": "ok", "database": "ok"}}


async def test_readyz_is_503_while_the_node_is_stopping(memory_api: Api) -> None:
    memory_api.context.stopping = True
    response = await memory_api.client.get("/readyz")
    assert response.status_code == 503
    assert response.json()["checks"]["node"] == "stopping"
    assert (await memory_api.client.get("/healthz")).status_code == 200


async def test_readyz_reports_a_failing_extra_check(memory_api: Api) -> None:
    memory_api.context.extra_checks["schema"] = lambda: "schema version 3, code wants 4"
    memory_api.context.extra_checks["actors"] = lambda: None
    response = await memory_api.client.get("/readyz")
    assert response.status_code == 503
    checks = response.json()["checks"]
    assert checks["schema"] == "schema version 3, code wants 4"
    assert checks["actors"] == "ok"


# --- a database that is down -------------------------------------------------------------------


@pytest.fixture
async def switchable() -> AsyncIterator[tuple[Api, FaultyLedger]]:
    clock = ManualClock(START)
    ledger = FaultyLedger(memory_ledger(clock))
    await prepare_ledger(ledger.as_ledger())
    async with serve(ledger.as_ledger(), clock, "memory") as api:
        yield api, ledger


async def test_readyz_and_healthz_when_the_database_is_down(
    switchable: tuple[Api, FaultyLedger],
) -> None:
    api, ledger = switchable
    ledger.down = True
    ready = await api.client.get("/readyz")
    assert ready.status_code == 503
    assert ready.json()["status"] == "not ready"
    assert "down" in ready.json()["checks"]["database"]
    assert (await api.client.get("/healthz")).status_code == 200


@pytest.mark.parametrize(
    "endpoint",
    # /metrics reads no ledger (and is a 404 without a renderer).
    [e for e in endpoints() if e.access is not Access.OPEN and e.path != "/metrics"],
    ids=label,
)
@pytest.mark.parametrize("token_cached", [False, True], ids=["uncached", "cached"])
async def test_every_route_answers_503_with_retry_after_while_the_database_is_down(
    switchable: tuple[Api, FaultyLedger], endpoint: Endpoint, token_cached: bool
) -> None:
    api, ledger = switchable
    if token_cached:
        assert (await api.client.get("/v1/cluster", headers=api.admin)).status_code == 200
    ledger.down = True
    response = await api.client.request(
        endpoint.method, concrete(endpoint.path), json=_valid_body(endpoint), headers=api.admin
    )
    assert_problem(response, 503, "unavailable")
    assert response.headers["retry-after"] == "1"


def _valid_body(endpoint: Endpoint) -> object:
    """A body that decodes for ``endpoint`` (so the request reaches the ledger)."""
    bodies: dict[str, object] = {
        "ScheduleSpec": {"cron_expr": "* * * * *", "task_type": "noop"},
        "ScheduleBatch": {"schedules": [{"cron_expr": "* * * * *", "task_type": "noop"}]},
        "BackfillIn": {"from": "2026-03-01T00:00:00Z", "to": "2026-03-01T01:00:00Z"},
        "TaskTypeSpec": {"kind": "noop"},
        "RegionFailoverSpec": {"to_region": "east"},
        "PurgeFilter": {"all": True},
        "SecretRotation": {"secret": "whsec_" + "A" * 43},
        "ReplayFilter": {"all": True},
        "ApplyIn": {"manifest_set": "probe-set"},
    }
    return bodies.get(getattr(endpoint.body, "__name__", ""), {})
