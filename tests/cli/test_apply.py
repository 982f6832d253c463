"""`carillon apply` and `carillon diff` against the real API: YAML, TOML and JSON manifests,
files and directories, exit codes for CI, and every bad item named with its file and line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio

from engine.cli.manifest_files import load
from engine.errors import InvalidField
from engine.handlers import HandlerOptions
from tests.cli.conftest import Api
from tests.cli.harness import Cli
from tests.handlers.nats_server import NatsServer, add_stream, nats_server

__all__ = ["nats_server"]  # the fixture, imported for this module's tests

YAML = """\
manifest_set: billing
tenants:
  - tenant_id: acme
    weight: 2
schedules:
  - schedule_id: invoices
    tenant_id: acme
    cron_expr: "0 2 * * *"
    task_type: noop
    payload: {run: invoices}
  - schedule_id: reminders
    tenant_id: acme
    cron_expr: "*/30 * * * *"
    task_type: noop
"""
TOML = """\
manifest_set = "billing"

[[schedules]]
schedule_id = "ledger-close"
tenant_id = "acme"
cron_expr = "0 0 1 * *"
task_type = "noop"

[[schedules]]
schedule_id = "bad-toml"
tenant_id = "acme"
cron_expr = "0 0 31 2 *"
task_type = "noop"
"""
JSON_TEXT = json.dumps(
    {
        "manifest_set": "billing",
        "schedules": [
            {"schedule_id": "json-ok", "cron_expr": "@hourly", "task_type": "noop"},
            {"schedule_id": "json-bad", "cron_expr": "@hourly", "task_type": "noop",
             "timezone": "Nowhere/Town"},
        ],
    },
    indent=2,
)  # fmt: skip


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(text)
    return path


async def test_apply_then_diff_reports_no_drift(api: Api, cli: Cli, tmp_path: Path) -> None:
    manifest = write(tmp_path, "billing.yaml", YAML)
    drift = await cli("diff", "-f", str(manifest))
    assert drift.code == 1, drift.err
    assert "invoices" in drift.out
    assert "create" in drift.out
    assert await api.ledger.schedules_get_many(["invoices"]) == {}
    applied = await cli("apply", "-f", str(manifest))
    assert applied.code == 0, applied.err
    assert "applied 3 changes, 0 unchanged" in applied.err
    assert (await api.ledger.tenants_get("acme")).weight == 2
    again = await cli("apply", "-f", str(manifest))
    assert again.code == 0
    assert "applied 0 changes, 3 unchanged" in again.err
    clean = await cli("diff", "-f", str(manifest))
    assert clean.code == 0, clean.err


async def test_a_nats_streams_short_window_is_a_warning_with_its_file_and_line(
    api: Api, cli: Cli, tmp_path: Path, nats_server: NatsServer
) -> None:
    await trio.to_thread.run_sync(
        lambda: add_stream(nats_server.url, "TICKS", ["ticks.>"], duplicate_window=10)
    )
    api.context.handler_options = HandlerOptions(broker_allow_cidrs=("127.0.0.0/8",))
    manifest = write(
        tmp_path,
        "ticks.yaml",
        f"""\
manifest_set: ticks
task_types:
  - name: ticks
    kind: nats
    settings: {{url: "{nats_server.url}", subject: ticks.report}}
