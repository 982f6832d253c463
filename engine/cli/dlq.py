"""``carillon dlq``: list, replay and purge dead letters (through the API); read the audit trail.

A dead letter is an execution that will not be retried any more: its handler failed
permanently (a 4xx, a refused address, a ``PermanentError``) or ran out of attempts. After
the cause is fixed, ``replay`` puts it back in the queue under the **same execution id** --
so the receiver's idempotency key is unchanged -- with its attempt history kept; the next
claim starts the next attempt number. A running node picks replays up within seconds.

``replay ID...`` replays those executions; ids that are not dead letters (unknown, or
already replayed) are named on stderr and skipped, which is not an error, so a replay may
safely be repeated. So is a dead letter whose schedule is deleted: it cannot be replayed
(it would run without its payload). ``replay --all`` replays every dead letter matching the
filters -- but those of deleted schedules --, in rounds of :data:`REPLAY_ROUND_MAX` (for
after an outage); it refuses to run without
``--schedule``, ``--task-type`` or ``--tenant``: replaying every dead letter of the cluster
at once is almost never what an operator means, and it can be done filter by filter. The
API audits each replay with the token as the actor and the ``--reason``.

``purge`` deletes dead letters for good (with their attempt history; audited like a replay):
``purge ID...`` those executions, or every one matching ``--schedule``, ``--tenant``,
``--task-type``, ``--from`` or ``--to``, or with ``--all`` every one (a tenant token: its
tenant's). A filter or ``--all`` purge first counts what matches and deletes nothing
unless ``--yes`` confirms it; with ``--yes`` it deletes in rounds of
:data:`PURGE_ROUND_MAX` and prints how many went. A purged fire is not backfilled again.

``audit`` is the exception: it reads the replays' audit trail **from the database**
(``--database-url`` as for ``carillon migrate``), oldest first. It is an administrator's
forensic read and the API has no route for it.
"""

from __future__ import annotations

import argparse
import json
from typing import Any, Final

import msgspec

from engine.cli.client import (
    ApiClient,
    ApiProblem,
    add_client_arguments,
    add_output_argument,
    emit,
    open_client,
    segment,
)
from engine.cli.database import add_database_argument, run_with_ledger
from engine.cli.executions import add_execution_filters, error_of, execution_query
from engine.cli.flags import add_paging, next_page_note, usage
from engine.cli.output import cell, note, one_line, plural, print_table
from engine.core.instants import format_utc
from engine.errors import InvalidField
from engine.ledger.base import Ledger
from engine.ledger.params import PAGE_SIZE_MAX, AuditQuery
from engine.model import AuditAction, AuditEvent, validate_reason

REPLAY_ROUND_MAX: Final = 1000
"""Dead letters one ``replay --all`` request replays; rounds repeat while a round is full."""
REPLAY_ROUNDS_MAX: Final = 1000
REPLAY_IDS_MAX: Final = 10_000
"""Most ids one ``replay ID...`` (or ``purge ID...``) accepts (one request each)."""
PURGE_ROUND_MAX: Final = 1000
"""Dead letters one ``purge --yes`` request deletes; rounds repeat while a round is full."""
PURGE_ROUNDS_MAX: Final = 1000
COUNT_PAGES_MAX: Final = 1000
"""Pages of dead letters a ``purge`` without ``--yes`` counts at most (a million)."""
AUDIT_LIMIT_DEFAULT: Final = 100
AUDIT_LIMIT_MAX: Final = 100_000
REASON_CHARS_SHOWN: Final = 60
_SKIPPABLE: Final = frozenset({404, 409})
"""Answers to replaying one id that mean "not a dead letter" (or one whose schedule is
deleted): skipped, not failed."""
SCHEDULE_DELETED_PROBLEM: Final = "schedule-deleted"
"""The API's answer to replaying a dead letter whose schedule is deleted."""


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "dlq",
        help="list, replay and purge dead letters; read the replays' audit trail",
        description="Dead letters: executions that will not be retried any more.",
    )
    parser.set_defaults(handler=lambda _: usage(parser))
    actions = parser.add_subparsers(metavar="ACTION", parser_class=type(parser))
    listing = actions.add_parser("list", help="list dead letters, oldest planned first")
    add_execution_filters(listing)
    add_paging(listing, "dead letters")
    add_client_arguments(listing)
    listing.set_defaults(handler=run_list)
    replay = actions.add_parser(
        "replay",
        help="put dead letters back in the queue (same execution id, history kept)",
        description="Replay the named dead letters, or with --all every one matching the "
        "filters (--all needs --schedule, --task-type or --tenant).",
    )
    replay.add_argument("execution_ids", nargs="*", metavar="ID")
    replay.add_argument("--all", action="store_true", help="replay every matching dead letter")
    replay.add_argument("--reason", metavar="TEXT", help="why, kept in the audit trail")
    add_execution_filters(replay)
    add_client_arguments(replay, output=False)
    add_output_argument(replay, 'the ids replayed, as the API answers them: {"replayed": [...]}')
    replay.set_defaults(handler=run_replay)
    purge = actions.add_parser(
        "purge",
        help="delete dead letters for good (audited); count first, --yes to delete",
        description="Delete the named dead letters, or every one matching the filters, or "
        "with --all every one. Filters and --all only count unless --yes confirms.",
    )
    purge.add_argument("execution_ids", nargs="*", metavar="ID")
    purge.add_argument("--all", action="store_true", help="every dead letter (no filter)")
    purge.add_argument("--yes", action="store_true", help="delete what matches (else: count)")
    purge.add_argument("--reason", metavar="TEXT", help="why, kept in the audit trail")
    add_execution_filters(purge)
    add_client_arguments(purge, output=False)
    add_output_argument(purge, 'the ids purged: {"purged": [...]}, or {"matching": N}')
    purge.set_defaults(handler=run_purge)
    audit = actions.add_parser(
        "audit",
        help="list the replays' audit trail, oldest first (reads the database)",
        description="Who replayed which dead letter, when, why, and after which error. "
        "Reads the database directly (an administrator's command).",
    )
    audit.add_argument("--execution", metavar="ID", help="only the replays of this execution")
    audit.add_argument(
        "--limit",
        type=int,
        default=AUDIT_LIMIT_DEFAULT,
        metavar="N",
        help=f"most to list, 1-{AUDIT_LIMIT_MAX} [{AUDIT_LIMIT_DEFAULT}]",
    )
    add_output_argument(audit, "the audit events")
    add_database_argument(audit)
    audit.set_defaults(handler=run_audit)


