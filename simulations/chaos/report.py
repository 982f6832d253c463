"""The chaos run's printed report (a plain-text table) and its JSON summary."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from simulations.chaos.checks import Figure
from simulations.chaos.runner import RunResult


def _utc(wall_s: float) -> str:
    return datetime.fromtimestamp(wall_s, UTC).strftime("%H:%M:%S")


def figure_table(figures: list[Figure]) -> list[str]:
    """The checks as aligned rows: name, value, bound, verdict (``VIOLATION`` when failed)."""
    width = max(len(f.name) for f in figures)
    value_width = max(len(f.value) for f in figures)
    lines = [f"  {'check':<{width}}  {'value':>{value_width}}  {'bound':<16}  verdict"]
    for figure in figures:
        verdict = {True: "ok", False: "VIOLATION", None: ""}[figure.ok]
        lines.append(
            f"  {figure.name:<{width}}  {figure.value:>{value_width}}  {figure.bound:<16}  "
            f"{verdict}".rstrip()
        )
    return lines


def render(result: RunResult) -> str:
    c = result.config
    lines = [
        f"Carillon chaos run{' (quick)' if c.quick else ''}: {c.schedules:,} schedules "
        f"'{c.cron_expr}' over {len(c.tenants)} tenants and {len(c.zones)} zones, "
        f"{c.nodes} nodes, {c.partitions} partitions",
        f"lease TTL {c.lease_ttl_s:g} s (margin {c.lease_safety_margin_s:g} s), attempt lease "
        f"{c.attempt_lease_s:g} s; checked window {_utc(result.window[0])}-"
        f"{_utc(result.window[1])} UTC ({result.window[1] - result.window[0]:g} s)",
        "",
        "timeline (t0 = first checked fire)",
    ]
    for wall, what in result.timeline:
        lines.append(f"  {wall - result.t0:+8.1f} s  {what}")
    lines += ["", "start-delay bound (docs/chaos.md)"]
    for name, value in result.bound.terms():
        lines.append(f"  {name:<58} {value:6.2f} s")
    lines.append(f"  {'= bound':<58} {result.bound.total_s:6.2f} s")
    lines += ["", *figure_table(result.figures)]
    stuck = result.details.get("fires", {}).get("not_succeeded_by_state") or {}
    if stuck:
        lines += ["", "missing fires, by their state in the ledger (status, error, attempt)"]
        lines += [f"  {count:6,}  {state}" for state, count in sorted(stuck.items())]
    t = result.timings
    lines += [
        "",
        f"setup {t.get('setup_s', 0):.1f} s, window and drain {t.get('window_and_drain_s', 0):.1f}"
        f" s, total {t.get('total_s', 0):.1f} s",
        f"RESULT: {'FAIL' if result.violations else 'PASS'}"
        + (f" ({len(result.violations)} violations)" if result.violations else ""),
    ]
    if result.workdir is not None:
        lines.append(f"logs: {result.workdir}")
    return "\n".join(lines)


def summary(result: RunResult) -> dict[str, Any]:
    return {
        "passed": not result.violations,
        "violations": [f.name for f in result.violations],
        "figures": [f.__dict__ for f in result.figures],
        "bound_s": result.bound.total_s,
        "bound_terms": dict(result.bound.terms()),
        "timeline": [(round(wall - result.t0, 2), what) for wall, what in result.timeline],
        "timings": result.timings,
        "details": result.details,
        "workdir": None if result.workdir is None else str(result.workdir),
    }


def write_json(result: RunResult, path: Path) -> None:
    path.write_text(json.dumps(summary(result), indent=2, default=str))
