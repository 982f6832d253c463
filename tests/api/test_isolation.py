"""Tenant isolation: a tenant token sees and changes only its own tenant's records.

Two tenants, ``acme`` (A) and ``globex`` (B), each own a schedule, a queued execution and a
dead letter. A's token gets 404 -- not 403 -- on every route that names one of B's records,
and that 404 is byte for byte the answer for an id that does not exist (status, headers and
body, the id aside), so A cannot tell B's ids from missing ones by any route. A never sees
B's rows in a listing, cannot create in B, and cannot replay or purge B's dead letters; an
admin token sees both. Creating under an id B holds is refused as taken (409), the one thing
a single namespace of ids tells (docs/api.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

import httpx
import pytest

from engine.api.app import endpoints
from engine.api.endpoint import Access
from tests.api.support import Api, assert_problem, walk_pages

A, B = "acme", "globex"


@dataclass(frozen=True)
class World:
    schedule: dict[str, str]
    queued: dict[str, str]
    dead: dict[str, str]
    other: str = B
    """The tenant the cases name as "another tenant"."""


async def build_world(api: Api) -> World:
    schedules, queued, dead = {}, {}, {}
    for tenant in (A, B):
        schedules[tenant] = f"{tenant}-s"
        await api.create_schedule(schedules[tenant], tenant_id=tenant)
        queued[tenant] = await api.queued(schedules[tenant])
        dead[tenant] = await api.dead_letter(schedules[tenant])
    return World(schedules, queued, dead)


SPEC = {"cron_expr": "*/5 * * * *", "task_type": "noop"}
RANGE = {"from": "2026-03-01T22:00:00Z", "to": "2026-03-01T23:00:00Z"}

# (method, path with {schedule}/{queued}/{dead}/{tenant} of B filled in, body)
FOREIGN_ID_CASES: list[tuple[str, str, Any]] = [
    ("GET", "/v1/schedules/{schedule}", None),
    ("PUT", "/v1/schedules/{schedule}", SPEC),  # taken: see TAKEN below
    ("PATCH", "/v1/schedules/{schedule}", {"payload": {"stolen": True}}),
    ("DELETE", "/v1/schedules/{schedule}", None),
    ("POST", "/v1/schedules/{schedule}:pause", {}),
    ("POST", "/v1/schedules/{schedule}:resume", {}),
    ("POST", "/v1/schedules/{schedule}:trigger", {}),
    ("POST", "/v1/schedules/{schedule}:backfill", RANGE),
    ("GET", "/v1/schedules/{schedule}/preview", None),
    ("GET", "/v1/executions/{queued}", None),
    ("GET", "/v1/executions/{dead}", None),
    ("POST", "/v1/dead-letters/{dead}:replay", {}),
    ("GET", "/v1/tenants/{tenant}", None),
    ("GET", "/v1/schedules?tenant_id={tenant}", None),
    ("GET", "/v1/executions?tenant_id={tenant}", None),
    ("GET", "/v1/dead-letters?tenant_id={tenant}", None),
    ("POST", "/v1/schedules", {**SPEC, "tenant_id": "{tenant}"}),
    ("PUT", "/v1/schedules/new-in-b", {**SPEC, "tenant_id": "{tenant}"}),
    ("POST", "/v1/dead-letters:replay", {"tenant_id": "{tenant}"}),
    ("POST", "/v1/dead-letters/{dead}:purge", {}),
    ("POST", "/v1/dead-letters:purge", {"tenant_id": "{tenant}"}),
]


def fill(value: Any, world: World) -> Any:
    names = {
        "schedule": world.schedule[B],
        "queued": world.queued[B],
        "dead": world.dead[B],
        "tenant": world.other,
    }
    if isinstance(value, str):
        return value.format(**names)
    if isinstance(value, dict):
        return {key: fill(item, world) for key, item in value.items()}
    return value


TAKEN: Final = {("PUT", "/v1/schedules/{schedule}")}
"""Cases that create under one of B's ids: refused as taken (409), which a missing id is
not; every other case answers exactly as for a missing id."""


def missing_like(world: World) -> World:
    """``world`` with B's ids replaced by ids of the same length that do not exist."""

    def absent(execution_id: str) -> str:
        schedule, _, instant = execution_id.partition(":")
        return "z" * len(schedule) + ":" + instant

    return World(
        {**world.schedule, B: "z" * len(world.schedule[B])},
        {**world.queued, B: absent(world.queued[B])},
        {**world.dead, B: absent(world.dead[B])},
        "z" * len(B),
    )


def comparable(response: httpx.Response, ids: list[str]) -> tuple[int, list[Any], str]:
    """What a response shows, with the ids asked for blanked and the Date header left out."""
    body = response.text
    for index, value in enumerate(ids):
        body = body.replace(value, f"<id{index}>")
    headers = sorted((k, v) for k, v in response.headers.items() if k.lower() != "date")
    return response.status_code, headers, body


