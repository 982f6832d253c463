"""Operator actions on a schedule: pause, resume, trigger, backfill and preview."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest

from engine.core.instants import format_utc
from engine.ledger.params import (
    BATCH_ROWS_MAX,
    SCHEDULE_DELETED,
    SCHEDULE_PAUSED,
    AuditQuery,
    ExecutionsQuery,
)
from engine.model import execution_id, parse_execution_id
from tests.api.support import TASK_TYPE, Api, assert_problem

HOUR = "2026-03-01T23:00:00Z"
MIDNIGHT = "2026-03-02T00:00:00Z"


def spec(**fields: Any) -> dict[str, Any]:
    return {"cron_expr": "*/5 * * * *", "task_type": TASK_TYPE, **fields}


async def statuses(api: Api, schedule_id: str) -> dict[str, tuple[str, str | None]]:
    page = await api.ledger.executions_query(ExecutionsQuery(schedule_id=schedule_id, limit=1000))
    return {e.execution_id: (str(e.status), e.error_code) for e in page.items}


# --- pause and resume ------------------------------------------------------------------------


async def test_pause_disables_and_skips_queued_runs_with_schedule_paused(api: Api) -> None:
    await api.create_schedule("pausable")
    queued = [await api.queued("pausable"), await api.queued("pausable")]
    response = await api.client.post(
        "/v1/schedules/pausable:pause", json={"reason": "maintenance"}, headers=api.admin
    )
    assert response.status_code == 200, response.text
    assert response.json()["enabled"] is False
    assert response.headers["etag"] == '"2"'
    found = await statuses(api, "pausable")
    assert {found[i] for i in queued} == {("skipped", SCHEDULE_PAUSED)}


async def test_pausing_a_paused_schedule_changes_nothing(api: Api) -> None:
    await api.create_schedule("twice-paused")
    first = await api.client.post("/v1/schedules/twice-paused:pause", headers=api.admin)
    second = await api.client.post("/v1/schedules/twice-paused:pause", headers=api.admin)
    assert (first.status_code, second.status_code) == (200, 200)
    assert second.json()["version"] == first.json()["version"] == 2


async def test_resume_restarts_at_the_next_fire_after_now_without_catching_up(
    memory_api: Api,
) -> None:
    api = memory_api
    created = await api.create_schedule("sleeper")
    await api.client.post("/v1/schedules/sleeper:pause", headers=api.admin)
    api.clock.advance(86400 + 7 * 60)  # a day and 7 minutes later: 2026-03-03T00:07
    response = await api.client.post("/v1/schedules/sleeper:resume", headers=api.admin)
    assert response.status_code == 200
    body = response.json()
    assert body["enabled"] is True
    assert created["next_run_at"] == "2026-03-02T00:05:00Z"
    assert body["next_run_at"] == "2026-03-03T00:10:00Z"
    # Resuming plans nothing by itself: the 288 fires of the pause stay unplanned.
    assert await statuses(api, "sleeper") == {}


async def test_resume_on_every_ledger_moves_next_run_past_now(api: Api) -> None:
    await api.create_schedule("resumable")
    await api.client.post("/v1/schedules/resumable:pause", headers=api.admin)
    before = await api.now()
    response = await api.client.post("/v1/schedules/resumable:resume", headers=api.admin)
    assert response.status_code == 200
    next_run = response.json()["next_run_at"]
    assert format_utc(before) < next_run <= format_utc(before + timedelta(minutes=5))
    again = await api.client.post("/v1/schedules/resumable:resume", headers=api.admin)
    assert again.json()["version"] == response.json()["version"]


async def test_resume_queues_again_the_fires_to_come_the_pause_skipped_and_nothing_else(
    api: Api,
) -> None:
    await api.create_schedule("revival", cron_expr="* * * * *")
    now = await api.now()
    minute = now.replace(second=0, microsecond=0)
    passed = await api.planned("revival", minute - timedelta(minutes=1))
    to_come = await api.planned("revival", minute + timedelta(minutes=1))  # in the lookahead
    triggered = await api.queued("revival")  # an operator's run: not a fire of its timetable
    await api.client.post("/v1/schedules/revival:pause", headers=api.admin)
    found = await statuses(api, "revival")
    assert {found[key] for key in (passed, to_come, triggered)} == {("skipped", SCHEDULE_PAUSED)}
    response = await api.client.post("/v1/schedules/revival:resume", headers=api.admin)
    assert response.status_code == 200, response.text
    found = await statuses(api, "revival")
    assert found[to_come] == ("queued", None)
    assert found[passed] == found[triggered] == ("skipped", SCHEDULE_PAUSED)
    assert len(found) == 3


async def test_deleting_and_creating_a_schedule_again_queues_its_fires_to_come_again(
    api: Api,
) -> None:
    await api.create_schedule("reborn", cron_expr="* * * * *")
    minute = (await api.now()).replace(second=0, microsecond=0)
    first = await api.planned("reborn", minute + timedelta(minutes=1))
    second = await api.planned("reborn", minute + timedelta(minutes=2))
    deleted = await api.client.delete("/v1/schedules/reborn", headers=api.admin)
    assert deleted.status_code == 204
    # Created again to fire only at the second instant's minute: the first stays skipped.
    cron = f"{(minute + timedelta(minutes=2)).minute} * * * *"
    await api.create_schedule("reborn", cron_expr=cron)
    found = await statuses(api, "reborn")
    assert found[first] == ("skipped", SCHEDULE_DELETED)
    assert found[second] == ("queued", None)


async def test_patch_enabled_false_skips_queued_runs_like_pause(api: Api) -> None:
    await api.create_schedule("patched-off")
    queued = await api.queued("patched-off")
    response = await api.client.patch(
        "/v1/schedules/patched-off", json={"enabled": False}, headers=api.admin
    )
    assert response.json()["enabled"] is False
    assert (await statuses(api, "patched-off"))[queued] == ("skipped", SCHEDULE_PAUSED)


# --- trigger ---------------------------------------------------------------------------------


async def test_trigger_creates_a_queued_run_with_an_id_of_its_own(api: Api) -> None:
    await api.create_schedule("manual")
    first = await api.client.post(
        "/v1/schedules/manual:trigger", json={"reason": "customer asked"}, headers=api.admin
    )
    second = await api.client.post("/v1/schedules/manual:trigger", headers=api.admin)
    assert (first.status_code, second.status_code) == (201, 201)
    one, two = first.json(), second.json()
    assert one["execution_id"] != two["execution_id"]
    assert one["status"] == "queued"
    assert one["schedule_id"] == "manual"
    assert first.headers["location"] == f"/v1/executions/{one['execution_id']}"
    events = await api.ledger.audit_list(AuditQuery(action="schedule.trigger"))
    assert [(e.actor, e.target, e.details["reason"]) for e in events] == [
        (f"token:{api.admin_id}", one["execution_id"], "customer asked"),
        (f"token:{api.admin_id}", two["execution_id"], None),
    ]


async def test_trigger_does_not_take_the_id_of_a_fire_already_planned(memory_api: Api) -> None:
    api = memory_api  # the clock sits exactly on a fire: 00:00
    await api.create_schedule("on-the-dot")
    backfill = await api.client.post(
        "/v1/schedules/on-the-dot:backfill",
        json={"from": HOUR, "to": "2026-03-02T00:00:00.5Z"},
        headers=api.admin,
    )
    regular = execution_id("on-the-dot", api.clock.now())
    assert regular in backfill.json()["execution_ids"]
    triggered = await api.client.post("/v1/schedules/on-the-dot:trigger", headers=api.admin)
    assert triggered.status_code == 201
    assert triggered.json()["execution_id"] != regular
    assert triggered.json()["planned_at"] == "2026-03-02T00:00:00.000001Z"


async def test_trigger_on_a_fire_instant_leaves_the_regular_fire_to_be_planned(
    memory_api: Api,
) -> None:
    api = memory_api  # the clock sits exactly on a fire: 00:00
    await api.create_schedule("collides")
    triggered = await api.client.post("/v1/schedules/collides:trigger", headers=api.admin)
    regular = execution_id("collides", api.clock.now())
    assert triggered.json()["execution_id"] != regular
    backfill = await api.client.post(
        "/v1/schedules/collides:backfill",
        json={"from": "2026-03-01T23:55:00Z", "to": "2026-03-02T00:00:00.5Z"},
        headers=api.admin,
    )
    assert backfill.json()["inserted"] == 2
    assert regular in backfill.json()["execution_ids"]


async def test_trigger_works_on_a_paused_schedule(api: Api) -> None:
    await api.create_schedule("paused-manual")
    await api.client.post("/v1/schedules/paused-manual:pause", headers=api.admin)
    response = await api.client.post("/v1/schedules/paused-manual:trigger", headers=api.admin)
    assert response.status_code == 201
    assert response.json()["status"] == "queued"


@pytest.mark.parametrize("reason", ["x" * 1001, "bell\u0007", "nul\u0000"])
async def test_trigger_with_a_bad_reason_gets_422(memory_api: Api, reason: str) -> None:
    await memory_api.create_schedule("reasoned")
    response = await memory_api.client.post(
        "/v1/schedules/reasoned:trigger", json={"reason": reason}, headers=memory_api.admin
    )
    assert_problem(response, 422, "invalid-field")


# --- backfill --------------------------------------------------------------------------------


async def test_backfill_inserts_past_fires_once_and_a_second_backfill_inserts_nothing(
    api: Api,
) -> None:
    await api.create_schedule("history")
    now = await api.now()
    start = format_utc(now.replace(microsecond=0, second=0) - timedelta(hours=1, minutes=1))
    end = format_utc(now)
    body = {"from": start, "to": end, "reason": "outage"}
    first = await api.client.post("/v1/schedules/history:backfill", json=body, headers=api.admin)
    assert first.status_code == 201, first.text
    requested = first.json()["requested"]
    assert 12 <= requested <= 13
    assert first.json()["inserted"] == requested == len(first.json()["execution_ids"])
    second = await api.client.post("/v1/schedules/history:backfill", json=body, headers=api.admin)
    assert second.json() == {
        "requested": requested,
        "inserted": 0,
        "execution_ids": [],
        "skipped_purged": 0,
        "purged_through": None,
    }
    assert len(await statuses(api, "history")) == requested
    events = await api.ledger.audit_list(AuditQuery(action="schedule.backfill"))
    assert [(e.actor, e.target, e.details["inserted"]) for e in events] == [
        (f"token:{api.admin_id}", "history", requested),
        (f"token:{api.admin_id}", "history", 0),
    ]


async def test_backfill_after_a_purge_skips_the_purged_history_and_says_so(api: Api) -> None:
    """A backfill never runs a fire again whose execution retention or a purge deleted: it
    skips every fire up to the schedule's purged history, counting them."""
    await api.create_schedule("purged-past")
    now = await api.now()
    body = {"from": format_utc(now - timedelta(minutes=30)), "to": format_utc(now)}
    first = await api.client.post(
        "/v1/schedules/purged-past:backfill", json=body, headers=api.admin
    )
    fires = first.json()["execution_ids"]
    assert len(fires) == first.json()["requested"] >= 5
    dead = await api.dead_letter("purged-past")  # a manual run, after every fire of the range
    purged = await api.client.post(
        f"/v1/dead-letters/{dead}:purge", json={"reason": "noise"}, headers=api.admin
    )
    assert purged.json() == {"purged": [dead]}
    # Every fire of the range is at or before the purged history now.
    again = await api.client.post(
        "/v1/schedules/purged-past:backfill", json=body, headers=api.admin
    )
    assert again.status_code == 201, again.text
    result = again.json()
    assert (result["inserted"], result["execution_ids"]) == (0, [])
    assert result["skipped_purged"] == result["requested"] == len(fires)
    detail = await api.ledger.executions_get(fires[0])  # the rows themselves were not touched
    assert str(detail.execution.status) == "queued"
    purged_through = datetime.fromisoformat(result["purged_through"])
    assert purged_through == parse_execution_id(dead)[1]
    [_, event] = await api.ledger.audit_list(AuditQuery(action="schedule.backfill"))
    assert event.details["skipped_purged"] == len(fires)


