"""Every Prometheus metric of a node, declared once, on the node's own registry.

:class:`NodeMetrics` owns a :class:`~prometheus_client.CollectorRegistry` per node (never the
global default one), so several nodes in one process -- tests, simulations -- never share a
series. Counters and histograms move on the hot paths through plain methods: label children
are looked up once and cached. The per-execution ones (``execution_started``,
``execution_finished``) do not even touch prometheus-client, whose counters and histograms
take a lock per call (a burst spent several microseconds an execution there): they tally in
plain Python -- a count per counter child, bucket counts and a sum per histogram child -- and
the tallies are added to the children whenever the registry is collected (a scrape, or
``registry.get_sample_value``), before any of them is read, so every read is exact. Gauges of
the node's state -- queue depth, planner lag, checkpoint age, clock skew -- are read from the
actors' ``statistics()`` only when scraped, through the source given to
:meth:`NodeMetrics.watch`.
``docs/ops/`` holds the alerting rules, the Grafana dashboard and the runbook built on them.

Names: the five the design fixes keep their names verbatim (``scheduler_lag_seconds``,
``due_jobs_enqueued_total``, ``execution_attempts_total``, ``execution_duration_ms``,
``dead_letter_total``); every other one starts with ``carillon_``.

Invariants
----------
* Bounded cardinality: no label names a schedule or an execution. ``partition`` is bounded
  by the partition count. ``task_type`` and, only with ``tenant_labels=True``, ``tenant``
  keep their first ``label_values_max`` distinct values (default 100); every later value is
  reported as ``other`` (a tenant really named ``other`` shares that series). Statuses,
  skip reasons and lease-loss reasons are fixed by the code (and capped all the same).
* The start SLO counts *first* attempts only (a retry starts late on purpose); its gauge is
  the share of the last ``slo_window_starts`` (default 10,000) first-attempt starts that
  began within ``slo_target_s`` (default 60 s) of their planned instant -- ``NaN`` before
  any start. A count window is O(1) per start and needs no clock; it spans seconds at a high
  rate and hours at a low one, so anything judged over time (alerts, burn rates) uses the
  counters ``carillon_starts_total`` and ``carillon_starts_late_total`` instead.
* Scrape-time series exist only while true: a partition this node stops owning drops out of
  ``carillon_planner_lag_seconds`` at the next scrape instead of freezing at its last value.

Wiring (who calls what, where)
------------------------------
The node creates one ``NodeMetrics`` and passes it to the actors like any dependency::

    Planner.step            after ``executions_plan`` returned (in ``Planner._count``):
                              metrics.executions_planned(queued, now)   # the list it builds
                              metrics.skipped(e.error_code) for each written execution
                              whose error_code is set (catch-up records)
    Planner._resolve        notes each ``result.bulk_skipped``; ``_count`` then adds
                              metrics.skipped(SKIP_CATCHUP_BULK, n) once the batch is
                              written (a batch retried after an error counts once)
    Dispatcher._admit_batch after ``overlap.admit`` (the guard's ``_skip`` bumps
                            ``overlap_skipped``): metrics.skipped(SKIP_OVERLAP, new skips)
    WorkerPool._execute     just before the handler runs (setup done, not abandoned):
                              metrics.execution_started(execution, delay_s)
                              with delay_s = (clock monitor's corrected now
                              - execution.planned_at) in seconds
                            after ``decide``:
                              metrics.execution_finished(execution.task_type,
                                                         decision.outcome, duration_s)
                            or, for an execution whose schedule was deleted after its
                            claim (not run): metrics.skipped(SCHEDULE_DELETED)
                              duration_s measured on the monotonic clock around the handler
                              (0.0 when the task type could not even be set up); an
                              abandoned attempt writes no completion and is not counted
    Redeliverer.step        metrics.attempts_expired(len(requeued))
    LeaseKeeper._rebalance  metrics.lease_acquired(len(acquired))
    LeaseKeeper._drain_and_release, release_all
                            metrics.lease_released(released)
    LeaseKeeper._renew      where a renewal was refused: metrics.lease_lost(LEASE_LOST_REFUSED)
    LeaseKeeper._expire_locally
                            metrics.lease_lost(LEASE_LOST_EXPIRED)
    PlannerSupervisor._run_partition
                            where a planner gives its partition up and drops it:
                              metrics.lease_lost(LEASE_LOST_REFUSED) on a rejected fence,
                              metrics.lease_lost(LEASE_LOST_EXPIRED) when the trust window
                              ended (its deadline fires before the lease keeper's next
                              cycle, so most trust-window losses are counted here)
    Node.__init__           metrics.watch(self._gauges), which returns node_gauges(
                                self.statistics(), self.clock_monitor.now(),
                                queue_capacity=self.dispatcher.config.queue_max,
                                workers=config.workers)
    GET /metrics            body, content_type = render(metrics.registry, request_accept)

Render from the trio thread: the source reads actor state that only that thread writes, and
the tallies are added to the children there.
"""

