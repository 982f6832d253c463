"""The fence check that opens every ownership-dependent transaction.

:func:`require_fences` key-share-locks the lease rows of the given fences and checks, by the
server's ``now()``, that each still has the caller as owner with the caller's token and has
not expired. It runs *first*, before any write: if one fence fails, :class:`~engine.errors.
LeaseLost` is raised, the transaction rolls back, and nothing has changed. If all hold, the
locks keep them holding until commit: a takeover locks the lease row ``FOR UPDATE`` first,
and that waits for (or skips) this transaction; the owner's renewals do not
(``sql.FENCES_HOLDING``). The lock rows are taken in partition order, like every
other lease-row lock (see :mod:`engine.ledger.postgres.sql`), so this never deadlocks with
the caller's own renewals.
"""

from __future__ import annotations

import asyncpg

from engine.errors import LeaseLost
from engine.ledger.params import Fence
from engine.ledger.postgres import sql


def lease_lost(partitions: set[int]) -> LeaseLost:
    ordered = tuple(sorted(partitions))
    return LeaseLost(
        f"the lease of partition(s) {', '.join(map(str, ordered))} is no longer held "
        "with this owner and fencing token; stop acting on them",
        partitions=ordered,
    )


def _ways_held(fences: list[Fence]) -> dict[int, set[tuple[str, int]]]:
    """The (owner, token) pairs each partition is named with."""
    held_as: dict[int, set[tuple[str, int]]] = {}
    for fence in fences:
        held_as.setdefault(fence.partition_id, set()).add((fence.owner_id, fence.fencing_token))
    return held_as


def _conflicting(held_as: dict[int, set[tuple[str, int]]]) -> set[int]:
    """Partitions named with two different owners or tokens: they cannot hold under both."""
    return {partition for partition, ways in held_as.items() if len(ways) > 1}


def fence_arrays(fences: list[Fence]) -> tuple[list[int], list[str], list[int]]:
    """The fences as the partition, owner and token arrays of :func:`sql_executions.fence_cte`, each
    partition once; ``LeaseLost`` for a partition named with two different owners or tokens."""
    held_as = _ways_held(fences)
    conflicting = _conflicting(held_as)
    if conflicting:
        raise lease_lost(conflicting)
    partitions = list(held_as)
    pairs = [next(iter(held_as[partition])) for partition in partitions]
    return partitions, [owner for owner, _ in pairs], [token for _, token in pairs]


def check_held(head: asyncpg.Record, partitions: list[int]) -> None:
    """Raise ``LeaseLost`` unless the statement's fence check (the ``fences_held`` and
    ``holding`` columns of :func:`sql_executions.fence_cte`'s ``held``) found every fence holding --
    in which case the statement changed nothing."""
    if head["fences_held"] != len(partitions):
        raise lease_lost(set(partitions) - set(head["holding"] or ()))


async def require_fences(connection: asyncpg.Connection, fences: list[Fence]) -> None:
    """Raise LeaseLost naming every partition whose fence does not hold (inside a txn)."""
    if not fences:
        return
    rows = await connection.fetch(
        sql.FENCES_HOLDING,
        [fence.partition_id for fence in fences],
        [fence.owner_id for fence in fences],
        [fence.fencing_token for fence in fences],
    )
    holding = {row["partition_id"] for row in rows}
    lost = {fence.partition_id for fence in fences} - holding
    lost |= _conflicting(_ways_held(fences))
    if lost:
        raise lease_lost(lost)
