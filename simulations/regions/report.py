"""The game day's printed report (a table per variant) and its JSON summary."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from simulations.chaos.report import figure_table
from simulations.regions.gameday import VariantResult


def _utc(wall_s: float) -> str:
    return datetime.fromtimestamp(wall_s, UTC).strftime("%H:%M:%S")


def render(result: VariantResult) -> str:
    c, r = result.config, result.record
    cron = c.workload().cron_expr
    lines = [
        f"Carillon game day{' (quick)' if c.quick else ''}, {r.name}: {c.schedules:,} schedules "
        f"'{cron}', region A {c.region_a_nodes} nodes on the primary, region B "
        f"{c.region_b_nodes} on the standby, {c.partitions} partitions",
        f"lease TTL {c.lease_ttl_s:g} s, attempt lease {c.attempt_lease_s:g} s; region epoch "
        f"{r.epoch_before} -> {r.epoch_after}; checked window {_utc(r.window[0])}-"
        f"{_utc(r.window[1])} UTC ({r.window[1] - r.window[0]:g} s)",
        "",
        "timeline (t0 = first checked fire)",
    ]
    lines += [f"  {wall - r.t0:+8.1f} s  {what}" for wall, what in r.timeline]
    lines += ["", "recovery bound (docs/multi-region.md)"]
    lines += [f"  {name:<54} {value:6.2f} s" for name, value in result.bound.terms()]
    lines += ["", *figure_table(result.figures)]
    t = result.timings
    lines += [
        "",
        f"setup {t.get('setup_s', 0):.1f} s, total {t.get('total_s', 0):.1f} s",
        f"RESULT ({r.name}): {'FAIL' if result.violations else 'PASS'}"
        + (f" ({len(result.violations)} violations)" if result.violations else ""),
    ]
    return "\n".join(lines)


def summary(results: list[VariantResult]) -> dict[str, Any]:
    return {
        "passed": all(not result.violations for result in results),
        "variants": {
            result.record.name: {
                "passed": not result.violations,
                "violations": [f.name for f in result.violations],
                "figures": [f.__dict__ for f in result.figures],
                "bound_terms": dict(result.bound.terms()),
                "timeline": [
                    (round(wall - result.record.t0, 2), what)
                    for wall, what in result.record.timeline
                ],
                "switch_terms": result.record.switch_terms,
                "timings": result.timings,
            }
            for result in results
        },
    }


def write_json(results: list[VariantResult], path: Path) -> None:
    path.write_text(json.dumps(summary(results), indent=2, default=str))
