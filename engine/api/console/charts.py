"""Chart geometry for the console's inline SVG: numbers in, shapes out.

Pure and synchronous. The templates draw what these records describe (``macros.html``), so
every label and tooltip passes through the templates' escaping, and no chart needs a script
or a style attribute (colours come from classes in ``console.css``, which the
Content-Security-Policy allows). Each chart has a text summary for readers without SVG.

Coordinates are in the chart's own ``viewBox`` units; the page scales them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Final

from engine.core.instants import format_utc

CHART_WIDTH: Final = 300
CHART_HEIGHT: Final = 80
PLOT_TOP: Final = 14
"""The plot starts this far below the chart's top, leaving room for the scale's label."""
_PLOT: Final = CHART_HEIGHT - PLOT_TOP
HEAT_LEVELS: Final = 5
"""Shades of the heat map (classes ``heat1`` .. ``heat5``)."""
HEAT_CELLS_VISIBLE: Final = 480
"""A page-wide heat map shows about this many distinct cells; narrower ones are widened."""

Format = Callable[[float], str]


@dataclass(frozen=True)
class Mark:
    """A rectangle: a bar, or the invisible hover target of a bucket on a line."""

    x: float
    y: float
    width: float
    height: float
    title: str


@dataclass(frozen=True)
class Chart:
    title: str
    summary: str
    """The headline figure, also the chart's text alternative."""
    bars: list[Mark] = field(default_factory=list)
    line: str = ""
    """An SVG path (``M x y L x y ...``); a gap in the data starts a new ``M``."""
    targets: list[Mark] = field(default_factory=list)
    top: str = ""
    """The value at the top of the chart."""
    start: str = ""
    end: str = ""
    width: int = CHART_WIDTH
    height: int = CHART_HEIGHT


def _clock(instant: datetime) -> str:
    return format_utc(instant)[11:16]


def _scale(values: Sequence[float | None], top: float | None) -> float:
    highest = max((v for v in values if v is not None), default=0.0)
    return top if top is not None else (highest if highest > 0 else 1.0)


def bar_chart(
    title: str,
    summary: str,
    values: Sequence[float],
    starts: Sequence[datetime],
    fmt: Format,
) -> Chart:
    """One bar per bucket, scaled to the largest; each bar's title names its minute."""
    top = _scale(values, None)
    step = CHART_WIDTH / max(len(values), 1)
    bars = []
    for index, (value, start) in enumerate(zip(values, starts, strict=True)):
        height = _PLOT * value / top
        bars.append(
            Mark(
                round(index * step, 2),
                round(CHART_HEIGHT - height, 2),
                round(max(step - 1, 0.5), 2),
                round(height, 2),
                f"{_clock(start)} UTC: {fmt(value)}",
            )
        )
    first, last = _ends(starts)
    return Chart(title, summary, bars=bars, top=fmt(top), start=first, end=last)


def line_chart(
    title: str,
    summary: str,
    values: Sequence[float | None],
    starts: Sequence[datetime],
    fmt: Format,
    *,
    top: float | None = None,
) -> Chart:
    """A line through the buckets' values (``None``: no value, the line breaks there)."""
    highest = _scale(values, top)
    step = CHART_WIDTH / max(len(values), 1)
    parts: list[str] = []
    targets = []
    pen_down = False
    for index, (value, start) in enumerate(zip(values, starts, strict=True)):
        x = round(index * step + step / 2, 2)
        label = "no data" if value is None else fmt(value)
        hover = f"{_clock(start)} UTC: {label}"
        targets.append(Mark(round(index * step, 2), 0, round(step, 2), CHART_HEIGHT, hover))
        if value is None:
            pen_down = False
            continue
        y = round(CHART_HEIGHT - _PLOT * min(value, highest) / highest, 2)
        parts.append(f"{'L' if pen_down else 'M'}{x} {y}")
        pen_down = True
    first, last = _ends(starts)
    return Chart(
        title,
        summary,
        line=" ".join(parts),
        targets=targets,
        top=fmt(highest),
        start=first,
        end=last,
    )


def _ends(starts: Sequence[datetime]) -> tuple[str, str]:
    if not starts:
        return "", ""
    return _clock(starts[0]), _clock(starts[-1])


# --- the forecast heat map -------------------------------------------------------------------


@dataclass(frozen=True)
class HeatCell:
    x: int
    level: int
    title: str


@dataclass(frozen=True)
class HeatRow:
    label: str
    total: int
    cells: list[HeatCell]


@dataclass(frozen=True)
class HeatMap:
    columns: int
    rows: list[HeatRow]
    totals: str
    """The due executions of every row per bucket, as one SVG path of vertical strokes."""
    total_height: int
    ticks: list[tuple[int, str]]
    """``(column, label)`` of each hour mark on the time axis."""
    peak: int
    cell_width: int = 1
    """Cells are drawn this many columns wide, so that a lone minute stays visible."""


def heat_level(count: int, peak: int) -> int:
    """Shade 1..:data:`HEAT_LEVELS` of a non-zero cell, logarithmic: a spike of 10,000 and a
    steady 5 per minute are both visible."""
    if count <= 0 or peak <= 0:
        return 0
    return min(HEAT_LEVELS, 1 + int((HEAT_LEVELS - 1) * math.log1p(count) / math.log1p(peak)))


def heat_map(
    series: Sequence[tuple[str, Sequence[int]]],
    totals: Sequence[int],
    start: datetime,
    bucket_s: int,
) -> HeatMap:
    """Rows of cells, one per non-zero bucket of each series, shaded against the largest
    cell of the whole map; above them the total per bucket."""
    peak = max((max(counts, default=0) for _, counts in series), default=0)
    rows = []
    for label, counts in series:
        cells = [
            HeatCell(
                index,
                heat_level(count, peak),
                f"{label} at {_clock(start + timedelta(seconds=index * bucket_s))} UTC: "
                f"{count:,} due",
            )
            for index, count in enumerate(counts)
            if count
        ]
        rows.append(HeatRow(label, sum(counts), cells))
    total_height = 60
    top = max(totals, default=0) or 1
    strokes = [
        f"M{index + 0.5} {total_height}V{round(total_height - total_height * n / top, 2)}"
        for index, n in enumerate(totals)
        if n
    ]
    span_s = len(totals) * bucket_s
    tick_s = 900 if span_s <= 3 * 3600 else 3600 if span_s <= 12 * 3600 else 7200
    every = max(tick_s // bucket_s, 1)
    since_midnight = start.hour * 3600 + start.minute * 60 + start.second
    first = (-since_midnight // bucket_s) % every
    ticks = [
        (column, _clock(start + timedelta(seconds=column * bucket_s)))
        for column in range(first, len(totals), every)
    ]
    return HeatMap(
        len(totals),
        rows,
        "".join(strokes),
        total_height,
        ticks,
        max(totals, default=0),
        cell_width=max(1, len(totals) // HEAT_CELLS_VISIBLE),
    )