async def test_backfill_over_existing_runs_inserts_only_the_missing_ones(memory_api: Api) -> None:
    api = memory_api
    await api.create_schedule("partial")
    half = {"from": "2026-03-01T23:30:00Z", "to": MIDNIGHT}
    first = await api.client.post("/v1/schedules/partial:backfill", json=half, headers=api.admin)
    assert first.json()["inserted"] == 6
    whole = {"from": HOUR, "to": MIDNIGHT}
    second = await api.client.post("/v1/schedules/partial:backfill", json=whole, headers=api.admin)
    assert second.json()["requested"] == 12
    assert second.json()["inserted"] == 6
    assert set(second.json()["execution_ids"]).isdisjoint(first.json()["execution_ids"])


async def test_backfill_queues_again_the_runs_a_pause_skipped_but_not_one_that_ran(
    api: Api,
) -> None:
    await api.create_schedule("skipped-again")
    now = await api.now()
    body = {"from": format_utc(now - timedelta(minutes=30)), "to": format_utc(now)}
    first = await api.client.post(
        "/v1/schedules/skipped-again:backfill", json=body, headers=api.admin
    )
    ids = first.json()["execution_ids"]
    await api.client.post("/v1/schedules/skipped-again:pause", headers=api.admin)
    await api.client.post("/v1/schedules/skipped-again:resume", headers=api.admin)
    found = await statuses(api, "skipped-again")
    assert {found[i] for i in ids} == {("skipped", SCHEDULE_PAUSED)}
    again = await api.client.post(
        "/v1/schedules/skipped-again:backfill", json=body, headers=api.admin
    )
    # They never ran: queued again, under their own ids.
    assert again.json()["inserted"] == len(ids)
    assert sorted(again.json()["execution_ids"]) == sorted(ids)
    found = await statuses(api, "skipped-again")
    assert {found[i] for i in ids} == {("queued", None)}
    # A backfill over them now (queued, or once they ran) adds nothing.
    third = await api.client.post(
        "/v1/schedules/skipped-again:backfill", json=body, headers=api.admin
    )
    assert third.json()["inserted"] == 0


