"""A fast local webhook receiver: HTTP/1.1 with keep-alive, for benchmarks and tests.

Runs in its own process on asyncio + uvloop (plain asyncio where uvloop is missing), one
``asyncio.Protocol`` per connection parsing requests by hand (request line, headers,
``Content-Length`` or chunked bodies; pipelined requests are answered in order). It answers
every request after ``--latency-ms`` (a timer, not a blocked loop), so the latency of a
real receiver costs it no CPU, and counts what it sees.

Usage::

    python benchmarks/webhook_receiver.py [--host 127.0.0.1] [--port 0] [--latency-ms 0]
        [--keepalive-s 60] [--tls-cert CERT.pem --tls-key KEY.pem]

When it listens it prints its port on a line of its own on stdout (and flushes), then serves
until SIGTERM/SIGINT. ``--keepalive-s`` closes connections idle for that long. With
``--tls-cert`` and ``--tls-key`` it speaks HTTPS (HTTP/1.1 only, by ALPN) instead.

Control endpoints (never counted):

* ``GET /_stats`` -> JSON: ``requests``, ``unique_keys`` (distinct ``Idempotency-Key``
  values), ``connections`` (that carried a webhook so far), ``open_connections``,
  ``peak_connections`` (most open at once), ``in_flight``, ``peak_in_flight`` (requests
  received and not yet answered, most at once), ``latency_ms``.
* ``POST /_reset`` -> zeroes the counters (the peaks restart from what is open now).
* ``POST /_latency?ms=N`` -> sets the latency of later requests.

Every other path is a webhook and answers ``200 ok`` after the latency, unless it is one of
these test faults (the query is optional):

* ``/status/<code>[?retry_after=S]`` -> that status (a 3xx with ``Location: /elsewhere``).
* ``/slow?ms=N`` -> answers after N ms instead of the latency.
* ``/hang`` -> never answers (the connection stays open until the client goes).
* ``/reset`` -> aborts the connection with a TCP RST once the request is read.
* ``/close`` -> closes the connection (FIN) once the request is read, without an answer.
* ``/huge?bytes=N`` -> ``503`` with an N-byte body (written as the client reads it).
* ``/partial`` -> a status line and half the headers, then nothing.
* ``/idle-reset?ms=N`` -> answers, then aborts the connection (RST) if it stays idle N ms.
* any path with ``?close=1`` -> answers with ``Connection: close`` and closes.

Import it to run it from a test: :func:`start_receiver` spawns the process and returns a
:class:`ReceiverProcess` (port, ``stats()``, ``set_latency()``, ``reset()``, ``stop()``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import resource
import signal
import socket
import ssl
import struct
import subprocess
import sys
import urllib.request
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast
from urllib.parse import parse_qs

HEAD_BYTES_MAX = 64 * 1024
BODY_BYTES_MAX = 16 * 1024 * 1024
HUGE_CHUNK = 64 * 1024

_REASONS = {
    200: b"OK",
    302: b"Found",
    400: b"Bad Request",
    404: b"Not Found",
    429: b"Too Many Requests",
    500: b"Internal Server Error",
    503: b"Service Unavailable",
}


@dataclass
class Stats:
    requests: int = 0
    keys: set[bytes] = field(default_factory=set)
    connections: int = 0
    open_connections: int = 0
    peak_connections: int = 0
    in_flight: int = 0
    peak_in_flight: int = 0

    def reset(self) -> None:
        self.requests = 0
        self.keys = set()
        self.connections = 0
        self.peak_connections = self.open_connections
        self.peak_in_flight = self.in_flight

    def as_json(self, latency_ms: float) -> bytes:
        return json.dumps(
            {
                "requests": self.requests,
                "unique_keys": len(self.keys),
                "connections": self.connections,
                "open_connections": self.open_connections,
                "peak_connections": self.peak_connections,
                "in_flight": self.in_flight,
                "peak_in_flight": self.peak_in_flight,
                "latency_ms": latency_ms,
            }
        ).encode()


class Server:
    def __init__(self, latency_ms: float, keepalive_s: float) -> None:
        self.latency_s = latency_ms / 1000
        self.keepalive_s = keepalive_s
        self.stats = Stats()
        self.loop = asyncio.get_running_loop()


class _Slot:
    """One request's place in a connection's answer queue (answers go out in order)."""

    __slots__ = ("close_after", "counted", "data", "huge", "ready")

    def __init__(self) -> None:
        self.ready = False
        self.data = b""
        self.close_after = False
        self.huge = 0
        self.counted = True


def _response(status: int, body: bytes, *, close: bool, extra: bytes = b"") -> bytes:
    reason = _REASONS.get(status, b"Status")
    return b"HTTP/1.1 %d %s\r\nContent-Length: %d\r\nContent-Type: text/plain\r\n%s%s\r\n%s" % (
        status,
        reason,
        len(body),
        b"Connection: close\r\n" if close else b"",
        extra,
        body,
    )


class ReceiverProtocol(asyncio.Protocol):
    def __init__(self, server: Server) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.slots: deque[_Slot] = deque()
        self.closed = False
        self.writable = asyncio.Event()
        self.writable.set()
        self.idle_timer: asyncio.TimerHandle | None = None
        self.idle_reset_s = 0.0
        self.counted = False
        # Parser state: None while reading a head; else (head fields, body bytes wanted).
        self.head: tuple[bytes, bytes, dict[bytes, bytes]] | None = None
        self.body_left = 0
        self.chunked = False
        self.body = bytearray()

    # --- connection --------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass
        self._arm_idle()

    def _count_connection(self) -> None:
        """Connections are counted at their first webhook (control calls are not counted)."""
        self.counted = True
        stats = self.server.stats
        stats.connections += 1
        stats.open_connections += 1
        stats.peak_connections = max(stats.peak_connections, stats.open_connections)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.counted:
            self.server.stats.open_connections -= 1
        for slot in self.slots:
            if slot.counted:
                self.server.stats.in_flight -= 1
        self.slots.clear()
        self.writable.set()
        if self.idle_timer is not None:
            self.idle_timer.cancel()

    def pause_writing(self) -> None:
        self.writable.clear()

    def resume_writing(self) -> None:
        self.writable.set()

    def _arm_idle(self) -> None:
        if self.idle_timer is not None:
            self.idle_timer.cancel()
            self.idle_timer = None
        if self.slots or self.closed:
            return
        if self.idle_reset_s:
            self.idle_timer = self.server.loop.call_later(self.idle_reset_s, self._abort)
        elif self.server.keepalive_s:
            self.idle_timer = self.server.loop.call_later(self.server.keepalive_s, self._close)

    def _close(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.close()

    def _abort(self) -> None:
        """Close with a TCP RST (SO_LINGER 0) rather than a FIN."""
        if self.transport is None or self.closed:
            return
        sock = self.transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.transport.abort()

    # --- parsing -----------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self.idle_timer is not None:
            self.idle_timer.cancel()
            self.idle_timer = None
        self.buffer += data
        try:
            while not self.closed and self._parse_one():
                pass
        except ValueError:
            self._fail(400)

    def _fail(self, status: int) -> None:
        if self.transport is not None and not self.closed:
            self.transport.write(_response(status, b"bad request", close=True))
            self.transport.close()
        self.closed = True

    def _parse_one(self) -> bool:
        """Consume one request (or part of one) from the buffer; True if one completed."""
        if self.head is None:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(self.buffer) > HEAD_BYTES_MAX:
                    raise ValueError("head too long")
                return False
            lines = bytes(self.buffer[:end]).split(b"\r\n")
            del self.buffer[: end + 4]
            method, target, version = lines[0].split(b" ", 2)
            headers: dict[bytes, bytes] = {}
            for line in lines[1:]:
                name, _, value = line.partition(b":")
                headers[name.strip().lower()] = value.strip()
            if version != b"HTTP/1.1":
                headers.setdefault(b"connection", b"close")
            self.head = (method, target, headers)
            self.chunked = b"chunked" in headers.get(b"transfer-encoding", b"").lower()
            self.body_left = 0 if self.chunked else int(headers.get(b"content-length", b"0"))
            if self.body_left > BODY_BYTES_MAX:
                raise ValueError("body too long")
            self.body = bytearray()
        if self.chunked:
            if not self._read_chunks():
                return False
        else:
            take = min(self.body_left, len(self.buffer))
            self.body += self.buffer[:take]
            del self.buffer[:take]
            self.body_left -= take
            if self.body_left:
                return False
        method, target, headers = self.head
        self.head = None
        self._handle(method, target, headers, bytes(self.body))
        return True

    def _read_chunks(self) -> bool:
        while True:
            if self.body_left == 0:
                end = self.buffer.find(b"\r\n")
                if end < 0:
                    return False
                size = int(bytes(self.buffer[:end]).split(b";")[0], 16)
                if size == 0:
                    trailer_end = self.buffer.find(b"\r\n\r\n", end)
                    if self.buffer[end : end + 4] == b"\r\n\r\n":
                        del self.buffer[: end + 4]
                        return True
                    if trailer_end < 0:
                        return False
                    del self.buffer[: trailer_end + 4]
                    return True
                del self.buffer[: end + 2]
                self.body_left = size + 2  # the chunk and its CRLF
            take = min(self.body_left, len(self.buffer))
            self.body += self.buffer[:take]
            del self.buffer[:take]
            self.body_left -= take
            if self.body_left:
                return False
            del self.body[-2:]
            if len(self.body) > BODY_BYTES_MAX:
                raise ValueError("body too long")

    # --- answering ---------------------------------------------------------------------

    def _handle(
        self, method: bytes, target: bytes, headers: dict[bytes, bytes], body: bytes
    ) -> None:
        path, _, query_text = target.decode("latin-1").partition("?")
        query = {name: values[-1] for name, values in parse_qs(query_text).items()}
        close = headers.get(b"connection", b"").lower() == b"close" or query.get("close") == "1"
        server = self.server
        slot = _Slot()
        if path.startswith("/_"):
            slot.counted = False
            self.slots.append(slot)
            self._control(slot, method, path, query, close)
            return
        stats = server.stats
        if not self.counted:
            self._count_connection()
        stats.requests += 1
        key = headers.get(b"idempotency-key")
        if key is not None:
            stats.keys.add(key)
        stats.in_flight += 1
        stats.peak_in_flight = max(stats.peak_in_flight, stats.in_flight)
        self.slots.append(slot)
        delay_s = server.latency_s
        if path == "/hang":
            return
        if path == "/reset":
            self._abort()
            return
        if path == "/close":
            self._close()
            return
        if path == "/partial":
            assert self.transport is not None
            self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Le")
            return
        if path == "/slow":
            delay_s = float(query.get("ms", "0")) / 1000
        if path == "/idle-reset":
            self.idle_reset_s = float(query.get("ms", "50")) / 1000
        if path.startswith("/status/"):
            status = int(path.removeprefix("/status/"))
            extra = b""
            if 300 <= status < 400:
                extra += b"Location: /elsewhere\r\n"
            if "retry_after" in query:
                extra += b"Retry-After: %s\r\n" % query["retry_after"].encode()
            slot.data = _response(status, b"status %d" % status, close=close, extra=extra)
        elif path == "/huge":
            size = int(query.get("bytes", str(8 * 1024 * 1024)))
            slot.huge = size
            slot.data = (
                b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: %d\r\n"
                b"Content-Type: text/plain\r\n\r\n" % size
            )
        else:
            slot.data = _response(200, b"ok", close=close)
        slot.close_after = close
        if delay_s > 0:
            server.loop.call_later(delay_s, self._ready, slot)
        else:
            self._ready(slot)

    def _control(
        self, slot: _Slot, method: bytes, path: str, query: dict[str, str], close: bool
    ) -> None:
        server = self.server
        if path == "/_stats":
            body = server.stats.as_json(server.latency_s * 1000)
        elif path == "/_reset" and method == b"POST":
            server.stats.reset()
            body = b"{}"
        elif path == "/_latency" and method == b"POST":
            server.latency_s = float(query.get("ms", "0")) / 1000
            body = b"{}"
        else:
            slot.data = _response(404, b"no such control", close=close)
            slot.close_after = close
            self._ready(slot)
            return
        slot.data = _response(200, body, close=close, extra=b"X-Control: 1\r\n")
        slot.close_after = close
        self._ready(slot)

    def _ready(self, slot: _Slot) -> None:
        slot.ready = True
        self._flush()

    def _flush(self) -> None:
        transport = self.transport
        while self.slots and self.slots[0].ready and not self.closed:
            slot = self.slots.popleft()
            if slot.counted:
                self.server.stats.in_flight -= 1
            assert transport is not None
            transport.write(slot.data)
            if slot.huge:
                self.slots.appendleft(_Slot())  # holds the line while the body streams
                self.slots[0].counted = False
                self.server.loop.create_task(self._stream_huge(slot.huge))
                return
            if slot.close_after:
                transport.close()
                self.closed = True
                return
        self._arm_idle()

    async def _stream_huge(self, size: int) -> None:
        chunk = b"E" * HUGE_CHUNK
        left = size
        while left > 0 and not self.closed:
            await self.writable.wait()
            if self.closed or self.transport is None:
                return
            self.transport.write(chunk[: min(left, HUGE_CHUNK)])
            left -= HUGE_CHUNK
        if self.closed:
            return
        self.slots.popleft()
        self._flush()


def raise_fd_limit() -> None:
    """As many file descriptors as allowed: a benchmark holds thousands of connections."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


