"""The ``nats`` handler against real NATS JetStream servers: acknowledged, deduplicated
publishes, the duplicate window, failures, restarts.

Most tests run a private ``nats-server -js`` (``nats_server.py``) that they may kill, pause
and restart; one checks the machine's shared server with a stream of its own. Real clock.
"""

from __future__ import annotations

import functools
import json
import logging
import random
import secrets
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio

from engine.errors import InvalidField
from engine.handlers import HandlerOptions, HandlerResult, OutcomeKind
from engine.handlers.brokers import BrokerBridge, open_broker_bridge
from engine.handlers.nats_jetstream import NatsHandler, window_short
from engine.handlers.registry import build_handler, check_settings
from tests.handlers.conftest import make_context
from tests.handlers.nats_server import (
    NATS_SERVER,
    NatsServer,
    add_stream,
    messages,
    nats_server,
    wait_listening,
)
from tests.handlers.redis_server import free_port

__all__ = ["nats_server"]  # the fixture, imported for this module's tests

LOOPBACK = HandlerOptions(broker_allow_cidrs=("127.0.0.0/8",))
SHARED_NATS = "nats://127.0.0.1:4222"
STREAM = "TICKS"
SUBJECT = "ticks.report"


@pytest.fixture
async def brokers() -> AsyncIterator[BrokerBridge]:
    async with open_broker_bridge() as opened:
        yield opened


@pytest.fixture
def ticks(nats_server: NatsServer) -> NatsServer:
    """The private server with a stream ``TICKS`` on ``ticks.>`` (default 2 min window)."""
    add_stream(nats_server.url, STREAM, ["ticks.>"])
    return nats_server


def handler(
    brokers: BrokerBridge | None,
    url: str,
    subject: str = SUBJECT,
    options: HandlerOptions = LOOPBACK,
    retry_horizon_s: float = 0.0,
    **settings: Any,
) -> NatsHandler:
    built = build_handler(
        "nats",
        {"url": url, "subject": subject, **settings},
        options=options,
        brokers=brokers,
        retry_horizon_s=retry_horizon_s,
        task_type_name="ticks",
    )
    assert isinstance(built, NatsHandler)
    return built


async def window_checked(publisher: NatsHandler) -> None:
    """Until the handler's duplicate-window check, which runs beside its first acknowledged
    publish on the broker bridge's loop, has finished."""
    with trio.fail_after(10):
        while not publisher._window_checked or publisher._checks:
            await trio.sleep(0.01)


def execution_ids(url: str) -> list[str]:
    return [headers["X-Carillon-Execution-Id"] for headers, _ in messages(url, STREAM, SUBJECT)]


async def publish_until_done(
    publisher: NatsHandler, execution: int, failures: list[str] | None = None
) -> HandlerResult:
    """Publish as the retry policy would: again after each transient failure."""
    for attempt in range(1, 400):
        result = await publisher.run(make_context(execution_id=f"e{execution}", attempt=attempt))
        if result.kind is not OutcomeKind.TRANSIENT:
            return result
        if failures is not None:
            failures.append(result.error_code or "")
        await trio.sleep(0.05)
    raise AssertionError(f"execution {execution} never got through")


# -- what is published --------------------------------------------------------------------


async def test_an_execution_is_published_once_with_its_context(
    brokers: BrokerBridge, ticks: NatsServer
) -> None:
    publisher = handler(brokers, ticks.url)
    context = make_context()

    first = await publisher.run(context)
    again = await publisher.run(make_context(attempt=2))  # a duplicate ack is a success

    assert first.kind is again.kind is OutcomeKind.SUCCEEDED
    [(headers, data)] = await trio.to_thread.run_sync(messages, ticks.url, STREAM, SUBJECT)
    assert headers == {
        "Nats-Msg-Id": context.execution_id,
        "Content-Type": "application/json",
        "X-Carillon-Execution-Id": context.execution_id,
        "X-Carillon-Schedule-Id": "nightly.report",
        "X-Carillon-Tenant-Id": "acme",
        "X-Carillon-Planned-At": "2026-03-08T07:00:00Z",
        "X-Carillon-Attempt": "1",
        "X-Carillon-Fencing-Token": "42",
    }
    assert json.loads(data) == {
        "execution_id": context.execution_id,
        "schedule_id": "nightly.report",
        "tenant_id": "acme",
        "task_type": "report",
        "planned_at": "2026-03-08T07:00:00Z",
        "attempt": 1,
        "fencing_token": 42,
        "payload": {"region": "eu", "n": 3},
    }