async def test_backfill_refuses_a_range_reaching_into_the_future(api: Api) -> None:
    await api.create_schedule("no-future")
    now = await api.now()
    body = {
        "from": format_utc(now - timedelta(hours=1)),
        "to": format_utc(now + timedelta(hours=1)),
    }
    response = await api.client.post(
        "/v1/schedules/no-future:backfill", json=body, headers=api.admin
    )
    assert_problem(response, 422, "invalid-field")
    assert await statuses(api, "no-future") == {}


async def test_backfill_with_to_a_moment_ahead_covers_only_the_past(memory_api: Api) -> None:
    """'to' may be up to a second ahead (a client's clock); fires after now are left out."""
    api = memory_api
    api.clock.advance(0.5)  # 00:00:00.5
    await api.create_schedule("every-second", cron_expr="* * * * * *")
    body = {"from": "2026-03-01T23:59:58Z", "to": "2026-03-02T00:00:01.4Z"}
    response = await api.client.post(
        "/v1/schedules/every-second:backfill", json=body, headers=api.admin
    )
    assert response.status_code == 201, response.text
    assert response.json()["requested"] == 3  # 23:59:58, 23:59:59, 00:00:00


@pytest.mark.parametrize(
    "body",
    [
        {"from": MIDNIGHT, "to": HOUR},
        {"from": MIDNIGHT, "to": MIDNIGHT},
        {"from": "2026-03-01T23:00:00", "to": MIDNIGHT},
        {"from": HOUR, "to": "2026-03-02T00:00:00"},
        {"from": "2026-03-01", "to": MIDNIGHT},
        {"from": "0001-01-01T00:00:00Z", "to": MIDNIGHT},
        {"from": "0001-01-01T00:00:00+01:00", "to": MIDNIGHT},
        {"from": HOUR, "to": "9999-12-31T23:59:59-01:00"},
        {"from": HOUR},
        {"to": MIDNIGHT},
        {"from": HOUR, "to": MIDNIGHT, "reason": "x" * 1001},
        {"from": HOUR, "to": MIDNIGHT, "extra": 1},
        {"from": 5, "to": MIDNIGHT},
        {"from": "2025-01-01T00:00:00Z", "to": MIDNIGHT},  # more than 10,000 fires
    ],
)
async def test_backfill_with_a_bad_range_gets_422(memory_api: Api, body: dict[str, Any]) -> None:
    await memory_api.create_schedule("ranged")
    response = await memory_api.client.post(
        "/v1/schedules/ranged:backfill", json=body, headers=memory_api.admin
    )
    assert_problem(response, 422, "invalid-field")
    assert await statuses(memory_api, "ranged") == {}


