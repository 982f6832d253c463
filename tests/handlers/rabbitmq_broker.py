"""RabbitMQ for the ``rabbitmq`` handler's tests: the machine's broker (each test declares
its own uniquely named exchange and queue and deletes them), a private ``rabbitmq-server``
the tests may kill and restart, forced closes of one connection, and the consumer-side
deduplication recipe of ``docs/targets.md`` ("rabbitmq").

Everything here is synchronous (aio-pika under ``asyncio.run``): trio tests call it with
``trio.to_thread.run_sync``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
import signal
import sqlite3
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import aio_pika
import aio_pika.abc
import pytest

from tests.handlers.redis_server import free_port

SHARED_URL = "amqp://guest:guest@127.0.0.1:5672/"
RABBITMQ_SERVER = shutil.which("rabbitmq-server") or "/usr/sbin/rabbitmq-server"
RABBITMQCTL = shutil.which("rabbitmqctl") or "/usr/sbin/rabbitmqctl"
T = TypeVar("T")


def _run(url: str, work: Callable[[aio_pika.abc.AbstractChannel], Awaitable[T]]) -> T:
    async def main() -> T:
        connection = await aio_pika.connect(url, timeout=10)
        try:
            return await work(await connection.channel())
        finally:
            await connection.close()

    return asyncio.run(main())


@dataclass(frozen=True)
class Topology:
    """A direct exchange and a queue bound to it with ``routing_key``, named for one test."""

    url: str
    exchange: str
    queue: str
    routing_key: str
    durable: bool = False

    @classmethod
    def unique(cls, url: str = SHARED_URL, *, durable: bool = False) -> Topology:
        tag = secrets.token_hex(4)
        return cls(
            url=url,
            exchange=f"carillon-test.{tag}",
            queue=f"carillon-test.{tag}.q",
            routing_key=f"ticks.{tag}",
            durable=durable,
        )

    def declare(self) -> None:
        async def work(channel: aio_pika.abc.AbstractChannel) -> None:
            exchange = await channel.declare_exchange(
                self.exchange, aio_pika.ExchangeType.DIRECT, durable=self.durable
            )
            queue = await channel.declare_queue(self.queue, durable=self.durable)
            await queue.bind(exchange, self.routing_key)

        _run(self.url, work)

    def delete(self) -> None:
        async def work(channel: aio_pika.abc.AbstractChannel) -> None:
            await channel.queue_delete(self.queue)
            await channel.exchange_delete(self.exchange)

        _run(self.url, work)

    def drain(self) -> list[aio_pika.abc.AbstractIncomingMessage]:
        """Every message in the queue now, taken off it."""

        async def work(
            channel: aio_pika.abc.AbstractChannel,
        ) -> list[aio_pika.abc.AbstractIncomingMessage]:
            queue = await channel.get_queue(self.queue)
            taken = []
            while (message := await queue.get(no_ack=True, fail=False)) is not None:
                taken.append(message)
            return taken

        return _run(self.url, work)

    def message_ids(self) -> list[str]:
        return [str(message.message_id) for message in self.drain()]


@pytest.fixture
def topology() -> Iterator[Topology]:
    """An exchange and a queue of this test's own on the machine's broker."""
    made = Topology.unique()
    made.declare()
    try:
        yield made
    finally:
        made.delete()


# -- the consumer-side deduplication recipe ---------------------------------------------------

RECIPE_SCHEMA = """
CREATE TABLE IF NOT EXISTS processed_messages (message_id TEXT PRIMARY KEY);
CREATE TABLE IF NOT EXISTS reports (execution_id TEXT, payload TEXT);
"""


def consume_once_per_message_id(url: str, queue: str, database: Path) -> int:
    """The recipe of ``docs/targets.md``: in one transaction, record the message id (a
    primary key: a repeat inserts nothing) and apply the message's effect only if it was
    new; commit, then ack. Consumes the queue until it is empty; returns messages seen."""
    db = sqlite3.connect(database)
    db.execute("PRAGMA synchronous = OFF")  # a test's database: atomicity, not durability
    db.executescript(RECIPE_SCHEMA)

    async def work(channel: aio_pika.abc.AbstractChannel) -> int:
        source = await channel.get_queue(queue)
        seen = 0
        while (message := await source.get(fail=False)) is not None:
            seen += 1
            with db:  # one transaction: the id and the effect commit together, or neither
                inserted = db.execute(
                    "INSERT INTO processed_messages (message_id) VALUES (?) "
                    "ON CONFLICT (message_id) DO NOTHING",
                    (message.message_id,),
                ).rowcount
                if inserted:
                    db.execute(
                        "INSERT INTO reports VALUES (?, ?)",
                        (message.headers["X-Carillon-Execution-Id"], message.body.decode()),
                    )
            await message.ack()  # after the commit: a crash before it redelivers, harmlessly
        return seen

    try:
        return _run(url, work)
    finally:
        db.close()


def effects(database: Path) -> list[str]:
    """The execution ids whose effect the recipe applied, in order."""
    db = sqlite3.connect(database)
    try:
        return [row[0] for row in db.execute("SELECT execution_id FROM reports ORDER BY rowid")]
    finally:
        db.close()


# -- forced closes ----------------------------------------------------------------------------


def close_connection_named(name: str, *, node: str | None = None) -> None:
    """Close, broker-side, the one connection whose client named itself ``name``
    (``rabbitmqctl close_connection``): only the test's own connection, never another."""
    target = ["-n", node] if node else []
    listed = subprocess.run(
        [RABBITMQCTL, *target, "list_connections", "-q", "--no-table-headers", "pid",
         "client_properties"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout  # fmt: skip
    pids = [
        line.split("\t", 1)[0]
        for line in listed.splitlines()
        if f'{{"connection_name","{name}"}}' in line
    ]
    assert len(pids) == 1, f"no single connection named {name!r}: {listed!r}"
    subprocess.run(
        [RABBITMQCTL, *target, "close_connection", pids[0], "carillon test: forced close"],
        capture_output=True,
        check=True,
        timeout=60,
    )


# -- a private broker -------------------------------------------------------------------------


class RabbitServer:
    """A private ``rabbitmq-server`` node (its own name, ports and data under ``base``),
    which a test may kill and start again on the same data."""

    def __init__(self, base: Path, *, tls: tuple[Path, Path] | None = None) -> None:
        """``tls``: a certificate and its key: the node also listens with TLS on
        ``tls_port``."""
        self.base = base
        self.port = free_port()
        self.dist_port = free_port()
        self.tls_port = free_port()
        self.node = f"carillon-test-{secrets.token_hex(4)}@localhost"
        self.url = f"amqp://guest:guest@127.0.0.1:{self.port}/"
        self._process: subprocess.Popen[bytes] | None = None
        base.mkdir(parents=True, exist_ok=True)
        (base / "enabled_plugins").write_text("[].\n")
        config = ""
        if tls is not None:
            for source, name in zip(tls, ("cert.pem", "key.pem"), strict=True):
                shutil.copy(source, base / name)
                shutil.chown(base / name, user="rabbitmq")
            config = (
                f"listeners.ssl.default = {self.tls_port}\n"
                f"ssl_options.certfile = {base}/cert.pem\n"
                f"ssl_options.keyfile = {base}/key.pem\n"
                "ssl_options.verify = verify_none\n"
                "ssl_options.fail_if_no_peer_cert = false\n"
            )
        (base / "rabbitmq.conf").write_text(config)
        shutil.chown(base, user="rabbitmq")  # the server drops to that user

    def _environment(self) -> dict[str, str]:
        base = str(self.base)
        return {
            **os.environ,
            "RABBITMQ_NODENAME": self.node,
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_MNESIA_BASE": f"{base}/mnesia",
            "RABBITMQ_LOG_BASE": f"{base}/log",
            "RABBITMQ_PID_FILE": f"{base}/pid",
            "RABBITMQ_FEATURE_FLAGS_FILE": f"{base}/feature_flags",
            "RABBITMQ_ENABLED_PLUGINS_FILE": f"{base}/enabled_plugins",
            "RABBITMQ_CONFIG_FILE": f"{base}/rabbitmq.conf",
            "RABBITMQ_ADVANCED_CONFIG_FILE": f"{base}/no-advanced.config",
        }

    def start(self) -> None:
        self._process = subprocess.Popen(
            [RABBITMQ_SERVER],
            env=self._environment(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"rabbitmq-server exited with {self._process.returncode}")
            try:
                _run(self.url, _nothing)
                return
            except Exception:
                time.sleep(0.25)
        raise RuntimeError("rabbitmq-server did not start within 90 s")

    def kill(self) -> None:
        """SIGKILL the node (its Erlang VM), as a crash would."""
        pid_file = self.base / "pid"
        if pid_file.exists():
            pid = int(pid_file.read_text().strip())
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            pid_file.unlink()
        if self._process is not None:
            try:
                self._process.wait(30)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait(10)
            self._process = None

    def restart(self) -> None:
        self.kill()
        self.start()

    def ctl(self, *arguments: str) -> None:
        """``rabbitmqctl`` on this node (only this one)."""
        subprocess.run(
            [RABBITMQCTL, "-n", self.node, *arguments], capture_output=True, check=True, timeout=60
        )

    def block_publishers(self) -> None:
        """A memory alarm (the high watermark at 0): the node stops reading from publishing
        connections, so their publishes hang unconfirmed."""
        self.ctl("set_vm_memory_high_watermark", "0")

    def unblock_publishers(self) -> None:
        self.ctl("set_vm_memory_high_watermark", "0.4")


async def _nothing(channel: aio_pika.abc.AbstractChannel) -> None:
    del channel


@pytest.fixture
def rabbit_server() -> Iterator[RabbitServer]:
    if not os.path.exists(RABBITMQ_SERVER):
        pytest.fail("rabbitmq-server is not installed (it is on every Carillon machine)")
    # Not under tmp_path: pytest makes that readable by root only, and the server runs as
    # the rabbitmq user.
    base = Path(tempfile.mkdtemp(prefix="carillon-rabbitmq-"))
    server = RabbitServer(base)
    try:
        server.start()
        yield server
    finally:
        server.kill()
        shutil.rmtree(base, ignore_errors=True)
