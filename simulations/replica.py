"""The run's databases: region A's primary and, after a region failover, the promoted replica.

A :class:`Database` is one PostgreSQL server as the simulator models it: a
:class:`~engine.ledger.memory.MemoryLedger` and whether its clients can reach it. Every
ledger proxy talks to one database for the life of its process.

:func:`replica_of` is the streaming replica at one instant: a second ``MemoryLedger`` holding
a copy of the primary's state as it is *now* (what the standby has replayed when the
primary is lost ``lag_s`` later), independent of it from then on. Invariants:

* every table is copied (``copy.deepcopy``): no row, index or list is shared, so a write to
  either ledger never shows in the other;
* the clock is **shared**, not copied: both servers read the same true time, as two
  NTP-synchronised database servers do (a deep copy of a
  :class:`~simulations.clocks.DatabaseClock` would read the same now, but a clock is not
  data and must not fork);
* the schedule change feed's rows are copied, its trio ``Event`` is not: tasks parked on the
  primary's feed (its change-feed waiters) stay with the primary, and the replica's feed
  starts with a fresh event (a deep copy of a trio ``Event`` would copy its waiting-task
  set, which is not data either).

``engine/`` has no hook for this: the copy is taken from the ledger's attributes, whatever
they are, so a table added to ``MemoryLedger`` later is copied too.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from engine.ledger.memory import MemoryLedger
from engine.ledger.memory.tables import ChangeFeed


@dataclass
class Database:
    """One database server of the run."""

    name: str
    """``a`` (the run's primary) or ``b`` (the replica promoted at a region failover)."""
    ledger: MemoryLedger
    reachable: bool = True
    """``False`` while its clients cannot reach it (the old primary after a failover)."""


def replica_of(primary: MemoryLedger) -> MemoryLedger:
    """A new ledger with a copy of ``primary``'s state now, on the same clock."""
    state: dict[str, Any] = vars(primary)
    clock = state["_clock"]
    replica = MemoryLedger.__new__(MemoryLedger)
    memo: dict[int, Any] = {id(clock): clock}
    for name, value in state.items():
        copied = value.copy() if isinstance(value, ChangeFeed) else copy.deepcopy(value, memo)
        setattr(replica, name, copied)
    return replica
