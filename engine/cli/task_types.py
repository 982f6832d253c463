"""``carillon task-type``: define, list, show and delete task types.

A task type says what running a schedule's executions means -- a webhook, a Python function,
a command, or nothing -- and within which limits (timeout, concurrency caps, retries,
overlap). Schedules may only name task types that exist, so create them first.

``set`` is declarative: its command line is the task type's whole definition, and options
it leaves out take their defaults (running the same ``set`` twice changes nothing but the
version). Handler settings are checked by building the handler once
(:func:`validate_task_type_settings`) before anything is stored. Secrets are never printed:
``secret`` and sensitive-looking header or environment values show as ``***``.

The database is chosen as for ``carillon migrate`` (``--database-url``, else
``$CARILLON_DATABASE_URL``, else the local server, else embedded PostgreSQL); the helpers
:func:`add_database_argument` and :func:`run_with_ledger` serve every command that talks to
the ledger. Bad input ends with exit code 2, database trouble with 1 (:mod:`engine.cli`).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Awaitable, Callable
from contextlib import ExitStack
from typing import Any, Final, TypeVar

import msgspec
import trio

from engine.core.instants import format_utc
from engine.errors import InvalidField
from engine.ledger.base import Ledger, TaskTypesPut
from engine.ledger.database import resolve_database, validate_database_url
from engine.ledger.postgres import open_postgres_ledger
from engine.model import HandlerKind, OverlapPolicy, TaskType

T = TypeVar("T")

REDACTED: Final = "***"
_SENSITIVE_WORDS: Final = ("secret", "password", "token", "auth", "key", "cookie", "signature")
_KIND_OPTIONS: Final = {
    HandlerKind.WEBHOOK: ("url", "secret", "header"),
    HandlerKind.PYTHON: ("callable",),
    HandlerKind.SHELL: ("argv", "env"),
    HandlerKind.NOOP: ("delay",),
}
_REQUIRED: Final = {
    HandlerKind.WEBHOOK: "url",
    HandlerKind.PYTHON: "callable",
    HandlerKind.SHELL: "argv",
}
_LIMITS: Final = {
    "timeout": "timeout_s",
    "max_concurrency": "max_concurrency",
    "max_concurrency_cluster": "max_concurrency_cluster",
    "max_attempts": "max_attempts",
    "backoff_base": "backoff_base_s",
    "backoff_max": "backoff_max_s",
}
"""``set`` options -> TaskType fields; an option left out leaves the field's default."""
_DEFAULT: Final = TaskType(name="default", kind=HandlerKind.NOOP)


# --- shared by the commands that talk to the ledger ----------------------------------------


def add_database_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--database-url",
        metavar="URL",
        help="postgresql://user:password@host:5432/dbname (default: $CARILLON_DATABASE_URL, "
        "else the local server, else embedded PostgreSQL)",
    )


def run_with_ledger(args: argparse.Namespace, operation: Callable[[Ledger], Awaitable[T]]) -> T:
    """Open the ledger on the chosen database, run ``operation`` on it, close it."""
    with ExitStack() as stack:
        if args.database_url is not None:
            url = validate_database_url(args.database_url)
        else:
            url = stack.enter_context(resolve_database()).app_url

        async def main() -> T:
            async with open_postgres_ledger(url, pool_max=1) as ledger:
                return await operation(ledger)

        return trio.run(main)


def _key_value(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    return name, value


# --- the command ---------------------------------------------------------------------------


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "task-type",
        help="define, list, show and delete task types",
        description="Task types: what running a schedule's executions means, and its limits.",
    )
    parser.set_defaults(handler=lambda _: _usage(parser))
    actions = parser.add_subparsers(metavar="ACTION", parser_class=type(parser))
    _add_set(actions)
    listing = actions.add_parser("list", help="list the task types")
    listing.add_argument("--json", action="store_true", help="print JSON (secrets redacted)")
    add_database_argument(listing)
    listing.set_defaults(handler=run_list)
    show = actions.add_parser("show", help="show one task type (secrets redacted)")
    show.add_argument("name", metavar="NAME")
    show.add_argument("--json", action="store_true", help="print JSON (secrets redacted)")
    add_database_argument(show)
    show.set_defaults(handler=run_show)
    delete = actions.add_parser("delete", help="delete a task type that no schedule uses any more")
    delete.add_argument("name", metavar="NAME")
    add_database_argument(delete)
    delete.set_defaults(handler=run_delete)