from __future__ import annotations

import bisect
import logging
import math
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Final

import msgspec
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.exposition import CONTENT_TYPE_LATEST, choose_encoder, generate_latest
from prometheus_client.metrics_core import GaugeMetricFamily, Metric

from engine.config import SLO_TARGET_S_DEFAULT
from engine.errors import ConfigError
from engine.model import Execution

if TYPE_CHECKING:
    from engine.node import NodeStatistics

log = logging.getLogger("carillon.metrics")

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


class PartitionGauges(msgspec.Struct, frozen=True):
    partition_id: int
    planner_lag_s: float
    """How long ago the partition's earliest unplanned fire was due (0 while it keeps up)."""
    checkpoint_age_s: float | None
    """Now minus the checkpoint; negative while the checkpoint runs ahead (the lookahead)."""


class NodeGauges(msgspec.Struct, frozen=True, kw_only=True):
    """What the scrape-time gauges show, read from the actors' statistics."""

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


def node_gauges(
    statistics: NodeStatistics, now: datetime, *, queue_capacity: int, workers: int
) -> NodeGauges:
    """The gauges of a node from its statistics, ``now`` being the clock monitor's time.

    A partition's planner lag is ``now - next_instant`` when positive: the planner writes
    every fire before it is due (lookahead), so an unplanned fire in the past means planning
    is behind (a slow ledger, planning paused for clock skew). ``scheduler_lag_s`` is the
    worst partition's. Partitions whose planner is still loading have no entry yet.
    """
    partitions = []
    for planner in statistics.planners.planners:
        lag_s = 0.0
        if planner.next_instant is not None:
            lag_s = max(0.0, (now - planner.next_instant).total_seconds())
        age_s = None
        if planner.checkpoint is not None:
            age_s = (now - planner.checkpoint).total_seconds()
        partitions.append(PartitionGauges(planner.partition_id, lag_s, age_s))
    return NodeGauges(
        scheduler_lag_s=max((p.planner_lag_s for p in partitions), default=0.0),
        partitions=partitions,
        partitions_owned=len(statistics.leases.owned),
        queue_depth=statistics.dispatcher.queued,
        queue_capacity=queue_capacity,
        workers_busy=statistics.workers.busy,
        workers_capacity=workers,
        dispatch_stalled_s=statistics.pipeline.stalled_s,
        clock_offset_s=statistics.clock.offset_s,
        clock_spread_s=statistics.clock.spread_s,
        planning_allowed=statistics.clock.planning_allowed,
        live_nodes=len(statistics.membership.live_nodes),
        region_standby=statistics.membership.standby,
        region_epoch=statistics.membership.region_epoch,
    )


def render(registry: CollectorRegistry, accept: str | None = None) -> tuple[bytes, str]:
    """The exposition of ``registry`` and its content type, for ``GET /metrics``.

    The Prometheus text format, or OpenMetrics when ``accept`` (the request's ``Accept``
    header) asks for it.
    """
    if not accept:
        return generate_latest(registry), CONTENT_TYPE_LATEST
    encoder, content_type = choose_encoder(accept)
    return encoder(registry), content_type


class _CappedLabel:
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


class _StartWindow:
    """Whether each of the last ``size`` first-attempt starts was late, in a ring."""

    __slots__ = ("_filled", "_late", "_late_count", "_next", "_size")

    def __init__(self, size: int) -> None:
        self._size = size
        self._late = bytearray(size)
        self._next = 0
        self._filled = 0
        self._late_count = 0

    def record(self, late: bool) -> None:
        i = self._next
        self._late_count += late - self._late[i]
        self._late[i] = late
        self._next = 0 if i + 1 == self._size else i + 1
        if self._filled < self._size:
            self._filled += 1

    @property
    def starts(self) -> int:
        return self._filled

    def on_time_ratio(self) -> float | None:
        if not self._filled:
            return None
        return (self._filled - self._late_count) / self._filled


