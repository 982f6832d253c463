"""A tenant's console shows and changes its own tenant only, with the API's 404s; every
value is escaped; no page shows a task type's settings."""

from __future__ import annotations

import pytest

from engine.ledger.params import (
    Completion,
    ExecutionsClaim,
    ExecutionsComplete,
    Outcome,
    TaskTypesPut,
)
from engine.model import ExecutionStatus, HandlerKind, TaskType
from tests.console.support import Console

XSS = "<script>alert(1)</script>"


async def test_a_tenant_sees_its_own_schedules_and_dead_letters_only(console: Console) -> None:
    api = console.api
    await api.create_schedule("ours")
    await api.create_schedule("theirs", tenant_id="globex")
    own_dead = await api.dead_letter("ours")
    their_dead = await api.dead_letter("theirs")
    browser = await console.signed_in("tenant:acme")
    listing = (await browser.get("/ui/schedules")).text
    assert ">ours</a>" in listing
    assert "theirs" not in listing
    letters = (await browser.get("/ui/dead-letters")).text
    assert own_dead in letters
    assert their_dead not in letters
    assert 'name="tenant_id"' not in letters  # no tenant filter to offer


@pytest.mark.parametrize(
    "path",
    [
        "/ui/schedules/theirs",
        "/ui/executions/{dead}",
        "/ui/schedules?tenant_id=globex",
        "/ui/dead-letters?tenant_id=globex",
        "/ui/executions?tenant_id=globex",
    ],
)
async def test_another_tenants_records_are_not_found(console: Console, path: str) -> None:
    api = console.api
    await api.create_schedule("theirs", tenant_id="globex")
    dead = await api.dead_letter("theirs")
    browser = await console.signed_in("tenant:acme")
    page = await browser.get(path.format(dead=dead))
    assert page.status_code == 404
    if "{dead}" in path or path.endswith("theirs"):
        # Exactly the page of a record that does not exist, the id aside.
        missing_id = "z" * len("theirs") if path.endswith("theirs") else "z" * 6 + dead[6:]
        missing = await browser.get(path.format(dead=missing_id).replace("theirs", missing_id))
        shown = dead if "{dead}" in path else "theirs"
        assert page.text.replace(shown, "ID") == missing.text.replace(missing_id, "ID")
        assert "does not exist" in page.text
    else:
        assert "not found" in page.text


async def test_a_tenant_cannot_act_on_another_tenants_records(console: Console) -> None:
    api = console.api
    await api.create_schedule("theirs", tenant_id="globex")
    dead = await api.dead_letter("theirs")
    browser = await console.signed_in("tenant:acme")
    for action in ("pause", "trigger"):
        response = await browser.post(f"/ui/schedules/theirs/{action}", {})
        assert response.status_code == 404
    assert (await api.ledger.schedules_get("theirs")).enabled
    for step in ({}, {"confirmed": "yes"}):
        response = await browser.post("/ui/dead-letters/replay", {"execution_id": dead, **step})
        assert response.status_code == 404
    assert (await api.ledger.executions_get(dead)).execution.status is ExecutionStatus.DEAD_LETTER


async def test_every_value_is_escaped(console: Console) -> None:
    api = console.api
    await api.create_schedule("xss", payload={"html": XSS, XSS: "key"})
    await api.dead_letter("xss")
    browser = await console.signed_in()
    pages = [
        await browser.get("/ui/schedules/xss"),
        await browser.get("/ui/schedules", id_prefix=f'"><{XSS}'),
        await browser.get("/ui/forecast", task_type=XSS),
        await browser.get("/ui/executions", schedule_id=XSS),
        await browser.get("/ui/dead-letters", task_type=f"'{XSS}"),
    ]
    for page in pages:
        assert XSS not in page.text, page.url
        assert "<script>" not in page.text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in pages[0].text
    assert 'value="&#34;&gt;&lt;&lt;script&gt;' in pages[1].text


async def test_execution_errors_are_escaped(console: Console) -> None:
    api = console.api
    await api.create_schedule("nightly")
    dead = await api.queued("nightly")
    schedule = await api.ledger.schedules_get("nightly")
    assert schedule.partition_id is not None
    fence = await api._fence(schedule.partition_id)
    [claimed] = await api.ledger.executions_claim(ExecutionsClaim([fence], [dead], 60.0, "n"))
    failure = Completion(dead, claimed.attempt, Outcome.DEAD_LETTER, None, XSS, XSS)
    await api.ledger.executions_complete(ExecutionsComplete([fence], [failure]))
    browser = await console.signed_in()
    for path in (f"/ui/executions/{dead}", "/ui/dead-letters"):
        page = await browser.get(path)
        assert page.status_code == 200
        assert XSS not in page.text
        assert "&lt;script&gt;" in page.text


async def test_no_page_shows_a_task_types_settings(console: Console) -> None:
    api = console.api
    secret = "whsec_must_never_render"
    hook = TaskType(
        name="hook",
        kind=HandlerKind.WEBHOOK,
        allowed_tenants=("*",),
        settings={"url": "https://hooks.example/x", "secret": secret},
    )
    await api.ledger.task_types_put(TaskTypesPut(hook))
    await api.create_schedule("hooked", task_type="hook")
    await api.dead_letter("hooked")
    browser = await console.signed_in()
    for path in (
        "/ui/overview",
        "/ui/forecast",
        "/ui/schedules",
        "/ui/schedules/hooked",
        "/ui/executions?tenant_id=acme&planned_from=2000-01-01",
        "/ui/dead-letters",
        "/ui/cluster",
    ):
        page = await browser.get(path)
        assert page.status_code == 200, path
        assert secret not in page.text, path
        assert "hooks.example" not in page.text, path
