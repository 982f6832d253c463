"""The shared webhook client (engine/handlers/http_client.py) against a real receiver process
on 127.0.0.1 (benchmarks/webhook_receiver.py): keep-alive, limits, faults, DNS, cancellation."""

from __future__ import annotations

import contextlib
import logging
import socket
import ssl
from collections.abc import AsyncIterator, Iterator
from functools import partial
from ipaddress import ip_network
from pathlib import Path
from typing import Any

import pytest
import trio

from benchmarks.webhook_receiver import ReceiverProcess, start_receiver
from engine.handlers import HandlerOptions, HandlerResult, OutcomeKind
from engine.handlers import http_client as http_client_module
from engine.handlers.http_client import (
    WebhookClient,
    WebhookClientConfig,
    WebhookResponse,
    default_client,
    open_webhook_client,
)
from engine.handlers.webhook import WebhookHandler
from tests.handlers.conftest import make_clock, make_context

LOOPBACK = HandlerOptions(webhook_allow_cidrs=("127.0.0.0/8",), webhook_timeout_s=5)


@pytest.fixture(scope="module")
def receiver_process() -> Iterator[ReceiverProcess]:
    process = start_receiver()
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture
def receiver(receiver_process: ReceiverProcess) -> ReceiverProcess:
    receiver_process.set_latency(0)
    receiver_process.reset()
    return receiver_process


def handler(
    url: str,
    client: WebhookClient | None,
    options: HandlerOptions = LOOPBACK,
    **settings: object,
) -> WebhookHandler:
    return WebhookHandler(
        {"url": url, **settings}, options=options, clock=make_clock(), client=client
    )


async def deliver_many(target: WebhookHandler, count: int, concurrency: int) -> list[HandlerResult]:
    results: list[HandlerResult] = []
    limiter = trio.Semaphore(concurrency)

    async def one(index: int) -> None:
        async with limiter:
            results.append(await target.run(make_context(execution_id=f"run:{index}")))

    async with trio.open_nursery() as nursery:
        for index in range(count):
            nursery.start_soon(one, index)
    return results


class Answers(trio.abc.HostnameResolver):
    """Resolves every name to the next of ``answers`` (the last one repeats; none: the name
    does not exist); counts calls."""

    def __init__(self, *answers: str) -> None:
        self.answers = list(answers)
        self.calls = 0

    async def getaddrinfo(self, host, port, family=0, type=0, proto=0, flags=0):  # type: ignore[no-untyped-def]
        self.calls += 1
        if not self.answers:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        address = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port))]

    async def getnameinfo(self, sockaddr, flags):  # type: ignore[no-untyped-def]
        raise NotImplementedError


