"""A cluster of nodes in one ``trio.run`` on trio's mock clock, sharing one MemoryLedger.

Run it under ``trio.testing.MockClock(autojump_threshold=0)`` (pytest-trio's
``autojump_clock`` fixture): hours of cluster time pass in milliseconds, and a run is the same
every time. Each node gets its own wall clock (a :class:`~engine.testing.clock.SkewedClock`,
skewable) and its own :class:`~engine.testing.faulty.FaultyLedger` in front of the shared
ledger, so a test can take one node's database away (``down``), freeze the node
(``pause``), slow its calls (``delay``) or lose its replies, while the others go on::

    async with open_cluster() as cluster:
        first = await cluster.start_node("n1")
        await cluster.start_node("n2")
        await trio.sleep(60)
        first.ledger.down = True  # n1's process is gone: n2 takes its partitions
        await trio.sleep(60)
        assert len(cluster.owners()["n2"]) == CLUSTER_PARTITIONS
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any, Final

import trio

from engine.config import NodeConfig
from engine.ledger.memory import MemoryLedger
from engine.ledger.params import ExecutionsQuery
from engine.model import Execution
from engine.node import Node
from engine.testing.clock import SkewedClock
from engine.testing.faulty import FaultyLedger
from engine.tracing import Tracing

CLUSTER_START: Final = datetime(2026, 3, 2, 0, 0, 30, tzinfo=UTC)
"""Where the cluster's clocks start unless told otherwise."""

CLUSTER_PARTITIONS: Final = 16

NODE_DEFAULTS: Final[Mapping[str, Any]] = MappingProxyType(
    {
        "lease_ttl_s": 15,
        "lease_safety_margin_s": 2,
        "lookahead_s": 5,
        "clock_probe_interval_s": 10,
        "change_poll_interval_s": 30,
        "http": "",  # many nodes in one process: no HTTP API
    }
)
"""The :class:`~engine.config.NodeConfig` settings every node starts with (short leases and
cycles, no HTTP API); the cluster's and each node's own settings override them."""


@dataclass
class ClusterNode:
    """One node of the cluster, with the ledger and clock it alone sees."""

    node: Node
    ledger: FaultyLedger
    clock: SkewedClock
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    """Cancel it to stop the node at once (a killed process)."""


@dataclass
class Cluster:
    ledger: MemoryLedger
    """The shared ledger (no faults: the database as the test sees it)."""
    db_clock: SkewedClock
    """The ledger's clock: the database server's."""
    nursery: trio.Nursery
    nodes: dict[str, ClusterNode] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)
    """:class:`~engine.config.NodeConfig` settings for every node (over :data:`NODE_DEFAULTS`)."""

    async def start_node(
        self,
        node_id: str,
        *,
        skew_s: float = 0.0,
        delays: Mapping[str, float] | None = None,
        tracing: Tracing | None = None,
        **settings: Any,
    ) -> ClusterNode:
        """Start node ``node_id`` (running once this returns), its wall clock ``skew_s``
        ahead of the database's, each call of the methods in ``delays`` taking that much
        longer, and ``settings`` over the cluster's; traced by ``tracing`` (off by default,
        whatever the ``OTEL_*`` variables say)."""
        clock = SkewedClock(self.db_clock.now(), skew_s=skew_s)
        faulty = FaultyLedger(self.ledger)
        for method, seconds in (delays or {}).items():
            faulty.delay(method, seconds)
        config = NodeConfig(node_id=node_id, **{**NODE_DEFAULTS, **self.settings, **settings})
        node = Node(config, faulty.as_ledger(), clock, random.Random(node_id), tracing=tracing)
        started = ClusterNode(node, faulty, clock)

        async def run(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
            with started.scope:
                await node.run(task_status=task_status)

        await self.nursery.start(run)
        self.nodes[node_id] = started
        return started

    def owners(self) -> dict[str, list[int]]:
        """The partitions each node believes it owns."""
        return {name: list(member.node.table) for name, member in self.nodes.items()}


@asynccontextmanager
async def open_cluster(
    *,
    start: datetime = CLUSTER_START,
    partitions: int = CLUSTER_PARTITIONS,
    **settings: Any,
) -> AsyncIterator[Cluster]:
    """A cluster with no node yet, on a fresh MemoryLedger of ``partitions`` whose clock
    starts at ``start``; ``settings`` apply to every node. Its nodes stop on exit."""
    db_clock = SkewedClock(start)
    ledger = MemoryLedger(clock=db_clock, partition_count=partitions)
    async with trio.open_nursery() as nursery:
        yield Cluster(ledger, db_clock, nursery, settings=dict(settings))
        nursery.cancel_scope.cancel()


async def all_executions(ledger: MemoryLedger) -> list[Execution]:
    """Every execution in the ledger, page by page."""
    found: list[Execution] = []
    cursor = None
    while True:
        page = await ledger.executions_query(ExecutionsQuery(cursor=cursor, limit=1000))
        found += page.items
        if page.next_cursor is None:
            return found
        cursor = page.next_cursor
