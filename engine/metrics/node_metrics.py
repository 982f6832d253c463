""":class:`NodeMetrics`: the methods the actors call as work happens, and the scrape source.

Each method says what happened in the caller's terms; the callers are found by name (every
call is ``metrics.<method>(...)`` on the ``NodeMetrics`` the node injects).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from datetime import datetime

from prometheus_client import CollectorRegistry, Counter, Histogram

from engine.config import SLO_TARGET_S_DEFAULT
from engine.errors import ConfigError
from engine.metrics.declarations import (
    DISPATCHED_CLAIMED,
    DISPATCHED_FOLDED,
    FIXED_LABEL_VALUES_MAX,
    LABEL_VALUES_MAX_DEFAULT,
    SLO_WINDOW_STARTS_DEFAULT,
    SLO_WINDOW_STARTS_MAX,
    START_DELAY_BUCKETS_S,
    CappedLabel,
    Instruments,
    NodeGauges,
)
from engine.metrics.exposition import ScrapeCollector
from engine.metrics.tallies import CounterTally, HistogramTally, StartWindow
from engine.model import Execution

log = logging.getLogger("carillon.metrics")

_Starts = tuple[HistogramTally, CounterTally, CounterTally]
_Finished = tuple[CounterTally, HistogramTally, CounterTally | None]


class NodeMetrics:
    """The metrics of one node, on ``registry`` (a new one of its own by default)."""

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
        self._tenants = CappedLabel(label_values_max)
        self._task_types = CappedLabel(label_values_max)
        self._statuses = CappedLabel(FIXED_LABEL_VALUES_MAX)
        self._reasons = CappedLabel(FIXED_LABEL_VALUES_MAX)
        self._window = StartWindow(slo_window_starts)
        self._source: Callable[[], NodeGauges] | None = None
        # First, so that a scrape whose source fails already shows that failure's count.
        self.registry.register(ScrapeCollector(self))
        self._instruments = i = Instruments(
            self.registry,
            start_delay_buckets=sorted({*START_DELAY_BUCKETS_S, slo_target_s}),
            tenant_labels=tenant_labels,
        )
        self._tallies: dict[object, CounterTally | HistogramTally] = {}
        """One per counter or histogram child moved on the per-execution paths."""
        self._retries_tally = self._counter_tally(i.retries)
        self._starts_by_tenant: dict[str, _Starts] = {}
        self._starts_all: _Starts | None = (
            None
            if tenant_labels
            else (
                self._histogram_tally(i.start_delay),
                self._counter_tally(i.starts),
                self._counter_tally(i.starts_late),
            )
        )
        self._finished: dict[tuple[str, str], _Finished] = {}

    # -- hot paths ------------------------------------------------------------------------

    def executions_planned(self, planned_at: Sequence[datetime], now: datetime) -> None:
        """The planner wrote these executions as queued at ``now`` (skipped ones go to
        :meth:`skipped`)."""
        self._instruments.enqueued.inc(len(planned_at))
        observe = self._instruments.enqueue_delay.observe
        for at in planned_at:
            if at >= now:
                observe(0.0)
            else:
                observe((now - at).total_seconds())

    def skipped(self, reason: str, n: int = 1) -> None:
        """``n`` executions were recorded as skipped for ``reason`` (a catch-up policy's
        error code, :data:`SKIP_OVERLAP`, :data:`SKIP_CATCHUP_BULK` -- which counts ranges --
        or ``schedule_deleted``)."""
        self._instruments.skipped.labels(self._reasons(reason)).inc(n)

    def execution_started(
        self,
        execution: Execution,
        start_delay_s: float,
        exemplar: dict[str, str] | None = None,
        *,
        attempt: int | None = None,
    ) -> None:
        """A worker starts ``execution``'s attempt ``start_delay_s`` after its planned instant
        (on the clock monitor's corrected time), its setup done, just before the handler.
        ``exemplar``: the labels of the attempt's trace (tracing on, the span sampled), kept
        on the start-delay bucket the first attempt lands in (OpenMetrics exposition).
        ``attempt``: the attempt's number when it is not the execution's (a folded attempt
        runs under the next one)."""
        if (execution.attempt if attempt is None else attempt) > 1:
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
        if exemplar is not None:
            starts[0].exemplar(delay_s, exemplar)
        starts[1].n += 1
        if late:
            starts[2].n += 1
        self._window.record(late)

    def execution_finished(self, task_type: str, outcome: str, duration_s: float) -> None:
        """An attempt of ``task_type`` ended as ``outcome`` (``succeeded``, ``failed`` --
        a retry is scheduled -- or ``dead-letter``) after running ``duration_s`` (on the
        monotonic clock; 0 when its task type could not be set up). An abandoned attempt
        writes no completion and is not counted."""
        children = self._finished.get((task_type, outcome))
        if children is None:
            children = self._finished_children(task_type, outcome)
        children[0].n += 1
        children[1].observe(duration_s * 1000.0)
        if children[2] is not None:
            children[2].n += 1

    def executions_started_each(
        self,
        executions: Sequence[Execution],
        start_delays_s: Sequence[float],
        attempts: Sequence[int],
    ) -> None:
        """:meth:`execution_started` for each of ``executions`` with its start delay and its
        attempt's number (no exemplars: tracing is off), as a worker's batch of inline
        attempts reports them: the same observations, the counters added once."""
        starts = self._starts_all
        if starts is None:  # tenant labels: each start finds its tenant's children
            for execution, delay_s, number in zip(
                executions, start_delays_s, attempts, strict=True
            ):
                self.execution_started(execution, delay_s, attempt=number)
            return
        observe, record = starts[0].observe, self._window.record
        slo_target_s = self.slo_target_s
        retries = late_n = 0
        for delay_s, number in zip(start_delays_s, attempts, strict=True):
            if number > 1:
                retries += 1
                continue
            if not delay_s > 0.0:
                delay_s = 0.0
            late = delay_s > slo_target_s
            observe(delay_s)
            record(late)
            late_n += late
        self._retries_tally.n += retries
        starts[1].n += len(executions) - retries
        starts[2].n += late_n

    def executions_finished_each(
        self, task_type: str, outcome: str, durations_s: Sequence[float]
    ) -> None:
        """:meth:`execution_finished` for attempts of ``task_type`` that all ended as
        ``outcome``, one per duration: the same observations, the counters added once."""
        children = self._finished.get((task_type, outcome))
        if children is None:
            children = self._finished_children(task_type, outcome)
        children[0].n += len(durations_s)
        observe = children[1].observe
        for duration_s in durations_s:
            observe(duration_s * 1000.0)
        if children[2] is not None:
            children[2].n += len(durations_s)

    def attempts_dispatched(self, claimed: int, folded: int) -> None:
        """The dispatcher handed ``claimed`` attempts claimed in the ledger and ``folded``
        attempts started without a recorded claim to the workers."""
        dispatched = self._instruments.dispatched
        if claimed:
            dispatched.labels(DISPATCHED_CLAIMED).inc(claimed)
        if folded:
            dispatched.labels(DISPATCHED_FOLDED).inc(folded)

    def attempts_expired(self, n: int) -> None:
        """The redeliverer re-queued ``n`` attempts whose attempt lease ran out."""
        if n:
            self._instruments.expired.inc(n)

    def lease_acquired(self, n: int = 1) -> None:
        if n:
            self._instruments.lease_acquired.inc(n)

    def lease_released(self, n: int = 1) -> None:
        """``n`` leases were handed back (a rebalance's drain, or the node's shutdown)."""
        if n:
            self._instruments.lease_released.inc(n)

    def lease_lost(self, reason: str, n: int = 1) -> None:
        """``reason``: :data:`LEASE_LOST_REFUSED` (a renewal or a fenced write was refused)
        or :data:`LEASE_LOST_EXPIRED` (the trust window ran out: counted by the lease keeper
        or, when its deadline fires first, by the planner supervisor)."""
        self._instruments.lease_lost.labels(self._reasons(reason)).inc(n)

    def change_feed_gap(self) -> None:
        """The change feed found changes pruned past its watermark; planners reload."""
        self._instruments.change_feed_gaps.inc()

    # -- scrape time ----------------------------------------------------------------------

    def watch(self, source: Callable[[], NodeGauges]) -> None:
        """Read the node gauges from ``source`` at every scrape (the node assembles them from
        its actors' ``statistics()``)."""
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
            self._instruments.source_errors.inc()
            return None

    def window_starts(self) -> int:
        return self._window.starts

    def flush(self) -> None:
        """Add the tallies of the per-execution paths to their prometheus children (done at
        every collection of the registry, first; see ``engine/metrics/tallies.py``)."""
        for tally in self._tallies.values():
            tally.flush()

    # -- internals ------------------------------------------------------------------------

    def _counter_tally(self, child: Counter) -> CounterTally:
        tally = self._tallies.get(child)
        if tally is None:
            tally = self._tallies[child] = CounterTally(child)
        assert isinstance(tally, CounterTally)
        return tally

    def _histogram_tally(self, child: Histogram) -> HistogramTally:
        tally = self._tallies.get(child)
        if tally is None:
            tally = self._tallies[child] = HistogramTally(child)
        assert isinstance(tally, HistogramTally)
        return tally

    def _tenant_starts(self, tenant_id: str) -> _Starts:
        label = self._tenants(tenant_id)
        i = self._instruments
        children = (
            self._histogram_tally(i.start_delay.labels(label)),
            self._counter_tally(i.starts.labels(label)),
            self._counter_tally(i.starts_late.labels(label)),
        )
        if label == tenant_id:  # values folded into "other" stay uncached: the cache is bounded
            self._starts_by_tenant[tenant_id] = children
        return children

    def _finished_children(self, task_type: str, outcome: str) -> _Finished:
        label = self._task_types(task_type)
        status = self._statuses(outcome)
        i = self._instruments
        children = (
            self._counter_tally(i.attempts.labels(status, label)),
            self._histogram_tally(i.duration.labels(label)),
            self._counter_tally(i.dead.labels(label)) if outcome == "dead-letter" else None,
        )
        if label == task_type and status == outcome:
            self._finished[(task_type, outcome)] = children
        return children
