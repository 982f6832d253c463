"""The ``carillon`` command (also ``python -m engine``).

Each subcommand lives in its own module and registers itself through ``add_parser``. Most
are clients of a node's HTTP API (:mod:`engine.cli.client`); ``migrate``, ``token``,
``region`` and ``dlq audit`` talk to the database directly (:mod:`engine.cli.database`);
``run`` starts a node; ``preview`` and ``simulate`` need neither. Bad input ends with exit
code 2 and a single ``carillon: error: ...`` line on stderr -- never a traceback; operating
errors (API or database unreachable, a refused request) with exit code 1.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import NoReturn

from engine import __version__
from engine.cli import (
    apply,
    cluster,
    dlq,
    executions,
    import_crontab,
    migrate,
    preview,
    region,
    run,
    schedules,
    simulate,
    task_types,
    tenants,
    tokens,
)
from engine.cli.client import CommandFailed
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
    for module in (
        preview,
        migrate,
        run,
        tokens,
        schedules,
        executions,
        dlq,
        import_crontab,
        apply,
        task_types,
        tenants,
        cluster,
        region,
        simulate,
    ):
        module.add_parser(commands)
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
    except CommandFailed as exc:
        print(f"carillon: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except ValidationError as exc:
        print(f"carillon: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except CarillonError as exc:
        print(f"carillon: error: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    except (KeyError, IndexError, TypeError, AttributeError, ValueError) as exc:
        if not getattr(args, "speaks_api", False):
            raise  # a bug: its traceback is wanted
        # The API answered with a success the commands cannot read: another service at
        # CARILLON_URL, or a node of another version.
        print(
            f"carillon: error: unexpected answer from the API ({type(exc).__name__}: {exc}); "
            f"is CARILLON_URL a Carillon API of this version ({__version__})?",
            file=sys.stderr,
        )
        return EXIT_FAILURE
    except KeyboardInterrupt:
        return 130
    return code
