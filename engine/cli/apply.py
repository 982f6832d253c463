"""``carillon apply`` and ``carillon diff``: schedules as code (``docs/manifests.md``).

Both read manifest files (:mod:`engine.cli.manifest_files`) and send the whole set in one
``POST /v1/apply``: the server applies it all or nothing, under the set's lock, and names
every bad item with its file and line. ``diff`` sends the same request with
``?dry_run=true`` and prints what would change; its exit status is made for CI: 0 when
nothing would change, 1 when something would, 2 on any error (bad files, bad items, a
refused request). ``apply`` exits 0 when applied (changes or not), 2 for bad input, 1 when
the API could not be used. The warnings the answer carries for task types (a ``nats``
stream's duplicate window) are printed to stderr as ``warning: FILE:LINE …``; they change no
exit status.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Final

from engine.cli.client import (
    EXIT_USAGE,
    ApiProblem,
    CommandFailed,
    add_client_arguments,
    open_client,
)
from engine.cli.manifest_files import load
from engine.cli.output import note, plural, print_table

_EPILOG_DIFF: Final = """\
Exit status: 0 when nothing would change, 1 when something would, 2 on any error (bad
files or items, a refused request, the API unreachable): `carillon diff -f deploy/ || ...`
in CI fails the job on drift."""
_EPILOG_APPLY: Final = """\
Exit status: 0 when the set is applied (or already was), 2 for bad files or items (nothing
is applied: every bad item is named with its file and line), 1 when the API failed."""


def add_parser(commands: Any) -> None:
    for name, runner, summary, epilog in (
        (
            "apply",
            run_apply,
            "create, update (and --prune) what manifest files list",
            _EPILOG_APPLY,
        ),
        ("diff", run_diff, "show what `carillon apply` would change", _EPILOG_DIFF),
    ):
        parser = commands.add_parser(
            name,
            help=summary,
            description=f"{summary[0].upper()}{summary[1:]}: schedules, task types and tenants "
            "of one manifest set, all or nothing.",
            epilog=epilog,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        parser.add_argument(
            "-f",
            "--file",
            dest="files",
            action="append",
            required=True,
            type=Path,
            metavar="FILE|DIR",
            help="a manifest (.yaml, .yml, .toml, .json) or a directory of them; repeatable",
        )
        parser.add_argument(
            "--set",
            dest="set_name",
            metavar="NAME",
            help="the manifest set (default: the files' manifest_set)",
        )
        parser.add_argument(
            "--prune",
            action="store_true",
            help="also delete the objects of this set that the files no longer list",
        )
        add_client_arguments(parser)
        parser.set_defaults(handler=runner)


def _send(args: argparse.Namespace, *, dry_run: bool) -> dict[str, Any]:
    manifests = load(args.files, args.set_name)
    body = {"manifest_set": manifests.name, "prune": args.prune, **manifests.items}
    with open_client(args) as api:
        try:
            answer = api.call("POST", "/v1/apply", query={"dry_run": dry_run}, body=body)
        except ApiProblem as problem:
            if len(problem.errors) > 1:  # every bad item, one a line, before the summary
                for error in problem.errors:
                    print(f"  {error}", file=sys.stderr)
                detail = str(problem).split(": ", 1)[0]
                raise CommandFailed(
                    f"{detail} ({len(problem.errors)} listed above)", problem.exit_code
                ) from None
            raise
    if args.output == "json":
        print(answer.text)
    result: dict[str, Any] = answer.json()
    for change in result.get("changes") or ():
        for warning in change.get("warnings") or ():  # on stderr, as `task-type set` says them
            where = f"{change['source']}: " if change.get("source") else ""
            print(f"warning: {where}{warning.get('message')}", file=sys.stderr)
    return result


def run_apply(args: argparse.Namespace) -> int:
    result = _send(args, dry_run=False)
    if args.output != "json":
        _render(result, applied=True)
    return 0


def run_diff(args: argparse.Namespace) -> int:
    try:
        result = _send(args, dry_run=True)
    except CommandFailed as exc:  # every error is 2 for a CI's diff, never "drift"
        raise CommandFailed(str(exc), EXIT_USAGE) from None
    if args.output != "json":
        _render(result, applied=False)
    return 1 if result["changes"] else 0


def _render(result: dict[str, Any], *, applied: bool) -> None:
    changes = result["changes"]
    if changes:
        print_table(
            ("KIND", "NAME", "CHANGE", "FIELDS", "VERSION", "SOURCE"),
            (
                (
                    change["kind"],
                    change["name"],
                    change["action"],
                    ",".join(change["fields"]) or "-",
                    "-" if change["version"] is None else str(change["version"]),
                    change["source"] or "-",
                )
                for change in changes
            ),
        )
    done = "applied" if applied else "would apply"
    note(
        f"manifest set {result['manifest_set']!r}: {done} {plural(len(changes), 'change')}, "
        f"{result['unchanged']} unchanged"
    )
