"""`carillon task-type` and `carillon tenant` against a fresh, migrated database."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator

import pytest
import trio

from engine.cli import main
from engine.ledger.base import SchedulesCreate, SchedulesDelete
from engine.ledger.postgres import open_postgres_ledger
from engine.model import HandlerKind, OverlapPolicy, Schedule, TaskType
from tests.ledger.backends import postgres_template_database

pytestmark = pytest.mark.postgres

SECRET = "whsec_" + base64.b64encode(b"s3cr3t-key-material-of-32-bytes!").decode()


@pytest.fixture
async def url(database_url: str, postgres_template: str) -> AsyncIterator[str]:
    async with postgres_template_database(database_url, postgres_template) as fresh:
        yield fresh


async def cli(
    capsys: pytest.CaptureFixture[str], url: str | None, *args: str
) -> tuple[int, str, str]:
    """Run ``carillon ARGS --database-url URL`` in-process (it runs its own trio loop, so in a
    worker thread); returns the exit code, stdout and stderr."""
    argv = [*args, "--database-url", url] if url is not None else list(args)
    code = await trio.to_thread.run_sync(main, argv)
    out, err = capsys.readouterr()
    return code, out, err


async def stored_task_type(url: str, name: str) -> TaskType:
    async with open_postgres_ledger(url) as ledger:
        return await ledger.task_types_get(name)


async def test_set_creates_then_replaces_a_webhook_and_never_prints_its_secret(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    hook = ["task-type", "set", "billing", "--kind", "webhook", "--url", "https://example.com/h"]
    code, out, err = await cli(capsys, url, *hook, "--secret", SECRET, "--max-concurrency", "4")
    assert (code, err) == (0, "")
    assert out.startswith("created task type 'billing' (version 1)\n")
    assert "  secret: ***\n" in out
    code, out, _ = await cli(capsys, url, *hook, "--secret", SECRET, "--timeout", "5")
    assert code == 0
    assert out.startswith("updated task type 'billing' (version 2)\n")
    assert "max_concurrency: none" in out  # set is the whole definition
    stored = await stored_task_type(url, "billing")
    assert stored.settings == {"url": "https://example.com/h", "secret": SECRET}
    assert (stored.timeout_s, stored.max_concurrency, stored.version) == (5.0, None, 2)
    for command in (["task-type", "show", "billing"], ["task-type", "list", "--json"]):
        code, out, _ = await cli(capsys, url, *command)
        assert code == 0
        assert SECRET not in out
        assert "***" in out
    [listed] = json.loads(out)
    assert listed["settings"] == {"secret": "***", "url": "https://example.com/h"}
    assert (listed["name"], listed["kind"], listed["version"]) == ("billing", "webhook", 2)


async def test_each_kind_stores_its_settings_and_the_limits(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    commands = [
        ["nap", "--kind", "noop", "--delay", "0.25"],
        ["backup", "--kind", "shell", "--argv", '["/usr/bin/backup", "--full"]',
         "--env", "MODE=full", "--env", "API_TOKEN=t0k3n"],
        ["encode", "--kind", "python", "--callable", "json:dumps", "--timeout", "2.5",
         "--max-concurrency", "3", "--max-concurrency-cluster", "30", "--max-attempts", "7",
         "--backoff-base", "0.5", "--backoff-max", "20", "--overlap", "buffer_one"],
    ]  # fmt: skip
    for command in commands:
        code, _, err = await cli(capsys, url, "task-type", "set", *command)
        assert (code, err) == (0, "")
    async with open_postgres_ledger(url) as ledger:
        nap, backup, encode = [await ledger.task_types_get(n) for n in ("nap", "backup", "encode")]
    assert (nap.kind, nap.settings) == (HandlerKind.NOOP, {"delay_s": 0.25})
    assert backup.settings == {
        "argv": ["/usr/bin/backup", "--full"],
        "env": {"MODE": "full", "API_TOKEN": "t0k3n"},
    }
    assert encode == TaskType(
        name="encode",
        kind=HandlerKind.PYTHON,
        settings={"callable": "json:dumps"},
        timeout_s=2.5,
        max_concurrency=3,
        max_concurrency_cluster=30,
        max_attempts=7,
        backoff_base_s=0.5,
        backoff_max_s=20.0,
        overlap=OverlapPolicy.BUFFER_ONE,
        updated_at=encode.updated_at,
        version=1,
    )
    code, out, _ = await cli(capsys, url, "task-type", "show", "backup")
    assert '  env: {"API_TOKEN": "***", "MODE": "full"}' in out
    code, out, _ = await cli(capsys, url, "task-type", "list")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == [
        "NAME", "KIND", "TIMEOUT_S", "MAX_CONC", "CLUSTER_CONC", "ATTEMPTS", "OVERLAP", "VER"
    ]  # fmt: skip
    assert [line.split()[0] for line in lines[1:]] == ["backup", "encode", "nap"]
    assert lines[2].split() == ["encode", "python", "2.5", "3", "30", "7", "buffer_one", "1"]


async def test_headers_are_stored_and_sensitive_ones_redacted(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = await cli(
        capsys, url, "task-type", "set", "hook", "--kind", "webhook",
        "--url", "https://example.com/h", "--header", "Authorization=Bearer abc",
        "--header", "X-Team=billing", "--skip-handler-check",
    )  # fmt: skip
    assert (code, err) == (0, "")
    assert "Bearer abc" not in out
    assert '  headers: {"Authorization": "***", "X-Team": "billing"}' in out
    stored = await stored_task_type(url, "hook")
    assert stored.settings["headers"] == {"Authorization": "Bearer abc", "X-Team": "billing"}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["set", "x", "--kind", "noop", "--url", "https://example.com"],
         "--url applies only to --kind webhook"),
        (["set", "x", "--kind", "webhook"], "--kind webhook needs --url"),
        (["set", "x", "--kind", "shell", "--argv", "backup --full"], "--argv must be a JSON list"),
        (["set", "x", "--kind", "shell", "--argv", "[]"], "--argv must be a non-empty JSON list"),
        (["set", "x", "--kind", "noop", "--timeout", "0"], "timeout_s must be a positive"),
        (["set", "x", "--kind", "noop", "--backoff-base", "9", "--backoff-max", "3"],
         "backoff_max_s"),
        (["set", "x", "--kind", "noop", "--max-attempts", "many"], "invalid int value"),
        (["set", "x", "--kind", "ftp"], "invalid choice"),
        (["set", "bad name", "--kind", "noop"], "task type name 'bad name' is invalid"),
        (["set", "x", "--kind", "webhook", "--url", "ftp://example.com"], "http:// or https://"),
        (["set", "x", "--kind", "webhook", "--url", "https://e.com", "--secret", "short"],
         "secret"),
        (["set", "x", "--kind", "python", "--callable", "no_such_module_xyz:run"],
         "cannot import"),
    ],
)  # fmt: skip
async def test_bad_input_exits_2_with_one_line_and_stores_nothing(
    url: str, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    code, out, err = await cli(capsys, url, "task-type", *args)
    assert code == 2
    assert out == ""
    assert len(err.splitlines()) == 1
    assert message in err
    assert "short" not in err  # a secret is never echoed
    code, out, _ = await cli(capsys, url, "task-type", "list", "--json")
    assert json.loads(out) == []


async def test_delete_refuses_a_task_type_in_use_and_then_deletes_it(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, _ = await cli(capsys, url, "task-type", "set", "report", "--kind", "noop")
    assert code == 0
    async with open_postgres_ledger(url) as ledger:
        await ledger.schedules_create(
            SchedulesCreate(
                [Schedule(schedule_id="weekly", tenant_id="acme", cron_expr="@weekly",
                          task_type="report")]
            )
        )  # fmt: skip
    code, out, err = await cli(capsys, url, "task-type", "delete", "report")
    assert (code, out) == (2, "")
    assert err == (
        "carillon: error: task type 'report' is still used by 1 schedule (weekly); delete them "
        "or move them to another task type first\n"
    )
    async with open_postgres_ledger(url) as ledger:
        await ledger.schedules_delete(SchedulesDelete("weekly"))
    code, out, err = await cli(capsys, url, "task-type", "delete", "report")
    assert (code, err) == (0, "")
    assert out == "deleted task type 'report' (it was at version 1)\n"
    code, out, err = await cli(capsys, url, "task-type", "show", "report")
    assert (code, out) == (1, "")
    assert err == "carillon: error: task type 'report' does not exist\n"


async def test_tenants_are_set_whole_and_listed(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = await cli(capsys, url, "tenant", "list")
    assert code == 0
    assert out.startswith("no tenant has settings of its own")
    code, out, _ = await cli(
        capsys, url, "tenant", "set", "acme", "--weight", "5", "--quota", "10", "--rate", "2.5",
        "--burst", "5",
    )  # fmt: skip
    assert code == 0
    assert out == "saved tenant 'acme' (version 1): weight 5, quota 10, rate 2.5/s, burst 5\n"
    code, out, _ = await cli(capsys, url, "tenant", "set", "acme", "--weight", "3")
    assert out == "saved tenant 'acme' (version 2): weight 3, quota none, rate none, burst none\n"
    await cli(capsys, url, "tenant", "set", "globex", "--quota", "2")
    code, out, _ = await cli(capsys, url, "tenant", "list")
    assert [line.split() for line in out.splitlines()] == [
        ["TENANT", "WEIGHT", "QUOTA", "RATE_PER_S", "BURST", "VER"],
        ["acme", "3", "-", "-", "-", "2"],
        ["globex", "1", "2", "-", "-", "1"],
    ]
    code, out, _ = await cli(capsys, url, "tenant", "list", "--json")
    assert [(t["tenant_id"], t["weight"]) for t in json.loads(out)] == [("acme", 3), ("globex", 1)]
    for bad, message in [
        (["--weight", "0"], "weight must be a whole number from 1 to 1000"),
        (["--weight", "1001"], "weight"),
        (["--burst", "3"], "a burst only applies with a rate"),
        (["--rate", "-1"], "rate_per_s"),
    ]:
        code, out, err = await cli(capsys, url, "tenant", "set", "acme", *bad)
        assert (code, out) == (2, "")
        assert len(err.splitlines()) == 1
        assert message in err


async def test_database_trouble_exits_1_with_one_line(
    database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # The session database exists but was never migrated.
    code, out, err = await cli(capsys, database_url, "task-type", "list")
    assert (code, out) == (1, "")
    assert len(err.splitlines()) == 1
    assert "carillon migrate" in err
    code, out, err = await cli(
        capsys, "postgresql://postgres@127.0.0.1:1/nowhere", "tenant", "list"
    )
    assert (code, out) == (1, "")
    assert len(err.splitlines()) == 1
    assert "unavailable" in err


async def test_without_an_action_the_usage_is_shown(capsys: pytest.CaptureFixture[str]) -> None:
    for command in ("task-type", "tenant"):
        code, out, err = await cli(capsys, None, command)
        assert (code, out) == (2, "")
        assert "ACTION" in err
