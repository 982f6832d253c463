"""`carillon schedule ...` against the real API on a memory ledger."""

from __future__ import annotations

import json
import re

import msgspec
import pytest

from engine.ledger.params import ExecutionsQuery, SchedulesList
from engine.model import CatchUpPolicy, OverlapPolicy
from tests.cli.conftest import Api
from tests.cli.harness import Cli

EVERY_5_MIN = ("--cron", "*/5 * * * *", "--task-type", "noop")


async def test_add_without_an_id_creates_one_under_an_id_the_api_chooses(
    api: Api, cli: Cli
) -> None:
    result = await cli("schedule", "add", *EVERY_5_MIN, "--tenant", "acme")
    assert (result.code, result.err) == (0, "")
    assert result.out.startswith("created schedule 'sch_")
    assert result.out.endswith("(version 1); next fire 2026-01-01T12:05:00Z\n")
    [stored] = (await api.ledger.schedules_list(_all())).items
    assert (stored.tenant_id, stored.cron_expr, stored.task_type) == ("acme", "*/5 * * * *", "noop")


async def test_add_with_an_id_creates_then_replaces_the_whole_definition(
    api: Api, cli: Cli
) -> None:
    full = ("--tz", "Europe/Paris", "--payload", '{"n": 1}', "--catch-up", "all",
            "--overlap", "skip", "--paused")  # fmt: skip
    result = await cli("schedule", "add", "nightly", *EVERY_5_MIN, *full)
    assert (result.code, result.out) == (
        0,
        "created schedule 'nightly' (version 1); next fire none while paused\n",
    )
    stored = await api.ledger.schedules_get("nightly")
    assert (stored.timezone, stored.payload, stored.enabled) == ("Europe/Paris", {"n": 1}, False)
    assert (stored.catch_up, stored.overlap) == (CatchUpPolicy.ALL, OverlapPolicy.SKIP)
    result = await cli("schedule", "put", "nightly", "--cron", "0 2 * * *", "--task-type", "noop")
    assert (result.code, result.out) == (
        0,
        "replaced schedule 'nightly' (version 2); next fire 2026-01-02T02:00:00Z\n",
    )
    stored = await api.ledger.schedules_get("nightly")  # left-out options took their defaults
    assert (stored.timezone, stored.payload, stored.enabled) == ("UTC", {}, True)
    assert (stored.catch_up, stored.overlap) == (CatchUpPolicy.LATEST, None)


async def test_show_prints_the_fields_and_json_is_the_api_answer_exactly(
    api: Api, cli: Cli
) -> None:
    await cli("schedule", "add", "s1", *EVERY_5_MIN, "--payload", '{"k": "v"}')
    result = await cli("schedule", "show", "s1")
    assert result.code == 0
    assert "schedule_id: s1\n" in result.out
    assert 'payload: {"k": "v"}\n' in result.out
    assert "overlap: -\n" in result.out
    result = await cli("schedule", "show", "s1", "--output", "json")
    stored = await api.ledger.schedules_get("s1")
    assert result.out == msgspec.json.encode(stored).decode() + "\n"
    assert json.loads(result.out)["version"] == 1


async def test_list_shows_one_page_and_names_the_cursor_of_the_next_on_stderr(
    api: Api, cli: Cli
) -> None:
    for name, tenant in (("a", "acme"), ("b", "acme"), ("c", "globex")):
        await cli("schedule", "add", name, *EVERY_5_MIN, "--tenant", tenant)
    await cli("schedule", "pause", "b")
    result = await cli("schedule", "list")
    lines = result.out.splitlines()
    assert lines[0].split() == ["SCHEDULE_ID", "TENANT", "CRON", "TZ", "TASK_TYPE", "STATE",
                                "NEXT_RUN", "VER"]  # fmt: skip
    assert [line.split()[0] for line in lines[1:]] == ["a", "b", "c"]
    assert "paused" in lines[2]
    result = await cli("schedule", "list", "--tenant", "acme", "--limit", "1")
    assert [line.split()[0] for line in result.out.splitlines()[1:]] == ["a"]
    assert "more schedules match; the next page: --cursor " in result.err
    cursor = result.err.split("--cursor ")[1].strip()
    result = await cli("schedule", "list", "--tenant", "acme", "--limit", "1", "--cursor", cursor)
    assert [line.split()[0] for line in result.out.splitlines()[1:]] == ["b"]
    result = await cli("schedule", "list", "--paused", "-o", "json")
    page = json.loads(result.out)
    assert [s["schedule_id"] for s in page["items"]] == ["b"]
    assert page["next_cursor"] is None
    result = await cli("schedule", "list", "--tenant", "nobody")
    assert (result.code, result.out) == (0, "no schedules match\n")


