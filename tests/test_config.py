"""Node configuration: validation, sources and precedence, and the ``carillon run`` command."""

from __future__ import annotations

import json
import logging
import math
import os
import re
import signal
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, cast

import pytest
import trio

from engine.cli import main
from engine.cli import run as run_command
from engine.cli.run import serve_node
from engine.cli.settings import SETTINGS, default_node_id, load_node_config
from engine.clock import Clock
from engine.config import LEASE_TTL_S_DEFAULT, LogFormat, LogLevel, NodeConfig
from engine.errors import ConfigError, LeaseLost
from engine.ledger.base import Ledger
from engine.ledger.database import DATABASE_URL_ENV, ResolvedDatabase
from engine.logs import LOGGER_NAMESPACE


@pytest.fixture(autouse=True)
def restore_carillon_logger() -> Iterator[None]:
    logger = logging.getLogger(LOGGER_NAMESPACE)
    handlers, level = list(logger.handlers), logger.level
    yield
    logger.handlers[:] = handlers
    logger.setLevel(level)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "carillon.toml"
    path.write_text(text)
    return path


def load(
    flags: dict[str, object] | None = None,
    env: dict[str, str] | None = None,
    toml: Path | None = None,
) -> NodeConfig:
    return load_node_config(flags or {}, env or {}, toml)


# --- NodeConfig validation -------------------------------------------------------------------


@pytest.mark.parametrize("ttl", [0.5, 601.0])
def test_node_config_rejects_lease_ttl_out_of_bounds(ttl: float) -> None:
    with pytest.raises(ConfigError, match=r"lease_ttl_s must be between 1 and 600 seconds"):
        NodeConfig(node_id="n1", lease_ttl_s=ttl, lease_safety_margin_s=0.1)


def test_node_config_rejects_a_margin_of_a_third_of_the_ttl_or_more() -> None:
    with pytest.raises(ConfigError, match=r"under a third of lease_ttl_s \(ttl 9.0, margin 3.0\)"):
        NodeConfig(node_id="n1", lease_ttl_s=9.0, lease_safety_margin_s=3.0)


@pytest.mark.parametrize("target", [0.0, -1.0, 86_401.0, math.nan])
def test_node_config_rejects_an_slo_target_that_is_not_within_a_day(target: float) -> None:
    with pytest.raises(ConfigError, match=r"slo_target_s must be more than 0 and at most 86400"):
        NodeConfig(node_id="n1", slo_target_s=target)


def test_node_config_takes_an_slo_target_of_up_to_a_day() -> None:
    assert NodeConfig(node_id="n1", slo_target_s=86_400).slo_target_s == 86_400
    assert NodeConfig(node_id="n1").slo_target_s == 60.0


def test_node_config_reports_every_problem_at_once() -> None:
    with pytest.raises(ConfigError) as caught:
        NodeConfig(node_id="has space", plan_batch_max=0, shutdown_timeout_s=0)
    assert str(caught.value).count(";") == 2
    assert "node_id" in str(caught.value)


# --- sources and precedence ------------------------------------------------------------------


def test_defaults_apply_when_nothing_is_set() -> None:
    config = load()
    assert config.lease_ttl_s == LEASE_TTL_S_DEFAULT
    assert config.database_url is None
    assert config.log_level is LogLevel.INFO


def test_flag_beats_env_beats_file_beats_default(tmp_path: Path) -> None:
    toml = write(tmp_path, '[node]\nlease_ttl_s = 30\nlookahead_s = 7\nregion = "file"\n')
    env = {"CARILLON_LEASE_TTL_S": "40", "CARILLON_LOOKAHEAD_S": "8"}
    config = load({"lease_ttl_s": 50.0, "lookahead_s": None}, env, toml)
    assert config.lease_ttl_s == 50.0  # flag
    assert config.lookahead_s == 8.0  # env
    assert config.region == "file"  # file
    assert config.shutdown_timeout_s == NodeConfig(node_id="x").shutdown_timeout_s  # default


def test_values_are_converted_to_the_field_types(tmp_path: Path) -> None:
    toml = write(tmp_path, '[node]\nlog_format = "json"\nlease_ttl_s = 20\n')
    env = {"CARILLON_PLAN_BATCH_MAX": "250", "CARILLON_LOG_LEVEL": "DEBUG"}
    config = load({"clock_probe_interval_s": "2.5"}, env, toml)
    assert config.plan_batch_max == 250
    assert config.log_level is LogLevel.DEBUG
    assert config.log_format is LogFormat.JSON
    assert config.lease_ttl_s == 20.0
    assert isinstance(config.lease_ttl_s, float)
    assert config.clock_probe_interval_s == 2.5


