"""Every page renders what the ledger holds: overview, forecast, schedules, executions, dead
letters, cluster -- on the memory ledger and on Postgres."""

from __future__ import annotations

import re
from datetime import timedelta

from engine.core.instants import format_utc
from engine.ledger.params import ExecutionsBackfill, NodesHeartbeat, SchedulesCreate
from engine.model import Schedule
from tests.console.support import Console, assert_secured


def rows(page_text: str) -> int:
    return page_text.count("<tr>") + len(re.findall(r"<tr class=", page_text))


async def test_the_overview_charts_the_last_hour_of_executions(console: Console) -> None:
    api = console.api
    await api.create_schedule("nightly")
    await api.dead_letter("nightly")
    await api.queued("nightly")
    browser = await console.signed_in()
    page = await browser.get("/ui/overview")
    assert page.status_code == 200
    assert_secured(page)
    text = page.text
    assert text.count("<svg") == 5
    assert "1 this hour" in text  # one dead letter
    assert "of 1 first starts" in text  # the dead letter's attempt started
    assert "1 waiting now" in text  # the queued run
    assert "Cluster now" in text
    assert 'aria-label="Started on time (within 60 s)' in text


async def test_a_tenants_overview_counts_its_own_executions_only(console: Console) -> None:
    api = console.api
    await api.create_schedule("theirs", tenant_id="globex")
    await api.dead_letter("theirs")
    browser = await console.signed_in("tenant:acme")
    text = (await browser.get("/ui/overview")).text
    assert "0 this hour" in text
    assert "no first start this hour" in text
    assert "Cluster now" not in text


async def test_the_forecast_shows_a_burst_as_its_peak(console: Console) -> None:
    api = console.api
    now = await api.now()
    burst = now.replace(second=0, microsecond=0) + timedelta(hours=3, minutes=7)
    cron = f"{burst.minute} {burst.hour} * * *"
    for i in range(25):
        await api.create_schedule(f"burst-{i:02d}", cron_expr=cron)
    await api.create_schedule("quiet", tenant_id="globex", cron_expr="0 0 1 1 *")
    browser = await console.signed_in()
    text = (await browser.get("/ui/forecast", hours="6")).text
    assert "<strong>25</strong>" in text
    assert format_utc(burst).replace("T", " ") in text
    assert "acme / noop" in text
    assert f"acme / noop at {format_utc(burst)[11:16]} UTC: 25 due" in text
    tenant = await console.signed_in("tenant:globex")
    assert "acme / noop" not in (await tenant.get("/ui/forecast")).text


async def test_schedules_are_searched_by_id_prefix_and_filtered_and_paged(
    console: Console,
) -> None:
    api = console.api
    batch = [
        Schedule(
            schedule_id=f"billing-{i:03d}",
            tenant_id="acme",
            cron_expr="*/5 * * * *",
            task_type="noop",
            enabled=i % 10 != 0,
        )
        for i in range(60)
    ]
    await api.ledger.schedules_create(SchedulesCreate(batch))
    await api.create_schedule("reports", tenant_id="globex")
    browser = await console.signed_in()
    first = await browser.get("/ui/schedules", id_prefix="billing")
    assert first.status_code == 200
    assert "billing-000" in first.text
    assert "billing-049" in first.text
    assert "billing-050" not in first.text
    assert "reports" not in first.text
    cursor = re.search(r'rel="next" href="/ui/schedules\?[^"]*cursor=([0-9a-f]+)', first.text)
    assert cursor is not None
    second = await browser.get("/ui/schedules", id_prefix="billing", cursor=cursor.group(1))
    assert "billing-050" in second.text
    assert "billing-059" in second.text
    assert 'rel="next"' not in second.text
    paused = await browser.get("/ui/schedules", enabled="false")
    assert re.findall(r">(billing-\d+)</a>", paused.text) == [
        f"billing-{i:03d}" for i in range(0, 60, 10)
    ]
    globex = await browser.get("/ui/schedules", tenant_id="globex")
    assert ">reports</a>" in globex.text
    assert "billing-001" not in globex.text


