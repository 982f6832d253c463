"""The node's Prometheus metrics: names, counters, histograms, the start SLO, label bounds."""

from __future__ import annotations

import math
import random
from datetime import UTC, datetime, timedelta

import msgspec
import pytest
import trio
import trio.testing
from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from engine.actors.planner import PlannerStatistics
from engine.config import NodeConfig
from engine.errors import ConfigError
from engine.ledger.memory import MemoryLedger
from engine.ledger.params import TaskTypesPut
from engine.metrics import (
    LEASE_LOST_EXPIRED,
    LEASE_LOST_REFUSED,
    OTHER,
    SKIP_OVERLAP,
    NodeGauges,
    NodeMetrics,
    PartitionGauges,
    render,
)
from engine.model import Execution, HandlerKind, TaskType
from engine.node import Node, partition_gauges
from engine.testing import ManualClock
from tests.actors import probe_handlers
from tests.actors.harness import PARTITIONS, START, TEST_TENANTS, cluster, create, make_schedules

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)

FIXED_BY_THE_DESIGN = {
    "scheduler_lag_seconds",
    "due_jobs_enqueued_total",
    "execution_attempts_total",
    "execution_duration_ms",
    "dead_letter_total",
}


def execution(*, tenant: str = "acme", attempt: int = 1, task_type: str = "hook") -> Execution:
    return Execution(
        execution_id=f"s:{attempt}",
        schedule_id="s",
        tenant_id=tenant,
        task_type=task_type,
        planned_at=T0,
        attempt=attempt,
        partition_id=0,
    )


def families(metrics: NodeMetrics) -> dict[str, str]:
    """Family name -> type, as a scraper reads them from the exposition."""
    body, _ = render(metrics.registry)
    return {f.name: f.type for f in text_string_to_metric_families(body.decode())}


