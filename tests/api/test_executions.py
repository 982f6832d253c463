"""``/v1/executions`` and ``/v1/dead-letters``: reading runs, replaying and purging dead letters."""

from __future__ import annotations

from datetime import timedelta

import pytest

from engine.core.instants import format_utc
from engine.ledger.common import encode_cursor
from engine.ledger.params import AuditQuery
from tests.api.support import Api, assert_problem, walk_pages

RECENT = "2026-02-01T00:00:00Z"
"""Before every execution the tests make (the memory ledger starts on 2026-03-02)."""


async def backfilled(api: Api, schedule_id: str, minutes: int) -> list[str]:
    """The ids of the fires of the last ``minutes`` (a minutely schedule), oldest first."""
    await api.create_schedule(schedule_id, cron_expr="* * * * *")
    now = await api.now()
    body = {"from": format_utc(now - timedelta(minutes=minutes)), "to": format_utc(now)}
    response = await api.client.post(
        f"/v1/schedules/{schedule_id}:backfill", json=body, headers=api.admin
    )
    assert response.status_code == 201, response.text
    ids: list[str] = response.json()["execution_ids"]
    return ids


# --- reading ---------------------------------------------------------------------------------


async def test_cursor_pagination_walks_every_execution_once_in_planned_order(api: Api) -> None:
    first = await backfilled(api, "walk-a", 40)
    second = await backfilled(api, "walk-b", 25)
    for limit in (1, 6, 1000) if api.backend == "memory" else (6, 1000):
        items = await walk_pages(api.client, "/v1/executions", api.admin, limit)
        ids = [item["execution_id"] for item in items]
        assert sorted(ids) == sorted(first + second)
        assert len(set(ids)) == len(ids)
        keys = [(item["planned_at"], item["execution_id"]) for item in items]
        assert keys == sorted(keys)
    only_a = await walk_pages(api.client, "/v1/executions?schedule_id=walk-a", api.admin, 9)
    assert [item["execution_id"] for item in only_a] == first


async def test_execution_listing_filters_by_status_time_and_task_type(api: Api) -> None:
    ids = await backfilled(api, "filtered", 10)
    dead = await api.dead_letter("filtered")

    async def listed(query: str) -> list[str]:
        response = await api.client.get(f"/v1/executions?{query}", headers=api.admin)
        assert response.status_code == 200, response.text
        return [item["execution_id"] for item in response.json()["items"]]

    assert await listed("status=dead-letter") == [dead]
    assert await listed("status=queued&schedule_id=filtered") == ids
    middle = ids[3].split(":", 1)[1]
    assert await listed(f"schedule_id=filtered&planned_to={middle}") == ids[:3]
    assert await listed(f"status=queued&planned_from={middle}") == ids[3:]
    assert await listed("task_type=noop&tenant_id=acme&status=queued") == ids
    assert await listed("task_type=other") == []


async def test_get_execution_shows_its_attempts(api: Api) -> None:
    await api.create_schedule("attempted")
    dead = await api.dead_letter("attempted")
    response = await api.client.get(f"/v1/executions/{dead}", headers=api.admin)
    assert response.status_code == 200
    detail = response.json()
    assert detail["execution"]["status"] == "dead-letter"
    assert detail["execution"]["error_code"] == "boom"
    assert [(a["attempt"], a["outcome"]) for a in detail["attempts"]] == [(1, "dead-letter")]


async def test_unknown_or_malformed_execution_id_gets_404(api: Api) -> None:
    for execution_id in ["nope", "s:2026-01-01T00:00:00Z", "%00", "a%00b", "x" * 400]:
        for method, path in [
            ("GET", f"/v1/executions/{execution_id}"),
            ("POST", f"/v1/dead-letters/{execution_id}:replay"),
        ]:
            response = await api.client.request(method, path, json={}, headers=api.admin)
            assert_problem(response, 404, "not-found")


BAD_EXECUTION_QUERIES = [
    "status=bogus",
    "status=",
    "limit=0",
    "limit=1001",
    "planned_from=yesterday",
    "planned_from=2026-03-01T00:00:00",
    "planned_to=2026-03-01",
    "planned_from=0001-01-01T00:00:00%2B01:00",
    "planned_to=9999-12-31T23:59:59-01:00",
    "cursor=nothex",
    "cursor=7b7d",
    "schedule_id=%00",
    "task_type=x%00",
]


async def test_execution_listing_with_a_bad_query_gets_422(api: Api) -> None:
    for path in ("/v1/executions", "/v1/dead-letters"):
        for query in BAD_EXECUTION_QUERIES:
            if path == "/v1/dead-letters" and query.startswith("status"):
                continue  # the dead-letter listing has no status parameter (it is ignored)
            response = await api.client.get(f"{path}?{query}", headers=api.admin)
            assert_problem(response, 422, "invalid-field")


