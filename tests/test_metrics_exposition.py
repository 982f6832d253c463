"""The exposition's metric families, pinned: every name, type, label name and help text a
scraper, an alert or a dashboard may depend on.

A change here is a change operators see (a renamed series breaks a dashboard; a new label
multiplies series), so it is made on purpose, in this table, not as a side effect of moving
code. The families are read back from the text exposition as Prometheus parses it, from a
registry where every family has at least one series (an unlabelled family shows no label
names until it has one); ``tests/actors/test_node_metrics.py`` checks a running node's
exposition against the same table.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from prometheus_client.parser import text_string_to_metric_families

from engine.metrics import (
    LEASE_LOST_EXPIRED,
    SKIP_OVERLAP,
    NodeGauges,
    NodeMetrics,
    PartitionGauges,
    render,
)
from engine.model import Execution

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)

Family = tuple[str, str, tuple[str, ...], str]
"""Name (as the parser gives it: counters without ``_total``), type, label names, help."""

FAMILIES: list[Family] = [
    # Read from the node at scrape time, in this order (they are collected first).
    ("carillon_planner_lag_seconds", "gauge", ("partition",),
     "How long ago the partition's earliest unplanned fire was due (0 while planning keeps "
     "ahead)."),
    ("carillon_checkpoint_age_seconds", "gauge", ("partition",),
     "Now minus the partition's planning checkpoint (negative: ahead by the lookahead; grows "
     "while nothing is due)."),
    ("scheduler_lag_seconds", "gauge", (),
     "The worst planner lag of the partitions this node owns."),
    ("carillon_partitions_owned", "gauge", (), "Partitions whose lease this node holds."),
    ("carillon_queue_depth", "gauge", (),
     "Due executions fetched and waiting in the dispatcher's queue."),
    ("carillon_queue_capacity", "gauge", (),
     "Bound of the dispatcher's queue (beyond it, due work waits in the ledger)."),
    ("carillon_workers_busy", "gauge", (), "Workers running an attempt."),
    ("carillon_workers_capacity", "gauge", (), "Workers in the pool."),
    ("carillon_dispatch_stalled_seconds", "gauge", (),
     "How long due work has waited while workers sat idle and nothing was dispatched, or no "
     "fetch completed (0 while the pipeline moves; /readyz fails past the stall bound)."),
    ("carillon_clock_offset_seconds", "gauge", (),
     "Database clock minus this node's clock (median of the recent probes)."),
    ("carillon_clock_spread_seconds", "gauge", (),
     "How far the recent probes of the database time disagree (planning pauses beyond the "
     "skew bound)."),
    ("carillon_clock_planning_allowed", "gauge", (),
     "1 while the clock monitor lets this node plan, 0 while planning is paused."),
    ("carillon_live_nodes", "gauge", (),
     "Live nodes of the active region, as this node sees them."),
    ("carillon_region_standby", "gauge", (),
     "1 while this node's region is not the active one (it owns nothing), else 0."),
    ("carillon_region_epoch", "gauge", (),
     "The cluster's region epoch as this node last read it (moves on each failover)."),
    # The start SLO's window.
    ("carillon_start_slo_ratio", "gauge", (),
     "Share of the last window of first-attempt starts begun within the SLO target of their "
     "planned instant (NaN before any start)."),
    ("carillon_start_slo_window_starts", "gauge", (),
     "First-attempt starts in the SLO gauge's window."),
    ("carillon_start_slo_target_seconds", "gauge", (),
     "The SLO target: a start within this many seconds of its planned instant is on time."),
    # Counters and histograms, moved as work happens.
    ("due_jobs_enqueued", "counter", (),
     "Executions the planner wrote to the ledger as queued."),
    ("carillon_enqueue_delay_seconds", "histogram", ("le",),
     "Planned instant -> written to the ledger; 0 when written ahead (the lookahead)."),
    ("execution_attempts", "counter", ("status", "task_type"),
     "Finished attempts by status (succeeded, failed = retry scheduled, dead-letter)."),
    ("execution_duration_ms", "histogram", ("le", "task_type"),
     "Handler run time of an attempt, in milliseconds."),
    ("dead_letter", "counter", ("task_type",), "Executions moved to the dead letters."),
    ("carillon_retries", "counter", (),
     "Attempts started after the first (retries, redeliveries, replays)."),
    ("carillon_attempts_expired", "counter", (),
     "Running attempts whose attempt lease ran out, put back in the queue."),
    ("carillon_attempts_dispatched", "counter", ("path",),
     "Attempts handed to the workers, by path: 'claimed' (the claim recorded in the ledger "
     "first) or 'folded' (the claim written with the completion)."),
    ("carillon_start_delay_seconds", "histogram", ("le",),
     "Planned instant -> first attempt started, in seconds (early starts count as 0)."),
    ("carillon_starts", "counter", (), "First attempts started (the SLO's denominator)."),
    ("carillon_starts_late", "counter", (),
     "First attempts started later than the SLO target after their planned instant."),
    ("carillon_skipped", "counter", ("reason",),
     "Executions recorded as skipped, by reason (catch-up, overlap, schedule deleted)."),
    ("carillon_lease_acquisitions", "counter", (), "Partition leases acquired."),
    ("carillon_lease_releases", "counter", (), "Partition leases handed back gracefully."),
    ("carillon_lease_losses", "counter", ("reason",),
     "Partition leases lost: renewal refused, or the trust window ran out."),
    ("carillon_change_feed_gap_reloads", "counter", (),
     "Times this node's change feed fell behind the pruned changes and its planners reloaded "
     "their partitions."),
    ("carillon_metrics_source_errors", "counter", (),
     "Scrapes whose node gauges could not be read (see the node's log)."),
]  # fmt: skip

TENANT_LABELLED = {"carillon_start_delay_seconds", "carillon_starts", "carillon_starts_late"}
"""The families that gain a ``tenant`` label with ``tenant_labels=True``."""


def expected(tenant_labels: bool) -> list[Family]:
    if not tenant_labels:
        return FAMILIES
    return [
        (name, kind, tuple(sorted({*labels, "tenant"})), help_)
        if name in TENANT_LABELLED
        else (name, kind, labels, help_)
        for name, kind, labels, help_ in FAMILIES
    ]


def exposed(body: bytes) -> list[Family]:
    """The families of a text exposition, in order; the ``_created`` twin of a counter or
    histogram with series is checked to be exactly that, then left out."""
    found: list[Family] = []
    with_series: set[str] = set()
    for family in text_string_to_metric_families(body.decode()):
        labels = tuple(sorted({name for sample in family.samples for name in sample.labels}))
        found.append((family.name, family.type, labels, family.documentation))
        if family.samples:
            with_series.add(family.name)
    created = [f for f in found if f[0].endswith("_created")]
    twins = [
        (name + "_created", "gauge", tuple(label for label in labels if label != "le"), help_)
        for name, kind, labels, help_ in found
        if kind in ("counter", "histogram") and name in with_series
    ]
    assert created == twins
    return [f for f in found if not f[0].endswith("_created")]


def every_series(tenant_labels: bool) -> NodeMetrics:
    """Metrics where every family has a series: each hot path taken once, a node source."""
    metrics = NodeMetrics(tenant_labels=tenant_labels)
    metrics.watch(
        lambda: NodeGauges(
            scheduler_lag_s=1.0,
            partitions=[PartitionGauges(0, 1.0, 2.0)],
            partitions_owned=1,
            queue_depth=1,
            queue_capacity=2,
            workers_busy=0,
            workers_capacity=1,
            clock_offset_s=0.0,
            clock_spread_s=0.0,
            planning_allowed=True,
            live_nodes=1,
            region_epoch=1,
        )
    )
    metrics.executions_planned([T0], T0)
    metrics.skipped(SKIP_OVERLAP)
    metrics.execution_started(
        Execution(
            execution_id="s:1",
            schedule_id="s",
            tenant_id="t",
            task_type="hook",
            partition_id=0,
            planned_at=T0,
        ),
        1.0,
    )
    metrics.execution_finished("hook", "dead-letter", 0.1)
    metrics.attempts_expired(1)
    metrics.lease_acquired()
    metrics.lease_released()
    metrics.lease_lost(LEASE_LOST_EXPIRED)
    metrics.change_feed_gap()
    return metrics


@pytest.mark.parametrize("tenant_labels", [False, True])
def test_the_exposition_has_exactly_the_pinned_families(tenant_labels: bool) -> None:
    body, _ = render(every_series(tenant_labels).registry)
    assert exposed(body) == expected(tenant_labels)


def test_openmetrics_names_the_same_families() -> None:
    body, _ = render(every_series(False).registry, "application/openmetrics-text")
    text = body.decode()
    for name, kind, _, _ in FAMILIES:
        assert f"# TYPE {name} {kind}\n" in text
