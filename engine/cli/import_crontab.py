"""``carillon import-crontab``: turn a user crontab into schedules, through the API.

The file (``-``: standard input) is read by :func:`~engine.core.crontab.parse_crontab`:
every line becomes an entry or a rejected line with a reason (``@reboot``, a system-crontab
line, an expression that never fires ...). Each entry becomes the schedule
``<id prefix><12 hex digits>`` of the given tenant and task type, its payload
``{"command", "env"[, "stdin"]}`` for the task type's handler to act on.

Importing is idempotent: an entry whose schedule is absent is created (``PUT``); one whose
schedule differs in expression, zone, task type or payload is updated (``PATCH`` of those
fields only, guarded by the version just read, so a schedule paused since the last import
stays paused); one that matches is left alone and reported ``unchanged``. Importing the
same file twice therefore changes nothing the second time. Lines deleted from the crontab
are not deleted from Carillon: ``carillon schedule delete`` them by id.

``--dry-run`` parses and reports without contacting the API (no token needed). Exit code 0
when every line converted (and every write succeeded), 1 when some lines were rejected or
some writes failed (the others are imported all the same), 2 for bad input (an unreadable
or oversized file, an unknown ``--tz``, a bad ``--id-prefix``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Final

import msgspec

from engine.cli.client import (
    EXIT_USAGE,
    ApiClient,
    ApiProblem,
    CommandFailed,
    add_client_arguments,
    add_output_argument,
    open_client,
    segment,
)
from engine.cli.output import one_line, plural, print_table
from engine.core.crontab import CrontabEntry, CrontabImport, parse_crontab
from engine.model import validate_identifier

ID_PREFIX_DEFAULT: Final = "crontab-"
COMMAND_CHARS_SHOWN: Final = 50
ENTRY_FAILURES: Final = frozenset({400, 404, 409, 412, 413, 422})
"""Answers that fail one entry (reported, the import goes on); others stop the import."""
_COMPARED: Final = ("cron_expr", "timezone", "task_type", "payload")
_EPILOG: Final = """\
Exit status: 0 when every line converted; 1 when some lines were rejected or could not be
written (the others are imported all the same); 2 for bad input. Re-importing the same file
changes nothing; lines removed from the file are not deleted from Carillon."""


class Outcome(msgspec.Struct, frozen=True):
    line_no: int
    schedule_id: str
    result: str
    """``created``, ``updated``, ``unchanged``, ``failed``, or with --dry-run ``parsed``."""
    cron_expr: str
    timezone: str
    command: str
    detail: str | None = None
    """Why it failed."""


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "import-crontab",
        help="create or update schedules from a user crontab (through the API)",
        description="Create or update one schedule per line of a user crontab (crontab -l "
        "format). Lines that cannot become schedules are listed with the reason.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("file", metavar="FILE", help="the crontab; - for standard input")
    parser.add_argument("--tenant", required=True, metavar="ID", help="the schedules' tenant")
    parser.add_argument(
        "--task-type", required=True, metavar="NAME", help="the task type that runs them"
    )
    parser.add_argument(
        "--id-prefix",
        default=ID_PREFIX_DEFAULT,
        metavar="P",
        help=f"schedule ids are P + 12 hex digits [{ID_PREFIX_DEFAULT}]",
    )
    parser.add_argument(
        "--tz", default="UTC", metavar="ZONE", help="zone of lines without CRON_TZ/TZ [UTC]"
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="parse and report only; send nothing"
    )
    add_client_arguments(parser, output=False)
    add_output_argument(parser, "every line's outcome and every rejected line")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    validate_identifier(args.tenant, kind="tenant id")
    validate_identifier(args.task_type, kind="task type")
    parsed = parse_crontab(read_text(args.file), default_timezone=args.tz, id_prefix=args.id_prefix)
    outcomes: list[Outcome] = []
    if args.dry_run:
        outcomes = [_outcome(entry, "parsed") for entry in parsed.entries]
    elif parsed.entries:
        with open_client(args) as api:
            try:
                for entry in parsed.entries:
                    outcomes.append(import_entry(api, entry, args.tenant, args.task_type))
            except CommandFailed:
                _report(args, parsed, outcomes)  # what was done before the API failed
                raise
    _report(args, parsed, outcomes)
    failed = any(outcome.result == "failed" for outcome in outcomes)
    return 1 if parsed.rejected or failed else 0


def read_text(name: str) -> str:
    """The crontab's text; bytes that are not UTF-8 survive as lone surrogates, which the
    parser rejects line by line."""
    try:
        raw = sys.stdin.buffer.read() if name == "-" else Path(name).read_bytes()
    except OSError as exc:
        raise CommandFailed(f"cannot read {name}: {exc.strerror or exc}", EXIT_USAGE) from None
    return raw.decode("utf-8", "surrogateescape")


def import_entry(api: ApiClient, entry: CrontabEntry, tenant: str, task_type: str) -> Outcome:
    """Create, update or leave the entry's schedule; a failed entry is an outcome too."""
    wanted = {
        "cron_expr": entry.cron_expr,
        "timezone": entry.timezone,
        "task_type": task_type,
        "payload": entry.payload,
    }
    path = f"/v1/schedules/{segment(entry.schedule_id)}"
    try:
        try:
            current = api.call_json("GET", path)
        except ApiProblem as problem:
            if problem.status != 404:
                raise
            api.call("PUT", path, body={**wanted, "tenant_id": tenant})
            return _outcome(entry, "created")
        if current["tenant_id"] != tenant:
            return _outcome(
                entry,
                "failed",
                f"schedule {entry.schedule_id!r} belongs to tenant {current['tenant_id']!r}; "
                "import with another --id-prefix",
            )
        changes = {name: value for name, value in wanted.items() if current.get(name) != value}
        if not changes:
            return _outcome(entry, "unchanged")
        api.call("PATCH", path, body=changes, if_match=current["version"])
        return _outcome(entry, "updated")
    except ApiProblem as problem:
        if problem.status not in ENTRY_FAILURES:
            raise
        return _outcome(entry, "failed", str(problem))


