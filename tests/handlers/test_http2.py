"""The webhook client's HTTP/2 connection (engine/handlers/http2.py): against a scripted
receiver (h2's server side on an in-memory stream; each test chooses its frames, on trio's
autojump clock, so a hang fails the test at once instead of stalling it) and, once, against
a real one (hypercorn over TLS, ALPN h2)."""

from __future__ import annotations

import logging
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings
import hypothesis
import pytest
import trio
import trio.testing
from hpack import NeverIndexedHeaderTuple
from hyperframe.frame import ContinuationFrame, Frame, GoAwayFrame, HeadersFrame
from hypothesis import strategies as st

from engine.handlers.http2 import ConnectionUnavailable, H2Connection, StreamRefused
from engine.handlers.http_client import ConnectFailed, ExchangeFailed, WebhookResponse

Codes = h2.errors.ErrorCodes
Settings = dict[h2.settings.SettingCodes, int]
MemoryStream = trio.StapledStream[trio.testing.MemorySendStream, trio.testing.MemoryReceiveStream]
HEADERS = [
    ("Host", "sink.test"),
    ("Content-Type", "application/json"),
    ("Idempotency-Key", "run:1"),
]


# --- the scripted receiver -------------------------------------------------------------------


@dataclass
class Seen:
    """A request as the receiver saw it."""

    headers: list[tuple[bytes, bytes]]
    body: bytearray = field(default_factory=bytearray)
    ended: bool = False
    reset: int | None = None
    """The error code of the client's RST_STREAM, if it sent one."""

    @property
    def path(self) -> str:
        return dict(self.headers)[b":path"].decode()


Handler = Callable[["Peer", int], Awaitable[None]]


class Peer:
    """An HTTP/2 receiver under the test's control: h2's server side on an in-memory stream.

    ``run()`` reads and records every request, and starts ``handler(peer, stream_id)`` for
    each as its headers arrive. Received data is acknowledged unless ``acknowledge`` is off
    (a receiver whose buffers are full).
    """

    def __init__(self, stream: MemoryStream, handler: Handler, settings: Settings | None) -> None:
        self.stream = stream
        self.handler = handler
        config = h2.config.H2Configuration(client_side=False, header_encoding=None)
        self.h2 = h2.connection.H2Connection(config=config)
        self.h2.local_settings = h2.settings.Settings(
            client=False,
            initial_values={h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: 100}
            | (settings or {}),
        )
        self.acknowledge = True
        self.seen: dict[int, Seen] = {}
        self.peak_open = 0
        self.goaway: h2.events.ConnectionTerminated | None = None
        self.eof = False
        self.release = trio.Event()
        """Set by a test to let the holding handlers answer."""
        self._changed = trio.Event()
        self._send_lock = trio.Lock()

    def stream_of(self, path: str) -> int:
        (stream_id,) = (i for i, seen in self.seen.items() if seen.path == path)
        return stream_id

    async def until(self, condition: Callable[[], bool]) -> None:
        while not condition():
            await self._changed.wait()

    async def flush(self) -> None:
        async with self._send_lock:
            data = self.h2.data_to_send()
            if data:
                await self.stream.send_all(data)

    async def send_raw(self, data: bytes) -> None:
        await self.flush()
        async with self._send_lock:
            await self.stream.send_all(data)

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            while True:
                try:
                    data = await self.stream.receive_some(65536)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    data = b""
                if not data:
                    self.eof = True
                    self._notify()
                    nursery.cancel_scope.cancel()
                    return
                for event in self.h2.receive_data(data):
                    self._record(event, nursery)
                await self._quietly(self.flush())
                self._notify()

    def _record(self, event: h2.events.Event, nursery: trio.Nursery) -> None:
        if isinstance(event, h2.events.RequestReceived):
            self.seen[event.stream_id] = Seen(list(event.headers))
            self.peak_open = max(self.peak_open, self.h2.open_inbound_streams)
            nursery.start_soon(self._quietly, self.handler(self, event.stream_id))
        elif isinstance(event, h2.events.DataReceived):
            self.seen[event.stream_id].body += event.data
            if self.acknowledge:
                self.h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
        elif isinstance(event, h2.events.StreamEnded):
            self.seen[event.stream_id].ended = True
        elif isinstance(event, h2.events.StreamReset):
            self.seen[event.stream_id].reset = event.error_code
        elif isinstance(event, h2.events.ConnectionTerminated):
            self.goaway = event

    async def _quietly(self, step: Awaitable[None]) -> None:
        """A step of a handler, which may find its stream reset or the client gone."""
        with suppress(h2.exceptions.StreamClosedError, trio.BrokenResourceError):
            await step

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def answer(
        self,
        stream_id: int,
        status: int = 200,
        body: bytes = b"",
        headers: tuple[tuple[bytes, bytes], ...] = (),
        *,
        end: bool = True,
    ) -> None:
        block = [(b":status", str(status).encode()), *headers]
        self.h2.send_headers(stream_id, block, end_stream=end and not body)
        await self.flush()
        if body:
            await self.send_body(stream_id, body, end=end)

    async def send_body(self, stream_id: int, body: bytes, *, end: bool = True) -> None:
        """As the client's windows allow (waiting for its WINDOW_UPDATE frames)."""
        offset = 0
        while offset < len(body):
            window = self.h2.local_flow_control_window(stream_id)
            if window <= 0:
                await self.flush()
                await self._changed.wait()
                continue
            size = min(window, self.h2.max_outbound_frame_size, len(body) - offset)
            last = end and offset + size == len(body)
            self.h2.send_data(stream_id, body[offset : offset + size], end_stream=last)
            offset += size
        await self.flush()


