"""Cluster settings, the region failover, partition leases and node membership, in memory
(the twin of :mod:`engine.ledger.postgres.cluster`). Every expiry is judged by the ledger's
clock, ``_now()``.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import msgspec
import trio

from engine.ledger.checks import check_partitions, check_planner_lags
from engine.ledger.common import region_failover_details
from engine.ledger.memory.state import MemoryState
from engine.ledger.params import (
    ClusterSettings,
    LeasesAcquire,
    LeasesRelease,
    LeasesRenew,
    NodeInfo,
    NodesHeartbeat,
    RegionChange,
    RegionFailover,
    token_floor,
)
from engine.model import AuditAction, Lease


class ClusterMethods(MemoryState):
    """The ledger's clock and settings, partition leases and node membership."""

    # cluster ---------------------------------------------------------------------------------

    async def database_now(self) -> datetime:
        await trio.lowlevel.checkpoint()
        return self._now()

    async def cluster_get(self) -> ClusterSettings:
        await trio.lowlevel.checkpoint()
        return self._settings

    async def region_failover(self, params: RegionFailover) -> RegionChange:
        await trio.lowlevel.checkpoint()
        params = params.checked()
        region, actor, reason = params.to_region, params.actor, params.reason
        before = self._settings
        if before.active_region == region and before.region_epoch >= params.epoch_at_least:
            return RegionChange(before, changed=False, revoked=0)
        after = msgspec.structs.replace(
            before,
            active_region=region,
            region_epoch=max(before.region_epoch + 1, params.epoch_at_least),
        )
        self._settings = after
        revoked = self._leases.revoke_all()
        details = region_failover_details(before, after, revoked, reason)
        self._audit.append(self._now(), actor, AuditAction.REGION_FAILOVER.value, region, details)
        return RegionChange(after, changed=True, revoked=revoked)

    # leases and membership -------------------------------------------------------------------

    async def leases_acquire(self, params: LeasesAcquire) -> list[Lease]:
        await trio.lowlevel.checkpoint()
        params = params.checked()
        ttl = timedelta(seconds=params.ttl_s)
        partitions = check_partitions(params.partition_ids, self._settings.partition_count)
        settings = self._settings
        if params.region != settings.active_region:
            return []  # a standby region's node acquires nothing
        return self._leases.acquire(
            params.owner_id,
            partitions,
            ttl,
            self._now(),
            token_floor=token_floor(settings.region_epoch),
        )

    async def leases_renew(self, params: LeasesRenew) -> list[Lease]:
        await trio.lowlevel.checkpoint()
        ttl = timedelta(seconds=params.checked().ttl_s)
        return self._leases.renew(params.fences, ttl, self._now())

    async def leases_release(self, params: LeasesRelease) -> int:
        await trio.lowlevel.checkpoint()
        return self._leases.release(params.fences, self._now())

    async def leases_list(self) -> list[Lease]:
        await trio.lowlevel.checkpoint()
        return self._leases.rows()

    async def nodes_heartbeat(self, params: NodesHeartbeat) -> NodeInfo:
        await trio.lowlevel.checkpoint()
        params = params.checked()
        ttl = timedelta(seconds=params.ttl_s)
        offset = params.clock_offset_s
        lags = check_planner_lags(params.planner_lag_s, self._settings.partition_count)
        now = self._now()
        previous = self._nodes.get(params.node_id)
        # A node that lets its row expire has been judged dead; its next heartbeat is a rejoin.
        alive = previous is not None and previous.expires_at > now
        node = NodeInfo(
            node_id=params.node_id,
            region=params.region,
            started_at=previous.started_at if alive and previous is not None else now,
            last_seen_at=now,
            expires_at=now + ttl,
            clock_offset_s=offset,
            planner_lag_s=lags,
        )
        self._nodes[params.node_id] = node
        return node

    async def nodes_live(self) -> list[NodeInfo]:
        await trio.lowlevel.checkpoint()
        now = self._now()
        return [
            self._nodes[key] for key in sorted(self._nodes) if self._nodes[key].expires_at > now
        ]

    async def nodes_leave(self, node_id: str) -> None:
        await trio.lowlevel.checkpoint()
        self._nodes.pop(node_id, None)
