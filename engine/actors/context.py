"""What every actor of a node shares: the :class:`NodeContext`.

An actor takes its own frozen config first, then ``ctx`` and any collaborator of its own
(the dispatcher's room, the lease keeper's membership), all by keyword. The node builds one
context (``engine/node.py``), after the clock monitor it carries; the monitor itself, built
first, takes the ledger, clock and rng alone. Each actor's config comes from the node's
settings in one place: ``engine/actors/configs.py``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from engine.actors.clock_monitor import ClockMonitor
from engine.actors.partitions import PartitionTable
from engine.clock import Clock
from engine.ledger.base import Ledger
from engine.metrics import NodeMetrics
from engine.tracing import Tracing


@dataclass(frozen=True, kw_only=True, slots=True)
class NodeContext:
    """The dependencies a node's actors share (one per node, never replaced)."""

    ledger: Ledger
    clock: Clock
    """The node's own clock: monotonic time for every timer. Its wall clock is not trusted
    for planning or due times; :meth:`ClockMonitor.now` is the database's time."""
    monitor: ClockMonitor
    table: PartitionTable
    """The partitions this node owns, their fences and trust windows."""
    rng: random.Random
    """The node's one seeded stream: jitter, retry backoff (a seed reproduces a run)."""
    metrics: NodeMetrics
    tracing: Tracing | None = None
    """The node's tracing (``engine/tracing.py``); ``None``, the default, when it is off."""