# --- list ----------------------------------------------------------------------------------


def run_list(args: argparse.Namespace) -> int:
    with open_client(args) as api:
        answer = api.call("GET", "/v1/dead-letters", query=execution_query(args))
    emit(args, answer, _print_letters)
    next_page_note(answer.json(), "dead letters")
    return 0


def _print_letters(page: dict[str, Any]) -> None:
    if not page["items"]:
        print("no dead letters match")
        return
    print_table(
        ("EXECUTION_ID", "TENANT", "TASK_TYPE", "ATTEMPT", "DEAD_SINCE", "ERROR"),
        [
            (
                e["execution_id"],
                e["tenant_id"],
                e["task_type"],
                str(e["attempt"]),
                cell(e.get("finished_at")),
                error_of(e),
            )
            for e in page["items"]
        ],
    )


# --- replay --------------------------------------------------------------------------------


def run_replay(args: argparse.Namespace) -> int:
    reason = validate_reason(args.reason)
    filters = {
        "schedule_id": args.schedule,
        "tenant_id": args.tenant,
        "task_type": args.task_type,
        "planned_from": args.start,
        "planned_to": args.end,
    }
    given = {name: value for name, value in filters.items() if value is not None}
    if args.all:
        if args.execution_ids:
            raise InvalidField("give execution ids or --all, not both")
        if not given.keys() & {"schedule_id", "tenant_id", "task_type"}:
            raise InvalidField(
                "--all needs --schedule, --task-type or --tenant (replay the whole cluster "
                "filter by filter)"
            )
        with open_client(args) as api:
            replayed = replay_matching(api, given, reason)
        summary = f"replayed {plural(len(replayed), 'dead letter')}"
    else:
        ids = list(dict.fromkeys(args.execution_ids))
        if not ids:
            raise InvalidField("name the dead letters to replay, or use --all with a filter")
        if given:
            raise InvalidField(
                "--schedule, --tenant, --task-type, --from and --to apply only with --all"
            )
        if len(ids) > REPLAY_IDS_MAX:
            raise InvalidField(f"at most {REPLAY_IDS_MAX} ids at once, got {len(ids)}")
        with open_client(args) as api:
            replayed = _replay_each(api, ids, reason)
        summary = f"replayed {len(replayed)} of {len(ids)} dead letters"
    if args.output == "json":
        print(json.dumps({"replayed": replayed}))
    else:
        print(summary)
    return 0


def replay_matching(api: ApiClient, filters: dict[str, Any], reason: str | None) -> list[str]:
    """Replay every dead letter matching ``filters``, a round at a time; returns their ids.

    A replayed execution stops matching, so each round finds only new ones; a round that
    comes back short was the last.
    """
    body: dict[str, Any] = {**filters, "limit": REPLAY_ROUND_MAX}
    if reason is not None:
        body["reason"] = reason
    replayed: list[str] = []
    for _ in range(REPLAY_ROUNDS_MAX):
        done: list[str] = api.call_json("POST", "/v1/dead-letters:replay", body=body)["replayed"]
        replayed += done
        if len(done) < REPLAY_ROUND_MAX:
            break
    return replayed


