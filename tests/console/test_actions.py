"""What operators do from the console: pause, resume, run now, replay dead letters (with a
confirmation step) -- each through the API's route, so each is checked and audited as
through ``/v1``."""

from __future__ import annotations

from engine.ledger.params import AuditQuery, ExecutionsQuery
from engine.model import ExecutionStatus
from tests.console.support import Console


async def test_pause_resume_and_run_now_return_to_the_page_with_a_notice(
    console: Console,
) -> None:
    api = console.api
    await api.create_schedule("nightly")
    browser = await console.signed_in()
    back = "/ui/schedules?id_prefix=night"
    paused = await browser.post("/ui/schedules/nightly/pause", {"back": back})
    assert paused.status_code == 303
    assert paused.headers["location"] == back + "&notice=paused"
    assert not (await api.ledger.schedules_get("nightly")).enabled
    page = await browser.get("/ui/schedules", id_prefix="night", notice="paused")
    assert "The schedule is paused" in page.text
    assert "/ui/schedules/nightly/resume" in page.text

    resumed = await browser.post("/ui/schedules/nightly/resume", {})
    assert resumed.headers["location"] == "/ui/schedules/nightly?notice=resumed"
    assert (await api.ledger.schedules_get("nightly")).enabled

    triggered = await browser.post("/ui/schedules/nightly/trigger", {"reason": "by hand"})
    assert triggered.headers["location"] == "/ui/schedules/nightly?notice=triggered"
    runs = await api.ledger.executions_query(ExecutionsQuery(schedule_id="nightly"))
    assert [e.status for e in runs.items] == [ExecutionStatus.QUEUED]
    [event] = await api.ledger.audit_list(AuditQuery(action="schedule.trigger"))
    assert event.actor == f"token:{api.admin_id}"
    assert event.details["reason"] == "by hand"


async def test_a_notice_is_chosen_from_a_fixed_list_never_echoed(console: Console) -> None:
    browser = await console.signed_in()
    page = await browser.get("/ui/schedules", notice="<b>hello</b>")
    assert "hello" not in page.text


async def test_an_action_refuses_what_the_api_refuses(console: Console) -> None:
    await console.api.create_schedule("nightly")
    browser = await console.signed_in()
    too_long = await browser.post("/ui/schedules/nightly/trigger", {"reason": "x" * 1001})
    assert too_long.status_code == 422
    unknown = await browser.post("/ui/schedules/nightly/explode", {})
    assert unknown.status_code == 404
    missing = await browser.post("/ui/schedules/nope/pause", {})
    assert missing.status_code == 404
    outside = await browser.post("/ui/schedules/nightly/pause", {"back": "https://evil.example"})
    assert outside.headers["location"] == "/ui/schedules/nightly?notice=paused"


async def test_a_replay_shows_what_it_will_do_and_replays_only_once_confirmed(
    console: Console,
) -> None:
    api = console.api
    await api.create_schedule("nightly")
    first = await api.dead_letter("nightly")
    second = await api.dead_letter("nightly")
    browser = await console.signed_in()
    listing = await browser.get("/ui/dead-letters")
    assert first in listing.text
    assert second in listing.text

    chosen = {"execution_id": [first, second], "back": "/ui/dead-letters?tenant_id=acme"}
    confirm = await browser.post("/ui/dead-letters/replay", chosen)
    assert confirm.status_code == 200
    assert "Replay 2 dead letters?" in confirm.text
    assert 'name="confirmed" value="yes"' in confirm.text
    assert (await api.ledger.executions_get(first)).execution.status is ExecutionStatus.DEAD_LETTER

    done = await browser.post(
        "/ui/dead-letters/replay", {**chosen, "confirmed": "yes", "reason": "fixed"}
    )
    assert done.status_code == 303
    assert done.headers["location"] == "/ui/dead-letters?tenant_id=acme&notice=replayed"
    for key in (first, second):
        assert (await api.ledger.executions_get(key)).execution.status is ExecutionStatus.QUEUED
    events = await api.ledger.audit_list(AuditQuery(action="dead_letter.replay"))
    assert [(e.target, e.details["reason"]) for e in events] == [
        (first, "fixed"),
        (second, "fixed"),
    ]

    again = await browser.post("/ui/dead-letters/replay", {**chosen, "confirmed": "yes"})
    assert again.headers["location"].endswith("notice=replayed-none")
    assert len(await api.ledger.audit_list(AuditQuery(action="dead_letter.replay"))) == 2


async def test_a_replay_needs_a_selection(console: Console) -> None:
    browser = await console.signed_in()
    response = await browser.post("/ui/dead-letters/replay", {"confirmed": "yes"})
    assert response.status_code == 422
    assert "select at least one" in response.text


async def test_a_replay_skips_a_dead_letter_whose_schedule_is_deleted(console: Console) -> None:
    api = console.api
    await api.create_schedule("kept")
    await api.create_schedule("gone")
    kept, gone = await api.dead_letter("kept"), await api.dead_letter("gone")
    await api.client.delete("/v1/schedules/gone", headers=api.admin)
    browser = await console.signed_in()
    done = await browser.post(
        "/ui/dead-letters/replay", {"execution_id": [gone, kept], "confirmed": "yes"}
    )
    assert done.status_code == 303
    assert done.headers["location"].endswith("notice=replayed")
    assert (await api.ledger.executions_get(kept)).execution.status is ExecutionStatus.QUEUED
    assert (await api.ledger.executions_get(gone)).execution.status is (ExecutionStatus.DEAD_LETTER)
