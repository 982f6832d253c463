"""`carillon executions` and `carillon dlq list|replay|purge` against the real API.

Dead letters are made through the ledger itself, as a node would (:func:`dead_letters`).
"""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from engine.core.instants import format_utc
from engine.errors import NotFound
from engine.ledger.base import Ledger
from engine.ledger.params import AuditQuery, SchedulesDelete
from engine.model import ExecutionStatus
from tests.cli.conftest import Api
from tests.cli.harness import LETTERS, Cli, dead_letters


async def statuses(ledger: Ledger, ids: list[str]) -> list[ExecutionStatus]:
    return [(await ledger.executions_get(eid)).execution.status for eid in ids]


async def test_executions_list_filters_pages_and_show_prints_the_attempts(
    api: Api, cli: Cli
) -> None:
    ids = await dead_letters(api.ledger, LETTERS)
    since = ("--from", "2026-01-01T11:00:00Z")
    result = await cli("executions", "list", *since)
    assert (result.code, result.err) == (0, "")
    lines = result.out.splitlines()
    assert lines[0].split() == ["EXECUTION_ID", "TENANT", "TASK_TYPE", "STATUS", "ATTEMPT",
                                "STARTED_AT", "ERROR"]  # fmt: skip
    assert [line.split()[0] for line in lines[1:]] == [ids[s] for s, _, _ in LETTERS]
    assert lines[1].split()[1:5] == ["acme", "billing", "dead-letter", "1"]
    assert lines[1].endswith("http_404 gone")
    result = await cli("executions", *since, "--tenant", "acme", "--task-type", "billing",
                       "--status", "dead-letter", "-o", "json")  # fmt: skip
    page = json.loads(result.out)
    assert [e["execution_id"] for e in page["items"]] == [ids["bill-1"], ids["bill-2"]]
    result = await cli("executions", "list", *since, "--schedule", "mail-1", "--limit", "1")
    assert [line.split()[0] for line in result.out.splitlines()[1:]] == [ids["mail-1"]]
    assert result.err == ""  # the only one: no next page
    result = await cli("executions", "list", "--from", "2026-01-01T11:59:30Z",
                       "--to", "2026-01-01T11:59:31Z")  # fmt: skip
    assert result.out == "no executions match\n"
    result = await cli("executions", "show", ids["bill-3"])
    assert result.code == 0
    assert f"execution_id: {ids['bill-3']}\n" in result.out
    assert "status: dead-letter\n" in result.out
    assert result.out.splitlines()[-1].split()[:2] == ["1", "dead-letter"]
    result = await cli("executions", "show", ids["bill-3"], "-o", "json")
    detail = json.loads(result.out)
    assert [a["error_code"] for a in detail["attempts"]] == ["http_404"]
    result = await cli("executions", "show", "bill-3:2020-01-01T00:00:00Z")
    assert result.code == 1
    assert "does not exist" in result.err


async def test_executions_without_from_lists_the_last_minutes_by_this_machines_clock(
    api: Api, cli: Cli
) -> None:
    await dead_letters(api.ledger, LETTERS)  # planned in 2026, by the ledger's manual clock
    result = await cli("executions", "--minutes", "5")
    assert (result.code, result.out) == (0, "no executions match\n")
    result = await cli("executions", "--minutes", "5", "--from", "2026-01-01T00:00:00Z")
    assert (result.code, result.err) == (2, "carillon: error: give --from or --minutes, not both\n")


async def test_dlq_replay_skips_a_dead_letter_whose_schedule_is_deleted_and_says_why(
    api: Api, cli: Cli
) -> None:
    ids = await dead_letters(api.ledger, LETTERS)
    await api.ledger.schedules_delete(SchedulesDelete("bill-1"))
    result = await cli("dlq", "replay", ids["bill-1"], ids["bill-2"])
    assert (result.code, result.out) == (0, "replayed 1 of 2 dead letters\n")
    assert result.err == (
        f"carillon: {ids['bill-1']} cannot be replayed (execution {ids['bill-1']!r} cannot be "
        "replayed: its schedule 'bill-1' was deleted, and with it the payload the execution "
        "runs with; create the schedule again, then replay it); skipped\n"
    )
    result = await cli("dlq", "replay", "--all", "--task-type", "billing")
    assert (result.code, result.out) == (0, "replayed 1 dead letter\n")  # bill-3, not bill-1
    assert await statuses(api.ledger, [ids["bill-1"], ids["bill-2"], ids["bill-3"]]) == [
        ExecutionStatus.DEAD_LETTER,
        ExecutionStatus.QUEUED,
        ExecutionStatus.QUEUED,
    ]


