"""The constraints the OpenAPI document states are the ones the server enforces.

Every length, range and pattern the document gives a request body field or a query
parameter is tried against the running app: a value *at* the bound is accepted, a value
*just past* it is refused with a 4xx. The cases are derived from the served document
itself, so a constraint added to a schema is tried without touching this file, and a
document that promised more (or less) than the server holds to fails here.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import msgspec
import pytest

from engine.api.app import endpoints
from engine.api.openapi import openapi_document
from engine.api.schemas import INSTANT_MAX, INSTANT_MIN, INSTANT_YEARS, NO_NUL
from engine.ledger.params import TaskTypesPut
from engine.model import IDENTIFIER_PATTERN, HandlerKind, TaskType
from tests.api.schema_strategies import inline
from tests.api.support import Api

PROBE = "probe"
"""A schedule every case may address: yearly, so that backfills stay small."""
PROBE_CRON = "0 0 1 1 *"
BLANK_OR_NUL = "^[^\\x00]*[^\\x00\\s][^\\x00]*$"


@dataclass(frozen=True)
class Probe:
    """Where a request body type is sent, and a body that is valid without the field."""

    method: str
    path: str
    base: dict[str, Any]
    extra: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Per field: what else the body needs for a value at a bound to be valid."""


PROBE_SECRET = "whsec_" + "A" * 43
"""A well-formed webhook secret (32 zero-ish bytes)."""

PROBES = {
    "ScheduleSpec": Probe("POST", "/v1/schedules", {"cron_expr": PROBE_CRON, "task_type": "noop"}),
    "SchedulePatch": Probe("PATCH", f"/v1/schedules/{PROBE}", {}),
    "ReasonIn": Probe("POST", f"/v1/schedules/{PROBE}:pause", {}),
    "BackfillIn": Probe(
        "POST",
        f"/v1/schedules/{PROBE}:backfill",
        {"from": "2026-01-01T00:00:00Z", "to": "2026-02-01T00:00:00Z"},
    ),
    "ReplayFilter": Probe("POST", "/v1/dead-letters:replay", {"all": True}),
    "PurgeFilter": Probe(
        "POST",
        "/v1/dead-letters:purge",
        {"all": True},
        # "all" and a filter together are refused: a filter's bound is tried without "all".
        extra={name: {"all": False} for name in ("schedule_id", "tenant_id", "task_type")}
        | {name: {"all": False} for name in ("planned_from", "planned_to")},
    ),
    "SecretRotation": Probe(
        "POST", "/v1/task-types/probe-hook:rotate-secret", {"secret": PROBE_SECRET}
    ),
    "TaskTypeSpec": Probe(
        "PUT",
        "/v1/task-types/probe-type",
        {"kind": "noop"},
        extra={
            "backoff_base_s": {"backoff_max_s": 86400},
            "backoff_max_s": {"backoff_base_s": 0.001},
        },
    ),
    "TenantSpec": Probe("PUT", "/v1/tenants/probe-tenant", {}, extra={"burst": {"rate_per_s": 1}}),
    "RegionFailoverSpec": Probe("POST", "/v1/region:failover", {"to_region": "main"}),
    "ScheduleBatch": Probe(
        "POST",
        "/v1/schedules:batch",
        {"schedules": [{"cron_expr": PROBE_CRON, "task_type": "noop"}]},
    ),
    # A dry run: the probe set's plan, nothing written.
    "ApplyIn": Probe("POST", "/v1/apply?dry_run=true", {"manifest_set": "probe-set"}),
}
NOT_AT_BOUND = {
    ("ScheduleSpec", "cron_expr", "minLength"): "no cron expression is one character long",
    ("SchedulePatch", "cron_expr", "minLength"): "no cron expression is one character long",
    ("ScheduleSpec", "timezone", "minLength"): "no zone name is one character long",
    ("SchedulePatch", "timezone", "minLength"): "no zone name is one character long",
    ("BackfillIn", "from", "upper"): "a backfill covers the past",
    ("BackfillIn", "to", "upper"): "a backfill covers the past",
    ("BackfillIn", "to", "lower"): "'to' must come after 'from'",
    ("ScheduleBatch", "schedules", "maxItems"): "10,000 at once: test_schedule_batch.py",
    ("/v1/forecast", "to", "lower"): "'to' must come after 'from' (now)",
    ("/v1/forecast", "to", "upper"): "a forecast covers at most 7 days (from now)",
}
"""Bounds where a value at the bound is refused for another reason (said here)."""
LONGEST_CRON = "10" + ",0" * 123 + " * * * *"
"""A valid expression of exactly the longest length (256 characters)."""


@dataclass(frozen=True)
class Case:
    name: str
    method: str
    path: str
    accept: bool
    body: dict[str, Any] | None = None
    params: dict[str, str] = field(default_factory=dict)


def _filler(pattern: str | None, length: int) -> str:
    assert pattern in (None, IDENTIFIER_PATTERN, NO_NUL, BLANK_OR_NUL), pattern
    return "a" * length


def _past_pattern(pattern: str) -> list[str]:
    return {
        IDENTIFIER_PATTERN: ["-a", "a b", "a:b", "é"],
        NO_NUL: ["a\x00"],
        BLANK_OR_NUL: [" ", "\n\t"],
        INSTANT_YEARS: [],  # the instants' bounds are tried as such (_bounds)
    }[pattern]


