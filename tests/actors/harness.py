"""A cluster of nodes in one ``trio.run`` on the mock clock, sharing one MemoryLedger.

Each node gets its own wall clock (skewable) and a ledger proxy that can make the node
*crash* (every call fails, as if the process were gone) or *pause* (calls block, then go out
after the pause, like a frozen process whose requests sit in a socket buffer).
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import trio

from engine.config import WORKERS_DEFAULT, NodeConfig
from engine.core.timetable import Timetable, TimetableCache
from engine.errors import LeaseLost, LedgerUnavailable
from engine.ledger.memory import MemoryLedger
from engine.ledger.params import ExecutionsQuery, SchedulesCreate
from engine.model import Execution, Schedule
from engine.node import Node
from engine.testing import SkewedClock
from tests.ledger.backends import put_noop_task_type

TEST_TENANTS: tuple[str, ...] = (
    *("default", "acme", "t", "t1", "t2", "t3", "big", "heavy", "middle", "light", "quota"),
    *(f"{prefix}-{n}" for prefix in ("tenant", "small", "burst") for n in range(20)),
)
"""Every tenant the actor tests' schedules use: python and shell task types are granted to
tenants by name, never to every tenant."""

START = datetime(2026, 3, 2, 0, 0, 30, tzinfo=UTC)
PARTITIONS = 16


class FaultyLedger:
    """Forwards to the shared ledger unless the node is crashed or paused."""

    def __init__(self, inner: MemoryLedger) -> None:
        self._inner = inner
        self.crashed = False
        self._resumed: trio.Event | None = None
        self.lease_lost: list[str] = []
        self.calls_after_resume: list[tuple[str, str]] = []
        self._watch_after_resume = False
        self._pause_on: str | None = None
        self.paused_in_flight = trio.Event()
        self.slow: dict[str, float] = {}
        """Extra seconds each call of the named method takes (a slow round trip)."""
        self.raise_once: dict[str, BaseException] = {}
        """The next call of the named method raises this (an unexpected error, a bug)."""

    def pause(self) -> None:
        """Freeze: calls block (shielded) until :meth:`resume`, then go out as sent."""
        self._resumed = trio.Event()

    def pause_at_next(self, method: str) -> None:
        """Freeze when the node next calls ``method`` (a write caught in flight)."""
        self._pause_on = method

    def resume(self) -> None:
        assert self._resumed is not None
        self._resumed.set()
        self._resumed = None
        self._watch_after_resume = True

    def __getattr__(self, name: str) -> Any:
        target = getattr(self._inner, name)

        async def call(*args: Any) -> Any:
            if self.crashed:
                await trio.lowlevel.checkpoint()
                raise LedgerUnavailable("node crashed")
            injected = self.raise_once.pop(name, None)
            if injected is not None:
                await trio.lowlevel.checkpoint()
                raise injected
            if self._pause_on == name:
                self._pause_on = None
                self.pause()
                self.paused_in_flight.set()
            shield = self._resumed is not None
            try:
                # A frozen process's request is already written: it reaches the ledger after
                # the pause, whatever the process's own deadlines say by then.
                with trio.CancelScope(shield=shield):
                    if self._resumed is not None:
                        await self._resumed.wait()
                    await trio.sleep(self.slow.get(name, 0.0))
                    result = await target(*args)
            except LeaseLost:
                self.lease_lost.append(name)
                if self._watch_after_resume:
                    self.calls_after_resume.append((name, "lease-lost"))
                raise
            if self._watch_after_resume and name.startswith("executions_"):
                self.calls_after_resume.append((name, "ok"))
            return result

        return call


@dataclass
class SimNode:
    node: Node
    ledger: FaultyLedger
    clock: SkewedClock
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)


@dataclass
class Cluster:
    ledger: MemoryLedger
    db_clock: SkewedClock
    nursery: trio.Nursery
    nodes: dict[str, SimNode] = field(default_factory=dict)
    config_overrides: dict[str, Any] = field(default_factory=dict)

    async def start_node(
        self,
        node_id: str,
        *,
        skew_s: float = 0.0,
        slow: dict[str, float] | None = None,
        region: str | None = None,
        dispatch_queue_max: int | None = None,
    ) -> SimNode:
        clock = SkewedClock(self.db_clock.now(), skew_s=skew_s)
        proxy = FaultyLedger(self.ledger)
        proxy.slow.update(slow or {})
        settings: dict[str, Any] = {
            "lease_ttl_s": 15,
            "lease_safety_margin_s": 2,
            "lookahead_s": 5,
            "clock_probe_interval_s": 10,
            "change_poll_interval_s": 30,
            "http": "",  # many nodes in one process: no HTTP API
            "enable_python": True,  # the tests' task types are python callables
        }
        settings.update(self.config_overrides)
        # The tests' python callables stand in for any handler: let as many run as workers.
        settings.setdefault("blocking_workers", settings.get("workers", WORKERS_DEFAULT))
        if region is not None:
            settings["region"] = region
        if dispatch_queue_max is not None:
            # A queue bound far below a test's backlog (the node's is 50,000).
            settings["dispatch_queue_max"] = dispatch_queue_max
        config = NodeConfig(node_id=node_id, **settings)
        node = Node(config, proxy, clock, random.Random(node_id))  # type: ignore[arg-type]
        sim = SimNode(node, proxy, clock)

        async def run(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
            with sim.scope:
                await node.run(task_status=task_status)

        await self.nursery.start(run)
        self.nodes[node_id] = sim
        return sim

    def owners(self) -> dict[str, list[int]]:
        return {name: list(sim.node.table) for name, sim in self.nodes.items()}


@asynccontextmanager
async def cluster(**config_overrides: Any) -> AsyncIterator[Cluster]:
    db_clock = SkewedClock(START)
    ledger = MemoryLedger(clock=db_clock, partition_count=PARTITIONS)
    async with trio.open_nursery() as nursery:
        yield Cluster(ledger, db_clock, nursery, config_overrides=config_overrides)
        nursery.cancel_scope.cancel()


MIX = [
    ("*/15 * * * *", "UTC"),
    ("0 * * * *", "Europe/Paris"),
    ("H * * * *", "UTC"),
    ("30 2 * * *", "America/New_York"),
    ("H H * * *", "Asia/Tokyo"),
    ("*/5 9-17 * * MON-FRI", "Europe/London"),
    ("H/10 * * * *", "UTC"),
]


def make_schedules(
    count: int, at: datetime, pick: Callable[[int], tuple[str, str]] | None = None
) -> list[Schedule]:
    schedules = []
    for n in range(count):
        expr, zone = pick(n) if pick else MIX[n % len(MIX)]
        sid = f"sched-{n:05d}"
        first = Timetable.compile(expr, zone, schedule_id=sid).next_fire(at).planned_at
        schedules.append(
            Schedule(
                schedule_id=sid,
                tenant_id=f"tenant-{n % 7}",
                cron_expr=expr,
                timezone=zone,
                task_type="noop",
                next_run_at=first,
            )
        )
    return schedules


async def create(ledger: MemoryLedger, schedules: list[Schedule]) -> None:
    await put_noop_task_type(ledger)
    for n in range(0, len(schedules), 1000):
        await ledger.schedules_create(SchedulesCreate(schedules[n : n + 1000]))


def expected_fires(
    schedules: list[Schedule], start: datetime, end: datetime
) -> set[tuple[str, datetime]]:
    """Independent expectation: every fire in (start, end] of every schedule."""
    fires = set()
    cache = TimetableCache()
    for s in schedules:
        timetable = cache.get(s.cron_expr, s.timezone, schedule_id=s.schedule_id)
        at = start
        while True:
            at = timetable.next_fire(at).planned_at
            if at > end:
                break
            fires.add((s.schedule_id, at))
    return fires


async def all_executions(ledger: MemoryLedger) -> list[Execution]:
    found: list[Execution] = []
    cursor = None
    while True:
        page = await ledger.executions_query(ExecutionsQuery(cursor=cursor, limit=1000))
        found += page.items
        if page.next_cursor is None:
            return found
        cursor = page.next_cursor


def within(executions: list[Execution], start: datetime, end: datetime) -> list[Execution]:
    return [e for e in executions if start < e.planned_at <= end]


HOUR = timedelta(hours=1)
