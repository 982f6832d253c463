"""HTTP/2 for the webhook client: one connection, many concurrent deliveries (h2 on trio).

:class:`H2Connection` is the protocol half of the webhook client's HTTP/2 path. It speaks
HTTP/2 with the sans-IO ``h2`` library (what httpx uses) over one trio stream that the
webhook client (:mod:`engine.handlers.http_client`) connected to a vetted address and, for
``https``, wrapped in TLS where ALPN selected ``h2``. The client pools it under the same key
as an HTTP/1.1 connection and sends many deliveries on it at once.

Life of a connection: ``await start()`` (client preface and SETTINGS, then the receiver's
SETTINGS), then :meth:`H2Connection.run` as a background task (the caller's system task or
nursery: this module takes none), then any number of concurrent :meth:`H2Connection.request`
calls while :meth:`H2Connection.available` says so (:meth:`H2Connection.wait_available`
waits for a slot); :meth:`H2Connection.close` ends it at once.

Design: ``run()`` reads the socket, feeds ``h2`` and routes each event to the state of its
stream -- a small struct and a ``trio.Event`` per request, no task per request. A single
writer task, started inside ``run()``, sends whatever ``h2`` has queued: writes never
interleave, and the reader never waits on a write, so a receiver that stops reading until
its own answers are read cannot deadlock the connection. ``request()`` queues its frames,
wakes the writer and waits on its stream's event. Request header blocks are built valid and
normalised here, so ``h2``'s own outbound checks are off (measured: a quarter of the CPU
per request); ``authorization``, ``proxy-authorization`` and ``cookie`` stay out of the HPACK
table, as ``h2`` would keep them.

Client CPU per request (N=5,000 POSTs, 100 in flight, hypercorn on uvloop answering 200 in
another process, the 2-core machine, two runs each; the HTTP/1.1 client with 100 connections
against the same receiver):

==========  ====================  =======================
transport   HTTP/1.1 (h11, pool)  HTTP/2 (one connection)
==========  ====================  =======================
cleartext   195-228 µs            201-257 µs
TLS         496-540 µs            343-374 µs
==========  ====================  =======================

On par in cleartext (HPACK encoding is the largest part of ``h2``'s cost), a third cheaper over TLS
(many requests per TLS record, one handshake); either way far fewer sockets per receiver.

What it guarantees:

* **The receiver's limits are kept.** Never more open streams than the receiver's
  ``MAX_CONCURRENT_STREAMS`` (nor ``max_streams``, when given): :meth:`~H2Connection.request`
  on a connection without room raises :class:`ConnectionUnavailable` (nothing sent) rather
  than pass a limit. ``start()`` waits for the receiver's SETTINGS, so the limit is known
  before the first request. A request body is sent as the receiver's flow-control windows
  open (waiting for its WINDOW_UPDATE frames), in frames within its ``MAX_FRAME_SIZE``.
* **Answers never stall the connection.** Each stream may receive
  :data:`STREAM_WINDOW_BYTES` (1 MiB) and the connection :data:`CONNECTION_WINDOW_BYTES`
  (16 MiB) unacknowledged; every byte is acknowledged as soon as it is read (``h2`` batches
  the WINDOW_UPDATE frames), the bytes of abandoned streams included.
* **As the HTTP/1.1 client does:** at most ``body_max_bytes`` of a body is kept; past it the
  stream is reset (``CANCEL``) and the answer returned with its body cut at the cap, the
  connection staying in use. Response headers come as ``str`` (latin-1) in a dict, names
  lower-case, the last of repeated ones; 1xx answers and trailers are skipped; push is
  disabled. Request headers are given HTTP/1.1-style: ``Host``, ``Content-Length``, the
  hop-by-hop headers (and those ``Connection`` names) are dropped, ``:authority`` and our
  own ``content-length`` stand in; a header HTTP/2 cannot carry raises ``ValueError``
  before anything is sent.
* **Faults are errors, never hangs or leaks.** The caller's cancel scope bounds each request
  (a receiver that never answers is waited on until then). Cancelling one request resets
  its stream (``RST_STREAM CANCEL``) and frees its slot; the connection and the other
  streams go on. Every per-stream resource is released exactly once, in the ``finally`` of
  its request. A request ends with:

  - :class:`StreamRefused` when it was provably not processed, so it may be sent again on
    another connection: the receiver reset its stream with ``REFUSED_STREAM`` before any
    answer (1xx included), or sent GOAWAY with a last stream id below it. After a GOAWAY no
    stream is opened; the streams it covers complete normally and the connection ends when
    they have (hypercorn, for one, says GOAWAY after 1,000 requests on a connection).
  - :class:`~engine.handlers.http_client.ExchangeFailed` when it may have been processed:
    any other reset by the receiver (the message names the code); for every open stream,
    the connection closed, reset or unwritable, or a protocol violation by the receiver
    (malformed frames, a frame announced longer than our ``MAX_FRAME_SIZE`` -- refused from
    its header, not buffered -- a header block over :data:`RESPONSE_HEAD_BYTES_MAX`, bytes
    that are not HTTP/2). We answer a violation with GOAWAY and close. Nothing is resent here.

* **run() cannot crash the node.** It returns when the connection ends, whatever the cause
  (every open stream has failed by then, our GOAWAY is sent if due and the transport is
  closed); it raises only ``trio.Cancelled``, when its caller cancels it, after the same
  clean-up. An unexpected error inside is logged and ends the connection like a fault.
  ``start()`` raises :class:`~engine.handlers.http_client.ConnectFailed` (and closes the
  transport) when the receiver does not answer with HTTP/2.

Not done: server push, priorities, PING keep-alives (an idle connection is the pool's to
reap), request trailers, resending (the caller decides, on :class:`StreamRefused`). A
receiver that stops reading stalls the writer, hence every stream of its connection until
each one's deadline; that is the pool's signal to stop sending there.
"""