def _bounds(schema: dict[str, Any], name: str) -> Iterator[tuple[str, bool, Any]]:
    """``(bound, accepted?, value)`` for every constraint ``schema`` states."""
    schema = next((s for s in schema.get("anyOf", [schema]) if s.get("type") != "null"), schema)
    kind = schema.get("type")
    pattern = schema.get("pattern")
    if kind == "string" and schema.get("format") == "date-time":
        assert pattern == INSTANT_YEARS, name
        yield "lower", True, f"{INSTANT_MIN.year}-01-01T00:00:00Z"
        yield "upper", True, f"{INSTANT_MAX.year - 1}-12-31T23:59:59Z"
        yield "lower", False, f"{INSTANT_MIN.year - 1}-12-31T23:59:59Z"
        yield "upper", False, f"{INSTANT_MAX.year}-01-01T00:00:00Z"
        yield "offset", False, "2026-01-01T00:00:00"
        return
    if kind == "string":
        if "minLength" in schema:
            low = schema["minLength"]
            yield "minLength", True, _filler(pattern, low)
            if low > 0:
                yield "minLength", False, _filler(pattern, low - 1)
        if "maxLength" in schema:
            high = schema["maxLength"]
            at = LONGEST_CRON if name == "cron_expr" else _filler(pattern, high)
            assert len(at) == high
            yield "maxLength", True, at
            yield "maxLength", False, _filler(pattern, high + 1)
        if pattern is not None:
            for value in _past_pattern(pattern):
                yield "pattern", False, value
    if kind in ("integer", "number"):
        step = 1 if kind == "integer" else 0.001
        if "minimum" in schema:
            yield "minimum", True, schema["minimum"]
            yield "minimum", False, schema["minimum"] - step
        if "exclusiveMinimum" in schema:
            yield "exclusiveMinimum", True, schema["exclusiveMinimum"] + step
            yield "exclusiveMinimum", False, schema["exclusiveMinimum"]
        if "maximum" in schema:
            yield "maximum", True, schema["maximum"]
            yield "maximum", False, schema["maximum"] + step
    if kind == "array":
        if "minItems" in schema:
            yield "minItems", False, []
        if "maxItems" in schema:
            yield (
                "maxItems",
                False,
                [{"cron_expr": PROBE_CRON, "task_type": "noop"}] * (schema["maxItems"] + 1),
            )


def cases() -> Iterator[Case]:
    document = msgspec.json.decode(msgspec.json.encode(openapi_document(endpoints())))
    components = document["components"]["schemas"]
    bodies = {
        op["requestBody"]["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[-1]
        for item in document["paths"].values()
        for op in item.values()
        if "requestBody" in op
    }
    assert bodies == set(PROBES), "every request body type has a probe"
    for component, probe in sorted(PROBES.items()):
        schema = inline(components[component], components)
        for name, sub in schema["properties"].items():
            for bound, accept, value in _bounds(sub, name):
                if accept and (component, name, bound) in NOT_AT_BOUND:
                    continue
                body = {**probe.base, **probe.extra.get(name, {}), name: value}
                shown = json.dumps(value)[:20]
                yield Case(
                    f"{component}.{name}:{bound}:{'at' if accept else 'past'}:{shown}",
                    probe.method,
                    probe.path,
                    accept,
                    body,
                )
    for path, item in document["paths"].items():
        for method, operation in item.items():
            for param in operation["parameters"]:
                if param["in"] != "query":
                    continue
                for bound, accept, value in _bounds(param["schema"], param["name"]):
                    if accept and (path, param["name"], bound) in NOT_AT_BOUND:
                        continue
                    concrete = path.replace("{schedule_id}", PROBE)
                    yield Case(
                        f"{method.upper()} {path}?{param['name']}:{bound}:"
                        f"{'at' if accept else 'past'}:{value!s:.20}",
                        method.upper(),
                        concrete,
                        accept,
                        params={param["name"]: str(value)},
                    )


CASES = list(cases())


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
async def test_a_value_at_a_documented_bound_is_accepted_and_one_past_it_refused(
    memory_api: Api, case: Case
) -> None:
    for name in ("a", "a" * 128):  # task types at the identifier bounds
        await memory_api.ledger.task_types_put(
            TaskTypesPut(TaskType(name=name, kind=HandlerKind.NOOP, allowed_tenants=("*",)))
        )
    await memory_api.ledger.task_types_put(
        TaskTypesPut(
            TaskType(
                name="probe-hook",
                kind=HandlerKind.WEBHOOK,
                settings={"url": "https://example.com/h", "secret": PROBE_SECRET},
            )
        )
    )
    await memory_api.create_schedule(PROBE, cron_expr=PROBE_CRON)
    response = await memory_api.client.request(
        case.method,
        case.path,
        params=case.params,
        content=None if case.body is None else json.dumps(case.body).encode(),
        headers={**memory_api.admin, "Content-Type": "application/json"},
    )
    if case.accept:
        assert response.status_code < 300, response.text[:400]
    else:
        assert 400 <= response.status_code < 500, response.text[:400]


def test_every_constraint_of_the_document_is_tried() -> None:
    kinds = {case.name.split(":")[1] for case in CASES}
    assert {"minLength", "maxLength", "pattern", "minimum", "maximum", "exclusiveMinimum"} <= kinds
    assert {"lower", "upper", "minItems", "maxItems"} <= kinds
    assert sum(case.accept for case in CASES) > 40


def test_the_instant_pattern_admits_exactly_the_years_the_server_does() -> None:
    admitted = [y for y in range(10_000) if re.match(INSTANT_YEARS, f"{y:04d}-06-01T00:00:00Z")]
    assert admitted == list(range(INSTANT_MIN.year, INSTANT_MAX.year))