@pytest.mark.parametrize(
    "parts",
    [("\u0000",), ("2026-01-01T00:00:00Z", "\u0000"), ("0001-01-01T00:00:00+01:00", "x")],
    ids=["nul-id", "nul-second-part", "year-one"],
)
async def test_forged_cursor_is_refused_without_a_server_error(
    api: Api, parts: tuple[str, ...]
) -> None:
    """A cursor is opaque but not signed: one made up of a NUL or an instant that overflows
    must not reach SQL or date arithmetic unchecked."""
    cursor = encode_cursor(*parts)
    for path in ("/v1/schedules", "/v1/executions"):
        response = await api.client.get(f"{path}?cursor={cursor}", headers=api.admin)
        assert response.status_code < 500, (path, response.text)


# --- dead letters ----------------------------------------------------------------------------


async def test_dead_letter_listing_shows_only_dead_letters(api: Api) -> None:
    await api.create_schedule("mixed")
    await api.queued("mixed")
    dead = [await api.dead_letter("mixed"), await api.dead_letter("mixed")]
    items = await walk_pages(api.client, "/v1/dead-letters", api.admin, 1)
    assert sorted(item["execution_id"] for item in items) == sorted(dead)
    assert {item["status"] for item in items} == {"dead-letter"}


async def test_replaying_one_dead_letter_queues_it_again_and_audits_the_token(api: Api) -> None:
    await api.create_schedule("replayed")
    dead = await api.dead_letter("replayed")
    response = await api.client.post(
        f"/v1/dead-letters/{dead}:replay", json={"reason": "fixed the endpoint"}, headers=api.admin
    )
    assert response.status_code == 200, response.text
    assert response.json() == {"replayed": [dead]}
    detail = (await api.client.get(f"/v1/executions/{dead}", headers=api.admin)).json()
    assert detail["execution"]["status"] == "queued"
    [event] = await api.ledger.audit_list(AuditQuery(action="dead_letter.replay"))
    assert event.actor == f"token:{api.admin_id}"
    assert event.target == dead
    assert event.details["reason"] == "fixed the endpoint"
    assert event.details["error_code"] == "boom"
    # It is queued now: replaying it again is a conflict, and audits nothing more.
    again = await api.client.post(f"/v1/dead-letters/{dead}:replay", headers=api.admin)
    assert_problem(again, 409, "not-a-dead-letter")
    assert len(await api.ledger.audit_list(AuditQuery(action="dead_letter.replay"))) == 1


async def test_replaying_a_run_that_is_not_a_dead_letter_gets_409(api: Api) -> None:
    await api.create_schedule("queued-only")
    queued = await api.queued("queued-only")
    response = await api.client.post(f"/v1/dead-letters/{queued}:replay", headers=api.admin)
    assert_problem(response, 409, "not-a-dead-letter")
    detail = (await api.client.get(f"/v1/executions/{queued}", headers=api.admin)).json()
    assert detail["execution"]["status"] == "queued"


async def test_replaying_a_dead_letter_of_a_deleted_schedule_gets_409_and_changes_nothing(
    api: Api,
) -> None:
    await api.create_schedule("gone")
    dead = await api.dead_letter("gone")
    deleted = await api.client.delete("/v1/schedules/gone", headers=api.admin)
    assert deleted.status_code == 204
    for headers in (api.admin, api.tenant("acme")):
        response = await api.client.post(f"/v1/dead-letters/{dead}:replay", headers=headers)
        body = assert_problem(response, 409, "schedule-deleted")
        assert "'gone' was deleted" in body["detail"]
    detail = (await api.client.get(f"/v1/executions/{dead}", headers=api.admin)).json()
    assert detail["execution"]["status"] == "dead-letter"
    assert await api.ledger.audit_list(AuditQuery(action="dead_letter.replay")) == []
    # Created again, the schedule has a payload to run with: the replay goes through.
    await api.create_schedule("gone")
    response = await api.client.post(f"/v1/dead-letters/{dead}:replay", headers=api.admin)
    assert response.json() == {"replayed": [dead]}


async def test_replaying_by_filter_leaves_out_dead_letters_of_deleted_schedules(
    api: Api,
) -> None:
    await api.create_schedule("deleted-one")
    await api.create_schedule("kept-one")
    gone = [await api.dead_letter("deleted-one") for _ in range(3)]  # planned first
    kept = await api.dead_letter("kept-one")
    await api.client.delete("/v1/schedules/deleted-one", headers=api.admin)
    response = await api.client.post(
        "/v1/dead-letters:replay", json={"tenant_id": "acme", "limit": 1}, headers=api.admin
    )
    assert response.status_code == 200, response.text
    assert response.json() == {"replayed": [kept]}
    remaining = await walk_pages(api.client, "/v1/dead-letters", api.admin, 100)
    assert sorted(item["execution_id"] for item in remaining) == sorted(gone)