async def test_update_changes_only_the_given_fields_and_if_version_refuses_a_stale_one(
    api: Api, cli: Cli
) -> None:
    await cli("schedule", "add", "s1", *EVERY_5_MIN, "--payload", '{"keep": true}')
    result = await cli("schedule", "update", "s1", "--tz", "Asia/Tokyo", "--if-version", "1")
    assert (result.code, result.out) == (
        0,
        "updated schedule 's1' (version 2); next fire 2026-01-01T12:05:00Z\n",
    )
    stored = await api.ledger.schedules_get("s1")
    assert (stored.timezone, stored.payload, stored.cron_expr) == (
        "Asia/Tokyo",
        {"keep": True},
        "*/5 * * * *",
    )
    result = await cli("schedule", "update", "s1", "--overlap", "skip", "--if-version", "1")
    assert result.code == 1
    assert result.err == (
        "carillon: error: schedule 's1' is at version 2, not 1; re-read it and apply the "
        "change again\n"
    )
    result = await cli("schedule", "update", "s1", "--overlap", "skip")
    assert result.code == 0
    result = await cli("schedule", "update", "s1", "--overlap", "default", "--paused")
    stored = await api.ledger.schedules_get("s1")
    assert (stored.overlap, stored.enabled, stored.version) == (None, False, 4)
    result = await cli("schedule", "update", "s1")
    assert result.code == 2
    assert "nothing to change" in result.err


async def test_pause_skips_and_resume_plans_from_the_next_fire_after_now(
    api: Api, cli: Cli
) -> None:
    await cli("schedule", "add", "s1", *EVERY_5_MIN)
    result = await cli("schedule", "pause", "s1")
    assert (result.code, result.out) == (0, "paused schedule 's1' (version 2)\n")
    result = await cli("schedule", "pause", "s1")  # idempotent
    assert result.out == "paused schedule 's1' (version 2)\n"
    api.clock.advance(3600)
    result = await cli("schedule", "resume", "s1", "-o", "json")
    resumed = json.loads(result.out)
    assert (resumed["enabled"], resumed["next_run_at"]) == (True, "2026-01-01T13:05:00Z")


async def test_trigger_runs_now_and_backfill_plans_past_fires_only_once(api: Api, cli: Cli) -> None:
    await cli("schedule", "add", "s1", *EVERY_5_MIN)
    result = await cli("schedule", "trigger", "s1", "--reason", "smoke test")
    assert result.code == 0
    assert re.fullmatch(  # the id of "now", moved on if a planned fire holds it
        r"triggered schedule 's1': execution s1:2026-01-01T12:00:00(\.\d+)?Z \(queued\)\n",
        result.out,
    )
    window = ("--from", "2026-01-01T10:00:00Z", "--to", "2026-01-01T10:15:00+00:00")
    result = await cli("schedule", "backfill", "s1", *window)
    assert (result.code, result.out) == (
        0,
        "backfilled schedule 's1' from 2026-01-01T10:00:00Z to 2026-01-01T10:15:00Z: 3 fires, "
        "3 planned now, 0 had an execution already\n",
    )
    result = await cli("schedule", "backfill", "s1", *window, "-o", "json")
    assert json.loads(result.out) == {
        "requested": 3,
        "inserted": 0,
        "execution_ids": [],
        "skipped_purged": 0,
        "purged_through": None,
    }
    executions = await api.ledger.executions_query(ExecutionsQuery(schedule_id="s1"))
    assert len(executions.items) == 4
    result = await cli("schedule", "backfill", "s1", "--from", "2026-01-01T13:00:00Z",
                       "--to", "2026-01-01T14:00:00Z")  # fmt: skip
    assert result.code == 2
    assert "a backfill covers the past" in result.err


