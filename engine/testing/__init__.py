"""Public test toolkit for Carillon and for people testing the handlers or ledgers they write,
as ``trio.testing`` is for trio (see docs/testing.md).

* :class:`MemoryLedger`: the in-memory ledger, the contract's reference backend;
* :class:`ManualClock`, :class:`SkewedClock`: clocks a test moves;
* :class:`FaultyLedger`: a ledger wrapper that injects errors, delays, pauses and lost replies
  on named methods;
* :func:`open_cluster`: several nodes in one ``trio.run`` on the mock clock, sharing one
  memory ledger, each behind its own :class:`FaultyLedger`;
* ``engine.testing.ledger_contract``: the ledger contract suite, per protocol area, to run
  against a ledger of your own (it needs pytest; nothing here imports it).

Nothing in ``engine/`` outside this package imports it, and importing it needs no pytest.
"""

from engine.ledger.memory import MemoryLedger
from engine.testing.clock import ManualClock, SkewedClock
from engine.testing.cluster import (
    CLUSTER_PARTITIONS,
    CLUSTER_START,
    NODE_DEFAULTS,
    Cluster,
    ClusterNode,
    all_executions,
    open_cluster,
)
from engine.testing.faulty import LEDGER_METHODS, CallOutcome, FaultyLedger, Hold

__all__ = [
    "CLUSTER_PARTITIONS",
    "CLUSTER_START",
    "LEDGER_METHODS",
    "NODE_DEFAULTS",
    "CallOutcome",
    "Cluster",
    "ClusterNode",
    "FaultyLedger",
    "Hold",
    "ManualClock",
    "MemoryLedger",
    "SkewedClock",
    "all_executions",
    "open_cluster",
]
