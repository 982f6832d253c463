"""The fence check that opens every ownership-dependent transaction.

:func:`require_fences` share-locks the lease rows of the given fences and checks, by the
server's ``now()``, that each still has the caller as owner with the caller's token and has
not expired. It runs *first*, before any write: if one fence fails, :class:`~engine.errors.
LeaseLost` is raised, the transaction rolls back, and nothing has changed. If all hold, the
share locks keep them holding until commit: a takeover must update the lease row, and that
update waits for this transaction. The lock rows are taken in partition order, like every
other lease-row lock (see :mod:`engine.ledger.postgres.sql`), so this never deadlocks with
the caller's own renewals.
"""

from __future__ import annotations

import asyncpg

from engine.errors import LeaseLost
from engine.ledger.base import Fence
from engine.ledger.postgres import sql


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
    # A partition named twice with different tokens cannot hold under both.
    lost = {fence.partition_id for fence in fences} - holding
    tokens: dict[int, set[tuple[str, int]]] = {}
    for fence in fences:
        tokens.setdefault(fence.partition_id, set()).add((fence.owner_id, fence.fencing_token))
    lost |= {partition for partition, held_as in tokens.items() if len(held_as) > 1}
    if lost:
        partitions = tuple(sorted(lost))
        raise LeaseLost(
            f"the lease of partition(s) {', '.join(map(str, partitions))} is no longer held "
            "with this owner and fencing token; stop acting on them",
            partitions=partitions,
        )