def _replay_each(api: ApiClient, ids: list[str], reason: str | None) -> list[str]:
    body = {} if reason is None else {"reason": reason}
    replayed: list[str] = []
    for execution_id in ids:
        path = f"/v1/dead-letters/{segment(execution_id)}:replay"
        try:
            replayed += api.call_json("POST", path, body=body)["replayed"]
        except ApiProblem as problem:
            if problem.status not in _SKIPPABLE:
                raise
            if problem.slug == SCHEDULE_DELETED_PROBLEM:
                note(f"{execution_id} cannot be replayed ({problem}); skipped")
            else:
                note(f"{execution_id} is not a dead letter ({problem}); skipped")
    return replayed


# --- purge ---------------------------------------------------------------------------------


def run_purge(args: argparse.Namespace) -> int:
    reason = validate_reason(args.reason)
    filters = {
        "schedule_id": args.schedule,
        "tenant_id": args.tenant,
        "task_type": args.task_type,
        "planned_from": args.start,
        "planned_to": args.end,
    }
    given = {name: value for name, value in filters.items() if value is not None}
    if args.execution_ids:
        if args.all or given:
            raise InvalidField("give execution ids, or filters or --all, not both")
        ids = list(dict.fromkeys(args.execution_ids))
        if len(ids) > REPLAY_IDS_MAX:
            raise InvalidField(f"at most {REPLAY_IDS_MAX} ids at once, got {len(ids)}")
        with open_client(args) as api:
            each = _purge_each(api, ids, reason)
        return _purged(args, each, f"purged {len(each)} of {len(ids)} dead letters")
    if args.all and given:
        raise InvalidField("give filters or --all, not both")
    if not args.all and not given:
        raise InvalidField(
            "name the dead letters to purge: ids, --schedule, --tenant, --task-type, --from "
            "or --to, or --all for every one"
        )
    with open_client(args) as api:
        if not args.yes:
            matching = count_matching(api, given)
            if args.output == "json":
                print(json.dumps({"matching": matching}))
            else:
                print(
                    f"{plural(matching, 'dead letter')} match; nothing purged (add --yes to "
                    "purge them)"
                )
            return 0
        body: dict[str, Any] = {**given, "limit": PURGE_ROUND_MAX}
        if args.all:
            body["all"] = True
        if reason is not None:
            body["reason"] = reason
        purged: list[str] = []
        for _ in range(PURGE_ROUNDS_MAX):
            done: list[str] = api.call_json("POST", "/v1/dead-letters:purge", body=body)["purged"]
            purged += done
            if len(done) < PURGE_ROUND_MAX:
                break
    return _purged(args, purged, f"purged {plural(len(purged), 'dead letter')}")


def _purged(args: argparse.Namespace, purged: list[str], summary: str) -> int:
    if args.output == "json":
        print(json.dumps({"purged": purged}))
    else:
        print(summary)
    return 0


def count_matching(api: ApiClient, filters: dict[str, Any]) -> int:
    """How many dead letters match ``filters`` (what the token may see), by listing them."""
    query: dict[str, Any] = {**filters, "limit": PAGE_SIZE_MAX}
    count = 0
    for _ in range(COUNT_PAGES_MAX):
        page = api.call_json("GET", "/v1/dead-letters", query=query)
        count += len(page["items"])
        if not page.get("next_cursor"):
            return count
        query["cursor"] = page["next_cursor"]
    raise InvalidField(f"more than {count} dead letters match; narrow the filters to count them")


def _purge_each(api: ApiClient, ids: list[str], reason: str | None) -> list[str]:
    body = {} if reason is None else {"reason": reason}
    purged: list[str] = []
    for execution_id in ids:
        path = f"/v1/dead-letters/{segment(execution_id)}:purge"
        try:
            purged += api.call_json("POST", path, body=body)["purged"]
        except ApiProblem as problem:
            if problem.status not in _SKIPPABLE:
                raise
            note(f"{execution_id} is not a dead letter ({problem}); skipped")
    return purged


# --- audit (the database) ------------------------------------------------------------------


def run_audit(args: argparse.Namespace) -> int:
    if not 1 <= args.limit <= AUDIT_LIMIT_MAX:
        raise InvalidField(f"--limit must be between 1 and {AUDIT_LIMIT_MAX}, got {args.limit}")
    events, more = run_with_ledger(
        args, lambda ledger: list_replay_events(ledger, args.execution, args.limit)
    )
    if args.output == "json":
        print(json.dumps([msgspec.to_builtins(event) for event in events], indent=2))
    elif not events:
        print("no replays recorded" + ("" if args.execution is None else " for that execution"))
    else:
        _print_audit(events)
    if more:
        note(f"more than {args.limit} replays recorded; raise --limit or pass --execution")
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
    def detail(event: AuditEvent, key: str) -> str:
        value = event.details.get(key)
        return "-" if value is None else str(value)

    print_table(
        ("EVENT", "AT", "ACTOR", "EXECUTION_ID", "ATTEMPT", "ERROR", "REASON"),
        [
            (
                str(event.event_id),
                format_utc(event.at),
                event.actor,
                event.target,
                detail(event, "attempt"),
                detail(event, "error_code"),
                one_line(detail(event, "reason"), REASON_CHARS_SHOWN),
            )
            for event in events
        ],
    )
