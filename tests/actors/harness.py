"""The actor tests' cluster: :func:`engine.testing.open_cluster` with their settings, and the
schedules, fires and tenants they share.

Each node gets its own wall clock (skewable) and its own
:class:`~engine.testing.FaultyLedger`: ``down`` makes the node *crash* (every call fails, as
if the process were gone), ``pause`` freezes it (calls block, then go out after the pause,
like a frozen process whose requests sit in a socket buffer).
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import datetime, timedelta
from typing import Any

from engine.actors.clock_monitor import ClockMonitor, ClockMonitorConfig
from engine.actors.context import NodeContext
from engine.actors.partitions import PartitionTable
from engine.clock import Clock
from engine.config import (
    CLOCK_PROBE_INTERVAL_S_DEFAULT,
    CLOCK_SKEW_BOUND_S_DEFAULT,
    WORKERS_DEFAULT,
)
from engine.core.timetable import Timetable, TimetableCache
from engine.ledger.base import Ledger
from engine.ledger.memory import MemoryLedger
from engine.ledger.params import SchedulesCreate
from engine.metrics import NodeMetrics
from engine.model import Execution, Schedule
from engine.testing import CLUSTER_PARTITIONS, CLUSTER_START, Cluster, open_cluster
from engine.testing import all_executions as all_executions  # the actor tests import it here
from tests.ledger.backends import put_noop_task_type

TEST_TENANTS: tuple[str, ...] = (
    *("default", "acme", "t", "t1", "t2", "t3", "big", "heavy", "middle", "light", "quota"),
    *(f"{prefix}-{n}" for prefix in ("tenant", "small", "burst") for n in range(20)),
)
"""Every tenant the actor tests' schedules use: python and shell task types are granted to
tenants by name, never to every tenant."""

START = CLUSTER_START
PARTITIONS = CLUSTER_PARTITIONS


def node_context(
    ledger: Ledger,
    clock: Clock,
    *,
    table: PartitionTable | None = None,
    metrics: NodeMetrics | None = None,
    seed: int = 1,
) -> NodeContext:
    """What a node gives its actors, for a test that builds one actor alone: a clock monitor
    as a default node's (on ``ledger``; running it is the test's choice), an empty partition
    table unless given, fresh metrics unless given, one rng."""
    rng = random.Random(seed)
    monitor = ClockMonitor(
        ClockMonitorConfig(CLOCK_SKEW_BOUND_S_DEFAULT, CLOCK_PROBE_INTERVAL_S_DEFAULT),
        ledger=ledger,
        clock=clock,
        rng=rng,
    )
    return NodeContext(
        ledger=ledger,
        clock=clock,
        monitor=monitor,
        table=PartitionTable() if table is None else table,
        rng=rng,
        metrics=NodeMetrics() if metrics is None else metrics,
    )


@asynccontextmanager
async def cluster(**config_overrides: Any) -> AsyncIterator[Cluster]:
    """:func:`~engine.testing.open_cluster` at :data:`START`, with the tests' python task
    types enabled: their callables stand in for any handler, so as many run as workers."""
    config_overrides.setdefault("enable_python", True)
    config_overrides.setdefault(
        "blocking_workers", config_overrides.get("workers", WORKERS_DEFAULT)
    )
    async with open_cluster(start=START, partitions=PARTITIONS, **config_overrides) as opened:
        yield opened


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


def within(executions: list[Execution], start: datetime, end: datetime) -> list[Execution]:
    return [e for e in executions if start < e.planned_at <= end]


HOUR = timedelta(hours=1)
