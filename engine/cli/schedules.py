"""``carillon schedule``: create, change, read and delete schedules through the API.

``add`` without an id creates a schedule under an id the API chooses (``POST``); with an id
it creates or replaces that schedule (``PUT``): the command line is then the schedule's
whole definition, and options left out take their defaults, so running it twice changes
nothing but the version. ``put ID`` is the same as ``add ID`` (its pre-API name). ``update``
changes only the fields given (``PATCH``). ``--if-version N`` makes ``add ID``, ``update``
and ``delete`` refuse (exit 1) if someone changed the schedule since version N.

The actions on one schedule (pause, resume, trigger, backfill, preview) are in
:mod:`engine.cli.schedule_actions`. A changed schedule reaches the node that owns it within
about a second, whichever node served the request.
"""

from __future__ import annotations

import argparse
from typing import Any, Final

from engine.cli import schedule_actions
from engine.cli.client import add_client_arguments, emit, open_client, segment
from engine.cli.flags import add_paging, json_object, next_page_note, usage, version
from engine.cli.output import NONE, cell, print_fields, print_table
from engine.core.dst import DstGap, DstOverlap
from engine.errors import InvalidField
from engine.model import CatchUpPolicy, OverlapPolicy

OVERLAP_INHERIT: Final = "default"
"""``update --overlap default``: follow the task type's overlap policy again."""
_FIELDS: Final = (  # flag destination -> API field, for add and update
    ("cron", "cron_expr"),
    ("task_type", "task_type"),
    ("tz", "timezone"),
    ("payload", "payload"),
    ("catch_up", "catch_up"),
    ("catch_up_window", "catch_up_window_s"),
    ("dst_gap", "dst_gap"),
    ("dst_overlap", "dst_overlap"),
    ("overlap", "overlap"),
)


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "schedule",
        help="create, change, pause, trigger and delete schedules (through the API)",
        description="Schedules, through the HTTP API.",
    )
    parser.set_defaults(handler=lambda _: usage(parser))
    actions = parser.add_subparsers(metavar="ACTION", parser_class=type(parser))
    for name in ("add", "put"):
        _add_add(actions, name)
    _add_update(actions)
    listing = actions.add_parser("list", help="list schedules, by id")
    listing.add_argument("--tenant", metavar="ID", help="only this tenant's")
    listing.add_argument("--task-type", metavar="NAME", help="only this task type's")
    state = listing.add_mutually_exclusive_group()
    state.add_argument("--enabled", dest="enabled", action="store_const", const=True)
    state.add_argument("--paused", dest="enabled", action="store_const", const=False)
    add_paging(listing, "schedules")
    add_client_arguments(listing)
    listing.set_defaults(handler=run_list)
    show = actions.add_parser("show", help="show one schedule")
    show.add_argument("schedule_id", metavar="ID")
    add_client_arguments(show)
    show.set_defaults(handler=run_show)
    delete = actions.add_parser("delete", help="delete a schedule (its queued runs are skipped)")
    delete.add_argument("schedule_id", metavar="ID")
    _add_if_version(delete)
    add_client_arguments(delete)
    delete.set_defaults(handler=run_delete)
    schedule_actions.add_actions(actions)


def _add_add(actions: Any, name: str) -> None:
    alias = name == "put"
    parser = actions.add_parser(
        name,
        help="create or replace a schedule (same as add with an id)"
        if alias
        else "create a schedule, or create or replace one with an id",
        description="Without ID: create a schedule under a new id. With ID: create it, or "
        "replace it whole (options left out take their defaults).",
    )
    parser.add_argument(
        "schedule_id",
        metavar="ID",
        nargs=None if alias else "?",
        help="schedule id" + ("" if alias else " (default: a new one, sch_<16 hex digits>)"),
    )
    parser.add_argument("--cron", required=True, metavar="EXPR", help="cron expression")
    parser.add_argument("--task-type", required=True, metavar="NAME")
    parser.add_argument(
        "--tenant", metavar="ID", help="tenant (default: the token's, else 'default')"
    )
    _add_settings(parser, overlap_choices=[p.value for p in OverlapPolicy])
    parser.add_argument("--paused", action="store_true", help="store it paused")
    _add_if_version(parser)
    add_client_arguments(parser)
    parser.set_defaults(handler=run_add)


def _add_update(actions: Any) -> None:
    parser = actions.add_parser(
        "update",
        help="change some fields of a schedule",
        description="Change the fields given; the others keep their values.",
    )
    parser.add_argument("schedule_id", metavar="ID")
    parser.add_argument("--cron", metavar="EXPR", help="cron expression")
    parser.add_argument("--task-type", metavar="NAME")
    _add_settings(
        parser,
        overlap_choices=[*(p.value for p in OverlapPolicy), OVERLAP_INHERIT],
        defaults=False,
    )
    state = parser.add_mutually_exclusive_group()
    state.add_argument("--paused", dest="enabled", action="store_const", const=False)
    state.add_argument("--enabled", dest="enabled", action="store_const", const=True)
    _add_if_version(parser)
    add_client_arguments(parser)
    parser.set_defaults(handler=run_update)