async def test_replaying_by_filter_replays_the_matching_dead_letters_only(api: Api) -> None:
    await api.create_schedule("f-one")
    await api.create_schedule("f-two")
    one = [await api.dead_letter("f-one") for _ in range(3)]
    two = await api.dead_letter("f-two")
    token_id, token = await api.new_token("admin")
    response = await api.client.post(
        "/v1/dead-letters:replay",
        json={"schedule_id": "f-one", "reason": "bulk"},
        headers={"Authorization": f"Bearer {token}"},
    )
    assert response.status_code == 200, response.text
    assert sorted(response.json()["replayed"]) == sorted(one)
    remaining = await walk_pages(api.client, "/v1/dead-letters", api.admin, 100)
    assert [item["execution_id"] for item in remaining] == [two]
    events = await api.ledger.audit_list(AuditQuery(action="dead_letter.replay"))
    assert sorted(e.target for e in events) == sorted(one)
    assert {(e.actor, e.details["reason"]) for e in events} == {(f"token:{token_id}", "bulk")}


async def test_replaying_by_filter_honours_the_limit(api: Api) -> None:
    await api.create_schedule("limited")
    dead = [await api.dead_letter("limited") for _ in range(4)]
    response = await api.client.post(
        "/v1/dead-letters:replay", json={"all": True, "limit": 3}, headers=api.admin
    )
    assert len(response.json()["replayed"]) == 3
    assert set(response.json()["replayed"]) < set(dead)


async def test_replaying_by_filter_with_no_match_replays_nothing(api: Api) -> None:
    response = await api.client.post(
        "/v1/dead-letters:replay", json={"task_type": "nothing-here"}, headers=api.admin
    )
    assert response.status_code == 200
    assert response.json() == {"replayed": []}
    assert await api.ledger.audit_list(AuditQuery(action="dead_letter.replay")) == []


@pytest.mark.parametrize(
    "body",
    [None, {}, {"limit": 5}, {"all": False}, {"reason": "outage"}, {"planned_from": RECENT}],
    ids=["no-body", "empty", "limit-only", "all-false", "reason-only", "time-range-only"],
)
async def test_replaying_without_a_filter_or_all_is_refused_and_replays_nothing(
    api: Api, body: dict[str, object] | None
) -> None:
    await api.create_schedule("kept-dead", tenant_id="acme")
    dead = await api.dead_letter("kept-dead")
    for headers in (api.admin, api.tenant("acme")):
        response = await api.client.post("/v1/dead-letters:replay", json=body, headers=headers)
        problem = assert_problem(response, 422, "invalid-field")
        assert '"all": true' in problem["detail"]
    detail = (await api.client.get(f"/v1/executions/{dead}", headers=api.admin)).json()
    assert detail["execution"]["status"] == "dead-letter"
    assert await api.ledger.audit_list(AuditQuery(action="dead_letter.replay")) == []


async def test_replaying_all_explicitly_replays_every_dead_letter(api: Api) -> None:
    await api.create_schedule("all-a", tenant_id="acme")
    await api.create_schedule("all-b", tenant_id="globex")
    dead = [await api.dead_letter("all-a"), await api.dead_letter("all-b")]
    response = await api.client.post(
        "/v1/dead-letters:replay", json={"all": True, "reason": "outage over"}, headers=api.admin
    )
    assert response.status_code == 200, response.text
    assert sorted(response.json()["replayed"]) == sorted(dead)


async def test_all_with_a_time_range_replays_only_that_range(api: Api) -> None:
    await api.create_schedule("ranged")
    dead = await api.dead_letter("ranged")
    later = await api.client.post(
        "/v1/dead-letters:replay",
        json={"all": True, "planned_from": "2100-01-01T00:00:00Z"},
        headers=api.admin,
    )
    assert later.json() == {"replayed": []}
    since = await api.client.post(
        "/v1/dead-letters:replay", json={"all": True, "planned_from": RECENT}, headers=api.admin
    )
    assert since.json() == {"replayed": [dead]}


