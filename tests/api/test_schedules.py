"""``/v1/schedules``: create, read, replace (PUT), change (PATCH), delete and list."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from engine.api.endpoint import BODY_BYTES_MAX
from engine.errors import NotFound
from engine.ledger.params import SCHEDULE_DELETED, ExecutionsQuery
from engine.model import PAYLOAD_BYTES_MAX, ExecutionStatus
from tests.api.support import TASK_TYPE, Api, assert_problem, walk_pages


def spec(**fields: Any) -> dict[str, Any]:
    return {"cron_expr": "*/5 * * * *", "task_type": TASK_TYPE, **fields}


def next_five_minutes(now: Any) -> Any:
    """The first */5 fire strictly after ``now``."""
    floor = now.replace(second=0, microsecond=0) - timedelta(minutes=now.minute % 5)
    return floor + timedelta(minutes=5)


# --- create ----------------------------------------------------------------------------------


async def test_create_answers_201_with_etag_location_and_next_fire(api: Api) -> None:
    now = await api.now()
    response = await api.client.post(
        "/v1/schedules", json=spec(schedule_id="nightly", tenant_id="acme"), headers=api.admin
    )
    assert response.status_code == 201, response.text
    body = response.json()
    assert response.headers["etag"] == '"1"'
    assert response.headers["location"] == "/v1/schedules/nightly"
    assert body["schedule_id"] == "nightly"
    assert body["tenant_id"] == "acme"
    assert body["version"] == 1
    assert body["partition_id"] is not None
    assert body["next_run_at"] == next_five_minutes(now).strftime("%Y-%m-%dT%H:%M:%SZ")


async def test_create_without_an_id_generates_one(api: Api) -> None:
    response = await api.client.post("/v1/schedules", json=spec(), headers=api.admin)
    assert response.status_code == 201
    assert response.json()["schedule_id"].startswith("sch_")


async def test_create_by_admin_without_a_tenant_goes_to_the_default_tenant(api: Api) -> None:
    response = await api.client.post("/v1/schedules", json=spec(), headers=api.admin)
    assert response.json()["tenant_id"] == "default"


async def test_create_by_tenant_token_goes_to_its_own_tenant(api: Api) -> None:
    for body in (spec(), spec(tenant_id="acme")):
        response = await api.client.post("/v1/schedules", json=body, headers=api.tenant("acme"))
        assert response.status_code == 201
        assert response.json()["tenant_id"] == "acme"


async def test_create_with_an_existing_id_gets_409(api: Api) -> None:
    await api.create_schedule("dup")
    response = await api.client.post(
        "/v1/schedules", json=spec(schedule_id="dup"), headers=api.admin
    )
    assert_problem(response, 409, "already-exists")


async def test_create_of_a_deleted_id_starts_a_new_incarnation(api: Api) -> None:
    await api.create_schedule("phoenix")
    assert (await api.client.delete("/v1/schedules/phoenix", headers=api.admin)).status_code == 204
    again = await api.client.post(
        "/v1/schedules", json=spec(schedule_id="phoenix", tenant_id="acme"), headers=api.admin
    )
    assert again.status_code == 201
    assert again.json()["version"] == 2  # one more than the deleted incarnation's last


async def test_a_deleted_id_is_never_revived_into_another_tenant(api: Api) -> None:
    """Ids are one namespace: a deleted id stays its tenant's, so another tenant can neither
    take over its history (backfill, execution ids) nor tell it from a live one."""
    await api.create_schedule("phoenix", tenant_id="globex")
    assert (await api.client.delete("/v1/schedules/phoenix", headers=api.admin)).status_code == 204
    await api.create_schedule("live-one", tenant_id="globex")
    answers = []
    for schedule_id in ("phoenix", "live-one"):
        body = spec(schedule_id=schedule_id)
        post = await api.client.post("/v1/schedules", json=body, headers=api.tenant("acme"))
        put = await api.client.put(
            f"/v1/schedules/{schedule_id}", json=spec(), headers=api.tenant("acme")
        )
        answers.append([(r.status_code, r.text.replace(schedule_id, "ID")) for r in (post, put)])
    # A deleted id and a live one of another tenant answer alike: "taken", nothing more.
    assert answers[0] == answers[1]
    assert [status for status, _ in answers[0]] == [409, 409]
    with pytest.raises(NotFound):
        await api.ledger.schedules_get("phoenix")
    assert (await api.ledger.schedules_get("live-one")).tenant_id == "globex"


INVALID_SPECS = {
    "malformed cron": spec(cron_expr="61 * * * *"),
    "cron with too many fields": spec(cron_expr="* * * * * * *"),
    "empty cron": spec(cron_expr=""),
    "reboot": spec(cron_expr="@reboot"),
    "never fires": spec(cron_expr="0 0 30 2 *"),
    "unknown zone": spec(timezone="Mars/Olympus_Mons"),
    "empty zone": spec(timezone=""),
    "bad schedule id": spec(schedule_id="has space"),
    "colon in schedule id": spec(schedule_id="a:b"),
    "empty schedule id": spec(schedule_id=""),
    "long schedule id": spec(schedule_id="x" * 129),
    "bad tenant id": spec(tenant_id="a/b"),
    "empty tenant id": spec(tenant_id=""),
    "unknown task type": spec(task_type="nope"),
    "bad task type": spec(task_type="no pe"),
    "oversize payload": spec(payload={"blob": "x" * PAYLOAD_BYTES_MAX}),
    "NUL in a payload value": spec(payload={"a": "x\u0000y"}),
    "NUL in a payload key": spec(payload={"a\u0000": 1}),
    "NUL deep in a payload": spec(payload={"a": [{"b": "\u0000"}]}),
    "unknown field": spec(timzone="UTC"),
    "cron of the wrong type": spec(cron_expr=5),
    "payload of the wrong type": spec(payload=[1, 2]),
    "enabled of the wrong type": spec(enabled="yes"),
    "unknown catch-up policy": spec(catch_up="sometimes"),
    "zero catch-up window": spec(catch_up_window_s=0),
    "negative catch-up window": spec(catch_up_window_s=-1),
    "catch-up window over 7 days": spec(catch_up_window_s=7 * 86400 + 1),
    "unknown DST policy": spec(dst_gap="maybe"),
    "unknown overlap policy": spec(overlap="sometimes"),
    "missing cron": {"task_type": TASK_TYPE},
    "missing task type": {"cron_expr": "* * * * *"},
}


@pytest.mark.parametrize("body", INVALID_SPECS.values(), ids=INVALID_SPECS.keys())
async def test_create_with_an_invalid_field_gets_422_and_creates_nothing(
    memory_api: Api, body: dict[str, Any]
) -> None:
    response = await memory_api.client.post("/v1/schedules", json=body, headers=memory_api.admin)
    assert_problem(response, 422, "invalid-field")
    listing = await memory_api.client.get("/v1/schedules", headers=memory_api.admin)
    assert listing.json()["items"] == []


async def test_every_invalid_create_and_put_gets_422_on_every_ledger(api: Api) -> None:
    for name, body in INVALID_SPECS.items():
        created = await api.client.post("/v1/schedules", json=body, headers=api.admin)
        assert created.status_code == 422, (name, created.text)
        if "schedule_id" not in body:
            put = await api.client.put("/v1/schedules/put-target", json=body, headers=api.admin)
            assert put.status_code == 422, (name, put.text)
    assert (await api.client.get("/v1/schedules", headers=api.admin)).json()["items"] == []


async def test_payload_over_the_body_limit_gets_413_not_5xx(memory_api: Api) -> None:
    response = await memory_api.client.post(
        "/v1/schedules",
        json=spec(payload={"blob": "x" * (BODY_BYTES_MAX + 1)}),
        headers=memory_api.admin,
    )
    assert_problem(response, 413, "payload-too-large")


async def test_payload_of_exactly_64_kib_is_accepted(api: Api) -> None:
    filler = PAYLOAD_BYTES_MAX - len('{"blob":""}')
    response = await api.client.post(
        "/v1/schedules", json=spec(payload={"blob": "x" * filler}), headers=api.admin
    )
    assert response.status_code == 201, response.text


async def test_unicode_payload_round_trips(api: Api) -> None:
    payload = {"emoji": "🔔", "nested": {"list": [1, 2.5, None, True]}, "zh": "钟"}
    created = await api.create_schedule("unicode", payload=payload)
    assert created["payload"] == payload
    read = await api.client.get("/v1/schedules/unicode", headers=api.admin)
    assert read.json()["payload"] == payload


async def test_payload_may_hold_the_text_backslash_u0000(api: Api) -> None:
    """Only a real NUL character is refused, not the six characters ``\\u0000``."""
    payload = {"path": "C:\\u0000dir", "escaped": "\\\\u0000"}
    created = await api.create_schedule("backslashes", payload=payload)
    assert created["payload"] == payload
    read = await api.client.get("/v1/schedules/backslashes", headers=api.admin)
    assert read.json()["payload"] == payload


# --- read ------------------------------------------------------------------------------------


async def test_get_answers_the_schedule_with_its_etag(api: Api) -> None:
    created = await api.create_schedule("read-me")
    response = await api.client.get("/v1/schedules/read-me", headers=api.admin)
    assert response.status_code == 200
    assert response.json() == created
    assert response.headers["etag"] == '"1"'


MALFORMED_IDS = ["missing", "has%20space", "a:b", "%00", "nul%00inside", "x" * 300, "%E2%82%AC"]


async def test_unknown_or_malformed_id_gets_404_on_every_schedule_route(api: Api) -> None:
    for schedule_id in MALFORMED_IDS:
        path = f"/v1/schedules/{schedule_id}"
        for method, url, body in [
            ("GET", path, None),
            ("PATCH", path, {}),
            ("DELETE", path, None),
            ("GET", f"{path}/preview", None),
            ("POST", f"{path}:pause", {}),
            ("POST", f"{path}:resume", {}),
            ("POST", f"{path}:trigger", {}),
            (
                "POST",
                f"{path}:backfill",
                {"from": "2026-03-01T00:00:00Z", "to": "2026-03-01T01:00:00Z"},
            ),
        ]:
            response = await api.client.request(method, url, json=body, headers=api.admin)
            assert_problem(response, 404, "not-found")


# --- replace (PUT) ---------------------------------------------------------------------------


async def test_put_creates_then_replaces_under_the_same_id(api: Api) -> None:
    first = await api.client.put("/v1/schedules/upsert", json=spec(), headers=api.admin)
    assert first.status_code == 201
    assert first.headers["etag"] == '"1"'
    second = await api.client.put(
        "/v1/schedules/upsert", json=spec(payload={"v": 2}), headers=api.admin
    )
    assert second.status_code == 200
    assert second.json()["schedule_id"] == "upsert"
    assert second.json()["payload"] == {"v": 2}
    assert second.headers["etag"] == '"2"'


async def test_put_with_an_unchanged_body_writes_nothing_and_keeps_the_version(
    api: Api,
) -> None:
    first = await api.client.put("/v1/schedules/same", json=spec(), headers=api.admin)
    second = await api.client.put("/v1/schedules/same", json=spec(), headers=api.admin)
    assert (first.status_code, second.status_code) == (201, 200)
    assert second.json() == first.json()
    assert second.headers["etag"] == '"1"'
    stale = await api.client.put(
        "/v1/schedules/same", json=spec(), headers={**api.admin, "If-Match": '"7"'}
    )
    assert stale.status_code == 412


async def test_patch_that_changes_nothing_keeps_the_version(api: Api) -> None:
    await api.client.put("/v1/schedules/same", json=spec(payload={"a": 1}), headers=api.admin)
    patched = await api.client.patch(
        "/v1/schedules/same", json={"payload": {"a": 1}}, headers=api.admin
    )
    assert patched.status_code == 200
    assert patched.headers["etag"] == '"1"'


async def test_put_keeps_next_run_unless_the_timing_changes(memory_api: Api) -> None:
    api = memory_api
    created = (await api.client.put("/v1/schedules/p", json=spec(), headers=api.admin)).json()
    api.clock.advance(3 * 3600)
    same_timing = await api.client.put(
        "/v1/schedules/p", json=spec(payload={"x": 1}), headers=api.admin
    )
    assert same_timing.json()["next_run_at"] == created["next_run_at"]
    retimed = await api.client.put(
        "/v1/schedules/p", json=spec(cron_expr="0 * * * *"), headers=api.admin
    )
    assert retimed.json()["next_run_at"] == "2026-03-02T04:00:00Z"


async def test_put_honours_if_match(api: Api) -> None:
    await api.client.put("/v1/schedules/guarded", json=spec(), headers=api.admin)
    stale = await api.client.put(
        "/v1/schedules/guarded", json=spec(), headers={**api.admin, "If-Match": '"7"'}
    )
    assert_problem(stale, 412, "version-conflict")
    fresh = await api.client.put(
        "/v1/schedules/guarded", json=spec(), headers={**api.admin, "If-Match": '"1"'}
    )
    assert fresh.status_code == 200


async def test_put_with_if_match_on_a_missing_schedule_gets_412(api: Api) -> None:
    response = await api.client.put(
        "/v1/schedules/absent", json=spec(), headers={**api.admin, "If-Match": '"1"'}
    )
    assert_problem(response, 412, "version-conflict")
    assert_problem(await api.client.get("/v1/schedules/absent", headers=api.admin), 404)


async def test_put_with_a_different_id_in_the_body_gets_422(api: Api) -> None:
    response = await api.client.put(
        "/v1/schedules/one", json=spec(schedule_id="two"), headers=api.admin
    )
    assert_problem(response, 422, "invalid-field")


async def test_put_cannot_move_a_schedule_to_another_tenant(api: Api) -> None:
    await api.create_schedule("mover", tenant_id="acme")
    response = await api.client.put(
        "/v1/schedules/mover", json=spec(tenant_id="globex"), headers=api.admin
    )
    assert_problem(response, 422, "invalid-field")


@pytest.mark.parametrize(
    "if_match", [b"abc", b'"v1"', b'"-1"', b'"1.0"', b'""', '"\u00b2"'.encode("latin-1")]
)
async def test_malformed_if_match_gets_400(api: Api, if_match: bytes) -> None:
    await api.create_schedule("etagged")
    for method in ("PATCH", "DELETE"):
        response = await api.client.request(
            method, "/v1/schedules/etagged", json={}, headers={**api.admin, "If-Match": if_match}
        )
        assert_problem(response, 400, "bad-request")
    response = await api.client.put(
        "/v1/schedules/etagged", json=spec(), headers={**api.admin, "If-Match": if_match}
    )
    assert_problem(response, 400, "bad-request")


async def test_if_match_beyond_any_version_gets_412(api: Api) -> None:
    await api.create_schedule("huge")
    headers = {**api.admin, "If-Match": '"99999999999999999999999"'}
    for method, body in (("PATCH", {}), ("PUT", spec()), ("DELETE", None)):
        response = await api.client.request(
            method, "/v1/schedules/huge", json=body, headers=headers
        )
        assert_problem(response, 412, "version-conflict")


async def test_weak_etag_is_accepted_in_if_match(api: Api) -> None:
    await api.create_schedule("weak")
    response = await api.client.patch(
        "/v1/schedules/weak", json={"payload": {"a": 1}}, headers={**api.admin, "If-Match": 'W/"1"'}
    )
    assert response.status_code == 200


# --- change (PATCH) --------------------------------------------------------------------------


async def test_patch_changes_only_the_given_fields_and_keeps_next_run(memory_api: Api) -> None:
    api = memory_api
    created = await api.create_schedule("patched", payload={"a": 1})
    api.clock.advance(3600 + 60)
    response = await api.client.patch(
        "/v1/schedules/patched", json={"payload": {"b": 2}}, headers=api.admin
    )
    assert response.status_code == 200
    body = response.json()
    assert body["payload"] == {"b": 2}
    assert body["cron_expr"] == created["cron_expr"]
    assert body["next_run_at"] == created["next_run_at"]
    assert response.headers["etag"] == '"2"'


@pytest.mark.parametrize(
    "change",
    [
        {"cron_expr": "0 * * * *"},
        {"timezone": "Asia/Kolkata"},
        {"dst_gap": "skip"},
        {"dst_overlap": "both"},
    ],
    ids=lambda change: next(iter(change)),
)
async def test_patch_of_timing_restarts_at_the_next_fire_after_now(
    memory_api: Api, change: dict[str, Any]
) -> None:
    api = memory_api
    created = await api.create_schedule("retimed")
    api.clock.advance(2 * 3600 + 7 * 60)  # now 02:07, the stored next run was 00:05
    response = await api.client.patch("/v1/schedules/retimed", json=change, headers=api.admin)
    assert response.status_code == 200, response.text
    next_run = response.json()["next_run_at"]
    assert next_run != created["next_run_at"]
    assert next_run > "2026-03-02T02:07:00Z"


async def test_patch_with_a_stale_if_match_gets_412_and_changes_nothing(api: Api) -> None:
    await api.create_schedule("raced")
    response = await api.client.patch(
        "/v1/schedules/raced", json={"payload": {"x": 1}}, headers={**api.admin, "If-Match": '"5"'}
    )
    assert_problem(response, 412, "version-conflict")
    read = await api.client.get("/v1/schedules/raced", headers=api.admin)
    assert read.json()["payload"] == {}


@pytest.mark.parametrize(
    "change",
    [
        {"cron_expr": "nope"},
        {"cron_expr": "0 0 31 2 *"},
        {"timezone": "Nowhere/City"},
        {"task_type": "missing"},
        {"task_type": "bad name"},
        {"payload": {"k": "\u0000"}},
        {"payload": None},
        {"enabled": None},
        {"catch_up_window_s": 0},
        {"schedule_id": "renamed"},
        {"tenant_id": "globex"},
        {"version": 9},
    ],
)
async def test_patch_with_an_invalid_field_gets_422(
    memory_api: Api, change: dict[str, Any]
) -> None:
    await memory_api.create_schedule("strict")
    response = await memory_api.client.patch(
        "/v1/schedules/strict", json=change, headers=memory_api.admin
    )
    assert_problem(response, 422, "invalid-field")


async def test_patch_naming_a_missing_task_type_gets_422_and_changes_nothing(api: Api) -> None:
    await api.create_schedule("typed")
    response = await api.client.patch(
        "/v1/schedules/typed", json={"task_type": "missing"}, headers=api.admin
    )
    assert_problem(response, 422, "invalid-field")
    read = await api.client.get("/v1/schedules/typed", headers=api.admin)
    assert (read.json()["task_type"], read.json()["version"]) == ("noop", 1)


async def test_patch_of_an_unknown_schedule_gets_404(api: Api) -> None:
    response = await api.client.patch("/v1/schedules/ghost", json={}, headers=api.admin)
    assert_problem(response, 404, "not-found")


async def test_patch_overlap_to_null_clears_it(api: Api) -> None:
    await api.create_schedule("overlapping", overlap="skip")
    response = await api.client.patch(
        "/v1/schedules/overlapping", json={"overlap": None}, headers=api.admin
    )
    assert response.json()["overlap"] is None


# --- delete ----------------------------------------------------------------------------------


async def test_delete_answers_204_and_skips_queued_runs(api: Api) -> None:
    await api.create_schedule("doomed")
    queued = await api.queued("doomed")
    response = await api.client.delete("/v1/schedules/doomed", headers=api.admin)
    assert (response.status_code, response.content) == (204, b"")
    assert_problem(await api.client.get("/v1/schedules/doomed", headers=api.admin), 404)
    detail = await api.ledger.executions_get(queued)
    assert detail.execution.status is ExecutionStatus.SKIPPED
    assert detail.execution.error_code == SCHEDULE_DELETED


async def test_delete_with_a_stale_if_match_gets_412_and_keeps_the_schedule(api: Api) -> None:
    await api.create_schedule("kept")
    response = await api.client.delete(
        "/v1/schedules/kept", headers={**api.admin, "If-Match": '"2"'}
    )
    assert_problem(response, 412, "version-conflict")
    assert (await api.client.get("/v1/schedules/kept", headers=api.admin)).status_code == 200
    ok = await api.client.delete("/v1/schedules/kept", headers={**api.admin, "If-Match": '"1"'})
    assert ok.status_code == 204


async def test_delete_of_an_unknown_schedule_gets_404(api: Api) -> None:
    assert_problem(await api.client.delete("/v1/schedules/ghost", headers=api.admin), 404)


# --- list ------------------------------------------------------------------------------------


async def test_cursor_pagination_walks_every_schedule_once(api: Api) -> None:
    ids = sorted(f"s-{n:03d}" for n in range(53))
    response = await api.client.post(
        "/v1/schedules:batch",
        json={"schedules": [spec(schedule_id=i, tenant_id="acme") for i in ids]},
        headers=api.admin,
    )
    assert response.status_code == 201, response.text
    for limit in (1, 7, 53, 1000) if api.backend == "memory" else (7, 1000):
        items = await walk_pages(api.client, "/v1/schedules", api.admin, limit)
        assert [item["schedule_id"] for item in items] == ids


async def test_listing_filters_by_tenant_task_type_and_enabled(api: Api) -> None:
    await api.create_schedule("a1", tenant_id="acme")
    await api.create_schedule("a2", tenant_id="acme", enabled=False)
    await api.create_schedule("g1", tenant_id="globex")

    async def ids(query: str) -> list[str]:
        response = await api.client.get(f"/v1/schedules?{query}", headers=api.admin)
        assert response.status_code == 200, response.text
        return [item["schedule_id"] for item in response.json()["items"]]

    assert await ids("tenant_id=acme") == ["a1", "a2"]
    assert await ids("enabled=false") == ["a2"]
    assert await ids("enabled=true") == ["a1", "g1"]
    assert await ids(f"task_type={TASK_TYPE}") == ["a1", "a2", "g1"]
    assert await ids("task_type=other") == []


BAD_LIST_QUERIES = [
    "limit=0",
    "limit=1001",
    "limit=ten",
    "limit=",
    "limit=%C2%B2",
    "enabled=yes",
    "enabled=True",
    "cursor=zz",
    "cursor=00",
    "cursor=5b315d",
    "cursor=",
    "task_type=%00",
    "tenant_id=a%00",
]


async def test_listing_with_a_bad_query_parameter_gets_422(api: Api) -> None:
    for query in BAD_LIST_QUERIES:
        response = await api.client.get(f"/v1/schedules?{query}", headers=api.admin)
        assert_problem(response, 422, "invalid-field")


async def test_deleting_a_schedule_leaves_another_schedules_queued_runs_alone(api: Api) -> None:
    """Deleting one schedule leaves another's queued runs alone."""
    await api.create_schedule("left")
    await api.create_schedule("right")
    kept = await api.queued("right")
    await api.client.delete("/v1/schedules/left", headers=api.admin)
    page = await api.ledger.executions_query(ExecutionsQuery(schedule_id="right"))
    assert [e.execution_id for e in page.items] == [kept]
    assert page.items[0].status is ExecutionStatus.QUEUED
