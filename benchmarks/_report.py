"""Shared helpers for benchmarks: machine, statistics, docs/benchmarks.md sections, results.

A full run of a benchmark replaces its own section of ``docs/benchmarks.md`` (between
``<!-- name:start -->`` and ``<!-- name:end -->``), writes its headline figures to
``docs/bench-results/<name>.json`` (:func:`write_results`) and rebuilds the "Targets" section
near the top from every results file there (:func:`write_targets`), so that the issue's
targets are read in one place, each beside the run that measured it. A ``--quick`` run writes
none of these.
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final, Literal

ROOT = Path(__file__).resolve().parents[1]
_OWN_OUTPUTS: Final = tuple(
    f":(exclude){path}" for path in ("docs/benchmarks.md", "docs/bench-results", "docs/img")
)
DOC = ROOT / "docs" / "benchmarks.md"
RESULTS = ROOT / "docs" / "bench-results"
HEADER = """# Benchmarks

Status: **works**: the targets below say which are met on this machine.

Figures written by the scripts in `benchmarks/` (`make bench`). Each section is replaced by
its script on every full run; medians, minima and maxima are over the stated number of runs,
measured side by side in one process, on a shared 2-core machine (expect +-25% noise).
"""


def machine() -> str:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{os.cpu_count()} cores, {cpu}, Python {platform.python_version()}, {platform.system()}"


def revision() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        )
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    # The benchmarks' own outputs do not count: in `make bench`, each benchmark after the
    # first would otherwise report the revision of the code it ran as dirty.
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no", "--", ".", *_OWN_OUTPUTS],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    return out.stdout.strip() + ("+dirty" if dirty else "")


def summary(samples: Sequence[float]) -> tuple[float, float, float]:
    """(median, min, max)."""
    return statistics.median(samples), min(samples), max(samples)


def image_link(path: Path | None, alt: str) -> list[str]:
    """A markdown image line for a plot in docs/img/ (and a blank line), or nothing."""
    return [] if path is None else [f"![{alt}](img/{path.name})", ""]


def _replace_block(text: str, name: str, body: str, *, top: bool) -> str:
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    block = f"{start}\n{body.rstrip()}\n{end}"
    if start in text and end in text:
        before, rest = text.split(start, 1)
        _, after = rest.split(end, 1)
        return before + block + after
    first = text.find("<!-- ")
    if top and first >= 0:  # before the first section, after the header
        return text[:first] + block + "\n\n" + text[first:]
    return text.rstrip() + "\n\n" + block + "\n"


def write_section(name: str, body: str, *, top: bool = False, doc: Path | None = None) -> None:
    """Replace (or add: at the end, or before the first section with ``top``) the section
    ``name`` of ``doc`` (docs/benchmarks.md)."""
    doc = doc or DOC
    text = doc.read_text() if doc.exists() else HEADER
    doc.write_text(_replace_block(text, name, body, top=top))


# --- machine-readable results and the targets ---------------------------------------------------


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def write_results(
    name: str,
    figures: Mapping[str, Sequence[float]],
    context: Mapping[str, Any],
    *,
    directory: Path | None = None,
) -> Path:
    """Write ``<directory>/<name>.json``: for each figure its median, min, max and the
    per-run samples (a timeout or other non-finite value as null), with the revision, date,
    machine and ``context`` (what the run measured: sizes, settings); ``directory``:
    docs/bench-results by default."""
    directory = directory or RESULTS
    directory.mkdir(parents=True, exist_ok=True)
    document = {
        "benchmark": name,
        "revision": revision(),
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine(),
        "context": dict(context),
        "figures": {
            key: {
                **dict(zip(("median", "min", "max"), map(_finite, summary(samples)), strict=True)),
                "runs": [_finite(s) for s in samples],
            }
            for key, samples in figures.items()
            if samples
        },
    }
    path = directory / f"{name}.json"
    path.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")
    return path


def read_results(directory: Path | None = None) -> dict[str, dict[str, Any]]:
    """Every results file in ``directory`` (docs/bench-results), by benchmark name
    (unreadable ones skipped)."""
    directory = directory or RESULTS
    results = {}
    for path in sorted(directory.glob("*.json")) if directory.exists() else []:
        try:
            results[path.stem] = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
    return results


@dataclass(frozen=True)
class Target:
    """One target of the issue, and where its measurement is found."""

    wording: str
    source: str
    """The benchmark whose results file holds the figure."""
    figure: str
    limit: float | str
    """The bound, or the name of the context value of the results that holds it."""
    op: Literal[">=", ">", "<="]
    every_run: bool = False
    """Met when the worst run meets it (else when the median does)."""
    unit: str = ""
    digits: int = 0
    requires: tuple[tuple[str, object], ...] = ()
    """Context values the run must have had for the figure to measure this target."""


TARGETS: Final = (
    Target(
        "Burst: >= 20,000 executions/s end to end (one node, smoothing off, 32 workers)",
        "bench_burst", "executions_per_s", 20_000.0, ">=", unit="/s",
        requires=(("schedules", 200_000), ("base_variant", "32 workers, smoothing off")),
    ),
    Target(
        "Burst: zero duplicates (all variants, every run)",
        "bench_burst", "duplicates", 0.0, "<=", every_run=True,
        requires=(("schedules", 200_000),),
    ),
    Target(
        "Burst: engine >= 50% of the raw PostgreSQL ceiling (insert+claim+complete) "
        "measured in the same run",
        "bench_burst", "ceiling_ratio", 0.5, ">=", unit="%",
        requires=(("schedules", 200_000), ("base_variant", "32 workers, smoothing off")),
    ),
    Target(
        "Burst: all 200,000 durable before their instant (lead > 0 in every run)",
        "bench_burst", "lead_s", 0.0, ">", every_run=True, unit=" s", digits=2,
        requires=(("schedules", 200_000),),
    ),
    Target(
        "Scale: 1,000,000 schedules in <= 400 MB RSS",
        "bench_scale", "rss_loaded_mb@1000000", 400.0, "<=", unit=" MB",
    ),
    Target(
        "Scale: 1,000,000 schedules cold-loaded in <= 15 s",
        "bench_scale", "load_s@1000000", 15.0, "<=", unit=" s", digits=1,
    ),
    Target(
        "Failover: RTO <= lease TTL + 2 s (every run)",
        "bench_failover", "rto_s", "rto_limit_s", "<=", every_run=True, unit=" s", digits=2,
    ),
    Target(
        "Peer: >= 10x the peer's executions/s on the same burst",
        "bench_peer", "rate_ratio", 10.0, ">=", unit="x", digits=1,
    ),
    Target(
        "Webhooks: >= 3,000 deliveries/s (one node, receiver latency 50 ms, default settings)",
        "bench_webhooks", "deliveries_per_s@1n50ms", 3_000.0, ">=", unit="/s",
        requires=(("webhooks", 20_000),),
    ),
    Target(
        "Webhooks: a 20,000 burst fully delivered within 10 s of its instant (one node, 50 ms)",
        "bench_webhooks", "all_delivered_s@1n50ms", 10.0, "<=", unit=" s", digits=2,
        requires=(("webhooks", 20_000),),
    ),
    Target(
        "Webhooks: >= 30% of the receiver's plain keep-alive ceiling measured in the same run "
        "(one node, 50 ms)",
        "bench_webhooks", "ratio@1n50ms", 0.3, ">=", unit="%",
        requires=(("webhooks", 20_000),),
    ),
    Target(
        "Webhooks: zero duplicates at the receiver and in the ledger (every variant and run)",
        "bench_webhooks", "duplicates", 0.0, "<=", every_run=True,
        requires=(("webhooks", 20_000),),
    ),
)  # fmt: skip
"""The targets of issues #8 (burst, scale, failover, peer) and #25 (webhooks), in the words
the Targets section shows."""


def _meets(value: float | None, target: Target, limit: float) -> bool:
    if value is None:  # a timeout, or nothing measured
        return False
    if target.op == ">=":
        return value >= limit
    return value > limit if target.op == ">" else value <= limit


def _value(value: float | None, target: Target) -> str:
    if value is None:
        return "none (timeout)"
    if target.unit == "%":
        return f"{100 * value:,.0f}%"
    return f"{value:,.{target.digits}f}{target.unit}"


def target_cells(target: Target, results: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """target | measured: median (worst run) | source | met? -- for one target."""
    document = results.get(target.source)
    figure = (document or {}).get("figures", {}).get(target.figure)
    if document is None or figure is None:
        return [target.wording, "not measured yet", "", ""]
    context = document.get("context", {})
    runs = figure.get("runs") or [None]
    worst = None if None in runs else (min(runs) if target.op != "<=" else max(runs))
    limit = context.get(target.limit) if isinstance(target.limit, str) else target.limit
    source = f"`{target.source}` {document.get('revision', '?')}, {document.get('date', '?')}"
    measured = f"{_value(figure['median'], target)} ({_value(worst, target)})"
    missing = [f"{k}={v!r}" for k, v in target.requires if context.get(k) != v]
    if limit is None or missing:
        why = ", ".join(missing) or f"no {target.limit}"
        return [target.wording, measured, source, f"n/a (run with {why})"]
    met = _meets(worst if target.every_run else figure["median"], target, float(limit))
    return [target.wording, measured, source, "met" if met else "**not met**"]


def targets_section(results: Mapping[str, Mapping[str, Any]]) -> str:
    """The "Targets" section: one row per target of ``TARGETS``."""
    lines = [
        "## Targets",
        "",
        "Rebuilt by every full benchmark run from `docs/bench-results/*.json` (each the "
        "headline figures of that benchmark's latest full run). A target is met when the "
        "median over the runs meets it, or, where the target says every run, the worst run "
        "does. 2-core machine shared with PostgreSQL.",
        "",
        "| target | measured: median (worst run) | source | met? |",
        "|---|---:|---|:-:|",
        *(f"| {' | '.join(target_cells(t, results))} |" for t in TARGETS),
    ]
    return "\n".join(lines)


def write_targets(*, directory: Path | None = None, doc: Path | None = None) -> None:
    """Rebuild the "Targets" section of docs/benchmarks.md from the results files."""
    write_section("targets", targets_section(read_results(directory)), top=True, doc=doc)
