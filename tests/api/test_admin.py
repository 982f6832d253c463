"""Admin routes: task types, tenants, the cluster view and the load forecast."""

from __future__ import annotations

import base64
from datetime import datetime, timedelta
from typing import Any

import pytest

from engine.core import load_forecast
from engine.core.redaction import fingerprint
from engine.ledger.params import AuditQuery, LeasesAcquire, NodesHeartbeat
from engine.model import SETTINGS_BYTES_MAX, AuditAction
from tests.api.support import PARTITIONS, TASK_TYPE, Api, assert_problem

# --- task types ------------------------------------------------------------------------------


async def test_task_type_put_creates_then_replaces_and_reads_back(api: Api) -> None:
    first = await api.client.put(
        "/v1/task-types/mailer",
        json={"kind": "webhook", "settings": {"url": "https://example.com/hook"}, "timeout_s": 5},
        headers=api.admin,
    )
    assert first.status_code == 200, first.text
    assert (first.json()["name"], first.json()["version"]) == ("mailer", 1)
    second = await api.client.put("/v1/task-types/mailer", json={"kind": "noop"}, headers=api.admin)
    assert (second.json()["kind"], second.json()["version"]) == ("noop", 2)
    read = await api.client.get("/v1/task-types/mailer", headers=api.admin)
    assert {**read.json(), "warnings": []} == second.json()  # a write's answer adds warnings
    listing = await api.client.get("/v1/task-types", headers=api.admin)
    assert [t["name"] for t in listing.json()] == ["mailer", TASK_TYPE]


async def test_task_type_delete_answers_204_then_404(api: Api) -> None:
    await api.client.put("/v1/task-types/short-lived", json={"kind": "noop"}, headers=api.admin)
    response = await api.client.delete("/v1/task-types/short-lived", headers=api.admin)
    assert (response.status_code, response.content) == (204, b"")
    assert_problem(await api.client.get("/v1/task-types/short-lived", headers=api.admin), 404)
    assert_problem(await api.client.delete("/v1/task-types/short-lived", headers=api.admin), 404)


async def test_deleting_a_task_type_in_use_is_refused_and_keeps_it(api: Api) -> None:
    await api.create_schedule("user-of-noop")
    response = await api.client.delete(f"/v1/task-types/{TASK_TYPE}", headers=api.admin)
    problem = assert_problem(response, 409, "in-use")
    assert "user-of-noop" in problem["detail"]
    assert (await api.client.get(f"/v1/task-types/{TASK_TYPE}", headers=api.admin)).is_success


@pytest.mark.parametrize(
    ("name", "body"),
    [
        ("t", {"kind": "carrier-pigeon"}),
        ("t", {}),
        ("t", {"kind": "noop", "timeout_s": 0}),
        ("t", {"kind": "noop", "timeout_s": 86401}),
        ("t", {"kind": "noop", "max_attempts": 0}),
        ("t", {"kind": "noop", "max_concurrency": 0}),
        ("t", {"kind": "noop", "max_concurrency": 10**30}),
        ("t", {"kind": "noop", "backoff_base_s": -1}),
        ("t", {"kind": "noop", "settings": {"blob": "x" * SETTINGS_BYTES_MAX}}),
        ("t", {"kind": "noop", "settings": {"nul": "\u0000"}}),
        ("t", {"kind": "noop", "settings": []}),
        ("t", {"kind": "noop", "colour": "blue"}),
        # Task types that could never run: the same check `carillon task-type set` makes.
        ("t", {"kind": "webhook"}),
        ("t", {"kind": "webhook", "settings": {"url": "not a url"}}),
        ("t", {"kind": "webhook", "settings": {"url": "ftp://example.com/x"}}),
        ("t", {"kind": "webhook", "settings": {"url": "https://e.com", "secret": "short"}}),
        ("t", {"kind": "python"}),
        ("t", {"kind": "python", "settings": {"callable": "no colon"}}),
        ("t", {"kind": "shell"}),
        ("t", {"kind": "shell", "settings": {"argv": "rm -rf /"}}),
        ("t", {"kind": "noop", "settings": {"delay_s": "soon"}}),
        ("t", {"kind": "redis", "settings": {"url": "redis://10.0.0.5/0"}}),
        ("t", {"kind": "redis", "settings": {"url": "redis://10.0.0.5/x", "stream": "s"}}),
        # A dedup expiry shorter than the worst retry horizon of the task type's policy.
        (
            "t",
            {"kind": "redis", "settings": {"url": "redis://h/0", "stream": "s", "dedup_ttl_s": 60}},
        ),
        # Grants that do not hold together.
        ("t", {"kind": "shell", "settings": {"argv": ["true"]}, "allowed_tenants": ["*"]}),
        ("t", {"kind": "noop", "tenant_id": "acme", "allowed_tenants": ["globex"]}),
        ("t", {"kind": "noop", "allowed_tenants": ["no way"]}),
        ("t", {"kind": "noop", "tenant_id": ""}),
        ("bad%20name", {"kind": "noop"}),
        ("a:b", {"kind": "noop"}),
        ("x" * 129, {"kind": "noop"}),
    ],
)
async def test_task_type_put_with_an_invalid_field_gets_422(
    api: Api, name: str, body: dict[str, Any]
) -> None:
    response = await api.client.put(f"/v1/task-types/{name}", json=body, headers=api.admin)
    assert_problem(response, 422, "invalid-field")


