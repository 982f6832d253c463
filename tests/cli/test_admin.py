"""`carillon task-type`, `tenant`, `cluster` and `forecast` against the real API."""

from __future__ import annotations

import base64
import json

import pytest
import trio

from engine.core.redaction import fingerprint
from engine.handlers import HandlerOptions
from engine.ledger.params import LeasesAcquire, SchedulesCreate, SchedulesDelete
from engine.model import HandlerKind, OverlapPolicy, Schedule, TaskType
from tests.cli.conftest import Api
from tests.cli.harness import Cli
from tests.handlers.nats_server import NatsServer, add_stream, nats_server

__all__ = ["nats_server"]  # the fixture, imported for this module's tests

SECRET = "whsec_" + base64.b64encode(b"s3cr3t-key-material-of-32-bytes!").decode()


async def test_task_type_set_creates_then_replaces_a_webhook_and_never_prints_its_secret(
    api: Api, cli: Cli
) -> None:
    hook = ["task-type", "set", "billing", "--kind", "webhook", "--url", "https://example.com/h"]
    result = await cli(*hook, "--secret", SECRET, "--max-concurrency", "4")
    assert (result.code, result.err) == (0, "")
    assert result.out.startswith("created task type 'billing' (version 1)\n")
    assert f"  secret: {fingerprint(SECRET)}\n" in result.out
    result = await cli(*hook, "--secret", SECRET, "--timeout", "5")
    assert result.out.startswith("updated task type 'billing' (version 2)\n")
    assert "max_concurrency: none" in result.out  # set is the whole definition
    stored = await api.ledger.task_types_get("billing")
    assert stored.settings == {"url": "https://example.com/h", "secret": SECRET}
    assert (stored.timeout_s, stored.max_concurrency, stored.version) == (5.0, None, 2)
    for command in (["show", "billing"], ["show", "billing", "-o", "json"], ["list", "-o", "json"]):
        result = await cli("task-type", *command)
        assert result.code == 0
        assert SECRET not in result.out
        assert fingerprint(SECRET) in result.out
    listed = {t["name"]: t for t in json.loads(result.out)}
    assert listed["billing"]["settings"] == {
        "secret": fingerprint(SECRET),
        "url": "https://example.com/h",
    }
    assert (listed["billing"]["kind"], listed["billing"]["version"]) == ("webhook", 2)


