"""The webhook handler against a real HTTP sink on 127.0.0.1 (allow-listed unless the test is
about the SSRF guard)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import socket
from datetime import timedelta
from email.utils import format_datetime

import httpx
import pytest
import trio

from engine import __version__
from engine.errors import InvalidField
from engine.handlers import HandlerOptions, HandlerResult, OutcomeKind, build_handler
from engine.handlers.base import Handler
from engine.handlers.signing import message_id, parse_secret
from engine.handlers.webhook import parse_retry_after, read_capped
from tests.handlers.conftest import WALL_NOW, Route, Sink, make_clock, make_context

LOOPBACK = HandlerOptions(webhook_allow_cidrs=("127.0.0.0/8",), webhook_timeout_s=5)
KEY = bytes(range(32))
SECRET = "whsec_" + base64.b64encode(KEY).decode()


def webhook(url: str, options: HandlerOptions = LOOPBACK, **settings: object) -> Handler:
    return build_handler("webhook", {"url": url, **settings}, options=options, clock=make_clock())


def expected_signature(msg_id: str, timestamp: str, body: bytes) -> str:
    """Standard Webhooks v1, recomputed here without the engine's code."""
    digest = hmac.new(KEY, f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


async def test_posts_the_context_as_json_with_the_carillon_headers(sink: Sink) -> None:
    result = await webhook(sink.url()).run(make_context())
    assert result == HandlerResult.succeeded()
    [request] = sink.requests
    assert (request.method, request.path) == ("POST", "/hook")
    assert json.loads(request.body) == {
        "execution_id": "nightly.report:2026-03-08T07:00:00Z",
        "schedule_id": "nightly.report",
        "tenant_id": "acme",
        "task_type": "report",
        "planned_at": "2026-03-08T07:00:00Z",
        "attempt": 1,
        "fencing_token": 42,
        "payload": {"region": "eu", "n": 3},
    }
    headers = request.headers
    assert headers["content-type"] == "application/json"
    assert headers["idempotency-key"] == "nightly.report:2026-03-08T07:00:00Z"
    assert headers["x-carillon-execution-id"] == "nightly.report:2026-03-08T07:00:00Z"
    assert headers["x-carillon-schedule-id"] == "nightly.report"
    assert headers["x-carillon-planned-at"] == "2026-03-08T07:00:00Z"
    assert headers["x-carillon-attempt"] == "1"
    assert headers["x-carillon-fencing-token"] == "42"
    assert headers["user-agent"] == f"carillon/{__version__}"
    assert headers["host"] == f"127.0.0.1:{sink.port}"
    assert "webhook-signature" not in headers


async def test_signs_with_standard_webhooks_verifiable_by_the_receiver(sink: Sink) -> None:
    assert await webhook(sink.url(), secret=SECRET).run(make_context()) == (
        HandlerResult.succeeded()
    )
    [request] = sink.requests
    headers = request.headers
    assert headers["webhook-timestamp"] == str(int(WALL_NOW.timestamp()))
    assert "." not in headers["webhook-id"]
    assert headers["webhook-signature"] == expected_signature(
        headers["webhook-id"], headers["webhook-timestamp"], request.body
    )


OLD_KEY = bytes(range(100, 132))
OLD_SECRET = "whsec_" + base64.b64encode(OLD_KEY).decode()


@pytest.mark.parametrize(
    ("until", "keys"),
    [(WALL_NOW + timedelta(seconds=1), [KEY, OLD_KEY]), (WALL_NOW, [KEY])],
    ids=["within the overlap", "after it"],
)
async def test_a_rotated_secret_signs_beside_the_new_one_until_its_overlap_ends(
    sink: Sink, until: object, keys: list[bytes]
) -> None:
    handler = webhook(
        sink.url(),
        secret=SECRET,
        previous_secret=OLD_SECRET,
        previous_secret_until=until.isoformat(),  # type: ignore[attr-defined]
    )
    assert await handler.run(make_context()) == HandlerResult.succeeded()
    [request] = sink.requests
    headers = request.headers
    content = f"{headers['webhook-id']}.{headers['webhook-timestamp']}.".encode() + request.body
    # What a receiver does: any one of the space-separated signatures verifies.
    wanted = [
        "v1," + base64.b64encode(hmac.new(key, content, hashlib.sha256).digest()).decode()
        for key in keys
    ]
    assert headers["webhook-signature"].split(" ") == wanted


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"previous_secret": OLD_SECRET}, "go together"),
        ({"previous_secret_until": "2026-03-09T00:00:00Z"}, "go together"),
        ({"previous_secret": OLD_SECRET, "previous_secret_until": "soon"}, "RFC 3339"),
        ({"previous_secret": OLD_SECRET, "previous_secret_until": "2026-03-09T00:00:00"}, "UTC"),
        ({"previous_secret": "short", "previous_secret_until": "2026-03-09T00:00:00Z"}, "secret"),
    ],
)
def test_a_malformed_rotation_is_refused(settings: dict[str, str], message: str) -> None:
    with pytest.raises(InvalidField, match=message):
        webhook("https://example.com/h", secret=SECRET, **settings)
    with pytest.raises(InvalidField, match="needs a secret"):
        webhook(
            "https://example.com/h",
            previous_secret=OLD_SECRET,
            previous_secret_until="2026-03-09T00:00:00Z",
        )


