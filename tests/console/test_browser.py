"""The console in a real browser: Debian's Chromium, driven by Playwright, against a live
node-like server (the real API server on a socket, over the demo hour in a memory ledger).

An operator signs in, finds a schedule and pauses it, replays a dead letter through the
confirmation step, and sees the forecast spike of a burst created through the JSON API.
Screenshots of each step are left in ``.artifacts/console/``. Skipped, saying why, where
Chromium is missing or cannot start (:func:`~tests.console.live.chromium_or_skip`).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import httpx
import pytest
from playwright.sync_api import Browser, ConsoleMessage, Page, expect

from engine.core.instants import format_utc
from engine.model import ExecutionStatus
from tests.console.browser import ARTIFACTS, chromium, new_page, sign_in
from tests.console.demo import DEMO_NOW
from tests.console.live import LiveNode, chromium_or_skip


@pytest.fixture(scope="module")
def live() -> Iterator[LiveNode]:
    chromium_or_skip()
    node = LiveNode().start()
    yield node
    node.stop()


@pytest.fixture(scope="module")
def browser(live: LiveNode) -> Iterator[Browser]:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with chromium(chromium_or_skip()) as opened:
        yield opened


@pytest.fixture
def page(browser: Browser, live: LiveNode) -> Iterator[Page]:
    with new_page(browser, live.url) as opened:
        yield opened


def shot(page: Page, name: str) -> None:
    page.screenshot(path=ARTIFACTS / f"{name}.png", full_page=True)


def test_an_operator_signs_in_finds_a_schedule_and_pauses_it(page: Page, live: LiveNode) -> None:
    sign_in(page, live.tokens["admin"], "/ui/schedules")
    expect(page).to_have_url(f"{live.url}/ui/schedules")
    page.get_by_label("Id starts with").fill("billing-rem")
    page.get_by_role("button", name="Search").click()
    expect(page.locator("table.list tbody tr")).to_have_count(1)
    page.get_by_role("link", name="billing-reminders").click()
    expect(page.get_by_role("heading", level=1)).to_contain_text("billing-reminders")
    shot(page, "schedule-before-pause")
    page.get_by_role("button", name="Pause").click()
    expect(page.get_by_role("status")).to_contain_text("The schedule is paused")
    expect(page.get_by_role("heading", level=1)).to_contain_text("paused")
    shot(page, "schedule-paused")
    schedule = live.run(live.ledger.schedules_get, "billing-reminders")
    assert not schedule.enabled
    page.get_by_role("button", name="Resume").click()
    expect(page.get_by_role("status")).to_contain_text("running again")
    assert live.run(live.ledger.schedules_get, "billing-reminders").enabled


def test_an_operator_replays_a_dead_letter_after_confirming(page: Page, live: LiveNode) -> None:
    sign_in(page, live.tokens["admin"], "/ui/dead-letters")
    page.get_by_label("Schedule").fill("billing-reminders")
    page.get_by_role("button", name="Filter").click()
    boxes = page.locator('input[name="execution_id"]')
    expect(boxes).to_have_count(4)
    page.get_by_label("Select all").check()  # the script's one enhancement runs under the CSP
    expect(boxes.nth(3)).to_be_checked()
    page.get_by_label("Select all").uncheck()
    first = boxes.first.get_attribute("value")
    assert first is not None
    boxes.first.check()
    page.get_by_role("button", name="Replay selected…").click()
    expect(page.get_by_role("heading", level=1)).to_have_text("Replay 1 dead letter?")
    assert (
        live.run(live.ledger.executions_get, first).execution.status is ExecutionStatus.DEAD_LETTER
    )
    page.get_by_label("Reason (kept in the audit trail)").fill("the endpoint is back")
    shot(page, "replay-confirm")
    page.get_by_role("button", name="Replay 1").click()
    expect(page.get_by_role("status")).to_contain_text("queued again")
    expect(page.locator('input[name="execution_id"]')).to_have_count(3)
    shot(page, "replayed")
    assert live.run(live.ledger.executions_get, first).execution.status is ExecutionStatus.QUEUED


def test_the_forecast_shows_the_spike_of_a_burst_created_through_the_api(
    page: Page, live: LiveNode
) -> None:
    burst = DEMO_NOW.replace(second=0) + timedelta(hours=2, minutes=13)
    specs = [
        {
            "schedule_id": f"burst-{i:03d}",
            "tenant_id": "initech",
            "cron_expr": f"{burst.minute} {burst.hour} * * *",
            "task_type": "noop",
        }
        for i in range(400)
    ]
    created = httpx.post(
        f"{live.url}/v1/schedules:batch",
        json={"schedules": specs},
        headers={"Authorization": f"Bearer {live.tokens['admin']}"},
    )
    assert created.status_code == 201, created.text
    sign_in(page, live.tokens["admin"], "/ui/forecast")
    peak = page.locator("table.peaks tbody tr").first
    expect(peak).to_contain_text(format_utc(burst).replace("T", " "))
    expect(peak).to_contain_text("412")  # the burst and acme's twelve minutely schedules
    title = f"initech / noop at {format_utc(burst)[11:16]} UTC: 400 due"
    cell = page.locator("svg.heat-strip rect", has=page.locator("title", has_text=title))
    expect(cell).to_have_count(1)
    assert cell.get_attribute("class") == "heat5"  # the darkest shade: the map's peak
    shot(page, "forecast-burst")


def test_a_tenant_sees_its_own_tenant_and_no_cluster(page: Page, live: LiveNode) -> None:
    sign_in(page, live.tokens["tenant:acme"], "/ui/schedules")
    expect(page.get_by_role("link", name="Cluster")).to_have_count(0)
    tenants = page.locator("table.list tbody tr td:nth-child(2)").all_inner_texts()
    assert set(tenants) == {"acme"}
    page.goto("/ui/schedules/globex-report-daily")
    expect(page.get_by_role("heading", level=1)).to_contain_text("404")
    shot(page, "tenant-404")


def test_no_page_breaks_the_content_security_policy(page: Page, live: LiveNode) -> None:
    problems: list[str] = []

    def listen(message: ConsoleMessage) -> None:
        if message.type in ("error", "warning"):
            problems.append(f"{page.url}: {message.text}")

    page.on("console", listen)
    page.on("pageerror", lambda error: problems.append(f"{page.url}: {error}"))
    sign_in(page, live.tokens["admin"])
    for path in (
        "/ui/overview",
        "/ui/forecast",
        "/ui/schedules",
        "/ui/schedules/billing-invoices-eu",
        "/ui/executions?tenant_id=acme",
        "/ui/dead-letters",
        "/ui/cluster",
    ):
        page.goto(path)
        expect(page.locator("main h1")).to_be_visible()
    assert problems == []
