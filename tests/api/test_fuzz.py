"""A property-based fuzz over the OpenAPI document: no request gets a 5xx.

For every operation the document lists, Hypothesis draws path parameters (ids that exist,
for both tenants, and arbitrary text), query parameters (typed values and arbitrary text)
and bodies -- schema-conforming ones drawn from the document's schemas after inlining the
component ``$ref`` s (:mod:`tests.api.schema_strategies`, with a few known-good values mixed
in, so that requests get past validation into the routes and the ledger), arbitrary JSON,
and garbage bytes -- and sends
each request with an admin token and with each of two tenants' tokens. Every answer must be
below 500, have a status the operation documents, and every 4xx be a problem document.

Tenant isolation is fuzzed too: each tenant's schedules carry a payload marker, and each has
a hidden schedule, execution and dead letter whose ids no request names. No answer to one
tenant's token may contain anything of the other tenant's (its id, its records' ids, its
markers) that the request did not itself send -- a 404 may echo the id it was asked for.

The app and its ledger live for the whole run; Hypothesis runs in a worker thread and sends
each request into the test's trio loop (``trio.from_thread.run``), so the same fuzz runs on
the memory ledger and on real Postgres. ``derandomize`` makes the examples the same on every
run; the ``slow`` variant draws many more.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from functools import partial
from typing import Any
from urllib.parse import quote, unquote

import httpx
import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.core.instants import format_utc
from tests.api.schema_strategies import ANY_JSON, TEXT, from_schema, inline
from tests.api.support import START, TENANTS, Api

EXAMPLES = {"memory": 100, "postgres": 25}
SLOW_EXAMPLES = {"memory": 1000, "postgres": 200}

CRONS = ["*/5 * * * *", "0 * * * *", "H H * * *", "0 9 * * THU", "30 2 * * *", "0 0 30 2 *"]
ZONES = ["UTC", "America/New_York", "Europe/London", "Asia/Kolkata", "Nowhere/Town"]


def instants() -> st.SearchStrategy[str]:
    """RFC 3339 instants around the test's start, and a few far-off and malformed ones."""
    near = st.integers(-3 * 86400, 86400).map(lambda s: format_utc(START + timedelta(seconds=s)))
    edges = st.sampled_from(
        [
            "0001-01-01T00:00:00Z",
            "9999-12-31T23:59:59Z",
            "2026-03-02T00:00:00",
            "2026-03-02T00:00:00+14:00",
            "2026-13-01T00:00:00Z",
        ]
    )
    anywhere = st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30)).map(
        lambda d: d.isoformat() + "Z"
    )
    return st.one_of(near, near, edges, anywhere)


