"""The asyncio side of the Postgres ledger: a pool, and the way every operation runs on it.

Each ledger operation is one coroutine (``async def op(store, params)``) that checks its
input, then opens at most one transaction through :meth:`Store.transaction` or reads through
:meth:`Store.connection`. :meth:`Store.run` wraps it: driver failures become Carillon errors,
and a transaction the server aborted to break a deadlock or a serialization conflict is run
again, a bounded number of times (it changed nothing, so repeating it is safe).

Invariants: everything here runs on the bridge's event loop; the partition count is read
once at open (it is fixed by ``carillon migrate``); after a connection-level failure every
pooled connection is replaced on its next use, so a restarted server costs the callers at
most one :class:`~engine.errors.LedgerUnavailable` per operation in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Final, TypeVar

import asyncpg

from engine.errors import LedgerUnavailable
from engine.ledger.postgres.connection import is_unavailable, translate_errors

T = TypeVar("T")
P = TypeVar("P")

ACQUIRE_TIMEOUT_S: Final = 10.0
"""How long an operation waits for a pooled connection (pool exhausted or reconnecting)."""
CONFLICT_RETRIES: Final = 3
"""Runs of an operation the server aborted with a deadlock or serialization failure."""

_RETRYABLE: Final = (asyncpg.DeadlockDetectedError, asyncpg.SerializationError)


CONTROL_POOL_SIZE: Final = 2
"""Connections reserved for lease, membership and clock operations."""


ANALYZE_AFTER_ROWS: Final = 50_000
SCHEDULES_STATISTICS_CHECK_S: Final = 60.0
"""How often a node asks whether the schedules table's statistics are stale (one small read)."""

TABLE_STATISTICS: Final = """
SELECT c.reltuples, s.n_mod_since_analyze
FROM pg_class AS c JOIN pg_stat_user_tables AS s ON s.relid = c.oid
WHERE c.oid = $1::regclass
"""
"""The query planner's row count of table ``$1`` (-1: never analyzed) and the rows changed
since its last analysis."""


def statistics_stale(reltuples: float, modified: int) -> bool:
    """Autovacuum's analyze rule with its default settings (50 rows + 10 % of the table), for
    a server on which it is off or has not come round yet; a table never analyzed
    (``reltuples`` -1) is always stale (the count of changed rows may not have been
    reported yet, and analyzing a small table costs next to nothing)."""
    return reltuples < 0 or modified > 50 + 0.1 * reltuples


class Store:
    """Two pools of connections and the cluster's fixed partition count.

    ``pool`` serves data operations (planning, claiming, listing); ``control`` serves only
    the small operations that keep a node's leases and membership alive, so that a renewal
    never waits behind a planner loading a million schedules and loses a lease it holds.
    """

    def __init__(
        self, pool: asyncpg.Pool, control: asyncpg.Pool | None = None, *, partition_count: int
    ) -> None:
        self.pool = pool
        self.control = control or pool
        self.partition_count = partition_count
        self._planned_unanalyzed = 0
        self._schedules_checked_at = -math.inf

    async def note_planned(self, rows: int) -> None:
        """Count executions this process inserted, and refresh the executions table's
        statistics every :data:`ANALYZE_AFTER_ROWS` of them. A burst planned faster than
        autovacuum analyzes (or with autovacuum off) otherwise leaves the query planner
        believing the startable backlog holds a handful of rows: it then sorts the whole
        backlog on every fetch instead of reading the index in order (measured on 200,000:
        40-80 ms a page instead of a few). An ANALYZE samples a bounded number of rows
        (about 0.1 s), and locks nothing that reads or writes wait for."""
        self._planned_unanalyzed += rows
        if self._planned_unanalyzed < ANALYZE_AFTER_ROWS:
            return
        self._planned_unanalyzed = 0
        await self._analyze("executions")  # the plan is committed already

    async def check_schedules_statistics(self) -> None:
        """Refresh the schedules table's statistics when they are stale, at most every
        :data:`SCHEDULES_STATISTICS_CHECK_S`. Schedules created in bulk (an import, a
        benchmark) into a table never analyzed leave the query planner guessing its size
        from nothing: it then hash-joins a plan's batch against the whole table instead of
        probing the primary key (measured at 5,000,000 schedules: 2.9 s per 5,000-row advance
        instead of 0.1 s, spilling to disk). Autovacuum would fix that within a minute or so
        where it runs; this does it where it is off or has not come round yet."""
        now = asyncio.get_running_loop().time()
        if now - self._schedules_checked_at < SCHEDULES_STATISTICS_CHECK_S:
            return
        self._schedules_checked_at = now
        await self._analyze("schedules", if_stale=True)

    async def _analyze(self, table: str, *, if_stale: bool = False) -> None:
        """``ANALYZE table`` (when ``if_stale``, only if :func:`statistics_stale` says so).
        Best effort: stale statistics only cost speed, so a failure here must not fail the
        write that asked for it."""
        with contextlib.suppress(asyncpg.PostgresError, asyncpg.InterfaceError, OSError):
            async with self.connection() as connection:
                if if_stale:
                    row = await connection.fetchrow(TABLE_STATISTICS, table)
                    if row is None or not statistics_stale(
                        row["reltuples"], row["n_mod_since_analyze"]
                    ):
                        return
                await connection.execute(f"ANALYZE {table}")

    async def run(self, op: Callable[[Store, P], Awaitable[T]], params: P) -> T:
        """Run one operation, translating failures and retrying aborted transactions."""
        for run in range(1, CONFLICT_RETRIES + 1):
            try:
                with translate_errors():
                    return await self._watch(op(self, params))
            except _RETRYABLE as exc:
                if run == CONFLICT_RETRIES:
                    raise LedgerUnavailable(
                        f"the database aborted the transaction {run} times: {exc}"
                    ) from exc
        raise AssertionError("unreachable")  # pragma: no cover

    async def _watch(self, call: Awaitable[T]) -> T:
        try:
            return await call
        except BaseException as exc:
            if is_unavailable(exc):
                # Connections opened before the failure may all be dead (a restart); make
                # the pools replace each one at its next acquisition instead of failing on it.
                await self.pool.expire_connections()
                if self.control is not self.pool:
                    await self.control.expire_connections()
            raise

    @asynccontextmanager
    async def connection(self, *, control: bool = False) -> AsyncIterator[asyncpg.Connection]:
        """A pooled connection in autocommit mode (for single-statement reads); from the
        control pool when ``control``."""
        pool = self.control if control else self.pool
        async with pool.acquire(timeout=ACQUIRE_TIMEOUT_S) as connection:
            yield connection

    @asynccontextmanager
    async def transaction(
        self, *, readonly: bool = False, control: bool = False
    ) -> AsyncIterator[asyncpg.Connection]:
        """A pooled connection inside a READ COMMITTED transaction (REPEATABLE READ when
        ``readonly``, so that several reads see one snapshot), committed on success."""
        isolation = "repeatable_read" if readonly else "read_committed"
        pool = self.control if control else self.pool
        async with (
            pool.acquire(timeout=ACQUIRE_TIMEOUT_S) as connection,
            connection.transaction(isolation=isolation, readonly=readonly),
        ):
            yield connection

    async def close(self) -> None:
        await self.pool.close()
        if self.control is not self.pool:
            await self.control.close()

    def terminate(self) -> None:
        self.pool.terminate()
        if self.control is not self.pool:
            self.control.terminate()
