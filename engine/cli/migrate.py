"""``carillon migrate``: bring the database schema up to date, or show where it stands.

The server is chosen as everywhere else (:mod:`engine.ledger.database`): ``--database-url``,
else ``$CARILLON_DATABASE_URL``, else the local server, else embedded PostgreSQL. Safe to run
from several nodes at once (the migrations take an advisory lock), and to run again.
"""

from __future__ import annotations

import argparse
import functools
from contextlib import ExitStack
from typing import Any

import trio

from engine.core.instants import format_utc
from engine.ledger.database import (
    APP_DATABASE,
    ResolvedDatabase,
    resolve_database,
    validate_database_url,
)
from engine.ledger.postgres.migrate import (
    PARTITIONS_DEFAULT,
    PARTITIONS_MAX,
    MigrationReport,
    MigrationStatus,
    check_partitions,
    create_database,
    migrate_database,
    read_migration_status,
)


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "migrate",
        help="create or upgrade the database schema",
        description=(
            "Apply the pending schema migrations (each in one transaction; concurrent runs "
            "wait for each other) and, on a new database, fix the partition count."
        ),
    )
    parser.add_argument(
        "--database-url",
        metavar="URL",
        help="postgresql://user:password@host:5432/dbname (default: $CARILLON_DATABASE_URL, "
        "else the local server, else embedded PostgreSQL)",
    )
    parser.add_argument(
        "--partitions",
        type=int,
        metavar="N",
        help=f"partition count of a new cluster, 1-{PARTITIONS_MAX} (default "
        f"{PARTITIONS_DEFAULT}); fixed once chosen",
    )
    parser.add_argument(
        "--status", action="store_true", help="show applied and pending migrations; change nothing"
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    check_partitions(args.partitions)
    with ExitStack() as stack:
        if args.database_url is not None:
            database = ResolvedDatabase(validate_database_url(args.database_url), "env")
        else:
            database = stack.enter_context(resolve_database())
        url = database.app_url
        where = f"{ResolvedDatabase(url, 'env').redacted_url} ({_source(args, database)})"
        if args.status:
            status = trio.run(read_migration_status, url)
            _print_status(status, where)
        else:
            if url != database.url and trio.run(create_database, database.url, APP_DATABASE):
                print(f"created database {APP_DATABASE!r}")
            report = trio.run(functools.partial(migrate_database, url, partitions=args.partitions))
            _print_report(report, where)
    return 0


def _source(args: argparse.Namespace, database: ResolvedDatabase) -> str:
    if args.database_url is not None:
        return "--database-url"
    return {"env": "$CARILLON_DATABASE_URL", "local": "local server"}.get(
        database.source, "embedded PostgreSQL"
    )


def _print_report(report: MigrationReport, where: str) -> None:
    print(f"database: {where}")
    if not report.applied:
        print(f"schema up to date at version {report.schema_version}")
    for migration in report.applied:
        print(f"applied {migration.version:04d}_{migration.name}")
    if report.partitions_created:
        print(f"created {report.partitions_created} partition leases")
    print(f"schema version {report.schema_version}; {report.partition_count} partitions")


def _print_status(status: MigrationStatus, where: str) -> None:
    print(f"database: {where}")
    print(f"schema version: {status.schema_version} (this Carillon: {status.latest_version})")
    count = status.partition_count
    print(f"partitions: {count if count is not None else 'not set (run carillon migrate)'}")
    print("applied:" if status.applied else "applied: none")
    for applied in status.applied:
        note = "  (file changed since it was applied)" if applied.modified else ""
        print(f"  {applied.version:04d}_{applied.name}  {format_utc(applied.applied_at)}{note}")
    if status.schema_version > status.latest_version:
        print("newer than this Carillon: upgrade Carillon before using this database")
    print("pending:" if status.pending else "pending: none")
    for migration in status.pending:
        print(f"  {migration.version:04d}_{migration.name}")
