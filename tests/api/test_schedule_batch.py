"""``POST /v1/schedules:batch``: up to 10,000 schedules in one write, all or none, and the
tenant quota it shares with single creates."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from engine.api.endpoint import BATCH_BODY_BYTES_MAX
from engine.ledger.params import BATCH_ROWS_MAX, TenantsPut
from engine.model import PAYLOAD_BYTES_MAX, Tenant
from tests.api.support import TASK_TYPE, Api, assert_problem

SCHEDULE_BYTES_TYPICAL = 800
"""The size of a schedule, as JSON, that a full batch may average (docs/api.md, Limits)."""


def spec(**fields: Any) -> dict[str, Any]:
    return {"cron_expr": "*/5 * * * *", "task_type": TASK_TYPE, **fields}


def batch(count: int, **fields: Any) -> dict[str, Any]:
    return {
        "schedules": [
            spec(schedule_id=f"b-{n:05d}", tenant_id="acme", **fields) for n in range(count)
        ]
    }


async def count_schedules(api: Api) -> int:
    return await api.ledger.schedules_count("acme")


async def test_batch_of_10000_creates_them_all(api: Api) -> None:
    response = await api.client.post(
        "/v1/schedules:batch", json=batch(BATCH_ROWS_MAX), headers=api.admin
    )
    assert response.status_code == 201, response.text[:500]
    body = response.json()
    assert body["created"] == BATCH_ROWS_MAX
    assert body["schedule_ids"][:2] == ["b-00000", "b-00001"]
    assert await count_schedules(api) == BATCH_ROWS_MAX


def realistic(n: int) -> dict[str, Any]:
    """A schedule as a client would write it: every field set, a small webhook payload, and
    padded to :data:`SCHEDULE_BYTES_TYPICAL` bytes as ``json.dumps`` writes it."""
    item = spec(
        schedule_id=f"acme-invoice-reminder-eu-west-{n:06d}",
        tenant_id="acme",
        cron_expr="30 2 * * MON-FRI",
        timezone="Europe/London",
        payload={
            "customer_id": f"cus_{n:012d}",
            "region": "eu-west-1",
            "template": "invoice-reminder",
            "notify": ["billing@example.com"],
            "note": "",
        },
        enabled=True,
        catch_up="latest",
        catch_up_window_s=3600,
        dst_gap="auto",
        dst_overlap="auto",
        overlap="skip",
    )
    item["payload"]["note"] = "x" * (SCHEDULE_BYTES_TYPICAL - len(json.dumps(item)))
    assert len(json.dumps(item)) == SCHEDULE_BYTES_TYPICAL
    return item


async def test_batch_of_10000_realistic_schedules_fits_under_the_body_limit(
    memory_api: Api,
) -> None:
    body = {"schedules": [realistic(n) for n in range(BATCH_ROWS_MAX)]}
    content = json.dumps(body).encode()
    assert len(content) > 2**20  # the old 1 MiB limit refused it
    assert len(content) <= BATCH_BODY_BYTES_MAX
    response = await memory_api.client.post(
        "/v1/schedules:batch",
        content=content,
        headers={**memory_api.admin, "Content-Type": "application/json"},
    )
    assert response.status_code == 201, response.text[:500]
    assert response.json()["created"] == BATCH_ROWS_MAX
    assert await count_schedules(memory_api) == BATCH_ROWS_MAX


async def test_batch_over_the_body_limit_gets_413_naming_both_bounds(memory_api: Api) -> None:
    padding = "x" * (BATCH_BODY_BYTES_MAX // 100)
    body = {"schedules": [spec(payload={"pad": padding}) for _ in range(101)]}
    response = await memory_api.client.post(
        "/v1/schedules:batch", json=body, headers=memory_api.admin
    )
    problem = assert_problem(response, 413, "payload-too-large")
    assert f"{BATCH_BODY_BYTES_MAX} bytes" in problem["detail"]
    assert f"{BATCH_ROWS_MAX} schedules" in problem["detail"]
    assert "smaller batches" in problem["detail"]
    assert await count_schedules(memory_api) == 0


@pytest.mark.parametrize("character", ["\u00e9", "\u20ac", "\U0001f514"], ids=["2", "3", "4"])
async def test_one_schedule_with_a_full_payload_fits_however_its_json_is_escaped(
    memory_api: Api, character: str
) -> None:
    """The payload limit counts compact UTF-8 JSON; a client that escapes every non-ASCII
    character (Python's ``json.dumps``) sends up to three times as many bytes."""
    char = character.encode().decode("unicode_escape")
    wrapper = len(msgspec.json.encode({"text": ""}))
    text = char * ((PAYLOAD_BYTES_MAX - wrapper) // len(char.encode()))
    payload = {"text": text + "x" * (PAYLOAD_BYTES_MAX - wrapper - len(text.encode()))}
    assert len(msgspec.json.encode(payload)) == PAYLOAD_BYTES_MAX
    content = json.dumps(spec(schedule_id="full", payload=payload)).encode()
    assert len(content) > 128 * 1024  # the old body limit refused it
    response = await memory_api.client.post(
        "/v1/schedules",
        content=content,
        headers={**memory_api.admin, "Content-Type": "application/json"},
    )
    assert response.status_code == 201, response.text[:300]
    assert response.json()["payload"] == payload


async def test_batch_with_one_bad_item_creates_nothing_and_names_it(api: Api) -> None:
    body = batch(BATCH_ROWS_MAX)
    body["schedules"][7777]["cron_expr"] = "0 0 30 2 *"
    body["schedules"][9999]["timezone"] = "Nowhere/Town"
    response = await api.client.post("/v1/schedules:batch", json=body, headers=api.admin)
    problem = assert_problem(response, 422, "invalid-field")
    assert problem["detail"].startswith("2 of 10000 schedules are invalid")
    assert [e.split(":")[0] for e in problem["errors"]] == ["schedules[7777]", "schedules[9999]"]
    assert await count_schedules(api) == 0


async def test_batch_with_an_unknown_task_type_creates_nothing(api: Api) -> None:
    body = batch(50)
    body["schedules"][49]["task_type"] = "missing"
    response = await api.client.post("/v1/schedules:batch", json=body, headers=api.admin)
    assert_problem(response, 422, "invalid-field")
    assert await count_schedules(api) == 0


async def test_batch_naming_an_id_twice_is_refused(api: Api) -> None:
    body = batch(3)
    body["schedules"][2]["schedule_id"] = "b-00000"
    response = await api.client.post("/v1/schedules:batch", json=body, headers=api.admin)
    problem = assert_problem(response, 422, "invalid-field")
    assert "more than once" in problem["detail"]
    assert await count_schedules(api) == 0


async def test_batch_naming_an_existing_id_gets_409_and_creates_nothing(api: Api) -> None:
    await api.create_schedule("b-00001")
    response = await api.client.post("/v1/schedules:batch", json=batch(5), headers=api.admin)
    assert_problem(response, 409, "already-exists")
    assert await count_schedules(api) == 1


async def test_batch_over_the_quota_gets_409_and_creates_nothing(api: Api) -> None:
    await api.ledger.tenants_put(TenantsPut(Tenant(tenant_id="acme", schedules_max=10)))
    response = await api.client.post("/v1/schedules:batch", json=batch(11), headers=api.admin)
    assert_problem(response, 409, "quota-exceeded")
    assert await count_schedules(api) == 0
    fits = await api.client.post("/v1/schedules:batch", json=batch(10), headers=api.admin)
    assert fits.status_code == 201


@pytest.mark.parametrize(
    "body",
    [{"schedules": []}, {}, {"schedules": {}}, {"schedules": [None]}],
    ids=["empty", "missing", "object", "null-item"],
)
async def test_batch_of_the_wrong_shape_gets_422(memory_api: Api, body: dict[str, Any]) -> None:
    response = await memory_api.client.post(
        "/v1/schedules:batch", json=body, headers=memory_api.admin
    )
    assert_problem(response, 422, "invalid-field")


async def test_batch_of_more_than_10000_gets_422(memory_api: Api) -> None:
    body = {"schedules": [{"cron_expr": "* * * * *", "task_type": "noop"}] * (BATCH_ROWS_MAX + 1)}
    response = await memory_api.client.post(
        "/v1/schedules:batch", json=body, headers=memory_api.admin
    )
    assert_problem(response, 422, "invalid-field")
    assert await count_schedules(memory_api) == 0


async def test_quota_exceeded_on_create_gets_409(api: Api) -> None:
    await api.ledger.tenants_put(TenantsPut(Tenant(tenant_id="acme", schedules_max=1)))
    await api.create_schedule("only-one")
    response = await api.client.post(
        "/v1/schedules", json=spec(tenant_id="acme"), headers=api.tenant("acme")
    )
    problem = assert_problem(response, 409, "quota-exceeded")
    assert "acme" in problem["detail"]
    put = await api.client.put("/v1/schedules/second", json=spec(), headers=api.tenant("acme"))
    assert_problem(put, 409, "quota-exceeded")
