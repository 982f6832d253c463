"""A real HTTP sink on 127.0.0.1 (a thread running ``http.server``) and context factories."""

from __future__ import annotations

import http.server
import shutil
import ssl
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from engine.handlers import ExecutionContext
from engine.testing.clock import ManualClock

PLANNED_AT = datetime(2026, 3, 8, 7, 0, tzinfo=UTC)
WALL_NOW = datetime(2026, 3, 8, 7, 0, 3, tzinfo=UTC)


def make_context(**overrides: Any) -> ExecutionContext:
    fields: dict[str, Any] = {
        "execution_id": "nightly.report:2026-03-08T07:00:00Z",
        "schedule_id": "nightly.report",
        "tenant_id": "acme",
        "task_type": "report",
        "planned_at": PLANNED_AT,
        "attempt": 1,
        "fencing_token": 42,
        "payload": {"region": "eu", "n": 3},
    }
    return ExecutionContext(**(fields | overrides))


def make_clock() -> ManualClock:
    return ManualClock(WALL_NOW)


@dataclass
class Route:
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    delay_s: float = 0.0


@dataclass
class Received:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


class Sink:
    """Answers each path as routed (200 by default) and records every request it gets."""

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        self.routes: dict[str, Route] = {}
        self.requests: list[Received] = []
        self.release = threading.Event()
        sink = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                self._answer()

            def do_GET(self) -> None:
                self._answer()

            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = self.rfile.read(length)
                headers = {name.lower(): value for name, value in self.headers.items()}
                sink.requests.append(Received(self.command, self.path, headers, body))
                route = sink.routes.get(self.path, Route())
                if route.delay_s:
                    sink.release.wait(route.delay_s)
                try:
                    self.send_response(route.status)
                    for name, value in route.headers.items():
                        self.send_header(name, value)
                    self.send_header("Content-Length", str(len(route.body)))
                    self.send_header("Connection", "close")
                    self.end_headers()
                    self.wfile.write(route.body)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client stopped reading: that is what a capped read does

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        if tls is not None:
            self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, args=(0.05,))

    def url(self, path: str = "/hook", host: str = "127.0.0.1", scheme: str = "http") -> str:
        return f"{scheme}://{host}:{self.port}{path}"

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(timeout=5)


@pytest.fixture
def sink() -> Iterator[Sink]:
    server = Sink()
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate for ``sink.test`` (and its key), made with ``openssl``."""
    if shutil.which("openssl") is None:
        pytest.skip("needs openssl")
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "2", "-subj", "/CN=sink.test",
         "-addext", "subjectAltName=DNS:sink.test"],
        check=True, capture_output=True,
    )  # fmt: skip
    return cert, key