async def test_an_attempts_trace_context_rides_in_its_message_headers(
    brokers: BrokerBridge, ticks: NatsServer
) -> None:
    from opentelemetry.sdk.trace import TracerProvider

    from engine.tracing import Tracing

    tracing = Tracing(TracerProvider().get_tracer("carillon"))  # a node traces
    span = tracing.tracer.start_span("carillon.attempt")
    token = tracing.attach(span)  # as the worker does while the handler runs
    try:
        result = await handler(brokers, ticks.url).run(make_context())
    finally:
        tracing.detach(token)
        span.end()

    assert result.kind is OutcomeKind.SUCCEEDED
    [(headers, _)] = await trio.to_thread.run_sync(messages, ticks.url, STREAM, SUBJECT)
    sent = span.get_span_context()
    assert headers["traceparent"] == (
        f"00-{sent.trace_id:032x}-{sent.span_id:016x}-{int(sent.trace_flags):02x}"
    )


async def test_the_machines_nats_takes_a_deduplicated_publish_too(brokers: BrokerBridge) -> None:
    name = f"CARILLON_TEST_{secrets.token_hex(4).upper()}"
    subject = f"carillon-test.{name.lower()}"
    await trio.to_thread.run_sync(add_stream, SHARED_NATS, name, [subject])
    try:
        publisher = handler(brokers, SHARED_NATS, subject=subject, stream=name)
        results = [await publisher.run(make_context(attempt=n)) for n in (1, 2, 3)]
        assert [r.kind for r in results] == [OutcomeKind.SUCCEEDED] * 3
        assert len(await trio.to_thread.run_sync(messages, SHARED_NATS, name, subject)) == 1
    finally:
        await trio.to_thread.run_sync(_delete_stream, SHARED_NATS, name)


def _delete_stream(url: str, name: str) -> None:
    from tests.handlers.nats_server import jetstream

    async def delete(js: Any) -> None:
        await js.delete_stream(name)

    jetstream(url, delete)


# -- the duplicate window -------------------------------------------------------------------


async def test_a_window_shorter_than_the_retry_horizon_is_warned_about_once(
    brokers: BrokerBridge, ticks: NatsServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="carillon.brokers")
    covered = handler(brokers, ticks.url, retry_horizon_s=60)  # the window is 120 s
    await covered.run(make_context(execution_id="a"))
    await window_checked(covered)
    assert caplog.records == []

    short = handler(brokers, ticks.url, retry_horizon_s=518)
    for n in range(3):
        await short.run(make_context(execution_id=f"b{n}"))
    await window_checked(short)

    [warning] = caplog.records
    assert warning.getMessage().startswith(
        "task type 'ticks' publishes to NATS stream 'TICKS', whose duplicate window (120 s) is "
        "shorter than the task type's worst retry horizon (518 s)"
    )
    # The warning a write of the task type answers, word for word (one comparison).
    said = window_short("ticks", STREAM, 120, 518)
    assert said is not None
    assert warning.getMessage() == said.message


