"""The cluster-wide pages: the overview (the last hour), the forecast (the next hours) and
the cluster's nodes and partitions.

The overview reads one :meth:`~engine.ledger.base.Ledger.executions_stats` call -- sixty
one-minute buckets of the executions planned in the last hour, the caller's tenant only
for a tenant token -- and derives every chart from it:

* **on time**: of the first attempts started, the share that started within the node's SLO
  target (``slo_target_s``) of their planned instant, as ``carillon_start_slo_ratio`` counts;
* **executions/s**: first attempts started per second, by the minute they started;
* **queue depth**: executions planned but neither started nor skipped at each minute's end
  (a running sum of planned minus started minus skipped; a backlog planned before the hour
  is not in it);
* **dead letters**: executions planned in each minute that are dead letters now;
* **plan lag**: how late the planner wrote each minute's executions, at worst.

An admin also sees the cluster's state now (the ``/v1/cluster`` route). The forecast is the
``/v1/forecast`` route itself, by tenant and task type, drawn as a heat map. The cluster
page is ``/v1/cluster`` (admin only: a tenant token gets its 403): the membership, every
partition's lease with its fencing token, its checkpoint and the planner lag its owner last
reported -- bounded by the partition count (at most 4,096) and the live nodes.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from itertools import accumulate
from typing import Any, Final

from starlette.responses import Response

from engine.api import routes_admin
from engine.api.console.charts import Chart, bar_chart, heat_map, line_chart
from engine.api.console.web import Visit, window
from engine.api.schemas import ClusterView, Forecast
from engine.core.instants import format_utc
from engine.ledger.params import ExecutionsBucket, ExecutionsStats

OVERVIEW_MINUTES: Final = 60
FORECAST_HOURS: Final = (1, 3, 6, 12, 24)
HEAT_ROWS_MAX: Final = 12
"""Series drawn as their own heat-map row; the rest are summed into one."""
PEAKS_SHOWN: Final = 5


def _percent(value: float) -> str:
    return f"{value * 100:.1f} %"


def _rate(value: float) -> str:
    return f"{value:.2f}/s" if value < 10 else f"{value:,.0f}/s"


def _count(value: float) -> str:
    return f"{value:,.0f}"


def _seconds(value: float) -> str:
    return f"{value:.1f} s"


def overview_charts(
    buckets: list[ExecutionsBucket], starts: list[datetime], slo_target_s: float
) -> list[Chart]:
    """The overview's five charts from one hour of execution statistics."""
    started = sum(b.started for b in buckets)
    on_time = sum(b.on_time for b in buckets)
    shares = [b.on_time / b.started if b.started else None for b in buckets]
    rates = [b.starts / 60 for b in buckets]
    arrived = accumulate(b.planned for b in buckets)
    left = accumulate(b.starts + b.skips for b in buckets)
    depth = [max(a - gone, 0) for a, gone in zip(arrived, left, strict=True)]
    dead = [b.dead_letters for b in buckets]
    lag = [b.plan_lag_s_max for b in buckets]
    slo = f"within {slo_target_s:g} s"
    return [
        line_chart(
            f"Started on time ({slo})",
            f"{_percent(on_time / started)} of {started:,} first starts"
            if started
            else "no first start this hour",
            shares,
            starts,
            _percent,
            top=1.0,
        ),
        bar_chart(
            "Executions started per second",
            f"{_rate(sum(rates) / len(rates))} on average, {_rate(max(rates))} at most",
            rates,
            starts,
            _rate,
        ),
        line_chart(
            "Queue depth (planned, not started)",
            f"{depth[-1]:,} waiting now, {max(depth):,} at most",
            [float(d) for d in depth],
            starts,
            _count,
        ),
        bar_chart(
            "Dead letters (by planned minute)",
            f"{sum(dead):,} this hour",
            [float(d) for d in dead],
            starts,
            _count,
        ),
        line_chart(
            "Planner lag (latest write after the planned instant)",
            f"{max(lag):.1f} s at worst",
            lag,
            starts,
            _seconds,
        ),
    ]


