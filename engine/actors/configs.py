"""The one place a node's settings become its actors' configs (:func:`actor_configs`).

The node calls it once, so a setting reaches its actor in exactly one place; and a config
built without a node (a test's ``RetentionConfig()``) has a default node's values, because
both name the same constants (``engine/config.py``, or next to the actor that owns one).
"""

from __future__ import annotations

import msgspec

from engine.actors.change_feed import ChangeFeedConfig
from engine.actors.clock_monitor import ClockMonitorConfig
from engine.actors.dispatcher import DispatcherConfig
from engine.actors.forecast import ForecastConfig
from engine.actors.lease_keeper import LeaseKeeperConfig
from engine.actors.membership import MembershipConfig
from engine.actors.pipeline import PipelineConfig
from engine.actors.planner import PlannerConfig
from engine.actors.redeliverer import RedelivererConfig
from engine.actors.retention import RetentionConfig
from engine.actors.workers import WorkerPoolConfig, renew_check_s_for
from engine.config import DAY_S, NodeConfig
from engine.handlers import HandlerOptions
from engine.handlers.http_client import WebhookClientConfig


class ActorConfigs(msgspec.Struct, frozen=True, kw_only=True):
    """Every actor's config, as :func:`actor_configs` derives them from a node's."""

    clock: ClockMonitorConfig
    membership: MembershipConfig
    leases: LeaseKeeperConfig
    planner: PlannerConfig
    forecast: ForecastConfig
    changes: ChangeFeedConfig
    pipeline: PipelineConfig
    handlers: HandlerOptions
    redeliverer: RedelivererConfig
    retention: RetentionConfig


def actor_configs(config: NodeConfig) -> ActorConfigs:
    """The node's settings, each given to the actor that uses it."""
    return ActorConfigs(
        clock=ClockMonitorConfig(config.clock_skew_bound_s, config.clock_probe_interval_s),
        membership=MembershipConfig(config.node_id, config.region, config.lease_ttl_s),
        leases=LeaseKeeperConfig(
            config.node_id, config.lease_ttl_s, config.lease_safety_margin_s, config.region
        ),
        planner=PlannerConfig(
            lookahead_s=config.lookahead_s,
            batch_max=config.plan_batch_max,
            catchup_grace_s=config.catchup_grace_s,
        ),
        forecast=ForecastConfig(
            config.lookahead_s, config.burst_plan_rate_per_s, config.burst_lookahead_extra_s_max
        ),
        changes=ChangeFeedConfig(config.change_poll_interval_s),
        pipeline=PipelineConfig(
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
        ),
        handlers=HandlerOptions(
            webhook_allow_cidrs=config.webhook_allow_list,
            broker_allow_cidrs=config.broker_allow_list,
            enable_shell=config.enable_shell,
            enable_python=config.enable_python,
            python_modules=config.python_module_list,
        ),
        redeliverer=RedelivererConfig(),
        retention=RetentionConfig(
            keep_s=config.retention_days * DAY_S,
            dead_letters_keep_s=config.dead_letter_retention_days * DAY_S or None,
            changes_keep_s=config.change_retention_days * DAY_S,
        ),
    )