async def test_a_task_type_with_unfinished_runs_cannot_be_deleted(api: Api) -> None:
    await api.client.put(
        "/v1/task-types/report", json={"kind": "noop", "allowed_tenants": ["*"]}, headers=api.admin
    )
    await api.create_schedule("monthly", task_type="report")
    await api.queued("monthly")
    dead = await api.dead_letter("monthly")
    await api.client.patch(
        "/v1/schedules/monthly", json={"task_type": TASK_TYPE}, headers=api.admin
    )
    response = await api.client.delete("/v1/task-types/report", headers=api.admin)
    problem = assert_problem(response, 409, "in-use")
    assert "2 unfinished runs (1 queued, 1 dead letter)" in problem["detail"]
    assert (await api.client.get("/v1/task-types/report", headers=api.admin)).is_success
    assert (await api.ledger.executions_get(dead)).execution.task_type == "report"


async def test_unknown_task_type_gets_404(api: Api) -> None:
    for name in ("missing", "%00", "bad%20name"):
        response = await api.client.get(f"/v1/task-types/{name}", headers=api.admin)
        assert_problem(response, 404, "not-found")


# --- tenants ---------------------------------------------------------------------------------


async def test_tenant_put_sets_settings_and_reports_its_schedule_count(api: Api) -> None:
    await api.create_schedule("counted-1")
    await api.create_schedule("counted-2", enabled=False)
    response = await api.client.put(
        "/v1/tenants/acme",
        json={
            "weight": 3,
            "concurrency_quota": 10,
            "rate_per_s": 2.5,
            "burst": 5,
            "schedules_max": 100,
        },
        headers=api.admin,
    )
    assert response.status_code == 200, response.text
    view = response.json()
    assert view["tenant_id"] == "acme"
    assert (view["weight"], view["schedules_max"], view["schedules"]) == (3, 100, 2)
    assert view["version"] == 1
    read = await api.client.get("/v1/tenants/acme", headers=api.admin)
    assert read.json() == view
    assert [
        t["tenant_id"] for t in (await api.client.get("/v1/tenants", headers=api.admin)).json()
    ] == ["acme"]


async def test_tenant_without_settings_reads_as_the_defaults(api: Api) -> None:
    response = await api.client.get("/v1/tenants/newcomer", headers=api.admin)
    assert response.status_code == 200
    assert response.json() == {
        "tenant_id": "newcomer",
        "weight": 1,
        "concurrency_quota": None,
        "rate_per_s": None,
        "burst": None,
        "schedules_max": None,
        "schedules": 0,
        "version": 0,
        "updated_at": None,
    }


async def test_tenant_token_reads_its_own_tenant(api: Api) -> None:
    await api.create_schedule("own", tenant_id="acme")
    response = await api.client.get("/v1/tenants/acme", headers=api.tenant("acme"))
    assert response.status_code == 200
    assert response.json()["schedules"] == 1