""",
    )

    drift = await cli("diff", "-f", str(manifest))
    applied = await cli("apply", "-f", str(manifest))

    assert (drift.code, applied.code) == (1, 0)
    for result in (drift, applied):
        [warning] = [line for line in result.err.splitlines() if line.startswith("warning:")]
        assert warning.startswith(f"warning: {manifest}:3 (task_types[0]): task type 'ticks'")
        assert "duplicate window (10 s) is shorter" in warning


async def test_an_edit_shows_as_one_update_in_the_diff(api: Api, cli: Cli, tmp_path: Path) -> None:
    manifest = write(tmp_path, "billing.yaml", YAML)
    assert (await cli("apply", "-f", str(manifest))).code == 0
    write(tmp_path, "billing.yaml", YAML.replace("run: invoices", "run: invoices-v2"))
    result = await cli("diff", "-f", str(manifest), "-o", "json")
    assert result.code == 1
    [change] = json.loads(result.out)["changes"]
    assert (change["name"], change["action"], change["fields"]) == (
        "invoices",
        "update",
        ["payload"],
    )
    assert change["source"].endswith("billing.yaml:6 (schedules[0])")


async def test_bad_items_in_every_format_are_named_with_file_and_line(
    api: Api, cli: Cli, tmp_path: Path
) -> None:
    write(tmp_path, "a.yaml", YAML.replace('"*/30 * * * *"', '"*/30 * * *"'))
    write(tmp_path, "b.toml", TOML)
    write(tmp_path, "c.json", JSON_TEXT)
    result = await cli("apply", "-f", str(tmp_path), "-o", "json")
    assert result.code == 2
    assert result.err.endswith(
        "carillon: error: 3 manifest item(s) are invalid; nothing was applied (3 listed above)\n"
    )
    assert len(result.err.splitlines()) == 4  # one line per bad item, then the summary
    assert "a.yaml:11 (schedules[1])" in result.err
    assert "b.toml:9 (schedules[3])" in result.err
    assert "c.json:9 (schedules[5])" in result.err
    assert await api.ledger.schedules_get_many(["invoices", "ledger-close", "json-ok"]) == {}
    diff = await cli("diff", "-f", str(tmp_path))
    assert diff.code == 2


async def test_every_bad_item_reaches_the_answer(api: Api, cli: Cli, tmp_path: Path) -> None:
    write(tmp_path, "c.json", JSON_TEXT)
    write(tmp_path, "b.toml", TOML)
    result = await cli("diff", "-f", str(tmp_path / "c.json"), "-f", str(tmp_path / "b.toml"))
    assert result.code == 2
    assert "c.json:9 (schedules[1])" in result.err
    assert "b.toml:9 (schedules[3])" in result.err


async def test_prune_deletes_the_sets_own_objects_only(api: Api, cli: Cli, tmp_path: Path) -> None:
    manifest = write(tmp_path, "billing.yaml", YAML)
    assert (await cli("apply", "-f", str(manifest))).code == 0
    write(tmp_path, "billing.yaml", YAML.split("  - schedule_id: reminders")[0])
    kept = await cli("apply", "-f", str(manifest))
    assert "applied 0 changes" in kept.err
    pruned = await cli("apply", "-f", str(manifest), "--prune")
    assert pruned.code == 0, pruned.err
    assert "reminders" in pruned.out
    assert "delete" in pruned.out
    assert sorted(await api.ledger.schedules_get_many(["invoices", "reminders"])) == ["invoices"]


async def test_unreadable_manifests_are_usage_errors(api: Api, cli: Cli, tmp_path: Path) -> None:
    broken = write(tmp_path, "broken.yaml", "schedules: [\n")
    result = await cli("apply", "-f", str(broken))
    assert result.code == 2
    assert "not valid YAML" in result.err
    unnamed = write(tmp_path, "unnamed.json", '{"schedules": []}')
    result = await cli("diff", "-f", str(unnamed))
    assert result.code == 2
    assert "no manifest set named" in result.err
    result = await cli("diff", "-f", str(unnamed), "--set", "billing")
    assert result.code == 0, result.err
    missing = await cli("apply", "-f", str(tmp_path / "absent.yaml"))
    assert missing.code == 2
    assert "no such file" in missing.err


def test_toml_items_outside_array_tables_are_named_by_index(tmp_path: Path) -> None:
    inline = 'manifest_set = "m"\nschedules = [{schedule_id = "a"}, {schedule_id = "b"}]\n'
    loaded = load([write(tmp_path, "inline.toml", inline)])
    sources = [item["source"] for item in loaded.items["schedules"]]
    assert sources == [
        f"{tmp_path}/inline.toml schedules[0]",
        f"{tmp_path}/inline.toml schedules[1]",
    ]


def test_yaml_and_json_items_carry_the_line_they_start_on(tmp_path: Path) -> None:
    yaml_text = "manifest_set: m\n\nschedules:\n\n  - schedule_id: a\n  -\n    schedule_id: b\n"
    loaded = load([write(tmp_path, "m.yaml", yaml_text)])
    assert [item["source"] for item in loaded.items["schedules"]] == [
        f"{tmp_path}/m.yaml:5",
        f"{tmp_path}/m.yaml:7",
    ]
    json_text = '{"manifest_set": "m",\n "tenants": [\n\n  {"tenant_id": "t"}, {"tenant_id": "u"}]}'
    loaded = load([write(tmp_path, "m.json", json_text)])
    assert [item["source"] for item in loaded.items["tenants"]] == [
        f"{tmp_path}/m.json:4",
        f"{tmp_path}/m.json:4",
    ]


def test_files_naming_two_sets_are_refused(tmp_path: Path) -> None:
    write(tmp_path, "a.yaml", "manifest_set: one\n")
    write(tmp_path, "b.json", '{"manifest_set": "two"}')
    with pytest.raises(InvalidField, match="differs from 'one'"):
        load([tmp_path])