async def echo(peer: Peer, stream_id: int) -> None:
    """Answers ``200`` with ``<path> <body length>`` once the request is complete."""
    seen = peer.seen[stream_id]
    await peer.until(lambda: seen.ended)
    body = f"{seen.path} {len(seen.body)}".encode()
    await peer.answer(stream_id, 200, body, ((b"content-type", b"text/plain"),))


async def hold(peer: Peer, stream_id: int) -> None:
    """Answers as :func:`echo`, once the test sets ``peer.release``."""
    await peer.release.wait()
    await echo(peer, stream_id)


async def hang(peer: Peer, stream_id: int) -> None:
    """Never answers."""


@dataclass
class Wire:
    connection: H2Connection
    peer: Peer
    ended: trio.Event
    """Set when the connection's ``run()`` returned."""


async def started(
    nursery: trio.Nursery, handler: Handler, settings: Settings | None = None, **options: Any
) -> tuple[H2Connection, Peer]:
    """A started connection to a scripted receiver that runs in ``nursery``; the
    connection's own ``run()`` is the caller's to start."""
    client_end, server_end = trio.testing.memory_stream_pair()
    peer = Peer(server_end, handler, settings)
    connection = H2Connection(client_end, **options)
    peer.h2.initiate_connection()
    await peer.flush()
    nursery.start_soon(peer.run)
    await connection.start()
    return connection, peer


@asynccontextmanager
async def connected(
    handler: Handler = echo, settings: Settings | None = None, **options: Any
) -> AsyncIterator[Wire]:
    """A started connection to a scripted receiver, its ``run()`` going; closed at the end."""
    ended = trio.Event()

    # On the autojump clock, a test that hangs fails at once rather than never ending.
    with trio.fail_after(600):
        async with trio.open_nursery() as nursery:
            connection, peer = await started(nursery, handler, settings, **options)

            async def run() -> None:
                await connection.run()
                ended.set()

            nursery.start_soon(run)
            try:
                yield Wire(connection, peer, ended)
            finally:
                connection.close()


async def post(
    connection: H2Connection,
    path: str = "/hook",
    body: bytes = b"{}",
    *,
    cap: int = 65536,
    headers: list[tuple[str, str]] | None = None,
) -> WebhookResponse:
    return await connection.request(
        scheme="https",
        authority="sink.test",
        path=path,
        headers=HEADERS if headers is None else headers,
        body=body,
        body_max_bytes=cap,
    )


class Calls:
    """Requests running in the background; ``outcomes[path]`` is the answer or the error,
    or ``"cancelled"``; ``cancel(path)`` cancels one."""

    def __init__(self, nursery: trio.Nursery, connection: H2Connection) -> None:
        self.nursery = nursery
        self.connection = connection
        self.outcomes: dict[str, WebhookResponse | Exception | str] = {}
        self.scopes: dict[str, trio.CancelScope] = {}

    def start(self, path: str, body: bytes = b"{}", **options: Any) -> None:
        scope = self.scopes[path] = trio.CancelScope()

        async def call() -> None:
            with scope:
                try:
                    self.outcomes[path] = await post(self.connection, path, body, **options)
                except Exception as error:
                    self.outcomes[path] = error
            if scope.cancelled_caught:
                self.outcomes[path] = "cancelled"

        self.nursery.start_soon(call)

    def cancel(self, path: str) -> None:
        self.scopes[path].cancel()