async def test_preview_marks_the_fires_daylight_saving_moved(api: Api, cli: Cli) -> None:
    await cli("schedule", "add", "ny", "--cron", "30 2 * * *", "--tz", "America/New_York",
              "--task-type", "noop")  # fmt: skip
    result = await cli("schedule", "preview", "ny", "--after", "2026-03-07T00:00:00Z",
                       "--count", "3")  # fmt: skip
    assert result.code == 0
    assert result.out.splitlines() == [
        "schedule 'ny' in America/New_York:",
        "PLANNED_AT            LOCAL_TIME                 DST",
        "2026-03-07T07:30:00Z  2026-03-07T02:30:00-05:00  -",
        "2026-03-08T07:00:00Z  2026-03-08T03:00:00-04:00  shifted",
        "2026-03-09T06:30:00Z  2026-03-09T02:30:00-04:00  -",
    ]
    result = await cli("schedule", "preview", "ny", "--count", "1", "-o", "json")
    assert json.loads(result.out)["fires"][0]["planned_at"] == "2026-01-02T07:30:00Z"


async def test_delete_skips_the_queued_runs_and_json_prints_nothing(api: Api, cli: Cli) -> None:
    await cli("schedule", "add", "s1", *EVERY_5_MIN)
    await cli("schedule", "add", "s2", *EVERY_5_MIN)
    result = await cli("schedule", "delete", "s1", "--if-version", "1")
    assert (result.code, result.out) == (
        0,
        "deleted schedule 's1'; its queued executions were skipped\n",
    )
    result = await cli("schedule", "delete", "s2", "-o", "json")
    assert (result.code, result.out, result.err) == (0, "", "")
    assert (await api.ledger.schedules_list(_all())).items == []


async def test_a_bad_expression_is_exit_2_with_the_apis_detail(api: Api, cli: Cli) -> None:
    result = await cli("schedule", "add", "s1", "--cron", "61 * * * *", "--task-type", "noop")
    assert (result.code, result.out) == (2, "")
    assert result.err.startswith("carillon: error: ")
    assert result.err.count("\n") == 1
    assert "61" in result.err
    result = await cli("schedule", "add", "s1", "--cron", "* * * * *", "--tz", "Mars/Olympus",
                       "--task-type", "noop")  # fmt: skip
    assert result.code == 2
    assert "Mars/Olympus" in result.err


async def test_an_unknown_schedule_is_exit_1(api: Api, cli: Cli) -> None:
    for action in ("show", "pause", "trigger", "delete", "preview"):
        result = await cli("schedule", action, "nope")
        assert (result.code, result.out) == (1, ""), action
        assert result.err == "carillon: error: schedule 'nope' does not exist\n"


async def test_a_tenant_token_sees_and_creates_only_its_own_tenants_schedules(
    api: Api, cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    await cli("schedule", "add", "theirs", *EVERY_5_MIN, "--tenant", "globex")
    monkeypatch.setenv("CARILLON_TOKEN", await api.token(tenant="acme"))
    result = await cli("schedule", "add", "mine", *EVERY_5_MIN)
    assert result.code == 0
    assert (await api.ledger.schedules_get("mine")).tenant_id == "acme"
    result = await cli("schedule", "list")
    assert [line.split()[0] for line in result.out.splitlines()[1:]] == ["mine"]
    result = await cli("schedule", "show", "theirs")
    assert (result.code, result.err) == (1, "carillon: error: schedule 'theirs' does not exist\n")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["add", "s", *EVERY_5_MIN, "--payload", "[1]"], "must be a JSON object"),
        (["add", "s", *EVERY_5_MIN, "--payload", "{"], "not JSON"),
        (["add", "s", "--task-type", "noop"], "the following arguments are required: --cron"),
        (["add", *EVERY_5_MIN, "--if-version", "2"], "--if-version needs the schedule's ID"),
        (["update", "s", "--if-version", "0"], "a version is a whole number from 1"),
        (["list", "--limit", "0"], "must be between 1 and 1000"),
        (["backfill", "s", "--from", "2026-01-01T10:00:00", "--to", "2026-01-01T11:00:00Z"],
         "has no UTC offset"),
        (["preview", "s", "--after", "yesterday"], "is not an RFC 3339 timestamp"),
        (["update", "s", "--paused", "--enabled"], "not allowed with argument"),
    ],
)  # fmt: skip
async def test_bad_flags_are_refused_before_any_request(
    cli: Cli, monkeypatch: pytest.MonkeyPatch, args: list[str], message: str
) -> None:
    monkeypatch.setenv("CARILLON_URL", "http://127.0.0.1:1")  # nothing listens there
    monkeypatch.setenv("CARILLON_TOKEN", "crl_x_y")
    result = await cli("schedule", *args)
    assert (result.code, result.out) == (2, "")
    assert result.err.count("\n") == 1
    assert message in result.err


def _all() -> SchedulesList:
    return SchedulesList()
