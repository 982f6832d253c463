"""PostgresLedger: the ledger protocol on PostgreSQL, for trio callers.

Each method is **one hop** over the database bridge: it hands one asyncio coroutine (from
the module of its protocol area: :mod:`~engine.ledger.postgres.cluster`,
:mod:`~engine.ledger.postgres.schedules`, :mod:`~engine.ledger.postgres.catalog`,
:mod:`~engine.ledger.postgres.executions`, :mod:`~engine.ledger.postgres.audit` or
:mod:`~engine.ledger.postgres.tokens`) to the bridge's loop, and that coroutine runs the
whole transaction there (``docs/ledger.md``, "The bridge and the driver, measured": a claim
costs 1.6 ms as one hop, 3.0 ms as one hop per statement). The docstrings of
:class:`~engine.ledger.base.Ledger` are the contract.

Design
------
* **Fencing** happens in SQL, first in every ownership-dependent transaction: the lease
  rows are key-share-locked and checked against owner, token and the server's ``now()``
  (:mod:`~engine.ledger.postgres.fencing`). A failed fence raises ``LeaseLost`` before any
  write, and the held locks make a takeover (``FOR UPDATE``) wait until the transaction
  ends, while the owner's renewals (``FOR NO KEY UPDATE``) pass.
* **Atomicity**: one transaction per method; batches are single statements over arrays.
* **Task types** must exist for every live schedule naming them: checked under a key-share
  lock by schedule writers, and backed by a foreign key (:mod:`~engine.ledger.postgres.
  catalog`).
* **Change order**: schedule writers serialize on a transaction advisory lock just before
  drawing their ``seq``, so the feed's order is commit order, and NOTIFY in the same
  transaction (:mod:`~engine.ledger.postgres.schedules`); waiters LISTEN on a dedicated
  connection (:mod:`~engine.ledger.postgres.listener`).
* **Availability**: connection loss, restarts, timeouts and cancellations by the server
  become ``LedgerUnavailable``; the pool then replaces its connections, so once the server
  is back the next operation succeeds.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from datetime import datetime
from typing import TYPE_CHECKING, Final, TypeVar

import trio

from engine.errors import ConfigError
from engine.ledger.bridge import DatabaseBridge, open_bridge
from engine.ledger.checks import check_wait_timeout
from engine.ledger.manifests import ManifestDone, ManifestsApply
from engine.ledger.params import (
    AuditQuery,
    Backfilled,
    ClusterSettings,
    CompleteResult,
    DeadLettersPurge,
    DeadLettersReplay,
    ExecutionDetail,
    ExecutionsBackfill,
    ExecutionsBucket,
    ExecutionsClaim,
    ExecutionsComplete,
    ExecutionsDue,
    ExecutionsExtend,
    ExecutionsFinish,
    ExecutionsPlan,
    ExecutionsPurge,
    ExecutionsQuery,
    ExecutionsRequeueExpired,
    ExecutionsSkip,
    ExecutionsStats,
    ExecutionsTrigger,
    LeasesAcquire,
    LeasesRelease,
    LeasesRenew,
    NodeInfo,
    NodesHeartbeat,
    Page,
    PlannableSchedule,
    PlanResult,
    RegionChange,
    RegionFailover,
    ScheduleChange,
    ScheduleChangesPrune,
    ScheduleChangesSince,
    ScheduleGroup,
    SchedulesCensus,
    SchedulesCreate,
    SchedulesDelete,
    SchedulesList,
    SchedulesPlannable,
    SchedulesUpdate,
    SessionsCreate,
    TaskTypesPut,
    TenantsPut,
    TokensCreate,
    TokensRevoke,
)
from engine.ledger.postgres import (
    audit,
    catalog,
    cluster,
    executions,
    manifests,
    schedules,
    sql,
    tokens,
)
from engine.ledger.postgres.connection import connect, create_pool, translate_errors
from engine.ledger.postgres.listener import ChangeListener
from engine.ledger.postgres.migrate import latest_version
from engine.ledger.postgres.store import CONTROL_POOL_SIZE, Store
from engine.model import (
    ApiToken,
    AuditEvent,
    ConsoleSession,
    Execution,
    Lease,
    PlannerCheckpoint,
    Schedule,
    TaskType,
    Tenant,
)

if TYPE_CHECKING:
    from engine.ledger.base import Ledger

__all__ = [
    "POOL_MAX_DEFAULT",
    "STATEMENT_TIMEOUT_S_DEFAULT",
    "PostgresLedger",
    "open_postgres_ledger",
]

POOL_MAX_DEFAULT: Final = 10
STATEMENT_TIMEOUT_S_DEFAULT: Final = 30.0
CLOSE_TIMEOUT_S: Final = 5.0
"""How long closing waits for the pool's connections to say goodbye before cutting them."""