async def test_dlq_list_shows_dead_letters_filtered(api: Api, cli: Cli) -> None:
    ids = await dead_letters(api.ledger, LETTERS)
    result = await cli("dlq", "list")
    lines = result.out.splitlines()
    assert lines[0].split() == ["EXECUTION_ID", "TENANT", "TASK_TYPE", "ATTEMPT", "DEAD_SINCE",
                                "ERROR"]  # fmt: skip
    assert [line.split()[0] for line in lines[1:]] == [ids[s] for s, _, _ in LETTERS]
    result = await cli("dlq", "list", "--tenant", "acme", "--task-type", "billing", "-o", "json")
    assert [e["execution_id"] for e in json.loads(result.out)["items"]] == [
        ids["bill-1"],
        ids["bill-2"],
    ]
    result = await cli("dlq", "list", "--limit", "2")
    assert len(result.out.splitlines()) == 3
    assert "more dead letters match; the next page: --cursor" in result.err


async def test_dlq_replay_by_id_requeues_and_skips_what_is_not_a_dead_letter(
    api: Api, cli: Cli
) -> None:
    ids = await dead_letters(api.ledger, LETTERS)
    result = await cli("dlq", "replay", ids["bill-1"], "nope:2026-01-01T00:00:00Z",
                       "--reason", "receiver fixed")  # fmt: skip
    assert result.code == 0
    assert result.out == "replayed 1 of 2 dead letters\n"
    assert result.err == (
        "carillon: nope:2026-01-01T00:00:00Z is not a dead letter (execution "
        "'nope:2026-01-01T00:00:00Z' does not exist); skipped\n"
    )
    assert await statuses(api.ledger, [ids["bill-1"], ids["bill-2"]]) == [
        ExecutionStatus.QUEUED,
        ExecutionStatus.DEAD_LETTER,
    ]
    result = await cli("dlq", "replay", ids["bill-1"], "-o", "json")  # again: harmless
    assert (result.code, json.loads(result.out)) == (0, {"replayed": []})
    assert "is queued; only dead letters can be replayed); skipped" in result.err
    [event] = await api.ledger.audit_list(AuditQuery(action="dead_letter.replay"))
    assert (event.target, event.details["reason"]) == (ids["bill-1"], "receiver fixed")
    assert event.actor.startswith("token:")