@pytest.fixture
async def answers() -> AsyncIterator[list[Answers]]:
    """Install a resolver with ``installed.append(Answers(...))``; removed after the test."""
    installed: list[Answers] = []

    class Delegate(trio.abc.HostnameResolver):
        async def getaddrinfo(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            return await installed[-1].getaddrinfo(*args, **kwargs)

        async def getnameinfo(self, sockaddr, flags):  # type: ignore[no-untyped-def]
            raise NotImplementedError

    previous = trio.socket.set_custom_hostname_resolver(Delegate())
    try:
        yield installed
    finally:
        trio.socket.set_custom_hostname_resolver(previous)


# --- keep-alive and limits -------------------------------------------------------------------


async def test_connections_are_kept_alive_and_reused(receiver: ReceiverProcess) -> None:
    async with open_webhook_client() as client:
        results = await deliver_many(handler(receiver.url(), client), 300, concurrency=10)
        assert client.statistics().connections_idle == client.statistics().connections_open
    stats = client.statistics()
    assert results == [HandlerResult.succeeded()] * 300
    seen = receiver.stats()
    assert (seen["requests"], seen["unique_keys"]) == (300, 300)
    assert seen["connections"] <= 10
    assert stats.connections_opened == seen["connections"]
    assert stats.connections_reused == 300 - seen["connections"]
    assert stats.connections_open == 0  # closed with the client


async def test_the_per_host_limit_bounds_the_connections(receiver: ReceiverProcess) -> None:
    receiver.set_latency(20)
    config = WebhookClientConfig(connections_per_host=4)
    async with open_webhook_client(config) as client:
        results = await deliver_many(handler(receiver.url(), client), 60, concurrency=60)
    assert results == [HandlerResult.succeeded()] * 60
    seen = receiver.stats()
    assert seen["peak_connections"] <= 4
    assert seen["peak_in_flight"] <= 4
    assert seen["requests"] == 60


async def test_the_global_limit_bounds_connections_across_hosts(
    receiver: ReceiverProcess, answers: list[Answers]
) -> None:
    answers.append(Answers("127.0.0.1"))
    receiver.set_latency(20)
    config = WebhookClientConfig(connections_per_host=10, connections_total=3)
    async with open_webhook_client(config) as client, trio.open_nursery() as nursery:
        for name in ("a.test", "b.test", "c.test"):
            nursery.start_soon(deliver_many, handler(receiver.url(host=name), client), 20, 20)
    seen = receiver.stats()
    assert seen["requests"] == 60
    assert seen["peak_connections"] <= 3


async def test_a_new_connection_evicts_an_idle_one_rather_than_pass_the_limit(
    receiver: ReceiverProcess, answers: list[Answers]
) -> None:
    answers.append(Answers("127.0.0.1"))
    config = WebhookClientConfig(connections_total=1)
    async with open_webhook_client(config) as client:
        for name in ("a.test", "b.test", "a.test"):
            assert await handler(receiver.url(host=name), client).run(make_context()) == (
                HandlerResult.succeeded()
            )
            assert client.statistics().connections_open == 1
    assert receiver.stats()["connections"] == 3


# --- faults ------------------------------------------------------------------------------------


async def test_a_hanging_receiver_times_out_and_frees_the_slot(receiver: ReceiverProcess) -> None:
    config = WebhookClientConfig(connections_per_host=1)
    async with open_webhook_client(config) as client:
        result = await handler(receiver.url("/hang"), client, timeout_s=0.3).run(make_context())
        assert (result.kind, result.error_code) == (OutcomeKind.TRANSIENT, "timeout")
        assert result.error_message is not None
        assert "waiting for the answer" in result.error_message
        assert client.statistics().connections_open == 0
        # The only slot is free again:
        after = await handler(receiver.url(), client, timeout_s=2).run(make_context())
        assert after == HandlerResult.succeeded()


async def test_a_slow_answer_within_the_deadline_succeeds_and_past_it_times_out(
    receiver: ReceiverProcess,
) -> None:
    async with open_webhook_client() as client:
        slow = receiver.url("/slow?ms=150")
        assert await handler(slow, client, timeout_s=2).run(make_context()) == (
            HandlerResult.succeeded()
        )
        result = await handler(slow, client, timeout_s=0.05).run(make_context())
        assert result.error_code == "timeout"


async def test_a_reset_after_the_request_is_a_network_error_and_not_resent(
    receiver: ReceiverProcess,
) -> None:
    async with open_webhook_client() as client:
        # The first delivery leaves a kept-alive connection that the second one reuses.
        assert await handler(receiver.url(), client).run(make_context()) == (
            HandlerResult.succeeded()
        )
        result = await handler(receiver.url("/reset"), client).run(make_context())
        stats = client.statistics()
    assert (result.kind, result.error_code) == (OutcomeKind.TRANSIENT, "network_error")
    assert stats.connections_reused == 1
    assert stats.resent == 0
    assert receiver.stats()["requests"] == 2  # the reset one arrived once and only once


async def test_a_close_without_an_answer_is_a_network_error(receiver: ReceiverProcess) -> None:
    async with open_webhook_client() as client:
        result = await handler(receiver.url("/close"), client).run(make_context())
        assert client.statistics().connections_open == 0
    assert (result.kind, result.error_code) == (OutcomeKind.TRANSIENT, "network_error")
    assert result.error_message is not None
    assert "closed" in result.error_message or "Reset" in result.error_message


async def test_a_truncated_answer_times_out(receiver: ReceiverProcess) -> None:
    async with open_webhook_client() as client:
        result = await handler(receiver.url("/partial"), client, timeout_s=0.2).run(make_context())
        assert client.statistics().connections_open == 0
    assert result.error_code == "timeout"


async def test_a_huge_body_is_read_up_to_the_cap_and_its_connection_discarded(
    receiver: ReceiverProcess,
) -> None:
    options = HandlerOptions(webhook_allow_cidrs=("127.0.0.0/8",), response_body_max_bytes=100)
    async with open_webhook_client() as client:
        result = await handler(receiver.url("/huge?bytes=50000000"), client, options).run(
            make_context()
        )
        assert client.statistics().connections_open == 0
        assert await handler(receiver.url(), client).run(make_context()) == (
            HandlerResult.succeeded()
        )
        assert client.statistics().connections_opened == 2
    assert (result.kind, result.error_code) == (OutcomeKind.TRANSIENT, "http_503")
    assert result.error_message is not None
    assert "E" * 100 in result.error_message
    assert "E" * 101 not in result.error_message


async def test_status_codes_keep_their_classification(receiver: ReceiverProcess) -> None:
    async with open_webhook_client() as client:
        unavailable = await handler(receiver.url("/status/503?retry_after=7"), client).run(
            make_context()
        )
        redirect = await handler(receiver.url("/status/302"), client).run(make_context())
        missing = await handler(receiver.url("/status/404"), client).run(make_context())
        # Error answers keep their connection (they were read to the end).
        assert client.statistics().connections_opened == 1
    assert (unavailable.kind, unavailable.error_code, unavailable.retry_after_s) == (
        OutcomeKind.TRANSIENT,
        "http_503",
        7.0,
    )
    assert (redirect.kind, redirect.error_code) == (OutcomeKind.PERMANENT, "http_302")
    assert (missing.kind, missing.error_code) == (OutcomeKind.PERMANENT, "http_404")
    assert receiver.stats()["requests"] == 3  # the redirect was not followed


async def test_a_kept_alive_connection_closed_by_the_receiver_is_not_used(
    receiver: ReceiverProcess,
) -> None:
    async with open_webhook_client() as client:
        idle_reset = handler(receiver.url("/idle-reset?ms=20"), client)
        assert await idle_reset.run(make_context()) == HandlerResult.succeeded()
        await trio.sleep(0.2)  # the receiver resets the idle connection meanwhile
        assert await idle_reset.run(make_context()) == HandlerResult.succeeded()
        stats = client.statistics()
    assert (stats.stale_discarded, stats.resent, stats.connections_opened) == (1, 0, 2)
    assert receiver.stats()["requests"] == 2


async def test_a_failed_send_on_a_reused_connection_is_sent_once_more_on_a_new_one(
    receiver: ReceiverProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reset arrives between the liveness check and the send (simulated by skipping the
    check): the send fails, so the receiver never got the request, and it is resent."""
    monkeypatch.setattr(http_client_module, "_looks_alive", lambda sock: True)
    async with open_webhook_client() as client:
        idle_reset = handler(receiver.url("/idle-reset?ms=20"), client)
        assert await idle_reset.run(make_context()) == HandlerResult.succeeded()
        await trio.sleep(0.2)
        result = await idle_reset.run(make_context(attempt=2))
        stats = client.statistics()
    assert result == HandlerResult.succeeded()
    assert (stats.resent, stats.connections_opened) == (1, 2)
    assert receiver.stats()["requests"] == 2


async def test_a_closed_port_is_a_connect_error_naming_the_address() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    async with open_webhook_client() as client:
        result = await handler(f"http://127.0.0.1:{port}/", client).run(make_context())
        assert client.statistics().connections_open == 0
    assert (result.kind, result.error_code) == (OutcomeKind.TRANSIENT, "connect_error")
    assert result.error_message is not None
    assert "127.0.0.1" in result.error_message


# --- DNS ---------------------------------------------------------------------------------------


async def test_dns_answers_are_cached_and_shared(
    receiver: ReceiverProcess, answers: list[Answers]
) -> None:
    resolver = Answers("127.0.0.1")
    answers.append(resolver)
    async with open_webhook_client() as client:
        results = await deliver_many(handler(receiver.url(host="hook.test"), client), 50, 50)
    assert results == [HandlerResult.succeeded()] * 50
    assert resolver.calls == 1


async def test_a_dns_answer_turning_internal_is_refused_at_the_next_resolution(
    receiver: ReceiverProcess, answers: list[Answers]
) -> None:
    """Rebinding between deliveries: the cached answer expires, the new one names the cloud
    metadata service; nothing is sent, and the connection kept alive for the old address
    is closed."""
    resolver = Answers("127.0.0.1", "169.254.169.254")
    answers.append(resolver)
    config = WebhookClientConfig(dns_cache_s=0.05)
    async with open_webhook_client(config) as client:
        target = handler(receiver.url(host="rebind.test"), client)
        assert await target.run(make_context()) == HandlerResult.succeeded()
        assert client.statistics().connections_idle == 1
        await trio.sleep(0.2)
        result = await target.run(make_context(attempt=2))
        assert client.statistics().connections_idle == 0
    assert (result.kind, result.error_code) == (OutcomeKind.PERMANENT, "ssrf_refused")
    assert result.error_message is not None
    assert "169.254.169.254" in result.error_message
    assert resolver.calls == 2
    assert receiver.stats()["requests"] == 1


async def test_a_cached_answer_is_vetted_again_for_every_handler(
    receiver: ReceiverProcess, answers: list[Answers]
) -> None:
    """One handler's allow-list does not open the cached answer (or the pooled connection)
    to another handler without it."""
    answers.append(Answers("127.0.0.1"))
    async with open_webhook_client() as client:
        allowed = handler(receiver.url(host="shared.test"), client)
        refused = handler(receiver.url(host="shared.test"), client, HandlerOptions())
        assert await allowed.run(make_context()) == HandlerResult.succeeded()
        result = await refused.run(make_context())
    assert result.error_code == "ssrf_refused"
    assert receiver.stats()["requests"] == 1


async def test_a_name_that_does_not_resolve_is_a_dns_error(answers: list[Answers]) -> None:
    resolver = Answers()
    answers.append(resolver)
    async with open_webhook_client() as client:
        results = await deliver_many(handler("http://nowhere.test/", client), 5, 5)
    assert {(result.kind, result.error_code) for result in results} == {
        (OutcomeKind.TRANSIENT, "dns_error")
    }
    assert resolver.calls == 1  # the failure is shared, briefly


# --- cancellation and life ---------------------------------------------------------------------


async def test_cancellation_propagates_and_frees_the_slot(receiver: ReceiverProcess) -> None:
    config = WebhookClientConfig(connections_per_host=1)
    async with open_webhook_client(config) as client:
        hanging = handler(receiver.url("/hang"), client)
        with trio.move_on_after(0.2) as scope:
            await hanging.run(make_context())
            raise AssertionError("run must not return once cancelled")
        assert scope.cancelled_caught
        assert client.statistics().connections_open == 0
        with trio.fail_after(2):
            assert await handler(receiver.url(), client).run(make_context()) == (
                HandlerResult.succeeded()
            )
    assert receiver.stats()["open_connections"] <= 1  # the hung one is gone (or going)


async def test_cancelling_a_waiter_for_a_slot_takes_nothing(receiver: ReceiverProcess) -> None:
    config = WebhookClientConfig(connections_per_host=1)
    async with open_webhook_client(config) as client, trio.open_nursery() as nursery:
        nursery.start_soon(handler(receiver.url("/slow?ms=300"), client).run, make_context())
        await trio.sleep(0.05)
        with trio.move_on_after(0.05) as scope:  # waits for the slot, then gives up
            await handler(receiver.url(), client).run(make_context())
        assert scope.cancelled_caught
    assert receiver.stats()["requests"] == 1


def test_the_default_client_is_per_run_and_closed_with_it(
    receiver_process: ReceiverProcess,
) -> None:
    receiver_process.reset()
    clients: list[WebhookClient] = []

    async def main() -> None:
        target = handler(receiver_process.url(), None)
        assert await target.run(make_context()) == HandlerResult.succeeded()
        assert await target.run(make_context()) == HandlerResult.succeeded()
        clients.append(default_client())

    trio.run(main)
    trio.run(main)
    first, second = clients
    assert first is not second
    for client in clients:
        stats = client.statistics()
        assert (stats.connections_opened, stats.connections_reused) == (1, 1)
        assert stats.connections_open == 0


# --- TLS -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tls_receiver(certificate: tuple[Path, Path]) -> Iterator[ReceiverProcess]:
    process = start_receiver(tls=certificate)
    try:
        yield process
    finally:
        process.stop()


def trusting(cert: Path) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(cert))
    context.verify_flags &= ~getattr(ssl, "VERIFY_X509_STRICT", 0)
    return context


async def test_https_is_kept_alive_and_resumes_tls_sessions(
    tls_receiver: ReceiverProcess, certificate: tuple[Path, Path], answers: list[Answers]
) -> None:
    answers.append(Answers("127.0.0.1"))
    tls_receiver.reset()
    async with open_webhook_client() as client:
        target = WebhookHandler(
            {"url": tls_receiver.url(host="sink.test")},
            options=LOOPBACK,
            clock=make_clock(),
            ssl_context=trusting(certificate[0]),
            client=client,
        )
        for attempt in range(1, 6):
            assert await target.run(make_context(attempt=attempt)) == HandlerResult.succeeded()
        assert client.statistics().connections_opened == 1
        assert client.close_idle() == 1
        assert await target.run(make_context()) == HandlerResult.succeeded()
        stats = client.statistics()
    assert (stats.connections_opened, stats.connections_reused) == (2, 4)
    assert stats.tls_sessions_resumed == 1
    assert tls_receiver.stats()["requests"] == 6


async def test_a_kept_alive_tls_connection_is_not_shared_with_another_server_name(
    tls_receiver: ReceiverProcess, certificate: tuple[Path, Path], answers: list[Answers]
) -> None:
    """Same address, other host name: its own connection, verified for its own name."""
    answers.append(Answers("127.0.0.1"))
    async with open_webhook_client() as client:
        context = trusting(certificate[0])

        def to(name: str) -> WebhookHandler:
            return WebhookHandler(
                {"url": tls_receiver.url(host=name)},
                options=LOOPBACK,
                clock=make_clock(),
                ssl_context=context,
                client=client,
            )

        assert await to("sink.test").run(make_context()) == HandlerResult.succeeded()
        result = await to("other.test").run(make_context())
    assert (result.kind, result.error_code) == (OutcomeKind.TRANSIENT, "connect_error")
    assert result.error_message is not None
    assert "not valid for 'other.test'" in result.error_message


async def test_deliveries_to_an_http2_receiver_share_its_connections(
    certificate: tuple[Path, Path], answers: list[Answers]
) -> None:
    """Through :class:`WebhookClient`: a receiver that chose ``h2`` by ALPN carries many
    deliveries per connection (here at most 20 streams each, 150 deliveries at once): the
    deliveries wait for a stream or for the connection being opened rather than each
    opening its own, and every one is answered."""
    from hypercorn.config import Config
    from hypercorn.trio import serve

    from tests.handlers.test_http2 import asgi_echo

    answers.append(Answers("127.0.0.1"))
    config = Config()
    config.bind = ["127.0.0.1:0"]
    config.certfile, config.keyfile = str(certificate[0]), str(certificate[1])
    config.accesslog = None
    config.errorlog = logging.getLogger("tests.hypercorn")
    config.h2_max_concurrent_streams = 20
    stop = trio.Event()
    context = ssl.create_default_context(cafile=str(certificate[0]))
    context.verify_flags &= ~getattr(ssl, "VERIFY_X509_STRICT", 0)
    context.set_alpn_protocols(["h2", "http/1.1"])
    answers: dict[int, WebhookResponse] = {}
    loopback = (ip_network("127.0.0.0/8"),)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery, open_webhook_client() as client:
            app: Any = asgi_echo
            binds = await nursery.start(partial(serve, app, config, shutdown_trigger=stop.wait))
            port = int(binds[0].rsplit(":", 1)[1])

            async def deliver(index: int) -> None:
                answers[index] = await client.post(
                    scheme="https", host="sink.test", port=port, target=b"/hook/%d" % index,
                    headers=[("Host", f"sink.test:{port}")], body=b"%d" % index,
                    allow=loopback, body_max_bytes=1024, ssl_context=context,
                )  # fmt: skip

            for wave in range(3):  # each wave waits for the one before: 150 at once at most
                async with trio.open_nursery() as deliveries:
                    for index in range(150 * wave, 150 * (wave + 1)):
                        deliveries.start_soon(deliver, index)
            statistics = client.statistics()
            stop.set()
    assert sorted(answers) == list(range(450))
    for index, response in answers.items():
        assert (response.status, response.body) == (200, b"/hook/%d %d" % (index, index))
        assert response.headers["x-http-version"] == "2"
    assert statistics.http2_connections_opened == statistics.connections_opened
    # 150 at once, 20 streams a connection: 8 connections would do, and the later waves
    # reuse them (a few more may open while a full one's streams are being answered).
    assert statistics.connections_opened <= 12
    assert statistics.requests == 450
    assert statistics.resent == 0


async def test_streams_an_http2_receiver_refused_with_goaway_are_sent_again_elsewhere(
    certificate: tuple[Path, Path], answers: list[Answers]
) -> None:
    """The first connection's receiver takes three requests at once, answers the first, says
    GOAWAY with it as its last stream and closes: the two others were provably not
    processed, and the client sends them once more, on a new connection, where they are
    answered. Every delivery is answered once; two were sent twice."""
    import h2.config
    import h2.connection
    import h2.events

    answers.append(Answers("127.0.0.1"))
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_context.load_cert_chain(str(certificate[0]), str(certificate[1]))
    server_context.set_alpn_protocols(["h2"])
    client_context = ssl.create_default_context(cafile=str(certificate[0]))
    client_context.verify_flags &= ~getattr(ssl, "VERIFY_X509_STRICT", 0)
    client_context.set_alpn_protocols(["h2", "http/1.1"])
    connections: list[list[int]] = []  # the stream ids each connection received

    async def serve(stream: trio.SSLStream[trio.SocketStream]) -> None:
        received: list[int] = []
        connections.append(received)
        first = len(connections) == 1
        peer = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
        peer.initiate_connection()
        await stream.send_all(peer.data_to_send())
        bodies: dict[int, bytes] = {}
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            while True:
                data = await stream.receive_some(65536)
                if not data:
                    return
                for event in peer.receive_data(data):
                    if isinstance(event, h2.events.DataReceived):
                        bodies[event.stream_id] = bodies.get(event.stream_id, b"") + event.data
                        peer.acknowledge_received_data(len(event.data), event.stream_id)
                    elif isinstance(event, h2.events.StreamEnded):
                        received.append(event.stream_id)
                        if not first:
                            answer(peer, event.stream_id, bodies[event.stream_id])
                if first and len(received) == 3:
                    answer(peer, received[0], bodies[received[0]])
                    peer.close_connection(last_stream_id=received[0])
                    await stream.send_all(peer.data_to_send())
                    await stream.aclose()
                    return
                await stream.send_all(peer.data_to_send())

    def answer(peer: Any, stream_id: int, body: bytes) -> None:
        peer.send_headers(stream_id, [(":status", "200")])
        peer.send_data(stream_id, b"got " + body, end_stream=True)

    results: dict[int, bytes] = {}
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery, open_webhook_client() as client:
            listeners = await nursery.start(
                partial(trio.serve_ssl_over_tcp, serve, 0, server_context, host="127.0.0.1")
            )
            port = listeners[0].transport_listener.socket.getsockname()[1]

            async def deliver(index: int) -> None:
                response = await client.post(
                    scheme="https", host="sink.test", port=port, target=b"/hook",
                    headers=[("Host", "sink.test")], body=b"%d" % index,
                    allow=(ip_network("127.0.0.0/8"),), body_max_bytes=1024,
                    ssl_context=client_context,
                )  # fmt: skip
                results[index] = response.body

            # The first delivery opens the connection; the others wait for it (protocol not
            # known yet), then share it: three streams on the first connection.
            async with trio.open_nursery() as deliveries:
                for index in range(3):
                    deliveries.start_soon(deliver, index)
            statistics = client.statistics()
            nursery.cancel_scope.cancel()
    assert results == {index: b"got %d" % index for index in range(3)}
    assert [len(received) for received in connections] == [3, 2]
    assert statistics.resent == 2
    assert statistics.requests == 5
    assert statistics.http2_connections_opened == statistics.connections_opened == 2