from __future__ import annotations

import contextlib
import logging
import re
from typing import Final

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings
import trio
from hpack import NeverIndexedHeaderTuple
from hyperframe.frame import Frame, GoAwayFrame

from engine.handlers.http_wire import (
    RECEIVE_BYTES,
    RESPONSE_HEAD_BYTES_MAX,
    ConnectFailed,
    ExchangeFailed,
    StreamRefused,
    WebhookResponse,
    describe,
)

__all__ = [
    "CONNECTION_WINDOW_BYTES",
    "STREAM_WINDOW_BYTES",
    "ConnectionUnavailable",
    "H2Connection",
    "StreamRefused",
]

log = logging.getLogger("carillon.http2")

STREAM_WINDOW_BYTES: Final = 1 << 20
"""What the receiver may send on one stream before we acknowledge (our initial window)."""
CONNECTION_WINDOW_BYTES: Final = 16 << 20
"""What the receiver may send on all streams together before we acknowledge."""
GOODBYE_S: Final = 1.0
"""Longest time spent sending a last GOAWAY when the connection ends."""
STREAM_ID_MAX: Final = 2**31 - 1
_DROPPED: Final = frozenset(
    {"host", "content-length", "connection", "keep-alive", "proxy-connection",
     "transfer-encoding", "upgrade"}
)  # fmt: skip
"""HTTP/1.1 headers never sent on HTTP/2 (framing, hop-by-hop; ``:authority`` is the host)."""
_NAME: Final = re.compile(r"[!#$%&'*+.^_`|~0-9a-z-]+")
"""A lower-case field name (RFC 9110 token), as HTTP/2 requires."""
_VALUE_ILLEGAL: Final = re.compile(r"[\r\n\0]")
_NEVER_INDEXED: Final = frozenset({b"authorization", b"proxy-authorization", b"cookie"})
"""Kept out of the HPACK table (as h2's own normalisation, which we replace, would)."""


class ConnectionUnavailable(StreamRefused):
    """:meth:`H2Connection.request` on a connection that cannot open one more stream now
    (closed, going away, at the stream limit, out of stream ids): nothing was sent."""