P = TypeVar("P")
T = TypeVar("T")


class PostgresLedger:
    """The ledger on PostgreSQL; made by :func:`open_postgres_ledger`."""

    def __init__(self, bridge: DatabaseBridge, store: Store, listener: ChangeListener) -> None:
        self._bridge = bridge
        self._store = store
        self._listener = listener

    @property
    def partition_count(self) -> int:
        """The cluster's partition count (fixed by ``carillon migrate``)."""
        return self._store.partition_count

    async def _run(self, op: Callable[[Store, P], Awaitable[T]], params: P) -> T:
        return await self._bridge.call(self._store.run, op, params)

    # cluster ---------------------------------------------------------------------------------

    async def database_now(self) -> datetime:
        return await self._run(cluster.database_now, None)

    async def cluster_get(self) -> ClusterSettings:
        return await self._run(cluster.cluster_get, None)

    async def region_failover(self, params: RegionFailover) -> RegionChange:
        return await self._run(cluster.region_failover, params)

    # schedules -------------------------------------------------------------------------------

    async def schedules_create(self, params: SchedulesCreate) -> list[Schedule]:
        return await self._run(schedules.schedules_create, params)

    async def schedules_update(self, params: SchedulesUpdate) -> Schedule:
        return await self._run(schedules.schedules_update, params)

    async def schedules_delete(self, params: SchedulesDelete) -> Schedule:
        return await self._run(schedules.schedules_delete, params)

    async def schedules_get(self, schedule_id: str) -> Schedule:
        return await self._run(schedules.schedules_get, schedule_id)

    async def schedules_get_many(self, schedule_ids: list[str]) -> dict[str, Schedule]:
        return await self._run(schedules.schedules_get_many, schedule_ids)

    async def schedules_list(self, params: SchedulesList) -> Page[Schedule]:
        return await self._run(schedules.schedules_list, params)

    async def schedules_plannable(self, params: SchedulesPlannable) -> list[PlannableSchedule]:
        return await self._run(schedules.schedules_plannable, params)

    async def schedules_count(self, tenant_id: str) -> int:
        return await self._run(schedules.schedules_count, tenant_id)

    async def schedules_census(self, params: SchedulesCensus) -> list[ScheduleGroup]:
        return await self._run(schedules.schedules_census, params)

    async def schedule_changes(self, params: ScheduleChangesSince) -> list[ScheduleChange]:
        return await self._run(schedules.schedule_changes, params)

    async def schedule_changes_head(self) -> int:
        return await self._run(schedules.schedule_changes_head, None)

    async def schedule_changes_prune(self, params: ScheduleChangesPrune) -> int:
        return await self._run(schedules.schedule_changes_prune, params)

    async def schedule_changes_wait(self, after_seq: int, timeout_s: float) -> bool:
        check_wait_timeout(timeout_s)
        return await self._bridge.call(self._listener.wait, after_seq, timeout_s)

    # task types and tenants ------------------------------------------------------------------

    async def task_types_put(self, params: TaskTypesPut) -> TaskType:
        return await self._run(catalog.task_types_put, params)

    async def task_types_get(self, name: str) -> TaskType:
        return await self._run(catalog.task_types_get, name)

    async def task_types_list(self) -> list[TaskType]:
        return await self._run(catalog.task_types_list, None)

    async def task_types_delete(self, name: str) -> TaskType:
        return await self._run(catalog.task_types_delete, name)

    async def tenants_put(self, params: TenantsPut) -> Tenant:
        return await self._run(catalog.tenants_put, params)

    async def tenants_get(self, tenant_id: str) -> Tenant:
        return await self._run(catalog.tenants_get, tenant_id)

    async def tenants_list(self) -> list[Tenant]:
        return await self._run(catalog.tenants_list, None)

    async def manifests_apply(self, params: ManifestsApply) -> list[ManifestDone]:
        return await self._run(manifests.manifests_apply, params)

    # API tokens ------------------------------------------------------------------------------

    async def tokens_create(self, params: TokensCreate) -> ApiToken:
        return await self._run(tokens.tokens_create, params)

    async def tokens_get_by_hash(self, token_hash: bytes) -> ApiToken:
        return await self._run(tokens.tokens_get_by_hash, token_hash)

    async def tokens_list(self) -> list[ApiToken]:
        return await self._run(tokens.tokens_list, None)

    async def tokens_revoke(self, params: TokensRevoke) -> ApiToken:
        return await self._run(tokens.tokens_revoke, params)

    # console sessions ------------------------------------------------------------------------

    async def sessions_create(self, params: SessionsCreate) -> ConsoleSession:
        return await self._run(tokens.sessions_create, params)

    async def sessions_touch(self, session_hash: bytes) -> ConsoleSession:
        return await self._run(tokens.sessions_touch, session_hash)

    async def sessions_revoke(self, session_hash: bytes) -> None:
        await self._run(tokens.sessions_revoke, session_hash)

    # leases and membership -------------------------------------------------------------------

    async def leases_acquire(self, params: LeasesAcquire) -> list[Lease]:
        return await self._run(cluster.leases_acquire, params)

    async def leases_renew(self, params: LeasesRenew) -> list[Lease]:
        return await self._run(cluster.leases_renew, params)

    async def leases_release(self, params: LeasesRelease) -> int:
        return await self._run(cluster.leases_release, params)

    async def leases_list(self) -> list[Lease]:
        return await self._run(cluster.leases_list, None)

    async def nodes_heartbeat(self, params: NodesHeartbeat) -> NodeInfo:
        return await self._run(cluster.nodes_heartbeat, params)

    async def nodes_live(self) -> list[NodeInfo]:
        return await self._run(cluster.nodes_live, None)

    async def nodes_leave(self, node_id: str) -> None:
        await self._run(cluster.nodes_leave, node_id)

    # planning and execution ------------------------------------------------------------------

    async def checkpoints_get(self, partition_ids: list[int]) -> list[PlannerCheckpoint]:
        return await self._run(executions.checkpoints_get, partition_ids)

    async def executions_plan(self, params: ExecutionsPlan) -> PlanResult:
        return await self._run(executions.executions_plan, params)

    async def executions_due(self, params: ExecutionsDue) -> list[Execution]:
        return await self._run(executions.executions_due, params)

    async def executions_claim(self, params: ExecutionsClaim) -> list[Execution]:
        return await self._run(executions.executions_claim, params)

    async def executions_extend(self, params: ExecutionsExtend) -> list[str]:
        return await self._run(executions.executions_extend, params)

    async def executions_complete(self, params: ExecutionsComplete) -> CompleteResult:
        return await self._run(executions.executions_complete, params)

    async def executions_finish(self, params: ExecutionsFinish) -> CompleteResult:
        return await self._run(executions.executions_finish, params)

    async def executions_skip(self, params: ExecutionsSkip) -> list[str]:
        return await self._run(executions.executions_skip, params)

    async def executions_requeue_expired(self, params: ExecutionsRequeueExpired) -> list[str]:
        return await self._run(executions.executions_requeue_expired, params)

    async def executions_get(self, execution_id: str) -> ExecutionDetail:
        return await self._run(executions.executions_get, execution_id)

    async def executions_query(self, params: ExecutionsQuery) -> Page[Execution]:
        return await self._run(executions.executions_query, params)

    async def executions_stats(self, params: ExecutionsStats) -> list[ExecutionsBucket]:
        return await self._run(executions.executions_stats, params)

    async def dead_letters_replay(self, params: DeadLettersReplay) -> list[str]:
        return await self._run(audit.dead_letters_replay, params)

    async def dead_letters_purge(self, params: DeadLettersPurge) -> list[str]:
        return await self._run(audit.dead_letters_purge, params)

    async def executions_trigger(self, params: ExecutionsTrigger) -> Execution:
        return await self._run(audit.executions_trigger, params)

    async def executions_backfill(self, params: ExecutionsBackfill) -> Backfilled:
        return await self._run(audit.executions_backfill, params)

    async def audit_list(self, params: AuditQuery) -> list[AuditEvent]:
        return await self._run(audit.audit_list, params)

    async def executions_purge(self, params: ExecutionsPurge) -> int:
        return await self._run(executions.executions_purge, params)


