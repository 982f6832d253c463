"""``carillon dlq``: list dead letters, replay them, and show the replays' audit trail.

A dead letter is an execution that will not be retried any more: its handler failed
permanently (a 4xx, a refused address, a ``PermanentError``) or ran out of attempts. After
the cause is fixed, ``replay`` puts it back in the queue under the **same execution id** --
so the receiver's idempotency key is unchanged -- with its attempt history kept; the next
claim starts the next attempt number. A running node picks replayed executions up on its
next fetch (within ``FETCH_INTERVAL_S_DEFAULT`` seconds).

``replay --all`` replays every dead letter matching the filters, page by page (for after an
outage). It refuses to run without ``--task-type`` or ``--tenant``: replaying every dead
letter of the cluster at once is almost never what an operator means, and it can be done
filter by filter. Ids that are not dead letters (unknown, or already replayed) are named on
stderr and skipped; that is not an error, so a replay may safely be repeated.

Every replay is audited by the ledger, in the replay's own transaction: who (the actor
``cli:<os user>@<host>``, :func:`cli_actor`), why (``--reason``), which execution, at which
attempt and after which error. ``audit`` lists that trail, oldest first.

The database is chosen as for every ledger command (:func:`~engine.cli.task_types.
run_with_ledger`). Bad input ends with exit code 2, database trouble with 1.
"""

from __future__ import annotations

import argparse
import getpass
import json
import socket
import sys
from datetime import datetime
from typing import Any, Final

import msgspec

from engine.cli.task_types import add_database_argument, run_with_ledger
from engine.core.instants import format_utc, parse_instant
from engine.errors import InvalidField
from engine.ledger.base import (
    PAGE_SIZE_MAX,
    AuditQuery,
    DeadLettersReplay,
    ExecutionsQuery,
    Ledger,
)
from engine.model import (
    ACTOR_LENGTH_MAX,
    AuditAction,
    AuditEvent,
    Execution,
    ExecutionStatus,
    validate_reason,
)

LIST_LIMIT_DEFAULT: Final = 100
LIST_LIMIT_MAX: Final = 100_000
"""Most dead letters one ``list`` prints."""
REPLAY_IDS_MAX: Final = 10_000
"""Most ids one ``replay ID...`` accepts (one ledger call)."""
ERROR_CHARS_SHOWN: Final = 60
REASON_CHARS_SHOWN: Final = 60
ACTOR_UNKNOWN_USER: Final = "unknown"


class Filters(msgspec.Struct, frozen=True):
    tenant_id: str | None = None
    task_type: str | None = None
    since: datetime | None = None

    def query(self, cursor: str | None, limit: int) -> ExecutionsQuery:
        return ExecutionsQuery(
            status=ExecutionStatus.DEAD_LETTER,
            tenant_id=self.tenant_id,
            task_type=self.task_type,
            finished_from=self.since,
            cursor=cursor,
            limit=limit,
        )


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "dlq",
        help="list and replay dead letters",
        description="Dead letters: executions that will not be retried any more.",
    )
    parser.set_defaults(handler=lambda _: _usage(parser))
    actions = parser.add_subparsers(metavar="ACTION", parser_class=type(parser))
    listing = actions.add_parser("list", help="list dead letters, oldest planned first")
    _add_filters(listing)
    listing.add_argument(
        "--limit",
        type=int,
        default=LIST_LIMIT_DEFAULT,
        metavar="N",
        help=f"most to list, 1-{LIST_LIMIT_MAX} [{LIST_LIMIT_DEFAULT}]",
    )
    listing.add_argument("--json", action="store_true", help="print JSON")
    add_database_argument(listing)
    listing.set_defaults(handler=run_list)
    replay = actions.add_parser(
        "replay",
        help="put dead letters back in the queue (same execution id, history kept)",
        description="Replay the named dead letters, or with --all every one matching the "
        "filters (--all needs --task-type or --tenant).",
    )
    replay.add_argument("execution_ids", nargs="*", metavar="ID")
    replay.add_argument("--all", action="store_true", help="replay every matching dead letter")
    replay.add_argument(
        "--reason", metavar="TEXT", help="why, recorded in the audit trail with who replayed"
    )
    _add_filters(replay)
    add_database_argument(replay)
    replay.set_defaults(handler=run_replay)
    audit = actions.add_parser(
        "audit",
        help="list the replays' audit trail, oldest first",
        description="Who replayed which dead letter, when, why, and after which error.",
    )
    audit.add_argument("--execution", metavar="ID", help="only the replays of this execution")
    audit.add_argument(
        "--limit",
        type=int,
        default=LIST_LIMIT_DEFAULT,
        metavar="N",
        help=f"most to list, 1-{LIST_LIMIT_MAX} [{LIST_LIMIT_DEFAULT}]",
    )
    audit.add_argument("--json", action="store_true", help="print JSON")
    add_database_argument(audit)
    audit.set_defaults(handler=run_audit)


