"""``carillon schedule`` and ``carillon executions``: manage schedules and look at what ran.

A small operator's client over the ledger until the HTTP API exists. ``schedule put`` is
declarative: it creates the schedule or replaces it (keeping its id), validating the
expression, zone and DST policy first and setting ``next_run_at`` to its next fire, so the
owning node plans it within about a second.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import timedelta
from typing import Any

import msgspec

from engine.cli.task_types import add_database_argument, run_with_ledger
from engine.core.dst import DstGap, DstOverlap
from engine.core.instants import format_utc
from engine.core.timetable import Timetable
from engine.errors import InvalidField, NotFound
from engine.ledger.base import (
    PAGE_SIZE_MAX,
    ExecutionsQuery,
    Ledger,
    Page,
    SchedulesCreate,
    SchedulesDelete,
    SchedulesList,
    SchedulesUpdate,
)
from engine.model import (
    CatchUpPolicy,
    Execution,
    ExecutionStatus,
    OverlapPolicy,
    Schedule,
    check_payload_size,
    validate_identifier,
)


def add_parser(commands: Any) -> None:
    parser = commands.add_parser("schedule", help="create, replace, list and delete schedules")
    parser.set_defaults(handler=lambda _: _usage(parser))
    actions = parser.add_subparsers(metavar="ACTION", parser_class=type(parser))
    put = actions.add_parser("put", help="create or replace a schedule")
    put.add_argument("schedule_id", metavar="ID")
    put.add_argument("--cron", required=True, metavar="EXPR", help="cron expression")
    put.add_argument("--task-type", required=True, metavar="NAME")
    put.add_argument("--tenant", default="default", metavar="ID", help="tenant [default]")
    put.add_argument("--tz", default="UTC", metavar="ZONE", help="IANA zone [UTC]")
    put.add_argument("--payload", default="{}", metavar="JSON", help="JSON object [{}]")
    put.add_argument("--paused", action="store_true", help="store it disabled")
    put.add_argument("--catch-up", choices=[p.value for p in CatchUpPolicy], default="latest")
    put.add_argument("--dst-gap", choices=[p.value for p in DstGap], default="auto")
    put.add_argument("--dst-overlap", choices=[p.value for p in DstOverlap], default="auto")
    put.add_argument(
        "--overlap",
        choices=[p.value for p in OverlapPolicy],
        default=None,
        help="what a fire due while the previous run is still going does (default: the task "
        "type's overlap policy, else allow)",
    )
    add_database_argument(put)
    put.set_defaults(handler=run_put)
    listing = actions.add_parser("list", help="list schedules")
    listing.add_argument("--tenant", metavar="ID")
    listing.add_argument("--limit", type=int, default=100)
    listing.add_argument("--json", action="store_true")
    add_database_argument(listing)
    listing.set_defaults(handler=run_list)
    delete = actions.add_parser("delete", help="delete a schedule (its pending runs are skipped)")
    delete.add_argument("schedule_id", metavar="ID")
    add_database_argument(delete)
    delete.set_defaults(handler=run_delete)

    executions = commands.add_parser(
        "executions", help="list recent executions (planned in the last --minutes), oldest first"
    )
    executions.add_argument("--minutes", type=float, default=60.0, help="how far back [60]")
    executions.add_argument("--schedule", metavar="ID")
    executions.add_argument("--tenant", metavar="ID")
    executions.add_argument("--status", choices=[s.value for s in ExecutionStatus])
    executions.add_argument("--limit", type=int, default=50)
    executions.add_argument("--json", action="store_true")
    add_database_argument(executions)
    executions.set_defaults(handler=run_executions)


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2


def run_put(args: argparse.Namespace) -> int:
    validate_identifier(args.schedule_id, kind="schedule id")
    validate_identifier(args.tenant, kind="tenant id")
    try:
        payload = json.loads(args.payload)
    except json.JSONDecodeError as exc:
        raise InvalidField(f"--payload is not JSON: {exc}") from None
    if not isinstance(payload, dict):
        raise InvalidField("--payload must be a JSON object")
    check_payload_size(payload)
    gap, overlap = DstGap(args.dst_gap), DstOverlap(args.dst_overlap)
    timetable = Timetable.compile(
        args.cron, args.tz, dst_gap=gap, dst_overlap=overlap, schedule_id=args.schedule_id
    )

    async def put(ledger: Ledger) -> tuple[str, Schedule]:
        now = await ledger.database_now()
        schedule = Schedule(
            schedule_id=args.schedule_id,
            tenant_id=args.tenant,
            cron_expr=args.cron,
            timezone=args.tz,
            task_type=args.task_type,
            payload=payload,
            enabled=not args.paused,
            next_run_at=timetable.next_fire(now).planned_at,
            catch_up=CatchUpPolicy(args.catch_up),
            dst_gap=gap,
            dst_overlap=overlap,
            overlap=None if args.overlap is None else OverlapPolicy(args.overlap),
        )
        try:
            current = await ledger.schedules_get(args.schedule_id)
        except NotFound:
            return "created", (await ledger.schedules_create(SchedulesCreate([schedule])))[0]
        updated = await ledger.schedules_update(SchedulesUpdate(schedule, current.version))
        return "replaced", updated

    verb, stored = run_with_ledger(args, put)
    when = format_utc(stored.next_run_at) if stored.next_run_at else "never (paused)"
    print(f"{verb} schedule {stored.schedule_id!r} (version {stored.version}); next fire {when}")
    return 0


def run_list(args: argparse.Namespace) -> int:
    if not 1 <= args.limit <= PAGE_SIZE_MAX:
        raise InvalidField(f"--limit must be between 1 and {PAGE_SIZE_MAX}")
    page = run_with_ledger(
        args,
        lambda ledger: ledger.schedules_list(
            SchedulesList(tenant_id=args.tenant, limit=args.limit)
        ),
    )
    if args.json:
        print(msgspec.json.encode(page.items).decode())
        return 0
    for s in page.items:
        state = "enabled" if s.enabled else "paused"
        when = format_utc(s.next_run_at) if s.next_run_at else "-"
        print(f"{s.schedule_id}  {s.cron_expr!r} {s.timezone}  {s.task_type}  {state}  next {when}")
    return 0


def run_delete(args: argparse.Namespace) -> int:
    run_with_ledger(args, lambda ledger: ledger.schedules_delete(SchedulesDelete(args.schedule_id)))
    print(f"deleted schedule {args.schedule_id!r}; its pending executions were skipped")
    return 0


def run_executions(args: argparse.Namespace) -> int:
    if not 1 <= args.limit <= PAGE_SIZE_MAX:
        raise InvalidField(f"--limit must be between 1 and {PAGE_SIZE_MAX}")
    status = None if args.status is None else ExecutionStatus(args.status)

    async def query(ledger: Ledger) -> Page[Execution]:
        since = await ledger.database_now() - timedelta(minutes=args.minutes)
        return await ledger.executions_query(
            ExecutionsQuery(
                schedule_id=args.schedule,
                tenant_id=args.tenant,
                status=status,
                planned_from=since,
                limit=args.limit,
            )
        )

    page = run_with_ledger(args, query)
    if args.json:
        print(msgspec.json.encode(page.items).decode())
        return 0
    for e in page.items:
        started = format_utc(e.started_at) if e.started_at else "-"
        error = f"  {e.error_code}" if e.error_code else ""
        print(f"{e.execution_id}  {e.status}  attempt {e.attempt}  started {started}{error}")
    if not page.items:
        print("no executions match", file=sys.stderr)
    return 0