def test_metrics_settings_come_from_flags_env_and_file(tmp_path: Path) -> None:
    assert load().metrics_tenant_labels is False
    toml = write(tmp_path, "[node]\nslo_target_s = 30\nmetrics_tenant_labels = true\n")
    from_file = load(toml=toml)
    assert (from_file.slo_target_s, from_file.metrics_tenant_labels) == (30.0, True)
    env = {"CARILLON_SLO_TARGET_S": "45", "CARILLON_METRICS_TENANT_LABELS": "off"}
    from_env = load(env=env, toml=toml)
    assert (from_env.slo_target_s, from_env.metrics_tenant_labels) == (45.0, False)
    from_flags = load({"slo_target_s": "5", "metrics_tenant_labels": "yes"}, env, toml)
    assert (from_flags.slo_target_s, from_flags.metrics_tenant_labels) == (5.0, True)


def test_console_session_settings_come_from_flags_env_and_file(tmp_path: Path) -> None:
    default = load()
    assert (default.console_session_idle_s, default.console_session_lifetime_s) == (1800, 43200)
    assert (default.console_insecure_cookie, default.trusted_proxy_networks) == (False, ())
    toml = write(tmp_path, '[node]\ntrusted_proxies = "10.0.0.5, 10.1.0.0/16, ::1"\n')
    env = {"CARILLON_CONSOLE_SESSION_IDLE_S": "600"}
    flags = {"console_insecure_cookie": "true", "console_session_lifetime_s": "3600"}
    config = load(flags, env, toml)
    assert (config.console_session_idle_s, config.console_session_lifetime_s) == (600, 3600)
    assert config.console_insecure_cookie is True
    assert [str(n) for n in config.trusted_proxy_networks] == [
        "10.0.0.5/32",
        "10.1.0.0/16",
        "::1/128",
    ]


@pytest.mark.parametrize(
    ("settings", "problem"),
    [
        ({"console_session_idle_s": 59.0}, "console_session_idle_s must be at least 60"),
        (
            {"console_session_idle_s": 7200.0, "console_session_lifetime_s": 3600.0},
            "at most console_session_lifetime_s",
        ),
        ({"console_session_lifetime_s": 31 * 86400.0}, "at most 2592000 (30 days)"),
        ({"trusted_proxies": "10.0.0.5,proxy.internal"}, "'proxy.internal' is not an IP"),
        ({"trusted_proxies": "10.0.0.0/33"}, "'10.0.0.0/33' is not an IP"),
    ],
)
def test_node_config_rejects_impossible_console_settings(
    settings: dict[str, Any], problem: str
) -> None:
    with pytest.raises(ConfigError, match=re.escape(problem)):
        NodeConfig(node_id="n1", **settings)


@pytest.mark.usefixtures("no_database")
def test_run_rejects_an_slo_target_beyond_a_day_naming_the_flag(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["run", "--slo-target", "90000"]) == 1
    line = one_line_error(capsys.readouterr().err)
    assert "slo_target_s must be more than 0 and at most 86400 seconds" in line
    assert "(slo_target_s from --slo-target)" in line


def test_database_url_is_taken_from_the_environment_variable_the_resolver_reads() -> None:
    config = load(env={"CARILLON_DATABASE_URL": "postgresql://u:pw@db:5432/carillon"})
    assert config.database_url == "postgresql://u:pw@db:5432/carillon"