@asynccontextmanager
async def open_postgres_ledger(
    url: str,
    *,
    pool_max: int = POOL_MAX_DEFAULT,
    statement_timeout_s: float = STATEMENT_TIMEOUT_S_DEFAULT,
    bridge: DatabaseBridge | None = None,
) -> AsyncIterator[PostgresLedger]:
    """Open a ledger on the migrated database at ``url``; close its connections on exit.

    Uses ``bridge`` when given (the node's single bridge), else opens one for the block.
    Opens one pooled connection at once (up to ``pool_max`` on demand) and the LISTEN
    connection on the first :meth:`~PostgresLedger.schedule_changes_wait`. Every statement
    is cancelled by the server after ``statement_timeout_s`` (``LedgerUnavailable``).
    Raises ``ConfigError`` for a bad URL or settings, or a schema that ``carillon migrate``
    has not brought to this code's version; ``LedgerUnavailable`` if the server is down.
    """
    if pool_max < 1:
        raise ConfigError(f"pool_max must be at least 1, got {pool_max}")
    if not statement_timeout_s > 0:
        raise ConfigError(f"statement_timeout_s must be positive, got {statement_timeout_s}")
    async with AsyncExitStack() as stack:
        if bridge is None:
            bridge = await stack.enter_async_context(open_bridge())
        store = await bridge.call(_open_store, url, pool_max, statement_timeout_s)
        listener = ChangeListener(
            # A command timeout like the pool's: a LISTEN that hangs (a half-open connection,
            # a frozen server) fails as unavailable, and the next wait opens a new one.
            functools.partial(connect, url, statement_timeout_s=statement_timeout_s),
            functools.partial(store.run, schedules.schedule_changes_head, None),
        )
        try:
            yield PostgresLedger(bridge, store, listener)
        finally:
            with trio.CancelScope(shield=True):
                await bridge.call(_close, store, listener)


