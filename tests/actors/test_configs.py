"""A node's settings reach its actors in one place: every actor setting changes an actor's
config, and an actor built alone with its config's defaults is configured as a default node's."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from engine.actors.configs import actor_configs
from engine.actors.dispatcher import DispatcherConfig
from engine.actors.pipeline import PipelineConfig
from engine.actors.redeliverer import RedelivererConfig
from engine.actors.retention import RetentionConfig
from engine.config import DAY_S, NodeConfig
from engine.handlers import HandlerOptions

NOT_FOR_ACTORS = frozenset(
    {
        "node_id",  # every actor's, tested below
        "database_url",  # the command opening the ledger
        "shutdown_timeout_s",  # the node's shutdown
        "slo_target_s",  # the metrics and the API
        "metrics_tenant_labels",
        "http",
        "metrics_protected",
        "api_token_rate_per_s",
        "api_token_burst",
        "console_session_idle_s",
        "console_session_lifetime_s",
        "console_insecure_cookie",
        "trusted_proxies",
        "log_level",
        "log_format",
    }
)
"""The settings that configure the node, its API or its process rather than an actor."""

TEXT_SETTINGS: dict[str, str] = {
    "region": "eu-west",
    "webhook_allow_cidrs": "10.0.0.0/8",
    "broker_allow_cidrs": "10.0.0.0/8",
    "python_modules": "billing.jobs",
}


def _changed(name: str, default: Any) -> Any:
    """A valid value other than the default (alone, the others left at theirs)."""
    if isinstance(default, bool):
        return not default
    if isinstance(default, int | float):
        return default + 1
    return TEXT_SETTINGS[name]


ACTOR_SETTINGS = sorted(set(NodeConfig.__struct_fields__) - NOT_FOR_ACTORS)


@pytest.mark.parametrize("name", ACTOR_SETTINGS)
def test_every_actor_setting_changes_an_actors_config(name: str) -> None:
    default = NodeConfig(node_id="n1")
    changed = msgspec.structs.replace(default, **{name: _changed(name, getattr(default, name))})
    assert actor_configs(changed) != actor_configs(default)


def test_the_node_id_reaches_every_actor_that_names_the_node() -> None:
    configs = actor_configs(NodeConfig(node_id="n7", region="eu"))
    assert configs.membership.node_id == configs.leases.node_id == "n7"
    assert configs.pipeline.dispatcher.node_id == "n7"
    assert configs.membership.region == configs.leases.region == "eu"


def test_an_actor_built_alone_is_configured_as_a_default_nodes() -> None:
    configs = actor_configs(NodeConfig(node_id="n1"))
    assert configs.pipeline == PipelineConfig(DispatcherConfig(node_id="n1"))
    assert configs.retention == RetentionConfig()
    assert configs.redeliverer == RedelivererConfig()
    assert configs.handlers == HandlerOptions()


def test_settings_in_days_and_zero_meaning_none_are_translated_once() -> None:
    configs = actor_configs(
        NodeConfig(
            node_id="n1",
            retention_days=2,
            change_retention_days=0.5,
            dead_letter_retention_days=30,
            dispatch_rate_per_s=0,
            dispatch_queue_max=10,
        )
    )
    assert configs.retention.keep_s == 2 * DAY_S
    assert configs.retention.changes_keep_s == DAY_S / 2
    assert configs.retention.dead_letters_keep_s == 30 * DAY_S
    assert configs.pipeline.dispatcher.rate_per_s is None  # 0: no node-wide rate
    assert configs.pipeline.dispatcher.queue_max == 10
    kept = actor_configs(NodeConfig(node_id="n1", dead_letter_retention_days=0))
    assert kept.retention.dead_letters_keep_s is None  # 0: kept until replayed or purged
