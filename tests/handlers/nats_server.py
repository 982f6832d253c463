"""A private ``nats-server -js`` for tests that kill, pause and restart their broker.

The machine's shared NATS is never restarted: these tests start their own server on a free
port with its JetStream store in a temporary directory, so a server killed with SIGKILL and
started again recovers its streams (and their duplicate windows) from that store.
"""

from __future__ import annotations

import asyncio
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import nats
import pytest
from nats.js import JetStreamContext

from tests.handlers.redis_server import free_port

NATS_SERVER = shutil.which("nats-server") or "/usr/sbin/nats-server"
T = TypeVar("T")


class NatsServer:
    """One private JetStream server; :meth:`kill` and :meth:`start` keep its store and port."""

    def __init__(self, directory: Path, *, user: str | None = None, password: str = "") -> None:
        self.directory = directory
        self.port = free_port()
        self.user = user
        self.password = password
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    @property
    def admin_url(self) -> str:
        if self.user is None:
            return self.url
        return f"nats://{self.user}:{self.password}@127.0.0.1:{self.port}"

    def start(self) -> None:
        auth = [] if self.user is None else ["--user", self.user, "--pass", self.password]
        self.process = subprocess.Popen(
            [NATS_SERVER, "-js", "-a", "127.0.0.1", "-p", str(self.port),
             "-sd", str(self.directory), *auth],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        wait_listening(self.port, self.process)

    def kill(self) -> None:
        """SIGKILL: a crash, not a shutdown."""
        if self.process is not None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)
            self.process = None

    def restart(self) -> None:
        self.kill()
        self.start()

    def pause(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGCONT)

    def jetstream(self, action: Callable[[JetStreamContext], Awaitable[T]]) -> T:
        """Run ``action`` with a JetStream context of a fresh connection (blocking, in its own
        asyncio loop: call it from a thread in trio tests)."""
        return jetstream(self.admin_url, action)


def wait_listening(port: int, process: subprocess.Popen[bytes]) -> None:
    """Until a server started as ``process`` accepts connections on ``port`` (10 s at most)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError("nats-server exited at start")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.02)
    raise RuntimeError("nats-server did not listen within 10 s")


def jetstream(url: str, action: Callable[[JetStreamContext], Awaitable[T]]) -> T:
    async def run() -> T:
        nc = await nats.connect(url, connect_timeout=5, allow_reconnect=False)
        try:
            return await action(nc.jetstream())
        finally:
            await nc.close()

    return asyncio.run(run())


def add_stream(url: str, name: str, subjects: list[str], **config: Any) -> None:
    async def add(js: JetStreamContext) -> None:
        await js.add_stream(name=name, subjects=subjects, **config)

    jetstream(url, add)


def messages(url: str, stream: str, subject: str) -> list[tuple[dict[str, str], bytes]]:
    """Every message of ``stream`` on ``subject``, oldest first: (headers, data)."""

    async def read(js: JetStreamContext) -> list[tuple[dict[str, str], bytes]]:
        info = await js.stream_info(stream)
        found = []
        for seq in range(info.state.first_seq, info.state.last_seq + 1):
            if info.state.messages == 0:
                break
            message = await js.get_msg(stream, seq)
            if message.subject == subject:
                found.append((dict(message.headers or {}), message.data or b""))
        return found

    return jetstream(url, read)


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[NatsServer]:
    server = NatsServer(tmp_path)
    server.start()
    try:
        yield server
    finally:
        if server.process is not None:
            server.resume()
        server.kill()