def _outcome(entry: CrontabEntry, result: str, detail: str | None = None) -> Outcome:
    return Outcome(
        entry.line_no,
        entry.schedule_id,
        result,
        entry.cron_expr,
        entry.timezone,
        entry.command,
        detail,
    )


# --- the report ------------------------------------------------------------------------------


def _report(args: argparse.Namespace, parsed: CrontabImport, outcomes: list[Outcome]) -> None:
    if args.output == "json":
        report = {
            "dry_run": args.dry_run,
            "entries": msgspec.to_builtins(outcomes),
            "rejected": msgspec.to_builtins(parsed.rejected),
        }
        print(json.dumps(report))
        return
    if outcomes:
        print_table(
            ("LINE", "SCHEDULE_ID", "RESULT", "CRON", "TZ", "COMMAND"),
            [
                (
                    str(o.line_no),
                    o.schedule_id,
                    o.result,
                    o.cron_expr,
                    o.timezone,
                    one_line(o.command, COMMAND_CHARS_SHOWN),
                )
                for o in outcomes
            ],
        )
    failures = [o for o in outcomes if o.detail is not None]
    if failures:
        print("\nnot written:")
        for outcome in failures:
            print(f"  line {outcome.line_no} ({outcome.schedule_id}): {outcome.detail}")
    if parsed.rejected:
        print("\nrejected lines:")
        for line in parsed.rejected:
            print(f"  line {line.line_no}: {one_line(line.text)}")
            print(f"    {line.reason}")
    print()
    print(_summary(args.dry_run, parsed, outcomes))


def _summary(dry_run: bool, parsed: CrontabImport, outcomes: list[Outcome]) -> str:
    rejected = plural(len(parsed.rejected), "line")
    if dry_run:
        return (
            f"dry run: {plural(len(outcomes), 'line')} would be imported, {rejected} rejected; "
            "nothing was sent"
        )
    counts = dict.fromkeys(("created", "updated", "unchanged", "failed"), 0)
    for outcome in outcomes:
        counts[outcome.result] += 1
    done = ", ".join(f"{count} {result}" for result, count in counts.items())
    return f"{done}; {rejected} rejected"