async def test_dlq_replay_all_replays_every_match_of_its_filters_in_rounds(
    api: Api, cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("engine.cli.dlq.REPLAY_ROUND_MAX", 1)  # one dead letter per request
    ids = await dead_letters(api.ledger, LETTERS)
    result = await cli("dlq", "replay", "--all", "--task-type", "billing")
    assert (result.code, result.out, result.err) == (0, "replayed 3 dead letters\n", "")
    assert await statuses(api.ledger, [ids[s] for s, _, _ in LETTERS]) == [
        ExecutionStatus.QUEUED,
        ExecutionStatus.QUEUED,
        ExecutionStatus.QUEUED,
        ExecutionStatus.DEAD_LETTER,
    ]
    result = await cli("dlq", "replay", "--all", "--tenant", "acme", "-o", "json")
    assert json.loads(result.out) == {"replayed": [ids["mail-1"]]}


async def test_dlq_purge_counts_first_and_deletes_only_with_yes_in_rounds(
    api: Api, cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("engine.cli.dlq.PURGE_ROUND_MAX", 1)  # one dead letter per request
    ids = await dead_letters(api.ledger, LETTERS)
    result = await cli("dlq", "purge", "--task-type", "billing")
    assert (result.code, result.out, result.err) == (
        0,
        "3 dead letters match; nothing purged (add --yes to purge them)\n",
        "",
    )
    result = await cli("dlq", "purge", "--all", "-o", "json")
    assert (result.code, json.loads(result.out)) == (0, {"matching": 4})
    assert await statuses(api.ledger, list(ids.values())) == [ExecutionStatus.DEAD_LETTER] * 4
    result = await cli("dlq", "purge", "--task-type", "billing", "--yes", "--reason", "noise")
    assert (result.code, result.out, result.err) == (0, "purged 3 dead letters\n", "")
    events = await api.ledger.audit_list(AuditQuery(action="dead_letter.purge"))
    assert sorted(e.target for e in events) == sorted(
        ids[s] for s in ("bill-1", "bill-2", "bill-3")
    )
    assert {e.details["reason"] for e in events} == {"noise"}
    for schedule_id in ("bill-1", "bill-2", "bill-3"):
        with pytest.raises(NotFound):
            await api.ledger.executions_get(ids[schedule_id])
    result = await cli("dlq", "purge", "--all", "--yes", "-o", "json")
    assert json.loads(result.out) == {"purged": [ids["mail-1"]]}


async def test_dlq_purge_by_id_deletes_skips_the_rest_and_backfill_then_skips_its_fires(
    api: Api, cli: Cli
) -> None:
    ids = await dead_letters(api.ledger, LETTERS)
    result = await cli("dlq", "purge", ids["bill-1"], "nope:2026-01-01T00:00:00Z")
    assert (result.code, result.out) == (0, "purged 1 of 2 dead letters\n")
    assert "nope:2026-01-01T00:00:00Z is not a dead letter" in result.err
    with pytest.raises(NotFound):
        await api.ledger.executions_get(ids["bill-1"])
    # bill-1 fires every minute: its fires up to the purged one are not backfilled again.
    purged_at = ids["bill-1"].split(":", 1)[1]  # a minute ago
    api.clock.advance(120)
    now = await api.ledger.database_now()
    window = ("--from", format_utc(now - timedelta(minutes=5)), "--to", format_utc(now))
    result = await cli("schedule", "backfill", "bill-1", *window, "-o", "json")
    answer = json.loads(result.out)
    assert (answer["requested"], answer["skipped_purged"], answer["inserted"]) == (5, 3, 2)
    assert answer["purged_through"] == purged_at
    result = await cli("schedule", "backfill", "bill-1", *window)
    assert result.out.endswith(
        f"5 fires, 0 planned now, 2 had an execution already, 3 skipped: the schedule's "
        f"history through {purged_at} was purged (they may have run)\n"
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["purge"], "name the dead letters to purge"),
        (["purge", "--all", "--tenant", "a"], "give filters or --all, not both"),
        (["purge", "x:1", "--all"], "give execution ids, or filters or --all, not both"),
        (["purge", "--all", "--reason", " "], "reason must not be blank"),
        (["replay", "--all"], "--all needs --schedule, --task-type or --tenant"),
        (["replay"], "name the dead letters to replay"),
        (["replay", "x:1", "--all", "--tenant", "a"], "give execution ids or --all, not both"),
        (["replay", "x:1", "--tenant", "a"], "apply only with --all"),
        (["list", "--from", "yesterday"], "is not an RFC 3339 timestamp"),
        (["list", "--limit", "0"], "must be between 1 and 1000"),
        (["replay", "x:1", "--reason", " "], "reason must not be blank"),
        (["replay", "x:1", "--reason", "r" * 1001], "at most 1000 are kept"),
    ],
)
async def test_dlq_bad_input_is_one_line_and_exit_code_2(
    cli: Cli, monkeypatch: pytest.MonkeyPatch, args: list[str], message: str
) -> None:
    monkeypatch.setenv("CARILLON_URL", "http://127.0.0.1:1")
    monkeypatch.setenv("CARILLON_TOKEN", "crl_x_y")
    result = await cli("dlq", *args)
    assert (result.code, result.out) == (2, "")
    assert result.err.count("\n") == 1
    assert result.err.startswith("carillon")
    assert message in result.err