class World:
    """The records the fuzz aims at, for two tenants, and what each tenant must never see of
    the other's.

    Every tenant has schedules (with a payload marker) whose ids the fuzz knows and draws,
    each with a queued execution and a dead letter, plus a *hidden* schedule with its own
    execution and dead letter whose ids no request ever names: if one of those shows up in
    the other tenant's answer, a listing or a filter leaked it.
    """

    def __init__(self) -> None:
        self.schedules: list[str] = []
        self.executions: list[str] = []
        self.secrets: dict[str, set[str]] = {tenant: {tenant} for tenant in TENANTS}
        """Per tenant: its id, its records' ids and its payload markers."""

    async def build(self, api: Api) -> None:
        for tenant in TENANTS:
            marker = f"{tenant}-payload-7f3a"
            for n in range(2):
                schedule_id = f"{tenant}-{n}"
                await api.create_schedule(schedule_id, tenant_id=tenant, payload={"m": marker})
                self.schedules.append(schedule_id)
                self.executions.append(await api.queued(schedule_id))
                self.executions.append(await api.dead_letter(schedule_id))
            hidden = f"{tenant}-hidden"
            await api.create_schedule(hidden, tenant_id=tenant, payload={"m": f"{marker}-h"})
            known = {hidden, marker, *self.schedules[-2:], *self.executions[-4:]}
            known |= {await api.queued(hidden), await api.dead_letter(hidden)}
            self.secrets[tenant] |= known

    def check_isolated(self, tenant: str, answer: str, request: str, what: str) -> None:
        """``answer``, given to ``tenant``'s token, holds nothing of another tenant's that
        the request did not itself send (a 404 may echo the id it was asked for)."""
        for other in TENANTS:
            if other != tenant:
                leaked = {s for s in self.secrets[other] if s in answer and s not in request}
                assert not leaked, f"{what} showed {tenant} {other}'s {sorted(leaked)}: {answer}"

    def hints(self) -> dict[str, list[Any]]:
        """Known-good (and a few known-bad) values, by field or parameter name."""
        return {
            "cron_expr": CRONS,
            "timezone": ZONES,
            "task_type": ["noop", "missing"],
            "schedule_id": self.schedules + [f"new-{n}" for n in range(20)],
            "execution_id": self.executions,
            "tenant_id": [*TENANTS, "default"],
            "name": ["noop", "other-type"],
            "bucket": ["1m", "15m", "1h", "1d", "0m"],
            "by": ["tenant", "task_type", "tenant,task_type"],
            "limit": [1, 2, 100, 1000],
            "count": [1, 10, 10_000],
            "catch_up_window_s": [60, 3600.5, 0],
            "payload": [{}, {"region": "eu", "n": [1, 2]}],
            "reason": ["on-call asked", None],
            "kind": ["noop", "webhook"],
            "settings": [{}],
        }


def hinted(schema: Any, hints: dict[str, list[Any]]) -> Any:
    """``schema`` whose properties named in ``hints`` may also take the hinted values."""
    if isinstance(schema, dict):
        schema = {key: hinted(value, hints) for key, value in schema.items()}
        properties = schema.get("properties")
        if isinstance(properties, dict):
            for name, sub in properties.items():
                values = INSTANT_SAMPLES if name in INSTANT_FIELDS else hints.get(name)
                if values:  # three times in four a hinted value, so that more get through
                    properties[name] = {"anyOf": [*[{"enum": values}] * 3, sub]}
        return schema
    if isinstance(schema, list):
        return [hinted(value, hints) for value in schema]
    return schema


INSTANT_FIELDS = {"from", "to", "planned_from", "planned_to"}
INSTANT_SAMPLES = [
    "2026-03-01T23:00:00Z",
    "2026-03-01T12:00:00Z",
    "2026-03-02T00:00:00Z",
    "2026-03-02T06:00:00Z",
    "2026-02-25T00:00:00Z",
    "0001-01-01T00:00:00+01:00",
]


def path_value(name: str, hints: dict[str, list[Any]]) -> st.SearchStrategy[str]:
    known = [str(value) for value in hints.get(name, [])]
    arbitrary = TEXT.filter(lambda text: text not in ("", ".", ".."))
    return st.one_of(st.sampled_from(known), arbitrary) if known else arbitrary


def query_value(param: dict[str, Any], hints: dict[str, list[Any]]) -> st.SearchStrategy[str]:
    schema = param["schema"]
    name = param["name"]
    if "enum" in schema:
        typed: st.SearchStrategy[str] = st.sampled_from(schema["enum"])
    elif schema.get("format") == "date-time":
        typed = instants()
    elif schema["type"] == "integer":
        typed = st.integers(-5, 20_000).map(str)
    elif schema["type"] == "boolean":
        typed = st.sampled_from(["true", "false"])
    else:
        typed = TEXT
    if name in hints:
        typed = st.one_of(typed, st.sampled_from([str(value) for value in hints[name]]))
    return st.one_of(typed, typed, TEXT)


def body_strategy(
    operation: dict[str, Any], document: dict[str, Any], hints: dict[str, list[Any]]
) -> st.SearchStrategy[bytes]:
    if "requestBody" not in operation:
        return st.just(b"")
    schema = operation["requestBody"]["content"]["application/json"]["schema"]
    conforming = from_schema(hinted(inline(schema, document["components"]["schemas"]), hints))
    return st.one_of(
        conforming.map(lambda value: json.dumps(value).encode()),
        conforming.map(lambda value: json.dumps(value).encode()),
        ANY_JSON.map(lambda value: json.dumps(value).encode()),
        st.binary(max_size=64),
        st.just(b""),
    )


