"""Heartbeats this node into the ledger and keeps the set of live nodes.

A node is live while its heartbeat row has not expired by the *database's* clock. The live
set decides each node's fair share of partitions; it is refreshed every ``interval_s``
(a third of the heartbeat TTL, so one missed beat does not drop the node), and also just after
the earliest heartbeat of another node runs out: a crashed node leaves the live set as soon as
its row expires, not up to a cycle later. Each change of the live set is announced
(:meth:`Membership.wait_changed`), so the lease keeper rebalances at once.

Each beat also reads the cluster settings: only nodes of the *active region* share the
partitions, so the live set holds the live nodes of that region, and a node of another
region is on standby (it heartbeats, and acquires nothing).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any, Final

import msgspec
import trio

from engine.actors.context import NodeContext
from engine.actors.retry import retry_unavailable
from engine.errors import LedgerUnavailable
from engine.ledger.params import ClusterSettings, NodesHeartbeat

log = logging.getLogger("carillon.membership")

EXPIRY_SLACK_S: Final = 0.1
"""How long after another node's heartbeat (or lease) should have run out it is looked at
again: the local and database clocks are matched only to within a round trip."""


def wake_after_expiry(
    read_at: float, database_now: datetime, expiries: Iterable[datetime]
) -> float | None:
    """The local monotonic time just after the earliest of ``expiries`` still ahead of
    ``database_now`` has passed, given that the database's clock read ``database_now`` no
    later than the local clock read ``read_at``; ``None`` if none is ahead."""
    ahead = [expiry for expiry in expiries if expiry > database_now]
    if not ahead:
        return None
    return read_at + (min(ahead) - database_now).total_seconds() + EXPIRY_SLACK_S


class MembershipConfig(msgspec.Struct, frozen=True):
    node_id: str
    region: str
    ttl_s: float

    @property
    def interval_s(self) -> float:
        return self.ttl_s / 3


class MembershipStatistics(msgspec.Struct, frozen=True):
    live_nodes: list[str]
    heartbeats: int
    failures: int
    region: str
    active_region: str | None
    """The cluster's active region as last read (``None`` before the first beat)."""
    region_epoch: int | None

    @property
    def standby(self) -> bool:
        """Whether this node's region is not the active one (so it owns nothing)."""
        return self.active_region is not None and self.active_region != self.region


class Membership:
    def __init__(
        self,
        config: MembershipConfig,
        *,
        ctx: NodeContext,
        planner_lag_s: Callable[[], dict[int, float]] = dict,
    ) -> None:
        self._planner_lag_s = planner_lag_s
        self.config = config
        self._monitor = ctx.monitor
        """Whose measured offset to the database clock each beat publishes (for
        ``GET /v1/cluster``)."""
        self._ledger = ctx.ledger
        self._clock = ctx.clock
        self._rng = ctx.rng
        self.live_nodes: list[str] = [config.node_id]
        self.changes = 0
        """How many times the live set changed (see :meth:`wait_changed`)."""
        self._changed = trio.Event()
        self._wake_at_expiry: float | None = None
        """Local monotonic time just after the earliest heartbeat of another live node runs
        out."""
        self.settings: ClusterSettings | None = None
        """The cluster settings as of the last beat: active region and region epoch."""
        self._heartbeats = 0
        self._failures = 0

    async def run(self, *, task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
        await retry_unavailable(self.step, rng=self._rng, log=log, what="first heartbeat")
        task_status.started()
        while True:
            wake_at = self._clock.monotonic() + self.config.interval_s
            if self._wake_at_expiry is not None:
                wake_at = min(wake_at, self._wake_at_expiry)
            await trio.sleep_until(wake_at)
            try:
                await self.step()
            except LedgerUnavailable as exc:
                self._failures += 1
                log.warning("heartbeat failed: %s", exc)

    async def step(self) -> None:
        """Beat once and refresh the live set."""
        self._wake_at_expiry = None  # read afresh, or not at all if the beat fails
        me = await self._ledger.nodes_heartbeat(
            NodesHeartbeat(
                self.config.node_id,
                self.config.region,
                self.config.ttl_s,
                clock_offset_s=self._monitor.statistics().offset_s,
                planner_lag_s=self._planner_lag_s(),
            )
        )
        nodes = await self._ledger.nodes_live()
        # A local time no earlier than the database's stamp of the beat, so a wake-up at the
        # expiry computed from it finds the row expired.
        read_at = self._clock.monotonic()
        settings = await self._ledger.cluster_get()
        if self.settings is not None and settings != self.settings:
            log.warning(
                "region %s is active at epoch %d (was %s at epoch %d)%s",
                settings.active_region,
                settings.region_epoch,
                self.settings.active_region,
                self.settings.region_epoch,
                "" if settings.active_region == self.config.region else "; this node stands by",
            )
        self.settings = settings
        active = settings.active_region
        live = [node.node_id for node in nodes if node.region == active]
        mine = [self.config.node_id] if self.config.region == active else []
        live_nodes = sorted(set(live) | set(mine))
        self._wake_at_expiry = wake_after_expiry(
            read_at,
            me.last_seen_at,
            (
                node.expires_at
                for node in nodes
                if node.region == active and node.node_id != self.config.node_id
            ),
        )
        if live_nodes != self.live_nodes:
            self.live_nodes = live_nodes
            self.changes += 1
            self._changed.set()
            self._changed = trio.Event()
        self._heartbeats += 1

    async def wait_changed(self, since: int) -> None:
        """Return once the live set has changed after :attr:`changes` was ``since``."""
        if self.changes == since:
            await self._changed.wait()

    async def leave(self) -> None:
        """Remove this node's row (graceful shutdown); failures are only logged."""
        try:
            await self._ledger.nodes_leave(self.config.node_id)
        except LedgerUnavailable as exc:
            log.warning("could not leave the membership: %s", exc)

    def statistics(self) -> MembershipStatistics:
        settings = self.settings
        return MembershipStatistics(
            list(self.live_nodes),
            self._heartbeats,
            self._failures,
            self.config.region,
            None if settings is None else settings.active_region,
            None if settings is None else settings.region_epoch,
        )