@pytest.mark.parametrize(
    "body",
    [
        {"weight": 0},
        {"weight": 1001},
        {"weight": "heavy"},
        {"concurrency_quota": 0},
        {"rate_per_s": 0},
        {"rate_per_s": -1.5},
        {"burst": 0},
        {"schedules_max": -1},
        {"schedules_max": 10**30},
        {"region": "eu"},
    ],
)
async def test_tenant_put_with_an_invalid_field_gets_422(api: Api, body: dict[str, Any]) -> None:
    response = await api.client.put("/v1/tenants/acme", json=body, headers=api.admin)
    assert_problem(response, 422, "invalid-field")


async def test_malformed_tenant_id_gets_422(memory_api: Api) -> None:
    for method, body in (("GET", None), ("PUT", {})):
        response = await memory_api.client.request(
            method, "/v1/tenants/bad%20id", json=body, headers=memory_api.admin
        )
        assert_problem(response, 422, "invalid-field")


# --- cluster ---------------------------------------------------------------------------------


async def test_cluster_view_lists_every_partition_and_the_live_nodes(api: Api) -> None:
    await api.ledger.nodes_heartbeat(
        NodesHeartbeat("node-a", "default", 60.0, 0.002, planner_lag_s={3: 1.5})
    )
    [lease] = await api.ledger.leases_acquire(
        LeasesAcquire(owner_id="node-a", partition_ids=[3], ttl_s=60.0)
    )
    response = await api.client.get("/v1/cluster", headers=api.admin)
    assert response.status_code == 200
    view = response.json()
    assert set(view) == {
        "database_now",
        "partition_count",
        "active_region",
        "region_epoch",
        "nodes",
        "partitions",
    }
    assert view["partition_count"] == PARTITIONS
    assert view["active_region"] == "default"
    assert [p["partition_id"] for p in view["partitions"]] == list(range(PARTITIONS))
    owned = view["partitions"][3]
    assert owned["owner_id"] == "node-a"
    assert owned["fencing_token"] == lease.fencing_token
    assert owned["checkpoint_age_s"] is None  # nothing planned yet
    assert owned["planner_lag_s"] == 1.5  # as the owner reported it
    assert view["partitions"][4]["planner_lag_s"] is None  # no owner
    assert all(p["owner_id"] is None for i, p in enumerate(view["partitions"]) if i != 3)
    [node] = view["nodes"]
    assert (node["node_id"], node["partitions"], node["clock_offset_s"]) == ("node-a", 1, 0.002)


async def test_cluster_view_drops_an_expired_owner(memory_api: Api) -> None:
    api = memory_api
    await api.ledger.leases_acquire(LeasesAcquire(owner_id="gone", partition_ids=[0], ttl_s=5.0))
    api.clock.advance(10)
    view = (await api.client.get("/v1/cluster", headers=api.admin)).json()
    assert view["partitions"][0]["owner_id"] is None
    assert view["nodes"] == []


# --- region ----------------------------------------------------------------------------------


async def test_a_region_failover_through_the_api_revokes_leases_and_is_safe_to_repeat(
    api: Api,
) -> None:
    await api.ledger.nodes_heartbeat(NodesHeartbeat("node-a", "default", 60.0))
    await api.ledger.nodes_heartbeat(NodesHeartbeat("node-b", "east", 60.0))
    await api.ledger.leases_acquire(LeasesAcquire("node-a", [0, 1], 60.0))
    body = {"to_region": "east", "reason": "planned switch-over"}
    response = await api.client.post("/v1/region:failover", json=body, headers=api.admin)
    assert response.status_code == 200
    assert response.json() == {
        "active_region": "east",
        "region_epoch": 2,
        "changed": True,
        "revoked": 2,
    }
    again = await api.client.post("/v1/region:failover", json=body, headers=api.admin)
    assert again.json() == {**response.json(), "changed": False, "revoked": 0}
    view = (await api.client.get("/v1/cluster", headers=api.admin)).json()
    assert (view["active_region"], view["region_epoch"]) == ("east", 2)
    assert {n["node_id"]: n["state"] for n in view["nodes"]} == {
        "node-a": "standby",
        "node-b": "active",
    }
    assert all(p["owner_id"] is None for p in view["partitions"])
    [event] = await api.ledger.audit_list(AuditQuery(action=AuditAction.REGION_FAILOVER))
    assert event.actor.startswith("token:")
    assert event.details["reason"] == "planned switch-over"


