"""The ``carillon`` command (also ``python -m engine``).

Each subcommand lives in its own module and registers itself through ``add_parser``. Bad
input ends with exit code 2 and a single ``carillon: error: ...`` line on stderr -- never a
traceback; operating errors (database gone) with exit code 1.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import NoReturn

from engine import __version__
from engine.cli import dlq, migrate, preview, run, schedules, task_types, tenants
from engine.errors import CarillonError, ValidationError

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage error on one line."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="carillon",
        description="Carillon, a distributed cron engine.",
    )
    parser.add_argument("--version", action="version", version=f"carillon {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    preview.add_parser(commands)
    migrate.add_parser(commands)
    run.add_parser(commands)
    task_types.add_parser(commands)
    tenants.add_parser(commands)
    dlq.add_parser(commands)
    schedules.add_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (the console script exits with it)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version and usage errors end parsing this way
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        code: int = args.handler(args)
    except ValidationError as exc:
        print(f"carillon: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except CarillonError as exc:
        print(f"carillon: error: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    except KeyboardInterrupt:
        return 130
    return code