class _CounterTally:
    """Increments of one counter child not yet added to it."""

    __slots__ = ("child", "n")

    def __init__(self, child: Counter) -> None:
        self.child = child
        self.n = 0

    def flush(self) -> None:
        if self.n:
            self.child.inc(self.n)
            self.n = 0


class _HistogramTally:
    """Observations of one histogram child not yet added to it: a count per bucket and
    their sum. Flushing reaches into the child's bucket and sum values (prometheus-client
    has no public way to add many observations at once); ``tests/test_metrics_tallies.py``
    pins the result to what one ``observe`` per value gives."""

    __slots__ = ("_bounds", "_counts", "_pending", "_sum", "child")

    def __init__(self, child: Histogram) -> None:
        self.child = child
        self._bounds: list[float] = child._upper_bounds  # ends with +Inf
        self._counts = [0] * len(self._bounds)
        self._sum = 0.0
        self._pending = False

    def observe(self, amount: float) -> None:
        # The bucket observe() picks: the first bound >= amount (none for NaN).
        index = bisect.bisect_left(self._bounds, amount)
        if index < len(self._counts) and amount <= self._bounds[index]:
            self._counts[index] += 1
        self._sum += amount
        self._pending = True

    def flush(self) -> None:
        if not self._pending:
            return
        child, counts = self.child, self._counts
        child._sum.inc(self._sum)
        for index, count in enumerate(counts):
            if count:
                child._buckets[index].inc(count)
                counts[index] = 0
        self._sum = 0.0
        self._pending = False


_Starts = tuple[_HistogramTally, _CounterTally, _CounterTally]
_Finished = tuple[_CounterTally, _HistogramTally, _CounterTally | None]


