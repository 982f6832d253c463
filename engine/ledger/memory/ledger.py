"""An in-memory, deterministic :class:`~engine.ledger.base.Ledger` for tests and simulations.

It honours the whole contract of :mod:`engine.ledger.base` and passes the same contract suite
as the PostgreSQL ledger, so a planner, dispatcher or whole simulated cluster can run against
it with no database.

Design
------
* **Time.** The "database clock" is the injected :class:`~engine.clock.Clock`: every expiry
  is judged by, and every timestamp written is, ``clock.now()``. Simulations give the ledger
  its own (possibly skewed) clock, just as Postgres has its own ``now()``.
* **Transactions.** Each method opens with one trio checkpoint (so callers see a real
  suspension point, and cancellation may land there) and then runs to completion without
  awaiting: one method is one serializable transaction. Every method validates its whole
  input (``params.checked()``, as the Postgres ledger does) and checks every fence *before*
  changing anything, so a refused call changes nothing.
* **Validation order.** Malformed input (``InvalidField``) is reported before a lost lease
  (``LeaseLost``), since it is a caller bug whoever owns the partition.
* **Determinism.** No randomness, no real time, and no behaviour that depends on set or hash
  order: listings are sorted and batches are processed in the order given.
* **Soft delete.** A deleted schedule leaves the live table for a tombstone table; its id
  may be created again, and planning inserts executions only for live schedules.
* **Cluster caps.** A claim counts the running executions of a capped task type from an
  index kept by the execution table, so uncapped task types cost a dictionary lookup.
* **Layout.** One mixin per protocol area, in the file of the same name as the Postgres
  ledger's (see :mod:`engine.ledger.memory`); all of them share one state, its tables and
  its one clock (:class:`~engine.ledger.memory.state.MemoryState`).

Invariants
----------
* ``partition_id`` of a schedule is ``partition_of(schedule_id, partition_count)``, and an
  execution lives in its schedule's partition.
* ``attempt_expires_at`` is set exactly while an execution is ``running``; ``finished_at``
  exactly while it is terminal.
* Terminal executions never change again, except a dead letter that is replayed.
* No claim takes a task type past its ``max_concurrency_cluster`` running executions.
* Every live schedule names a stored task type (deleted schedules need not).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.ledger.memory.audit import AuditMethods
from engine.ledger.memory.catalog import CatalogMethods
from engine.ledger.memory.cluster import ClusterMethods
from engine.ledger.memory.executions import ExecutionMethods
from engine.ledger.memory.manifests import ManifestMethods
from engine.ledger.memory.schedules import ScheduleMethods
from engine.ledger.memory.tokens import TokenMethods

if TYPE_CHECKING:
    from engine.ledger.base import Ledger


class MemoryLedger(
    ClusterMethods,
    ScheduleMethods,
    CatalogMethods,
    ExecutionMethods,
    AuditMethods,
    TokenMethods,
    ManifestMethods,
):
    """The ledger contract in process memory, on an injected clock.

    ``MemoryLedger(clock=..., partition_count=64, active_region="default")``: the cluster
    settings a ``migrate`` would fix; every partition starts with a free lease row (no
    owner, token 0). The constructor and the tables are
    :class:`~engine.ledger.memory.state.MemoryState`'s.
    """


if TYPE_CHECKING:
    # mypy proves the class still satisfies the whole protocol whenever the contract grows.
    _CONFORMS: type[Ledger] = MemoryLedger