@pytest.mark.parametrize(
    "body",
    [
        {"limit": 0},
        {"limit": 10_001},
        {"planned_from": "2026-03-01T00:00:00"},
        {"planned_from": "0001-01-01T00:00:00+01:00"},
        {"planned_to": "9999-12-31T23:59:59-01:00"},
        {"reason": "x" * 1001},
        {"reason": "tab\u0007"},
        {"schedule_id": "nul\u0000"},
        {"task_type": 5},
        {"status": "queued"},
    ],
)
async def test_replaying_by_a_bad_filter_gets_422(api: Api, body: dict[str, object]) -> None:
    await api.create_schedule("untouched")
    dead = await api.dead_letter("untouched")
    response = await api.client.post("/v1/dead-letters:replay", json=body, headers=api.admin)
    assert_problem(response, 422, "invalid-field")
    detail = (await api.client.get(f"/v1/executions/{dead}", headers=api.admin)).json()
    assert detail["execution"]["status"] == "dead-letter"


# --- purging dead letters --------------------------------------------------------------------


async def test_purging_one_dead_letter_deletes_it_and_audits_the_token(api: Api) -> None:
    await api.create_schedule("purged")
    dead = await api.dead_letter("purged")
    response = await api.client.post(
        f"/v1/dead-letters/{dead}:purge", json={"reason": "known noise"}, headers=api.admin
    )
    assert response.status_code == 200, response.text
    assert response.json() == {"purged": [dead]}
    gone = await api.client.get(f"/v1/executions/{dead}", headers=api.admin)
    assert_problem(gone, 404, "not-found")
    [event] = await api.ledger.audit_list(AuditQuery(action="dead_letter.purge"))
    assert (event.actor, event.target) == (f"token:{api.admin_id}", dead)
    assert event.details == {
        "reason": "known noise",
        "attempt": 1,
        "error_code": "boom",
        "schedule_id": "purged",
    }
    again = await api.client.post(f"/v1/dead-letters/{dead}:purge", headers=api.admin)
    assert_problem(again, 404, "not-found")
    assert len(await api.ledger.audit_list(AuditQuery(action="dead_letter.purge"))) == 1


async def test_purging_a_run_that_is_not_a_dead_letter_gets_409_and_keeps_it(api: Api) -> None:
    await api.create_schedule("kept-queued")
    queued = await api.queued("kept-queued")
    response = await api.client.post(f"/v1/dead-letters/{queued}:purge", headers=api.admin)
    assert_problem(response, 409, "not-a-dead-letter")
    detail = (await api.client.get(f"/v1/executions/{queued}", headers=api.admin)).json()
    assert detail["execution"]["status"] == "queued"


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"reason": "everything"},
        {"all": False},
        {"all": True, "schedule_id": "p-one"},
        {"limit": 0, "all": True},
        {"all": "yes"},
        {"planned_to": "2026-03-01"},
        {"every": True},
    ],
    ids=["empty", "reason-only", "all-false", "all-and-filter", "limit-0", "all-not-bool",
         "bad-instant", "unknown-field"],
)  # fmt: skip
async def test_purging_by_filter_needs_a_filter_or_all_and_purges_nothing_otherwise(
    api: Api, body: dict[str, object]
) -> None:
    await api.create_schedule("p-one")
    dead = await api.dead_letter("p-one")
    response = await api.client.post("/v1/dead-letters:purge", json=body, headers=api.admin)
    assert response.status_code == 422, response.text
    assert (await api.ledger.executions_get(dead)).execution.execution_id == dead
    assert await api.ledger.audit_list(AuditQuery(action="dead_letter.purge")) == []


async def test_purging_by_filter_deletes_the_matching_dead_letters_only(api: Api) -> None:
    await api.create_schedule("q-one")
    await api.create_schedule("q-two")
    one = [await api.dead_letter("q-one") for _ in range(3)]
    two = await api.dead_letter("q-two")
    queued = await api.queued("q-one")
    response = await api.client.post(
        "/v1/dead-letters:purge",
        json={"schedule_id": "q-one", "limit": 2, "reason": "bulk"},
        headers=api.admin,
    )
    assert response.status_code == 200, response.text
    first = response.json()["purged"]
    assert len(first) == 2
    assert set(first) < set(one)
    rest = await api.client.post(
        "/v1/dead-letters:purge", json={"schedule_id": "q-one"}, headers=api.admin
    )
    assert sorted(first + rest.json()["purged"]) == sorted(one)
    remaining = await walk_pages(api.client, "/v1/dead-letters", api.admin, 100)
    assert [item["execution_id"] for item in remaining] == [two]
    assert (await api.ledger.executions_get(queued)).execution.execution_id == queued
    events = await api.ledger.audit_list(AuditQuery(action="dead_letter.purge"))
    assert sorted(e.target for e in events) == sorted(one)
    everything = await api.client.post(
        "/v1/dead-letters:purge", json={"all": True}, headers=api.admin
    )
    assert everything.json() == {"purged": [two]}
