"""The ``rabbitmq`` handler against real RabbitMQ: confirmed persistent publishes with
``message_id`` = the execution id, returned and refused publishes, forced connection closes,
a broker restart, and the consumer-side deduplication recipe.

Most tests use the machine's broker (127.0.0.1:5672), each with an exchange and a queue of its
own (``rabbitmq_broker.Topology``), deleted after; the restart test runs a private
``rabbitmq-server`` node it may kill. Real clock.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import json
import logging
import random
import secrets
import shutil
import ssl
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiormq.exceptions
import pytest
import trio

from engine.core.redaction import redact
from engine.errors import InvalidField
from engine.handlers import HandlerOptions, HandlerResult, OutcomeKind
from engine.handlers.brokers import BrokerBridge, open_broker_bridge
from engine.handlers.rabbitmq import (
    RabbitmqHandler,
    _quiet_unretrieved_amqp_errors,
    connection_name,
)
from engine.handlers.registry import build_handler, check_settings
from tests.handlers.conftest import make_context
from tests.handlers.rabbitmq_broker import (
    SHARED_URL,
    RabbitServer,
    Topology,
    close_connection_named,
    consume_once_per_message_id,
    effects,
    rabbit_server,
    topology,
)
from tests.handlers.redis_server import free_port
from tests.handlers.test_webhook_tls import FixedResolver

__all__ = ["rabbit_server", "topology"]  # the fixtures, imported for this module's tests

LOOPBACK = HandlerOptions(broker_allow_cidrs=("127.0.0.0/8",))


@pytest.fixture
async def brokers() -> AsyncIterator[BrokerBridge]:
    async with open_broker_bridge() as opened:
        yield opened


def handler(
    brokers: BrokerBridge | None,
    target: Topology,
    options: HandlerOptions = LOOPBACK,
    **settings: Any,
) -> RabbitmqHandler:
    built = build_handler(
        "rabbitmq",
        {
            "url": target.url,
            "exchange": target.exchange,
            "routing_key": target.routing_key,
            **settings,
        },
        options=options,
        brokers=brokers,
    )
    assert isinstance(built, RabbitmqHandler)
    return built


async def message_ids(target: Topology) -> list[str]:
    return await trio.to_thread.run_sync(target.message_ids)


async def publish_until_done(
    publisher: RabbitmqHandler, execution: int, failures: list[str] | None = None
) -> HandlerResult:
    """Publish as the retry policy would: again after each transient failure (for up to 90
    s: a private node's restart takes 10-20 s on a busy machine)."""
    with trio.move_on_after(90):
        for attempt in itertools.count(1):
            context = make_context(execution_id=f"e{execution}", attempt=attempt)
            result = await publisher.run(context)
            if result.kind is not OutcomeKind.TRANSIENT:
                return result
            if failures is not None:
                failures.append(result.error_code or "")
            await trio.sleep(0.05)
    raise AssertionError(f"execution {execution} never got through")


async def close_my_connection(brokers: BrokerBridge, publisher: RabbitmqHandler) -> None:
    """Close the publisher's pooled connection from the broker's side (only that one)."""
    address = (await publisher._host.addresses())[0]
    # With the publisher's own connect: a dropped connection is replaced here as at a publish.
    connect = publisher._connector(address)
    name = await brokers.run(publisher._key(address), connect, connection_name)
    await trio.to_thread.run_sync(close_connection_named, name)


# -- what is published --------------------------------------------------------------------


async def test_an_execution_is_published_persistent_with_its_id_and_context(
    brokers: BrokerBridge, topology: Topology
) -> None:
    publisher = handler(brokers, topology, headers={"team": "billing"})
    context = make_context()

    result = await publisher.run(context)

    assert result.kind is OutcomeKind.SUCCEEDED
    [message] = await trio.to_thread.run_sync(topology.drain)
    assert message.message_id == context.execution_id
    assert message.delivery_mode == 2  # persistent
    assert message.content_type == "application/json"
    assert message.headers == {
        "team": "billing",
        "X-Carillon-Execution-Id": context.execution_id,
        "X-Carillon-Schedule-Id": "nightly.report",
        "X-Carillon-Tenant-Id": "acme",
        "X-Carillon-Planned-At": "2026-03-08T07:00:00Z",
        "X-Carillon-Attempt": "1",
        "X-Carillon-Fencing-Token": "42",
    }
    assert json.loads(message.body) == {
        "execution_id": context.execution_id,
        "schedule_id": "nightly.report",
        "tenant_id": "acme",
        "task_type": "report",
        "planned_at": "2026-03-08T07:00:00Z",
        "attempt": 1,
        "fencing_token": 42,
        "payload": {"region": "eu", "n": 3},
    }


async def test_the_default_exchange_routes_by_queue_name(
    brokers: BrokerBridge, topology: Topology
) -> None:
    publisher = build_handler(
        "rabbitmq",
        {"url": SHARED_URL, "routing_key": topology.queue},
        options=LOOPBACK,
        brokers=brokers,
    )

    assert (await publisher.run(make_context())).kind is OutcomeKind.SUCCEEDED
    assert await message_ids(topology) == [make_context().execution_id]


async def test_a_retry_is_a_second_message_with_the_same_message_id(
    brokers: BrokerBridge, topology: Topology
) -> None:
    """No broker-side dedup: the consumer drops repeats by message_id (next test)."""
    publisher = handler(brokers, topology)

    await publisher.run(make_context())
    await publisher.run(make_context(attempt=2))

    assert await message_ids(topology) == [make_context().execution_id] * 2


# -- failures -----------------------------------------------------------------------------


async def test_an_unroutable_publish_is_a_permanent_failure(
    brokers: BrokerBridge, topology: Topology
) -> None:
    publisher = handler(brokers, topology, routing_key="bound.to.nothing")

    result = await publisher.run(make_context())
    after = await handler(brokers, topology).run(make_context(execution_id="next"))

    assert (result.kind, result.error_code) == (OutcomeKind.PERMANENT, "rabbitmq_unroutable")
    assert "312 NO_ROUTE" in (result.error_message or "")
    assert after.kind is OutcomeKind.SUCCEEDED  # the channel is still good
    assert await message_ids(topology) == ["next"]


async def test_without_mandatory_an_unroutable_message_is_dropped_and_confirmed(
    brokers: BrokerBridge, topology: Topology
) -> None:
    publisher = handler(brokers, topology, routing_key="bound.to.nothing", mandatory=False)

    assert (await publisher.run(make_context())).kind is OutcomeKind.SUCCEEDED
    assert await message_ids(topology) == []


async def test_a_concurrent_repeat_of_an_unroutable_publish_is_returned_too(
    brokers: BrokerBridge, topology: Topology
) -> None:
    """The client matches a returned message to its publish by message_id: two at once with
    the same id go on two channels, so neither return is mistaken for the other."""
    publisher = handler(brokers, topology, routing_key="bound.to.nothing")
    results: list[HandlerResult] = []

    async def one() -> None:
        results.append(await publisher.run(make_context()))

    async with trio.open_nursery() as nursery:
        for _ in range(4):
            nursery.start_soon(one)

    assert [r.error_code for r in results] == ["rabbitmq_unroutable"] * 4


async def test_a_missing_exchange_is_permanent_and_its_channel_replaced(
    brokers: BrokerBridge, topology: Topology
) -> None:
    missing = handler(brokers, topology, exchange=f"carillon-test.none.{secrets.token_hex(4)}")

    result = await missing.run(make_context())
    after = await handler(brokers, topology).run(make_context(execution_id="next"))

    assert (result.kind, result.error_code) == (OutcomeKind.PERMANENT, "rabbitmq_not_found")
    assert after.kind is OutcomeKind.SUCCEEDED
    assert brokers.statistics().clients == 1  # one connection for both: same vetted settings


async def test_a_missing_exchange_fails_no_other_exchanges_publishes_in_flight(
    brokers: BrokerBridge, topology: Topology
) -> None:
    """The broker closes the channel of a publish to a missing exchange, with every publish
    in flight on it: another task type's, to an exchange that exists, is never among them."""
    good = handler(brokers, topology)
    missing = handler(brokers, topology, exchange=f"carillon-test.none.{secrets.token_hex(4)}")
    results: dict[str, list[str | None]] = {"good": [], "missing": []}

    async def publish(name: str, publisher: RabbitmqHandler, n: int) -> None:
        result = await publisher.run(make_context(execution_id=f"{name}{n}"))
        results[name].append(result.error_code)

    async with trio.open_nursery() as nursery:
        for n in range(100):
            nursery.start_soon(publish, "good", good, n)
            if n % 10 == 0:
                nursery.start_soon(publish, "missing", missing, n)

    assert results["good"] == [None] * 100
    assert results["missing"] == ["rabbitmq_not_found"] * 10
    assert brokers.statistics().clients == 1  # one connection for both


async def test_refused_credentials_are_permanent_and_never_shown(
    brokers: BrokerBridge, topology: Topology, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    password = f"wrong-{secrets.token_hex(6)}"
    url = f"amqp://guest:{password}@127.0.0.1:5672/"
    publisher = build_handler(
        "rabbitmq",
        {"url": url, "exchange": topology.exchange, "routing_key": topology.routing_key},
        options=LOOPBACK,
        brokers=brokers,
    )

    result = await publisher.run(make_context())

    assert (result.kind, result.error_code) == (OutcomeKind.PERMANENT, "rabbitmq_auth_error")
    assert password not in (result.error_message or "")
    assert password not in repr(publisher)
    assert password not in caplog.text
    assert password not in json.dumps(redact("rabbitmq", {"url": url}))


async def test_a_vhost_the_user_may_not_use_is_permanent(
    brokers: BrokerBridge, topology: Topology
) -> None:
    publisher = handler(brokers, topology, url=f"{SHARED_URL}no-such-vhost-{secrets.token_hex(3)}")

    result = await publisher.run(make_context())

    assert (result.kind, result.error_code) == (OutcomeKind.PERMANENT, "rabbitmq_access_refused")


async def test_a_refused_connection_is_transient(brokers: BrokerBridge) -> None:
    target = Topology.unique(f"amqp://127.0.0.1:{free_port()}/")

    result = await handler(brokers, target).run(make_context())

    assert (result.kind, result.error_code) == (OutcomeKind.TRANSIENT, "rabbitmq_connection_error")


async def test_a_broker_address_is_vetted_like_a_webhooks(
    brokers: BrokerBridge, topology: Topology
) -> None:
    for url in (SHARED_URL, "amqp://localhost:5672/"):
        publisher = handler(brokers, topology, options=HandlerOptions(), url=url)
        result = await publisher.run(make_context())
        assert (result.kind, result.error_code) == (OutcomeKind.PERMANENT, "ssrf_refused")
        assert "--broker-allow-cidrs" in (result.error_message or "")
    assert brokers.statistics().connects == 0


async def test_amqps_goes_to_the_vetted_address_and_checks_the_host_names_certificate(
    brokers: BrokerBridge, certificate: tuple[Path, Path]
) -> None:
    """A private node listening with TLS (a certificate for ``sink.test``): the handler
    connects to the vetted address and checks the certificate against the URL's host."""
    base = Path(tempfile.mkdtemp(prefix="carillon-rabbitmq-tls-"))
    server = RabbitServer(base, tls=certificate)
    previous = trio.socket.set_custom_hostname_resolver(FixedResolver())  # any name: 127.0.0.1
    trusted = ssl.create_default_context(cafile=str(certificate[0]))

    def publisher(host: str, context: ssl.SSLContext | None) -> RabbitmqHandler:
        settings: dict[str, Any] = {
            "url": f"amqps://{host}:{server.tls_port}/",
            "routing_key": "amq.no-queue",
            "mandatory": False,  # dropped and confirmed: the TLS is what is tested
        }
        return RabbitmqHandler(settings, options=LOOPBACK, brokers=brokers, ssl_context=context)

    try:
        await trio.to_thread.run_sync(server.start)
        ok = await publisher("sink.test", trusted).run(make_context())
        other_name = await publisher("other.test", trusted).run(make_context())
        untrusted = await publisher("sink.test", None).run(make_context())
    finally:
        trio.socket.set_custom_hostname_resolver(previous)
        await trio.to_thread.run_sync(server.kill)
        shutil.rmtree(base, ignore_errors=True)

    assert ok.kind is OutcomeKind.SUCCEEDED, ok
    for refused in (other_name, untrusted):  # the certificate is not that name's, or untrusted
        assert refused.error_code == "rabbitmq_connection_error"
        assert "certificate" in (refused.error_message or "").lower()


async def test_a_handler_without_the_nodes_broker_bridge_fails_its_attempt(
    topology: Topology,
) -> None:
    result = await handler(None, topology).run(make_context())

    assert (result.kind, result.error_code) == (OutcomeKind.UNKNOWN, "setup_error")


async def test_a_connection_closed_by_the_broker_is_replaced_at_the_next_publish(
    brokers: BrokerBridge, topology: Topology
) -> None:
    publisher = handler(brokers, topology)
    assert (await publisher.run(make_context(execution_id="before"))).kind is (
        OutcomeKind.SUCCEEDED
    )

    await close_my_connection(brokers, publisher)
    after = await publish_until_done(publisher, 0)

    assert after.kind is OutcomeKind.SUCCEEDED
    assert brokers.statistics().connects == 2
    assert await message_ids(topology) == ["before", "e0"]


def test_aiormqs_unretrieved_close_errors_are_said_at_debug_level_only(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """When the broker closes a connection, aiormq rejects its internal futures with the
    close's error, which the publishes in flight already reported: asyncio's "never
    retrieved" error for those is logged at debug level; any other still goes to asyncio."""
    caplog.set_level(logging.DEBUG)
    loop = asyncio.new_event_loop()
    try:
        _quiet_unretrieved_amqp_errors(loop)
        never = "Future exception was never retrieved"
        closed = aiormq.exceptions.ConnectionClosed(320, "CONNECTION_FORCED")
        loop.call_exception_handler({"message": never, "exception": closed})
        loop.call_exception_handler({"message": never, "exception": ValueError("other")})
    finally:
        loop.close()

    [(level_amqp, logger_amqp), (level_other, logger_other)] = [
        (r.levelno, r.name) for r in caplog.records if "never retrieved" in r.getMessage()
    ]
    assert (level_amqp, logger_amqp) == (logging.DEBUG, "carillon.brokers")
    assert (level_other, logger_other) == (logging.ERROR, "asyncio")


# -- bursts -------------------------------------------------------------------------------

N = 300


async def burst(
    publisher: RabbitmqHandler,
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


async def test_a_burst_with_redeliveries_and_dropped_connections_lands_n_distinct_ids(
    brokers: BrokerBridge, topology: Topology, tmp_path: Path
) -> None:
    """Repeats (30 % published twice at once, 20 % cancelled mid-publish, and every publish
    in flight when the connection is closed under it) may store a message twice; the
    documented consumer recipe applies each execution's effect once.

    Beside the burst, publishes the broker drops (``mandatory`` off, a key bound to nothing)
    keep the shared connection busy, so each close meets publishes in flight."""
    publisher = handler(brokers, topology)
    busy = handler(brokers, topology, routing_key="bound.to.nothing", mandatory=False)
    failures: list[str] = []
    succeeded: list[int] = []
    closes = 0

    async def close_twice(done: trio.CancelScope) -> None:
        nonlocal closes
        for share in (N // 4, N // 2):
            while len(succeeded) < share:
                await trio.sleep(0.001)
            await close_my_connection(brokers, publisher)
            closes += 1
        done.cancel()

    async def keep_busy(worker: int) -> None:
        for k in range(1_000_000):
            result = await busy.run(make_context(execution_id=f"busy{worker}-{k}"))
            if result.kind is OutcomeKind.TRANSIENT:
                failures.append(result.error_code or "")
                await trio.sleep(0.01)

    async with trio.open_nursery() as nursery:
        with trio.CancelScope() as done:
            async with trio.open_nursery() as pressure:
                for worker in range(8):
                    pressure.start_soon(keep_busy, worker)
                pressure.start_soon(close_twice, done)
                nursery.start_soon(
                    functools.partial(
                        burst,
                        publisher,
                        range(N),
                        interrupt=0.2,
                        failures=failures,
                        succeeded=succeeded,
                        pace_s=0.01,
                    )
                )

    assert closes == 2
    assert "rabbitmq_connection_error" in failures or "rabbitmq_channel_closed" in failures
    # Replaced after each close (the last time by the first publish after it).
    assert (await busy.run(make_context(execution_id="after"))).kind is OutcomeKind.SUCCEEDED
    assert brokers.statistics().connects == 3
    ids = await message_ids_kept(topology)
    assert len(ids) >= N
    assert set(ids) == {f"e{n}" for n in range(N)}
    assert brokers.statistics().in_use == 0

    database = tmp_path / "consumer.sqlite"
    # Redeliver it all to the consumer: the messages, and every repeat among them, twice.
    await trio.to_thread.run_sync(_publish_back, topology, ids + ids)
    seen = await trio.to_thread.run_sync(
        consume_once_per_message_id, topology.url, topology.queue, database
    )
    assert seen == 2 * len(ids)
    applied = await trio.to_thread.run_sync(effects, database)
    assert sorted(applied) == sorted(f"e{n}" for n in range(N))


async def message_ids_kept(topology: Topology) -> list[str]:
    return await trio.to_thread.run_sync(topology.message_ids)


def _publish_back(topology: Topology, ids: list[str]) -> None:
    """Put messages with these ids (and Carillon's headers) back on the queue, as a broker's
    redelivery would present them to the consumer."""
    import asyncio

    import aio_pika

    async def main() -> None:
        connection = await aio_pika.connect(topology.url)
        try:
            channel = await connection.channel()
            for execution_id in ids:
                await channel.default_exchange.publish(
                    aio_pika.Message(
                        b"{}",
                        message_id=execution_id,
                        headers={"X-Carillon-Execution-Id": execution_id},
                    ),
                    routing_key=topology.queue,
                )
        finally:
            await connection.close()

    asyncio.run(main())


async def test_a_broker_restart_mid_burst_loses_nothing(
    brokers: BrokerBridge, rabbit_server: RabbitServer
) -> None:
    """A private node killed (SIGKILL) and started again on its data, a quarter into a
    burst: confirmed messages of a durable queue survive, the publishes in flight fail
    transiently and are retried, the connection is replaced."""
    target = Topology.unique(rabbit_server.url, durable=True)
    await trio.to_thread.run_sync(target.declare)
    publisher = handler(brokers, target, timeout_s=5)
    failures: list[str] = []
    succeeded: list[int] = []
    restarted = trio.Event()

    async def restart_midway() -> None:
        while len(succeeded) < N // 4:
            await trio.sleep(0.001)
        await trio.to_thread.run_sync(rabbit_server.restart)
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
    ids = await message_ids(target)
    assert set(ids) == {f"e{n}" for n in range(N)}
    assert brokers.statistics().connects >= 2  # replaced after the restart


# -- settings -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("settings", "reason"),
    [
        ({"url": "http://10.0.0.5/"}, "url must start with amqp:// or amqps://"),
        ({"url": "amqp://:pw@"}, "url names no host"),
        ({"url": "amqp://10.0.0.5/a/b"}, "written %2F"),
        ({"url": "amqp://10.0.0.5/?heartbeat=5"}, "must not have a query"),
        ({"exchange": "has space"}, "exchange must be 0-255 letters"),
        ({"exchange": "x" * 256}, "exchange must be 0-255 letters"),
        ({"routing_key": "k" * 256}, "routing_key must be at most 255 bytes"),
        ({"exchange": "", "routing_key": ""}, "routing_key must name a queue"),
        ({"headers": {"X-Carillon-Attempt": "9"}}, "is reserved"),
        ({"headers": {"bad name": "v"}}, "header name 'bad name'"),
        ({"mandatory": "yes"}, "rabbitmq handler settings are invalid"),
        ({"timeout_s": 0}, "timeout_s must be above 0"),
        ({"routing": "x"}, "rabbitmq handler settings are invalid"),
    ],
)
def test_bad_settings_are_refused_with_one_clear_reason(
    settings: dict[str, Any], reason: str
) -> None:
    full = {"url": "amqp://10.0.0.5:5672/", "exchange": "ticks", "routing_key": "r", **settings}
    with pytest.raises(InvalidField, match=reason):
        check_settings("rabbitmq", full)


def test_a_routing_key_is_required() -> None:
    with pytest.raises(InvalidField, match="routing_key"):
        check_settings("rabbitmq", {"url": "amqp://10.0.0.5/", "exchange": "ticks"})


def test_a_password_is_never_repeated_in_a_refusal() -> None:
    for url in ("amqp://u:s3cr3t-pw@h:0x", "amqp://u:s3cr3t-pw@h/a/b", "amqps://u:s3cr3t-pw@"):
        with pytest.raises(InvalidField) as refused:
            check_settings("rabbitmq", {"url": url, "routing_key": "q"})
        assert "s3cr3t" not in str(refused.value)


def test_the_url_and_credential_headers_are_redacted() -> None:
    settings = {
        "url": "amqp://app:s3cr3t-pw@10.0.0.5:5672/billing",
        "routing_key": "q",
        "headers": {"Authorization": "Bearer s3cr3t-token", "team": "billing"},
    }

    shown = redact("rabbitmq", settings)

    assert "s3cr3t" not in json.dumps(shown)
    assert shown["url"].endswith("@10.0.0.5:5672/billing")
    assert shown["headers"]["team"] == "billing"