def _cluster_summary(view: ClusterView) -> dict[str, Any]:
    owned = [p for p in view.partitions if p.owner_id is not None]
    lags = [p.planner_lag_s for p in view.partitions if p.planner_lag_s is not None]
    offsets = [abs(n.clock_offset_s) for n in view.nodes if n.clock_offset_s is not None]
    return {
        "nodes": len(view.nodes),
        "regions": sorted({n.region for n in view.nodes}),
        "partitions": view.partition_count,
        "unowned": view.partition_count - len(owned),
        "lag_s": max(lags, default=None),
        "skew_s": max(offsets, default=None),
    }


async def overview(visit: Visit) -> Response:
    now = await visit.ledger.database_now()
    start, _ = window(now, OVERVIEW_MINUTES / 60)
    target_s = visit.services.slo_target_s
    buckets = await visit.ledger.executions_stats(
        ExecutionsStats(start, 60, OVERVIEW_MINUTES, target_s, visit.principal.tenant_id)
    )
    starts = [start + timedelta(minutes=i) for i in range(OVERVIEW_MINUTES)]
    cluster = None
    if visit.principal.is_admin:
        cluster = _cluster_summary(await visit.call(routes_admin.cluster))
    return visit.page(
        "overview.html",
        charts=overview_charts(buckets, starts, target_s),
        now=now,
        start=start,
        cluster=cluster,
    )


def _hours(visit: Visit) -> int:
    text = visit.query("hours")
    return int(text) if text in {str(h) for h in FORECAST_HOURS} else FORECAST_HOURS[-1]


async def forecast(visit: Visit) -> Response:
    hours = _hours(visit)
    tenant, task_type = visit.query("tenant_id"), visit.query("task_type")
    now = await visit.ledger.database_now()
    start = now.replace(second=0, microsecond=0)
    result: Forecast = await visit.call(
        routes_admin.get_forecast,
        query={
            "from": format_utc(start),
            "to": format_utc(start + timedelta(hours=hours)),
            "bucket": "1m",
            "by": "tenant,task_type",
        },
    )
    series = [
        s
        for s in result.series
        if tenant in (None, s.tenant_id) and task_type in (None, s.task_type)
    ]
    totals = [sum(column) for column in zip(*(s.counts for s in series), strict=True)]
    if not series:
        totals = [0] * len(result.bucket_starts)
    busy = [s for s in series if s.total]
    rows = [(f"{s.tenant_id} / {s.task_type}", s.counts) for s in busy[:HEAT_ROWS_MAX]]
    rest = busy[HEAT_ROWS_MAX:]
    if rest:
        merged = [sum(column) for column in zip(*(s.counts for s in rest), strict=True)]
        rows.append((f"{len(rest)} more series", merged))
    peaks = sorted(range(len(totals)), key=lambda i: (-totals[i], i))[:PEAKS_SHOWN]
    return visit.page(
        "forecast.html",
        heat=heat_map(rows, totals, start, result.bucket_s),
        peaks=[(result.bucket_starts[i], totals[i]) for i in peaks if totals[i]],
        series=series,
        total=sum(totals),
        approximated=result.approximated_schedules,
        start=start,
        hours=hours,
        choices=FORECAST_HOURS,
        tenant_id=tenant,
        task_type=task_type,
    )


# --- the cluster page ---------------------------------------------------------------------

LAG_WARN_S: Final = 5.0
"""Planner lag shown as a warning: the planner is this far behind its fires."""
SKEW_WARN_S: Final = 1.0
"""A node's clock this far from the database's is shown as a warning (the default skew
bound, past which a node stops planning, is 2 s)."""


async def cluster(visit: Visit) -> Response:
    view: ClusterView = await visit.call(routes_admin.cluster)
    owners = {node.node_id: node.region for node in view.nodes}
    return visit.page(
        "cluster.html",
        view=view,
        owners=owners,
        unowned=sum(1 for p in view.partitions if p.owner_id is None),
        lag_warn_s=LAG_WARN_S,
        skew_warn_s=SKEW_WARN_S,
    )