class NodeMetrics:
    """The metrics of one node. See the module docstring for who calls which method."""

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        *,
        slo_target_s: float = SLO_TARGET_S_DEFAULT,
        slo_window_starts: int = SLO_WINDOW_STARTS_DEFAULT,
        tenant_labels: bool = False,
        label_values_max: int = LABEL_VALUES_MAX_DEFAULT,
    ) -> None:
        if not (math.isfinite(slo_target_s) and slo_target_s > 0):
            raise ConfigError(
                f"slo_target_s must be a positive number of seconds, not {slo_target_s}"
            )
        if not 1 <= slo_window_starts <= SLO_WINDOW_STARTS_MAX:
            raise ConfigError(
                f"slo_window_starts must be 1-{SLO_WINDOW_STARTS_MAX}, not {slo_window_starts}"
            )
        if label_values_max < 1:
            raise ConfigError(f"label_values_max must be at least 1, not {label_values_max}")
        self.registry = registry if registry is not None else CollectorRegistry()
        self.slo_target_s = slo_target_s
        self.tenant_labels = tenant_labels
        self._tenants = _CappedLabel(label_values_max)
        self._task_types = _CappedLabel(label_values_max)
        self._statuses = _CappedLabel(FIXED_LABEL_VALUES_MAX)
        self._reasons = _CappedLabel(FIXED_LABEL_VALUES_MAX)
        self._window = _StartWindow(slo_window_starts)
        self._source: Callable[[], NodeGauges] | None = None
        # First, so that a scrape whose source fails already shows that failure's count.
        self.registry.register(_ScrapeCollector(self))
        self._declare(tenant_labels)
        self._tallies: dict[object, _CounterTally | _HistogramTally] = {}
        """One per counter or histogram child moved on the per-execution paths."""
        self._retries_tally = self._counter_tally(self._retries)
        self._starts_by_tenant: dict[str, _Starts] = {}
        self._starts_all: _Starts | None = (
            None
            if tenant_labels
            else (
                self._histogram_tally(self._start_delay),
                self._counter_tally(self._starts),
                self._counter_tally(self._starts_late),
            )
        )
        self._finished: dict[tuple[str, str], _Finished] = {}

    def _declare(self, tenant_labels: bool) -> None:
        r = self.registry
        tenant = ["tenant"] if tenant_labels else []
        self._enqueued = Counter(
            "due_jobs_enqueued_total",
            "Executions the planner wrote to the ledger as queued.",
            registry=r,
        )
        self._enqueue_delay = Histogram(
            "carillon_enqueue_delay_seconds",
            "Planned instant -> written to the ledger; 0 when written ahead (the lookahead).",
            buckets=ENQUEUE_DELAY_BUCKETS_S,
            registry=r,
        )
        self._attempts = Counter(
            "execution_attempts_total",
            "Finished attempts by status (succeeded, failed = retry scheduled, dead-letter).",
            ["status", "task_type"],
            registry=r,
        )
        self._duration = Histogram(
            "execution_duration_ms",
            "Handler run time of an attempt, in milliseconds.",
            ["task_type"],
            buckets=DURATION_BUCKETS_MS,
            registry=r,
        )
        self._dead = Counter(
            "dead_letter_total", "Executions moved to the dead letters.", ["task_type"], registry=r
        )
        self._retries = Counter(
            "carillon_retries_total",
            "Attempts started after the first (retries, redeliveries, replays).",
            registry=r,
        )
        self._expired = Counter(
            "carillon_attempts_expired_total",
            "Running attempts whose attempt lease ran out, put back in the queue.",
            registry=r,
        )
        self._start_delay = Histogram(
            "carillon_start_delay_seconds",
            "Planned instant -> first attempt started, in seconds (early starts count as 0).",
            tenant,
            buckets=sorted({*START_DELAY_BUCKETS_S, self.slo_target_s}),
            registry=r,
        )
        self._starts = Counter(
            "carillon_starts_total",
            "First attempts started (the SLO's denominator).",
            tenant,
            registry=r,
        )
        self._starts_late = Counter(
            "carillon_starts_late_total",
            "First attempts started later than the SLO target after their planned instant.",
            tenant,
            registry=r,
        )
        self._skipped = Counter(
            "carillon_skipped_total",
            "Executions recorded as skipped, by reason (catch-up, overlap, schedule deleted).",
            ["reason"],
            registry=r,
        )
        self._lease_acquired = Counter(
            "carillon_lease_acquisitions_total", "Partition leases acquired.", registry=r
        )
        self._lease_released = Counter(
            "carillon_lease_releases_total", "Partition leases handed back gracefully.", registry=r
        )
        self._lease_lost = Counter(
            "carillon_lease_losses_total",
            "Partition leases lost: renewal refused, or the trust window ran out.",
            ["reason"],
            registry=r,
        )
        self._change_feed_gaps = Counter(
            "carillon_change_feed_gap_reloads_total",
            "Times this node's change feed fell behind the pruned changes and its planners "
            "reloaded their partitions.",
            registry=r,
        )
        self._source_errors = Counter(
            "carillon_metrics_source_errors_total",
            "Scrapes whose node gauges could not be read (see the node's log).",
            registry=r,
        )
        for reason in (LEASE_LOST_REFUSED, LEASE_LOST_EXPIRED):
            self._lease_lost.labels(reason)  # both series exist from the start, at 0

    # -- hot paths ------------------------------------------------------------------------

    def executions_planned(self, planned_at: Sequence[datetime], now: datetime) -> None:
        """The planner wrote these executions as queued at ``now`` (skipped ones go to
        :meth:`skipped`)."""
        self._enqueued.inc(len(planned_at))
        observe = self._enqueue_delay.observe
        for at in planned_at:
            if at >= now:
                observe(0.0)
            else:
                observe((now - at).total_seconds())

    def skipped(self, reason: str, n: int = 1) -> None:
        """``n`` executions were recorded as skipped for ``reason``."""
        self._skipped.labels(self._reasons(reason)).inc(n)

    def execution_started(self, execution: Execution, start_delay_s: float) -> None:
        """A worker starts ``execution``'s attempt ``start_delay_s`` after its planned instant."""
        if execution.attempt > 1:
            self._retries_tally.n += 1
            return
        starts = self._starts_all
        if starts is None:
            starts = self._starts_by_tenant.get(execution.tenant_id)
            if starts is None:
                starts = self._tenant_starts(execution.tenant_id)
        delay_s = start_delay_s if start_delay_s > 0.0 else 0.0
        late = delay_s > self.slo_target_s
        starts[0].observe(delay_s)
        starts[1].n += 1
        if late:
            starts[2].n += 1
        self._window.record(late)

    def execution_finished(self, task_type: str, outcome: str, duration_s: float) -> None:
        """An attempt of ``task_type`` ended as ``outcome`` (``succeeded``, ``failed`` --
        a retry is scheduled -- or ``dead-letter``) after running ``duration_s``."""
        children = self._finished.get((task_type, outcome))
        if children is None:
            children = self._finished_children(task_type, outcome)
        children[0].n += 1
        children[1].observe(duration_s * 1000.0)
        if children[2] is not None:
            children[2].n += 1

    def attempts_expired(self, n: int) -> None:
        """The redeliverer re-queued ``n`` attempts whose attempt lease ran out."""
        if n:
            self._expired.inc(n)

    def lease_acquired(self, n: int = 1) -> None:
        if n:
            self._lease_acquired.inc(n)

    def lease_released(self, n: int = 1) -> None:
        if n:
            self._lease_released.inc(n)

    def lease_lost(self, reason: str, n: int = 1) -> None:
        """``reason``: :data:`LEASE_LOST_REFUSED` or :data:`LEASE_LOST_EXPIRED`."""
        self._lease_lost.labels(self._reasons(reason)).inc(n)

    def change_feed_gap(self) -> None:
        """The change feed found changes pruned past its watermark; planners reload."""
        self._change_feed_gaps.inc()

    # -- scrape time ----------------------------------------------------------------------

    def watch(self, source: Callable[[], NodeGauges]) -> None:
        """Read the node gauges from ``source`` at every scrape (see :func:`node_gauges`)."""
        self._source = source

    def slo_ratio(self) -> float | None:
        """The share of the window's first-attempt starts that were on time (``None``: none)."""
        return self._window.on_time_ratio()

    def gauges(self) -> NodeGauges | None:
        """The source's gauges now, or ``None`` (no source, or it failed -- logged, counted)."""
        if self._source is None:
            return None
        try:
            return self._source()
        except Exception:
            # A scrape must not fail: a failing /metrics would read as "node down".
            log.exception("could not read the node gauges for a scrape")
            self._source_errors.inc()
            return None

    def window_starts(self) -> int:
        return self._window.starts

    def flush(self) -> None:
        """Add the tallies of the per-execution paths to their prometheus children (done at
        every collection of the registry, first; see the module docstring)."""
        for tally in self._tallies.values():
            tally.flush()

    # -- internals ------------------------------------------------------------------------

    def _counter_tally(self, child: Counter) -> _CounterTally:
        tally = self._tallies.get(child)
        if tally is None:
            tally = self._tallies[child] = _CounterTally(child)
        assert isinstance(tally, _CounterTally)
        return tally

    def _histogram_tally(self, child: Histogram) -> _HistogramTally:
        tally = self._tallies.get(child)
        if tally is None:
            tally = self._tallies[child] = _HistogramTally(child)
        assert isinstance(tally, _HistogramTally)
        return tally

    def _tenant_starts(self, tenant_id: str) -> _Starts:
        label = self._tenants(tenant_id)
        children = (
            self._histogram_tally(self._start_delay.labels(label)),
            self._counter_tally(self._starts.labels(label)),
            self._counter_tally(self._starts_late.labels(label)),
        )
        if label == tenant_id:  # values folded into "other" stay uncached: the cache is bounded
            self._starts_by_tenant[tenant_id] = children
        return children

    def _finished_children(self, task_type: str, outcome: str) -> _Finished:
        label = self._task_types(task_type)
        status = self._statuses(outcome)
        children = (
            self._counter_tally(self._attempts.labels(status, label)),
            self._histogram_tally(self._duration.labels(label)),
            self._counter_tally(self._dead.labels(label)) if outcome == "dead-letter" else None,
        )
        if label == task_type and status == outcome:
            self._finished[(task_type, outcome)] = children
        return children


