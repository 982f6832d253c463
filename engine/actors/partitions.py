"""The partitions this node owns: written by the lease keeper, read by planners.

Each owned partition carries its :class:`~engine.ledger.base.Fence` and the monotonic instant
until which this node may *trust* the lease: the start of the acquire/renew attempt plus the
TTL minus a safety margin. Expiry itself is judged by the database's clock, but a node can
only know its own clock, so it stops acting strictly before the database could have handed
the partition to someone else (River's trust window). A planner runs inside a cancel scope
whose deadline is that instant; every successful renewal moves the deadline on.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import trio

from engine.ledger.base import Fence


@dataclass
class OwnedPartition:
    fence: Fence
    trusted_until: float
    """Monotonic seconds (trio's clock); the lease is not to be acted on from then."""
    scope: trio.CancelScope | None = None
    """The cancel scope of the partition's planner while one runs."""
    stopped: trio.Event = field(default_factory=trio.Event)
    """Set once no planner runs for this partition any more (after it was dropped)."""

    def extend(self, trusted_until: float) -> None:
        self.trusted_until = trusted_until
        if self.scope is not None:
            self.scope.deadline = trusted_until


class PartitionTable:
    """This node's view of the partitions it owns, with change notification."""

    def __init__(self) -> None:
        self._owned: dict[int, OwnedPartition] = {}
        self._changed = trio.Event()

    def __contains__(self, partition_id: object) -> bool:
        return partition_id in self._owned

    def __iter__(self) -> Iterator[int]:
        return iter(sorted(self._owned))

    def __len__(self) -> int:
        return len(self._owned)

    def get(self, partition_id: int) -> OwnedPartition | None:
        return self._owned.get(partition_id)

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

    async def wait_changed(self) -> None:
        """Block until the set of owned partitions changes."""
        await self._changed.wait()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()