@pytest.mark.parametrize(
    "body",
    [{"to_region": "east west"}, {"to_region": ""}, {}, {"to_region": "east", "extra": 1}],
)
async def test_a_malformed_failover_request_is_refused_and_changes_nothing(
    api: Api, body: dict[str, Any]
) -> None:
    response = await api.client.post("/v1/region:failover", json=body, headers=api.admin)
    assert response.status_code in (400, 422)
    assert response.headers["content-type"].startswith("application/problem+json")
    settings = await api.ledger.cluster_get()
    assert (settings.active_region, settings.region_epoch) == ("default", 1)


async def test_a_tenant_token_may_not_fail_over(api: Api) -> None:
    response = await api.client.post(
        "/v1/region:failover", json={"to_region": "east"}, headers=api.tenant("acme")
    )
    assert response.status_code == 403
    assert (await api.ledger.cluster_get()).active_region == "default"


# --- forecast --------------------------------------------------------------------------------

WINDOW = "from=2026-03-02T00:00:00Z&to=2026-03-02T03:00:00Z"


async def create_many(api: Api, count: int, prefix: str, **fields: Any) -> None:
    body = {
        "schedules": [
            {
                "schedule_id": f"{prefix}-{n:04d}",
                "tenant_id": "acme",
                "cron_expr": "0 * * * *",
                "task_type": TASK_TYPE,
                **fields,
            }
            for n in range(count)
        ]
    }
    response = await api.client.post("/v1/schedules:batch", json=body, headers=api.admin)
    assert response.status_code == 201, response.text


async def forecast(api: Api, query: str, headers: dict[str, str] | None = None) -> dict[str, Any]:
    response = await api.client.get(f"/v1/forecast?{query}", headers=headers or api.admin)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def test_forecast_stacks_1000_hourly_schedules_on_the_top_of_each_hour(api: Api) -> None:
    await create_many(api, 1000, "hourly")
    body = await forecast(api, f"{WINDOW}&bucket=1m")
    assert body["bucket_s"] == 60
    assert len(body["total"]) == len(body["bucket_starts"]) == 180
    assert body["bucket_starts"][:2] == ["2026-03-02T00:00:00Z", "2026-03-02T00:01:00Z"]
    for minute, count in enumerate(body["total"]):
        assert count == (1000 if minute % 60 == 0 else 0), minute
    assert body["approximated_schedules"] == 0
    assert body["series"] == []


async def test_forecast_spreads_hashed_schedules_over_several_buckets(api: Api) -> None:
    await create_many(api, 300, "hashed", cron_expr="H * * * *")
    body = await forecast(api, "from=2026-03-02T00:00:00Z&to=2026-03-02T01:00:00Z&bucket=1m")
    assert sum(body["total"]) == 300
    assert sum(1 for count in body["total"] if count) >= 10
    assert max(body["total"]) < 300
    assert body["approximated_schedules"] == 300


async def test_forecast_splits_series_by_tenant_and_task_type(api: Api) -> None:
    await create_many(api, 3, "acme-hourly")
    await api.create_schedule("globex-hourly", tenant_id="globex", cron_expr="0 * * * *")
    await api.create_schedule("paused", tenant_id="globex", cron_expr="0 * * * *", enabled=False)
    body = await forecast(api, f"{WINDOW}&bucket=1h&by=tenant,task_type")
    assert body["total"] == [4, 4, 4]
    assert [(s["tenant_id"], s["task_type"], s["counts"], s["total"]) for s in body["series"]] == [
        ("acme", TASK_TYPE, [3, 3, 3], 9),
        ("globex", TASK_TYPE, [1, 1, 1], 3),
    ]
    by_type = await forecast(api, f"{WINDOW}&bucket=1h&by=task_type")
    assert [(s["tenant_id"], s["task_type"]) for s in by_type["series"]] == [(None, TASK_TYPE)]


async def test_tenant_token_forecasts_only_its_own_schedules(api: Api) -> None:
    await create_many(api, 5, "mine")
    await api.create_schedule("theirs", tenant_id="globex", cron_expr="0 * * * *")
    body = await forecast(api, f"{WINDOW}&bucket=1h&by=tenant", api.tenant("globex"))
    assert body["total"] == [1, 1, 1]
    assert [s["tenant_id"] for s in body["series"]] == ["globex"]