async def serve(
    host: str, port: int, latency_ms: float, keepalive_s: float, tls: ssl.SSLContext | None
) -> None:
    loop = asyncio.get_running_loop()
    server = Server(latency_ms, keepalive_s)
    listener = await loop.create_server(
        lambda: ReceiverProtocol(server), host, port, backlog=4096, reuse_address=True, ssl=tls
    )
    bound = listener.sockets[0].getsockname()[1]
    print(bound, flush=True)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with listener:
        await stop.wait()


def _run(main: Callable[[], Any]) -> None:
    try:
        import uvloop
    except ImportError:
        asyncio.run(main())
    else:
        uvloop.run(main())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--latency-ms", type=float, default=0.0)
    parser.add_argument(
        "--keepalive-s", type=float, default=60.0, help="close idle connections (0: never)"
    )
    parser.add_argument("--tls-cert", type=Path, help="serve HTTPS with this certificate")
    parser.add_argument("--tls-key", type=Path, help="the certificate's private key")
    args = parser.parse_args(argv)
    if args.host not in ("127.0.0.1", "::1", "localhost"):
        parser.error("the receiver listens on loopback only")
    tls = None
    if args.tls_cert:
        tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        tls.load_cert_chain(args.tls_cert, args.tls_key)
        tls.set_alpn_protocols(["http/1.1"])
    raise_fd_limit()
    _run(lambda: serve(args.host, args.port, args.latency_ms, args.keepalive_s, tls))


