"""A private ``redis-server`` for tests that kill and restart their broker.

The machine's shared Redis is never restarted: these tests start their own server on a free
port in a temporary directory, with an append-only file fsynced on every write, so a server
killed with SIGKILL comes back with everything it acknowledged.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class RedisServer:
    """One private server; :meth:`kill` and :meth:`start` again keep its data and port."""

    def __init__(self, directory: Path, port: int | None = None) -> None:
        self.directory = directory
        self.port = port or free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.process = subprocess.Popen(
            [
                REDIS_SERVER,
                "--port", str(self.port),
                "--bind", "127.0.0.1",
                "--dir", str(self.directory),
                "--save", "",
                "--appendonly", "yes",
                "--appendfsync", "always",
                "--daemonize", "no",
                "--logfile", str(self.directory / "redis.log"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                log = (self.directory / "redis.log").read_text()
                raise RuntimeError(f"redis-server exited: {log}")
            try:
                if self.command("DBSIZE") is not None:  # refused while loading its data
                    return
            except RuntimeError as error:
                if not str(error).startswith("LOADING"):
                    raise
            time.sleep(0.02)
        raise RuntimeError("redis-server did not answer within 10 s")

    def kill(self) -> None:
        """SIGKILL: a crash, not a shutdown."""
        if self.process is not None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)
            self.process = None

    def restart(self) -> None:
        self.kill()
        self.start()

    def command(self, *args: str) -> str | None:
        """One command over a plain socket (RESP), its answer as text; ``None`` if the server
        cannot be reached. Enough for test setup: simple, error and integer answers."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=2) as conn:
                request = f"*{len(args)}\r\n" + "".join(
                    f"${len(arg.encode())}\r\n{arg}\r\n" for arg in args
                )
                conn.sendall(request.encode())
                answer = conn.recv(65536).decode()
        except OSError:
            return None
        kind, body = answer[:1], answer[1:].split("\r\n", 1)[0]
        if kind == "-":
            raise RuntimeError(body)
        return body


def entries(url: str, stream: str) -> list[dict[str, str]]:
    """Every entry of ``stream``, oldest first: its fields."""
    client = redis.Redis.from_url(url, decode_responses=True)
    try:
        found: list[tuple[str, dict[str, str]]] = client.xrange(stream)  # type: ignore[assignment]
        return [fields for _, fields in found]
    finally:
        client.close()


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.kill()
