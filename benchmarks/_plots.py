"""The benchmarks' plots: PNG files under docs/img/, named ``bench-*.png``.

matplotlib (the ``bench`` extra) is imported only when a plot is drawn, on the Agg backend
and through its object API (a ``Figure`` per plot, no pyplot state), so the benchmarks run
without it: :func:`draw` then prints one line saying the plots were skipped and returns
None. Only full runs draw; each plot function takes plain data, so a test can draw them
from small synthetic figures.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

IMG: Final = Path(__file__).resolve().parents[1] / "docs" / "img"
DPI: Final = 100
_SKIPPED: list[str] = []
"""Why plots were skipped, once said (a module-level list, not a global statement)."""


def _figure(width: float = 8.0, height: float = 4.0) -> Figure:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=DPI, layout="constrained")


def _save(figure: Figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path)
    return path


def _per_second(points: Sequence[tuple[int, int]]) -> tuple[list[int], list[int]]:
    """Counts per second as a step line: each second's count held until the next second,
    the missing seconds as 0, the last second closed at its end."""
    if not points:
        return [], []
    counts = dict(points)
    seconds = list(range(min(counts), max(counts) + 2))
    return seconds, [counts.get(s, 0) for s in seconds[:-1]] + [counts[max(counts)]]


def draw(
    plot: Callable[..., Path], name: str, *args: Any, directory: Path | None = None
) -> Path | None:
    """``plot(directory / name, *args)`` (docs/img by default); None, and one line said once,
    without matplotlib."""
    try:
        return plot((directory or IMG) / name, *args)
    except ImportError as error:
        if not _SKIPPED:
            _SKIPPED.append(str(error))
            print(f"plots skipped: {error} (pip install -e '.[bench]')", file=sys.stderr)
        return None


# --- the plots -------------------------------------------------------------------------------


def burst_rate(path: Path, series: Mapping[str, Sequence[tuple[int, int]]]) -> Path:
    """Starts per second since T, one line per variant: ``{label: [(second, starts)]}``."""
    figure = _figure()
    axes = figure.subplots()
    for label, points in series.items():
        seconds, counts = _per_second(points)
        axes.step(seconds, counts, where="post", label=label)
    axes.set_xlabel("seconds since T")
    axes.set_ylabel("executions started per second")
    axes.set_title("Burst: dispatch rate over time")
    axes.grid(alpha=0.3)
    axes.legend(fontsize="small")
    return _save(figure, path)


def burst_tenants(path: Path, quantiles: Mapping[str, Sequence[float]], title: str) -> Path:
    """A box per tenant from its start-delay quantiles p1, p25, p50, p75, p99."""
    figure = _figure(10.0, 4.0)
    axes = figure.subplots()
    stats = [
        {"label": t.removeprefix("tenant-"), "whislo": q[0], "q1": q[1], "med": q[2],
         "q3": q[3], "whishi": q[4], "fliers": []}
        for t, q in quantiles.items()
    ]  # fmt: skip
    axes.bxp(stats, showfliers=False)
    axes.set_xlabel("tenant")
    axes.set_ylabel("start delay (s): box p25-p75, whiskers p1-p99")
    axes.set_title(title)
    axes.grid(axis="y", alpha=0.3)
    return _save(figure, path)


def burst_weights(path: Path, classes: Sequence[tuple[str, float, float]]) -> Path:
    """Per weight class ``(label, share of the starts, share of the weight)``: two bars."""
    figure = _figure(6.0, 4.0)
    axes = figure.subplots()
    positions = range(len(classes))
    axes.bar([p - 0.2 for p in positions], [c[1] for c in classes], 0.4, label="share of starts")
    axes.bar([p + 0.2 for p in positions], [c[2] for c in classes], 0.4, label="share of weight")
    axes.set_xticks(list(positions), [c[0] for c in classes])
    axes.set_ylabel("share (contended period)")
    axes.set_title("Burst with weighted tenants: starts vs weights")
    axes.legend(fontsize="small")
    axes.grid(axis="y", alpha=0.3)
    return _save(figure, path)


def _limit(axes: Axes, limit: float, label: str) -> None:
    axes.axhline(limit, color="tab:red", linestyle="--", label=label)
    axes.legend(fontsize="small", loc="lower right")


def scale(
    path: Path,
    sizes: Sequence[tuple[int, tuple[float, float, float], tuple[float, float, float]]],
    rss_limit_mb: float,
    load_limit_s: float,
) -> Path:
    """Per schedule count ``(n, (rss median, min, max), (load median, min, max))``."""
    figure = _figure(8.0, 3.5)
    rss_axes, load_axes = figure.subplots(1, 2)
    labels = [f"{n:,}" for n, _, _ in sizes]
    panels = (
        (rss_axes, [rss for _, rss, _ in sizes], "RSS with every schedule loaded", "MB"),
        (load_axes, [load for _, _, load in sizes], "cold load", "s"),
    )
    for axes, spreads, title, unit in panels:
        medians = [m for m, _, _ in spreads]
        errors = [[m - lo for m, lo, _ in spreads], [hi - m for m, _, hi in spreads]]
        axes.bar(labels, medians, yerr=errors, capsize=4, color="tab:blue")
        axes.set_title(title)
        axes.set_xlabel("schedules")
        axes.set_ylabel(unit)
    _limit(rss_axes, rss_limit_mb, f"target {rss_limit_mb:g} MB")
    _limit(load_axes, load_limit_s, f"target {load_limit_s:g} s")
    return _save(figure, path)


def failover(
    path: Path, succeeded: Sequence[tuple[int, int]], reowned_s: float, resumed_s: float
) -> Path:
    """Executions succeeded per second since the kill (at 0), the moments marked."""
    figure = _figure()
    axes = figure.subplots()
    axes.step(*_per_second(succeeded), where="post")
    axes.axvline(0.0, color="tab:red", label="SIGKILL of the busiest node")
    if math.isfinite(reowned_s):
        axes.axvline(reowned_s, color="tab:green", linestyle="--", label="its partitions re-owned")
    if math.isfinite(resumed_s):
        axes.axvline(resumed_s, color="tab:orange", linestyle=":", label="their executions resume")
    axes.set_xlabel("seconds since the kill")
    axes.set_ylabel("executions succeeded per second")
    axes.set_title("Failover during a burst")
    axes.grid(alpha=0.3)
    axes.legend(fontsize="small")
    return _save(figure, path)


def peer(path: Path, sides: Sequence[tuple[str, tuple[float, float, float]]]) -> Path:
    """Executions/s per side ``(label, (median, min, max))``, log scale."""
    figure = _figure(7.0, 4.0)
    axes = figure.subplots()
    labels = [label for label, _ in sides]
    spreads = [(max(m, 1e-3), max(lo, 1e-3), max(hi, 1e-3)) for _, (m, lo, hi) in sides]
    medians = [m for m, _, _ in spreads]
    errors = [[m - lo for m, lo, _ in spreads], [hi - m for m, _, hi in spreads]]
    axes.bar(labels, medians, yerr=errors, capsize=4, color="tab:blue")
    axes.set_yscale("log")
    axes.set_ylabel("executions/s (log scale)")
    axes.set_title("The same burst: Carillon and APScheduler 4")
    axes.grid(axis="y", alpha=0.3, which="both")
    for position, (median, _, high) in enumerate(spreads):
        axes.annotate(
            f"{median:,.0f}/s", (position, high), (0, 3), textcoords="offset points", ha="center"
        )
    return _save(figure, path)