def _add_filters(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tenant", metavar="ID", help="only this tenant's")
    parser.add_argument("--task-type", metavar="NAME", help="only executions of this task type")
    parser.add_argument(
        "--since", metavar="RFC3339", help="only those dead-lettered at or after this instant"
    )


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2


def filters_from_args(args: argparse.Namespace) -> Filters:
    since = None if args.since is None else parse_instant(args.since, field="--since")
    return Filters(tenant_id=args.tenant, task_type=args.task_type, since=since)


# --- list ----------------------------------------------------------------------------------


def run_list(args: argparse.Namespace) -> int:
    if not 1 <= args.limit <= LIST_LIMIT_MAX:
        raise InvalidField(f"--limit must be between 1 and {LIST_LIMIT_MAX}, got {args.limit}")
    filters = filters_from_args(args)
    letters, more = run_with_ledger(
        args, lambda ledger: list_dead_letters(ledger, filters, args.limit)
    )
    if args.json:
        print(json.dumps([msgspec.to_builtins(e) for e in letters], indent=2))
    elif not letters:
        print("no dead letters match")
    else:
        _print_table(letters)
    if more:
        print(
            f"carillon: more than {args.limit} dead letters match; raise --limit or narrow the "
            "filters",
            file=sys.stderr,
        )
    return 0


async def list_dead_letters(
    ledger: Ledger, filters: Filters, limit: int
) -> tuple[list[Execution], bool]:
    """Up to ``limit`` matching dead letters by planned time, and whether more match."""
    found: list[Execution] = []
    cursor: str | None = None
    while len(found) < limit:
        page = await ledger.executions_query(
            filters.query(cursor, min(PAGE_SIZE_MAX, limit - len(found)))
        )
        found += page.items
        cursor = page.next_cursor
        if cursor is None:
            return found, False
    return found, True


def _print_table(letters: list[Execution]) -> None:
    header = ("EXECUTION_ID", "TENANT", "TASK_TYPE", "ATTEMPT", "DEAD_SINCE", "ERROR")
    rows = [header] + [
        (
            e.execution_id,
            e.tenant_id,
            e.task_type,
            str(e.attempt),
            "-" if e.finished_at is None else format_utc(e.finished_at),
            _error(e),
        )
        for e in letters
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    for row in rows:
        print(
            "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        )


def _error(execution: Execution) -> str:
    return _shown(
        f"{execution.error_code or '-'} {execution.error_message or ''}", ERROR_CHARS_SHOWN
    )


# --- replay --------------------------------------------------------------------------------


def cli_actor() -> str:
    """Who replays from this command line: ``cli:<os user>@<host>`` (the user ``unknown``
    when the system cannot say), cut to the length an audit event keeps."""
    try:
        user = getpass.getuser()
    except (OSError, KeyError, ImportError):  # no login name, no passwd entry
        user = ACTOR_UNKNOWN_USER
    actor = " ".join(f"cli:{user or ACTOR_UNKNOWN_USER}@{socket.gethostname()}".split())
    return actor[:ACTOR_LENGTH_MAX]


def run_replay(args: argparse.Namespace) -> int:
    filters = filters_from_args(args)
    reason = validate_reason(args.reason)
    actor = cli_actor()
    if args.all:
        if args.execution_ids:
            raise InvalidField("give execution ids or --all, not both")
        if filters.tenant_id is None and filters.task_type is None:
            raise InvalidField(
                "--all needs --task-type or --tenant (replay the whole cluster filter by filter)"
            )
        count = run_with_ledger(
            args, lambda ledger: replay_matching(ledger, filters, actor, reason)
        )
        print(f"replayed {count} dead letter{'' if count == 1 else 's'}")
        return 0
    ids = list(dict.fromkeys(args.execution_ids))
    if not ids:
        raise InvalidField("name the dead letters to replay, or use --all with a filter")
    if any(value is not None for value in msgspec.structs.astuple(filters)):
        raise InvalidField("--tenant, --task-type and --since apply only with --all")
    if len(ids) > REPLAY_IDS_MAX:
        raise InvalidField(f"at most {REPLAY_IDS_MAX} ids at once, got {len(ids)}")
    done = run_with_ledger(
        args, lambda ledger: ledger.dead_letters_replay(DeadLettersReplay(ids, actor, reason))
    )
    replayed = set(done)
    for execution_id in ids:
        if execution_id not in replayed:
            print(f"carillon: {execution_id} is not a dead letter; skipped", file=sys.stderr)
    print(f"replayed {len(done)} of {len(ids)} dead letters")
    return 0


async def replay_matching(
    ledger: Ledger, filters: Filters, actor: str, reason: str | None = None
) -> int:
    """Replay every dead letter matching ``filters`` on behalf of ``actor``, a page at a
    time; returns how many.

    A replayed execution stops matching, so the cursor only moves past what this call has
    seen: each dead letter is read and replayed once, and the loop ends.
    """
    replayed = 0
    cursor: str | None = None
    while True:
        page = await ledger.executions_query(filters.query(cursor, PAGE_SIZE_MAX))
        if page.items:
            ids = [execution.execution_id for execution in page.items]
            replay = DeadLettersReplay(ids, actor, reason)
            replayed += len(await ledger.dead_letters_replay(replay))
        if page.next_cursor is None:
            return replayed
        cursor = page.next_cursor


# --- audit ---------------------------------------------------------------------------------


def run_audit(args: argparse.Namespace) -> int:
    if not 1 <= args.limit <= LIST_LIMIT_MAX:
        raise InvalidField(f"--limit must be between 1 and {LIST_LIMIT_MAX}, got {args.limit}")
    events, more = run_with_ledger(
        args, lambda ledger: list_replay_events(ledger, args.execution, args.limit)
    )
    if args.json:
        print(json.dumps([msgspec.to_builtins(event) for event in events], indent=2))
    elif not events:
        print("no replays recorded" + ("" if args.execution is None else " for that execution"))
    else:
        _print_audit(events)
    if more:
        print(
            f"carillon: more than {args.limit} replays recorded; raise --limit or pass --execution",
            file=sys.stderr,
        )
    return 0


async def list_replay_events(
    ledger: Ledger, execution_id: str | None, limit: int
) -> tuple[list[AuditEvent], bool]:
    """Up to ``limit`` replay events (of one execution, if given), oldest first, and whether
    more are recorded."""
    found: list[AuditEvent] = []
    after: int | None = None
    while len(found) <= limit:
        page_size = min(PAGE_SIZE_MAX, limit + 1 - len(found))
        page = await ledger.audit_list(
            AuditQuery(
                target=execution_id,
                action=AuditAction.DEAD_LETTER_REPLAY.value,
                after_event_id=after,
                limit=page_size,
            )
        )
        found += page
        if len(page) < page_size:
            break
        after = page[-1].event_id
    return found[:limit], len(found) > limit


def _print_audit(events: list[AuditEvent]) -> None:
    header = ("EVENT", "AT", "ACTOR", "EXECUTION_ID", "ATTEMPT", "ERROR", "REASON")
    rows = [header] + [
        (
            str(event.event_id),
            format_utc(event.at),
            event.actor,
            event.target,
            _detail(event, "attempt"),
            _detail(event, "error_code"),
            _shown(_detail(event, "reason"), REASON_CHARS_SHOWN),
        )
        for event in events
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    for row in rows:
        print(
            "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        )


def _detail(event: AuditEvent, key: str) -> str:
    value = event.details.get(key)
    return "-" if value is None else str(value)


def _shown(text: str, width: int) -> str:
    """``text`` on one line, cut to ``width`` characters."""
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"
