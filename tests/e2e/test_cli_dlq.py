"""`carillon dlq` on a fresh, migrated Postgres database: replays go through the API, the
audit trail is read from the database.

Dead letters are made through the ledger itself, as a node would: plan, claim and complete
with a fence (:func:`tests.cli.harness.dead_letters`).
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator

import pytest
import trio

from engine.cli import main
from engine.cli.database import cli_actor
from engine.ledger.postgres import open_postgres_ledger
from engine.model import ExecutionStatus
from tests.cli.harness import LETTERS, Cli, cli_runner, create_token, dead_letters, serving
from tests.ledger.backends import postgres_template_database

pytestmark = pytest.mark.postgres


@pytest.fixture(autouse=True)
def operator(monkeypatch: pytest.MonkeyPatch) -> str:
    """The CLI runs as ``alice`` on ``ops-1``; returns the actor it records."""
    monkeypatch.setattr("getpass.getuser", lambda: "alice")
    monkeypatch.setattr("socket.gethostname", lambda: "ops-1")
    for name in ("CARILLON_URL", "CARILLON_TOKEN", "CARILLON_TOKEN_FILE"):
        monkeypatch.delenv(name, raising=False)
    return "cli:alice@ops-1"


@pytest.fixture
async def url(database_url: str, postgres_template: str) -> AsyncIterator[str]:
    async with postgres_template_database(database_url, postgres_template) as fresh:
        yield fresh


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Cli:
    return cli_runner(capsys)


async def test_replays_through_the_api_are_audited_and_audit_reads_them_from_the_database(
    url: str, cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with open_postgres_ledger(url) as ledger:
        ids = await dead_letters(ledger, LETTERS)
        token = await create_token(ledger)
        async with serving(ledger, time.monotonic) as (api_url, _):
            monkeypatch.setenv("CARILLON_URL", api_url)
            monkeypatch.setenv("CARILLON_TOKEN", token)
            reason = "billing API fixed (INC-42)"
            result = await cli("dlq", "replay", ids["bill-2"], "--reason", reason)
            assert (result.code, result.out) == (0, "replayed 1 of 1 dead letters\n")
            result = await cli("dlq", "replay", "--all", "--tenant", "globex", "--reason", "bulk")
            assert (result.code, result.out) == (0, "replayed 1 dead letter\n")
        statuses = [(await ledger.executions_get(ids[s])).execution.status for s, _, _ in LETTERS]
    assert statuses == [
        ExecutionStatus.DEAD_LETTER,
        ExecutionStatus.QUEUED,
        ExecutionStatus.QUEUED,
        ExecutionStatus.DEAD_LETTER,
    ]
    token_id = token.split("_")[1]
    result = await cli("dlq", "audit", "--database-url", url)
    assert (result.code, result.err) == (0, "")
    lines = result.out.splitlines()
    assert lines[0].split() == ["EVENT", "AT", "ACTOR", "EXECUTION_ID", "ATTEMPT", "ERROR",
                                "REASON"]  # fmt: skip
    assert len(lines) == 3
    assert lines[1].split()[2:6] == [f"token:{token_id}", ids["bill-2"], "1", "http_404"]
    assert lines[1].endswith(reason)
    assert lines[2].split()[3] == ids["bill-3"]
    assert lines[2].endswith("bulk")
    result = await cli("dlq", "audit", "--execution", ids["bill-3"], "--json",
                       "--database-url", url)  # fmt: skip
    [event] = json.loads(result.out)
    assert (event["actor"], event["action"], event["target"]) == (
        f"token:{token_id}",
        "dead_letter.replay",
        ids["bill-3"],
    )
    assert event["details"] == {"reason": "bulk", "attempt": 1, "error_code": "http_404"}
    result = await cli("dlq", "audit", "--limit", "1", "--database-url", url)
    assert len(result.out.splitlines()) == 2
    assert "more than 1 replays recorded" in result.err
    result = await cli("dlq", "audit", "--execution", ids["mail-1"], "--database-url", url)
    assert (result.code, result.out) == (0, "no replays recorded for that execution\n")


def test_the_actor_is_the_os_user_at_the_host_or_unknown(monkeypatch: pytest.MonkeyPatch) -> None:
    assert cli_actor() == "cli:alice@ops-1"

    def no_user() -> str:
        raise OSError("no login name")

    monkeypatch.setattr("getpass.getuser", no_user)
    assert cli_actor() == "cli:unknown@ops-1"
    monkeypatch.setattr("socket.gethostname", lambda: "h" * 300)
    assert len(cli_actor()) == 200


async def test_audit_bad_input_is_exit_2_and_an_unreachable_database_exit_1(cli: Cli) -> None:
    dead = "postgresql://postgres@127.0.0.1:1/nothing"
    result = await cli("dlq", "audit", "--limit", "0", "--database-url", dead)
    assert (result.code, result.out) == (2, "")
    assert "--limit must be between 1 and" in result.err
    code = await trio.to_thread.run_sync(main, ["dlq", "audit", "--database-url", dead])
    assert code == 1
