"""The ``redis`` handler against real Redis servers: once-only appends, failures, restarts.

Most tests run a private ``redis-server`` (``redis_server.py``) that they may kill, restart,
pause or fill with traps; one checks the machine's shared Redis with a stream of its own.
These tests use the real clock: the broker answers in real time.
"""

from __future__ import annotations

import functools
import math
import random
import secrets
import ssl
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import redis
import trio

from engine.core.retry_policy import RetryPolicy, retry_horizon_s
from engine.errors import InvalidField
from engine.handlers import HandlerOptions, HandlerResult, OutcomeKind
from engine.handlers.brokers import BrokerBridge, open_broker_bridge
from engine.handlers.redis_stream import (
    DEDUP_TTL_S_DEFAULT,
    RedisHandler,
    _Client,
    connections_in_use,
    dedup_key,
)
from engine.handlers.registry import build_handler, check_settings, retry_horizon_of
from engine.model import HandlerKind, TaskType
from tests.handlers.conftest import make_context
from tests.handlers.redis_server import (
    REDIS_SERVER,
    RedisServer,
    entries,
    free_port,
    redis_server,
)
from tests.handlers.test_webhook_tls import FixedResolver

__all__ = ["redis_server"]  # the fixture, imported for this module's tests

LOOPBACK = HandlerOptions(broker_allow_cidrs=("127.0.0.0/8",))
SHARED_REDIS = "redis://127.0.0.1:6379/0"


@pytest.fixture
async def brokers() -> AsyncIterator[BrokerBridge]:
    async with open_broker_bridge() as opened:
        yield opened


def handler(
    brokers: BrokerBridge | None,
    url: str,
    stream: str = "ticks",
    options: HandlerOptions = LOOPBACK,
    **settings: Any,
) -> RedisHandler:
    built = build_handler(
        "redis", {"url": url, "stream": stream, **settings}, options=options, brokers=brokers
    )
    assert isinstance(built, RedisHandler)
    return built


async def publish_until_done(
    publisher: RedisHandler,
    execution: int,
    *,
    attempts_max: int = 200,
    failures: list[str] | None = None,
) -> HandlerResult:
    """Publish execution ``execution`` as the retry policy would: again after each transient
    failure (a redelivery carries the same id and the next attempt number)."""
    for attempt in range(1, attempts_max + 1):
        result = await publisher.run(make_context(execution_id=f"e{execution}", attempt=attempt))
        if result.kind is not OutcomeKind.TRANSIENT:
            return result
        if failures is not None:
            failures.append(result.error_code or "")
        await trio.sleep(0.02)
    raise AssertionError(f"execution {execution} never got through")


# -- what is appended ---------------------------------------------------------------------


async def test_an_execution_is_appended_once_with_its_context(
    brokers: BrokerBridge, redis_server: RedisServer
) -> None:
    publisher = handler(brokers, redis_server.url)
    context = make_context()

    first = await publisher.run(context)
    again = await publisher.run(make_context(attempt=2))  # a retry: a success, nothing appended

    assert first.kind is again.kind is OutcomeKind.SUCCEEDED
    [entry] = entries(redis_server.url, "ticks")
    assert entry == {
        "execution_id": context.execution_id,
        "schedule_id": "nightly.report",
        "tenant_id": "acme",
        "task_type": "report",
        "planned_at": "2026-03-08T07:00:00Z",
        "attempt": "1",
        "fencing_token": "42",
        "payload": '{"region":"eu","n":3}',
    }
    key = dedup_key("ticks", context.execution_id)
    assert key == "carillon:dedup:{ticks}:" + context.execution_id
    stream_id = redis_server.command("XREVRANGE", "ticks", "+", "-", "COUNT", "1")
    assert stream_id is not None
    ttl = int(redis_server.command("TTL", key) or 0)
    assert DEDUP_TTL_S_DEFAULT - 5 <= ttl <= DEDUP_TTL_S_DEFAULT