class _Client(h2.connection.H2Connection):
    """``h2``'s client connection, except that a received GOAWAY does not close it.

    ``h2`` moves its connection to CLOSED on GOAWAY and then refuses every later frame, so
    the streams the GOAWAY lets finish could not (python-hyper/h2#1181, open since 2019);
    it also drops the frames queued to be sent. RFC 9113 section 6.8: "Activity on streams
    numbered lower than or equal to the last stream identifier might still complete
    successfully". Here GOAWAY only becomes the event; :class:`H2Connection` opens no new
    stream after it.
    """

    def _receive_goaway_frame(
        self, frame: GoAwayFrame
    ) -> tuple[list[Frame], list[h2.events.Event]]:
        event = h2.events.ConnectionTerminated()
        event.error_code = _error_code(frame.error_code)
        event.last_stream_id = frame.last_stream_id
        event.additional_data = frame.additional_data or None
        return [], [event]


class _Stream:
    """What one request waits for; ``done`` is set once, when it has an answer or failed."""

    __slots__ = ("body", "cap", "done", "error", "headers", "informed", "status")

    def __init__(self, cap: int) -> None:
        self.status = 0
        self.informed = False
        """A 1xx answer came (the receiver had begun: a later REFUSED_STREAM proves nothing)."""
        self.headers: dict[str, str] = {}
        self.body = bytearray()
        self.cap = cap
        self.done = trio.Event()
        self.error: Exception | None = None


