"""``carillon token create|list|revoke``: the API's bearer tokens, managed in the database.

These commands talk to the database directly, not to the API: using the API needs a token,
so the first one can only come from here (``--database-url`` as for ``carillon migrate``;
whoever can reach the database is an administrator already). Each action is audited with
the actor ``cli:<os user>@<host>``.

``create`` prints the token once: the ledger keeps only its SHA-256, so it cannot be shown
again (create another and revoke this one if it is lost). With ``--save PATH`` the token
goes only to that file, created with mode 0600 (an existing file is refused unless
``--force``, which replaces it atomically); the file is opened before the token is created,
and a token whose file cannot be written is revoked at once, so no unsaved token lingers.
``revoke`` takes effect on every API node within the token cache's lifetime
(:data:`~engine.api.auth.TOKEN_CACHE_TTL_S`, 5 s).
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import secrets
from datetime import datetime
from pathlib import Path
from typing import Any, Final

import msgspec

from engine.api.auth import TOKEN_CACHE_TTL_S, new_token, scope_of
from engine.cli.client import (
    EXIT_USAGE,
    TOKEN_ENV,
    TOKEN_FILE_ENV,
    CommandFailed,
    add_output_argument,
)
from engine.cli.database import add_database_argument, cli_actor, run_with_ledger
from engine.cli.flags import usage
from engine.cli.output import NONE, cell, one_line, print_table
from engine.core.instants import format_utc
from engine.ledger.base import Ledger
from engine.ledger.params import TokensCreate, TokensRevoke
from engine.model import ApiToken, validate_identifier

TOKEN_FILE_MODE: Final = 0o600
TOKEN_DIRECTORY_MODE: Final = 0o700
DESCRIPTION_CHARS_SHOWN: Final = 50


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "token",
        help="create, list and revoke API tokens (reads and writes the database)",
        description="API bearer tokens, managed directly in the database.",
    )
    parser.set_defaults(handler=lambda _: usage(parser))
    actions = parser.add_subparsers(metavar="ACTION", parser_class=type(parser))
    create = actions.add_parser(
        "create",
        help="create a token and print it once",
        description="Create an API token: --admin (everything) or --tenant ID (that tenant's "
        "schedules, executions and dead letters only). The token is shown once.",
    )
    scope = create.add_mutually_exclusive_group(required=True)
    scope.add_argument("--admin", action="store_true", help="a token that may do everything")
    scope.add_argument("--tenant", metavar="ID", help="a token confined to this tenant")
    create.add_argument(
        "--description", default="", metavar="TEXT", help="whose it is and what for"
    )
    create.add_argument(
        "--save",
        type=Path,
        metavar="PATH",
        help="write the token to PATH (mode 0600) instead of printing it",
    )
    create.add_argument("--force", action="store_true", help="with --save: replace PATH")
    add_output_argument(create, "the token's record")
    add_database_argument(create)
    create.set_defaults(handler=run_create)
    listing = actions.add_parser("list", help="list every token (revoked ones too)")
    add_output_argument(listing, "the tokens' records, never a secret")
    add_database_argument(listing)
    listing.set_defaults(handler=run_list)
    revoke = actions.add_parser("revoke", help="revoke a token (the API refuses it within 5 s)")
    revoke.add_argument("token_id", metavar="TOKEN_ID")
    add_output_argument(revoke, "the token's record")
    add_database_argument(revoke)
    revoke.set_defaults(handler=run_revoke)


# --- create ----------------------------------------------------------------------------------


def run_create(args: argparse.Namespace) -> int:
    if args.tenant is not None:
        validate_identifier(args.tenant, kind="tenant id")
    if args.force and args.save is None:
        raise CommandFailed("--force applies only with --save", EXIT_USAGE)
    scope = scope_of(admin=args.admin, tenant_id=args.tenant)
    token_id, token, token_hash = new_token()
    record = ApiToken(token_id=token_id, scope=scope, description=args.description)
    saver = None if args.save is None else TokenFile.open(args.save, force=args.force)

    async def create(ledger: Ledger) -> ApiToken:
        stored: ApiToken = await ledger.tokens_create(TokensCreate(record, token_hash, cli_actor()))
        if saver is not None:
            try:
                saver.write(token)
            except OSError as exc:
                await ledger.tokens_revoke(TokensRevoke(token_id, cli_actor()))
                raise CommandFailed(
                    f"cannot write {args.save}: {exc.strerror or exc}; token {token_id} was "
                    "revoked again"
                ) from None
        return stored

    try:
        stored = run_with_ledger(args, create)
    finally:
        if saver is not None:
            saver.discard()
    shown: dict[str, Any] = msgspec.to_builtins(stored)
    if args.save is None:
        shown["token"] = token
    else:
        shown["saved_to"] = str(args.save)
    if args.output == "json":
        print(json.dumps(shown))
        return 0
    print(f"created token {stored.token_id} (scope {stored.scope})")
    if args.save is None:
        print(f"token: {token}")
        print(f"it is shown only this once: store it now (use it as --token or ${TOKEN_ENV})")
    else:
        print(f"saved to {args.save} (mode 0600); use it with {TOKEN_FILE_ENV}={args.save}")
    return 0


class TokenFile:
    """A file opened, before the token exists, to receive it: ``write`` fills it (and puts
    it in place), ``discard`` removes whatever was not put in place."""

    def __init__(self, fd: int, path: Path, final: Path) -> None:
        self._fd: int | None = fd
        self._path = path
        self._final = final
        self._placed = False

    @classmethod
    def open(cls, path: Path, *, force: bool) -> TokenFile:
        """Open ``path`` (or, with ``force``, a temporary file beside it) with mode 0600;
        ``CommandFailed`` (exit 2) if ``path`` exists and not ``force``, or cannot be made."""
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
        target = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp") if force else path
        try:
            if force and path.is_dir():
                raise IsADirectoryError(errno.EISDIR, "Is a directory")
            path.parent.mkdir(parents=True, exist_ok=True, mode=TOKEN_DIRECTORY_MODE)
        except OSError as exc:  # a file where a directory should be, permissions ...
            raise CommandFailed(
                f"cannot create {path}: {exc.strerror or exc}", EXIT_USAGE
            ) from None
        try:
            fd = os.open(target, flags, TOKEN_FILE_MODE)
        except FileExistsError:
            raise CommandFailed(
                f"{path} exists; pass --force to replace it (or choose another path)", EXIT_USAGE
            ) from None
        except OSError as exc:
            raise CommandFailed(
                f"cannot create {path}: {exc.strerror or exc}", EXIT_USAGE
            ) from None
        os.fchmod(fd, TOKEN_FILE_MODE)
        return cls(fd, target, path)

    def write(self, token: str) -> None:
        fd, self._fd = self._fd, None
        if fd is None:
            raise RuntimeError("a token file is written once")
        try:
            os.write(fd, f"{token}\n".encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        if self._path != self._final:
            os.replace(self._path, self._final)
        self._placed = True

    def discard(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if not self._placed:
            self._path.unlink(missing_ok=True)


# --- list and revoke -------------------------------------------------------------------------


def run_list(args: argparse.Namespace) -> int:
    tokens = run_with_ledger(args, lambda ledger: ledger.tokens_list())
    if args.output == "json":
        print(json.dumps(msgspec.to_builtins(tokens)))
    elif not tokens:
        print("no tokens; create one with `carillon token create --admin`")
    else:
        print_table(
            ("TOKEN_ID", "SCOPE", "CREATED_AT", "REVOKED_AT", "DESCRIPTION"),
            [
                (
                    t.token_id,
                    t.scope,
                    cell(_utc(t.created_at)),
                    cell(_utc(t.revoked_at)),
                    one_line(t.description, DESCRIPTION_CHARS_SHOWN) or NONE,
                )
                for t in tokens
            ],
        )
    return 0


def run_revoke(args: argparse.Namespace) -> int:
    revoked = run_with_ledger(
        args, lambda ledger: ledger.tokens_revoke(TokensRevoke(args.token_id, cli_actor()))
    )
    if args.output == "json":
        print(json.dumps(msgspec.to_builtins(revoked)))
    else:
        print(
            f"revoked token {revoked.token_id} (scope {revoked.scope}) at "
            f"{_utc(revoked.revoked_at)}; API nodes refuse it within {TOKEN_CACHE_TTL_S:g} s"
        )
    return 0


def _utc(value: datetime | None) -> str | None:
    return None if value is None else format_utc(value)