async def test_task_type_kinds_store_their_settings_and_the_limits(api: Api, cli: Cli) -> None:
    commands = [
        ["nap", "--kind", "noop", "--delay", "0.25"],
        ["backup", "--kind", "shell", "--argv", '["/usr/bin/backup", "--full"]',
         "--env", "MODE=full", "--env", "API_TOKEN=t0k3n"],
        ["encode", "--kind", "python", "--callable", "json:dumps", "--timeout", "2.5",
         "--max-concurrency", "3", "--max-concurrency-cluster", "30", "--max-attempts", "7",
         "--backoff-base", "0.5", "--backoff-max", "20", "--overlap", "buffer_one"],
    ]  # fmt: skip
    for command in commands:
        result = await cli("task-type", "set", *command)
        assert (result.code, result.err) == (0, "")
    nap, backup, encode = [await api.ledger.task_types_get(n) for n in ("nap", "backup", "encode")]
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
        allowed_tenants=("default",),  # not given: the default tenant only
        updated_at=encode.updated_at,
        version=1,
    )
    result = await cli("task-type", "show", "backup")
    shown = {"API_TOKEN": fingerprint("t0k3n"), "MODE": fingerprint("full")}
    assert f"  env: {json.dumps(shown)}" in result.out  # every value of env is a secret
    result = await cli("task-type", "list")
    lines = result.out.splitlines()
    assert lines[0].split() == [
        "NAME", "KIND", "TIMEOUT_S", "MAX_CONC", "CLUSTER_CONC", "ATTEMPTS", "OVERLAP", "VER",
        "TENANTS",
    ]  # fmt: skip
    assert [line.split()[0] for line in lines[1:]] == ["backup", "encode", "nap", "noop"]
    assert lines[2].split() == [
        "encode", "python", "2.5", "3", "30", "7", "buffer_one", "1", "default"
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["set", "x", "--kind", "noop", "--url", "https://example.com"],
         "--url applies only to --kind webhook"),
        (["set", "x", "--kind", "webhook"], "--kind webhook needs --url"),
        (["set", "x", "--kind", "shell", "--argv", "backup --full"], "--argv must be a JSON list"),
        (["set", "x", "--kind", "noop", "--timeout", "0"], "timeout_s must be a positive"),
        (["set", "x", "--kind", "noop", "--max-attempts", "many"], "invalid int value"),
        (["set", "x", "--kind", "ftp"], "invalid choice"),
        (["set", "bad name", "--kind", "noop"], "task type 'bad name' is invalid"),
        (["set", "x", "--kind", "webhook", "--url", "https://e.com", "--secret", "short"],
         "secret"),
        (["set", "x", "--kind", "python", "--callable", "no_such_module_xyz.run"],
         "must look like 'package.module:function'"),
        (["set", "x", "--kind", "shell", "--argv", '["true"]', "--allow", "*"],
         "granted to tenants by name only"),
        (["set", "x", "--kind", "noop", "--tenant", "acme", "--allow", "acme"],
         "not allowed with argument"),
        (["set", "x", "--kind", "noop", "--stream", "s"],
         "--stream applies only to --kind redis or nats"),
        (["set", "x", "--kind", "redis", "--url", "redis://h/0", "--subject", "s"],
         "--subject applies only to --kind nats"),
        (["set", "x", "--kind", "nats", "--url", "nats://h", "--subject", "a.*"], "wildcards"),
        (["set", "x", "--kind", "redis", "--url", "redis://10.0.0.5/0"], "stream"),
        (["set", "x", "--kind", "nats", "--url", "nats://h", "--subject", "s", "--exchange", "x"],
         "--exchange applies only to --kind rabbitmq"),
        (["set", "x", "--kind", "rabbitmq", "--url", "amqp://h", "--exchange", "a b",
          "--routing-key", "k"], "exchange must be 0-255 letters"),
        (["set", "x", "--kind", "rabbitmq", "--url", "amqp://h"], "routing_key"),
        (["set", "x", "--kind", "redis", "--url", "redis://10.0.0.5/0", "--stream", "s",
          "--dedup-ttl", "60", "--max-attempts", "3"],
         "less than this task type's worst retry horizon"),
    ],
)  # fmt: skip
async def test_task_type_bad_input_exits_2_with_one_line_and_stores_nothing(
    api: Api, cli: Cli, args: list[str], message: str
) -> None:
    result = await cli("task-type", *args)
    assert (result.code, result.out) == (2, "")
    assert len(result.err.splitlines()) == 1
    assert message in result.err
    assert "short" not in result.err  # a secret is never echoed
    assert [t.name for t in await api.ledger.task_types_list()] == ["noop"]


async def test_a_redis_task_type_is_set_and_its_urls_credentials_never_printed(
    api: Api, cli: Cli
) -> None:
    url = "redis://app:pw-Hunter2@10.0.0.5:6379/0"
    result = await cli(
        "task-type", "set", "ticks", "--kind", "redis", "--url", url, "--stream", "ticks",
        "--maxlen", "1000", "--dedup-ttl", "7200",
    )  # fmt: skip
    assert (result.code, result.err) == (0, "")
    stored = await api.ledger.task_types_get("ticks")
    assert (stored.kind, stored.settings) == (
        HandlerKind.REDIS,
        {"url": url, "stream": "ticks", "maxlen": 1000, "dedup_ttl_s": 7200},
    )
    for command in (["list"], ["list", "-o", "json"], ["show", "ticks", "-o", "json"]):
        shown = await cli("task-type", *command)
        assert shown.code == 0
        assert "pw-Hunter2" not in shown.out
    shown = await cli("task-type", "show", "ticks")
    assert f"url: redis://{fingerprint('app:pw-Hunter2')}@10.0.0.5:6379/0" in shown.out
    assert "pw-Hunter2" not in shown.out