async def test_a_schedule_page_marks_dst_moves_and_lists_recent_runs_with_delays(
    console: Console,
) -> None:
    api = console.api
    await api.create_schedule("london", cron_expr="30 1 * * *", timezone="Europe/London")
    await api.dead_letter("london")
    browser = await console.signed_in()
    page = await browser.get("/ui/schedules/london")
    text = page.text
    assert page.status_code == 200
    assert "Clock changes in Europe/London" in text
    assert "clocks go forward +1:00" in text
    assert "clocks go back -1:00" in text
    assert '<span class="badge">shifted</span>' in text  # 01:30 does not exist that night
    assert '<span class="badge">first-pass</span>' in text  # 01:30 happens twice then
    assert "Recent executions" in text
    assert "dead-letter" in text
    assert re.search(r"<td>(\d+ ms|[\d.]+ s)</td>", text)  # its start delay


async def test_executions_need_a_tenant_or_schedule_for_an_admin_and_show_attempts(
    console: Console,
) -> None:
    api = console.api
    await api.create_schedule("nightly")
    dead = await api.dead_letter("nightly")
    browser = await console.signed_in()
    unfiltered = await browser.get("/ui/executions")
    assert "Choose a tenant or a schedule" in unfiltered.text
    assert dead not in unfiltered.text
    listed = await browser.get("/ui/executions", tenant_id="acme", planned_from="2000-01-01")
    assert dead in listed.text
    assert "boom" in listed.text
    by_status = await browser.get("/ui/executions", status="dead-letter", planned_from="2000-01-01")
    assert dead in by_status.text
    tenant = await console.signed_in("tenant:acme")
    own = await tenant.get("/ui/executions", planned_from="2000-01-01 00:00")
    assert dead in own.text
    detail = await browser.get(f"/ui/executions/{dead}")
    assert detail.status_code == 200
    assert "it failed for good" in detail.text
    assert "<code>boom</code>" in detail.text
    assert "Replay…" in detail.text


async def test_a_bad_filter_is_explained_with_the_apis_message(console: Console) -> None:
    browser = await console.signed_in()
    page = await browser.get("/ui/executions", tenant_id="acme", planned_from="yesterday")
    assert page.status_code == 422
    assert "planned_from" in page.text
    assert_secured(page)


async def test_the_cluster_page_shows_nodes_partitions_fencing_and_skew(console: Console) -> None:
    api = console.api
    await api.ledger.nodes_heartbeat(NodesHeartbeat("node-a", "eu-west", 60.0, 1.5, {0: 7.5}))
    await api._fence(0)
    browser = await console.signed_in()
    page = await browser.get("/ui/cluster")
    assert page.status_code == 200
    text = page.text
    assert "node-a" in text
    assert "eu-west" in text
    assert '<td class="warn">1.5 s</td>' in text  # skew over a second
    assert rows(text) == 2 + 1 + 8  # two header rows, the node, every partition
    assert re.search(r'<td class="num">0</td><td>api-test-node</td>', text)  # owner of 0
    tenant = await console.signed_in("tenant:acme")
    refused = await tenant.get("/ui/cluster")
    assert refused.status_code == 403
    assert "admin token" in refused.text
    assert 'href="/ui/cluster"' not in refused.text  # no link to it in the navigation


async def test_an_unknown_schedule_or_execution_is_a_404_page(console: Console) -> None:
    browser = await console.signed_in()
    for path in ("/ui/schedules/nope", "/ui/executions/nope:2026-03-02T00:00:00Z"):
        page = await browser.get(path)
        assert page.status_code == 404
        assert "Not found" in page.text
        assert_secured(page)


async def test_executions_and_dead_letters_page_with_a_cursor(console: Console) -> None:
    api = console.api
    await api.create_schedule("minutely", cron_expr="* * * * *")
    now = (await api.now()).replace(second=0, microsecond=0)
    fires = [now - timedelta(minutes=m) for m in range(1, 151)]
    await api.ledger.executions_backfill(ExecutionsBackfill("minutely", fires, "test"))
    browser = await console.signed_in()
    first = await browser.get("/ui/executions", schedule_id="minutely", planned_from="2000-01-01")
    assert first.text.count('href="/ui/executions/minutely') == 100
    cursor = re.search(r'rel="next" href="/ui/executions\?([^"]+)"', first.text)
    assert cursor is not None
    second = await browser.client.get("/ui/executions?" + cursor.group(1).replace("&amp;", "&"))
    assert second.text.count('href="/ui/executions/minutely') == 50
    assert 'rel="next"' not in second.text
    assert "First page" in second.text
    letters = await browser.get("/ui/dead-letters")
    assert "First page" not in letters.text  # one page: no pager