async def test_an_attempts_trace_context_rides_on_its_entry(
    brokers: BrokerBridge, redis_server: RedisServer
) -> None:
    from opentelemetry.sdk.trace import TracerProvider

    from engine.tracing import Tracing

    tracing = Tracing(TracerProvider().get_tracer("carillon"))  # a node traces
    span = tracing.tracer.start_span("carillon.attempt")
    token = tracing.attach(span)  # as the worker does while the handler runs
    try:
        result = await handler(brokers, redis_server.url).run(make_context())
    finally:
        tracing.detach(token)
        span.end()
    await handler(brokers, redis_server.url, stream="plain").run(make_context())

    assert result.kind is OutcomeKind.SUCCEEDED
    [traced] = entries(redis_server.url, "ticks")
    [untraced] = entries(redis_server.url, "plain")
    sent = span.get_span_context()
    assert traced["traceparent"] == (
        f"00-{sent.trace_id:032x}-{sent.span_id:016x}-{int(sent.trace_flags):02x}"
    )
    assert "traceparent" not in untraced


async def test_the_dedup_key_shares_the_streams_hash_slot() -> None:
    assert dedup_key("{orders}:ticks", "e1") == "carillon:dedup:{orders}:e1"
    assert dedup_key("plain", "e1") == "carillon:dedup:{plain}:e1"


async def test_the_machines_redis_takes_an_append_once_too(brokers: BrokerBridge) -> None:
    stream = f"carillon-test:{secrets.token_hex(6)}"
    publisher = handler(brokers, SHARED_REDIS, stream=stream)
    client = redis.Redis.from_url(SHARED_REDIS)
    try:
        results = [await publisher.run(make_context(attempt=n)) for n in (1, 2, 3)]
        assert [r.kind for r in results] == [OutcomeKind.SUCCEEDED] * 3
        assert client.xlen(stream) == 1
    finally:
        client.delete(stream, dedup_key(stream, make_context().execution_id))
        client.close()


async def test_maxlen_trims_the_stream_approximately(
    brokers: BrokerBridge, redis_server: RedisServer
) -> None:
    publisher = handler(brokers, redis_server.url, maxlen=10)
    for n in range(300):
        assert (await publisher.run(make_context(execution_id=f"e{n}"))).kind is (
            OutcomeKind.SUCCEEDED
        )

    length = int(redis_server.command("XLEN", "ticks") or 0)
    # "~": whole nodes of up to 100 entries are dropped, never below the limit.
    assert 10 <= length <= 10 + 100


async def test_a_flushed_script_cache_is_loaded_again(
    brokers: BrokerBridge, redis_server: RedisServer
) -> None:
    publisher = handler(brokers, redis_server.url)
    assert (await publisher.run(make_context(execution_id="a"))).kind is OutcomeKind.SUCCEEDED
    redis_server.command("SCRIPT", "FLUSH")

    assert (await publisher.run(make_context(execution_id="b"))).kind is OutcomeKind.SUCCEEDED
    assert len(entries(redis_server.url, "ticks")) == 2


# -- failures -----------------------------------------------------------------------------


async def test_a_broker_address_is_vetted_like_a_webhooks(
    brokers: BrokerBridge, redis_server: RedisServer
) -> None:
    for url in (redis_server.url, f"redis://localhost:{redis_server.port}/0"):
        result = await handler(brokers, url, options=HandlerOptions()).run(make_context())
        assert (result.kind, result.error_code) == (OutcomeKind.PERMANENT, "ssrf_refused")
        assert "a loopback address" in (result.error_message or "")
        assert "--broker-allow-cidrs" in (result.error_message or "")
    assert entries(redis_server.url, "ticks") == []
    # Webhooks' allow-list does not open addresses to brokers.
    webhooks_only = HandlerOptions(webhook_allow_cidrs=("127.0.0.0/8",))
    result = await handler(brokers, redis_server.url, options=webhooks_only).run(make_context())
    assert result.error_code == "ssrf_refused"


async def test_a_refused_connection_is_transient(brokers: BrokerBridge) -> None:
    result = await handler(brokers, f"redis://127.0.0.1:{free_port()}/0").run(make_context())

    assert (result.kind, result.error_code) == (OutcomeKind.TRANSIENT, "redis_connection_error")


