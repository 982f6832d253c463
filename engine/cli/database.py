"""What the few commands that talk to the database directly share.

Most commands are clients of the HTTP API (:mod:`engine.cli.client`). A few must reach the
database itself: ``migrate`` (there is no API before the schema), ``token`` (you need a
token to use the API at all) and ``dlq audit`` (an administrator's forensic read, with no
API route). They choose the database as ``carillon migrate`` does: ``--database-url``, else
``$CARILLON_DATABASE_URL``, else the local server, else embedded PostgreSQL.

Actions they record name their actor :func:`cli_actor` (``cli:<os user>@<host>``).
"""

from __future__ import annotations

import argparse
import getpass
import socket
from collections.abc import Awaitable, Callable
from contextlib import ExitStack
from typing import Final, TypeVar

import trio

from engine.ledger.base import Ledger
from engine.ledger.database import resolve_database, validate_database_url
from engine.ledger.postgres import open_postgres_ledger
from engine.model import ACTOR_LENGTH_MAX

T = TypeVar("T")

ACTOR_UNKNOWN_USER: Final = "unknown"


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


def cli_actor() -> str:
    """Who acts from this command line: ``cli:<os user>@<host>`` (the user ``unknown`` when
    the system cannot say), cut to the length an audit event keeps."""
    try:
        user = getpass.getuser()
    except (OSError, KeyError, ImportError):  # no login name, no passwd entry
        user = ACTOR_UNKNOWN_USER
    actor = " ".join(f"cli:{user or ACTOR_UNKNOWN_USER}@{socket.gethostname()}".split())
    return actor[:ACTOR_LENGTH_MAX]