async def test_idempotency_headers_are_stable_across_attempts(sink: Sink) -> None:
    handler = webhook(sink.url(), secret=SECRET)
    await handler.run(make_context(attempt=1))
    await handler.run(make_context(attempt=2, fencing_token=43))
    first, second = (request.headers for request in sink.requests)
    for name in ("idempotency-key", "x-carillon-execution-id", "webhook-id"):
        assert first[name] == second[name]
    assert (first["x-carillon-attempt"], second["x-carillon-attempt"]) == ("1", "2")
    assert second["x-carillon-fencing-token"] == "43"
    for request in sink.requests:
        assert request.headers["webhook-signature"] == expected_signature(
            request.headers["webhook-id"], request.headers["webhook-timestamp"], request.body
        )


async def test_a_server_error_is_transient_and_quotes_the_body(sink: Sink) -> None:
    sink.routes["/hook"] = Route(status=500, body=b"database is down")
    result = await webhook(sink.url()).run(make_context())
    assert (result.kind, result.error_code) == (OutcomeKind.TRANSIENT, "http_500")
    assert result.error_message is not None
    assert "database is down" in result.error_message


@pytest.mark.parametrize("status", [408, 425, 502, 503])
async def test_retryable_statuses_are_transient(sink: Sink, status: int) -> None:
    sink.routes["/hook"] = Route(status=status)
    result = await webhook(sink.url()).run(make_context())
    assert (result.kind, result.error_code) == (OutcomeKind.TRANSIENT, f"http_{status}")


async def test_too_many_requests_is_transient_and_honours_retry_after(sink: Sink) -> None:
    sink.routes["/hook"] = Route(status=429, headers={"Retry-After": "7"})
    result = await webhook(sink.url()).run(make_context())
    assert (result.kind, result.error_code, result.retry_after_s) == (
        OutcomeKind.TRANSIENT,
        "http_429",
        7.0,
    )


@pytest.mark.parametrize("status", [400, 401, 404, 410, 422])
async def test_other_client_errors_are_permanent(sink: Sink, status: int) -> None:
    sink.routes["/hook"] = Route(status=status, body=b'{"error": "bad field"}')
    result = await webhook(sink.url()).run(make_context())
    assert (result.kind, result.error_code) == (OutcomeKind.PERMANENT, f"http_{status}")