class H2Connection:
    """One HTTP/2 connection carrying many concurrent POSTs (see the module docstring).

    ``stream`` is connected (and TLS with ALPN ``h2`` for https) and owned from now on: it
    is closed when :meth:`run` ends. ``max_streams`` caps the open streams below the
    receiver's own limit, if given.
    """

    def __init__(self, stream: trio.abc.Stream, *, max_streams: int | None = None) -> None:
        if max_streams is not None and max_streams < 1:
            raise ValueError("max_streams must be at least 1")
        self._stream = stream
        self._max_streams = max_streams
        # Our header blocks are built valid and normalised (_request_headers): h2 need not
        # check them again (a third of its cost per request).
        config = h2.config.H2Configuration(
            client_side=True,
            header_encoding=None,
            validate_outbound_headers=False,
            normalize_outbound_headers=False,
        )
        self._h2 = _Client(config=config)
        # Set before the preface, so that the first SETTINGS frame carries them (and h2
        # applies them at once; nothing is pending an ACK).
        self._h2.local_settings = h2.settings.Settings(
            client=True,
            initial_values={
                h2.settings.SettingCodes.ENABLE_PUSH: 0,
                h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: STREAM_WINDOW_BYTES,
                h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: 100,
                h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE: RESPONSE_HEAD_BYTES_MAX,
            },
        )
        # Not in RFC 7540's SETTINGS: some servers refuse it in a preface (httpx drops it too).
        del self._h2.local_settings[h2.settings.SettingCodes.ENABLE_CONNECT_PROTOCOL]
        self._h2.decoder.max_header_list_size = RESPONSE_HEAD_BYTES_MAX
        self._streams: dict[int, _Stream] = {}
        self._window_waiters: dict[int, trio.Event] = {}
        self._writer = trio.lowlevel.ParkingLot()
        self._slot_waiters = trio.lowlevel.ParkingLot()
        self._writing = False
        self._run_scope = trio.CancelScope()
        self._started = False
        self._running = False
        self._settled = False
        self._closed = False
        self._end_reason: str | None = None
        self._scan_head = b""
        self._scan_skip = 0
        self._goaway_last: int | None = None
        self._goaway_code = ""
        self.idle_since = 0.0
        """When the last open stream was released (for the pool's idle reaper)."""

    # --- state ---------------------------------------------------------------------------

    def available(self) -> bool:
        """Whether :meth:`request` can open one more stream now."""
        return (
            self._settled
            and not self._closed
            and self._goaway_last is None
            and len(self._streams) < self._stream_limit()
            and self._ids_left()
        )

    async def wait_available(self) -> bool:
        """Wait until :meth:`available` (``True``), or until it never will again: closed,
        going away or out of stream ids (``False``). A caller that gets ``True`` and calls
        :meth:`request` without awaiting anything in between gets the slot."""
        while not self.available():
            if self._gone():
                return False
            await self._slot_waiters.park()
        return True

    def _slot_freed(self) -> None:
        if self._slot_waiters:
            self._slot_waiters.unpark_all()  # each checks again; the first ones get the slots

    def _gone(self) -> bool:
        """Whether no stream will ever be opened again (or start() has not succeeded)."""
        return (
            not self._settled
            or self._closed
            or self._goaway_last is not None
            or not self._ids_left()
        )

    def _ids_left(self) -> bool:
        return self._h2.highest_outbound_stream_id + 2 <= STREAM_ID_MAX

    @property
    def in_flight(self) -> int:
        """Requests open on this connection (each holds one stream)."""
        return len(self._streams)

    @property
    def closed(self) -> bool:
        """Ended, or ending: no request will be taken (a pool drops the connection)."""
        return self._closed

    @property
    def end_reason(self) -> str | None:
        """Why the connection ended (``None`` while it is open)."""
        return self._end_reason if self._closed else None

    def _stream_limit(self) -> int:
        limit = self._h2.remote_settings.max_concurrent_streams
        return limit if self._max_streams is None else min(limit, self._max_streams)

    def _unavailable(self) -> str:
        if not self._settled and not self._closed:
            return "the HTTP/2 connection is not started"
        if self._closed:
            return f"the HTTP/2 connection is closed ({self._end_reason})"
        if self._goaway_last is not None:
            return f"the receiver is going away (GOAWAY {self._goaway_code})"
        if len(self._streams) >= self._stream_limit():
            return f"the HTTP/2 connection is at its limit of {self._stream_limit()} streams"
        return "the HTTP/2 connection has used every stream id"

    # --- life --------------------------------------------------------------------------

    async def start(self) -> None:
        """Send the client preface and our SETTINGS; wait for the receiver's SETTINGS.

        Raises :class:`~engine.handlers.http_client.ConnectFailed` if the receiver does not
        answer with HTTP/2 (no request was sent); bound it with a cancel scope.
        """
        if self._started:
            raise RuntimeError("the HTTP/2 connection is already started")
        self._started = True
        try:
            await self._handshake()
        except BaseException as error:
            self._closed = True
            self._note_end("the connection could not be started")
            await trio.aclose_forcefully(self._stream)
            if isinstance(error, trio.BrokenResourceError | trio.ClosedResourceError | OSError):
                raise ConnectFailed(describe(error)) from None
            if isinstance(error, h2.exceptions.ProtocolError):
                raise ConnectFailed(f"the receiver does not speak HTTP/2: {error}") from None
            raise

    async def _handshake(self) -> None:
        h2c = self._h2
        h2c.initiate_connection()
        h2c.increment_flow_control_window(CONNECTION_WINDOW_BYTES - h2c.inbound_flow_control_window)
        await self._stream.send_all(h2c.data_to_send())
        while not self._settled:
            data = await self._stream.receive_some(RECEIVE_BYTES)
            if not data:
                raise ConnectFailed("the receiver closed the connection instead of HTTP/2")
            too_large = self._scan(data)
            if too_large:
                raise ConnectFailed(f"the receiver does not speak HTTP/2: {too_large}")
            events = h2c.receive_data(data)
            if events and not isinstance(events[0], h2.events.RemoteSettingsChanged):
                raise ConnectFailed("the receiver did not begin HTTP/2 with SETTINGS")
            for event in events:
                self._handle(event)
        pending = h2c.data_to_send()  # our SETTINGS ACK, and whatever else is due
        if pending:
            await self._stream.send_all(pending)

    async def run(self) -> None:
        """Read and write the connection until it ends (see the module docstring).

        Returns when the connection ends, for any reason: every stream still open has failed
        by then and the transport is closed. Raises only ``trio.Cancelled`` (after the same
        clean-up) when the caller cancels it. Call once, after :meth:`start`.
        """
        if not self._started or self._running:
            raise RuntimeError("run() is called once, after start()")
        self._running = True
        try:
            with self._run_scope:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._write)
                    reason = await self._read()
                    self._note_end(reason)
                    nursery.cancel_scope.cancel()
        except Exception as error:
            log.exception("the HTTP/2 connection failed unexpectedly")
            self._note_end(f"internal error: {describe(error)}")
        finally:
            self._end(self._end_reason or "the connection was closed")
            await self._goodbye()
            await trio.aclose_forcefully(self._stream)

    def close(self) -> None:
        """End the connection now: requests still open fail with ``ExchangeFailed``.

        The transport is closed by :meth:`run` as it returns (at once); if ``run()`` never
        ran, closing it is the caller's.
        """
        self._note_end("the connection was closed by the client")
        if not self._closed:
            with contextlib.suppress(h2.exceptions.ProtocolError):
                self._h2.close_connection()
        self._end(self._end_reason or "the connection was closed by the client")
        self._run_scope.cancel()

    def _note_end(self, reason: str) -> None:
        if self._end_reason is None:
            self._end_reason = reason

    def _end(self, reason: str) -> None:
        """Fail every open stream: refused if the GOAWAY proves it, else an exchange failure."""
        self._note_end(reason)
        self._closed = True
        self._slot_freed()
        for stream_id, state in self._streams.items():
            if not state.done.is_set():
                if self._goaway_last is not None and stream_id > self._goaway_last:
                    state.error = self._refused_by_goaway(stream_id)
                else:
                    state.error = ExchangeFailed(reason)
                self._finish(stream_id, state)

    async def _goodbye(self) -> None:
        """Send what is queued (our GOAWAY after a protocol error or close()), briefly, unless
        the writer stopped in the middle of a write (the framing would be broken)."""
        if self._writing:
            return
        data = self._h2.data_to_send()
        if not data:
            return
        failures = (trio.BrokenResourceError, trio.ClosedResourceError, OSError)
        deadline = trio.current_time() + GOODBYE_S
        with trio.CancelScope(shield=True, deadline=deadline), contextlib.suppress(*failures):
            await self._stream.send_all(data)

    # --- the writer and the reader -----------------------------------------------------

    def _wake_writer(self) -> None:
        self._writer.unpark()

    async def _write(self) -> None:
        """Send what ``h2`` has queued, in order, until cancelled or the transport fails."""
        h2c = self._h2
        stream = self._stream
        try:
            while True:
                data = h2c.data_to_send()
                if not data:
                    await self._writer.park()
                    continue
                self._writing = True
                await stream.send_all(data)
                self._writing = False
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as error:
            self._note_end(f"sending failed: {describe(error)}")
            self._run_scope.cancel()

    async def _read(self) -> str:
        """Read and route frames until the connection ends; return why it ended."""
        h2c = self._h2
        stream = self._stream
        while True:
            try:
                data = await stream.receive_some(RECEIVE_BYTES)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as error:
                return f"the connection failed: {describe(error)}"
            if not data:
                return "the receiver closed the connection"
            too_large = self._scan(data)
            if too_large:
                h2c.close_connection(h2.errors.ErrorCodes.FRAME_SIZE_ERROR)
                return f"the receiver broke HTTP/2: {too_large}"
            try:
                events = h2c.receive_data(data)
            except h2.exceptions.ProtocolError as error:
                # h2 queued a GOAWAY with the error code; run() sends it on the way out.
                return f"the receiver broke HTTP/2: {type(error).__name__}: {error}"
            for event in events:
                self._handle(event)
            self._wake_writer()
            if self._gone_away():
                return self._gone_away_reason()

    def _scan(self, data: bytes | bytearray) -> str | None:
        """Follow the frame boundaries, to refuse a frame longer than our MAX_FRAME_SIZE as
        soon as its header arrives (h2 would first buffer all of it: up to 16 MiB); what is
        wrong, if anything."""
        limit = self._h2.max_inbound_frame_size
        size = len(data)
        position = self._scan_skip
        if self._scan_head:  # a frame header split between reads
            head = self._scan_head + data[: 9 - len(self._scan_head)]
            if len(head) < 9:
                self._scan_head = head
                return None
            position = 9 - len(self._scan_head)
            self._scan_head = b""
            length = int.from_bytes(head[:3])
            if length > limit:
                return f"a frame of {length} bytes announced (at most {limit})"
            position += length
        while position + 9 <= size:
            length = int.from_bytes(data[position : position + 3])
            if length > limit:
                return f"a frame of {length} bytes announced (at most {limit})"
            position += 9 + length
        if position < size:
            self._scan_head = bytes(data[position:])
            self._scan_skip = 0
        else:
            self._scan_skip = position - size
        return None

    def _handle(self, event: h2.events.Event) -> None:
        """Route one event to its stream (or to the connection)."""
        if isinstance(event, h2.events.DataReceived):
            self._received_data(event)
        elif isinstance(event, h2.events.ResponseReceived):
            self._response(event)
        elif isinstance(event, h2.events.InformationalResponseReceived):
            state = self._streams.get(event.stream_id)
            if state is not None:
                state.informed = True  # skipped, but the receiver has begun
        elif isinstance(event, h2.events.StreamEnded):
            state = self._streams.get(event.stream_id)
            if state is not None and not state.done.is_set():
                self._finish(event.stream_id, state)
        elif isinstance(event, h2.events.WindowUpdated):
            self._window_opened(event.stream_id)
        elif isinstance(event, h2.events.RemoteSettingsChanged):
            self._settled = True
            self._window_opened(0)  # the initial window or the frame size may have grown
            self._slot_freed()  # MAX_CONCURRENT_STREAMS may have grown
        elif isinstance(event, h2.events.StreamReset):
            self._stream_reset(event)
        elif isinstance(event, h2.events.ConnectionTerminated):
            self._goaway(event)
        # Otherwise: trailers (skipped), PING and SETTINGS (h2 answers them), priorities,
        # ALTSVC and unknown frames (ignored).

    def _response(self, event: h2.events.ResponseReceived) -> None:
        state = self._streams.get(event.stream_id)
        if state is None or state.done.is_set():
            return
        headers = state.headers
        status = b""
        for name, value in event.headers:
            if name[:1] != b":":
                headers[name.decode("latin-1")] = value.decode("latin-1")
            elif name == b":status":
                status = value
        if len(status) == 3 and status.isdigit():
            state.status = int(status)
        else:
            state.error = ExchangeFailed(f"the answer has a malformed status {status!r}")
            self._reset(event.stream_id, h2.errors.ErrorCodes.PROTOCOL_ERROR)
            self._finish(event.stream_id, state)

    def _window_opened(self, stream_id: int) -> None:
        """Wake the body senders that may now send: of this stream, or all (0)."""
        if stream_id:
            waiter = self._window_waiters.get(stream_id)
            if waiter is not None:
                waiter.set()
        else:
            for waiter in self._window_waiters.values():
                waiter.set()

    def _received_data(self, event: h2.events.DataReceived) -> None:
        stream_id = event.stream_id
        # Acknowledged at once, kept or not: the data is consumed (copied or dropped).
        self._h2.acknowledge_received_data(event.flow_controlled_length, stream_id)
        state = self._streams.get(stream_id)
        if state is None or state.done.is_set():
            return
        data = event.data
        room = state.cap - len(state.body)
        if len(data) < room:
            state.body += data
            return
        if room > 0:
            state.body += data[:room]
        if data and event.stream_ended is None:
            # Over the cap (as the HTTP/1.1 client: the cap reached with more to come):
            # stop the stream, answer with what we have.
            self._reset(stream_id, h2.errors.ErrorCodes.CANCEL)
            self._finish(stream_id, state)

    def _stream_reset(self, event: h2.events.StreamReset) -> None:
        state = self._streams.get(event.stream_id)
        if state is None or state.done.is_set():
            return  # e.g. RST_STREAM NO_ERROR after a complete answer: nothing lost
        code = _code_name(event.error_code)
        if not event.remote_reset:
            state.error = ExchangeFailed(f"the answer broke HTTP/2 (stream reset: {code})")
        elif (
            event.error_code == h2.errors.ErrorCodes.REFUSED_STREAM
            and not state.status
            and not state.informed
        ):
            state.error = StreamRefused(
                f"the receiver refused stream {event.stream_id} (REFUSED_STREAM): not processed"
            )
        else:
            state.error = ExchangeFailed(f"the receiver reset the stream ({code})")
        self._finish(event.stream_id, state)

    def _goaway(self, event: h2.events.ConnectionTerminated) -> None:
        last = event.last_stream_id if event.last_stream_id is not None else STREAM_ID_MAX
        if self._goaway_last is not None:
            last = min(last, self._goaway_last)  # a second GOAWAY may only lower it
        self._goaway_last = last
        self._goaway_code = _code_name(event.error_code)
        self._slot_freed()  # waiters learn that no slot will come
        for stream_id, state in self._streams.items():
            if stream_id > last and not state.done.is_set():
                state.error = self._refused_by_goaway(stream_id)
                self._finish(stream_id, state)

    def _gone_away(self) -> bool:
        """After a GOAWAY: whether every stream it let finish has."""
        return self._goaway_last is not None and all(
            state.done.is_set() for state in self._streams.values()
        )

    def _gone_away_reason(self) -> str:
        return f"the receiver went away (GOAWAY {self._goaway_code})"

    def _refused_by_goaway(self, stream_id: int) -> StreamRefused:
        return StreamRefused(
            f"the receiver is going away (GOAWAY {self._goaway_code}, last stream "
            f"{self._goaway_last}): stream {stream_id} was not processed"
        )

    def _finish(self, stream_id: int, state: _Stream) -> None:
        state.done.set()
        waiter = self._window_waiters.get(stream_id)
        if waiter is not None:
            waiter.set()  # a body still being sent stops

    def _reset(self, stream_id: int, code: h2.errors.ErrorCodes) -> None:
        """Reset a stream that ``h2`` still has open (a no-op otherwise)."""
        h2_stream = self._h2.streams.get(stream_id)
        if h2_stream is None or h2_stream.closed:
            return
        try:
            self._h2.reset_stream(stream_id, code)
        except h2.exceptions.ProtocolError:
            return
        self._wake_writer()

    # --- requests ----------------------------------------------------------------------

    async def request(
        self,
        *,
        scheme: str,
        authority: str,
        path: str,
        headers: list[tuple[str, str]],
        body: bytes,
        body_max_bytes: int,
    ) -> WebhookResponse:
        """POST ``body`` to ``path`` on a new stream; the answer (its body cut at
        ``body_max_bytes``).

        Raises :class:`ConnectionUnavailable` (a :class:`StreamRefused`: nothing sent) unless
        :meth:`available`, :class:`StreamRefused` (not processed), ``ExchangeFailed`` (may have been
        processed), ``ValueError`` for a header HTTP/2 cannot carry (nothing sent). Bound it
        with a cancel scope: cancelling resets the stream and leaves the connection be.
        """
        block = _request_headers(scheme, authority, path, headers, len(body))
        if not self.available():
            raise ConnectionUnavailable(self._unavailable())
        h2c = self._h2
        stream_id = h2c.get_next_available_stream_id()
        state = _Stream(body_max_bytes)
        self._streams[stream_id] = state
        try:
            try:
                h2c.send_headers(stream_id, block, end_stream=not body)
            except h2.exceptions.TooManyStreamsError:
                raise ConnectionUnavailable(self._unavailable()) from None
            except h2.exceptions.ProtocolError as error:
                # h2 refused a block we checked: its state is no longer ours to trust.
                self.close()
                raise ExchangeFailed(f"HTTP/2 refused the request headers: {error}") from None
            self._wake_writer()
            if body:
                await self._send_body(stream_id, state, body)
            await state.done.wait()
        except h2.exceptions.ProtocolError as error:
            # The stream was closed under the body (reset by the receiver, the connection
            # ended): the reason, if known, is the stream's error.
            if state.error is None:
                raise ExchangeFailed(f"sending the request failed: {error}") from None
        finally:
            del self._streams[stream_id]
            if not self._closed:
                self._reset(stream_id, h2.errors.ErrorCodes.CANCEL)
            if not self._streams:
                self.idle_since = trio.current_time()
            self._slot_freed()
            if not self._closed and self._gone_away():  # the last stream was cancelled
                self._note_end(self._gone_away_reason())
                self._run_scope.cancel()
        if state.error is not None:
            raise state.error
        return WebhookResponse(status=state.status, headers=state.headers, body=bytes(state.body))

    async def _send_body(self, stream_id: int, state: _Stream, body: bytes) -> None:
        """Queue ``body`` as DATA frames as the flow-control windows open; stop early if
        the stream is done (answered before the end, reset, the connection gone)."""
        h2c = self._h2
        view = memoryview(body)
        offset, total = 0, len(body)
        while offset < total:
            if state.done.is_set():
                return
            window = h2c.local_flow_control_window(stream_id)
            if window <= 0:
                waiter = self._window_waiters[stream_id] = trio.Event()
                try:
                    await waiter.wait()
                finally:
                    del self._window_waiters[stream_id]
                continue
            frame_max = h2c.max_outbound_frame_size
            while window > 0 and offset < total:
                size = min(window, frame_max, total - offset)
                h2c.send_data(
                    stream_id, view[offset : offset + size], end_stream=offset + size == total
                )
                offset += size
                window -= size
            self._wake_writer()