class _ScrapeCollector:
    """The gauges computed at scrape time, from :class:`NodeMetrics` and its source."""

    def __init__(self, metrics: NodeMetrics) -> None:
        self._metrics = metrics

    def describe(self) -> Iterable[Metric]:
        return self._families(None)

    def collect(self) -> Iterable[Metric]:
        # Registered first, so collected first: the counters and histograms collected after
        # it show every tally.
        self._metrics.flush()
        return self._families(self._metrics.gauges())

    def _families(self, gauges: NodeGauges | None) -> list[Metric]:
        m = self._metrics
        families = _node_families(gauges)
        ratio = m.slo_ratio()
        families += [
            _gauge(
                "carillon_start_slo_ratio",
                "Share of the last window of first-attempt starts begun within the SLO target "
                "of their planned instant (NaN before any start).",
                math.nan if ratio is None else ratio,
            ),
            _gauge(
                "carillon_start_slo_window_starts",
                "First-attempt starts in the SLO gauge's window.",
                m.window_starts(),
            ),
            _gauge(
                "carillon_start_slo_target_seconds",
                "The SLO target: a start within this many seconds of its planned instant is "
                "on time.",
                m.slo_target_s,
            ),
        ]
        return families


def _gauge(name: str, documentation: str, value: float | None) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, documentation)
    if value is not None:
        family.add_metric([], value)
    return family


