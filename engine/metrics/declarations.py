"""Every metric of a node, declared once: name, type, labels, help text, buckets.

The counters and histograms (:class:`Instruments`) are created on a node's own registry and
moved as work happens; the gauges are families built at scrape time from what the node
reports (:class:`NodeGauges`, declared here with their names and help in
:data:`NODE_GAUGES`) and from the start SLO's window. ``tests/test_metrics_exposition.py``
pins the resulting exposition.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final, NamedTuple

import msgspec
from prometheus_client import CollectorRegistry, Counter, Histogram

SLO_WINDOW_STARTS_DEFAULT: Final = 10_000
"""First-attempt starts the SLO gauge looks back over."""
SLO_WINDOW_STARTS_MAX: Final = 10_000_000
LABEL_VALUES_MAX_DEFAULT: Final = 100
"""Distinct ``task_type`` (and ``tenant``) label values kept; later ones become ``other``."""
OTHER: Final = "other"
FIXED_LABEL_VALUES_MAX: Final = 32
"""Bound on label sets that are fixed by the code (statuses, reasons), against a stray value."""

LEASE_LOST_REFUSED: Final = "refused"
"""A renewal matched no lease row: another node holds the partition now."""
LEASE_LOST_EXPIRED: Final = "expired"
"""The local trust window ran out before a renewal succeeded: the node stepped down."""
DISPATCHED_CLAIMED: Final = "claimed"
"""An attempt whose claim was recorded in the ledger before its handler started."""
DISPATCHED_FOLDED: Final = "folded"
"""An attempt started without a recorded claim, its claim written with its completion
(docs/ledger.md, "Folded claims")."""
SKIP_OVERLAP: Final = "overlap"
SKIP_CATCHUP_BULK: Final = "catchup_bulk"
"""One per range of missed fires skipped without a record of each (counts ranges, not fires)."""

DURATION_BUCKETS_MS: Final = (
    1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0,
    1_000.0, 2_500.0, 5_000.0, 10_000.0, 30_000.0, 60_000.0, 300_000.0, 900_000.0, 3_600_000.0,
)  # fmt: skip
"""Handler run time, 1 ms to an hour (the longest task-type timeout worth a bucket)."""
START_DELAY_BUCKETS_S: Final = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
    30.0, 60.0, 120.0, 300.0, 900.0, 3_600.0,
)  # fmt: skip
"""Planned -> started; the SLO target is always added as a boundary too."""
ENQUEUE_DELAY_BUCKETS_S: Final = (0.0, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3_600.0)
"""Planned -> durable in the ledger; ``0`` holds every execution written ahead of its instant."""


class CappedLabel:
    """Label values: the first ``limit`` distinct values as themselves, later ones as ``other``."""

    __slots__ = ("_limit", "_seen")

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._seen: set[str] = set()

    def __call__(self, value: str) -> str:
        if value in self._seen:
            return value
        if len(self._seen) < self._limit:
            self._seen.add(value)
            return value
        return OTHER


# -- counters and histograms ------------------------------------------------------------------


class Instruments:
    """The counters and histograms of one node, created on ``registry``.

    ``start_delay_buckets``: :data:`START_DELAY_BUCKETS_S` with the SLO target added.
    ``tenant_labels``: whether the start metrics carry a ``tenant`` label.
    """

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        start_delay_buckets: list[float],
        tenant_labels: bool,
    ) -> None:
        r = registry
        tenant = ["tenant"] if tenant_labels else []
        self.enqueued = Counter(
            "due_jobs_enqueued_total",
            "Executions the planner wrote to the ledger as queued.",
            registry=r,
        )
        self.enqueue_delay = Histogram(
            "carillon_enqueue_delay_seconds",
            "Planned instant -> written to the ledger; 0 when written ahead (the lookahead).",
            buckets=ENQUEUE_DELAY_BUCKETS_S,
            registry=r,
        )
        self.attempts = Counter(
            "execution_attempts_total",
            "Finished attempts by status (succeeded, failed = retry scheduled, dead-letter).",
            ["status", "task_type"],
            registry=r,
        )
        self.duration = Histogram(
            "execution_duration_ms",
            "Handler run time of an attempt, in milliseconds.",
            ["task_type"],
            buckets=DURATION_BUCKETS_MS,
            registry=r,
        )
        self.dead = Counter(
            "dead_letter_total", "Executions moved to the dead letters.", ["task_type"], registry=r
        )
        self.retries = Counter(
            "carillon_retries_total",
            "Attempts started after the first (retries, redeliveries, replays).",
            registry=r,
        )
        self.expired = Counter(
            "carillon_attempts_expired_total",
            "Running attempts whose attempt lease ran out, put back in the queue.",
            registry=r,
        )
        self.dispatched = Counter(
            "carillon_attempts_dispatched_total",
            "Attempts handed to the workers, by path: 'claimed' (the claim recorded in the "
            "ledger first) or 'folded' (the claim written with the completion).",
            ["path"],
            registry=r,
        )
        self.start_delay = Histogram(
            "carillon_start_delay_seconds",
            "Planned instant -> first attempt started, in seconds (early starts count as 0).",
            tenant,
            buckets=start_delay_buckets,
            registry=r,
        )
        self.starts = Counter(
            "carillon_starts_total",
            "First attempts started (the SLO's denominator).",
            tenant,
            registry=r,
        )
        self.starts_late = Counter(
            "carillon_starts_late_total",
            "First attempts started later than the SLO target after their planned instant.",
            tenant,
            registry=r,
        )
        self.skipped = Counter(
            "carillon_skipped_total",
            "Executions recorded as skipped, by reason (catch-up, overlap, schedule deleted).",
            ["reason"],
            registry=r,
        )
        self.lease_acquired = Counter(
            "carillon_lease_acquisitions_total", "Partition leases acquired.", registry=r
        )
        self.lease_released = Counter(
            "carillon_lease_releases_total", "Partition leases handed back gracefully.", registry=r
        )
        self.lease_lost = Counter(
            "carillon_lease_losses_total",
            "Partition leases lost: renewal refused, or the trust window ran out.",
            ["reason"],
            registry=r,
        )
        self.change_feed_gaps = Counter(
            "carillon_change_feed_gap_reloads_total",
            "Times this node's change feed fell behind the pruned changes and its planners "
            "reloaded their partitions.",
            registry=r,
        )
        self.source_errors = Counter(
            "carillon_metrics_source_errors_total",
            "Scrapes whose node gauges could not be read (see the node's log).",
            registry=r,
        )
        for reason in (LEASE_LOST_REFUSED, LEASE_LOST_EXPIRED):
            self.lease_lost.labels(reason)  # both series exist from the start, at 0
        for path in (DISPATCHED_CLAIMED, DISPATCHED_FOLDED):
            self.dispatched.labels(path)


# -- gauges, computed at scrape time ----------------------------------------------------------


class PartitionGauges(msgspec.Struct, frozen=True):
    partition_id: int
    planner_lag_s: float
    """How long ago the partition's earliest unplanned fire was due (0 while it keeps up)."""
    checkpoint_age_s: float | None
    """Now minus the checkpoint; negative while the checkpoint runs ahead (the lookahead)."""