def _request_headers(
    scheme: str, authority: str, path: str, headers: list[tuple[str, str]], length: int
) -> list[tuple[bytes, bytes]]:
    """The HTTP/2 header block of a POST from HTTP/1.1-style headers (see the module
    docstring); ``ValueError`` for what HTTP/2 cannot carry."""
    if not authority or not path:
        raise ValueError("an HTTP/2 request needs an authority and a path")
    block = [
        (b":method", b"POST"),
        (b":scheme", scheme.encode("ascii")),
        (b":authority", authority.encode("ascii")),
        (b":path", path.encode("ascii")),
    ]
    connection_named: set[bytes] = set()
    for name, value in headers:
        lower = name.lower()
        if lower in _DROPPED:
            if lower == "connection":
                connection_named.update(t.strip().lower().encode() for t in value.split(","))
            continue
        if lower == "te" and value.strip().lower() != "trailers":
            continue
        if not _NAME.fullmatch(lower):
            raise ValueError(f"{name!r} is not a valid HTTP/2 header name")
        if _VALUE_ILLEGAL.search(value):
            raise ValueError(f"the value of header {name!r} is not allowed")
        field = (lower.encode("ascii"), value.strip().encode("latin-1"))
        if field[0] in _NEVER_INDEXED:
            field = NeverIndexedHeaderTuple(*field)
        block.append(field)
    if connection_named:  # headers the Connection header names are hop-by-hop too
        block = [field for field in block if field[0] not in connection_named]
    block.append((b"content-length", str(length).encode("ascii")))
    return block


def _error_code(value: int) -> h2.errors.ErrorCodes | int:
    try:
        return h2.errors.ErrorCodes(value)
    except ValueError:
        return value


def _code_name(code: h2.errors.ErrorCodes | int | None) -> str:
    if isinstance(code, h2.errors.ErrorCodes):
        return code.name
    return "no error code" if code is None else f"error code {code:#x}"