async def _open_store(url: str, pool_max: int, statement_timeout_s: float) -> Store:
    pool = await create_pool(url, pool_max=pool_max, statement_timeout_s=statement_timeout_s)
    control = None
    try:
        control = await create_pool(
            url, pool_max=CONTROL_POOL_SIZE, statement_timeout_s=statement_timeout_s
        )
        with translate_errors(url):
            async with pool.acquire() as connection:
                version = await connection.fetchval(sql.SCHEMA_VERSION)
                settings = await connection.fetchrow(sql.CLUSTER_GET)
        latest = latest_version()
        if version != latest:
            raise ConfigError(
                f"the database schema is at version {version}, but this Carillon needs "
                f"version {latest}: "
                + (
                    "run `carillon migrate`"
                    if (version or 0) < latest
                    else "upgrade Carillon to a version that knows it"
                )
            )
        if settings is None:
            raise ConfigError("the cluster settings are missing; run `carillon migrate`")
        return Store(pool, control, partition_count=settings["partition_count"])
    except BaseException:
        pool.terminate()
        if control is not None:
            control.terminate()
        raise


async def _close(store: Store, listener: ChangeListener) -> None:
    await listener.close()
    try:
        await asyncio.wait_for(store.close(), timeout=CLOSE_TIMEOUT_S)
    except Exception:  # the server is gone or slow: cut the connections instead
        store.terminate()


if TYPE_CHECKING:

    def _implements_the_protocol(ledger: PostgresLedger) -> Ledger:
        return ledger