async def test_a_redirect_is_not_followed_and_is_permanent(sink: Sink) -> None:
    sink.routes["/hook"] = Route(status=302, headers={"Location": "/elsewhere?token=secret"})
    result = await webhook(sink.url()).run(make_context())
    assert (result.kind, result.error_code) == (OutcomeKind.PERMANENT, "http_302")
    assert result.error_message is not None
    assert "/elsewhere" in result.error_message
    assert "secret" not in result.error_message
    assert [request.path for request in sink.requests] == ["/hook"]


async def test_a_slow_receiver_is_a_transient_timeout(sink: Sink) -> None:
    sink.routes["/hook"] = Route(delay_s=10)
    result = await webhook(sink.url(), timeout_s=0.3).run(make_context())
    assert (result.kind, result.error_code) == (OutcomeKind.TRANSIENT, "timeout")


async def test_cancellation_from_outside_propagates(sink: Sink) -> None:
    sink.routes["/hook"] = Route(delay_s=10)
    handler = webhook(sink.url())
    with trio.move_on_after(0.2) as scope:
        await handler.run(make_context())
        raise AssertionError("run must not return once cancelled")
    assert scope.cancelled_caught


async def test_a_huge_response_is_read_only_up_to_the_cap(sink: Sink) -> None:
    sink.routes["/hook"] = Route(status=503, body=b"E" * (8 * 1024 * 1024))
    options = HandlerOptions(webhook_allow_cidrs=("127.0.0.0/8",), response_body_max_bytes=100)
    result = await webhook(sink.url(), options).run(make_context())
    assert (result.kind, result.error_code) == (OutcomeKind.TRANSIENT, "http_503")
    assert result.error_message is not None
    assert "E" * 100 in result.error_message
    assert "E" * 101 not in result.error_message


async def test_read_capped_stops_reading_an_endless_body_and_closes_it() -> None:
    class Endless(httpx.AsyncByteStream):
        """A transport stream that never ends until closed."""

        def __init__(self) -> None:
            self.chunks = 0
            self.closed = False

        def __aiter__(self) -> Endless:
            return self

        async def __anext__(self) -> bytes:
            if self.closed:
                raise httpx.ReadError("closed")
            self.chunks += 1
            return b"z" * 1000

        async def aclose(self) -> None:
            self.closed = True

    stream = Endless()
    response = httpx.Response(200, stream=stream)
    assert await read_capped(response, 2500) == b"z" * 2500
    assert (stream.chunks, stream.closed) == (3, True)


async def test_a_closed_port_is_a_transient_connect_error() -> None:
    with socket.socket() as probe:  # find a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    result = await webhook(f"http://127.0.0.1:{port}/").run(make_context())
    assert (result.kind, result.error_code) == (OutcomeKind.TRANSIENT, "connect_error")


async def test_loopback_is_refused_without_the_allow_list(sink: Sink) -> None:
    result = await webhook(sink.url(), HandlerOptions()).run(make_context())
    assert (result.kind, result.error_code) == (OutcomeKind.PERMANENT, "ssrf_refused")
    assert result.error_message is not None
    assert "loopback" in result.error_message
    assert sink.requests == []


async def test_loopback_is_reached_with_the_allow_list(sink: Sink) -> None:
    assert await webhook(sink.url()).run(make_context()) == HandlerResult.succeeded()
    assert len(sink.requests) == 1


async def test_a_hostname_resolving_to_loopback_is_refused(sink: Sink) -> None:
    result = await webhook(sink.url(host="localhost"), HandlerOptions()).run(make_context())
    assert (result.kind, result.error_code) == (OutcomeKind.PERMANENT, "ssrf_refused")
    assert sink.requests == []