def _add_set(actions: Any) -> None:
    parser = actions.add_parser(
        "set",
        help="create or replace a task type",
        description="Create or replace a task type. The command line is its whole definition: "
        "options left out take their defaults.",
    )
    parser.add_argument("name", metavar="NAME")
    parser.add_argument(
        "--kind", required=True, choices=[kind.value for kind in HandlerKind], help="handler kind"
    )
    kinds = parser.add_argument_group("handler settings (by kind)")
    kinds.add_argument("--url", help="webhook: the http(s) URL to POST to")
    kinds.add_argument("--secret", help="webhook: signing secret (never printed back)")
    kinds.add_argument(
        "--header",
        type=_key_value,
        action="append",
        metavar="NAME=VALUE",
        help="webhook: an extra request header (repeatable)",
    )
    kinds.add_argument("--callable", help="python: the function, as package.module:function")
    kinds.add_argument("--argv", help='shell: the command as a JSON list, e.g. \'["/bin/x", "a"]\'')
    kinds.add_argument(
        "--env",
        type=_key_value,
        action="append",
        metavar="NAME=VALUE",
        help="shell: an environment variable for the command (repeatable)",
    )
    kinds.add_argument("--delay", type=float, metavar="S", help="noop: seconds to wait")
    limits = parser.add_argument_group("limits (defaults in brackets)")
    limits.add_argument(
        "--timeout", type=float, metavar="S", help=f"seconds per attempt [{_DEFAULT.timeout_s:g}]"
    )
    limits.add_argument(
        "--max-concurrency", type=int, metavar="N", help="running at once per node [no cap]"
    )
    limits.add_argument(
        "--max-concurrency-cluster", type=int, metavar="N", help="running at once in the cluster"
    )
    limits.add_argument(
        "--max-attempts",
        type=int,
        metavar="N",
        help=f"attempts before dead-lettering [{_DEFAULT.max_attempts}]",
    )
    limits.add_argument(
        "--backoff-base",
        type=float,
        metavar="S",
        help=f"first retry delay [{_DEFAULT.backoff_base_s:g}]",
    )
    limits.add_argument(
        "--backoff-max",
        type=float,
        metavar="S",
        help=f"longest retry delay [{_DEFAULT.backoff_max_s:g}]",
    )
    limits.add_argument(
        "--overlap",
        choices=[policy.value for policy in OverlapPolicy],
        help="default overlap policy of this type's schedules",
    )
    parser.add_argument(
        "--skip-handler-check",
        action="store_true",
        help="store the settings without building the handler here (e.g. a Python callable "
        "installed only on the nodes)",
    )
    add_database_argument(parser)
    parser.set_defaults(handler=run_set)


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2


def run_set(args: argparse.Namespace) -> int:
    task_type = task_type_from_args(args)
    if not args.skip_handler_check:
        validate_task_type_settings(task_type.kind, task_type.settings)
    stored = run_with_ledger(args, lambda ledger: ledger.task_types_put(TaskTypesPut(task_type)))
    verb = "created" if stored.version == 1 else "updated"
    print(f"{verb} task type {stored.name!r} (version {stored.version})")
    _print_task_type(stored)
    return 0


def run_list(args: argparse.Namespace) -> int:
    task_types = run_with_ledger(args, lambda ledger: ledger.task_types_list())
    if args.json:
        print(json.dumps([redacted(t) for t in task_types], indent=2))
    elif not task_types:
        print("no task types; create one with `carillon task-type set NAME --kind ...`")
    else:
        _print_table(task_types)
    return 0


def run_show(args: argparse.Namespace) -> int:
    task_type = run_with_ledger(args, lambda ledger: ledger.task_types_get(args.name))
    if args.json:
        print(json.dumps(redacted(task_type), indent=2))
    else:
        _print_task_type(task_type)
    return 0


def run_delete(args: argparse.Namespace) -> int:
    deleted = run_with_ledger(args, lambda ledger: ledger.task_types_delete(args.name))
    print(f"deleted task type {deleted.name!r} (it was at version {deleted.version})")
    return 0


# --- from flags to a task type -------------------------------------------------------------


def task_type_from_args(args: argparse.Namespace) -> TaskType:
    """The task type ``set`` describes; ``InvalidField`` for options of another kind or a
    missing required one."""
    kind = HandlerKind(args.kind)
    given = [
        option
        for options in _KIND_OPTIONS.values()
        for option in options
        if getattr(args, option) is not None
    ]
    for option in given:
        if option not in _KIND_OPTIONS[kind]:
            owner = next(k for k, options in _KIND_OPTIONS.items() if option in options)
            raise InvalidField(f"--{option} applies only to --kind {owner}, not to --kind {kind}")
    required = _REQUIRED.get(kind)
    if required is not None and getattr(args, required) is None:
        raise InvalidField(f"--kind {kind} needs --{required}")
    limits = {
        field: getattr(args, option)
        for option, field in _LIMITS.items()
        if getattr(args, option) is not None
    }
    return TaskType(
        name=args.name,
        kind=kind,
        settings=_settings(kind, args),
        overlap=None if args.overlap is None else OverlapPolicy(args.overlap),
        **limits,
    )


