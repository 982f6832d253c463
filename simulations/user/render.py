"""The ``carillon simulate`` report as text tables or one JSON document (``--output``).

Instants are shown in UTC (``Z``) where several zones meet (bursts, transitions) and in the
schedule's own zone, with its offset, where one schedule is concerned (its first and last
fire, a DST move), so a wall time can be read against the instant it became.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

from engine.cli.output import NONE, plural, print_table
from engine.core.instants import format_utc
from simulations import oracle
from simulations.scenario import describe
from simulations.user.report import DstMove, Report, ScheduleRow
from simulations.workload import SimSchedule

HANDLER_NOTE = (
    "the simulated handler replaces every task type (it succeeds at once unless handler "
    "faults are injected); expressions, zones, DST, catch-up and overlap policies are "
    "the schedules' own"
)

SCHEDULE_COLUMNS = (
    *("SCHEDULE", "CRON", "TZ", "DST", "EXPECTED", "SUCCEEDED", "SKIPPED", "DEAD"),
    *("UNFINISHED", "FIRST_FIRE", "LAST_FIRE", "MAX_DELAY_S"),
)


def print_text(report: Report) -> None:
    request, result = report.request, report.result
    print(
        f"carillon simulate: {plural(len(report.rows), 'schedule')} over {request.days:g} "
        f"days from {request.start.isoformat()} to {request.end.isoformat()}"
    )
    print(f"reproduce: {report.command}")
    print(HANDLER_NOTE)
    if report.disabled:
        print(f"not simulated (disabled): {', '.join(report.disabled)}")
    print("\nparameters:")
    for line in report.parameters:
        print(f"  {line}")
    print("\nschedules:")
    print_table(
        SCHEDULE_COLUMNS,
        [_row_cells(row) for row in report.rows],
    )
    skipped = [row for row in report.rows if row.skipped]
    for row in skipped:
        reasons = ", ".join(f"{k} {v}" for k, v in sorted(row.skipped.items()))
        print(f"  {row.schedule.sim.schedule_id} skipped: {reasons}")
    _print_dst(report.dst_moves)
    _print_bursts(report)
    totals = _totals(report)
    print(
        f"\nfires in the window: expected {totals['expected']}, succeeded "
        f"{totals['succeeded']}, skipped {totals['skipped']}, dead-letter "
        f"{totals['dead_letter']}, unfinished {totals['unfinished']}; max start delay "
        f"{_seconds(totals['max_start_delay_s'])} s (healthy bound {result.bound.healthy_s:g} s)"
    )
    injected = ", ".join(f"{k} {v}" for k, v in sorted(result.faults_injected.items()))
    print(f"faults injected: {injected or 'none'}")
    print(f"trace: {result.events} events, hash {result.digest}")
    print(f"violations: {len(result.violations)}")
    for violation in result.violations:
        print(f"  {violation}")
    print(f"reproduce: {report.command}")


def _row_cells(row: ScheduleRow) -> tuple[str, ...]:
    sim = row.schedule.sim
    expression = row.schedule.source_expr
    if " ".join(expression.split()) != sim.cron_expr:
        expression += f" ({sim.cron_expr})"
    return (
        sim.schedule_id,
        expression,
        sim.timezone,
        "/".join(_effective(sim)),
        str(row.expected),
        str(row.succeeded),
        str(sum(row.skipped.values())),
        str(row.dead_letter),
        str(row.unfinished),
        _local(row.first_fire),
        _local(row.last_fire),
        _seconds(row.max_start_delay_s),
    )


def _print_dst(moves: list[DstMove]) -> None:
    print(f"\nDST moves ({len(moves)}):")
    if not moves:
        print("  none: no fire in the window meets a DST transition")
    for m in moves:
        wall = m.wall.strftime("%Y-%m-%d %H:%M")
        policy = f"{m.policy} (auto)" if m.auto else m.policy
        what = "does not exist" if m.kind == "gap" else "happens twice"
        print(
            f"  {m.schedule_id}: {wall} {m.zone} {what} ({m.before} -> {m.after} at "
            f"{format_utc(m.transition)}); {m.kind} policy {policy}: {_outcome(m)}"
        )


def _outcome(m: DstMove) -> str:
    if not m.fires:
        return "not fired"
    fired = "fires at " + " and at ".join(
        f"{_local(f.instant, m.zone)} ({f.status})" for f in m.fires
    )
    if m.same_fire_as is not None:
        fired += f", one fire with {m.same_fire_as}'s"
    if m.passes_not_fired:
        fired += "; not at " + ", ".join(_local(i, m.zone) for i in m.passes_not_fired)
    return fired


def _print_bursts(report: Report) -> None:
    print("\nbursts (fires due per minute, the busiest first):")
    if not report.bursts:
        print("  none: no fire is due in the window")
        return
    print_table(
        ("  MINUTE", "FIRES", "TENANTS", "ZONES", "MAX_DELAY_S"),
        [
            (
                "  " + format_utc(b.minute),
                str(b.fires),
                _groups(b.tenants),
                _groups(b.zones),
                _seconds(b.max_start_delay_s),
            )
            for b in report.bursts
        ],
    )
    if report.busiest_second is not None:
        at, count = report.busiest_second
        print(f"  busiest second: {format_utc(at)} with {plural(count, 'fire')} due")


def to_json(report: Report) -> dict[str, Any]:
    request, result = report.request, report.result
    return {
        "command": report.command,
        "window": {
            "start": format_utc(request.start),
            "end": format_utc(request.end),
            "days": request.days,
        },
        "parameters": {
            "seed": request.seed,
            "nodes": request.nodes,
            "faults": list(request.faults),
            "fault_timeline": [describe(f) for f in result.params.faults],
            "lines": report.parameters,
        },
        "handler": HANDLER_NOTE,
        "not_simulated": list(report.disabled),
        "schedules": [_row_json(row) for row in report.rows],
        "dst_moves": [_move_json(m) for m in report.dst_moves],
        "bursts": {
            "busiest_minutes": [
                {
                    "minute": format_utc(b.minute),
                    "fires": b.fires,
                    "tenants": dict(b.tenants),
                    "zones": dict(b.zones),
                    "max_start_delay_s": b.max_start_delay_s,
                }
                for b in report.bursts
            ],
            "busiest_second": None
            if report.busiest_second is None
            else {"at": format_utc(report.busiest_second[0]), "fires": report.busiest_second[1]},
        },
        "totals": _totals(report) | {"healthy_bound_s": result.bound.healthy_s},
        "faults_injected": dict(sorted(result.faults_injected.items())),
        "trace_hash": result.digest,
        "violations": result.violations,
    }


def print_json(report: Report) -> None:
    print(json.dumps(to_json(report)))


def _row_json(row: ScheduleRow) -> dict[str, Any]:
    sim = row.schedule.sim
    gap, overlap = _effective(sim)
    return {
        "schedule_id": sim.schedule_id,
        "origin": row.schedule.origin,
        "tenant_id": sim.tenant_id,
        "cron_expr": row.schedule.source_expr,
        "evaluated_expr": sim.cron_expr,
        "timezone": sim.timezone,
        "dst_gap": gap,
        "dst_overlap": overlap,
        "catch_up": sim.catch_up,
        "overlap": sim.overlap,
        "expected": row.expected,
        "succeeded": row.succeeded,
        "skipped": dict(sorted(row.skipped.items())),
        "dead_letter": row.dead_letter,
        "unfinished": row.unfinished,
        "first_fire": None if row.first_fire is None else row.first_fire.isoformat(),
        "last_fire": None if row.last_fire is None else row.last_fire.isoformat(),
        "max_start_delay_s": row.max_start_delay_s,
    }


def _move_json(m: DstMove) -> dict[str, Any]:
    return {
        "schedule_id": m.schedule_id,
        "zone": m.zone,
        "wall": m.wall.isoformat(),
        "kind": m.kind,
        "policy": m.policy,
        "auto": m.auto,
        "transition": format_utc(m.transition),
        "offset_before": m.before,
        "offset_after": m.after,
        "fires": [
            {
                "planned_at": format_utc(f.instant),
                "local": _local(f.instant, m.zone),
                "status": f.status,
            }
            for f in m.fires
        ],
        "passes_not_fired": [format_utc(i) for i in m.passes_not_fired],
        "same_fire_as": m.same_fire_as,
    }


def _totals(report: Report) -> dict[str, Any]:
    delays = [r.max_start_delay_s for r in report.rows if r.max_start_delay_s is not None]
    return {
        "expected": sum(r.expected for r in report.rows),
        "succeeded": sum(r.succeeded for r in report.rows),
        "skipped": sum(sum(r.skipped.values()) for r in report.rows),
        "dead_letter": sum(r.dead_letter for r in report.rows),
        "unfinished": sum(r.unfinished for r in report.rows),
        "max_start_delay_s": max(delays) if delays else None,
    }


def _effective(sim: SimSchedule) -> tuple[str, str]:
    """The DST policies in force (``auto`` resolved by the cronie rule)."""
    return oracle.effective(sim.cron_expr, sim.dst_gap, sim.dst_overlap)


def _local(instant: datetime | None, zone: str | None = None) -> str:
    """``instant`` with its local offset (in ``zone`` when given); ``-`` for none."""
    if instant is None:
        return NONE
    if zone is not None:
        instant = instant.astimezone(ZoneInfo(zone))
    return instant.isoformat()


def _seconds(value: float | None) -> str:
    return NONE if value is None else f"{value:.3f}"


def _groups(counts: tuple[tuple[str, int], ...]) -> str:
    return ", ".join(f"{name} {count}" for name, count in counts)
