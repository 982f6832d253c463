"""Cluster settings, the region failover, partition leases and node membership (asyncio side).

Lease expiry and heartbeats are judged by the server's ``now()`` only. Lease rows are locked
in partition order by every statement that locks several (see :mod:`~engine.ledger.
postgres.sql`), so renewals never deadlock with the same node's fenced writes.
"""

from __future__ import annotations

from datetime import datetime

import asyncpg

from engine.errors import ConfigError
from engine.ledger.checks import check_partitions, check_planner_lags
from engine.ledger.common import region_failover_details
from engine.ledger.params import (
    ClusterSettings,
    LeasesAcquire,
    LeasesRelease,
    LeasesRenew,
    NodeInfo,
    NodesHeartbeat,
    RegionChange,
    RegionFailover,
)
from engine.ledger.postgres import sql
from engine.ledger.postgres.rows import lease_from_row, node_from_row
from engine.ledger.postgres.store import Store
from engine.model import (
    AuditAction,
    Lease,
)


async def database_now(store: Store, _: None) -> datetime:
    async with store.connection(control=True) as connection:
        now: datetime = await connection.fetchval(sql.DATABASE_NOW)
    return now


async def cluster_get(store: Store, _: None) -> ClusterSettings:
    async with store.connection(control=True) as connection:
        row = await connection.fetchrow(sql.CLUSTER_GET)
    if row is None:
        raise ConfigError("the cluster settings are missing; run `carillon migrate`")
    return _settings_from_row(row)


def _settings_from_row(row: asyncpg.Record) -> ClusterSettings:
    return ClusterSettings(
        partition_count=row["partition_count"],
        active_region=row["active_region"],
        region_epoch=row["region_epoch"],
    )


async def region_failover(store: Store, params: RegionFailover) -> RegionChange:
    params = params.checked()
    region, actor, reason = params.to_region, params.actor, params.reason
    async with store.transaction(control=True) as connection:
        row = await connection.fetchrow(sql.REGION_LOCK)
        if row is None:
            raise ConfigError("the cluster settings are missing; run `carillon migrate`")
        before = _settings_from_row(row)
        if before.active_region == region and before.region_epoch >= params.epoch_at_least:
            return RegionChange(before, changed=False, revoked=0)
        epoch = max(before.region_epoch + 1, params.epoch_at_least)
        after = _settings_from_row(await connection.fetchrow(sql.REGION_SET, region, epoch))
        status = await connection.execute(sql.LEASES_REVOKE_ALL)
        revoked = int(status.split()[-1])
        details = region_failover_details(before, after, revoked, reason)
        await connection.execute(sql.AUDIT_LOCK)
        await connection.execute(
            sql.AUDIT_APPEND, actor, AuditAction.REGION_FAILOVER.value, [region], [details]
        )
    return RegionChange(after, changed=True, revoked=revoked)


async def leases_acquire(store: Store, params: LeasesAcquire) -> list[Lease]:
    params = params.checked()
    ttl_s = params.ttl_s
    partitions = check_partitions(params.partition_ids, store.partition_count)
    if not partitions:
        return []
    async with store.connection(control=True) as connection:
        rows = await connection.fetch(
            sql.LEASES_ACQUIRE, partitions, params.owner_id, ttl_s, params.region
        )
    return sorted((lease_from_row(row) for row in rows), key=_by_partition)


async def leases_renew(store: Store, params: LeasesRenew) -> list[Lease]:
    ttl_s = params.checked().ttl_s
    if not params.fences:
        return []
    async with store.connection(control=True) as connection:
        rows = await connection.fetch(sql.LEASES_RENEW, *_fence_columns(params), ttl_s)
    return sorted((lease_from_row(row) for row in rows), key=_by_partition)


async def leases_release(store: Store, params: LeasesRelease) -> int:
    if not params.fences:
        return 0
    async with store.connection(control=True) as connection:
        rows = await connection.fetch(sql.LEASES_RELEASE, *_fence_columns(params))
    return len(rows)


async def leases_list(store: Store, _: None) -> list[Lease]:
    async with store.connection(control=True) as connection:
        rows = await connection.fetch(sql.LEASES_LIST)
    return [lease_from_row(row) for row in rows]


async def nodes_heartbeat(store: Store, params: NodesHeartbeat) -> NodeInfo:
    params = params.checked()
    ttl_s, offset_s = params.ttl_s, params.clock_offset_s
    lags = check_planner_lags(params.planner_lag_s, store.partition_count)
    async with store.connection(control=True) as connection:
        row = await connection.fetchrow(
            sql.NODES_HEARTBEAT,
            params.node_id,
            params.region,
            ttl_s,
            offset_s,
            {str(partition): lag for partition, lag in lags.items()},
        )
    return node_from_row(row)


async def nodes_live(store: Store, _: None) -> list[NodeInfo]:
    async with store.connection(control=True) as connection:
        rows = await connection.fetch(sql.NODES_LIVE)
    return [node_from_row(row) for row in rows]


async def nodes_leave(store: Store, node_id: str) -> None:
    async with store.connection(control=True) as connection:
        await connection.execute(sql.NODES_LEAVE, node_id)


def _fence_columns(params: LeasesRenew | LeasesRelease) -> tuple[list[int], list[str], list[int]]:
    fences = params.fences
    return (
        [fence.partition_id for fence in fences],
        [fence.owner_id for fence in fences],
        [fence.fencing_token for fence in fences],
    )


def _by_partition(lease: Lease) -> int:
    return lease.partition_id