Request = tuple[str, dict[str, str], bytes]
"""A drawn request: the URL (path parameters filled in), the query parameters, the body."""


def request_strategy(
    path: str, operation: dict[str, Any], document: dict[str, Any], hints: dict[str, list[Any]]
) -> st.SearchStrategy[Request]:
    path_params = {
        p["name"]: path_value(p["name"], hints)
        for p in operation["parameters"]
        if p["in"] == "path"
    }
    query_params = {
        p["name"]: query_value(p, hints) for p in operation["parameters"] if p["in"] == "query"
    }

    def url(values: dict[str, str]) -> str:
        filled = path
        for name, value in values.items():
            filled = filled.replace(f"{{{name}}}", quote(value, safe=""))
        return filled

    return st.tuples(
        st.fixed_dictionaries(path_params).map(url),
        st.fixed_dictionaries({}, optional=query_params),
        body_strategy(operation, document, hints),
    )


def check(response: httpx.Response, what: str, documented: set[str] | None) -> None:
    """No 5xx; a status the operation documents (``None``: the request left the operation,
    a path parameter holding a ``/``); every 4xx a problem document."""
    assert response.status_code < 500, f"{what} -> {response.status_code} {response.text}"
    assert documented is None or str(response.status_code) in documented, (
        f"{what} -> {response.status_code}, which the document does not list: {response.text}"
    )
    if response.status_code >= 400:
        assert response.headers["content-type"].startswith("application/problem+json"), what
        problem = response.json()
        assert problem["status"] == response.status_code, what
        for key in ("type", "title", "detail"):
            assert isinstance(problem[key], str), (what, key)
            assert problem[key], (what, key)


async def fuzz(api: Api, examples: int) -> None:
    world = World()
    await world.build(api)
    hints = world.hints()
    document = (await api.client.get("/openapi.json")).json()
    tokens = {"admin": api.admin, **{tenant: api.tenant(tenant) for tenant in TENANTS}}

    async def send(
        method: str,
        url: str,
        params: dict[str, str],
        body: bytes,
        documented: set[str] | None,
        template: str,
    ) -> None:
        sent = unquote(url) + json.dumps(params) + body.decode(errors="replace")
        if unquote(url).count("/") != template.count("/"):  # another path: the router's
            documented = None  # (e.g. its 307 to the path without a trailing slash)
        for who, headers in tokens.items():
            response = await api.client.request(
                method,
                url,
                params=params,
                content=body or None,
                headers={**headers, "Content-Type": "application/json"},
            )
            what = f"{method} {url} params={params!r} body={body[:300]!r} as {who}"
            check(response, what, documented)
            if who != "admin":
                world.check_isolated(who, response.text, sent, what)

    for path, item in document["paths"].items():
        for method, operation in item.items():
            strategy = request_strategy(path, operation, document, hints)
            documented = set(operation["responses"])
            await trio.to_thread.run_sync(
                runner(
                    method.upper(),
                    strategy,
                    partial(send, documented=documented, template=path),
                    examples,
                )
            )


def runner(
    method: str,
    strategy: st.SearchStrategy[Request],
    send: Callable[..., Awaitable[None]],
    examples: int,
) -> Callable[[], None]:
    """A Hypothesis test, for a worker thread, sending ``method`` requests into trio."""

    @settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(strategy)
    def run(request: Request) -> None:
        url, params, body = request
        trio.from_thread.run(send, method, url, params, body)

    return run


async def test_no_request_from_the_openapi_document_gets_a_server_error(api: Api) -> None:
    await fuzz(api, EXAMPLES[api.backend])


@pytest.mark.slow
async def test_no_request_from_the_openapi_document_gets_a_server_error_long_run(
    api: Api,
) -> None:
    await fuzz(api, SLOW_EXAMPLES[api.backend])
