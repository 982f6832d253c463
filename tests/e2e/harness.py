"""What the end-to-end tests share: a recording HTTP receiver and real nodes on Postgres.

:class:`Receiver` is a real HTTP server on 127.0.0.1 (a thread running ``http.server``) that
behaves like an idempotent webhook receiver: it records every delivery, decides each answer
with a test-supplied policy, and applies the effect of an ``Idempotency-Key`` at most once.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import http.server
import random
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import trio

from engine.clock import SystemClock
from engine.config import NodeConfig
from engine.core.timetable import Timetable
from engine.ledger.base import Ledger
from engine.ledger.params import ExecutionsQuery, SchedulesCreate, TaskTypesPut
from engine.ledger.postgres import open_postgres_ledger
from engine.model import Execution, HandlerKind, Schedule, TaskType
from engine.node import Node

KEY = bytes(range(7, 39))
SECRET = "whsec_" + base64.b64encode(KEY).decode()
EVERY_2_S = "*/2 * * * * *"
HANG = -1
"""A policy answer: take the delivery (and apply its effect), then never answer."""


@dataclass
class Delivery:
    path: str
    headers: dict[str, str]
    """Lower-cased names."""
    body: bytes

    @property
    def key(self) -> str:
        return self.headers["idempotency-key"]


Policy = Callable[[Delivery, int], int]
"""(delivery, how many deliveries of its key came before it) -> status to answer, or HANG."""


class Receiver:
    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.deliveries: list[Delivery] = []
        self.applied: dict[str, int] = {}
        """Effects applied, by idempotency key: a real receiver's side of exactly-once."""
        self.duplicates: dict[str, int] = {}
        """Accepted deliveries of a key whose effect was already applied (not applied again)."""
        self._lock = threading.Lock()
        self._release = threading.Event()
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                headers = {name.lower(): value for name, value in self.headers.items()}
                status = receiver._take(Delivery(self.path, headers, body))
                if status == HANG:
                    receiver._release.wait(30)
                    return
                try:
                    self.send_response(status)
                    self.send_header("Content-Length", "0")
                    self.send_header("Connection", "close")
                    self.end_headers()
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/hook"
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,))

    def _take(self, delivery: Delivery) -> int:
        with self._lock:
            before = sum(1 for d in self.deliveries if d.key == delivery.key)
            self.deliveries.append(delivery)
            status = self.policy(delivery, before)
            if status == HANG or 200 <= status < 300:  # the effect comes before the answer
                if delivery.key in self.applied:
                    self.duplicates[delivery.key] = self.duplicates.get(delivery.key, 0) + 1
                else:
                    self.applied[delivery.key] = 1
            return status

    def of(self, key: str) -> list[Delivery]:
        with self._lock:
            return [d for d in self.deliveries if d.key == key]

    @contextmanager
    def running(self) -> Iterator[Receiver]:
        self._thread.start()
        try:
            yield self
        finally:
            self._release.set()
            self._server.shutdown()
            self._server.server_close()
            self._thread.join(timeout=5)


def expected_signature(msg_id: str, timestamp: str, body: bytes) -> str:
    """Standard Webhooks v1, recomputed without the engine's code."""
    digest = hmac.new(KEY, f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def node_config(
    node_id: str, *, allow_loopback: bool = True, attempt_lease_s: float = 60.0
) -> NodeConfig:
    return NodeConfig(
        node_id=node_id,
        http="",
        attempt_lease_s=attempt_lease_s,
        lease_ttl_s=3,
        lease_safety_margin_s=0.5,
        lookahead_s=1,
        clock_probe_interval_s=1,
        change_poll_interval_s=1,
        catchup_grace_s=30,
        shutdown_timeout_s=5,
        webhook_allow_cidrs="127.0.0.0/8" if allow_loopback else "",
        broker_allow_cidrs="127.0.0.0/8" if allow_loopback else "",
    )


async def create_hook(
    ledger: Ledger, url: str, *, schedule_id: str = "e2e-hook", **limits: Any
) -> Schedule:
    """Task type ``hook`` (a signed webhook to ``url``) and one schedule firing every 2 s,
    from the first fire at least 1 s from now."""
    await ledger.task_types_put(
        TaskTypesPut(
            TaskType(
                name="hook",
                kind=HandlerKind.WEBHOOK,
                allowed_tenants=("*",),
                settings={"url": url, "secret": SECRET, "timeout_s": 5},
                **limits,
            )
        )
    )
    now = await ledger.database_now()
    first = Timetable.compile(EVERY_2_S).next_fire(now + timedelta(seconds=1)).planned_at
    [stored] = await ledger.schedules_create(
        SchedulesCreate(
            [
                Schedule(
                    schedule_id=schedule_id,
                    tenant_id="acme",
                    cron_expr=EVERY_2_S,
                    task_type="hook",
                    next_run_at=first,
                    payload={"report": "daily", "n": 3},
                )
            ]
        )
    )
    return stored


async def executions_of(ledger: Ledger, schedule_id: str) -> list[Execution]:
    page = await ledger.executions_query(ExecutionsQuery(schedule_id=schedule_id, limit=1000))
    return page.items


async def wait_for_execution(
    ledger: Ledger,
    schedule_id: str,
    condition: Callable[[Execution], bool],
    timeout_s: float = 15.0,
) -> Execution:
    """The first execution (by planned time) of ``schedule_id`` meeting ``condition``."""
    with trio.fail_after(timeout_s):
        while True:
            for execution in await executions_of(ledger, schedule_id):
                if condition(execution):
                    return execution
            await trio.sleep(0.1)


@asynccontextmanager
async def running_node(
    url: str,
    node_id: str = "e2e-a",
    *,
    allow_loopback: bool = True,
    seed: int = 1,
    attempt_lease_s: float = 60.0,
) -> AsyncIterator[tuple[Node, trio.CancelScope]]:
    """A real node on its own ledger connection; yields it and the scope that stops it
    (gracefully: leases released, running attempts left to their attempt lease)."""
    async with open_postgres_ledger(url) as ledger, trio.open_nursery() as nursery:
        node = Node(
            node_config(node_id, allow_loopback=allow_loopback, attempt_lease_s=attempt_lease_s),
            ledger,
            SystemClock(),
            random.Random(seed),
        )
        scope = trio.CancelScope()

        async def run() -> None:
            with scope:
                await node.run()

        nursery.start_soon(run)
        try:
            yield node, scope
        finally:
            scope.cancel()


def parse_rfc3339(text: str) -> datetime:
    return datetime.fromisoformat(text)