async def test_forecast_defaults_to_the_next_24_hours_by_the_minute(memory_api: Api) -> None:
    body = await forecast(memory_api, "")
    assert (body["from"], body["to"]) == ("2026-03-02T00:00:00Z", "2026-03-03T00:00:00Z")
    assert len(body["total"]) == 1440


@pytest.mark.parametrize(
    "query",
    [
        "bucket=0m",
        "bucket=10001m",
        "bucket=1x",
        "bucket=m",
        "bucket=",
        "bucket=%C2%B2m",
        "bucket=-1m",
        "bucket=1.5h",
        "from=2026-03-02T00:00:00Z&to=2026-03-10T00:00:00Z&bucket=1h",
        "from=2026-03-02T00:00:00Z&to=2026-03-01T00:00:00Z",
        "from=2026-03-02T00:00:00Z&to=2026-03-02T00:00:00Z",
        "from=2026-03-02T00:00:00Z&to=2026-03-09T00:00:00Z&bucket=1s",
        "from=2026-03-02T00:00:00",
        "from=tomorrow",
        "from=9999-12-31T00:00:00Z",
        "from=0001-01-01T00:00:00Z&to=0001-01-01T01:00:00Z",
        "by=colour",
        "by=tenant,colour",
    ],
)
async def test_forecast_with_a_bad_query_gets_422(memory_api: Api, query: str) -> None:
    response = await memory_api.client.get(f"/v1/forecast?{query}", headers=memory_api.admin)
    assert_problem(response, 422, "invalid-field")


