"""Runs one planner per owned partition, and stops it the moment the partition is not ours.

Each planner runs inside a cancel scope whose deadline is the lease's local trust window
(moved on by every renewal), so a node that cannot renew stops planning *before* the lease
can expire in the database. A dropped partition (lost, handed back, untrusted) cancels its
scope at once. A planner whose fence is rejected drops its partition. Any other planner
error escapes to the node's supervisor, which restarts this actor (and with it the planners)
or stops the node if it keeps failing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime
from typing import Any

import msgspec
import trio

from engine.actors.context import NodeContext
from engine.actors.forecast import BurstForecast
from engine.actors.partitions import OwnedPartition
from engine.actors.planner import PartitionLost, Planner, PlannerConfig, PlannerStatistics
from engine.actors.planning_gate import PlanningGate
from engine.core.timetable import TimetableCache
from engine.metrics import LEASE_LOST_EXPIRED, LEASE_LOST_REFUSED

log = logging.getLogger("carillon.planners")


class PlannerSupervisorStatistics(msgspec.Struct, frozen=True):
    planners: list[PlannerStatistics]


class PlannerSupervisor:
    def __init__(
        self,
        config: PlannerConfig,
        *,
        ctx: NodeContext,
        cache: TimetableCache,
        forecast: BurstForecast,
        on_planned: Callable[[datetime], None] = lambda at: None,
    ) -> None:
        self.config = config
        self._ctx = ctx
        self._on_planned = on_planned
        self._forecast = forecast
        # Loads and batch writes are bulk work: a few at a time leave the pool and the
        # cores to the dispatcher.
        self._gate = PlanningGate()
        self._cache = cache
        self._table = ctx.table
        self._metrics = ctx.metrics
        self._planners: dict[int, Planner] = {}
        self._running: set[int] = set()
        self._nursery: trio.Nursery | None = None

    def notify(self, partition_id: int, schedule_id: str) -> None:
        """Route a schedule change to the partition's planner, if this node runs one."""
        planner = self._planners.get(partition_id)
        if planner is not None:
            planner.notify(schedule_id)

    def reload_all(self) -> None:
        """Changes may have been missed (the feed fell behind its pruning): every running
        planner reloads its partition before its next step."""
        for planner in self._planners.values():
            planner.reload()

    async def run(self, *, task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            while True:
                self._start_missing()
                await self._table.wait_changed()

    def statistics(self) -> PlannerSupervisorStatistics:
        return PlannerSupervisorStatistics(
            [self._planners[p].statistics() for p in sorted(self._planners)]
        )

    def _start_missing(self) -> None:
        assert self._nursery is not None
        for partition_id in self._table:
            if partition_id not in self._running:
                owned = self._table.get(partition_id)
                if owned is not None:
                    self._running.add(partition_id)
                    self._nursery.start_soon(self._run_partition, owned)

    async def _run_partition(self, owned: OwnedPartition) -> None:
        partition_id = owned.fence.partition_id
        planner = Planner(
            self.config,
            ctx=self._ctx,
            fence=owned.fence,
            cache=self._cache,
            forecast=self._forecast,
            gate=self._gate,
            on_planned=self._on_planned,
        )
        stepped_down: str | None = None  # the lease-loss reason, once this planner gives up
        resume = False  # stopped by its deadline, but the window was extended since
        try:
            with trio.CancelScope(deadline=owned.trusted_until) as scope:
                owned.scope = scope
                self._planners[partition_id] = planner
                try:
                    await planner.run()
                except PartitionLost as exc:
                    log.warning("%s; stopping its planner", exc)
                    stepped_down = LEASE_LOST_REFUSED
            if scope.cancelled_caught and owned.trusted_until <= trio.current_time():
                log.warning("partition %d: trust window ended; planner stopped", partition_id)
                stepped_down = LEASE_LOST_EXPIRED
            elif scope.cancelled_caught and self._table.get(partition_id) is owned:
                # The deadline passed while a renewal was in flight (a slow database), and
                # the renewal then moved the window on: the lease is ours and trusted, so
                # plan on. (Found by the simulator, seed 238: the planner was gone while the
                # partition stayed owned and renewed, unplanned until the node's partitions
                # changed.)
                resume = True
        finally:
            owned.scope = None
            self._forecast.forget(partition_id)
            self._planners.pop(partition_id, None)
            self._running.discard(partition_id)
            # Drop the partition only when this planner gave it up. Cancelled from outside
            # (shutdown, a restart of this actor) or crashed, the lease is still ours: the
            # node releases it on shutdown, or a new planner takes over after a restart.
            if stepped_down is not None and self._table.get(partition_id) is owned:
                self._table.drop(partition_id)
                # The lease keeper counts the partitions it drops itself; this one it will
                # find gone, so the loss is counted here (once: only one of them drops it).
                self._metrics.lease_lost(stepped_down)
            if not resume:
                owned.stopped.set()
            current = self._table.get(partition_id)
            restart = current is not None and (current is not owned or resume)
            if restart and self._nursery is not None:
                self._start_missing()  # re-acquired while this planner was stopping, or resumed
