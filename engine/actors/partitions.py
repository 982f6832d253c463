"""The partitions this node owns: written by the lease keeper, read by planners.

Each owned partition carries its :class:`~engine.ledger.params.Fence` and the monotonic instant
until which this node may *trust* the lease: the start of the acquire/renew attempt plus the
TTL minus a safety margin. Expiry itself is judged by the database's clock, but a node can
only know its own clock, so it stops acting strictly before the database could have handed
the partition to someone else (River's trust window). A planner runs inside a cancel scope
whose deadline is that instant; every successful renewal moves the deadline on.

**A partition is drained before it is handed back.** While *draining* it is still owned --
its lease is renewed, its planner plans on, and the attempts this node already claimed there
are renewed and completed under its fence -- but nothing more of it is fetched or claimed.
Released at once instead, those completions would be refused by the fence and the attempts
run again after their attempt lease: a duplicate side effect and a minute's delay. The table
counts the attempts in flight per partition (being claimed, or claimed and not yet settled)
so the lease keeper can wait for them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import trio

from engine.ledger.params import Fence


@dataclass
class OwnedPartition:
    fence: Fence
    trusted_until: float
    """Monotonic seconds (trio's clock); the lease is not to be acted on from then."""
    scope: trio.CancelScope | None = None
    """The cancel scope of the partition's planner while one runs."""
    stopped: trio.Event = field(default_factory=trio.Event)
    """Set once no planner runs for this partition any more (after it was dropped)."""
    draining: bool = False
    """Being handed back: nothing more of it is fetched or claimed here."""

    def extend(self, trusted_until: float) -> None:
        self.trusted_until = trusted_until
        if self.scope is not None:
            self.scope.deadline = trusted_until


class PartitionTable:
    """This node's view of the partitions it owns, with change notification."""

    def __init__(self) -> None:
        self._owned: dict[int, OwnedPartition] = {}
        self._changed = trio.Event()
        self._inflight: dict[int, int] = {}
        self._folds: dict[int, int] = {}
        self._settled = trio.Event()

    def __contains__(self, partition_id: object) -> bool:
        return partition_id in self._owned

    def __iter__(self) -> Iterator[int]:
        return iter(sorted(self._owned))

    def __len__(self) -> int:
        return len(self._owned)

    def get(self, partition_id: int) -> OwnedPartition | None:
        return self._owned.get(partition_id)

    def claimable(self) -> list[int]:
        """The owned partitions whose executions this node may fetch and claim (not draining)."""
        return [p for p in sorted(self._owned) if not self._owned[p].draining]

    def fences(self) -> list[Fence]:
        return [self._owned[p].fence for p in sorted(self._owned)]

    def add(self, fence: Fence, trusted_until: float) -> None:
        self._owned[fence.partition_id] = OwnedPartition(fence, trusted_until)
        self._notify()

    def drop(self, partition_id: int) -> OwnedPartition | None:
        """Stop owning ``partition_id`` locally: its planner is cancelled at once."""
        owned = self._owned.pop(partition_id, None)
        if owned is not None:
            if owned.scope is not None:
                owned.scope.cancel()
            else:
                owned.stopped.set()
            self._notify()
        return owned

    def drain(self, partition_id: int) -> OwnedPartition | None:
        """Stop fetching and claiming in ``partition_id``, keeping it otherwise (see the
        module docstring); :meth:`drop` ends the drain."""
        owned = self._owned.get(partition_id)
        if owned is not None:
            owned.draining = True
        return owned

    # -- attempts in flight ---------------------------------------------------------------

    def attempts_started(self, partition_id: int, count: int = 1) -> None:
        """``count`` attempts of ``partition_id`` are being claimed by this node."""
        self._inflight[partition_id] = self._inflight.get(partition_id, 0) + count

    def attempts_settled(self, partition_id: int, count: int = 1) -> None:
        """``count`` of them settled: not claimed after all, given up, or their completion
        was written (or refused)."""
        left = self._inflight.get(partition_id, 0) - count
        if left > 0:
            self._inflight[partition_id] = left
            return
        self._inflight.pop(partition_id, None)
        self._settled.set()
        self._settled = trio.Event()

    def attempts_started_each(self, partition_ids: Iterable[int]) -> None:
        """One attempt being claimed per item of ``partition_ids``."""
        for partition_id, count in _tally(partition_ids).items():
            self.attempts_started(partition_id, count)

    def attempts_settled_each(self, partition_ids: Iterable[int]) -> None:
        """One attempt settled per item of ``partition_ids``."""
        for partition_id, count in _tally(partition_ids).items():
            self.attempts_settled(partition_id, count)

    def attempts_in_flight(self, partition_id: int) -> int:
        return self._inflight.get(partition_id, 0)

    # -- folded attempts in flight (a subset of the above) ---------------------------------

    def folds_started_each(self, partition_ids: Iterable[int]) -> None:
        """One folded attempt started per item of ``partition_ids``: no attempt lease keeps
        another node from running its execution once the lease is released (docs/ledger.md,
        "Folded claims"), so a hand-back waits for these beyond its drain."""
        for partition_id, count in _tally(partition_ids).items():
            self._folds[partition_id] = self._folds.get(partition_id, 0) + count

    def fold_settled(self, partition_id: int) -> None:
        """A folded attempt of ``partition_id`` settled (closed)."""
        left = self._folds.get(partition_id, 0) - 1
        if left > 0:
            self._folds[partition_id] = left
            return
        self._folds.pop(partition_id, None)
        self._settled.set()
        self._settled = trio.Event()

    def folds_in_flight(self, partition_id: int) -> int:
        return self._folds.get(partition_id, 0)

    async def wait_folds_settled(self, partition_ids: list[int]) -> None:
        """Block until no folded attempt of ``partition_ids`` is in flight on this node."""
        while any(p in self._folds for p in partition_ids):
            await self._settled.wait()

    async def wait_settled(self, partition_ids: list[int]) -> None:
        """Block until no attempt of ``partition_ids`` is in flight on this node."""
        while any(p in self._inflight for p in partition_ids):
            await self._settled.wait()

    async def wait_changed(self) -> None:
        """Block until the set of owned partitions changes."""
        await self._changed.wait()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()


def _tally(partition_ids: Iterable[int]) -> dict[int, int]:
    return Counter(partition_ids)  # counted in C: one batch of a burst is hundreds
