"""`carillon import-crontab` against the real API: a realistic crontab, imported twice."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import msgspec
import pytest

from engine.ledger.params import SchedulesList
from tests.cli.conftest import Api
from tests.cli.harness import Cli

CRONTAB = """\
# m h  dom mon dow   command
SHELL=/bin/bash
PATH=/usr/local/bin:/usr/bin:/bin
MAILTO=ops@example.com

CRON_TZ=Europe/Paris
30 2 * * *      /usr/local/bin/backup --full > /var/log/backup.log 2>&1
*/15 * * * *    /usr/local/bin/poll-queue
0 9 * * MON-FRI echo "standup" | mail -s standup team@example.com

CRON_TZ=America/New_York
@daily          /usr/local/bin/rotate-logs
0 0 1 * *       /usr/local/bin/invoice --month-end%summary%totals
@reboot         /usr/local/bin/warm-cache
0 0 30 2 *      /usr/local/bin/never-runs
"""
IMPORTED = {  # line -> (cron expression, zone, command)
    7: ("30 2 * * *", "Europe/Paris", "/usr/local/bin/backup --full > /var/log/backup.log 2>&1"),
    8: ("*/15 * * * *", "Europe/Paris", "/usr/local/bin/poll-queue"),
    9: ("0 9 * * MON-FRI", "Europe/Paris", 'echo "standup" | mail -s standup team@example.com'),
    12: ("@daily", "America/New_York", "/usr/local/bin/rotate-logs"),
    13: ("0 0 1 * *", "America/New_York", "/usr/local/bin/invoice --month-end"),
}
REJECTED = {14: "@reboot runs a job when the machine boots", 15: "never"}
ENV = {"SHELL": "/bin/bash", "PATH": "/usr/local/bin:/usr/bin:/bin", "MAILTO": "ops@example.com"}
TARGET = ("--tenant", "acme", "--task-type", "noop")


@pytest.fixture
def crontab(tmp_path: Path) -> Path:
    path = tmp_path / "crontab"
    path.write_text(CRONTAB)
    return path


def rows(out: str) -> dict[int, list[str]]:
    """The result table's rows by line number: [schedule id, result]."""
    table: dict[int, list[str]] = {}
    for line in out.splitlines():
        words = line.split()
        if len(words) > 2 and words[0].isdigit() and words[1].startswith(("crontab-", "tokyo-")):
            table[int(words[0])] = words[1:3]
    return table


async def test_a_crontab_imports_once_and_a_second_import_changes_nothing(
    api: Api, cli: Cli, crontab: Path
) -> None:
    result = await cli("import-crontab", str(crontab), *TARGET)
    assert result.code == 1  # two lines were rejected
    assert result.err == ""
    table = rows(result.out)
    assert sorted(table) == sorted(IMPORTED)
    assert {outcome for _, outcome in table.values()} == {"created"}
    assert "rejected lines:\n  line 14: @reboot /usr/local/bin/warm-cache\n" in result.out
    for line, reason in REJECTED.items():
        assert f"  line {line}: " in result.out
        assert reason in result.out
    assert result.out.endswith("5 created, 0 updated, 0 unchanged, 0 failed; 2 lines rejected\n")
    stored = {s.schedule_id: s for s in (await api.ledger.schedules_list(SchedulesList())).items}
    assert sorted(stored) == sorted(schedule_id for schedule_id, _ in table.values())
    for line, (cron_expr, zone, command) in IMPORTED.items():
        schedule = stored[table[line][0]]
        assert schedule.schedule_id.startswith("crontab-")
        assert (schedule.tenant_id, schedule.task_type) == ("acme", "noop")
        assert (schedule.cron_expr, schedule.timezone) == (cron_expr, zone)
        assert (schedule.payload["command"], schedule.payload["env"]) == (command, ENV)
    assert stored[table[13][0]].payload["stdin"] == "summary\ntotals\n"

    result = await cli("import-crontab", str(crontab), *TARGET)
    assert result.code == 1
    assert {outcome for _, outcome in rows(result.out).values()} == {"unchanged"}
    assert result.out.endswith("0 created, 0 updated, 5 unchanged, 0 failed; 2 lines rejected\n")
    again = {s.schedule_id: s for s in (await api.ledger.schedules_list(SchedulesList())).items}
    assert again == stored  # not even a version moved