def leftovers(connection: H2Connection) -> dict[str, int]:
    """Per-stream state the connection still holds (all zero when nothing is in flight)."""
    return {
        "streams": len(connection._streams),
        "window_waiters": len(connection._window_waiters),
        "slot_waiters": len(connection._slot_waiters),
        "h2_open_streams": connection._h2.open_outbound_streams,
    }


NOTHING_LEFT = {"streams": 0, "window_waiters": 0, "slot_waiters": 0, "h2_open_streams": 0}


def response_text(outcome: WebhookResponse | Exception | str) -> tuple[int, bytes]:
    assert isinstance(outcome, WebhookResponse), outcome
    return outcome.status, outcome.body


# --- multiplexing and limits -------------------------------------------------------------------


async def test_concurrent_requests_share_one_connection(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def answer_when_all_are_open(peer: Peer, stream_id: int) -> None:
        await peer.until(lambda: len(peer.seen) == 50)
        await echo(peer, stream_id)

    async with connected(answer_when_all_are_open) as wire, trio.open_nursery() as nursery:
        calls = Calls(nursery, wire.connection)
        for index in range(50):
            calls.start(f"/hook/{index}", b"x" * index)
    assert {path: response_text(o) for path, o in calls.outcomes.items()} == {
        f"/hook/{index}": (200, f"/hook/{index} {index}".encode()) for index in range(50)
    }
    assert wire.peer.peak_open == 50  # all open at once, on the one connection


async def test_http1_headers_become_an_http2_header_block(
    autojump_clock: trio.testing.MockClock,
) -> None:
    headers = [
        ("Host", "sink.test:8443"),
        ("Content-Length", "999"),
        ("Connection", "keep-alive, X-Hop"),
        ("Keep-Alive", "timeout=5"),
        ("Proxy-Connection", "keep-alive"),
        ("Transfer-Encoding", "chunked"),
        ("Upgrade", "h2c"),
        ("X-Hop", "dropped: named by Connection"),
        ("TE", "gzip"),
        ("Content-Type", "application/json"),
        ("X-Carillon-Attempt", " 1 "),
        ("Authorization", "Bearer secret"),
    ]
    async with connected() as wire:
        response = await wire.connection.request(
            scheme="https",
            authority="sink.test:8443",
            path="/hook?x=1",
            headers=headers,
            body=b"{}",
            body_max_bytes=100,
        )
        assert response == WebhookResponse(
            status=200, headers={"content-type": "text/plain"}, body=b"/hook?x=1 2"
        )
        (seen,) = wire.peer.seen.values()
        assert seen.headers == [
            (b":method", b"POST"),
            (b":scheme", b"https"),
            (b":authority", b"sink.test:8443"),
            (b":path", b"/hook?x=1"),
            (b"content-type", b"application/json"),
            (b"x-carillon-attempt", b"1"),
            (b"authorization", b"Bearer secret"),
            (b"content-length", b"2"),
        ]
        # A credential is kept out of the HPACK table (never indexed), as h2 would:
        never_indexed = [h[0] for h in seen.headers if isinstance(h, NeverIndexedHeaderTuple)]
        assert never_indexed == [b"authorization"]


async def test_a_header_http2_cannot_carry_is_refused_before_anything_is_sent(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with connected() as wire:
        with pytest.raises(ValueError, match="not allowed"):
            await post(wire.connection, headers=[("X-Bad", "a\r\nInjected: 1")])
        with pytest.raises(ValueError, match="not a valid HTTP/2 header name"):
            await post(wire.connection, headers=[("Bad Name", "x")])
        assert wire.peer.seen == {}
        assert response_text(await post(wire.connection, "/after")) == (200, b"/after 2")
        assert leftovers(wire.connection) == NOTHING_LEFT


async def test_never_more_streams_than_the_receiver_allows(
    autojump_clock: trio.testing.MockClock,
) -> None:
    limit = {h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: 2}
    async with connected(hold, limit) as wire, trio.open_nursery() as nursery:
        calls = Calls(nursery, wire.connection)
        calls.start("/a")
        calls.start("/b")
        await wire.peer.until(lambda: len(wire.peer.seen) == 2)
        assert (wire.connection.available(), wire.connection.in_flight) == (False, 2)
        with pytest.raises(ConnectionUnavailable, match="limit of 2 streams"):
            await post(wire.connection, "/c")

        async def when_a_slot_frees() -> None:
            assert await wire.connection.wait_available()
            calls.outcomes["/c"] = await post(wire.connection, "/c")

        nursery.start_soon(when_a_slot_frees)
        await trio.testing.wait_all_tasks_blocked()
        assert len(wire.peer.seen) == 2  # /c waits for a slot
        wire.peer.release.set()
    assert sorted(response_text(o) for o in calls.outcomes.values()) == [
        (200, b"/a 2"),
        (200, b"/b 2"),
        (200, b"/c 2"),
    ]
    assert wire.peer.peak_open == 2


async def test_our_own_stream_cap_applies_below_the_receivers(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with connected(hold, max_streams=1) as wire, trio.open_nursery() as nursery:
        calls = Calls(nursery, wire.connection)
        calls.start("/a")
        await wire.peer.until(lambda: len(wire.peer.seen) == 1)
        assert not wire.connection.available()
        with pytest.raises(ConnectionUnavailable):
            await post(wire.connection, "/b")
        wire.peer.release.set()
    assert response_text(calls.outcomes["/a"]) == (200, b"/a 2")


# --- flow control ------------------------------------------------------------------------------


async def test_a_body_larger_than_the_window_is_sent_as_the_window_opens(
    autojump_clock: trio.testing.MockClock,
) -> None:
    body = bytes(range(256)) * 1200  # 307,200 bytes: past the stream and connection windows
    small_window = {h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 1000}
    async with connected(echo, small_window) as wire, trio.open_nursery() as nursery:
        peer = wire.peer
        peer.acknowledge = False  # the receiver's buffers are full for now
        calls = Calls(nursery, wire.connection)
        calls.start("/big", body)
        await peer.until(lambda: bool(peer.seen) and len(peer.seen[1].body) == 1000)
        await trio.testing.wait_all_tasks_blocked()
        assert len(peer.seen[1].body) == 1000  # no byte past the window
        peer.acknowledge = True
        peer.h2.acknowledge_received_data(1000, 1)
        await peer.flush()
    assert response_text(calls.outcomes["/big"]) == (200, b"/big 307200")
    assert peer.seen[1].body == body
    assert leftovers(wire.connection) == NOTHING_LEFT


async def test_long_answers_are_acknowledged_and_never_stall_the_connection(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Three answers of 6 MiB each: past each stream's window (1 MiB) and, together, past
    the connection's (16 MiB); the receiver only sends what the client acknowledged."""
    big = bytes(range(251)) * (6 * 1024 * 1024 // 251)

    async def large(peer: Peer, stream_id: int) -> None:
        await peer.until(lambda: peer.seen[stream_id].ended)
        await peer.answer(stream_id, 200, big)

    async with connected(large) as wire, trio.open_nursery() as nursery:
        calls = Calls(nursery, wire.connection)
        for path in ("/a", "/b", "/c"):
            calls.start(path, cap=len(big))
    assert [response_text(calls.outcomes[p]) for p in ("/a", "/b", "/c")] == [(200, big)] * 3


# --- the response body cap ---------------------------------------------------------------------


async def test_an_answer_past_the_cap_is_cut_and_its_stream_reset(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def huge(peer: Peer, stream_id: int) -> None:
        if peer.seen[stream_id].path == "/huge":  # and more to come, some day
            await peer.answer(stream_id, 503, b"z" * 100_000, ((b"retry-after", b"5"),), end=False)
        else:
            await echo(peer, stream_id)

    async with connected(huge) as wire:
        response = await post(wire.connection, "/huge", cap=1000)
        assert response == WebhookResponse(
            status=503, headers={"retry-after": "5"}, body=b"z" * 1000
        )
        peer = wire.peer
        await peer.until(lambda: peer.seen[1].reset is not None)
        assert peer.seen[1].reset == Codes.CANCEL
        # The connection goes on; an answer exactly at the cap is whole, and not reset:
        assert response_text(await post(wire.connection, "/ok", cap=6)) == (200, b"/ok 2")
        assert peer.seen[3].reset is None
        assert leftovers(wire.connection) == NOTHING_LEFT


# --- cancellation and clean-up -----------------------------------------------------------------


async def test_cancelling_one_request_resets_its_stream_and_nothing_else(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with connected(hold) as wire, trio.open_nursery() as nursery:
        peer = wire.peer
        calls = Calls(nursery, wire.connection)
        for path in ("/a", "/b", "/c"):
            calls.start(path)
        await peer.until(lambda: len(peer.seen) == 3)
        calls.cancel("/b")
        await peer.until(lambda: peer.seen[peer.stream_of("/b")].reset is not None)
        assert peer.seen[peer.stream_of("/b")].reset == Codes.CANCEL
        assert wire.connection.in_flight == 2
        assert wire.connection.available()
        peer.release.set()
    assert calls.outcomes["/b"] == "cancelled"
    assert response_text(calls.outcomes["/a"]) == (200, b"/a 2")
    assert response_text(calls.outcomes["/c"]) == (200, b"/c 2")
    assert [seen.reset for seen in peer.seen.values()].count(None) == 2
    assert leftovers(wire.connection) == NOTHING_LEFT


async def test_no_stream_state_is_left_behind_whatever_the_outcome(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """One connection through every way a request ends; each releases its stream once."""

    async def script(peer: Peer, stream_id: int) -> None:
        path = peer.seen[stream_id].path
        if path == "/refused":
            peer.h2.reset_stream(stream_id, Codes.REFUSED_STREAM)
            await peer.flush()
        elif path == "/reset":
            await peer.answer(stream_id, 200, b"partial", end=False)
            peer.h2.reset_stream(stream_id, Codes.INTERNAL_ERROR)
            await peer.flush()
        elif path == "/early":  # answers before the body is in, and stops it
            await peer.answer(stream_id, 413, b"too large")
            peer.h2.reset_stream(stream_id, Codes.NO_ERROR)
            await peer.flush()
        elif path == "/capped":
            await peer.answer(stream_id, 200, b"y" * 50_000)
        elif path in {"/hung", "/blocked"}:
            pass
        else:
            await echo(peer, stream_id)

    window = {h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 1000}
    async with connected(script, window) as wire:
        connection, peer = wire.connection, wire.peer
        assert response_text(await post(connection, "/ok")) == (200, b"/ok 2")
        with pytest.raises(StreamRefused):
            await post(connection, "/refused")
        with pytest.raises(ExchangeFailed):
            await post(connection, "/reset")
        assert response_text(await post(connection, "/early", b"e" * 5000)) == (413, b"too large")
        assert response_text(await post(connection, "/capped", cap=10)) == (200, b"y" * 10)
        with trio.move_on_after(5):
            await post(connection, "/hung")
        peer.acknowledge = False
        with trio.move_on_after(5):  # cancelled while waiting for a window
            await post(connection, "/blocked", b"b" * 5000)
        assert len(peer.seen[peer.stream_of("/blocked")].body) == 1000
        assert leftovers(connection) == NOTHING_LEFT
        assert connection.available()


# --- the receiver ending streams and the connection ----------------------------------------------


async def test_goaway_refuses_later_streams_and_lets_earlier_ones_finish(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with connected(hold) as wire, trio.open_nursery() as nursery:
        connection, peer = wire.connection, wire.peer
        calls = Calls(nursery, connection)
        for path in ("/a", "/b", "/c"):
            calls.start(path)
        await peer.until(lambda: len(peer.seen) == 3)
        await peer.send_raw(GoAwayFrame(0, last_stream_id=3, error_code=0).serialize())
        later = next(path for path in ("/a", "/b", "/c") if peer.stream_of(path) == 5)
        await trio.testing.wait_all_tasks_blocked()
        assert isinstance(calls.outcomes[later], StreamRefused)
        assert "GOAWAY NO_ERROR, last stream 3" in str(calls.outcomes[later])
        assert not connection.available()
        assert not await connection.wait_available()
        with pytest.raises(ConnectionUnavailable, match="going away"):
            await post(connection, "/d")
        peer.release.set()
        await wire.ended.wait()  # the connection ends once streams 1 and 3 are answered
    earlier = sorted(response_text(o) for p, o in calls.outcomes.items() if p != later)
    assert [status for status, _ in earlier] == [200, 200]
    assert sorted(peer.seen) == [1, 3, 5]  # no stream opened after the GOAWAY
    assert connection.closed
    assert "GOAWAY" in (connection.end_reason or "")


async def test_a_goaway_on_an_idle_connection_ends_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with connected() as wire:
        assert response_text(await post(wire.connection)) == (200, b"/hook 2")
        await wire.peer.send_raw(GoAwayFrame(0, last_stream_id=1, error_code=0).serialize())
        await wire.ended.wait()
        assert not wire.connection.available()


async def test_cancelling_the_last_stream_after_a_goaway_ends_the_connection(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with connected(hang) as wire, trio.open_nursery() as nursery:
        calls = Calls(nursery, wire.connection)
        calls.start("/a")
        await wire.peer.until(lambda: len(wire.peer.seen) == 1)
        await wire.peer.send_raw(GoAwayFrame(0, last_stream_id=1, error_code=0).serialize())
        await trio.testing.wait_all_tasks_blocked()
        assert not wire.ended.is_set()  # stream 1 may still be answered
        calls.cancel("/a")
        await wire.ended.wait()
    assert calls.outcomes["/a"] == "cancelled"
    assert "GOAWAY" in (wire.connection.end_reason or "")


async def test_resets_by_the_receiver_refused_only_when_provably_unprocessed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def resets(peer: Peer, stream_id: int) -> None:
        path = peer.seen[stream_id].path
        if path == "/refused-late":
            await peer.answer(stream_id, 200, end=False)
        elif path == "/refused-after-103":
            peer.h2.send_headers(stream_id, [(b":status", b"103")])
        code = {"/ok": None, "/internal": Codes.INTERNAL_ERROR}.get(path, Codes.REFUSED_STREAM)
        if code is None:
            await echo(peer, stream_id)
        else:
            peer.h2.reset_stream(stream_id, code)
            await peer.flush()

    async with connected(resets) as wire:
        with pytest.raises(StreamRefused, match="REFUSED_STREAM"):
            await post(wire.connection, "/refused")
        with pytest.raises(ExchangeFailed, match=r"reset the stream \(INTERNAL_ERROR\)"):
            await post(wire.connection, "/internal")
        with pytest.raises(ExchangeFailed, match=r"reset the stream \(REFUSED_STREAM\)"):
            await post(wire.connection, "/refused-late")  # it had answered: not provable
        with pytest.raises(ExchangeFailed, match=r"reset the stream \(REFUSED_STREAM\)"):
            await post(wire.connection, "/refused-after-103")  # it had begun: not provable
        assert response_text(await post(wire.connection, "/ok")) == (200, b"/ok 2")


async def test_the_receiver_closing_the_connection_fails_every_open_stream(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with connected(hang) as wire, trio.open_nursery() as nursery:
        calls = Calls(nursery, wire.connection)
        for path in ("/a", "/b"):
            calls.start(path)
        await wire.peer.until(lambda: len(wire.peer.seen) == 2)
        await wire.peer.stream.aclose()
        await wire.ended.wait()
    assert all(
        isinstance(outcome, ExchangeFailed) and "closed the connection" in str(outcome)
        for outcome in calls.outcomes.values()
    )
    assert len(calls.outcomes) == 2
    assert wire.connection.closed
    with pytest.raises(ConnectionUnavailable, match="closed"):
        await post(wire.connection)


def huge_header_block(stream_id: int) -> bytes:
    """A HEADERS block decoding to 100 KB of headers (over the 64 KiB we accept)."""
    encoder = h2.connection.H2Connection().encoder
    block = encoder.encode([(b":status", b"200"), (b"x-big", b"a" * 100_000)], huffman=False)
    frames: list[Frame] = [HeadersFrame(stream_id, data=block[:16384])]
    for offset in range(16384, len(block), 16384):
        frames.append(ContinuationFrame(stream_id, data=block[offset : offset + 16384]))
    frames[-1].flags.add("END_HEADERS")
    return b"".join(frame.serialize() for frame in frames)


def continuation_flood(stream_id: int) -> bytes:
    """A HEADERS frame followed by CONTINUATION frames that never end."""
    frames: list[Frame] = [HeadersFrame(stream_id, data=b"\x88")]
    frames += [ContinuationFrame(stream_id, data=b"\x00" * 10) for _ in range(100)]
    return b"".join(frame.serialize() for frame in frames)


VIOLATIONS: dict[str, Callable[[int], bytes]] = {
    "garbage": lambda _: b"this is not HTTP/2 at all, not even close\r\n\r\n",
    "an announced frame too large (and no body)": lambda _: (
        (1 << 20).to_bytes(3, "big") + b"\x00\x00" + (1).to_bytes(4, "big")
    ),
    "DATA on stream 0": lambda _: b"\x00\x00\x01\x00\x00\x00\x00\x00\x00x",
    "a zero WINDOW_UPDATE": lambda _: b"\x00\x00\x04\x08\x00\x00\x00\x00\x00\x00\x00\x00\x00",
    "a header block over the limit": huge_header_block,
    "a CONTINUATION flood": continuation_flood,
}


@pytest.mark.parametrize("violation", list(VIOLATIONS))
async def test_a_protocol_violation_fails_every_stream_and_ends_the_connection(
    violation: str, autojump_clock: trio.testing.MockClock
) -> None:
    with trio.fail_after(60):  # on the autojump clock: fails at once if anything hangs
        async with connected(hang) as wire, trio.open_nursery() as nursery:
            calls = Calls(nursery, wire.connection)
            calls.start("/a")
            calls.start("/b")
            await wire.peer.until(lambda: len(wire.peer.seen) == 2)
            await wire.peer.send_raw(VIOLATIONS[violation](1))
            await wire.ended.wait()
            await wire.peer.until(lambda: wire.peer.eof)
    assert len(calls.outcomes) == 2
    for outcome in calls.outcomes.values():
        assert isinstance(outcome, ExchangeFailed)
        assert "broke HTTP/2" in str(outcome)
    assert wire.peer.goaway is not None  # the client said why, before closing
    assert wire.peer.goaway.error_code != Codes.NO_ERROR


# --- answers -----------------------------------------------------------------------------------


async def test_informational_answers_and_trailers_are_skipped(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def elaborate(peer: Peer, stream_id: int) -> None:
        await peer.until(lambda: peer.seen[stream_id].ended)
        peer.h2.send_headers(stream_id, [(b":status", b"103"), (b"link", b"</a>")])
        headers = ((b"x-name", b"caf\xe9"), (b"set-cookie", b"a=1"), (b"set-cookie", b"b=2"))
        await peer.answer(stream_id, 202, b"accepted", headers, end=False)
        peer.h2.send_headers(stream_id, [(b"x-trailer", b"t")], end_stream=True)
        await peer.flush()

    async with connected(elaborate) as wire:
        response = await post(wire.connection)
    assert response == WebhookResponse(
        status=202, headers={"x-name": "café", "set-cookie": "b=2"}, body=b"accepted"
    )


async def test_a_hung_receiver_is_bounded_by_the_callers_deadline(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def hang_once(peer: Peer, stream_id: int) -> None:
        if peer.seen[stream_id].path != "/hang":
            await echo(peer, stream_id)

    async with connected(hang_once) as wire:
        started = trio.current_time()
        with trio.move_on_after(30) as deadline:
            await post(wire.connection, "/hang")
        assert deadline.cancelled_caught
        assert trio.current_time() - started == pytest.approx(30)
        await wire.peer.until(lambda: wire.peer.seen[1].reset is not None)
        assert wire.peer.seen[1].reset == Codes.CANCEL
        assert response_text(await post(wire.connection, "/after")) == (200, b"/after 2")


# --- the connection's life ---------------------------------------------------------------------


async def test_close_fails_open_requests_says_goaway_and_ends_run(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with connected(hang) as wire, trio.open_nursery() as nursery:
        calls = Calls(nursery, wire.connection)
        calls.start("/a")
        await wire.peer.until(lambda: len(wire.peer.seen) == 1)
        wire.connection.close()
        await wire.ended.wait()
        await wire.peer.until(lambda: wire.peer.eof)
    outcome = calls.outcomes["/a"]
    assert isinstance(outcome, ExchangeFailed)
    assert "closed by the client" in str(outcome)
    assert wire.peer.goaway is not None
    assert wire.peer.goaway.error_code == Codes.NO_ERROR


async def test_cancelling_run_fails_open_requests_and_closes_the_transport(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with trio.open_nursery() as nursery:
        connection, peer = await started(nursery, hang)
        run_scope = trio.CancelScope()

        async def run() -> None:
            with run_scope:
                await connection.run()

        nursery.start_soon(run)
        calls = Calls(nursery, connection)
        calls.start("/a")
        await peer.until(lambda: len(peer.seen) == 1)
        run_scope.cancel()
        await peer.until(lambda: peer.eof)
    assert isinstance(calls.outcomes["/a"], ExchangeFailed)
    assert run_scope.cancelled_caught


async def test_run_as_a_system_task_survives_a_broken_receiver(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with trio.open_nursery() as nursery:
        connection, peer = await started(nursery, hang)
        trio.lowlevel.spawn_system_task(connection.run)
        await peer.send_raw(b"\xff" * 64)
        await peer.until(lambda: peer.eof)
    assert connection.closed
    assert "broke HTTP/2" in (connection.end_reason or "")


async def test_a_receiver_that_takes_no_more_bytes_fails_the_streams(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with connected(hang) as wire:
        await wire.peer.stream.receive_stream.aclose()  # its end of our writes is gone
        with pytest.raises(ExchangeFailed, match="sending failed"):
            await post(wire.connection)
        await wire.ended.wait()
        assert not wire.connection.available()


@hypothesis.settings(max_examples=200, deadline=None)
@hypothesis.given(
    lengths=st.lists(st.integers(0, 16384), max_size=12),
    cuts=st.lists(st.integers(0, 300_000), max_size=8),
)
def test_frame_boundaries_are_followed_however_the_bytes_are_split(
    lengths: list[int], cuts: list[int]
) -> None:
    """A frame announcing more than our MAX_FRAME_SIZE is refused from its header alone,
    in whatever reads the bytes arrive; frames within it never are."""
    wire = b"".join(n.to_bytes(3, "big") + b"\x00\x00\x00\x00\x00\x01" + b"f" * n for n in lengths)
    too_long = (16385).to_bytes(3, "big") + b"\x00\x00\x00\x00\x00\x01"
    data = wire + too_long
    connection = H2Connection(trio.testing.memory_stream_pair()[0])
    ends = sorted({cut % (len(data) + 1) for cut in cuts} | {len(data)})
    start, verdicts = 0, []
    for end in ends:
        if end > start:
            verdicts.append((end, connection._scan(data[start:end])))
            start = end
    assert [end for end, verdict in verdicts if verdict] == [len(data)]


async def test_a_connection_not_started_takes_no_request() -> None:
    client_end, _ = trio.testing.memory_stream_pair()
    connection = H2Connection(client_end)
    assert not connection.available()
    assert not await connection.wait_available()
    with pytest.raises(ConnectionUnavailable, match="not started"):
        await post(connection)
    with pytest.raises(RuntimeError, match="after start"):
        await connection.run()


async def receiver_says(data: bytes) -> ConnectFailed:
    client_end, server_end = trio.testing.memory_stream_pair()
    connection = H2Connection(client_end)
    await server_end.send_all(data)
    if not data:
        await server_end.send_stream.aclose()  # EOF, as a receiver that hangs up
    with pytest.raises(ConnectFailed) as failed:
        await connection.start()
    assert connection.closed
    assert await server_end.receive_some(1 << 20)  # our preface, then:
    assert await server_end.receive_some() == b""  # the transport is closed
    return failed.value


async def test_start_fails_as_connect_failed_when_the_receiver_does_not_speak_http2(
    autojump_clock: trio.testing.MockClock,
) -> None:
    with trio.fail_after(60):
        refused = await receiver_says(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
        assert "does not speak HTTP/2" in str(refused)
        closed = await receiver_says(b"")
        assert "closed the connection" in str(closed)
        ping = b"\x00\x00\x08\x06\x00\x00\x00\x00\x00" + b"\x00" * 8
        assert "begin HTTP/2 with SETTINGS" in str(await receiver_says(ping))


# --- a real receiver: hypercorn over TLS -------------------------------------------------------


async def asgi_echo(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Answers ``<path> <body>``, saying which HTTP version and client port carried it."""
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    headers = [
        (b"x-http-version", scope["http_version"].encode()),
        (b"x-client-port", str(scope["client"][1]).encode()),
    ]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": scope["path"].encode() + b" " + body})


async def test_hypercorn_over_tls_answers_200_concurrent_requests_on_one_connection(
    certificate: tuple[Path, Path],
) -> None:
    from hypercorn.config import Config
    from hypercorn.trio import serve

    config = Config()
    config.bind = ["127.0.0.1:0"]
    config.certfile, config.keyfile = str(certificate[0]), str(certificate[1])
    config.accesslog = None
    config.errorlog = logging.getLogger("tests.hypercorn")
    stop = trio.Event()
    context = ssl.create_default_context(cafile=str(certificate[0]))
    context.verify_flags &= ~getattr(ssl, "VERIFY_X509_STRICT", 0)
    context.set_alpn_protocols(["h2", "http/1.1"])
    results: dict[int, WebhookResponse] = {}
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            app: Any = asgi_echo
            binds = await nursery.start(partial(serve, app, config, shutdown_trigger=stop.wait))
            port = int(binds[0].rsplit(":", 1)[1])
            tcp = await trio.open_tcp_stream("127.0.0.1", port)
            tls = trio.SSLStream(tcp, context, server_hostname="sink.test", https_compatible=True)
            await tls.do_handshake()
            assert tls.selected_alpn_protocol() == "h2"
            connection = H2Connection(tls)
            await connection.start()
            nursery.start_soon(connection.run)

            async def one(index: int) -> None:
                assert await connection.wait_available()
                results[index] = await post(connection, f"/hook/{index}", b"%d" % index)

            async with trio.open_nursery() as requests:
                for index in range(200):
                    requests.start_soon(one, index)
            connection.close()
            stop.set()
    assert sorted(results) == list(range(200))
    for index, response in results.items():
        assert (response.status, response.body) == (200, f"/hook/{index} {index}".encode())
        assert response.headers["x-http-version"] == "2"
    assert len({response.headers["x-client-port"] for response in results.values()}) == 1