def _settings(kind: HandlerKind, args: argparse.Namespace) -> dict[str, Any]:
    settings: dict[str, Any] = {}
    if kind is HandlerKind.WEBHOOK:
        settings["url"] = args.url
        if args.secret is not None:
            settings["secret"] = args.secret
        if args.header:
            settings["headers"] = dict(args.header)
    elif kind is HandlerKind.PYTHON:
        settings["callable"] = args.callable
    elif kind is HandlerKind.SHELL:
        settings["argv"] = _argv(args.argv)
        if args.env:
            settings["env"] = dict(args.env)
    elif args.delay is not None:
        settings["delay_s"] = args.delay
    return settings


def _argv(text: str) -> list[str]:
    try:
        argv = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidField(
            f'--argv must be a JSON list of strings such as \'["/usr/bin/backup", "--full"]\' '
            f"({exc.msg})"
        ) from None
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        raise InvalidField(
            "--argv must be a non-empty JSON list of strings such as '[\"/usr/bin/backup\"]'"
        )
    return argv


def validate_task_type_settings(kind: HandlerKind, settings: dict[str, Any]) -> None:
    """Refuse settings the handler of ``kind`` would refuse (``InvalidField``).

    Builds the handler once through the registry (:func:`engine.handlers.build_handler`),
    with shell handlers allowed: whether a node runs them is that node's policy
    (``--enable-shell``), not a property of the task type.
    """
    from engine.handlers import HandlerOptions, build_handler

    build_handler(str(kind), settings, options=HandlerOptions(enable_shell=True))


# --- output --------------------------------------------------------------------------------


def _is_sensitive(name: str) -> bool:
    lowered = name.lower()
    return any(word in lowered for word in _SENSITIVE_WORDS)


def redact_settings(settings: dict[str, Any]) -> dict[str, Any]:
    """``settings`` safe to print, keys sorted: the values of secret-looking settings, headers
    and environment variables (``secret``, ``Authorization``, ``API_TOKEN`` ...) become
    ``***``."""
    shown: dict[str, Any] = {}
    for name, value in sorted(settings.items()):
        if _is_sensitive(name):
            shown[name] = REDACTED
        elif name in ("headers", "env") and isinstance(value, dict):
            shown[name] = {k: REDACTED if _is_sensitive(k) else v for k, v in sorted(value.items())}
        else:
            shown[name] = value
    return shown


def redacted(task_type: TaskType) -> dict[str, Any]:
    """``task_type`` as JSON-ready builtins, its settings redacted."""
    fields: dict[str, Any] = msgspec.to_builtins(task_type)
    fields["settings"] = redact_settings(task_type.settings)
    return fields


def _print_task_type(task_type: TaskType) -> None:
    def number(value: float | int | None) -> str:
        return "none" if value is None else f"{value:g}"

    print(f"name: {task_type.name}")
    print(f"kind: {task_type.kind}")
    settings = redact_settings(task_type.settings)
    print("settings:" if settings else "settings: none")
    for name, value in settings.items():
        text = value if isinstance(value, str) else json.dumps(value)
        print(f"  {name}: {text}")
    print(f"timeout_s: {number(task_type.timeout_s)}")
    print(f"max_concurrency: {number(task_type.max_concurrency)} (per node)")
    print(f"max_concurrency_cluster: {number(task_type.max_concurrency_cluster)}")
    print(f"max_attempts: {task_type.max_attempts}")
    print(f"backoff_base_s: {number(task_type.backoff_base_s)}")
    print(f"backoff_max_s: {number(task_type.backoff_max_s)}")
    overlap = task_type.overlap or "none (each schedule's own)"
    print(f"overlap: {overlap}")
    updated = (
        "" if task_type.updated_at is None else f" (updated {format_utc(task_type.updated_at)})"
    )
    print(f"version: {task_type.version}{updated}")


def _print_table(task_types: list[TaskType]) -> None:
    header = ("NAME", "KIND", "TIMEOUT_S", "MAX_CONC", "CLUSTER_CONC", "ATTEMPTS", "OVERLAP", "VER")
    rows = [header] + [
        (
            t.name,
            str(t.kind),
            f"{t.timeout_s:g}",
            "-" if t.max_concurrency is None else str(t.max_concurrency),
            "-" if t.max_concurrency_cluster is None else str(t.max_concurrency_cluster),
            str(t.max_attempts),
            "-" if t.overlap is None else str(t.overlap),
            str(t.version),
        )
        for t in task_types
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    for row in rows:
        print(
            "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        )
