"""`carillon token create|list|revoke` on a real Postgres database, used against the API."""

from __future__ import annotations

import json
import re
import stat
from pathlib import Path

import pytest

from engine.api.auth import TOKEN_CACHE_TTL_S
from engine.ledger.params import AuditQuery
from tests.cli.conftest import Api
from tests.cli.harness import Cli

pytestmark = pytest.mark.postgres

TOKEN = re.compile(r"crl_[0-9a-f]{12}_[A-Za-z0-9_-]+")


@pytest.fixture(autouse=True)
def operator(monkeypatch: pytest.MonkeyPatch) -> str:
    """The CLI runs as ``alice`` on ``ops-1``; returns the actor it records."""
    monkeypatch.setattr("getpass.getuser", lambda: "alice")
    monkeypatch.setattr("socket.gethostname", lambda: "ops-1")
    return "cli:alice@ops-1"


async def test_a_created_token_works_once_printed_and_a_revoked_one_is_refused(
    pg_api: Api, database: str, cli: Cli
) -> None:
    db = ("--database-url", database)
    result = await cli("token", "create", "--admin", "--description", "ops laptop", *db)
    assert (result.code, result.err) == (0, "")
    first, second, third = result.out.splitlines()
    token_id = first.removeprefix("created token ").removesuffix(" (scope admin)")
    token = second.removeprefix("token: ")
    assert TOKEN.fullmatch(token)
    assert token.startswith(f"crl_{token_id}_")
    assert (
        third == "it is shown only this once: store it now (use it as --token or $CARILLON_TOKEN)"
    )
    result = await cli("schedule", "list", "--token", token)
    assert (result.code, result.out) == (0, "no schedules match\n")
    result = await cli("token", "list", *db)
    rows = [line.split() for line in result.out.splitlines()]
    assert rows[0] == ["TOKEN_ID", "SCOPE", "CREATED_AT", "REVOKED_AT", "DESCRIPTION"]
    [mine] = [row for row in rows if row[0] == token_id]
    assert (mine[1], mine[3], mine[4:]) == ("admin", "-", ["ops", "laptop"])
    assert token not in result.out
    result = await cli("token", "revoke", token_id, *db)
    assert result.code == 0
    assert result.out.startswith(f"revoked token {token_id} (scope admin) at ")
    assert result.out.endswith("; API nodes refuse it within 5 s\n")
    pg_api.clock.advance(TOKEN_CACHE_TTL_S)  # the API's cached lookup expires
    result = await cli("schedule", "list", "--token", token)
    assert (result.code, result.out) == (1, "")
    assert result.err.startswith("carillon: error: the token was revoked (pass --token")
    events = await pg_api.ledger.audit_list(AuditQuery(target=token_id))
    assert [(e.action, e.actor) for e in events] == [
        ("token.create", "cli:alice@ops-1"),
        ("token.revoke", "cli:alice@ops-1"),
    ]
    result = await cli("token", "list", "-o", "json", *db)
    [listed] = [t for t in json.loads(result.out) if t["token_id"] == token_id]
    assert listed["revoked_at"] is not None


async def test_a_tenant_token_is_confined_to_its_tenant(
    pg_api: Api, database: str, cli: Cli
) -> None:
    every_minute = ("--cron", "* * * * *", "--task-type", "noop")
    await cli("schedule", "add", "theirs", *every_minute, "--tenant", "globex")
    result = await cli("token", "create", "--tenant", "acme", "-o", "json",
                       "--database-url", database)  # fmt: skip
    created = json.loads(result.out)
    assert created["scope"] == "tenant:acme"
    token = created["token"]
    result = await cli("schedule", "add", "mine", *every_minute, "--token", token)
    assert result.code == 0
    result = await cli("schedule", "list", "--token", token)
    assert [line.split()[:2] for line in result.out.splitlines()[1:]] == [["mine", "acme"]]
    result = await cli("cluster", "--token", token)
    assert (result.code, result.err) == (1, "carillon: error: this route needs an admin token\n")


async def test_save_writes_a_0600_file_refuses_an_existing_one_and_force_replaces_it(
    pg_api: Api, database: str, cli: Cli, tmp_path: Path
) -> None:
    db = ("--database-url", database)
    path = tmp_path / "secrets" / "admin.token"
    result = await cli("token", "create", "--admin", "--save", str(path), *db)
    assert result.code == 0
    assert "crl_" not in result.out
    assert result.out.endswith(
        f"saved to {path} (mode 0600); use it with CARILLON_TOKEN_FILE={path}\n"
    )
    token = path.read_text().strip()
    assert TOKEN.fullmatch(token)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    result = await cli("schedule", "list", "--token-file", str(path))
    assert result.code == 0
    before = await pg_api.ledger.tokens_list()
    result = await cli("token", "create", "--admin", "--save", str(path), *db)
    assert (result.code, result.out) == (2, "")
    assert result.err == (
        f"carillon: error: {path} exists; pass --force to replace it (or choose another path)\n"
    )
    assert await pg_api.ledger.tokens_list() == before  # refused before any token was made
    result = await cli("token", "create", "--admin", "--save", str(path), "--force", "-o", "json",
                       *db)  # fmt: skip
    created = json.loads(result.out)
    assert created["saved_to"] == str(path)
    assert "token" not in created
    replaced = path.read_text().strip()
    assert replaced != token
    assert replaced.startswith(f"crl_{created['token_id']}_")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert sorted(p.name for p in path.parent.iterdir()) == ["admin.token"]  # no temp left


@pytest.mark.parametrize(
    ("args", "message", "code"),
    [
        (["create"], "one of the arguments --admin --tenant is required", 2),
        (["create", "--admin", "--tenant", "acme"], "not allowed with argument", 2),
        (["create", "--tenant", "bad id"], "tenant id 'bad id' is invalid", 2),
        (["create", "--admin", "--force"], "--force applies only with --save", 2),
        (["create", "--admin", "--description", "tab\there"], "printable characters", 2),
        (["revoke", "nope"], "nope", 1),
    ],
)
async def test_token_bad_input_and_unknown_tokens(
    database: str, cli: Cli, args: list[str], message: str, code: int
) -> None:
    result = await cli("token", *args, "--database-url", database)
    assert (result.code, result.out) == (code, "")
    assert result.err.count("\n") == 1
    assert message in result.err


async def test_save_into_a_path_that_cannot_be_created_touches_no_database(
    cli: Cli, tmp_path: Path
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    dead = "postgresql://postgres@127.0.0.1:1/nothing"  # never reached
    result = await cli("token", "create", "--admin", "--save", str(blocker / "token"),
                       "--database-url", dead)  # fmt: skip
    assert result.code == 2
    assert result.err.startswith(f"carillon: error: cannot create {blocker / 'token'}: ")
