"""Which partitions a node should take or hand back: fair share with sticky preferences.

Each live node aims for its fair share: ``P // n`` partitions, plus one for the first
``P % n`` nodes in id order, so the shares add up to exactly ``P`` and the cluster is as
balanced as it can be (16 partitions over 3 nodes: 6, 5, 5). Which ones is decided by
rendezvous (highest-random-weight) hashing: for every partition, each live node has a
stable weight ``stable_hash(node:partition)`` and the heaviest node is its *preferred*
owner. A node takes free or expired partitions preferring those it is preferred for, and
hands back extras preferring those another node is preferred for. So when nodes join or leave
only the partitions that must move do, and they move to where they will stay.

Pure: the caller passes the lease rows and the live-node list it read from the ledger, and the
ledger's current time, and carries out the decision through fenced ledger calls.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import msgspec

from engine.core.hashing import stable_hash
from engine.model import Lease


class OwnershipPlan(msgspec.Struct, frozen=True):
    target: int
    """This node's fair share."""
    acquire: list[int]
    """Free or expired partitions to try to take, best first."""
    release: list[int]
    """Partitions this node holds beyond its share, to hand back gracefully."""


def fair_share(partition_count: int, live_nodes: Sequence[str], me: str) -> int:
    """``me``'s share: ``P // n``, plus one if ``me`` is among the first ``P % n`` nodes."""
    nodes = sorted(set(live_nodes) | {me})
    base, extra = divmod(partition_count, len(nodes))
    return base + (1 if nodes.index(me) < extra else 0)


def _weight(node_id: str, partition_id: int) -> int:
    return stable_hash(f"{node_id}:{partition_id}")


def preferred_owner(partition_id: int, live_nodes: Sequence[str]) -> str:
    """The live node rendezvous hashing assigns ``partition_id`` to."""
    return max(sorted(live_nodes), key=lambda node: _weight(node, partition_id))


def plan_ownership(
    me: str, leases: Sequence[Lease], live_nodes: Sequence[str], now: datetime
) -> OwnershipPlan:
    """Decide what ``me`` should acquire and release, given the leases as of ``now``."""
    nodes = sorted(set(live_nodes) | {me})
    target = fair_share(len(leases), nodes, me)
    mine = [
        lease.partition_id
        for lease in leases
        if lease.owner_id == me and lease.expires_at is not None and lease.expires_at > now
    ]
    free = [
        lease.partition_id
        for lease in leases
        if lease.owner_id is None or lease.expires_at is None or lease.expires_at <= now
    ]

    def preference(partition_id: int) -> tuple[bool, int]:
        # Partitions preferred by this node first; ties broken by this node's weight.
        return (preferred_owner(partition_id, nodes) != me, -_weight(me, partition_id))

    if len(mine) < target:
        return OwnershipPlan(target, sorted(free, key=preference)[: target - len(mine)], [])
    if len(mine) > target:
        extras = sorted(mine, key=preference, reverse=True)[: len(mine) - target]
        return OwnershipPlan(target, [], sorted(extras))
    return OwnershipPlan(target, [], [])
