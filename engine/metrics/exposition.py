"""The exposition: what ``GET /metrics`` serves, and the gauges built at scrape time.

:class:`ScrapeCollector` is registered first on a node's registry, so it is collected first:
it adds the fast tallies to their children (``engine/metrics/tallies.py``) before the
counters and histograms are read, and builds the gauge families from the node's source (see
:meth:`NodeMetrics.watch <engine.metrics.NodeMetrics.watch>`) and the start SLO's window.
Collect (scrape) from the trio thread: the source reads actor state that only that thread
writes, and the tallies are added to the children there.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Protocol

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import CONTENT_TYPE_LATEST, choose_encoder, generate_latest
from prometheus_client.metrics_core import GaugeMetricFamily, Metric

from engine.metrics.declarations import (
    CHECKPOINT_AGE,
    NODE_GAUGES,
    PLANNER_LAG,
    SLO_RATIO,
    SLO_TARGET,
    SLO_WINDOW_STARTS,
    GaugeDeclaration,
    NodeGauges,
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


class Scraped(Protocol):
    """What the scrape-time families are read from (a :class:`~engine.metrics.NodeMetrics`)."""

    @property
    def slo_target_s(self) -> float: ...

    def flush(self) -> None: ...

    def gauges(self) -> NodeGauges | None: ...

    def slo_ratio(self) -> float | None: ...

    def window_starts(self) -> int: ...


class ScrapeCollector:
    """The gauges computed at scrape time, from ``scraped`` and its node source."""

    def __init__(self, scraped: Scraped) -> None:
        self._scraped = scraped

    def describe(self) -> Iterable[Metric]:
        return self._families(None)

    def collect(self) -> Iterable[Metric]:
        # Registered first, so collected first: the counters and histograms collected after
        # it show every tally.
        self._scraped.flush()
        return self._families(self._scraped.gauges())

    def _families(self, gauges: NodeGauges | None) -> list[Metric]:
        s = self._scraped
        ratio = s.slo_ratio()
        families = _node_families(gauges)
        families += [
            _gauge(SLO_RATIO, math.nan if ratio is None else ratio),
            _gauge(SLO_WINDOW_STARTS, s.window_starts()),
            _gauge(SLO_TARGET, s.slo_target_s),
        ]
        return families


def _node_families(g: NodeGauges | None) -> list[Metric]:
    """The families of the node's gauges; without gauges (no source, or it failed) every
    family is there, without a series."""
    lag = GaugeMetricFamily(*PLANNER_LAG, labels=["partition"])
    age = GaugeMetricFamily(*CHECKPOINT_AGE, labels=["partition"])
    for p in g.partitions if g is not None else ():
        lag.add_metric([str(p.partition_id)], p.planner_lag_s)
        if p.checkpoint_age_s is not None:
            age.add_metric([str(p.partition_id)], p.checkpoint_age_s)
    families: list[Metric] = [lag, age]
    for declaration, pick in NODE_GAUGES:
        families.append(_gauge(declaration, None if g is None else pick(g)))
    return families


def _gauge(declaration: GaugeDeclaration, value: float | None) -> GaugeMetricFamily:
    family = GaugeMetricFamily(*declaration)
    if value is not None:
        family.add_metric([], value)
    return family