async def test_a_window_that_cannot_be_read_is_said_once_and_fails_no_publish(
    brokers: BrokerBridge, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A user who may publish to the subject but not ask JetStream about the stream."""
    port = free_port()
    config = tmp_path / "nats.conf"
    config.write_text(
        f"""
        port: {port}
        host: 127.0.0.1
        jetstream {{ store_dir: "{tmp_path}" }}
        authorization {{
          users = [
            {{ user: admin, password: admin-pw }}
            {{ user: app, password: app-pw,
               permissions: {{ publish: ["ticks.>"], subscribe: ["_INBOX.>"] }} }}
          ]
        }}
        """
    )
    server = subprocess.Popen(
        [NATS_SERVER, "-c", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    caplog.set_level(logging.WARNING, logger="carillon.brokers")
    try:
        await trio.to_thread.run_sync(wait_listening, port, server)
        admin = f"nats://admin:admin-pw@127.0.0.1:{port}"
        await trio.to_thread.run_sync(add_stream, admin, STREAM, ["ticks.>"])
        publisher = handler(brokers, f"nats://app:app-pw@127.0.0.1:{port}", retry_horizon_s=518)
        with trio.fail_after(2):  # the window's question (unanswered for 5 s) delays nothing
            results = [await publisher.run(make_context(execution_id=f"e{n}")) for n in range(3)]
        stored = await trio.to_thread.run_sync(messages, admin, STREAM, SUBJECT)
        await window_checked(publisher)
    finally:
        server.kill()
        server.wait(10)

    assert [r.kind for r in results] == [OutcomeKind.SUCCEEDED] * 3
    assert len(stored) == 3
    [warning] = caplog.records
    assert "whose duplicate window could not be read" in warning.getMessage()


async def test_a_redelivery_after_the_window_is_stored_again(
    brokers: BrokerBridge, nats_server: NatsServer
) -> None:
    add_stream(nats_server.url, STREAM, ["ticks.>"], duplicate_window=0.5)
    publisher = handler(brokers, nats_server.url)

    await publisher.run(make_context())
    await publisher.run(make_context(attempt=2))  # within the window: dropped
    await trio.sleep(0.8)
    await publisher.run(make_context(attempt=3))  # after it: a second message

    ids = await trio.to_thread.run_sync(execution_ids, nats_server.url)
    assert ids == [make_context().execution_id] * 2


# -- failures -----------------------------------------------------------------------------


async def test_a_subject_no_stream_takes_is_transient(
    brokers: BrokerBridge, ticks: NatsServer
) -> None:
    result = await handler(brokers, ticks.url, subject="elsewhere.x").run(make_context())

    assert (result.kind, result.error_code) == (OutcomeKind.TRANSIENT, "nats_no_responders")


async def test_a_subject_outside_the_expected_stream_is_permanent(
    brokers: BrokerBridge, ticks: NatsServer
) -> None:
    add_stream(ticks.url, "OTHER", ["other.>"])
    result = await handler(brokers, ticks.url, subject="other.x", stream=STREAM).run(make_context())

    assert (result.kind, result.error_code) == (OutcomeKind.PERMANENT, "nats_wrong_stream")


async def test_a_broker_address_is_vetted_like_a_webhooks(
    brokers: BrokerBridge, ticks: NatsServer
) -> None:
    for url in (ticks.url, f"nats://localhost:{ticks.port}"):
        result = await handler(brokers, url, options=HandlerOptions()).run(make_context())
        assert (result.kind, result.error_code) == (OutcomeKind.PERMANENT, "ssrf_refused")
        assert "--broker-allow-cidrs" in (result.error_message or "")


async def test_a_refused_connection_is_transient(brokers: BrokerBridge) -> None:
    result = await handler(brokers, f"nats://127.0.0.1:{free_port()}").run(make_context())

    assert (result.kind, result.error_code) == (OutcomeKind.TRANSIENT, "nats_connection_error")


async def test_bad_credentials_are_permanent_and_never_shown(
    brokers: BrokerBridge, tmp_path: Path
) -> None:
    password = "pw-" + secrets.token_hex(8)
    server = NatsServer(tmp_path, user="app", password=password)
    server.start()
    try:
        add_stream(server.admin_url, STREAM, ["ticks.>"])
        wrong = f"nats://app:wrong-{secrets.token_hex(4)}@127.0.0.1:{server.port}"
        refused = await handler(brokers, wrong).run(make_context())
        good = f"nats://app:{password}@127.0.0.1:{server.port}"
        accepted = await handler(brokers, good).run(make_context())
    finally:
        server.kill()

    assert (refused.kind, refused.error_code) == (OutcomeKind.PERMANENT, "nats_auth_error")
    assert "wrong-" not in (refused.error_message or "")
    assert accepted.kind is OutcomeKind.SUCCEEDED
    assert password not in repr(handler(brokers, good))


async def test_a_timeout_cancels_the_publish_on_the_loop_and_a_retry_publishes_once(
    brokers: BrokerBridge, ticks: NatsServer
) -> None:
    publisher = handler(brokers, ticks.url, timeout_s=0.5)
    assert (await publisher.run(make_context(execution_id="warm"))).kind is (OutcomeKind.SUCCEEDED)
    ticks.pause()  # SIGSTOP: the broker stops answering
    try:
        stuck = await publisher.run(make_context())
    finally:
        ticks.resume()

    assert (stuck.kind, stuck.error_code) == (OutcomeKind.TRANSIENT, "timeout")
    assert brokers.statistics().in_use == 0
    assert (await publish_until_done(publisher, 0)).kind is OutcomeKind.SUCCEEDED
    assert (await publisher.run(make_context(attempt=2))).kind is OutcomeKind.SUCCEEDED
    ids = await trio.to_thread.run_sync(execution_ids, ticks.url)
    assert sorted(ids) == sorted({"warm", "e0", make_context().execution_id})


async def test_a_handler_without_the_nodes_broker_bridge_fails_its_attempt() -> None:
    result = await handler(None, "nats://127.0.0.1:1").run(make_context())

    assert (result.kind, result.error_code) == (OutcomeKind.UNKNOWN, "setup_error")


# -- bursts ---------------------------------------------------------------------------------

N = 300


async def burst(
    publisher: NatsHandler,
    executions: range,
    *,
    interrupt: float = 0.0,
    failures: list[str] | None = None,
    succeeded: list[int] | None = None,
    pace_s: float = 0.0,
) -> None:
    """Every execution until it gets through, some twice at once, a share ``interrupt``
    cancelled mid-publish first (a killed worker); one started every ``pace_s``."""
    rng = random.Random(11)

    async def one(n: int) -> None:
        if rng.random() < interrupt:
            with trio.move_on_after(rng.random() * 0.005):
                await publisher.run(make_context(execution_id=f"e{n}"))
        result = await publish_until_done(publisher, n, failures)
        assert result.kind is OutcomeKind.SUCCEEDED, result
        if succeeded is not None:
            succeeded.append(n)

    async with trio.open_nursery() as nursery:
        for n in executions:
            nursery.start_soon(one, n)
            if rng.random() < 0.3:
                nursery.start_soon(one, n)
            if pace_s:
                await trio.sleep(pace_s)
            elif n % 50 == 0:
                await trio.sleep(0)


async def assert_exactly_once(url: str, count: int) -> None:
    ids = await trio.to_thread.run_sync(execution_ids, url)
    assert len(ids) == count, f"{len(ids)} messages for {count} executions"
    assert set(ids) == {f"e{n}" for n in range(count)}


async def test_a_burst_with_redeliveries_and_killed_workers_lands_each_execution_once(
    brokers: BrokerBridge, ticks: NatsServer
) -> None:
    await burst(handler(brokers, ticks.url), range(N), interrupt=0.2)

    await assert_exactly_once(ticks.url, N)
    assert brokers.statistics().in_use == 0


async def test_a_broker_restart_mid_burst_loses_nothing(
    brokers: BrokerBridge, ticks: NatsServer
) -> None:
    publisher = handler(brokers, ticks.url, timeout_s=2)
    failures: list[str] = []
    succeeded: list[int] = []
    restarted = trio.Event()

    async def restart_midway() -> None:
        while len(succeeded) < N // 4:
            await trio.sleep(0.001)
        await trio.to_thread.run_sync(ticks.restart)  # SIGKILL, then start on the same store
        restarted.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(restart_midway)
        nursery.start_soon(
            functools.partial(
                burst, publisher, range(N), failures=failures, succeeded=succeeded, pace_s=0.003
            )
        )

    assert restarted.is_set()
    assert failures  # the restart hit publishes in flight
    await assert_exactly_once(ticks.url, N)
    assert brokers.statistics().clients == 1  # reconnected, not replaced


# -- settings -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("settings", "reason"),
    [
        ({"url": "http://10.0.0.5/"}, "url must start with nats:// or tls://"),
        ({"url": "nats://:pw@"}, "url names no host"),
        ({"url": "nats://10.0.0.5:4222/x"}, "url must be only"),
        ({"subject": "has space"}, "subject must be 1-256 printable ASCII"),
        ({"subject": "a..b"}, "in tokens separated by dots"),
        ({"subject": "ticks.*"}, "must not contain wildcards"),
        ({"subject": "ticks.>"}, "must not contain wildcards"),
        ({"stream": "no.dots"}, "stream must be 1-64 letters"),
        ({"timeout_s": 0}, "timeout_s must be above 0"),
        ({"subjekt": "x"}, "nats handler settings are invalid"),
    ],
)
def test_bad_settings_are_refused_with_one_clear_reason(
    settings: dict[str, Any], reason: str
) -> None:
    full = {"url": "nats://10.0.0.5:4222", "subject": "ticks.report", **settings}
    with pytest.raises(InvalidField, match=reason):
        check_settings("nats", full)


def test_a_token_or_password_is_never_repeated_in_a_refusal() -> None:
    for url in ("nats://s3cr3t-token@h:0x", "nats://u:s3cr3t-token@h/x"):
        with pytest.raises(InvalidField) as refused:
            check_settings("nats", {"url": url, "subject": "s"})
        assert "s3cr3t" not in str(refused.value)