async def test_bad_credentials_are_permanent_and_never_shown(
    brokers: BrokerBridge, redis_server: RedisServer
) -> None:
    password = "pw-" + secrets.token_hex(8)
    # Least privilege: the script's commands and loading it, nothing else.
    redis_server.command(
        "ACL", "SETUSER", "app", "on", ">" + password, "~*",
        "+evalsha", "+script|load", "+get", "+set", "+xadd",
    )  # fmt: skip
    wrong = "wrong-" + secrets.token_hex(8)
    url = f"redis://app:{wrong}@127.0.0.1:{redis_server.port}/0"

    refused = await handler(brokers, url).run(make_context())
    good = f"redis://app:{password}@127.0.0.1:{redis_server.port}/0"
    accepted = await handler(brokers, good).run(make_context())

    assert (refused.kind, refused.error_code) == (OutcomeKind.PERMANENT, "redis_auth_error")
    assert wrong not in (refused.error_message or "")
    assert accepted.kind is OutcomeKind.SUCCEEDED
    assert password not in repr(handler(brokers, good))


async def test_a_key_of_another_type_is_permanent_and_leaves_no_dedup_record(
    brokers: BrokerBridge, redis_server: RedisServer
) -> None:
    redis_server.command("SET", "ticks", "not a stream")
    publisher = handler(brokers, redis_server.url)

    refused = await publisher.run(make_context())
    assert (refused.kind, refused.error_code) == (OutcomeKind.PERMANENT, "redis_wrongtype")
    # The failed script wrote nothing: once the key is fixed, the execution is appended.
    redis_server.command("DEL", "ticks")
    assert (await publisher.run(make_context(attempt=2))).kind is OutcomeKind.SUCCEEDED
    assert len(entries(redis_server.url, "ticks")) == 1


async def test_a_timeout_cancels_the_publish_on_the_loop_and_keeps_no_connection(
    brokers: BrokerBridge, redis_server: RedisServer
) -> None:
    publisher = handler(brokers, redis_server.url, timeout_s=0.3)
    assert (await publisher.run(make_context(execution_id="warm"))).kind is (OutcomeKind.SUCCEEDED)
    redis_server.command("CLIENT", "PAUSE", "1500", "ALL")  # the broker stops answering

    stuck = await publisher.run(make_context())

    assert (stuck.kind, stuck.error_code) == (OutcomeKind.TRANSIENT, "timeout")
    key = publisher._key((await publisher._host.addresses())[0])
    assert await brokers.run(key, _never_connects, connections_in_use) == 0
    assert brokers.statistics().in_use == 0
    # Once the broker answers again the retry gets through, and the execution is there once.
    retried = await publish_until_done(publisher, 0)
    assert retried.kind is OutcomeKind.SUCCEEDED
    again = await publisher.run(make_context(attempt=3))
    assert again.kind is OutcomeKind.SUCCEEDED
    ids = [e["execution_id"] for e in entries(redis_server.url, "ticks")]
    assert sorted(ids) == sorted({"warm", make_context().execution_id, "e0"})


