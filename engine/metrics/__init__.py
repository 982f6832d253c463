"""Every Prometheus metric of a node, declared once, on the node's own registry.

:class:`NodeMetrics` owns a :class:`~prometheus_client.CollectorRegistry` per node (never the
global default one), so several nodes in one process -- tests, simulations -- never share a
series. The node creates one and passes it to the actors like any dependency; they call its
methods as work happens. Gauges of the node's state -- queue depth, planner lag, checkpoint
age, clock skew -- are read only when scraped, from the :class:`NodeGauges` the node assembles
from its actors' ``statistics()`` (the source given to :meth:`NodeMetrics.watch`).
``docs/ops/`` holds the alerting rules, the Grafana dashboard and the runbook built on them.

The package, by concern (it imports neither the node nor the actors):

``engine/metrics/declarations.py``
    every name, type, label, help text and bucket; :class:`NodeGauges`
``engine/metrics/tallies.py``
    the plain-Python tallies of the per-execution paths (which never take prometheus-client's
    per-call lock) and the start SLO's window
``engine/metrics/exposition.py``
    :func:`render` for ``GET /metrics``, and the scrape-time collector that adds the tallies
    to their children and builds the gauge families
``engine/metrics/node_metrics.py``
    :class:`NodeMetrics`, the methods the actors call

Names: the five the design fixes keep their names verbatim (``scheduler_lag_seconds``,
``due_jobs_enqueued_total``, ``execution_attempts_total``, ``execution_duration_ms``,
``dead_letter_total``); every other one starts with ``carillon_``.
``tests/test_metrics_exposition.py`` pins every family.

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
* Every read of the registry is exact: the tallies are added to their children at each
  collection, before the counters and histograms are read.
* Scrape-time series exist only while true: a partition this node stops owning drops out of
  ``carillon_planner_lag_seconds`` at the next scrape instead of freezing at its last value.

Render from the trio thread: the source reads actor state that only that thread writes, and
the tallies are added to the children there.
"""

from engine.metrics.declarations import (
    DISPATCHED_CLAIMED,
    DISPATCHED_FOLDED,
    DURATION_BUCKETS_MS,
    ENQUEUE_DELAY_BUCKETS_S,
    FIXED_LABEL_VALUES_MAX,
    LABEL_VALUES_MAX_DEFAULT,
    LEASE_LOST_EXPIRED,
    LEASE_LOST_REFUSED,
    OTHER,
    SKIP_CATCHUP_BULK,
    SKIP_OVERLAP,
    SLO_WINDOW_STARTS_DEFAULT,
    SLO_WINDOW_STARTS_MAX,
    START_DELAY_BUCKETS_S,
    NodeGauges,
    PartitionGauges,
)
from engine.metrics.exposition import render
from engine.metrics.node_metrics import NodeMetrics

__all__ = [
    "DISPATCHED_CLAIMED",
    "DISPATCHED_FOLDED",
    "DURATION_BUCKETS_MS",
    "ENQUEUE_DELAY_BUCKETS_S",
    "FIXED_LABEL_VALUES_MAX",
    "LABEL_VALUES_MAX_DEFAULT",
    "LEASE_LOST_EXPIRED",
    "LEASE_LOST_REFUSED",
    "OTHER",
    "SKIP_CATCHUP_BULK",
    "SKIP_OVERLAP",
    "SLO_WINDOW_STARTS_DEFAULT",
    "SLO_WINDOW_STARTS_MAX",
    "START_DELAY_BUCKETS_S",
    "NodeGauges",
    "NodeMetrics",
    "PartitionGauges",
    "render",
]