def value(metrics: NodeMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def gauges(**overrides: object) -> NodeGauges:
    fields: dict[str, object] = {
        "scheduler_lag_s": 0.0,
        "partitions": [],
        "partitions_owned": 0,
        "queue_depth": 0,
        "queue_capacity": 50_000,
        "workers_busy": 0,
        "workers_capacity": 32,
        "clock_offset_s": 0.0,
        "clock_spread_s": 0.0,
        "planning_allowed": True,
        "live_nodes": 1,
    }
    fields.update(overrides)
    return msgspec.convert(fields, NodeGauges)


def planner(
    partition_id: int, *, checkpoint: datetime | None, next_instant: datetime | None
) -> PlannerStatistics:
    return PlannerStatistics(
        partition_id=partition_id,
        schedules=10,
        planned=5,
        skipped=0,
        batches=1,
        checkpoint=checkpoint,
        next_instant=next_instant,
    )


# -- names --------------------------------------------------------------------------------


def test_exposition_names_every_metric_the_design_fixes() -> None:
    exposed = {
        name + ("_total" if kind == "counter" else "")
        for name, kind in families(NodeMetrics()).items()
    }
    assert exposed >= FIXED_BY_THE_DESIGN


def test_every_other_metric_name_starts_with_carillon() -> None:
    for name, kind in families(NodeMetrics()).items():
        full = name + ("_total" if kind == "counter" else "")
        if full in FIXED_BY_THE_DESIGN or name.endswith("_created"):
            continue
        assert name.startswith("carillon_"), name


def test_exposition_declares_every_family_the_issue_asks_for() -> None:
    exposed = families(NodeMetrics())
    assert {
        "carillon_planner_lag_seconds": "gauge",
        "carillon_checkpoint_age_seconds": "gauge",
        "carillon_lease_acquisitions": "counter",
        "carillon_lease_losses": "counter",
        "carillon_queue_depth": "gauge",
        "carillon_enqueue_delay_seconds": "histogram",
        "carillon_retries": "counter",
        "carillon_start_delay_seconds": "histogram",
        "carillon_skipped": "counter",
        "carillon_clock_offset_seconds": "gauge",
        "carillon_start_slo_ratio": "gauge",
        "carillon_starts": "counter",
        "carillon_starts_late": "counter",
        "execution_duration_ms": "histogram",
        "scheduler_lag_seconds": "gauge",
    }.items() <= exposed.items()


def test_render_returns_the_text_format_and_its_content_type() -> None:
    body, content_type = render(NodeMetrics().registry)
    assert content_type.startswith("text/plain")
    assert b"# TYPE execution_duration_ms histogram" in body


def test_render_speaks_openmetrics_when_the_scraper_asks() -> None:
    body, content_type = render(NodeMetrics().registry, "application/openmetrics-text")
    assert content_type.startswith("application/openmetrics-text")
    assert body.rstrip().endswith(b"# EOF")


# -- counters and histograms --------------------------------------------------------------


def test_planned_executions_count_as_enqueued_and_late_writes_are_measured() -> None:
    metrics = NodeMetrics()
    ahead, late = T0 + timedelta(seconds=5), T0 - timedelta(seconds=7)
    metrics.executions_planned([ahead, ahead, late], T0)
    assert value(metrics, "due_jobs_enqueued_total") == 3
    assert value(metrics, "carillon_enqueue_delay_seconds_bucket", le="0.0") == 2
    assert value(metrics, "carillon_enqueue_delay_seconds_bucket", le="5.0") == 2
    assert value(metrics, "carillon_enqueue_delay_seconds_bucket", le="10.0") == 3
    assert value(metrics, "carillon_enqueue_delay_seconds_sum") == pytest.approx(7.0)


def test_finished_attempts_are_counted_by_status_and_task_type() -> None:
    metrics = NodeMetrics()
    metrics.execution_finished("hook", "succeeded", 0.2)
    metrics.execution_finished("hook", "succeeded", 0.2)
    metrics.execution_finished("hook", "failed", 1.0)
    metrics.execution_finished("mail", "succeeded", 0.1)
    assert value(metrics, "execution_attempts_total", status="succeeded", task_type="hook") == 2
    assert value(metrics, "execution_attempts_total", status="failed", task_type="hook") == 1
    assert value(metrics, "execution_attempts_total", status="succeeded", task_type="mail") == 1
    assert value(metrics, "dead_letter_total", task_type="hook") is None


def test_dead_letters_are_counted_by_task_type() -> None:
    metrics = NodeMetrics()
    metrics.execution_finished("hook", "dead-letter", 0.5)
    metrics.execution_finished("hook", "dead-letter", 0.5)
    assert value(metrics, "dead_letter_total", task_type="hook") == 2
    assert value(metrics, "execution_attempts_total", status="dead-letter", task_type="hook") == 2


def test_duration_histogram_is_in_milliseconds_with_buckets_from_ms_to_an_hour() -> None:
    metrics = NodeMetrics()
    metrics.execution_finished("hook", "succeeded", 0.004)  # 4 ms
    metrics.execution_finished("hook", "succeeded", 42.0)  # 42 s
    count = value(metrics, "execution_duration_ms_count", task_type="hook")
    assert count == 2
    assert value(metrics, "execution_duration_ms_sum", task_type="hook") == pytest.approx(42_004)
    assert value(metrics, "execution_duration_ms_bucket", task_type="hook", le="1.0") == 0
    assert value(metrics, "execution_duration_ms_bucket", task_type="hook", le="5.0") == 1
    assert value(metrics, "execution_duration_ms_bucket", task_type="hook", le="30000.0") == 1
    assert value(metrics, "execution_duration_ms_bucket", task_type="hook", le="60000.0") == 2
    assert value(metrics, "execution_duration_ms_bucket", task_type="hook", le="3.6e+06") == 2


def test_first_attempt_starts_feed_the_start_delay_histogram_and_slo_counters() -> None:
    metrics = NodeMetrics()
    metrics.execution_started(execution(), 0.3)
    metrics.execution_started(execution(), 61.0)
    assert value(metrics, "carillon_starts_total") == 2
    assert value(metrics, "carillon_starts_late_total") == 1
    assert value(metrics, "carillon_start_delay_seconds_bucket", le="0.5") == 1
    assert value(metrics, "carillon_start_delay_seconds_bucket", le="60.0") == 1
    assert value(metrics, "carillon_start_delay_seconds_bucket", le="120.0") == 2
    assert value(metrics, "carillon_retries_total") == 0


def test_retry_starts_count_as_retries_and_stay_out_of_the_slo() -> None:
    metrics = NodeMetrics()
    metrics.execution_started(execution(attempt=2), 3_600.0)
    assert value(metrics, "carillon_retries_total") == 1
    assert value(metrics, "carillon_starts_total") == 0
    assert value(metrics, "carillon_start_delay_seconds_count") == 0
    assert metrics.slo_ratio() is None


def test_a_start_before_its_instant_counts_as_no_delay() -> None:
    metrics = NodeMetrics()
    metrics.execution_started(execution(), -0.2)
    assert value(metrics, "carillon_start_delay_seconds_sum") == 0
    assert value(metrics, "carillon_start_delay_seconds_bucket", le="0.005") == 1


def test_a_configured_slo_target_is_a_bucket_boundary() -> None:
    metrics = NodeMetrics(slo_target_s=45.0)
    metrics.execution_started(execution(), 44.0)
    metrics.execution_started(execution(), 46.0)
    assert value(metrics, "carillon_start_delay_seconds_bucket", le="45.0") == 1
    assert value(metrics, "carillon_starts_late_total") == 1
    assert value(metrics, "carillon_start_slo_target_seconds") == 45


def test_skipped_executions_are_counted_by_reason() -> None:
    metrics = NodeMetrics()
    metrics.skipped("catchup_window", 3)
    metrics.skipped(SKIP_OVERLAP)
    assert value(metrics, "carillon_skipped_total", reason="catchup_window") == 3
    assert value(metrics, "carillon_skipped_total", reason="overlap") == 1


def test_lease_churn_is_counted_and_both_loss_reasons_start_at_zero() -> None:
    metrics = NodeMetrics()
    assert value(metrics, "carillon_lease_losses_total", reason=LEASE_LOST_REFUSED) == 0
    metrics.lease_acquired(4)
    metrics.lease_released(1)
    metrics.lease_lost(LEASE_LOST_EXPIRED)
    metrics.lease_lost(LEASE_LOST_REFUSED, 2)
    metrics.attempts_expired(5)
    assert value(metrics, "carillon_lease_acquisitions_total") == 4
    assert value(metrics, "carillon_lease_releases_total") == 1
    assert value(metrics, "carillon_lease_losses_total", reason=LEASE_LOST_EXPIRED) == 1
    assert value(metrics, "carillon_lease_losses_total", reason=LEASE_LOST_REFUSED) == 2
    assert value(metrics, "carillon_attempts_expired_total") == 5


# -- the SLO gauge ------------------------------------------------------------------------


def test_slo_gauge_is_nan_before_any_start() -> None:
    metrics = NodeMetrics()
    ratio = value(metrics, "carillon_start_slo_ratio")
    assert ratio is not None
    assert math.isnan(ratio)
    assert value(metrics, "carillon_start_slo_window_starts") == 0


def test_slo_gauge_is_the_on_time_share_of_the_window() -> None:
    metrics = NodeMetrics(slo_window_starts=10)
    for delay_s in (1.0, 1.0, 1.0, 90.0):
        metrics.execution_started(execution(), delay_s)
    assert value(metrics, "carillon_start_slo_ratio") == pytest.approx(0.75)
    assert value(metrics, "carillon_start_slo_window_starts") == 4


def test_slo_gauge_forgets_starts_older_than_the_window() -> None:
    metrics = NodeMetrics(slo_window_starts=4)
    for _ in range(4):
        metrics.execution_started(execution(), 600.0)  # an incident: all late
    assert metrics.slo_ratio() == 0.0
    for index in range(1, 5):
        metrics.execution_started(execution(), 0.1)
        assert metrics.slo_ratio() == pytest.approx(index / 4)
    assert value(metrics, "carillon_start_slo_window_starts") == 4
    assert value(metrics, "carillon_starts_late_total") == 4  # the counters never forget


@pytest.mark.parametrize(
    "settings",
    [
        {"slo_target_s": 0.0},
        {"slo_target_s": math.inf},
        {"slo_window_starts": 0},
        {"label_values_max": 0},
    ],
)
def test_unusable_settings_are_refused(settings: dict[str, float]) -> None:
    with pytest.raises(ConfigError):
        NodeMetrics(**settings)  # type: ignore[arg-type]


# -- label bounds -------------------------------------------------------------------------


def test_tenant_labels_are_off_by_default() -> None:
    metrics = NodeMetrics()
    metrics.execution_started(execution(tenant="acme"), 1.0)
    assert value(metrics, "carillon_starts_total") == 1
    assert b"tenant=" not in render(metrics.registry)[0]


def test_tenant_labels_when_enabled_keep_the_first_tenants_and_fold_the_rest() -> None:
    metrics = NodeMetrics(tenant_labels=True, label_values_max=2)
    for tenant in ("a", "b", "c", "d", "a"):
        metrics.execution_started(execution(tenant=tenant), 1.0)
    assert value(metrics, "carillon_starts_total", tenant="a") == 2
    assert value(metrics, "carillon_starts_total", tenant="b") == 1
    assert value(metrics, "carillon_starts_total", tenant=OTHER) == 2
    assert value(metrics, "carillon_starts_total", tenant="c") is None
    assert value(metrics, "carillon_start_delay_seconds_count", tenant=OTHER) == 2


def test_task_type_labels_are_capped() -> None:
    metrics = NodeMetrics(label_values_max=3)
    for index in range(10):
        metrics.execution_finished(f"type-{index}", "succeeded", 0.1)
    body = render(metrics.registry)[0].decode()
    task_types = {
        sample.labels["task_type"]
        for family in text_string_to_metric_families(body)
        if family.name == "execution_attempts"
        for sample in family.samples
    }
    assert task_types == {"type-0", "type-1", "type-2", OTHER}
    assert value(metrics, "execution_attempts_total", status="succeeded", task_type=OTHER) == 7


def test_no_metric_has_a_schedule_or_execution_label() -> None:
    metrics = NodeMetrics(tenant_labels=True)
    metrics.execution_started(execution(), 1.0)
    metrics.execution_finished("hook", "dead-letter", 1.0)
    for family in text_string_to_metric_families(render(metrics.registry)[0].decode()):
        for sample in family.samples:
            assert not {"schedule", "schedule_id", "execution_id"} & sample.labels.keys()


# -- independence -------------------------------------------------------------------------


def test_two_nodes_in_one_process_do_not_share_a_series() -> None:
    first, second = NodeMetrics(), NodeMetrics()
    first.execution_started(execution(), 1.0)
    first.lease_acquired(3)
    assert value(first, "carillon_starts_total") == 1
    assert value(second, "carillon_starts_total") == 0
    assert value(second, "carillon_lease_acquisitions_total") == 0
    assert first.registry is not second.registry


def test_the_global_default_registry_is_left_alone() -> None:
    NodeMetrics()
    assert REGISTRY.get_sample_value("due_jobs_enqueued_total") is None


def test_a_given_registry_is_used() -> None:
    registry = CollectorRegistry()
    metrics = NodeMetrics(registry)
    metrics.lease_acquired()
    assert registry.get_sample_value("carillon_lease_acquisitions_total") == 1


# -- scrape-time gauges -------------------------------------------------------------------


def test_node_gauges_are_read_from_the_source_only_when_scraped() -> None:
    metrics = NodeMetrics()
    calls: list[int] = []

    def source() -> NodeGauges:
        calls.append(1)
        return gauges(queue_depth=7 * len(calls), clock_offset_s=-0.25, planning_allowed=False)

    metrics.watch(source)
    metrics.execution_started(execution(), 1.0)
    metrics.execution_finished("hook", "succeeded", 0.1)
    assert calls == []
    assert value(metrics, "carillon_queue_depth") == 7
    assert value(metrics, "carillon_queue_depth") == 14
    assert value(metrics, "carillon_clock_offset_seconds") == -0.25
    assert value(metrics, "carillon_clock_planning_allowed") == 0


def test_partition_series_follow_ownership_from_scrape_to_scrape() -> None:
    metrics = NodeMetrics()
    owned = [PartitionGauges(3, 0.0, -4.0), PartitionGauges(9, 12.5, 20.0)]
    metrics.watch(lambda: gauges(partitions=owned, scheduler_lag_s=12.5))
    assert value(metrics, "carillon_planner_lag_seconds", partition="9") == 12.5
    assert value(metrics, "carillon_checkpoint_age_seconds", partition="3") == -4.0
    assert value(metrics, "scheduler_lag_seconds") == 12.5
    owned.pop()  # partition 9 handed over to another node
    assert value(metrics, "carillon_planner_lag_seconds", partition="9") is None
    assert value(metrics, "carillon_planner_lag_seconds", partition="3") == 0.0


def test_a_failing_source_leaves_the_counters_and_is_counted() -> None:
    metrics = NodeMetrics()

    def broken() -> NodeGauges:
        raise RuntimeError("boom")

    metrics.watch(broken)
    metrics.lease_acquired()
    body, _ = render(metrics.registry)
    assert b"carillon_lease_acquisitions_total 1.0" in body
    assert b"\ncarillon_queue_depth " not in body
    assert b"carillon_metrics_source_errors_total 1.0" in body


# -- the node's gauges -------------------------------------------------------------------


def test_partition_gauges_compute_planner_lag_and_checkpoint_age_per_partition() -> None:
    now = T0
    planners = [
        # keeping ahead: next fire beyond now, checkpoint ahead by the lookahead
        planner(1, checkpoint=now + timedelta(seconds=5), next_instant=now + timedelta(seconds=30)),
        # behind: its next fire was due 8 s ago
        planner(2, checkpoint=now - timedelta(seconds=9), next_instant=now - timedelta(seconds=8)),
        # just taken over: nothing planned yet, nothing to plan
        planner(3, checkpoint=None, next_instant=None),
    ]
    assert partition_gauges(planners, now) == [
        PartitionGauges(1, 0.0, -5.0),
        PartitionGauges(2, 8.0, 9.0),
        PartitionGauges(3, 0.0, None),
    ]


def test_an_idle_node_has_no_scheduler_lag() -> None:
    clock = ManualClock(T0)
    config = NodeConfig(node_id="n1", http="", dispatch_queue_max=10, workers=1)
    node = Node(config, MemoryLedger(clock=clock), clock, random.Random(1))
    result = node.metrics.gauges()
    assert result is not None
    assert result.scheduler_lag_s == 0.0
    assert result.partitions == []
    assert (result.queue_capacity, result.workers_capacity) == (10, 1)
    assert result.planning_allowed is False  # no clock probe yet
    assert result.clock_offset_s is None


async def test_a_running_nodes_gauges_are_what_its_actors_report(
    autojump_clock: trio.testing.MockClock,
) -> None:
    probe_handlers.reset(run_s=10.0)
    probe = TaskType(
        name="probe",
        kind=HandlerKind.PYTHON,
        allowed_tenants=TEST_TENANTS,
        settings={"callable": "tests.actors.probe_handlers:probe"},
    )
    schedules = [
        msgspec.structs.replace(s, task_type="probe")
        for s in make_schedules(25, START, lambda n: ("0 * * * *", "UTC"))
    ]
    first_fire = START.replace(minute=0, second=0) + timedelta(hours=1)
    async with cluster(workers=2, dispatch_queue_max=500) as c:
        await c.ledger.task_types_put(TaskTypesPut(probe))
        await create(c.ledger, schedules)
        sim = await c.start_node("n1", skew_s=-0.25)
        await trio.sleep((first_fire - START).total_seconds() + 1)
        node = sim.node
        result = node.metrics.gauges()
        now = node.clock_monitor.now()
        planners = node.planners.statistics().planners
        clock = node.clock_monitor.statistics()
        membership = node.membership.statistics()
        queued = node.dispatcher.statistics().queued
        busy = node.workers.statistics().busy
        stalled_s = node.pipeline.statistics().stalled_s
        owned = node.lease_keeper.statistics().owned
    assert result is not None
    # Distinct values, so that a gauge read from the wrong statistic shows.
    assert (result.queue_depth, result.workers_busy, result.partitions_owned) == (
        queued,
        busy,
        len(owned),
    )
    assert busy == 2
    assert len(owned) == PARTITIONS
    assert len({queued, busy, len(owned)}) == 3
    assert (result.queue_capacity, result.workers_capacity) == (500, 2)
    assert result.partitions == partition_gauges(planners, now)
    assert len(result.partitions) == PARTITIONS
    assert result.scheduler_lag_s == max(p.planner_lag_s for p in result.partitions)
    assert result.dispatch_stalled_s == stalled_s
    assert (result.clock_offset_s, result.clock_spread_s, result.planning_allowed) == (
        clock.offset_s,
        clock.spread_s,
        clock.planning_allowed,
    )
    assert result.clock_offset_s == 0.25
    assert (result.live_nodes, result.region_standby, result.region_epoch) == (
        len(membership.live_nodes),
        membership.standby,
        membership.region_epoch,
    )
    assert result.live_nodes == 1