# --- driving it from another process ------------------------------------------------------


class ReceiverProcess:
    """A receiver running in a child process (see :func:`start_receiver`)."""

    def __init__(
        self, process: subprocess.Popen[str], port: int, host: str, tls: bool = False
    ) -> None:
        self.process = process
        self.port = port
        self.host = host
        self.scheme = "https" if tls else "http"

    def url(self, path: str = "/hook", host: str | None = None) -> str:
        name = host or self.host
        if ":" in name:
            name = f"[{name}]"
        return f"{self.scheme}://{name}:{self.port}{path}"

    def _control(self, method: str, path: str) -> dict[str, Any]:
        request = urllib.request.Request(self.url(path), method=method, data=None)
        handlers: list[urllib.request.BaseHandler] = [urllib.request.ProxyHandler({})]
        if self.scheme == "https":  # control calls only; the certificate is the test's
            insecure = ssl.create_default_context()
            insecure.check_hostname = False
            insecure.verify_mode = ssl.CERT_NONE
            handlers.append(urllib.request.HTTPSHandler(context=insecure))
        with urllib.request.build_opener(*handlers).open(request, timeout=10) as response:
            answer: dict[str, Any] = json.loads(response.read())
            return answer

    def stats(self) -> dict[str, Any]:
        return self._control("GET", "/_stats")

    def reset(self) -> None:
        self._control("POST", "/_reset")

    def set_latency(self, ms: float) -> None:
        self._control("POST", f"/_latency?ms={ms:g}")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()


def start_receiver(
    *,
    latency_ms: float = 0.0,
    keepalive_s: float = 60.0,
    host: str = "127.0.0.1",
    tls: tuple[Path, Path] | None = None,
) -> ReceiverProcess:
    """Spawn a receiver process and wait until it listens (``tls``: certificate and key)."""
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--host",
        host,
        "--latency-ms",
        str(latency_ms),
        "--keepalive-s",
        str(keepalive_s),
    ]
    if tls is not None:
        command += ["--tls-cert", str(tls[0]), "--tls-key", str(tls[1])]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    line = process.stdout.readline()
    if not line.strip().isdigit():
        process.kill()
        process.wait()
        process.stdout.close()
        raise RuntimeError(f"the webhook receiver did not start (said {line!r})")
    return ReceiverProcess(process, int(line), host, tls=tls is not None)


if __name__ == "__main__":
    main()