def case_id(case: tuple[str, str, Any]) -> str:
    method, path, body = case
    suffix = " (tenant in body)" if isinstance(body, dict) and "tenant_id" in body else ""
    return f"{method} {path}{suffix}"


async def assert_b_untouched(api: Api, world: World) -> None:
    schedule = await api.ledger.schedules_get(world.schedule[B])
    assert (schedule.version, schedule.enabled, schedule.payload) == (1, True, {})
    dead = await api.ledger.executions_get(world.dead[B])
    assert str(dead.execution.status) == "dead-letter"
    queued = await api.ledger.executions_get(world.queued[B])
    assert str(queued.execution.status) == "queued"
    assert await api.ledger.schedules_count(B) == 1
    for path in ("/v1/executions", "/v1/dead-letters"):
        admin_view = await walk_pages(api.client, f"{path}?tenant_id={B}", api.admin, 100)
        assert len(admin_view) == (2 if path == "/v1/executions" else 1)


async def check_case(api: Api, world: World, case: tuple[str, str, Any]) -> None:
    method, path, body = case
    response = await api.client.request(
        method, fill(path, world), json=fill(body, world), headers=api.tenant(A)
    )
    if (method, path) in TAKEN:
        assert_problem(response, 409, "already-exists")
    else:
        assert_problem(response, 404, "not-found")
        missing = missing_like(world)
        absent = await api.client.request(
            method, fill(path, missing), json=fill(body, missing), headers=api.tenant(A)
        )
        ids = [world.schedule[B], world.queued[B], world.dead[B], B]
        absent_ids = [missing.schedule[B], missing.queued[B], missing.dead[B], "z" * len(B)]
        assert comparable(response, ids) == comparable(absent, absent_ids), case
    # The same request for A's own records is not refused for who asked.
    own = await api.client.request(
        method,
        path.format(
            schedule=world.schedule[A], queued=world.queued[A], dead=world.dead[A], tenant=A
        ),
        json=None if body is None else {k: v for k, v in body.items() if k != "tenant_id"},
        headers=api.tenant(A),
    )
    assert own.status_code not in (403, 404), (case, own.text)


@pytest.mark.parametrize("case", FOREIGN_ID_CASES, ids=case_id)
async def test_tenant_token_gets_404_for_another_tenants_records(
    memory_api: Api, case: tuple[str, str, Any]
) -> None:
    world = await build_world(memory_api)
    await check_case(memory_api, world, case)
    await assert_b_untouched(memory_api, world)


async def test_tenant_isolation_holds_for_every_case_on_every_ledger(api: Api) -> None:
    world = await build_world(api)
    # DELETE and purges last: their checks on A's own records remove them.
    for case in sorted(
        FOREIGN_ID_CASES, key=lambda case: case[0] == "DELETE" or ":purge" in case[1]
    ):
        await check_case(api, world, case)
    await assert_b_untouched(api, world)


def route_of(path: str) -> str:
    """The endpoint path a case's path template addresses."""
    return (
        path.split("?")[0]
        .replace("{schedule}", "{schedule_id}")
        .replace("{queued}", "{execution_id}")
        .replace("{dead}", "{execution_id}")
        .replace("{tenant}", "{tenant_id}")
    )


def test_the_matrix_covers_every_tenant_route_with_an_id_in_its_path() -> None:
    covered = {(method, route_of(path)) for method, path, _ in FOREIGN_ID_CASES}
    with_ids = {
        (e.method, e.path) for e in endpoints() if e.access is Access.TOKEN and "{" in e.path
    }
    assert with_ids - covered == set()


@pytest.mark.parametrize("path", ["/v1/schedules", "/v1/executions", "/v1/dead-letters"])
async def test_tenant_listings_show_only_the_tenants_own_rows(api: Api, path: str) -> None:
    world = await build_world(api)
    mine = await walk_pages(api.client, path, api.tenant(A), 1)
    everything = await walk_pages(api.client, path, api.admin, 1)
    tenants_seen = {item["tenant_id"] for item in mine}
    assert tenants_seen == {A}
    assert {item["tenant_id"] for item in everything} == {A, B}
    own_filter = await walk_pages(api.client, f"{path}?tenant_id={A}", api.tenant(A), 1)
    assert own_filter == mine
    if path == "/v1/dead-letters":
        assert [item["execution_id"] for item in mine] == [world.dead[A]]


async def test_tenant_forecast_and_batch_cannot_reach_another_tenant(api: Api) -> None:
    await build_world(api)
    forecast = await api.client.get("/v1/forecast?by=tenant&bucket=1h", headers=api.tenant(A))
    assert [series["tenant_id"] for series in forecast.json()["series"]] == [A]
    batch = await api.client.post(
        "/v1/schedules:batch",
        json={"schedules": [{**SPEC, "schedule_id": "sneaky", "tenant_id": B}]},
        headers=api.tenant(A),
    )
    # The batch reports the item instead of answering 404 outright: see the report.
    problem = assert_problem(batch, 422, "invalid-field")
    assert problem["errors"] == ["schedules[0]: tenant 'globex' not found"]
    assert await api.ledger.schedules_count(B) == 1


