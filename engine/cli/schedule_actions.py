"""``carillon schedule pause|resume|trigger|backfill|preview``: acting on one schedule.

* ``pause`` skips its queued runs and plans no more; ``resume`` starts again from the next
  fire after now (a week's pause does not fire a week of runs). Both are idempotent.
* ``trigger`` runs it now, under an execution id of its own (its planned fires are
  untouched); ``--reason`` goes to the audit trail.
* ``backfill --from --to`` plans the fires of ``[from, to)`` in the past under their normal
  ids: a fire that already has an execution is left exactly as it is, and so is one whose
  execution retention (or a dead-letter purge) deleted -- every fire up to the schedule's
  purged history is skipped, and counted --, so a backfill never runs anything twice and
  may be repeated.
* ``preview`` lists its next fires as the engine will plan them (compare ``carillon preview
  EXPR``, which needs no schedule and no API).
"""

from __future__ import annotations

import argparse
from typing import Any

from engine.cli.client import add_client_arguments, emit, open_client, segment
from engine.cli.flags import rfc3339
from engine.cli.output import plural, print_table
from engine.core.timetable import FIRES_PER_CALL_MAX

PREVIEW_COUNT_DEFAULT = 10


def add_actions(actions: Any) -> None:
    for name, summary in (
        ("pause", "pause a schedule (its queued runs are skipped)"),
        ("resume", "resume a paused schedule from its next fire"),
    ):
        parser = actions.add_parser(name, help=summary)
        parser.add_argument("schedule_id", metavar="ID")
        add_client_arguments(parser)
        parser.set_defaults(handler=run_pause_or_resume, action=name)
    trigger = actions.add_parser("trigger", help="run a schedule now, under an id of its own")
    trigger.add_argument("schedule_id", metavar="ID")
    trigger.add_argument("--reason", metavar="TEXT", help="why, kept in the audit trail")
    add_client_arguments(trigger)
    trigger.set_defaults(handler=run_trigger)
    _add_backfill(actions)
    preview = actions.add_parser("preview", help="the next fires of a schedule")
    preview.add_argument("schedule_id", metavar="ID")
    preview.add_argument(
        "--count",
        type=int,
        default=PREVIEW_COUNT_DEFAULT,
        metavar="N",
        help=f"how many, 1-{FIRES_PER_CALL_MAX} [{PREVIEW_COUNT_DEFAULT}]",
    )
    preview.add_argument("--after", type=rfc3339, metavar="RFC3339", help="[now]")
    add_client_arguments(preview)
    preview.set_defaults(handler=run_preview)


def _add_backfill(actions: Any) -> None:
    parser = actions.add_parser(
        "backfill",
        help="plan a schedule's past fires in [--from, --to) (never duplicates a run)",
        description="Plan the fires of [FROM, TO) under their normal execution ids; fires "
        "that have an execution already are left as they are.",
    )
    parser.add_argument("schedule_id", metavar="ID")
    parser.add_argument("--from", dest="start", required=True, type=rfc3339, metavar="RFC3339")
    parser.add_argument(
        "--to", dest="end", required=True, type=rfc3339, metavar="RFC3339", help="exclusive"
    )
    parser.add_argument("--reason", metavar="TEXT", help="why, kept in the audit trail")
    add_client_arguments(parser)
    parser.set_defaults(handler=run_backfill)


def _reason(args: argparse.Namespace) -> dict[str, Any]:
    return {} if args.reason is None else {"reason": args.reason}


def _path(args: argparse.Namespace, action: str) -> str:
    return f"/v1/schedules/{segment(args.schedule_id)}{action}"


def run_pause_or_resume(args: argparse.Namespace) -> int:
    with open_client(args) as api:
        answer = api.call("POST", _path(args, f":{args.action}"), body={})

    def render(schedule: dict[str, Any]) -> None:
        state = "paused" if args.action == "pause" else "resumed"
        when = "" if args.action == "pause" else f"; next fire {schedule.get('next_run_at')}"
        print(f"{state} schedule {schedule['schedule_id']!r} (version {schedule['version']}){when}")

    emit(args, answer, render)
    return 0


def run_trigger(args: argparse.Namespace) -> int:
    with open_client(args) as api:
        answer = api.call("POST", _path(args, ":trigger"), body=_reason(args))
    emit(
        args,
        answer,
        lambda execution: print(
            f"triggered schedule {args.schedule_id!r}: execution {execution['execution_id']} "
            f"({execution['status']})"
        ),
    )
    return 0


def run_backfill(args: argparse.Namespace) -> int:
    body = {"from": args.start, "to": args.end, **_reason(args)}
    with open_client(args) as api:
        answer = api.call("POST", _path(args, ":backfill"), body=body)

    def render(result: dict[str, Any]) -> None:
        purged = result.get("skipped_purged", 0)
        existing = result["requested"] - result["inserted"] - purged
        line = (
            f"backfilled schedule {args.schedule_id!r} from {args.start} to {args.end}: "
            f"{plural(result['requested'], 'fire')}, {result['inserted']} planned now, "
            f"{existing} had an execution already"
        )
        if purged:
            line += (
                f", {purged} skipped: the schedule's history through "
                f"{result['purged_through']} was purged (they may have run)"
            )
        print(line)

    emit(args, answer, render)
    return 0


def run_preview(args: argparse.Namespace) -> int:
    query = {"count": args.count, "after": args.after}
    with open_client(args) as api:
        answer = api.call("GET", _path(args, "/preview"), query=query)

    def render(preview: dict[str, Any]) -> None:
        print(f"schedule {preview['schedule_id']!r} in {preview['timezone']}:")
        print_table(
            ("PLANNED_AT", "LOCAL_TIME", "DST"),
            [
                (
                    fire["planned_at"],
                    fire["local_time"],
                    "-" if fire["adjustment"] == "none" else fire["adjustment"],
                )
                for fire in preview["fires"]
            ],
        )

    emit(args, answer, render)
    return 0