async def test_rediss_goes_to_the_vetted_address_and_checks_the_host_names_certificate(
    brokers: BrokerBridge, tmp_path: Path, certificate: tuple[Path, Path]
) -> None:
    cert, key = certificate
    port = free_port()
    server = subprocess.Popen(
        [REDIS_SERVER, "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1",
         "--tls-cert-file", str(cert), "--tls-key-file", str(key), "--tls-auth-clients", "no",
         "--save", "", "--appendonly", "no", "--dir", str(tmp_path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    previous = trio.socket.set_custom_hostname_resolver(FixedResolver())  # any name: 127.0.0.1
    trusted = ssl.create_default_context(cafile=str(cert))

    def publisher(host: str, context: ssl.SSLContext | None) -> RedisHandler:
        settings = {"url": f"rediss://{host}:{port}/0", "stream": "ticks"}
        return RedisHandler(settings, options=LOOPBACK, brokers=brokers, ssl_context=context)

    try:
        with trio.fail_after(10):
            while (ok := await publisher("sink.test", trusted).run(make_context())).kind is (
                OutcomeKind.TRANSIENT
            ):
                await trio.sleep(0.05)  # the server is starting
        other_name = await publisher("other.test", trusted).run(make_context())
        untrusted = await publisher("sink.test", None).run(make_context())
    finally:
        trio.socket.set_custom_hostname_resolver(previous)
        server.kill()
        server.wait(10)

    assert ok.kind is OutcomeKind.SUCCEEDED
    for refused in (other_name, untrusted):  # the certificate is not that name's, or untrusted
        assert refused.error_code == "redis_connection_error"
        assert "certificate" in (refused.error_message or "").lower()


async def _never_connects() -> _Client:
    raise AssertionError("the client exists already")


async def test_a_handler_without_the_nodes_broker_bridge_fails_its_attempt() -> None:
    result = await handler(None, "redis://127.0.0.1:1/0").run(make_context())

    assert (result.kind, result.error_code) == (OutcomeKind.UNKNOWN, "setup_error")


# -- bursts with redeliveries, dropped connections and a restart ----------------------------

N = 400


async def burst(
    publisher: RedisHandler,
    executions: range,
    *,
    interrupt: float = 0.0,
    seed: int = 7,
    failures: list[str] | None = None,
    pace_s: float = 0.0,
) -> None:
    """Publish every execution until it gets through, some twice at once (a redelivery racing
    a slow attempt), and a share ``interrupt`` of them cancelled mid-publish first (a worker
    killed: the asyncio side is cancelled wherever it was)."""
    rng = random.Random(seed)

    async def one(n: int) -> None:
        if rng.random() < interrupt:
            with trio.move_on_after(rng.random() * 0.005):
                await publisher.run(make_context(execution_id=f"e{n}"))
        result = await publish_until_done(publisher, n, failures=failures)
        assert result.kind is OutcomeKind.SUCCEEDED, result

    async with trio.open_nursery() as nursery:
        for n in executions:
            nursery.start_soon(one, n)
            if rng.random() < 0.3:
                nursery.start_soon(one, n)  # the same execution id, published twice at once
            if pace_s:
                await trio.sleep(pace_s)  # one started every pace_s
            elif n % 50 == 0:
                await trio.sleep(0)


def assert_exactly_once(url: str, stream: str, count: int) -> None:
    ids = [entry["execution_id"] for entry in entries(url, stream)]
    assert len(ids) == count, f"{len(ids)} entries for {count} executions"
    assert set(ids) == {f"e{n}" for n in range(count)}


async def test_a_burst_with_redeliveries_and_killed_workers_lands_each_execution_once(
    brokers: BrokerBridge, redis_server: RedisServer
) -> None:
    publisher = handler(brokers, redis_server.url)

    await burst(publisher, range(N), interrupt=0.2)

    assert_exactly_once(redis_server.url, "ticks", N)
    assert brokers.statistics().in_use == 0


async def test_connections_dropped_mid_burst_lose_and_repeat_nothing(
    brokers: BrokerBridge, redis_server: RedisServer
) -> None:
    publisher = handler(brokers, redis_server.url)

    async def drop_connections() -> None:
        for _ in range(10):
            await trio.sleep(0.01)
            await trio.to_thread.run_sync(
                redis_server.command, "CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"
            )

    async with trio.open_nursery() as nursery:
        nursery.start_soon(drop_connections)
        nursery.start_soon(burst, publisher, range(N))

    assert_exactly_once(redis_server.url, "ticks", N)


async def test_a_broker_restart_mid_burst_loses_nothing(
    brokers: BrokerBridge, redis_server: RedisServer
) -> None:
    publisher = handler(brokers, redis_server.url, timeout_s=2)
    restarted = trio.Event()
    failures: list[str] = []

    async def restart_midway() -> None:
        while int(await trio.to_thread.run_sync(redis_server.command, "XLEN", "ticks") or 0) < (
            N // 3
        ):
            await trio.sleep(0.005)
        await trio.to_thread.run_sync(redis_server.restart)  # SIGKILL, then start again
        restarted.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(restart_midway)
        nursery.start_soon(
            functools.partial(burst, publisher, range(N), failures=failures, pace_s=0.003)
        )

    assert restarted.is_set()
    assert "redis_connection_error" in failures  # the restart hit publishes in flight
    assert_exactly_once(redis_server.url, "ticks", N)
    # The same clients serve on: their connections were re-established, not replaced.
    assert brokers.statistics().clients == 1


# -- settings -----------------------------------------------------------------------------


def redis_type(**settings: Any) -> TaskType:
    return TaskType(
        name="ticks",
        kind=HandlerKind.REDIS,
        settings={"url": "redis://10.0.0.5:6379/0", "stream": "ticks", **settings},
    )


@pytest.mark.parametrize(
    ("settings", "reason"),
    [
        ({"url": "http://10.0.0.5/"}, "url must start with redis:// or rediss://"),
        ({"url": "redis://:pw@/0"}, "url names no host"),
        ({"url": "redis://10.0.0.5:99999/0"}, "url is not a valid URL"),
        ({"url": "redis://10.0.0.5/x"}, "path must be a database number"),
        ({"url": "redis://10.0.0.5/0?ssl=true"}, "must not have a query"),
        ({"stream": "has space"}, "stream must be 1-256 printable ASCII"),
        ({"stream": ""}, "stream must be 1-256 printable ASCII"),
        ({"stream": "carillon:dedup:x"}, "must not start with 'carillon:dedup:'"),
        ({"maxlen": 0}, "maxlen must be 1-"),
        ({"dedup_ttl_s": 0}, "dedup_ttl_s must be 1-"),
        ({"timeout_s": 0}, "timeout_s must be above 0"),
        ({"max_connections": 0}, "max_connections must be 1-1024"),
        ({"streem": "x"}, "redis handler settings are invalid"),
    ],
)
def test_bad_settings_are_refused_with_one_clear_reason(
    settings: dict[str, Any], reason: str
) -> None:
    task_type = redis_type(**settings)
    with pytest.raises(InvalidField, match=reason) as refused:
        check_settings("redis", task_type.settings, retry_horizon_s=retry_horizon_of(task_type))
    assert ";" not in str(refused.value)  # one reason, not a list


def test_a_url_with_a_password_is_never_repeated_in_a_refusal() -> None:
    with pytest.raises(InvalidField) as refused:
        check_settings("redis", {"url": "redis://u:hunter2@h:0x/0", "stream": "s"})
    assert "hunter2" not in str(refused.value)


def test_a_dedup_expiry_shorter_than_the_worst_retry_horizon_is_refused() -> None:
    task_type = msgspec_replace(redis_type(dedup_ttl_s=3600), max_attempts=20, backoff_max_s=600)
    horizon = math.ceil(retry_horizon_of(task_type))
    assert horizon > 3600

    with pytest.raises(InvalidField, match=r"less than this task type's worst retry horizon"):
        check_settings("redis", task_type.settings, retry_horizon_s=horizon)
    check_settings("redis", {**task_type.settings, "dedup_ttl_s": horizon}, retry_horizon_s=horizon)
    # Left out, it covers the horizon: a day, or the horizon when that is longer.
    long = RedisHandler(
        {"url": "redis://10.0.0.5/0", "stream": "s"}, options=LOOPBACK, retry_horizon_s=2e5
    )
    assert long.dedup_ttl_s == 200_000
    short = RedisHandler({"url": "redis://10.0.0.5/0", "stream": "s"}, options=LOOPBACK)
    assert short.dedup_ttl_s == DEDUP_TTL_S_DEFAULT


def test_the_worst_retry_horizon_counts_attempts_overruns_redeliveries_and_backoffs() -> None:
    policy = RetryPolicy(max_attempts=3, backoff_base_s=10, backoff_max_s=15)
    # 3 x (30 s + 5 s overrun + 65 s redelivery) + (10 + 15) s of backoff x 1.2 jitter.
    assert retry_horizon_s(policy, 30) == pytest.approx(3 * 100 + 25 * 1.2)


def msgspec_replace(task_type: TaskType, **changes: Any) -> TaskType:
    import msgspec

    return msgspec.structs.replace(task_type, **changes)
