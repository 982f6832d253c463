"""``POST /v1/apply``: manifest sets applied all or nothing, idempotently, labelled, audited."""

from __future__ import annotations

import base64
from typing import Any

import httpx
import trio

from engine.core import redaction
from engine.ledger.params import AuditQuery, ScheduleChangesSince, TenantsPut
from engine.model import Tenant
from tests.api.support import TASK_TYPE, Api, assert_problem

SET = "billing"
SECRET = "whsec_" + base64.b64encode(b"k" * 32).decode()


def schedule(schedule_id: str, line: int, **fields: Any) -> dict[str, Any]:
    return {
        "schedule_id": schedule_id,
        "tenant_id": "acme",
        "cron_expr": "*/5 * * * *",
        "task_type": TASK_TYPE,
        "source": f"billing.yaml:{line}",
        **fields,
    }


def manifest(*schedules: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {"manifest_set": SET, "schedules": list(schedules), **fields}


async def apply(
    api: Api, body: dict[str, Any], *, dry_run: bool = False, headers: Any = None
) -> httpx.Response:
    return await api.client.post(
        "/v1/apply" + ("?dry_run=true" if dry_run else ""),
        json=body,
        headers=api.admin if headers is None else headers,
    )


async def audit_rows(api: Api) -> int:
    events = await api.ledger.audit_list(AuditQuery(action="manifest.apply", limit=1000))
    return len(events)


async def test_applying_twice_changes_nothing_the_second_time(api: Api) -> None:
    body = manifest(schedule("a", 3), schedule("b", 9, payload={"n": 1}))
    first = await apply(api, body)
    assert first.status_code == 200, first.text
    assert [(c["name"], c["action"]) for c in first.json()["changes"]] == [
        ("a", "create"),
        ("b", "create"),
    ]
    audited = await audit_rows(api)
    assert audited == 2
    second = await apply(api, body)
    assert second.status_code == 200, second.text
    assert second.json()["changes"] == []
    assert second.json()["unchanged"] == 2
    assert await audit_rows(api) == audited


async def test_editing_one_payload_is_one_update_that_keeps_the_next_fire(api: Api) -> None:
    await apply(api, manifest(schedule("a", 3), schedule("b", 9, payload={"n": 1})))
    before = await api.ledger.schedules_get("b")
    response = await apply(api, manifest(schedule("a", 3), schedule("b", 9, payload={"n": 2})))
    changes = response.json()["changes"]
    assert [(c["name"], c["action"], c["fields"]) for c in changes] == [
        ("b", "update", ["payload"])
    ]
    after = await api.ledger.schedules_get("b")
    assert after.payload == {"n": 2}
    assert after.version == before.version + 1
    assert after.next_run_at == before.next_run_at


async def test_an_audit_event_names_the_token_and_the_set(api: Api) -> None:
    await apply(api, manifest(schedule("a", 3)))
    [event] = await api.ledger.audit_list(AuditQuery(action="manifest.apply", limit=10))
    assert event.actor == f"token:{api.admin_id}"
    assert event.target == "a"
    assert event.details["manifest_set"] == SET
    assert event.details["change"] == "create"
    assert event.details["source"] == "billing.yaml:3 (schedules[0])"


async def test_dry_run_answers_the_plan_and_writes_nothing(api: Api) -> None:
    response = await apply(api, manifest(schedule("a", 3)), dry_run=True)
    assert response.status_code == 200, response.text
    assert response.json()["dry_run"] is True
    assert [c["action"] for c in response.json()["changes"]] == ["create"]
    assert await api.ledger.schedules_get_many(["a"]) == {}
    assert await audit_rows(api) == 0


async def test_one_invalid_item_changes_nothing_and_every_bad_item_is_named(api: Api) -> None:
    await api.create_schedule("keep")
    body = manifest(
        schedule("a", 3),
        schedule("b", 9, cron_expr="61 * * * *"),
        schedule("c", 15, task_type="missing"),
        schedule("d", 21, timezone="Mars/Olympus"),
    )
    response = await apply(api, body)
    problem = assert_problem(response, 422, "invalid-field")
    errors = problem["errors"]
    assert len(errors) == 3
    for line, name in ((9, "b"), (15, "c"), (21, "d")):
        assert any(f"billing.yaml:{line} (schedules[" in error for error in errors), (name, errors)
    assert await api.ledger.schedules_get_many(["a", "b", "c", "d"]) == {}
    assert await audit_rows(api) == 0


async def test_prune_deletes_only_what_the_set_owns(api: Api) -> None:
    await api.create_schedule("unlabelled")
    other = {"manifest_set": "other", "schedules": [schedule("theirs", 1)]}
    assert (await apply(api, other)).status_code == 200
    await apply(api, manifest(schedule("a", 3), schedule("b", 9)))
    response = await apply(api, manifest(schedule("a", 3), prune=True))
    assert [(c["name"], c["action"]) for c in response.json()["changes"]] == [("b", "delete")]
    live = await api.ledger.schedules_get_many(["a", "b", "unlabelled", "theirs"])
    assert sorted(live) == ["a", "theirs", "unlabelled"]


async def test_without_prune_unlisted_objects_stay(api: Api) -> None:
    await apply(api, manifest(schedule("a", 3), schedule("b", 9)))
    response = await apply(api, manifest(schedule("a", 3)))
    assert response.json()["changes"] == []
    assert sorted(await api.ledger.schedules_get_many(["a", "b"])) == ["a", "b"]


async def test_an_object_of_another_set_is_refused(api: Api) -> None:
    await apply(api, {"manifest_set": "other", "schedules": [schedule("a", 1)]})
    problem = assert_problem(await apply(api, manifest(schedule("a", 3))), 422)
    assert "belongs to manifest set 'other'" in problem["errors"][0]


async def test_an_unlabelled_equal_object_is_adopted(api: Api) -> None:
    await api.create_schedule("a", cron_expr="*/5 * * * *")
    response = await apply(api, manifest(schedule("a", 3)))
    [change] = response.json()["changes"]
    assert change["action"] == "adopt"
    assert (await apply(api, manifest(schedule("a", 3)))).json()["changes"] == []


async def test_if_version_mismatch_is_409_and_nothing_is_applied(api: Api) -> None:
    await apply(api, manifest(schedule("a", 3)))
    body = manifest(schedule("a", 3, payload={"x": 1}, if_version=7), schedule("new", 9))
    problem = assert_problem(await apply(api, body), 409, "version-conflict")
    assert "billing.yaml:3" in problem["errors"][0]
    assert await api.ledger.schedules_get_many(["new"]) == {}
    matching = manifest(schedule("a", 3, payload={"x": 1}, if_version=1))
    assert (await apply(api, matching)).status_code == 200


async def test_task_types_and_tenants_apply_with_secrets_write_only(api: Api) -> None:
    hook: dict[str, Any] = {
        "name": "hook",
        "kind": "webhook",
        "settings": {"url": "https://example.com/hook", "secret": SECRET},
        "allowed_tenants": ["acme"],
        "source": "types.yaml:1",
    }
    body = {
        "manifest_set": SET,
        "tenants": [{"tenant_id": "acme", "weight": 3, "source": "tenants.yaml:1"}],
        "task_types": [hook],
        "schedules": [schedule("a", 3, task_type="hook")],
    }
    response = await apply(api, body)
    assert response.status_code == 200, response.text
    assert [(c["kind"], c["action"]) for c in response.json()["changes"]] == [
        ("tenant", "create"),
        ("task_type", "create"),
        ("schedule", "create"),
    ]
    # The manifest as kept in git holds the fingerprint, never the secret: unchanged.
    shown = {**hook, "settings": {**hook["settings"]}}
    shown["settings"]["secret"] = redaction.fingerprint(SECRET)
    again = await apply(api, {**body, "task_types": [shown]})
    assert again.json()["changes"] == [], again.text
    stored = await api.ledger.task_types_get("hook")
    assert stored.settings["secret"] == SECRET


async def test_a_task_type_is_checked_as_its_put_checks_it(api: Api) -> None:
    # A redis dedup expiry shorter than the task type's worst retry horizon: PUT refuses it
    # (tests/api/test_admin.py), and so must apply, or a set could store what PUT would not.
    short_dedup: dict[str, Any] = {
        "name": "stream",
        "kind": "redis",
        "settings": {"url": "redis://h/0", "stream": "s", "dedup_ttl_s": 60},
        "source": "types.yaml:4",
    }
    body = {"manifest_set": SET, "task_types": [short_dedup], "schedules": []}
    problem = assert_problem(await apply(api, body), 422, "invalid-field")
    assert any("types.yaml:4" in error and "dedup_ttl_s" in error for error in problem["errors"])
    assert "stream" not in {t.name for t in await api.ledger.task_types_list()}


async def test_tenancy_rules_of_task_types_hold(api: Api) -> None:
    private = {"name": "private", "kind": "noop", "tenant_id": "globex"}
    body = {
        "manifest_set": SET,
        "task_types": [private],
        "schedules": [schedule("a", 3, task_type="private")],
    }
    problem = assert_problem(await apply(api, body), 422)
    assert "not granted to tenant 'acme'" in problem["errors"][0]


async def test_a_tenant_token_applies_its_own_schedules_only(api: Api) -> None:
    acme = api.tenant("acme")
    ok = await apply(api, manifest(schedule("a", 3)), headers=acme)
    assert ok.status_code == 200, ok.text
    foreign = await apply(api, manifest(schedule("g", 3, tenant_id="globex")), headers=acme)
    assert_problem(foreign, 422)
    types = {"manifest_set": SET, "task_types": [{"name": "x", "kind": "noop"}]}
    assert_problem(await apply(api, types, headers=acme), 403, "forbidden")


async def test_bad_bodies_are_4xx_problems(api: Api) -> None:
    bodies: list[dict[str, Any]] = [
        {"schedules": []},
        {"manifest_set": "bad name"},
        {"manifest_set": SET, "schedules": "nope"},
        {"manifest_set": SET, "schedules": [{"schedule_id": 5}]},
        {"manifest_set": SET, "schedules": [{"schedule_id": "a", "if_version": "x"}]},
        {"manifest_set": SET, "tenants": [{"tenant_id": "t", "weight": 0}]},
        {"manifest_set": SET, "task_types": [{"name": "t", "kind": "webhook"}]},
        {"manifest_set": SET, "unknown": 1},
    ]
    for body in bodies:
        response = await apply(api, body)
        assert 400 <= response.status_code < 500, (body, response.text)
        assert_problem(response, response.status_code)
    bad_flag = await api.client.post("/v1/apply?dry_run=maybe", json=manifest(), headers=api.admin)
    assert_problem(bad_flag, 422)


async def test_concurrent_applies_of_one_set_serialize(api: Api) -> None:
    body = manifest(*(schedule(f"s{n:03d}", n) for n in range(50)))
    answers: list[dict[str, Any]] = []

    async def one() -> None:
        response = await apply(api, body)
        assert response.status_code == 200, response.text
        answers.append(response.json())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(one)
        nursery.start_soon(one)
    assert sorted(len(answer["changes"]) for answer in answers) == [0, 50]
    assert await audit_rows(api) == 50


async def test_a_refusal_after_some_writes_undoes_them_all(api: Api) -> None:
    """The quota refuses the third schedule after two were written: all three are undone."""
    await api.ledger.tenants_put(TenantsPut(Tenant(tenant_id="acme", schedules_max=2)))
    body = manifest(schedule("a", 1), schedule("b", 2), schedule("c", 3))
    assert_problem(await apply(api, body), 409, "quota-exceeded")
    assert await api.ledger.schedules_get_many(["a", "b", "c"]) == {}
    assert await audit_rows(api) == 0
    head = await api.ledger.schedule_changes_head()
    ok = await apply(api, manifest(schedule("a", 1), schedule("b", 2)))
    assert ok.status_code == 200, ok.text
    changes = await api.ledger.schedule_changes(ScheduleChangesSince(head, 100))
    assert [change.schedule_id for change in changes] == ["a", "b"]  # none of the undone


async def test_a_tenant_tokens_prune_never_touches_task_types_or_other_tenants(api: Api) -> None:
    shared = {
        "manifest_set": SET,
        "task_types": [{"name": "shared", "kind": "noop", "allowed_tenants": ["*"]}],
        "schedules": [schedule("mine", 1), schedule("theirs", 2, tenant_id="globex")],
    }
    assert (await apply(api, shared)).status_code == 200
    pruning = manifest(prune=True)
    response = await apply(api, pruning, headers=api.tenant("acme"))
    assert response.status_code == 200, response.text
    assert [(c["name"], c["action"]) for c in response.json()["changes"]] == [("mine", "delete")]
    assert sorted(await api.ledger.schedules_get_many(["mine", "theirs"])) == ["theirs"]
    assert (await api.ledger.task_types_get("shared")).name == "shared"


async def test_a_tenant_token_learns_only_that_a_foreign_id_is_taken(api: Api) -> None:
    other_set = {"manifest_set": "globex-set", "schedules": [schedule("g", 1, tenant_id="globex")]}
    assert (await apply(api, other_set)).status_code == 200
    attempt = manifest(schedule("g", 7))
    problem = assert_problem(await apply(api, attempt, headers=api.tenant("acme")), 422)
    assert problem["errors"] == ["billing.yaml:7 (schedules[0]): schedule id 'g' is taken"]
