"""The claim's statements, with cluster-wide concurrency caps (asyncio side).

A task type with ``max_concurrency_cluster`` C may have at most C executions ``running`` in
the whole cluster, while claims of different partitions run at once on different nodes and
connections. Counting and claiming are therefore serialized *per capped task type* by a
transaction advisory lock keyed on a stable hash of the type's name (:func:`cap_lock_key`),
held until commit, and the count is taken by a statement that starts after the lock is
granted: under READ COMMITTED it sees every claim committed by the lock's previous holders.

Design
------
* **Fast path.** The first statement (``executions.executions_claim``, fenced in itself)
  claims the listed startable executions of every task type *without* a cap (an anti-join
  with the few task types in the same statement). A batch of those is done in that one
  statement, as if caps did not exist: no lock, no count, no extra round trip.
* **Capped path** (:func:`claim_capped`, in a transaction whose fences are share-locked).
  Only if some ids were left unclaimed -- capped, not startable or unknown -- one read finds
  the capped task types of the startable ones among them. Those types
  are locked in key order (so two claims locking several types never deadlock; the fences'
  share locks are always taken before, by every claim), then one statement re-reads the
  caps, counts the running executions per type and claims, per type, the first
  ``cap - running`` startable ids in the order given.
* **Safety over liveness.** Anything that changes between the statements can only make the
  claim start fewer executions than it could have, never more: the count is exact under the
  lock, and a candidate that stopped being startable meanwhile is skipped by the update.
* **Caps change** with ``task_types_put``; a claim reads them in its own transaction, so a
  new cap binds the claims that begin after it is committed.
"""

from __future__ import annotations

import asyncpg

from engine.core.hashing import stable_hash
from engine.ledger.postgres import sql_executions

_INT32_SIGN = 1 << 31


def cap_lock_key(task_type: str) -> int:
    """The second advisory-lock key of ``task_type`` (the first is ``sql.CAP_LOCK_SPACE``):
    a signed 32-bit integer, the same on every node and version (BLAKE2b). Two task types
    that share a key merely wait for each other."""
    unsigned = stable_hash(task_type) >> 32
    return unsigned - (1 << 32) if unsigned >= _INT32_SIGN else unsigned


async def claim_capped(
    connection: asyncpg.Connection,
    ids: list[str],
    lease_s: float,
    node_id: str,
    tokens: dict[int, int],
) -> list[asyncpg.Record]:
    """Claim what may start of ``ids`` (left over by the fast path, which claims every
    uncapped one) inside the caller's transaction, whose fences already hold: the started
    rows, in no order."""
    capped = [
        row["task_type"]
        for row in await connection.fetch(sql_executions.TASK_TYPES_CAPPED_AMONG, ids)
    ]
    if not capped:
        return []
    await connection.execute(
        sql_executions.CAP_LOCKS, sorted({cap_lock_key(name) for name in capped})
    )
    fenced = (list(tokens), list(tokens.values()))
    rows: list[asyncpg.Record] = await connection.fetch(
        sql_executions.EXECUTIONS_CLAIM_CAPPED, ids, lease_s, node_id, *fenced, capped
    )
    return rows
