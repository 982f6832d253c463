"""``carillon executions list|show``: what ran, when, and how it ended, through the API.

``list`` shows one page of executions, oldest planned first, filtered by schedule, tenant,
task type, status and planned time; without ``--from`` it shows those planned in the last
``--minutes`` (60), by this machine's clock. ``carillon executions [filters]`` without an
action is ``list`` (the pre-API spelling). ``show`` prints one execution with every attempt
it made. A tenant token sees only its own tenant's executions.
"""

from __future__ import annotations

import argparse
from datetime import timedelta
from typing import Any, Final

from engine.cli.client import add_client_arguments, emit, open_client, segment
from engine.cli.flags import add_paging, next_page_note, rfc3339
from engine.cli.output import cell, one_line, print_fields, print_table
from engine.clock import SystemClock
from engine.core.instants import format_utc
from engine.errors import InvalidField
from engine.model import ExecutionStatus

RECENT_MINUTES_DEFAULT: Final = 60.0
ERROR_CHARS_SHOWN: Final = 60


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "executions",
        help="list executions or show one with its attempts (through the API)",
        description="Executions, through the HTTP API. Without an action: list.",
    )
    _add_list_options(parser)
    actions = parser.add_subparsers(metavar="ACTION", parser_class=type(parser))
    listing = actions.add_parser("list", help="list executions, oldest planned first")
    _add_list_options(listing)
    show = actions.add_parser("show", help="show an execution and its attempts")
    show.add_argument("execution_id", metavar="ID")
    add_client_arguments(show)
    show.set_defaults(handler=run_show)


def _add_list_options(parser: argparse.ArgumentParser) -> None:
    add_execution_filters(parser)
    parser.add_argument("--status", choices=[status.value for status in ExecutionStatus])
    parser.add_argument(
        "--minutes",
        type=float,
        metavar="M",
        help=f"planned in the last M minutes (without --from) [{RECENT_MINUTES_DEFAULT:g}]",
    )
    add_paging(parser, "executions")
    add_client_arguments(parser)
    parser.set_defaults(handler=run_list)


def add_execution_filters(parser: argparse.ArgumentParser) -> None:
    """The filters of executions and dead letters (the API's query parameters)."""
    parser.add_argument("--schedule", metavar="ID", help="only this schedule's")
    parser.add_argument("--tenant", metavar="ID", help="only this tenant's")
    parser.add_argument("--task-type", metavar="NAME", help="only this task type's")
    parser.add_argument(
        "--from", dest="start", type=rfc3339, metavar="RFC3339", help="planned at or after"
    )
    parser.add_argument("--to", dest="end", type=rfc3339, metavar="RFC3339", help="planned before")


def execution_query(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "schedule_id": args.schedule,
        "tenant_id": args.tenant,
        "task_type": args.task_type,
        "planned_from": args.start,
        "planned_to": args.end,
        "limit": args.limit,
        "cursor": args.cursor,
    }


def run_list(args: argparse.Namespace) -> int:
    query = execution_query(args)
    if args.start is not None and args.minutes is not None:
        raise InvalidField("give --from or --minutes, not both")
    if args.start is None:
        minutes = RECENT_MINUTES_DEFAULT if args.minutes is None else args.minutes
        if not minutes > 0:
            raise InvalidField(f"--minutes must be more than 0, got {minutes:g}")
        query["planned_from"] = format_utc(SystemClock().now() - timedelta(minutes=minutes))
    query["status"] = args.status
    with open_client(args) as api:
        answer = api.call("GET", "/v1/executions", query=query)
    emit(args, answer, _print_list)
    next_page_note(answer.json(), "executions")
    return 0


def run_show(args: argparse.Namespace) -> int:
    with open_client(args) as api:
        answer = api.call("GET", f"/v1/executions/{segment(args.execution_id)}")
    emit(args, answer, _print_detail)
    return 0


def error_of(execution: dict[str, Any]) -> str:
    code, message = execution.get("error_code"), execution.get("error_message")
    if code is None and message is None:
        return "-"
    return one_line(f"{code or '-'} {message or ''}", ERROR_CHARS_SHOWN)


def _print_list(page: dict[str, Any]) -> None:
    if not page["items"]:
        print("no executions match")
        return
    print_table(
        ("EXECUTION_ID", "TENANT", "TASK_TYPE", "STATUS", "ATTEMPT", "STARTED_AT", "ERROR"),
        [
            (
                e["execution_id"],
                e["tenant_id"],
                e["task_type"],
                e["status"],
                str(e["attempt"]),
                cell(e.get("started_at")),
                error_of(e),
            )
            for e in page["items"]
        ],
    )


def _print_detail(detail: dict[str, Any]) -> None:
    print_fields(detail["execution"])
    attempts = detail["attempts"]
    if not attempts:
        print("attempts: none finished")
        return
    print("attempts:")
    print_table(
        ("  ATTEMPT", "OUTCOME", "STARTED_AT", "FINISHED_AT", "ERROR"),
        [
            (
                f"  {a['attempt']}",
                a["outcome"],
                cell(a.get("started_at")),
                cell(a.get("finished_at")),
                error_of(a),
            )
            for a in attempts
        ],
    )