def _add_settings(
    parser: argparse.ArgumentParser, *, overlap_choices: list[str], defaults: bool = True
) -> None:
    def shown(default: str) -> str:
        return f" [{default}]" if defaults else ""

    parser.add_argument("--tz", metavar="ZONE", help="IANA time zone" + shown("UTC"))
    parser.add_argument("--payload", type=json_object, metavar="JSON", help="a JSON object")
    parser.add_argument(
        "--catch-up",
        choices=[p.value for p in CatchUpPolicy],
        help="what runs of the fires missed while no node could plan" + shown("latest"),
    )
    parser.add_argument(
        "--catch-up-window",
        type=float,
        metavar="S",
        help="missed fires older than this many seconds are not caught up" + shown("3600"),
    )
    parser.add_argument(
        "--dst-gap",
        choices=[p.value for p in DstGap],
        help="a wall time that does not exist" + shown("auto"),
    )
    parser.add_argument(
        "--dst-overlap",
        choices=[p.value for p in DstOverlap],
        help="a wall time that happens twice" + shown("auto"),
    )
    parser.add_argument(
        "--overlap",
        choices=overlap_choices,
        help="what a fire due while the previous run still goes does (default: the task "
        "type's policy, else allow)",
    )


def _add_if_version(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--if-version",
        type=version,
        metavar="N",
        help="refuse if the schedule is no longer at version N (If-Match)",
    )


def _fields(args: argparse.Namespace) -> dict[str, Any]:
    """The API fields the flags set (those left out are not sent)."""
    body: dict[str, Any] = {}
    for flag, field in _FIELDS:
        value = getattr(args, flag)
        if value is not None:
            body[field] = None if value == OVERLAP_INHERIT and flag == "overlap" else value
    return body


# --- handlers --------------------------------------------------------------------------------


def run_add(args: argparse.Namespace) -> int:
    body = _fields(args)
    if args.tenant is not None:
        body["tenant_id"] = args.tenant
    if args.paused:
        body["enabled"] = False
    if args.schedule_id is None and args.if_version is not None:
        raise InvalidField("--if-version needs the schedule's ID")
    with open_client(args) as api:
        if args.schedule_id is None:
            answer = api.call("POST", "/v1/schedules", body=body)
        else:
            path = f"/v1/schedules/{segment(args.schedule_id)}"
            answer = api.call("PUT", path, body=body, if_match=args.if_version)
    verb = "created" if answer.status == 201 else "replaced"
    emit(args, answer, lambda schedule: print(summary(verb, schedule)))
    return 0


def run_update(args: argparse.Namespace) -> int:
    body = _fields(args)
    if args.enabled is not None:
        body["enabled"] = args.enabled
    if not body:
        raise InvalidField("nothing to change: give at least one of the schedule's options")
    with open_client(args) as api:
        path = f"/v1/schedules/{segment(args.schedule_id)}"
        answer = api.call("PATCH", path, body=body, if_match=args.if_version)
    emit(args, answer, lambda schedule: print(summary("updated", schedule)))
    return 0


def run_list(args: argparse.Namespace) -> int:
    query = {
        "tenant_id": args.tenant,
        "task_type": args.task_type,
        "enabled": args.enabled,
        "limit": args.limit,
        "cursor": args.cursor,
    }
    with open_client(args) as api:
        answer = api.call("GET", "/v1/schedules", query=query)
    emit(args, answer, _print_list)
    next_page_note(answer.json(), "schedules")
    return 0


def run_show(args: argparse.Namespace) -> int:
    with open_client(args) as api:
        answer = api.call("GET", f"/v1/schedules/{segment(args.schedule_id)}")
    emit(args, answer, print_fields)
    return 0


def run_delete(args: argparse.Namespace) -> int:
    with open_client(args) as api:
        path = f"/v1/schedules/{segment(args.schedule_id)}"
        api.call("DELETE", path, if_match=args.if_version)
    if args.output == "table":  # the API answers 204 without a body: json prints nothing
        print(f"deleted schedule {args.schedule_id!r}; its queued executions were skipped")
    return 0


# --- output ----------------------------------------------------------------------------------


def summary(verb: str, schedule: dict[str, Any]) -> str:
    """``created schedule 'x' (version 1); next fire 2026-...Z``."""
    if not schedule.get("enabled", True):
        when = "none while paused"
    else:
        when = schedule.get("next_run_at") or "not planned yet"
    return (
        f"{verb} schedule {schedule['schedule_id']!r} (version {schedule['version']}); "
        f"next fire {when}"
    )


def _print_list(page: dict[str, Any]) -> None:
    schedules = page["items"]
    if not schedules:
        print("no schedules match")
        return
    print_table(
        ("SCHEDULE_ID", "TENANT", "CRON", "TZ", "TASK_TYPE", "STATE", "NEXT_RUN", "VER"),
        [
            (
                s["schedule_id"],
                s["tenant_id"],
                cell(s["cron_expr"]),
                s["timezone"],
                s["task_type"],
                "enabled" if s["enabled"] else "paused",
                cell(s.get("next_run_at")) if s["enabled"] else NONE,
                str(s["version"]),
            )
            for s in schedules
        ],
    )