async def test_a_changed_environment_updates_in_place_and_keeps_a_pause(
    api: Api, cli: Cli, crontab: Path
) -> None:
    result = await cli("import-crontab", str(crontab), *TARGET)
    backup_id = rows(result.out)[7][0]
    await cli("schedule", "pause", backup_id)
    crontab.write_text(CRONTAB.replace("MAILTO=ops@example.com", "MAILTO=oncall@example.com"))
    result = await cli("import-crontab", str(crontab), *TARGET, "-o", "json")
    assert result.code == 1
    report = json.loads(result.out)
    assert report["dry_run"] is False
    assert {e["result"] for e in report["entries"]} == {"updated"}
    assert report["entries"][0]["schedule_id"] == backup_id  # the same ids
    assert [r["line_no"] for r in report["rejected"]] == [14, 15]
    assert report["rejected"][0]["reason"].startswith("@reboot")
    backup = await api.ledger.schedules_get(backup_id)
    assert backup.payload["env"]["MAILTO"] == "oncall@example.com"
    assert backup.enabled is False  # the import changed only what the crontab says


async def test_dry_run_parses_and_reports_without_a_token_or_an_api(
    api: Api, cli: Cli, crontab: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CARILLON_TOKEN")
    monkeypatch.setenv("CARILLON_URL", "http://127.0.0.1:1")
    result = await cli("import-crontab", str(crontab), *TARGET, "--dry-run")
    assert result.code == 1
    assert {outcome for _, outcome in rows(result.out).values()} == {"parsed"}
    assert result.out.endswith(
        "dry run: 5 lines would be imported, 2 lines rejected; nothing was sent\n"
    )
    assert (await api.ledger.schedules_list(SchedulesList())).items == []
    result = await cli("import-crontab", str(crontab), *TARGET, "--dry-run", "-o", "json")
    assert json.loads(result.out)["dry_run"] is True


async def test_standard_input_with_every_line_converted_exits_0(
    api: Api, cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = "CRON_TZ=Asia/Tokyo\n@hourly /bin/ping\n15 3 * * SUN /bin/weekly\n"
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(text.encode())))
    result = await cli("import-crontab", "-", *TARGET, "--id-prefix", "tokyo-", "--tz", "UTC")
    assert (result.code, result.err) == (0, "")
    assert result.out.endswith("2 created, 0 updated, 0 unchanged, 0 failed; 0 lines rejected\n")
    assert "rejected" not in result.out.splitlines()[0]
    schedules = (await api.ledger.schedules_list(SchedulesList())).items
    assert [(s.schedule_id[:6], s.timezone) for s in schedules] == [
        ("tokyo-", "Asia/Tokyo"),
        ("tokyo-", "Asia/Tokyo"),
    ]


async def test_entries_the_api_refuses_are_reported_and_the_others_imported(
    api: Api, cli: Cli, tmp_path: Path
) -> None:
    path = tmp_path / "crontab"
    path.write_text("@hourly /bin/a\n@daily /bin/b\n")
    result = await cli("import-crontab", str(path), "--tenant", "acme", "--task-type", "nope")
    assert result.code == 1
    assert {outcome for _, outcome in rows(result.out).values()} == {"failed"}
    assert "not written:\n  line 1 (crontab-" in result.out
    assert "nope" in result.out
    result = await cli("import-crontab", str(path), *TARGET)
    assert result.code == 0
    result = await cli("import-crontab", str(path), "--tenant", "globex", "--task-type", "noop")
    assert result.code == 1
    assert "belongs to tenant 'acme'; import with another --id-prefix" in result.out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["missing-file"], "cannot read missing-file: No such file or directory"),
        (["{crontab}", "--tz", "Mars/Olympus"], "Mars/Olympus"),
        (["{crontab}", "--id-prefix", "bad prefix"], "id prefix 'bad prefix' cannot start"),
        (["{crontab}", "--tenant", "bad tenant"], "tenant id 'bad tenant' is invalid"),
    ],
)
async def test_bad_input_is_exit_2(cli: Cli, crontab: Path, args: list[str], message: str) -> None:
    argv = [arg.format(crontab=crontab) for arg in args]
    result = await cli("import-crontab", *TARGET, *argv, "--dry-run")
    assert (result.code, result.out) == (2, "")
    assert result.err.count("\n") == 1
    assert message in result.err


async def test_an_entry_whose_payload_is_at_the_limit_in_non_ascii_text_imports(
    api: Api, cli: Cli, tmp_path: Path
) -> None:
    """The parser admits a payload up to 64 KiB of UTF-8; the CLI escapes non-ASCII text
    (three times the bytes for ``é``), and the API's body limit must still take it."""
    env = "".join(f"GREETING_{n}={'é' * 4000}\n" for n in range(8))
    path = tmp_path / "crontab"
    path.write_text(env + "0 4 * * * /usr/local/bin/greet\n")
    result = await cli("import-crontab", str(path), *TARGET)
    assert (result.code, result.err) == (0, ""), result.out
    assert result.out.endswith("1 created, 0 updated, 0 unchanged, 0 failed; 0 lines rejected\n")
    [schedule] = (await api.ledger.schedules_list(SchedulesList())).items
    assert len(msgspec.json.encode(schedule.payload)) > 64_000
