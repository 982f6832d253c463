"""A Carillon node: the supervised actors of one process, and their graceful shutdown.

::

    Node.run
    └── Supervisor
        ├── Membership          heartbeat; live-node set
        ├── ClockMonitor        offset to the database clock; gates planning
        ├── ChangeFeed          schedule changes -> the owning planner (watermark first)
        ├── PlannerSupervisor   one Planner per owned partition, inside its trust window
        ├── LeaseKeeper         renew, expire locally, hand back extras, acquire fair share
        ├── RetentionKeeper     deletes old executions of owned partitions; prunes changes
        ├── ExecutionPipeline   rebuilt fresh on a restart (engine/actors/pipeline.py):
        │   ├── Dispatcher      due executions -> fair queue -> admission -> claim
        │   ├── WorkerPool      runs claimed attempts through their task type's handler
        │   └── CompletionWriter  batches completion writes (fenced, attempt-guarded)
        ├── Redeliverer         re-queues executions whose attempt lease ran out
        └── ApiServer           the HTTP API and /metrics, unless ``http`` is empty

The node's metrics (:class:`~engine.metrics.NodeMetrics`, ``node.metrics``) are on a registry
of its own: the actors move the counters and histograms as work happens, and at each scrape
the node assembles the gauges from the ``statistics()`` of the actors they describe.

On cancellation (SIGTERM/SIGINT in ``carillon run``) the node shuts down gracefully, shielded
and bounded by ``shutdown_timeout_s`` in all: it first *drains* -- claims nothing more, while
the workers finish the attempts already claimed and their completions are written, for at
most half that time (and no more than a hand-back's drain) -- then the actors stop, and the
node releases its leases, so other nodes take the partitions over at once instead of
waiting for expiry, and leaves the membership. Without the drain, an attempt cut off by the
shutdown would run again on another node once its attempt lease ran out: a deploy would
repeat side effects and delay them by a minute.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Iterable
from datetime import datetime
from typing import Any, Literal

import msgspec
import trio

from engine.actors.announcements import Announcements
from engine.actors.change_feed import ChangeFeed, ChangeFeedStatistics
from engine.actors.clock_monitor import ClockMonitor, ClockStatistics
from engine.actors.completions import CompletionStatistics, CompletionWriter
from engine.actors.configs import actor_configs
from engine.actors.context import NodeContext
from engine.actors.dispatcher import Dispatcher, DispatcherStatistics
from engine.actors.forecast import BurstForecast
from engine.actors.lease_keeper import HAND_BACK_DRAIN_S, LeaseKeeper, LeaseStatistics
from engine.actors.membership import Membership, MembershipStatistics
from engine.actors.partitions import PartitionTable
from engine.actors.pipeline import ExecutionPipeline, PipelineStatistics
from engine.actors.planner import PlannerStatistics
from engine.actors.planner_supervisor import PlannerSupervisor, PlannerSupervisorStatistics
from engine.actors.redeliverer import Redeliverer, RedelivererStatistics
from engine.actors.retention import RetentionKeeper, RetentionStatistics
from engine.actors.supervisor import ChildSpec, Supervisor, SupervisorStatistics
from engine.actors.workers import WorkerPool, WorkerStatistics
from engine.api.app import ANONYMOUS_BURST, ANONYMOUS_RATE_PER_S, ApiConfig, ApiContext
from engine.api.auth import Authenticator
from engine.api.console.web import ConsoleSettings
from engine.api.server import ApiServer
from engine.clock import Clock
from engine.config import NodeConfig
from engine.core.timetable import TimetableCache
from engine.errors import ConfigError, LedgerUnavailable
from engine.gc_thresholds import raised_gc_thresholds
from engine.ledger.base import Ledger
from engine.metrics import NodeGauges, NodeMetrics, PartitionGauges, render
from engine.tracing import Tracing, from_environment

log = logging.getLogger("carillon.node")


class NodeStatistics(msgspec.Struct, frozen=True):
    node_id: str
    membership: MembershipStatistics
    clock: ClockStatistics
    leases: LeaseStatistics
    changes: ChangeFeedStatistics
    planners: PlannerSupervisorStatistics
    retention: RetentionStatistics
    dispatcher: DispatcherStatistics
    workers: WorkerStatistics
    completions: CompletionStatistics
    pipeline: PipelineStatistics
    redeliverer: RedelivererStatistics
    supervisor: SupervisorStatistics


def partition_gauges(planners: Iterable[PlannerStatistics], now: datetime) -> list[PartitionGauges]:
    """Each planner's partition gauges, ``now`` being the clock monitor's time.

    A partition's planner lag is ``now - next_instant`` when positive: the planner writes
    every fire before it is due (lookahead), so an unplanned fire in the past means planning
    is behind (a slow ledger, planning paused for clock skew). Partitions whose planner is
    still loading have no entry yet.
    """
    partitions = []
    for planner in planners:
        lag_s = 0.0
        if planner.next_instant is not None:
            lag_s = max(0.0, (now - planner.next_instant).total_seconds())
        age_s = None
        if planner.checkpoint is not None:
            age_s = (now - planner.checkpoint).total_seconds()
        partitions.append(PartitionGauges(planner.partition_id, lag_s, age_s))
    return partitions


class Node:
    def __init__(
        self,
        config: NodeConfig,
        ledger: Ledger,
        clock: Clock,
        rng: random.Random,
        *,
        tracing: Tracing | Literal["environment"] | None = "environment",
    ) -> None:
        self.config = config
        self.ledger = ledger
        self.clock = clock
        self._configs = configs = actor_configs(config)
        self.table = PartitionTable()
        self.cache = TimetableCache()
        self.metrics = NodeMetrics(
            slo_target_s=config.slo_target_s, tenant_labels=config.metrics_tenant_labels
        )
        self.clock_monitor = ClockMonitor(configs.clock, ledger=ledger, clock=clock, rng=rng)
        self.context = ctx = NodeContext(
            ledger=ledger,
            clock=clock,
            monitor=self.clock_monitor,
            table=self.table,
            rng=rng,
            metrics=self.metrics,
            # Off unless the standard OTEL_* variables ask for traces (docs/tracing.md).
            tracing=from_environment() if tracing == "environment" else tracing,
        )
        """What the actors share, built once: a restarted actor gets the same."""
        self.membership = Membership(configs.membership, ctx=ctx, planner_lag_s=self._planner_lags)
        self.lease_keeper = LeaseKeeper(configs.leases, ctx=ctx, membership=self.membership)
        self.forecast = BurstForecast(configs.forecast)
        self.announcements = Announcements(
            self.clock_monitor.now, configs.pipeline.dispatcher.fetch_ahead_s
        )
        """When to fetch: planners, retries and the change feed announce; the pipeline reads
        (as far ahead as its dispatcher queues)."""
        self.planners = self._new_planner_supervisor()
        self.change_feed = ChangeFeed(configs.changes, ctx=ctx, sink=self)
        self.pipeline = self._new_pipeline()
        self._pipeline_started = False
        self.redeliverer = Redeliverer(configs.redeliverer, ctx=ctx)
        self.retention = RetentionKeeper(configs.retention, ctx=ctx)
        self.api = self._new_api()
        self.supervisor = Supervisor(
            [
                ChildSpec("membership", lambda: self.membership),
                ChildSpec("clock-monitor", lambda: self.clock_monitor),
                ChildSpec("change-feed", lambda: self.change_feed),
                ChildSpec("planners", self._restart_planners),
                ChildSpec("lease-keeper", lambda: self.lease_keeper),
                ChildSpec("retention", lambda: self.retention),
                ChildSpec("pipeline", self._restart_pipeline),
                ChildSpec("redeliverer", lambda: self.redeliverer),
                *self._api_child(),
            ],
            clock=clock,
            rng=rng,
        )
        self.metrics.watch(self._gauges)

    def _gauges(self) -> NodeGauges:
        """The scrape-time gauges, from the statistics of the actors they describe (read on
        the trio thread: they read actor state)."""
        planners = self.planners.statistics().planners
        clock = self.clock_monitor.statistics()
        membership = self.membership.statistics()
        partitions = partition_gauges(planners, self.clock_monitor.now())
        return NodeGauges(
            scheduler_lag_s=max((p.planner_lag_s for p in partitions), default=0.0),
            partitions=partitions,
            partitions_owned=len(self.lease_keeper.statistics().owned),
            queue_depth=self.dispatcher.statistics().queued,
            queue_capacity=self.config.dispatch_queue_max,
            workers_busy=self.workers.statistics().busy,
            workers_capacity=self.config.workers,
            dispatch_stalled_s=self.pipeline.statistics().stalled_s,
            clock_offset_s=clock.offset_s,
            clock_spread_s=clock.spread_s,
            planning_allowed=clock.planning_allowed,
            live_nodes=len(membership.live_nodes),
            region_standby=membership.standby,
            region_epoch=membership.region_epoch,
        )

    def _planner_lags(self) -> dict[int, float]:
        """Planner lag per partition planned here, as the gauges compute it (heartbeats
        publish it for ``GET /v1/cluster``)."""
        partitions = partition_gauges(self.planners.statistics().planners, self.clock_monitor.now())
        return {p.partition_id: p.planner_lag_s for p in partitions}

    @property
    def dispatcher(self) -> Dispatcher:
        """The current pipeline's dispatcher (a restart builds a new one)."""
        return self.pipeline.dispatcher

    @property
    def workers(self) -> WorkerPool:
        """The current pipeline's worker pool (a restart builds a new one)."""
        return self.pipeline.workers

    @property
    def completions(self) -> CompletionWriter:
        """The current pipeline's completion writer (a restart builds a new one)."""
        return self.pipeline.completions

    def _new_pipeline(self) -> ExecutionPipeline:
        return ExecutionPipeline(
            self._configs.pipeline,
            ctx=self.context,
            announcements=self.announcements,
            options=self._configs.handlers,
        )

    def _restart_pipeline(self) -> ExecutionPipeline:
        """The supervisor's factory: the first start runs the pipeline built in
        ``__init__``; every restart a fresh one, so nothing a crashed one held survives."""
        if self._pipeline_started:
            self.pipeline = self._new_pipeline()
        self._pipeline_started = True
        return self.pipeline

    def notify(self, partition_id: int, schedule_id: str) -> None:
        """Change-feed sink: forward to whichever planner supervisor is current, and fetch
        at once when this node owns the partition (a trigger or backfill through the API on
        any node added executions that are startable now)."""
        self.planners.notify(partition_id, schedule_id)
        if partition_id in self.table:
            self.announcements.announce(self.clock_monitor.now())

    def reload_all(self) -> None:
        """Change-feed sink: changes were missed (the feed fell behind its pruning), so every
        planner reloads its partition, and the dispatcher fetches (executions may have been
        added through the API meanwhile)."""
        self.planners.reload_all()
        if len(self.table):
            self.announcements.announce(self.clock_monitor.now())

    def _new_api(self) -> ApiServer | None:
        """The HTTP API actor, unless ``http`` is empty."""
        if not self.config.http:
            return None
        config = self.config
        context = ApiContext(
            self.ledger,
            Authenticator(
                self.ledger,
                self.clock.monotonic,
                token_rate_per_s=config.api_token_rate_per_s,
                token_burst=config.api_token_burst,
                anonymous_rate_per_s=ANONYMOUS_RATE_PER_S,
                anonymous_burst=ANONYMOUS_BURST,
            ),
            metrics_protected=config.metrics_protected,
            slo_target_s=config.slo_target_s,
            handler_options=self._configs.handlers,
            console=ConsoleSettings(
                insecure_cookie=config.console_insecure_cookie,
                session_idle_s=config.console_session_idle_s,
                session_lifetime_s=config.console_session_lifetime_s,
                trusted_proxies=config.trusted_proxy_networks,
            ),
            metrics=lambda accept: render(self.metrics.registry, accept),
            extra_checks={"dispatch": lambda: self.pipeline.stall_check()},
        )
        return ApiServer(ApiConfig(bind=config.http), context)

    def _api_child(self) -> list[ChildSpec]:
        api = self.api
        return [] if api is None else [ChildSpec("api", lambda: api)]

    async def run(self, *, task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
        """Run until cancelled, then shut down gracefully (bounded)."""
        await self._check_node_id()
        with raised_gc_thresholds():
            await self._run(task_status)

    async def _run(self, task_status: trio.TaskStatus[Any]) -> None:
        # The actors are shielded from the node's cancellation: the watcher below takes it,
        # drains, and only then stops them.
        actors = trio.CancelScope(shield=True)
        stop_by: list[float] = []
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._drain_when_cancelled, actors, stop_by)
                try:
                    with actors:
                        await self.supervisor.run(task_status=task_status)
                finally:
                    actors.cancel()  # ended on its own (an escalation): no drain
                    nursery.cancel_scope.cancel()
        finally:
            now = trio.current_time()
            # Within the shutdown's bound, but always a moment to release the leases: the
            # alternative is a TTL's wait for them on the other nodes.
            deadline = (
                max(stop_by[0], now + 1.0) if stop_by else now + self.config.shutdown_timeout_s
            )
            with trio.move_on_at(deadline) as scope:
                scope.shield = True
                await self._shutdown()
            if scope.cancelled_caught:
                log.warning("shutdown took longer than %.1f s", self.config.shutdown_timeout_s)

    async def _drain_when_cancelled(self, actors: trio.CancelScope, stop_by: list[float]) -> None:
        """Sleep until the node is cancelled; then drain (see the module docstring) and stop
        the actors. ``stop_by`` gets the instant the whole shutdown must end by."""
        try:
            await trio.sleep_forever()
        finally:
            if not actors.cancel_called:
                if self.api is not None:
                    self.api.mark_stopping()  # the load balancer stops sending requests now
                now = trio.current_time()
                stop_by.append(now + self.config.shutdown_timeout_s)
                drain_s = min(HAND_BACK_DRAIN_S, self.config.shutdown_timeout_s / 2)
                with trio.move_on_after(drain_s) as drain:
                    drain.shield = True
                    await self._drain()
                if drain.cancelled_caught:
                    left = sum(self.table.attempts_in_flight(p) for p in self.table)
                    log.warning(
                        "stopping with %d attempts in flight: they run again once their "
                        "attempt leases run out",
                        left,
                    )
                actors.cancel()

    async def _drain(self) -> None:
        """Claim nothing more, and wait for the attempts in flight to settle."""
        partitions = list(self.table)
        for partition_id in partitions:
            self.table.drain(partition_id)
        await self.table.wait_settled(partitions)

    def statistics(self) -> NodeStatistics:
        return NodeStatistics(
            self.config.node_id,
            self.membership.statistics(),
            self.clock_monitor.statistics(),
            self.lease_keeper.statistics(),
            self.change_feed.statistics(),
            self.planners.statistics(),
            self.retention.statistics(),
            self.dispatcher.statistics(),
            self.workers.statistics(),
            self.completions.statistics(),
            self.pipeline.statistics(),
            self.redeliverer.statistics(),
            self.supervisor.statistics(),
        )

    def _new_planner_supervisor(self) -> PlannerSupervisor:
        return PlannerSupervisor(
            self._configs.planner,
            ctx=self.context,
            cache=self.cache,
            forecast=self.forecast,
            on_planned=self.announcements.announce,
        )

    def _restart_planners(self) -> PlannerSupervisor:
        self.planners = self._new_planner_supervisor()
        return self.planners

    async def _check_node_id(self) -> None:
        try:
            live = await self.ledger.nodes_live()
        except LedgerUnavailable as exc:
            log.warning("could not check that node id %s is free: %s", self.config.node_id, exc)
            return
        for node in live:
            if node.node_id == self.config.node_id:
                raise ConfigError(
                    f"node id {self.config.node_id!r} is used by a live node (heartbeat until "
                    f"{node.expires_at.isoformat()}); give each process its own id"
                )

    async def _shutdown(self) -> None:
        try:
            await self.lease_keeper.release_all()
        except LedgerUnavailable as exc:
            log.warning("could not release leases (they will expire): %s", exc)
        await self.membership.leave()
        log.info("node %s stopped", self.config.node_id)