@pytest.mark.parametrize(
    ("variable", "value", "problem"),
    [
        ("CARILLON_LEASE_TTL_S", "abc", "is not a number"),
        ("CARILLON_LOOKAHEAD_S", "nan", "is not a finite number"),
        ("CARILLON_PLAN_BATCH_MAX", "1.5", "is not a whole number"),
        ("CARILLON_LOG_FORMAT", "xml", "is not one of human, json"),
        ("CARILLON_REGION", "", "must not be empty"),
    ],
)
def test_env_conversion_errors_name_the_variable(variable: str, value: str, problem: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load(env={variable: value})
    assert str(caught.value) == f"{variable}={value!r} {problem}"


def test_bad_database_url_error_names_the_source_and_hides_the_password() -> None:
    with pytest.raises(ConfigError) as caught:
        load(env={"CARILLON_DATABASE_URL": "mysql://u:secret@h/db"})
    assert str(caught.value).startswith("CARILLON_DATABASE_URL: malformed database URL")
    assert "secret" not in str(caught.value)


def test_validation_errors_name_where_the_offending_values_came_from(tmp_path: Path) -> None:
    toml = write(tmp_path, "[node]\nlease_safety_margin_s = 5\n")
    with pytest.raises(ConfigError) as caught:
        load(env={"CARILLON_LEASE_TTL_S": "9"}, toml=toml)
    assert str(caught.value).endswith(
        f"(lease_ttl_s from CARILLON_LEASE_TTL_S; lease_safety_margin_s from "
        f"{toml}:node.lease_safety_margin_s)"
    )


def test_file_number_written_as_a_string_is_rejected_with_a_hint(tmp_path: Path) -> None:
    toml = write(tmp_path, '[node]\nlease_ttl_s = "20"\n')
    with pytest.raises(ConfigError) as caught:
        load(toml=toml)
    assert str(caught.value) == (
        f"{toml}:node.lease_ttl_s='20' is not a number (write it without quotes)"
    )


def test_unknown_file_key_is_named_with_a_suggestion_and_the_known_keys(tmp_path: Path) -> None:
    toml = write(tmp_path, "[node]\nlease_tll_s = 20\n")
    with pytest.raises(ConfigError) as caught:
        load(toml=toml)
    message = str(caught.value)
    assert message.startswith(f"{toml}: unknown key node.lease_tll_s; did you mean lease_ttl_s?")
    assert all(setting.name in message for setting in SETTINGS)


def test_settings_outside_the_node_table_are_rejected(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"lease_ttl_s must be inside the \[node\] table"):
        load(toml=write(tmp_path, "lease_ttl_s = 20\n"))
    with pytest.raises(ConfigError, match=r"unknown key 'api'; settings go in a \[node\] table"):
        load(toml=write(tmp_path, "[api]\nport = 1\n"))


def test_malformed_file_is_reported_with_its_position(tmp_path: Path) -> None:
    toml = write(tmp_path, "[node]\nlease_ttl_s = \n")
    with pytest.raises(ConfigError, match=rf"config file {re.escape(str(toml))} is not valid TOML"):
        load(toml=toml)


def test_missing_file_is_reported() -> None:
    with pytest.raises(ConfigError, match=r"config file /nonexistent\.toml does not exist"):
        load(toml=Path("/nonexistent.toml"))


def test_default_node_ids_differ_between_calls_and_name_the_process() -> None:
    first, second = default_node_id(), default_node_id()
    assert first != second
    assert f"-{os.getpid()}-" in first
    assert load().node_id != load().node_id
    NodeConfig(node_id=first)  # valid as a node id


def test_every_setting_has_a_flag_an_env_var_and_help() -> None:
    flags = [setting.flag for setting in SETTINGS]
    assert len(set(flags)) == len(flags)
    assert {
        "--lease-ttl",
        "--lookahead",
        "--shutdown-timeout",
        "--node-id",
        "--slo-target",
        "--metrics-tenant-labels",
    } <= set(flags)
    assert all(setting.env_var == "CARILLON_" + setting.name.upper() for setting in SETTINGS)
    assert all(setting.help for setting in SETTINGS)


# --- the command line ------------------------------------------------------------------------


@pytest.fixture
def no_database(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> ResolvedDatabase:
        raise AssertionError("the database must not be resolved")

    monkeypatch.setattr(run_command, "resolve_database", refuse)


def one_line_error(err: str) -> str:
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1
    return lines[0]


@pytest.mark.usefixtures("no_database")
def test_run_rejects_a_malformed_flag_as_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--lease-ttl", "abc"]) == 2
    line = one_line_error(capsys.readouterr().err)
    assert "argument --lease-ttl: 'abc' is not a number" in line


@pytest.mark.usefixtures("no_database")
def test_run_reports_a_missing_config_file(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--config", "/nonexistent.toml"]) == 1
    line = one_line_error(capsys.readouterr().err)
    assert line == "carillon: error: config file /nonexistent.toml does not exist"


@pytest.mark.usefixtures("no_database")
def test_run_reports_a_bad_environment_value(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CARILLON_LEASE_TTL_S", "abc")
    assert main(["run"]) == 1
    line = one_line_error(capsys.readouterr().err)
    assert line == "carillon: error: CARILLON_LEASE_TTL_S='abc' is not a number"


def test_run_help_documents_the_environment_and_file_naming(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["run", "--help"]) == 0
    out = capsys.readouterr().out
    assert "CARILLON_LEASE_TTL_S" in out
    assert "[node]" in out


# --- the node's lifetime (fake ledger and node, real signals) -----------------------------------

DATABASE = ResolvedDatabase("postgresql://carillon:pw@db.example:5432/carillon", "env")


@asynccontextmanager
async def fake_ledger(url: str) -> AsyncIterator[Ledger]:
    yield cast(Ledger, object())


class FakeNode:
    """Stands in for engine.node.Node; its behaviour is chosen per test."""

    def __init__(
        self,
        *,
        fail_after_start: Exception | None = None,
        return_after_start: bool = False,
        shutdown_s: float = 0.0,
    ) -> None:
        self.fail_after_start = fail_after_start
        self.return_after_start = return_after_start
        self.shutdown_s = shutdown_s
        self.started = trio.Event()
        self.stopping = trio.Event()
        self.released = False

    def factory(self, config: NodeConfig, ledger: Ledger, clock: Clock, rng: Any) -> FakeNode:
        return self

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        self.started.set()
        try:
            if self.fail_after_start is not None:
                raise self.fail_after_start
            if not self.return_after_start:
                await trio.sleep_forever()
        finally:
            self.stopping.set()
            with trio.CancelScope(shield=True):
                await trio.sleep(self.shutdown_s)
                self.released = True


async def serve_until(node: FakeNode, *, signals: int = 0, timeout_s: float = 1.0) -> int:
    config = NodeConfig(node_id="node-a", region="eu", shutdown_timeout_s=timeout_s)
    codes: list[int] = []

    async def serve() -> None:
        codes.append(
            await serve_node(config, DATABASE, open_ledger=fake_ledger, make_node=node.factory)
        )

    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve)
        await node.started.wait()
        for _ in range(signals):
            signal.raise_signal(signal.SIGINT)
            await node.stopping.wait()
    return codes[0]


def test_run_wires_config_database_ledger_and_node_together(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    resolved: list[dict[str, str]] = []
    closed: list[bool] = []

    def resolve(env: dict[str, str]) -> ResolvedDatabase:
        resolved.append(dict(env))
        return ResolvedDatabase(env[DATABASE_URL_ENV], "env", release=lambda: closed.append(True))

    node = FakeNode(fail_after_start=LeaseLost("partition 3 lost"))
    monkeypatch.setattr(run_command, "resolve_database", resolve)
    monkeypatch.setattr(run_command, "_load_runtime", lambda: (fake_ledger, node.factory))
    url = "postgresql://carillon:pw@db.example/carillon"
    argv = ["run", "--database-url", url, "--node-id", "n1", "--log-format", "json"]
    assert main(argv) == 1
    assert resolved == [{DATABASE_URL_ENV: url}]
    assert closed == [True]
    assert node.released
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert [json.loads(line)["msg"] for line in err.splitlines()] == [
        "node ready",
        "node failed: partition 3 lost",
    ]


def messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name.startswith(LOGGER_NAMESPACE)]


async def test_a_signal_shuts_the_node_down_gracefully_and_exits_0(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER_NAMESPACE)
    node = FakeNode(shutdown_s=0.5)
    assert await serve_until(node, signals=2) == 0
    assert node.released
    assert messages(caplog) == [
        "node ready",
        "shutting down",
        "already shutting down; SIGKILL stops at once",
        "shutdown complete",
    ]
    ready = next(r for r in caplog.records if r.getMessage() == "node ready")
    assert ready.__dict__["node_id"] == "node-a"
    assert ready.__dict__["region"] == "eu"
    assert ready.__dict__["database"] == "configured"
    assert ready.__dict__["database_url"] == "postgresql://carillon:***@db.example:5432/carillon"


async def test_a_node_failing_with_an_operating_error_exits_1_without_a_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    node = FakeNode(fail_after_start=LeaseLost("partition 3 lost", partitions=(3,)))
    assert await serve_until(node) == 1
    failure = caplog.records[-1]
    assert failure.getMessage() == "node failed: partition 3 lost"
    assert failure.exc_info is None


async def test_a_node_crashing_with_a_bug_exits_1_and_logs_the_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    assert await serve_until(FakeNode(fail_after_start=KeyError("oops"))) == 1
    assert caplog.records[-1].getMessage() == "node crashed"
    assert caplog.records[-1].exc_info is not None


async def test_a_node_stopping_on_its_own_exits_1(caplog: pytest.LogCaptureFixture) -> None:
    assert await serve_until(FakeNode(return_after_start=True)) == 1
    assert caplog.records[-1].getMessage() == "the node stopped without being asked to"


async def test_a_shutdown_overrunning_its_timeout_is_reported(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    node = FakeNode(shutdown_s=60.0)
    assert await serve_until(node, signals=1, timeout_s=1.0) == 1
    assert caplog.records[-1].getMessage() == "the node did not finish shutting down within 3s"


def test_every_setting_has_help_text() -> None:
    assert [setting.name for setting in SETTINGS if not setting.help] == []


def test_an_empty_http_setting_turns_the_api_off_and_a_malformed_one_is_refused() -> None:
    http = next(setting for setting in SETTINGS if setting.name == "http")
    assert http.parse("") == ""
    assert load({"http": ""}).http == ""
    assert load({}).http == "127.0.0.1:8080"
    assert load({}, {"CARILLON_HTTP": "0.0.0.0:9000"}).http == "0.0.0.0:9000"
    with pytest.raises(ConfigError, match="HOST:PORT"):
        load({"http": "8080"})
    region = next(setting for setting in SETTINGS if setting.name == "region")
    with pytest.raises(ValueError, match="must not be empty"):
        region.parse("")
