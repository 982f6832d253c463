"""``carillon preview``: the next fires of a cron expression, as a schedule would have them.

Operators use it to check an expression, zone and DST policy before creating a schedule.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import msgspec

from engine.clock import SystemClock
from engine.core.dst import Adjustment, DstGap, DstOverlap
from engine.core.instants import format_local, format_utc, parse_instant
from engine.core.timetable import FIRES_PER_CALL_MAX, Fire, Timetable
from engine.errors import InvalidField
from engine.model import execution_id, validate_identifier

COUNT_DEFAULT = 10


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "preview",
        help="show the next fires of a cron expression",
        description=(
            "Show when a cron expression fires in a time zone under a DST policy. "
            "Fires that a daylight-saving rule moved or doubled are marked."
        ),
    )
    parser.add_argument("expression", metavar="EXPR", help="cron expression, e.g. '30 2 * * *'")
    parser.add_argument("--tz", default="UTC", metavar="ZONE", help="IANA zone (default UTC)")
    parser.add_argument(
        "--after", metavar="RFC3339", help="list fires after this instant (default: now)"
    )
    parser.add_argument(
        "--count", type=int, default=COUNT_DEFAULT, help=f"how many fires (default {COUNT_DEFAULT})"
    )
    parser.add_argument(
        "--dst-gap", choices=[policy.value for policy in DstGap], default=DstGap.AUTO.value
    )
    parser.add_argument(
        "--dst-overlap",
        choices=[policy.value for policy in DstOverlap],
        default=DstOverlap.AUTO.value,
    )
    parser.add_argument(
        "--id", dest="schedule_id", metavar="SCHEDULE_ID", help="schedule id (needed for H)"
    )
    parser.add_argument("--json", action="store_true", help="print a JSON array")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if not 1 <= args.count <= FIRES_PER_CALL_MAX:
        raise InvalidField(f"--count must be between 1 and {FIRES_PER_CALL_MAX}")
    if args.schedule_id is not None:
        validate_identifier(args.schedule_id, kind="schedule id")
    timetable = Timetable.compile(
        args.expression,
        args.tz,
        dst_gap=DstGap(args.dst_gap),
        dst_overlap=DstOverlap(args.dst_overlap),
        schedule_id=args.schedule_id,
    )
    after = (
        parse_instant(args.after, field="--after")
        if args.after is not None
        else SystemClock().now()
    )
    fires = timetable.fires(after, args.count)
    if args.json:
        rows = [_json_row(fire, timetable, args.schedule_id) for fire in fires]
        sys.stdout.write(msgspec.json.encode(rows).decode() + "\n")
    else:
        _print_human(fires, timetable, args.schedule_id)
    return 0


def _json_row(fire: Fire, timetable: Timetable, schedule_id: str | None) -> dict[str, Any]:
    row: dict[str, Any] = {
        "planned_at": format_utc(fire.planned_at),
        "local": format_local(fire.local(timetable.zone)),
        "wall": fire.wall.isoformat(),
        "dst": None if fire.adjustment is Adjustment.NONE else fire.adjustment.value,
    }
    if schedule_id is not None:
        row["execution_id"] = execution_id(schedule_id, fire.planned_at)
    return row


def _print_human(fires: list[Fire], timetable: Timetable, schedule_id: str | None) -> None:
    kind = "fixed-time" if timetable.spec.fixed_time else "wildcard"
    print(
        f"{timetable.spec.source!r} in {timetable.zone.key} ({kind}; DST gap: "
        f"{timetable.dst_gap}, overlap: {timetable.dst_overlap})"
    )
    if timetable.spec.expression != timetable.spec.source.strip():
        print(f"evaluated as {timetable.spec.expression!r}")
    for fire in fires:
        line = f"{format_utc(fire.planned_at)}  {format_local(fire.local(timetable.zone))}"
        if schedule_id is not None:
            line += f"  {execution_id(schedule_id, fire.planned_at)}"
        note = _note(fire, timetable)
        print(f"{line}  {note}" if note else line)


def _note(fire: Fire, timetable: Timetable) -> str:
    wall = fire.wall.strftime("%H:%M:%S" if timetable.spec.has_seconds else "%H:%M")
    if fire.adjustment is Adjustment.SHIFTED:
        return f"<- moved: {wall} does not exist (DST gap), fired at the end of the gap"
    doubled = timetable.dst_overlap is DstOverlap.BOTH
    if fire.adjustment is Adjustment.FIRST_PASS:
        return f"<- {wall} happens twice (DST overlap): " + (
            "first of two fires" if doubled else "fires on the first pass only"
        )
    if fire.adjustment is Adjustment.SECOND_PASS:
        return f"<- {wall} happens twice (DST overlap): " + (
            "second of two fires" if doubled else "fires on the second pass only"
        )
    return ""
