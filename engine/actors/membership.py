"""Heartbeats this node into the ledger and keeps the set of live nodes.

A node is live while its heartbeat row has not expired by the *database's* clock. The live
set decides each node's fair share of partitions; it is refreshed every ``interval_s``
(a third of the heartbeat TTL, so one missed beat does not drop the node).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from typing import Any

import msgspec
import trio

from engine.actors.retry import retry_unavailable
from engine.errors import LedgerUnavailable
from engine.ledger.base import Ledger, NodesHeartbeat

log = logging.getLogger("carillon.membership")


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


class Membership:
    def __init__(
        self,
        config: MembershipConfig,
        ledger: Ledger,
        rng: random.Random,
        clock_offset_s: Callable[[], float | None] = lambda: None,
        planner_lag_s: Callable[[], dict[int, float]] = dict,
    ) -> None:
        self._planner_lag_s = planner_lag_s
        self.config = config
        self._clock_offset_s = clock_offset_s
        """The node's measured offset to the database clock, published with each beat (for
        ``GET /v1/cluster``)."""
        self._ledger = ledger
        self._rng = rng
        self.live_nodes: list[str] = [config.node_id]
        self._heartbeats = 0
        self._failures = 0

    async def run(self, *, task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
        await retry_unavailable(self.step, rng=self._rng, log=log, what="first heartbeat")
        task_status.started()
        while True:
            await trio.sleep(self.config.interval_s)
            try:
                await self.step()
            except LedgerUnavailable as exc:
                self._failures += 1
                log.warning("heartbeat failed: %s", exc)

    async def step(self) -> None:
        """Beat once and refresh the live set."""
        await self._ledger.nodes_heartbeat(
            NodesHeartbeat(
                self.config.node_id,
                self.config.region,
                self.config.ttl_s,
                clock_offset_s=self._clock_offset_s(),
                planner_lag_s=self._planner_lag_s(),
            )
        )
        live = [node.node_id for node in await self._ledger.nodes_live()]
        self.live_nodes = sorted(set(live) | {self.config.node_id})
        self._heartbeats += 1

    async def leave(self) -> None:
        """Remove this node's row (graceful shutdown); failures are only logged."""
        try:
            await self._ledger.nodes_leave(self.config.node_id)
        except LedgerUnavailable as exc:
            log.warning("could not leave the membership: %s", exc)

    def statistics(self) -> MembershipStatistics:
        return MembershipStatistics(list(self.live_nodes), self._heartbeats, self._failures)