async def test_connects_to_the_vetted_address_not_a_second_dns_answer(sink: Sink) -> None:
    """DNS rebinding: the second answer (metadata service) must never be used."""

    class Rebinding(trio.abc.HostnameResolver):
        def __init__(self) -> None:
            self.answers = ["127.0.0.1", "169.254.169.254"]
            self.calls = 0

        async def getaddrinfo(self, host, port, family=0, type=0, proto=0, flags=0):
            assert host == b"sink.test"
            self.calls += 1
            address = self.answers.pop(0)
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port))]

        async def getnameinfo(self, sockaddr, flags):
            raise NotImplementedError

    resolver = Rebinding()
    previous = trio.socket.set_custom_hostname_resolver(resolver)
    try:
        result = await webhook(sink.url(host="sink.test")).run(make_context())
    finally:
        trio.socket.set_custom_hostname_resolver(previous)
    assert result == HandlerResult.succeeded()
    assert resolver.calls == 1
    [request] = sink.requests
    assert request.headers["host"] == f"sink.test:{sink.port}"


@pytest.mark.parametrize(
    ("url", "fragment"),
    [
        ("ftp://example.com/x", "http:// or https://"),
        ("file:///etc/passwd", "http:// or https://"),
        ("https://user:pw@example.com/", "credentials"),
        ("https:///path-only", "host"),
        ("not a url", "http:// or https://"),
    ],
)
def test_unusable_urls_are_refused_when_the_task_type_is_stored(url: str, fragment: str) -> None:
    with pytest.raises(InvalidField, match=fragment):
        webhook(url)


@pytest.mark.parametrize(
    "secret", ["whsec_!!!not-base64", "whsec_" + base64.b64encode(b"short").decode()]
)
def test_malformed_or_weak_secrets_are_refused_without_echoing_them(secret: str) -> None:
    with pytest.raises(InvalidField) as raised:
        webhook("https://example.com/", secret=secret)
    assert secret.removeprefix("whsec_") not in str(raised.value)


def test_secrets_are_accepted_with_or_without_the_whsec_prefix() -> None:
    raw = os.urandom(32)
    encoded = base64.b64encode(raw).decode()
    assert parse_secret("whsec_" + encoded) == raw == parse_secret(encoded.rstrip("="))


def test_message_ids_have_no_full_stops_and_differ_for_different_executions() -> None:
    assert message_id("a.b:2026-03-08T07:00:00.5Z") == "a%2Eb:2026-03-08T07:00:00%2E5Z"
    assert message_id("a.b:x") != message_id("a%2Eb:x")


def test_retry_after_reads_seconds_and_http_dates() -> None:
    clock = make_clock()
    assert parse_retry_after("120", clock) == 120.0
    later = format_datetime(WALL_NOW + timedelta(seconds=30), usegmt=True)
    assert parse_retry_after(later, clock) == 30.0
    earlier = format_datetime(WALL_NOW - timedelta(seconds=30), usegmt=True)
    assert parse_retry_after(earlier, clock) == 0.0
    assert parse_retry_after("soon", clock) is None
    assert parse_retry_after(None, clock) is None
    assert parse_retry_after("99999999", clock) == 24 * 3600.0


async def test_the_attempts_trace_context_reaches_the_receiver(sink: Sink) -> None:
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider

    from engine.tracing import Tracing

    tracing = Tracing(TracerProvider().get_tracer("carillon"))  # a node traces
    span = tracing.tracer.start_span("carillon.attempt")
    token = tracing.attach(span)  # as the worker does while the handler runs
    try:
        await webhook(sink.url()).run(make_context())
    finally:
        tracing.detach(token)
        span.end()
    await webhook(sink.url()).run(make_context())  # no attempt span: no trace context
    traced, untraced = sink.requests
    version, trace_id, parent_id, flags = traced.headers["traceparent"].split("-")
    sent = span.get_span_context()
    assert version == "00"
    assert int(flags, 16) == int(sent.trace_flags)  # sampled (and, level 2, a random id)
    assert (int(trace_id, 16), int(parent_id, 16)) == (sent.trace_id, sent.span_id)
    assert (len(trace_id), len(parent_id)) == (32, 16)
    assert "tracestate" not in traced.headers  # the span has none
    assert "traceparent" not in untraced.headers
    assert trace.get_current_span() is trace.INVALID_SPAN