async def test_a_nats_task_type_is_set_with_its_subject_and_expected_stream(
    api: Api, cli: Cli
) -> None:
    result = await cli(
        "task-type", "set", "ticks", "--kind", "nats", "--url", "nats://tok-3n@10.0.0.5:4222",
        "--subject", "ticks.report", "--stream", "TICKS",
    )  # fmt: skip
    assert result.code == 0
    # The API does not look at an address the node may not publish to (private, here).
    assert result.err.startswith(
        "warning: task type 'ticks' publishes to NATS stream 'TICKS', whose duplicate window "
        "could not be read ("
    )
    assert "--broker-allow-cidrs" in result.err
    assert "tok-3n" not in result.out + result.err
    stored = await api.ledger.task_types_get("ticks")
    assert (stored.kind, stored.settings) == (
        HandlerKind.NATS,
        {"url": "nats://tok-3n@10.0.0.5:4222", "subject": "ticks.report", "stream": "TICKS"},
    )


async def test_a_nats_streams_short_duplicate_window_is_a_warning_and_the_exit_code_0(
    api: Api, cli: Cli, nats_server: NatsServer
) -> None:
    await trio.to_thread.run_sync(
        lambda: add_stream(nats_server.url, "TICKS", ["ticks.>"], duplicate_window=10)
    )
    api.context.handler_options = HandlerOptions(broker_allow_cidrs=("127.0.0.0/8",))
    ticks = ["task-type", "set", "ticks", "--kind", "nats", "--url", nats_server.url,
             "--subject", "ticks.report"]  # fmt: skip

    result = await cli(*ticks)
    as_json = await cli(*ticks, "-o", "json")

    assert result.code == as_json.code == 0
    assert result.out.startswith("created task type 'ticks' (version 1)\n")
    [line] = result.err.splitlines()
    assert line.startswith(
        "warning: task type 'ticks' publishes to NATS stream 'TICKS', whose duplicate window "
        "(10 s) is shorter than the task type's worst retry horizon (518 s)"
    )
    assert as_json.err == result.err  # stdout keeps only the answer
    assert json.loads(as_json.out)["warnings"][0]["code"] == "nats_duplicate_window_short"


async def test_a_rabbitmq_task_type_is_set_and_its_credentials_never_printed(
    api: Api, cli: Cli
) -> None:
    url = "amqp://app:pw-Hunter2@10.0.0.5:5672/billing"
    result = await cli(
        "task-type", "set", "ticks", "--kind", "rabbitmq", "--url", url, "--exchange", "ticks",
        "--routing-key", "report.daily", "--no-mandatory", "--header", "Authorization=Bearer-zz9",
        "--header", "team=billing",
    )  # fmt: skip
    assert (result.code, result.err) == (0, "")
    stored = await api.ledger.task_types_get("ticks")
    assert (stored.kind, stored.settings) == (
        HandlerKind.RABBITMQ,
        {
            "url": url,
            "exchange": "ticks",
            "routing_key": "report.daily",
            "mandatory": False,
            "headers": {"Authorization": "Bearer-zz9", "team": "billing"},
        },
    )
    for command in (["list"], ["list", "-o", "json"], ["show", "ticks", "-o", "json"]):
        shown = await cli("task-type", *command)
        assert shown.code == 0
        assert "pw-Hunter2" not in shown.out
        assert "Bearer-zz9" not in shown.out
    shown = await cli("task-type", "show", "ticks", "-o", "json")
    assert f"amqp://{fingerprint('app:pw-Hunter2')}@10.0.0.5:5672/billing" in shown.out
    assert "billing" in shown.out


async def test_task_type_owner_and_grants_decide_which_tenants_may_use_it(
    api: Api, cli: Cli
) -> None:
    result = await cli("task-type", "set", "mine", "--kind", "noop", "--tenant", "acme")
    assert (result.code, result.err) == (0, "")
    assert "used by: tenant acme (its owner) only\n" in result.out
    result = await cli(
        "task-type", "set", "hook", "--kind", "webhook", "--url", "https://example.com/h",
        "--allow", "globex", "--allow", "acme",
    )  # fmt: skip
    assert "used by: acme, globex\n" in result.out
    hook = await api.ledger.task_types_get("hook")
    assert (hook.tenant_id, hook.allowed_tenants) == (None, ("acme", "globex"))
    result = await cli("task-type", "set", "any", "--kind", "noop", "--allow", "*")
    assert "used by: every tenant\n" in result.out
    listed = (await cli("task-type", "list")).out.splitlines()
    assert [line.split()[-1] for line in listed[1:]] == ["*", "acme,globex", "acme(owner)", "*"]