class NodeGauges(msgspec.Struct, frozen=True, kw_only=True):
    """What the scrape-time gauges show: the node assembles it from its actors'
    ``statistics()`` (``Node._gauges`` in ``engine/node.py``)."""

    scheduler_lag_s: float
    partitions: list[PartitionGauges]
    partitions_owned: int
    queue_depth: int
    queue_capacity: int
    workers_busy: int
    workers_capacity: int
    dispatch_stalled_s: float = 0.0
    clock_offset_s: float | None
    clock_spread_s: float | None
    planning_allowed: bool
    live_nodes: int
    region_standby: bool = False
    region_epoch: int | None = None


class GaugeDeclaration(NamedTuple):
    name: str
    documentation: str


PLANNER_LAG: Final = GaugeDeclaration(
    "carillon_planner_lag_seconds",
    "How long ago the partition's earliest unplanned fire was due (0 while planning keeps ahead).",
)
"""Labelled ``partition``: one series per partition this node plans."""
CHECKPOINT_AGE: Final = GaugeDeclaration(
    "carillon_checkpoint_age_seconds",
    "Now minus the partition's planning checkpoint (negative: ahead by the lookahead; "
    "grows while nothing is due).",
)
"""Labelled ``partition``: one series per partition with a checkpoint."""

NodePick = Callable[[NodeGauges], float | None]
NODE_GAUGES: Final[tuple[tuple[GaugeDeclaration, NodePick], ...]] = (
    (
        GaugeDeclaration(
            "scheduler_lag_seconds", "The worst planner lag of the partitions this node owns."
        ),
        lambda g: g.scheduler_lag_s,
    ),
    (
        GaugeDeclaration("carillon_partitions_owned", "Partitions whose lease this node holds."),
        lambda g: g.partitions_owned,
    ),
    (
        GaugeDeclaration(
            "carillon_queue_depth", "Due executions fetched and waiting in the dispatcher's queue."
        ),
        lambda g: g.queue_depth,
    ),
    (
        GaugeDeclaration(
            "carillon_queue_capacity",
            "Bound of the dispatcher's queue (beyond it, due work waits in the ledger).",
        ),
        lambda g: g.queue_capacity,
    ),
    (
        GaugeDeclaration("carillon_workers_busy", "Workers running an attempt."),
        lambda g: g.workers_busy,
    ),
    (
        GaugeDeclaration("carillon_workers_capacity", "Workers in the pool."),
        lambda g: g.workers_capacity,
    ),
    (
        GaugeDeclaration(
            "carillon_dispatch_stalled_seconds",
            "How long due work has waited while workers sat idle and nothing was dispatched, "
            "or no fetch completed (0 while the pipeline moves; /readyz fails past the stall "
            "bound).",
        ),
        lambda g: g.dispatch_stalled_s,
    ),
    (
        GaugeDeclaration(
            "carillon_clock_offset_seconds",
            "Database clock minus this node's clock (median of the recent probes).",
        ),
        lambda g: g.clock_offset_s,
    ),
    (
        GaugeDeclaration(
            "carillon_clock_spread_seconds",
            "How far the recent probes of the database time disagree (planning pauses beyond "
            "the skew bound).",
        ),
        lambda g: g.clock_spread_s,
    ),
    (
        GaugeDeclaration(
            "carillon_clock_planning_allowed",
            "1 while the clock monitor lets this node plan, 0 while planning is paused.",
        ),
        lambda g: 1.0 if g.planning_allowed else 0.0,
    ),
    (
        GaugeDeclaration(
            "carillon_live_nodes", "Live nodes of the active region, as this node sees them."
        ),
        lambda g: g.live_nodes,
    ),
    (
        GaugeDeclaration(
            "carillon_region_standby",
            "1 while this node's region is not the active one (it owns nothing), else 0.",
        ),
        lambda g: 1.0 if g.region_standby else 0.0,
    ),
    (
        GaugeDeclaration(
            "carillon_region_epoch",
            "The cluster's region epoch as this node last read it (moves on each failover).",
        ),
        lambda g: g.region_epoch,
    ),
)
"""The unlabelled gauges read from :class:`NodeGauges`, in exposition order (after the two
per-partition families); a family has no series while its value is ``None``."""

SLO_RATIO: Final = GaugeDeclaration(
    "carillon_start_slo_ratio",
    "Share of the last window of first-attempt starts begun within the SLO target "
    "of their planned instant (NaN before any start).",
)
SLO_WINDOW_STARTS: Final = GaugeDeclaration(
    "carillon_start_slo_window_starts", "First-attempt starts in the SLO gauge's window."
)
SLO_TARGET: Final = GaugeDeclaration(
    "carillon_start_slo_target_seconds",
    "The SLO target: a start within this many seconds of its planned instant is on time.",
)