_NodePick = Callable[[NodeGauges], float | None]
_NODE_GAUGES: Final[tuple[tuple[str, str, _NodePick], ...]] = (
    (
        "scheduler_lag_seconds",
        "The worst planner lag of the partitions this node owns.",
        lambda g: g.scheduler_lag_s,
    ),
    (
        "carillon_partitions_owned",
        "Partitions whose lease this node holds.",
        lambda g: g.partitions_owned,
    ),
    (
        "carillon_queue_depth",
        "Due executions fetched and waiting in the dispatcher's queue.",
        lambda g: g.queue_depth,
    ),
    (
        "carillon_queue_capacity",
        "Bound of the dispatcher's queue (beyond it, due work waits in the ledger).",
        lambda g: g.queue_capacity,
    ),
    ("carillon_workers_busy", "Workers running an attempt.", lambda g: g.workers_busy),
    ("carillon_workers_capacity", "Workers in the pool.", lambda g: g.workers_capacity),
    (
        "carillon_dispatch_stalled_seconds",
        "How long due work has waited while workers sat idle and nothing was dispatched, or "
        "no fetch completed (0 while the pipeline moves; /readyz fails past the stall bound).",
        lambda g: g.dispatch_stalled_s,
    ),
    (
        "carillon_clock_offset_seconds",
        "Database clock minus this node's clock (median of the recent probes).",
        lambda g: g.clock_offset_s,
    ),
    (
        "carillon_clock_spread_seconds",
        "How far the recent probes of the database time disagree (planning pauses beyond "
        "the skew bound).",
        lambda g: g.clock_spread_s,
    ),
    (
        "carillon_clock_planning_allowed",
        "1 while the clock monitor lets this node plan, 0 while planning is paused.",
        lambda g: 1.0 if g.planning_allowed else 0.0,
    ),
    (
        "carillon_live_nodes",
        "Live nodes of the active region, as this node sees them.",
        lambda g: g.live_nodes,
    ),
    (
        "carillon_region_standby",
        "1 while this node's region is not the active one (it owns nothing), else 0.",
        lambda g: 1.0 if g.region_standby else 0.0,
    ),
    (
        "carillon_region_epoch",
        "The cluster's region epoch as this node last read it (moves on each failover).",
        lambda g: g.region_epoch,
    ),
)


def _node_families(g: NodeGauges | None) -> list[Metric]:
    lag = GaugeMetricFamily(
        "carillon_planner_lag_seconds",
        "How long ago the partition's earliest unplanned fire was due (0 while planning "
        "keeps ahead).",
        labels=["partition"],
    )
    age = GaugeMetricFamily(
        "carillon_checkpoint_age_seconds",
        "Now minus the partition's planning checkpoint (negative: ahead by the lookahead; "
        "grows while nothing is due).",
        labels=["partition"],
    )
    for p in g.partitions if g is not None else ():
        lag.add_metric([str(p.partition_id)], p.planner_lag_s)
        if p.checkpoint_age_s is not None:
            age.add_metric([str(p.partition_id)], p.checkpoint_age_s)
    families: list[Metric] = [lag, age]
    for name, documentation, pick in _NODE_GAUGES:
        families.append(_gauge(name, documentation, None if g is None else pick(g)))
    return families
