"""`carillon dlq list|replay|audit` against a fresh, migrated database.

Dead letters are made through the ledger itself, as a node would: plan, claim and complete
with a fence.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import timedelta

import pytest
import trio

from engine.cli import main
from engine.cli.dlq import cli_actor
from engine.core.instants import format_utc
from engine.ledger.base import (
    AuditQuery,
    Completion,
    ExecutionsClaim,
    ExecutionsComplete,
    ExecutionsPlan,
    Fence,
    LeasesAcquire,
    Ledger,
    Outcome,
    PlannedExecution,
    SchedulesCreate,
    TaskTypesPut,
)
from engine.ledger.postgres import open_postgres_ledger
from engine.model import ExecutionStatus, HandlerKind, Schedule, TaskType
from tests.ledger.backends import PARTITIONS, postgres_template_database

pytestmark = pytest.mark.postgres

LETTERS = [  # schedule id, tenant, task type
    ("bill-1", "acme", "billing"),
    ("bill-2", "acme", "billing"),
    ("bill-3", "globex", "billing"),
    ("mail-1", "acme", "mailer"),
]


@pytest.fixture(autouse=True)
def operator(monkeypatch: pytest.MonkeyPatch) -> str:
    """The CLI runs as ``alice`` on ``ops-1``; returns the actor it records."""
    monkeypatch.setattr("getpass.getuser", lambda: "alice")
    monkeypatch.setattr("socket.gethostname", lambda: "ops-1")
    return "cli:alice@ops-1"


@pytest.fixture
async def url(database_url: str, postgres_template: str) -> AsyncIterator[str]:
    async with postgres_template_database(database_url, postgres_template) as fresh:
        yield fresh


async def cli(capsys: pytest.CaptureFixture[str], url: str, *args: str) -> tuple[int, str, str]:
    code = await trio.to_thread.run_sync(main, [*args, "--database-url", url])
    out, err = capsys.readouterr()
    return code, out, err


async def dead_letters(ledger: Ledger, letters: list[tuple[str, str, str]]) -> dict[str, str]:
    """Dead-letter one execution of each (schedule, tenant, task type); returns the execution
    id by schedule id. Each is planned a second apart, in list order."""
    for name in sorted({task_type for _, _, task_type in letters}):
        await ledger.task_types_put(TaskTypesPut(TaskType(name=name, kind=HandlerKind.NOOP)))
    created = await ledger.schedules_create(
        SchedulesCreate(
            [Schedule(schedule_id=s, tenant_id=t, cron_expr="* * * * *", task_type=k)
             for s, t, k in letters]
        )
    )  # fmt: skip
    leases = await ledger.leases_acquire(LeasesAcquire("dlq-test", list(range(PARTITIONS)), 60))
    fences = {lease.partition_id: Fence(lease.partition_id, "dlq-test", lease.fencing_token)
              for lease in leases}  # fmt: skip
    start = (await ledger.database_now()).replace(microsecond=0) - timedelta(minutes=1)
    ids: dict[str, str] = {}
    for n, schedule in enumerate(created):
        fence = fences[schedule.partition_id or 0]
        at = start + timedelta(seconds=n)
        planned = PlannedExecution(schedule.schedule_id, schedule.tenant_id, schedule.task_type, at)
        [eid] = (await ledger.executions_plan(ExecutionsPlan(fence, [planned], []))).inserted
        [claimed] = await ledger.executions_claim(ExecutionsClaim([fence], [eid], 30, "dlq-test"))
        completion = Completion(eid, claimed.attempt, Outcome.DEAD_LETTER, None, "http_404", "gone")
        await ledger.executions_complete(ExecutionsComplete([fence], [completion]))
        ids[schedule.schedule_id] = eid
    return ids


async def statuses(url: str, ids: list[str]) -> list[ExecutionStatus]:
    async with open_postgres_ledger(url) as ledger:
        return [(await ledger.executions_get(eid)).execution.status for eid in ids]


async def test_list_shows_dead_letters_filtered_by_tenant_task_type_and_since(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    async with open_postgres_ledger(url) as ledger:
        ids = await dead_letters(ledger, LETTERS)
        after = await ledger.database_now()
    code, out, err = await cli(capsys, url, "dlq", "list")
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0].split() == ["EXECUTION_ID", "TENANT", "TASK_TYPE", "ATTEMPT", "DEAD_SINCE",
                                "ERROR"]  # fmt: skip
    assert [line.split()[0] for line in lines[1:]] == [ids[s] for s, _, _ in LETTERS]
    assert lines[1].split()[1:4] == ["acme", "billing", "1"]
    assert lines[1].endswith("http_404 gone")
    code, out, _ = await cli(capsys, url, "dlq", "list", "--tenant", "acme", "--task-type",
                             "billing", "--json")  # fmt: skip
    assert code == 0
    listed = json.loads(out)
    assert [e["execution_id"] for e in listed] == [ids["bill-1"], ids["bill-2"]]
    assert {e["status"] for e in listed} == {"dead-letter"}
    code, out, _ = await cli(capsys, url, "dlq", "list", "--since", format_utc(after))
    assert (code, out) == (0, "no dead letters match\n")
    code, out, err = await cli(capsys, url, "dlq", "list", "--limit", "2")
    assert code == 0
    assert len(out.splitlines()) == 3
    assert "more than 2 dead letters match" in err


async def test_replay_by_id_requeues_under_the_same_id_and_names_what_it_skipped(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    async with open_postgres_ledger(url) as ledger:
        ids = await dead_letters(ledger, LETTERS)
    code, out, err = await cli(capsys, url, "dlq", "replay", ids["bill-1"], "nope:x")
    assert code == 0
    assert out == "replayed 1 of 2 dead letters\n"
    assert err == "carillon: nope:x is not a dead letter; skipped\n"
    assert await statuses(url, [ids["bill-1"], ids["bill-2"]]) == [
        ExecutionStatus.QUEUED,
        ExecutionStatus.DEAD_LETTER,
    ]
    async with open_postgres_ledger(url) as ledger:
        history = (await ledger.executions_get(ids["bill-1"])).attempts
    assert [(a.attempt, a.outcome, a.error_code) for a in history] == [
        (1, "dead-letter", "http_404")
    ]
    code, out, _ = await cli(capsys, url, "dlq", "replay", ids["bill-1"])  # again: harmless
    assert (code, out) == (0, "replayed 0 of 1 dead letters\n")
    async with open_postgres_ledger(url) as ledger:
        [event] = await ledger.audit_list(AuditQuery())  # only what was replayed is audited
    assert (event.actor, event.target, event.details) == (
        "cli:alice@ops-1",
        ids["bill-1"],
        {"reason": None, "attempt": 1, "error_code": "http_404"},
    )


async def test_replay_all_pages_through_every_match_of_its_filters(
    url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("engine.cli.dlq.PAGE_SIZE_MAX", 1)  # one dead letter per page
    async with open_postgres_ledger(url) as ledger:
        ids = await dead_letters(ledger, LETTERS)
    code, out, err = await cli(capsys, url, "dlq", "replay", "--all", "--task-type", "billing")
    assert (code, out, err) == (0, "replayed 3 dead letters\n", "")
    assert await statuses(url, [ids[s] for s, _, _ in LETTERS]) == [
        ExecutionStatus.QUEUED,
        ExecutionStatus.QUEUED,
        ExecutionStatus.QUEUED,
        ExecutionStatus.DEAD_LETTER,
    ]
    code, out, _ = await cli(capsys, url, "dlq", "replay", "--all", "--tenant", "acme")
    assert (code, out) == (0, "replayed 1 dead letter\n")


async def test_replays_record_who_and_why_and_audit_lists_them_oldest_first(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    async with open_postgres_ledger(url) as ledger:
        ids = await dead_letters(ledger, LETTERS)
    reason = "billing API fixed (INC-42)"
    code, out, _ = await cli(capsys, url, "dlq", "replay", ids["bill-2"], "--reason", reason)
    assert (code, out) == (0, "replayed 1 of 1 dead letters\n")  # output unchanged
    code, out, _ = await cli(
        capsys, url, "dlq", "replay", "--all", "--tenant", "globex", "--reason", "bulk"
    )
    assert (code, out) == (0, "replayed 1 dead letter\n")
    code, out, err = await cli(capsys, url, "dlq", "audit")
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0].split() == ["EVENT", "AT", "ACTOR", "EXECUTION_ID", "ATTEMPT", "ERROR",
                                "REASON"]  # fmt: skip
    assert len(lines) == 3
    first = lines[1].split()
    assert first[2:6] == ["cli:alice@ops-1", ids["bill-2"], "1", "http_404"]
    assert lines[1].endswith(reason)
    assert lines[2].split()[3] == ids["bill-3"]
    assert lines[2].endswith("bulk")
    code, out, _ = await cli(capsys, url, "dlq", "audit", "--execution", ids["bill-3"], "--json")
    assert code == 0
    [event] = json.loads(out)
    assert (event["actor"], event["action"], event["target"]) == (
        "cli:alice@ops-1",
        "dead_letter.replay",
        ids["bill-3"],
    )
    assert event["details"] == {"reason": "bulk", "attempt": 1, "error_code": "http_404"}
    code, out, err = await cli(capsys, url, "dlq", "audit", "--limit", "1")
    assert code == 0
    assert len(out.splitlines()) == 2
    assert "more than 1 replays recorded" in err
    code, out, _ = await cli(capsys, url, "dlq", "audit", "--execution", ids["mail-1"])
    assert (code, out) == (0, "no replays recorded for that execution\n")


def test_the_actor_is_the_os_user_at_the_host_or_unknown(monkeypatch: pytest.MonkeyPatch) -> None:
    assert cli_actor() == "cli:alice@ops-1"

    def no_user() -> str:
        raise OSError("no login name")

    monkeypatch.setattr("getpass.getuser", no_user)
    assert cli_actor() == "cli:unknown@ops-1"
    monkeypatch.setattr("socket.gethostname", lambda: "h" * 300)
    assert len(cli_actor()) == 200


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["replay", "--all"], "--all needs --task-type or --tenant"),
        (["replay"], "name the dead letters to replay"),
        (["replay", "x:1", "--all", "--tenant", "a"], "give execution ids or --all, not both"),
        (["replay", "x:1", "--tenant", "a"], "apply only with --all"),
        (["list", "--since", "yesterday"], "--since 'yesterday' is not an RFC 3339 timestamp"),
        (["list", "--since", "2026-03-08T07:00:00"], "has no UTC offset"),
        (["list", "--limit", "0"], "--limit must be between 1 and"),
        (["list", "--limit", "x"], "invalid int value"),
        (["replay", "x:1", "--reason", " "], "reason must not be blank"),
        (["replay", "x:1", "--reason", "r" * 1001], "at most 1000 are kept"),
        (["audit", "--limit", "0"], "--limit must be between 1 and"),
    ],
)
async def test_bad_input_is_one_line_and_exit_code_2(
    url: str, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    code, out, err = await cli(capsys, url, "dlq", *args)
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1
    assert err.startswith("carillon")
    assert message in err


async def test_an_unreachable_database_is_one_line_and_exit_code_1(
    capsys: pytest.CaptureFixture[str],
) -> None:
    dead = "postgresql://postgres@127.0.0.1:1/nothing"
    code = await trio.to_thread.run_sync(main, ["dlq", "list", "--database-url", dead])
    out, err = capsys.readouterr()
    assert code == 1
    assert out == ""
    assert err.count("\n") == 1
    assert err.startswith("carillon: error:")