async def test_replay_by_filter_replays_only_the_tenants_own_dead_letters(api: Api) -> None:
    world = await build_world(api)
    by_b_schedule = await api.client.post(
        "/v1/dead-letters:replay",
        json={"schedule_id": world.schedule[B]},
        headers=api.tenant(A),
    )
    assert by_b_schedule.json() == {"replayed": []}
    everything = await api.client.post(
        "/v1/dead-letters:replay", json={"all": True}, headers=api.tenant(A)
    )
    assert everything.json() == {"replayed": [world.dead[A]]}
    dead_b = await api.ledger.executions_get(world.dead[B])
    assert str(dead_b.execution.status) == "dead-letter"


async def test_purge_purges_only_the_tenants_own_dead_letters(api: Api) -> None:
    world = await build_world(api)
    by_b_schedule = await api.client.post(
        "/v1/dead-letters:purge",
        json={"schedule_id": world.schedule[B]},
        headers=api.tenant(A),
    )
    assert by_b_schedule.json() == {"purged": []}
    everything = await api.client.post(
        "/v1/dead-letters:purge", json={"all": True}, headers=api.tenant(A)
    )
    assert everything.json() == {"purged": [world.dead[A]]}
    await assert_b_untouched(api, world)


async def test_admin_sees_and_changes_both_tenants(api: Api) -> None:
    world = await build_world(api)
    for tenant in (A, B):
        read = await api.client.get(f"/v1/schedules/{world.schedule[tenant]}", headers=api.admin)
        assert read.status_code == 200
        detail = await api.client.get(f"/v1/executions/{world.dead[tenant]}", headers=api.admin)
        assert detail.status_code == 200
    replayed = await api.client.post(
        "/v1/dead-letters:replay", json={"all": True}, headers=api.admin
    )
    assert sorted(replayed.json()["replayed"]) == sorted(world.dead.values())


async def test_another_tenants_task_type_answers_exactly_like_a_missing_one(api: Api) -> None:
    """A task type owned by B, or shared with B only, cannot be named by A's schedules, and
    A cannot tell it from one that does not exist: the refusal is the same, byte for byte."""
    for name, grants in (("b-hook", {"tenant_id": B}), ("b-shared", {"allowed_tenants": [B]})):
        put = await api.client.put(
            f"/v1/task-types/{name}", json={"kind": "noop", **grants}, headers=api.admin
        )
        assert put.status_code == 200, put.text
    answers = []
    for name in ("b-hook", "b-shared", "z-hook", "zzshared"):
        body = {**SPEC, "schedule_id": "mine", "task_type": name}
        for method, path in (("POST", "/v1/schedules"), ("PUT", "/v1/schedules/mine")):
            response = await api.client.request(method, path, json=body, headers=api.tenant(A))
            answers.append(comparable(response, [name]))
        batch = await api.client.post(
            "/v1/schedules:batch", json={"schedules": [body]}, headers=api.tenant(A)
        )
        answers.append(comparable(batch, [name]))
    assert (answers[:3], answers[3:6]) == (answers[6:9], answers[9:])  # names of equal length
    assert answers[0][0] == 422
    # B's own schedules may use them; A's schedule count is unchanged.
    await api.create_schedule("b-user", tenant_id=B, task_type="b-hook")
    assert await api.ledger.schedules_count(A) == 0


async def test_task_type_routes_answer_a_tenant_token_alike_for_any_name(api: Api) -> None:
    """Task types are an admin's: a tenant token gets the same 403 for another tenant's task
    type, a shared one, and a name that does not exist, so it learns nothing from them."""
    put = await api.client.put(
        "/v1/task-types/b-owned", json={"kind": "noop", "tenant_id": B}, headers=api.admin
    )
    assert put.status_code == 200, put.text
    secret = {"secret": "whsec_" + "A" * 43}
    for method, path, body in (
        ("GET", "/v1/task-types/{name}", None),
        ("PUT", "/v1/task-types/{name}", {"kind": "noop", "tenant_id": A}),
        ("DELETE", "/v1/task-types/{name}", None),
        ("POST", "/v1/task-types/{name}:rotate-secret", secret),
    ):
        answers = [
            comparable(
                await api.client.request(
                    method, path.format(name=name), json=body, headers=api.tenant(A)
                ),
                [name],
            )
            for name in ("b-owned", "zzzzzzz")
        ]
        assert answers[0] == answers[1]
        assert answers[0][0] == 403
    stored = await api.ledger.task_types_get("b-owned")
    assert (stored.tenant_id, stored.version) == (B, 1)
