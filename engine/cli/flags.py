"""Argument types and options shared by the API commands.

Each type converts one flag's text or raises ``argparse.ArgumentTypeError``, which argparse
turns into one ``carillon ...: error: argument --flag: ...`` line and exit code 2 -- before
any request is sent, so a typo costs no round trip.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Final

from engine.cli.output import note
from engine.core.instants import format_utc, parse_instant
from engine.errors import InvalidField
from engine.ledger.params import PAGE_SIZE_MAX

LIMIT_DEFAULT: Final = 100


def rfc3339(text: str) -> str:
    """An instant with an offset, as the API's UTC text (``2026-03-08T07:00:00Z``)."""
    try:
        return format_utc(parse_instant(text, field="timestamp"))
    except InvalidField as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("timestamp ")) from None


def json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON ({exc.msg}): {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"must be a JSON object such as '{{\"k\": 1}}': {text!r}")
    return value


def page_size(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if not 1 <= value <= PAGE_SIZE_MAX:
        raise argparse.ArgumentTypeError(f"must be between 1 and {PAGE_SIZE_MAX}, got {value}")
    return value


def positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"a whole number from 1, got {text!r}")
    return int(text)


def version(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"a version is a whole number from 1, got {text!r}")
    return int(text)


def add_paging(parser: argparse.ArgumentParser, what: str) -> None:
    """``--limit`` and ``--cursor``: one page per command; the next page's cursor is named
    on stderr."""
    parser.add_argument(
        "--limit",
        type=page_size,
        default=LIMIT_DEFAULT,
        metavar="N",
        help=f"most {what} to list, 1-{PAGE_SIZE_MAX} [{LIMIT_DEFAULT}]",
    )
    parser.add_argument(
        "--cursor", metavar="CURSOR", help="continue after the previous page (printed on stderr)"
    )


def next_page_note(page: dict[str, Any], what: str) -> None:
    """Name the cursor of the next page, if any, on stderr."""
    cursor = page.get("next_cursor")
    if cursor:
        note(f"more {what} match; the next page: --cursor {cursor}")


def usage(parser: argparse.ArgumentParser) -> int:
    """The handler of a command group run without an action: its help, exit code 2."""
    parser.print_help(sys.stderr)
    return 2