async def test_task_type_delete_refuses_one_in_use_then_deletes_it(api: Api, cli: Cli) -> None:
    await cli("task-type", "set", "report", "--kind", "noop", "--allow", "acme")
    weekly = Schedule(schedule_id="weekly", tenant_id="acme", cron_expr="@weekly",
                      task_type="report")  # fmt: skip
    await api.ledger.schedules_create(SchedulesCreate([weekly]))
    result = await cli("task-type", "delete", "report")
    assert (result.code, result.out) == (1, "")  # refused by the state, not the command line
    assert result.err == (
        "carillon: error: task type 'report' is still used by 1 schedule (weekly); delete them "
        "or move them to another task type first\n"
    )
    await api.ledger.schedules_delete(SchedulesDelete("weekly"))
    result = await cli("task-type", "delete", "report")
    assert (result.code, result.out, result.err) == (0, "deleted task type 'report'\n", "")
    result = await cli("task-type", "show", "report")
    assert (result.code, result.err) == (1, "carillon: error: task type 'report' does not exist\n")


async def test_in_task_type_set_url_is_the_webhooks_and_api_url_the_apis(
    api: Api, cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CARILLON_URL", "http://127.0.0.1:1")  # overridden by --api-url
    result = await cli("task-type", "set", "hook", "--kind", "webhook", "--url",
                       "https://example.com/h", "--api-url", api.url)  # fmt: skip
    assert (result.code, result.err) == (0, "")
    assert (await api.ledger.task_types_get("hook")).settings == {"url": "https://example.com/h"}
    result = await cli("task-type", "show", "hook", "--url", api.url)
    assert "  url: https://example.com/h\n" in result.out


async def test_task_types_need_an_admin_token(
    api: Api, cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CARILLON_TOKEN", await api.token(tenant="acme"))
    result = await cli("task-type", "list")
    assert (result.code, result.err) == (1, "carillon: error: this route needs an admin token\n")


async def test_tenants_are_set_whole_shown_and_listed(api: Api, cli: Cli) -> None:
    result = await cli("tenant", "list")
    assert result.out.startswith("no tenant has settings of its own")
    result = await cli("tenant", "show", "acme")
    assert result.out == (
        "tenant 'acme' (defaults, never set): weight 1, quota none, rate none, burst none, "
        "schedules max none; owns 0 schedules\n"
    )
    result = await cli("tenant", "set", "acme", "--weight", "5", "--quota", "10", "--rate",
                       "2.5", "--burst", "5", "--schedules-max", "100")  # fmt: skip
    assert result.out == (
        "saved tenant 'acme' (version 1): weight 5, quota 10, rate 2.5/s, burst 5, schedules "
        "max 100; owns 0 schedules\n"
    )
    result = await cli("tenant", "set", "acme", "--weight", "3")
    assert result.out.startswith("saved tenant 'acme' (version 2): weight 3, quota none,")
    await cli("tenant", "set", "globex", "--quota", "2")
    result = await cli("tenant", "list")
    assert [line.split() for line in result.out.splitlines()] == [
        ["TENANT", "WEIGHT", "QUOTA", "RATE_PER_S", "BURST", "SCHEDULES_MAX", "VER"],
        ["acme", "3", "-", "-", "-", "-", "2"],
        ["globex", "1", "2", "-", "-", "-", "1"],
    ]
    result = await cli("tenant", "list", "-o", "json")
    assert [(t["tenant_id"], t["weight"]) for t in json.loads(result.out)] == [
        ("acme", 3),
        ("globex", 1),
    ]
    for bad, message in [
        (["--weight", "0"], "weight must be a whole number from 1 to 1000"),
        (["--burst", "3"], "a burst only applies with a rate"),
    ]:
        result = await cli("tenant", "set", "acme", *bad)
        assert (result.code, result.out) == (2, "")
        assert len(result.err.splitlines()) == 1
        assert message in result.err


async def test_cluster_shows_nodes_partitions_and_owners(api: Api, cli: Cli) -> None:
    await api.ledger.leases_acquire(LeasesAcquire("node-a", [0, 1, 2], 30))
    result = await cli("cluster")
    assert result.code == 0
    lines = result.out.splitlines()
    assert lines[0] == (
        "cluster at 2026-01-01T12:00:00Z: 8 partitions, active region default (epoch 1), "
        "0 live nodes; 5 without a live owner"
    )
    table = [line.split() for line in lines[2:]]
    assert table[0] == ["PARTITION", "OWNER", "FENCE", "LEASE_EXPIRES_AT", "CHECKPOINT_AGE_S",
                        "PLANNER_LAG_S"]  # fmt: skip
    assert table[1][:3] == ["0", "node-a", "1"]
    assert table[4][:3] == ["3", "-", "0"]
    result = await cli("cluster", "-o", "json")
    assert len(json.loads(result.out)["partitions"]) == 8


async def test_forecast_draws_the_busiest_buckets_and_splits_by_tenant(api: Api, cli: Cli) -> None:
    schedules = [
        Schedule(schedule_id="hourly", tenant_id="acme", cron_expr="0 * * * *", task_type="noop"),
        Schedule(schedule_id="often", tenant_id="globex", cron_expr="*/15 * * * *",
                 task_type="noop"),
    ]  # fmt: skip
    await api.ledger.schedules_create(SchedulesCreate(schedules))
    window = ("--from", "2026-01-01T12:00:00Z", "--to", "2026-01-01T14:00:00Z")
    result = await cli("forecast", *window, "--bucket", "15m", "--busiest", "2", "--by", "tenant")
    assert result.code == 0
    assert result.out.splitlines() == [
        "executions due from 2026-01-01T12:00:00Z to 2026-01-01T14:00:00Z: 10, per 15m:",
        "the 2 busiest buckets, in time order:",
        "BUCKET_START          DUE",
        "2026-01-01T12:00:00Z  2    " + "#" * 40,
        "2026-01-01T13:00:00Z  2    " + "#" * 40,
        "",
        "TENANT  TASK_TYPE  DUE  PEAK_PER_15M",
        "globex  *          8    1",
        "acme    *          2    1",
    ]
    result = await cli("forecast", *window, "--bucket", "1h", "-o", "json")
    forecast = json.loads(result.out)
    assert (forecast["bucket_s"], forecast["total"]) == (3600, [5, 5])
    result = await cli("forecast", "--bucket", "fortnight")
    assert (result.code, result.out) == (2, "")
    assert "bucket must be a number and a unit" in result.err


async def test_without_an_action_the_usage_is_shown(cli: Cli) -> None:
    for command in ("task-type", "tenant", "schedule", "dlq", "token"):
        result = await cli(command)
        assert (result.code, result.out) == (2, "")
        assert "ACTION" in result.err


async def test_rotate_secret_signs_with_both_for_the_overlap_and_never_prints_them(
    api: Api, cli: Cli
) -> None:
    hook = ["task-type", "set", "billing", "--kind", "webhook", "--url", "https://example.com/h"]
    await cli(*hook, "--secret", SECRET)
    new = "whsec_" + base64.b64encode(b"another-key-material-of-32-byte!").decode()
    result = await cli("task-type", "rotate-secret", "billing", "--secret", new, "--overlap", "60")
    assert (result.code, result.err) == (0, "")
    assert result.out.startswith("rotated the secret of task type 'billing' (signing with the old")
    assert f"  previous_secret: {fingerprint(SECRET)}\n" in result.out
    assert "  previous_secret_until: 2026-01-01T12:01:00Z\n" in result.out
    assert SECRET not in result.out
    assert new not in result.out
    stored = await api.ledger.task_types_get("billing")
    assert (stored.settings["secret"], stored.settings["previous_secret"]) == (new, SECRET)
    result = await cli("task-type", "rotate-secret", "billing", "--secret", "short")
    assert (result.code, result.out) == (2, "")
    assert "short" not in result.err
