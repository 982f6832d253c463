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
of its own: the actors move the counters and histograms as work happens, and the gauges are
read from :meth:`Node.statistics` at each scrape.

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
from typing import Any

import msgspec
import trio

from engine.actors.announcements import Announcements
from engine.actors.change_feed import ChangeFeed, ChangeFeedConfig, ChangeFeedStatistics
from engine.actors.clock_monitor import ClockMonitor, ClockMonitorConfig, ClockStatistics
from engine.actors.completions import CompletionStatistics, CompletionWriter
from engine.actors.dispatcher import (
    FETCH_AHEAD_S_DEFAULT,
    Dispatcher,
    DispatcherConfig,
    DispatcherStatistics,
)
from engine.actors.forecast import BurstForecast, ForecastConfig
from engine.actors.lease_keeper import (
    HAND_BACK_DRAIN_S,
    LeaseKeeper,
    LeaseKeeperConfig,
    LeaseStatistics,
)
from engine.actors.membership import Membership, MembershipConfig, MembershipStatistics
from engine.actors.partitions import PartitionTable
from engine.actors.pipeline import ExecutionPipeline, PipelineConfig, PipelineStatistics
from engine.actors.planner import PlannerConfig
from engine.actors.planner_supervisor import PlannerSupervisor, PlannerSupervisorStatistics
from engine.actors.redeliverer import Redeliverer, RedelivererConfig, RedelivererStatistics
from engine.actors.retention import RetentionConfig, RetentionKeeper, RetentionStatistics
from engine.actors.supervisor import ChildSpec, Supervisor, SupervisorStatistics
from engine.actors.workers import (
    WorkerPool,
    WorkerPoolConfig,
    WorkerStatistics,
    renew_check_s_for,
)
from engine.api.app import ANONYMOUS_BURST, ANONYMOUS_RATE_PER_S, ApiConfig, ApiContext
from engine.api.auth import Authenticator
from engine.api.console.web import ConsoleSettings
from engine.api.server import ApiServer
from engine.clock import Clock
from engine.config import NodeConfig
from engine.core.timetable import TimetableCache
from engine.errors import ConfigError, LedgerUnavailable
from engine.gc_thresholds import raised_gc_thresholds
from engine.handlers import HandlerOptions
from engine.handlers.http_client import WebhookClientConfig
from engine.ledger.base import Ledger
from engine.metrics import NodeGauges, NodeMetrics, node_gauges, render

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


class Node:
    def __init__(
        self, config: NodeConfig, ledger: Ledger, clock: Clock, rng: random.Random
    ) -> None:
        self.config = config
        self.ledger = ledger
        self.clock = clock
        self._rng = rng
        self.table = PartitionTable()
        self.cache = TimetableCache()
        self.metrics = NodeMetrics(
            slo_target_s=config.slo_target_s, tenant_labels=config.metrics_tenant_labels
        )
        self.clock_monitor = ClockMonitor(
            ClockMonitorConfig(config.clock_skew_bound_s, config.clock_probe_interval_s),
            ledger,
            clock,
            rng,
        )
        self.membership = Membership(
            MembershipConfig(config.node_id, config.region, config.lease_ttl_s),
            ledger,
            clock,
            rng,
            lambda: self.clock_monitor.statistics().offset_s,
            self._planner_lags,
        )
        self.lease_keeper = LeaseKeeper(
            LeaseKeeperConfig(
                config.node_id, config.lease_ttl_s, config.lease_safety_margin_s, config.region
            ),
            ledger,
            clock,
            self.table,
            self.membership,
            rng,
            metrics=self.metrics,
        )
        self._planner_config = PlannerConfig(
            lookahead_s=config.lookahead_s,
            batch_max=config.plan_batch_max,
            catchup_grace_s=config.catchup_grace_s,
        )
        self.forecast = BurstForecast(
            ForecastConfig(
                config.lookahead_s,
                config.burst_plan_rate_per_s,
                config.burst_lookahead_extra_s_max,
            )
        )
        self.announcements = Announcements(self.clock_monitor.now, FETCH_AHEAD_S_DEFAULT)
        """When to fetch: planners, retries and the change feed announce; the pipeline reads."""
        self.planners = self._new_planner_supervisor()
        self.change_feed = ChangeFeed(
            ChangeFeedConfig(config.change_poll_interval_s),
            ledger,
            self,
            rng,
            metrics=self.metrics,
        )
        self._pipeline_config = PipelineConfig(
            DispatcherConfig(
                node_id=config.node_id,
                queue_max=config.dispatch_queue_max,
                rate_per_s=config.dispatch_rate_per_s or None,
                burst=config.dispatch_burst,
                smoothing_window_s=config.dispatch_smoothing_window_s,
                attempt_lease_s=config.attempt_lease_s,
            ),
            WorkerPoolConfig(
                workers=config.workers,
                blocking_workers=config.blocking_workers,
                renew_check_s=renew_check_s_for(config.attempt_lease_s),
            ),
            webhook=WebhookClientConfig(
                connections_per_host=config.webhook_connections_per_host,
                connections_total=config.webhook_connections_total,
            ),
            stall_after_s=config.dispatch_stall_after_s,
        )
        self._handler_options = HandlerOptions(
            webhook_allow_cidrs=config.webhook_allow_list,
            broker_allow_cidrs=config.broker_allow_list,
            enable_shell=config.enable_shell,
            enable_python=config.enable_python,
            python_modules=config.python_module_list,
        )
        self.pipeline = self._new_pipeline()
        self._pipeline_started = False
        self.redeliverer = Redeliverer(
            RedelivererConfig(), ledger, self.table, metrics=self.metrics
        )
        self.retention = RetentionKeeper(
            RetentionConfig(
                keep_s=config.retention_days * 86400,
                dead_letters_keep_s=(config.dead_letter_retention_days * 86400 or None),
                changes_keep_s=config.change_retention_days * 86400,
            ),
            ledger,
            self.table,
        )
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
        """The scrape-time gauges (read on the trio thread: they read actor state)."""
        return node_gauges(
            self.statistics(),
            self.clock_monitor.now(),
            queue_capacity=self.config.dispatch_queue_max,
            workers=self.config.workers,
        )

    def _planner_lags(self) -> dict[int, float]:
        """Planner lag per partition planned here, as the gauges compute it (heartbeats
        publish it for ``GET /v1/cluster``)."""
        return {p.partition_id: p.planner_lag_s for p in self._gauges().partitions}

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
            self._pipeline_config,
            ledger=self.ledger,
            clock=self.clock,
            monitor=self.clock_monitor,
            table=self.table,
            announcements=self.announcements,
            options=self._handler_options,
            metrics=self.metrics,
            rng=self._rng,
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
            self._planner_config,
            self.ledger,
            self.clock_monitor,
            self.cache,
            self.table,
            self._rng,
            self.forecast,
            self.announcements.announce,
            metrics=self.metrics,
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