async def test_backfill_of_exactly_10000_fires_is_accepted(memory_api: Api) -> None:
    api = memory_api
    await api.create_schedule("dense", cron_expr="* * * * *")
    start = api.clock.now() - timedelta(minutes=BATCH_ROWS_MAX)
    body = {"from": format_utc(start), "to": MIDNIGHT}
    response = await api.client.post("/v1/schedules/dense:backfill", json=body, headers=api.admin)
    assert response.status_code == 201, response.text
    assert response.json()["inserted"] == BATCH_ROWS_MAX


# --- preview ---------------------------------------------------------------------------------


async def test_preview_lists_the_next_fires_with_local_times(api: Api) -> None:
    await api.create_schedule("morning", cron_expr="30 2 * * *", timezone="America/New_York")
    response = await api.client.get(
        "/v1/schedules/morning/preview?count=3&after=2026-03-07T12:00:00Z", headers=api.admin
    )
    assert response.status_code == 200
    body = response.json()
    assert body["schedule_id"] == "morning"
    assert body["timezone"] == "America/New_York"
    fires = body["fires"]
    # 02:30 does not exist on 2026-03-08 in New York (spring forward): shifted, and said so.
    assert fires[0]["planned_at"] == "2026-03-08T07:00:00Z"
    assert fires[0]["local_time"] == "2026-03-08T03:00:00-04:00"
    assert fires[0]["adjustment"] != "none"
    assert fires[1]["planned_at"] == "2026-03-09T06:30:00Z"
    assert fires[1]["local_time"] == "2026-03-09T02:30:00-04:00"
    assert fires[1]["adjustment"] == "none"