async def test_forecast_that_would_walk_too_many_fires_is_refused(
    memory_api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every timetable step costs CPU in the node's interpreter, for any token that asks: past
    FIRE_STEPS_MAX (lowered here, so the test is quick) the forecast is refused."""
    monkeypatch.setattr(load_forecast, "FIRE_STEPS_MAX", 10_000)
    await create_many(memory_api, 1, "secondly", cron_expr="* * * * * *")
    response = await memory_api.client.get(
        "/v1/forecast?from=2026-03-02T00:00:00Z&to=2026-03-02T03:00:00Z&bucket=1h",
        headers=memory_api.admin,
    )
    problem = assert_problem(response, 422, "invalid-field")
    assert "narrow the range" in problem["detail"]
    hour = await forecast(memory_api, "from=2026-03-02T00:00:00Z&to=2026-03-02T01:00:00Z&bucket=1h")
    assert hour["total"] == [3600]


def test_a_week_of_an_every_second_schedule_is_over_the_step_bound() -> None:
    assert load_forecast.FIRE_STEPS_MAX < 7 * 86400


async def test_forecast_counts_day_names_exactly_not_as_hashed(api: Api) -> None:
    await create_many(api, 4, "thursday", cron_expr="0 9 * * THU")
    body = await forecast(api, "from=2026-03-05T00:00:00Z&to=2026-03-06T00:00:00Z&bucket=1h")
    assert body["approximated_schedules"] == 0
    assert body["total"][9] == 4
    assert sum(body["total"]) == 4


# --- secrets are write-only -------------------------------------------------------------------

HOOK_SECRET = "whsec_" + base64.b64encode(b"s3cr3t-key-material-of-32-bytes!").decode()
NEW_SECRET = "whsec_" + base64.b64encode(b"another-key-material-of-32-byte!").decode()


async def test_secrets_are_never_returned_only_their_fingerprints(
    api: Api, caplog: pytest.LogCaptureFixture
) -> None:
    hook = {
        "kind": "webhook",
        "settings": {
            "url": "https://example.com/h",
            "secret": HOOK_SECRET,
            "headers": {"Authorization": "Bearer sk_live_1", "X-Team": "billing"},
        },
    }
    shell = {"kind": "shell", "settings": {"argv": ["/bin/true"], "env": {"PGPASSWORD": "hunter2"}}}
    answers = [
        await api.client.put("/v1/task-types/hook", json=hook, headers=api.admin),
        await api.client.put("/v1/task-types/sh", json=shell, headers=api.admin),
        await api.client.get("/v1/task-types/hook", headers=api.admin),
        await api.client.get("/v1/task-types", headers=api.admin),
    ]
    for answer in answers:
        assert answer.status_code == 200, answer.text
        for secret in (HOOK_SECRET, "sk_live_1", "hunter2"):
            assert secret not in answer.text
    shown = answers[2].json()["settings"]
    assert shown["secret"] == fingerprint(HOOK_SECRET)
    assert shown["headers"] == {
        "Authorization": fingerprint("Bearer sk_live_1"),
        "X-Team": "billing",
    }
    for secret in (HOOK_SECRET, "sk_live_1", "hunter2"):
        assert secret not in caplog.text
    stored = await api.ledger.task_types_get("hook")
    assert stored.settings["secret"] == HOOK_SECRET  # what signs is the secret itself


async def test_a_broker_urls_credentials_are_never_returned_only_their_fingerprint(
    api: Api, caplog: pytest.LogCaptureFixture
) -> None:
    url = "redis://app:pw-Hunter2-x@10.0.0.5:6379/0"
    body = {"kind": "redis", "settings": {"url": url, "stream": "ticks"}}
    created = await api.client.put("/v1/task-types/ticks", json=body, headers=api.admin)
    read = await api.client.get("/v1/task-types/ticks", headers=api.admin)
    listed = await api.client.get("/v1/task-types", headers=api.admin)
    for answer in (created, read, listed):
        assert answer.status_code == 200, answer.text
        assert "pw-Hunter2-x" not in answer.text
    shown = read.json()["settings"]["url"]
    assert shown == f"redis://{fingerprint('app:pw-Hunter2-x')}@10.0.0.5:6379/0"
    # Read, edited and written back, the URL keeps its credentials.
    edited = {"kind": "redis", "settings": {**read.json()["settings"], "maxlen": 1000}}
    written = await api.client.put("/v1/task-types/ticks", json=edited, headers=api.admin)
    assert written.status_code == 200, written.text
    stored = await api.ledger.task_types_get("ticks")
    assert stored.settings == {"url": url, "stream": "ticks", "maxlen": 1000}
    # A refusal of the settings does not echo them either.
    bad = {"kind": "redis", "settings": {"url": url + "?x=1", "stream": "ticks"}}
    refused = await api.client.put("/v1/task-types/ticks", json=bad, headers=api.admin)
    assert "pw-Hunter2-x" not in assert_problem(refused, 422, "invalid-field")["detail"]
    assert "pw-Hunter2-x" not in caplog.text


async def test_a_rabbitmq_task_types_url_and_credential_headers_are_write_only(
    api: Api, caplog: pytest.LogCaptureFixture
) -> None:
    url = "amqp://app:pw-Hunter2-x@10.0.0.5:5672/billing"
    settings = {
        "url": url,
        "exchange": "ticks",
        "routing_key": "report",
        "headers": {"Authorization": "Bearer tok-Zz9", "team": "billing"},
    }
    body = {"kind": "rabbitmq", "settings": settings}
    created = await api.client.put("/v1/task-types/ticks", json=body, headers=api.admin)
    read = await api.client.get("/v1/task-types/ticks", headers=api.admin)
    for answer in (created, read):
        assert answer.status_code == 200, answer.text
        assert "pw-Hunter2-x" not in answer.text
        assert "tok-Zz9" not in answer.text
    shown = read.json()["settings"]
    assert shown["url"] == f"amqp://{fingerprint('app:pw-Hunter2-x')}@10.0.0.5:5672/billing"
    assert shown["headers"] == {"Authorization": fingerprint("Bearer tok-Zz9"), "team": "billing"}
    # Read, edited and written back, the URL and the header keep their secrets.
    edited = {"kind": "rabbitmq", "settings": {**shown, "mandatory": False}}
    written = await api.client.put("/v1/task-types/ticks", json=edited, headers=api.admin)
    assert written.status_code == 200, written.text
    stored = await api.ledger.task_types_get("ticks")
    assert stored.settings == {**settings, "mandatory": False}
    bad = {"kind": "rabbitmq", "settings": {**settings, "exchange": "no spaces"}}
    refused = await api.client.put("/v1/task-types/ticks", json=bad, headers=api.admin)
    assert "pw-Hunter2-x" not in assert_problem(refused, 422, "invalid-field")["detail"]
    assert "pw-Hunter2-x" not in caplog.text


async def test_a_task_type_read_edited_and_written_back_keeps_its_secret(api: Api) -> None:
    hook = {"kind": "webhook", "settings": {"url": "https://example.com/h", "secret": HOOK_SECRET}}
    await api.client.put("/v1/task-types/hook", json=hook, headers=api.admin)
    read = (await api.client.get("/v1/task-types/hook", headers=api.admin)).json()
    edited = {
        key: read[key]
        for key in ("kind", "settings", "timeout_s", "max_attempts", "allowed_tenants")
    }
    edited["timeout_s"] = 7
    written = await api.client.put("/v1/task-types/hook", json=edited, headers=api.admin)
    assert written.status_code == 200, written.text
    stored = await api.ledger.task_types_get("hook")
    assert (stored.timeout_s, stored.settings["secret"], stored.version) == (7, HOOK_SECRET, 2)
    # A fingerprint of something never stored here is refused, and changes nothing.
    forged = {**edited, "settings": {**edited["settings"], "secret": fingerprint(NEW_SECRET)}}
    refused = await api.client.put("/v1/task-types/hook", json=forged, headers=api.admin)
    assert "of no secret stored here" in assert_problem(refused, 422, "invalid-field")["detail"]
    assert (await api.ledger.task_types_get("hook")).version == 2


async def test_a_secret_rotation_signs_with_both_until_the_overlap_ends(api: Api) -> None:
    hook = {"kind": "webhook", "settings": {"url": "https://example.com/h", "secret": HOOK_SECRET}}
    await api.client.put("/v1/task-types/hook", json=hook, headers=api.admin)
    now = await api.ledger.database_now()
    rotated = await api.client.post(
        "/v1/task-types/hook:rotate-secret",
        json={"secret": NEW_SECRET, "overlap_s": 3600},
        headers=api.admin,
    )
    assert rotated.status_code == 200, rotated.text
    assert NEW_SECRET not in rotated.text
    assert HOOK_SECRET not in rotated.text
    shown = rotated.json()["settings"]
    assert (shown["secret"], shown["previous_secret"]) == (
        fingerprint(NEW_SECRET),
        fingerprint(HOOK_SECRET),
    )
    stored = await api.ledger.task_types_get("hook")
    assert (stored.settings["secret"], stored.settings["previous_secret"]) == (
        NEW_SECRET,
        HOOK_SECRET,
    )
    until = datetime.fromisoformat(stored.settings["previous_secret_until"])
    # An hour from the ledger's clock when it rotated (Postgres's clock moves on meanwhile).
    assert now + timedelta(hours=1) <= until < now + timedelta(hours=1, seconds=30)
    # At once: the old secret stops signing now.
    again = await api.client.post(
        "/v1/task-types/hook:rotate-secret", json={"secret": HOOK_SECRET, "overlap_s": 0},
        headers=api.admin,
    )  # fmt: skip
    assert "previous_secret" not in again.json()["settings"]


@pytest.mark.parametrize(
    ("name", "body", "status"),
    [
        ("hook", {"secret": "short"}, 422),
        ("hook", {"secret": NEW_SECRET, "overlap_s": -1}, 422),
        ("hook", {"secret": NEW_SECRET, "overlap_s": 31 * 86400}, 422),
        ("hook", {}, 422),
        (TASK_TYPE, {"secret": NEW_SECRET}, 422),
        ("missing", {"secret": NEW_SECRET}, 404),
    ],
)
async def test_a_malformed_rotation_changes_nothing(
    api: Api, name: str, body: dict[str, Any], status: int
) -> None:
    hook = {"kind": "webhook", "settings": {"url": "https://example.com/h", "secret": HOOK_SECRET}}
    await api.client.put("/v1/task-types/hook", json=hook, headers=api.admin)
    answer = await api.client.post(
        f"/v1/task-types/{name}:rotate-secret", json=body, headers=api.admin
    )
    assert_problem(answer, status)
    assert "short" not in answer.text
    assert (await api.ledger.task_types_get("hook")).version == 1