async def test_preview_defaults_to_ten_fires_from_now(memory_api: Api) -> None:
    await memory_api.create_schedule("default-preview")
    response = await memory_api.client.get(
        "/v1/schedules/default-preview/preview", headers=memory_api.admin
    )
    fires = response.json()["fires"]
    assert len(fires) == 10
    assert fires[0]["planned_at"] == "2026-03-02T00:05:00Z"


@pytest.mark.parametrize("count", [1, 10_000])
async def test_preview_count_bounds_are_inclusive(memory_api: Api, count: int) -> None:
    await memory_api.create_schedule("counted", cron_expr="* * * * *")
    response = await memory_api.client.get(
        f"/v1/schedules/counted/preview?count={count}", headers=memory_api.admin
    )
    assert response.status_code == 200
    assert len(response.json()["fires"]) == count


@pytest.mark.parametrize(
    ("cron_expr", "after", "expected"),
    [
        ("0 0 1 1 *", "2026-03-02T00:00:00Z", 6973),  # 2027 .. 8999, then no more
        ("0 0 1 1 *", "8999-12-31T23:59:59Z", 0),
        ("0 0 29 2 *", "8980-01-01T00:00:00Z", 5),  # 8980, 8984, 8988, 8992, 8996
    ],
)
async def test_preview_stops_before_year_9000_instead_of_failing(
    memory_api: Api, cron_expr: str, after: str, expected: int
) -> None:
    """Instants end at year 9000 in the API: a preview lists the fires before it, fewer
    than asked for when there are fewer."""
    await memory_api.create_schedule("far", cron_expr=cron_expr)
    response = await memory_api.client.get(
        "/v1/schedules/far/preview",
        params={"count": "10000", "after": after},
        headers=memory_api.admin,
    )
    assert response.status_code == 200, response.text
    fires = response.json()["fires"]
    assert len(fires) == expected
    assert all(fire["planned_at"] < "9000" for fire in fires)


@pytest.mark.parametrize(
    "query",
    [
        "count=0",
        "count=10001",
        "count=-1",
        "count=many",
        "count=1.5",
        "after=yesterday",
        "after=2026-03-02T00:00:00",
        "after=9999-12-31T23:59:00Z",
        "after=0001-01-01T00:00:00%2B01:00",
    ],
)
async def test_preview_with_a_bad_query_gets_422(memory_api: Api, query: str) -> None:
    await memory_api.create_schedule("previewed")
    response = await memory_api.client.get(
        f"/v1/schedules/previewed/preview?{query}", headers=memory_api.admin
    )
    assert_problem(response, 422, "invalid-field")


@pytest.mark.parametrize(
    ("reason", "says"),
    [("   ", "must not be blank"), ("x" * 1001, "at most 1000"), ("bell\u0007", "printable")],
)
@pytest.mark.parametrize("action", ["pause", "resume", "trigger"])
async def test_a_bad_reason_is_refused_alike_on_every_action_saying_how_to_fix_it(
    memory_api: Api, action: str, reason: str, says: str
) -> None:
    await memory_api.create_schedule("reasoned")
    response = await memory_api.client.post(
        f"/v1/schedules/reasoned:{action}", json={"reason": reason}, headers=memory_api.admin
    )
    problem = assert_problem(response, 422, "invalid-field")
    assert says in problem["detail"]
