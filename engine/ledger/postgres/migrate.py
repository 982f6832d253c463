"""Schema migrations: versioned SQL files, applied in order, each recorded once.

The files live in ``migrations/`` and are named ``NNNN_description.sql`` (versions 1, 2, 3,
... without gaps). :func:`migrate` brings a database up to the newest version this code
knows, and fixes the cluster's partition count the first time.

Invariants:

* **Safe to run from several nodes at once**: the whole run holds a session advisory lock,
  so concurrent runs queue up (trying it every :data:`MIGRATION_LOCK_POLL_S`); the first
  applies, the others find nothing to do.
* **Each version is applied in one transaction** together with its row in
  ``carillon_schema_migrations``: a crash leaves the database at a recorded version.
* **Idempotent**: a second run changes nothing.
* **Refusals change nothing**: a database at a version *newer* than this code knows, or a
  ``partitions`` different from the fixed count, is refused with ``ConfigError`` before
  any statement that writes.
* The partition count is chosen once (default :data:`PARTITIONS_DEFAULT`), stored in
  ``cluster_settings`` and given one lease row per partition (no owner, token 0), in the
  same transaction as the last migration applied, so a schema never exists without them.

**Online migrations** move a live ledger without stopping it. A file whose first line is
``-- carillon: online`` is not run in one transaction: it is a list of *steps*, each one SQL
statement after a line ``-- step`` (or ``-- step: repeat``), run one at a time outside any
transaction, so a step may be ``CREATE INDEX CONCURRENTLY`` (which takes no lock that stops
writes) and a long data move may commit as it goes. Its version is recorded only after the
last step, so:

* **Resumable**: an interrupted run (crash, cancel, lost connection) leaves the version
  unrecorded, and the next run does every step again; steps are written to be idempotent
  (``IF NOT EXISTS``, ``IF EXISTS``, a data step's ``WHERE`` skipping rows already moved).
  A ``CREATE INDEX CONCURRENTLY IF NOT EXISTS`` interrupted midway leaves an *invalid*
  index that ``IF NOT EXISTS`` would keep: before such a step its index is dropped when
  PostgreSQL marks it invalid.
* **Batched**: a ``-- step: repeat`` statement (e.g. an ``UPDATE`` of the next 10,000 rows not
  yet moved) runs again, each run its own transaction, until it changes no row: a data move
  holds its row locks for one batch, never for the whole table.
* Nodes of the old version keep running while the steps run (the old schema stays usable
  until the file's last step says otherwise); a node of either version that starts checks
  that the schema is exactly its own (:mod:`engine.ledger.postgres.ledger`), so an old node
  refuses a migrated database and a new node an unmigrated one, each with a clear message.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime
from importlib import resources
from typing import Final

import asyncpg
import msgspec

from engine.errors import ConfigError, InvalidField
from engine.ledger.bridge import DatabaseBridge, open_bridge
from engine.ledger.params import PARTITIONS_DEFAULT
from engine.ledger.postgres import sql
from engine.ledger.postgres.connection import connect, translate_errors

__all__ = [
    "PARTITIONS_DEFAULT",
    "PARTITIONS_MAX",
    "AppliedMigration",
    "Migration",
    "MigrationReport",
    "MigrationStatus",
    "known_migrations",
    "latest_version",
    "migrate",
    "migrate_database",
    "migration_status",
    "read_migration_status",
]

PARTITIONS_MAX: Final = 4096
MIGRATION_LOCK_POLL_S: Final = 0.1
"""How often a run waiting for another's migration lock tries again."""

_FILE_NAME: Final = re.compile(r"^(?P<version>[0-9]{4})_(?P<name>[a-z0-9_]+)\.sql$")
ONLINE_HEADER: Final = "-- carillon: online"
_STEP: Final = re.compile(r"^-- step(?P<repeat>: repeat)?[ \t]*$", re.MULTILINE)
_CONCURRENT_INDEX: Final = re.compile(
    r"CREATE\s+(?:UNIQUE\s+)?INDEX\s+CONCURRENTLY\s+IF\s+NOT\s+EXISTS\s+(?P<name>[a-z_][a-z0-9_]*)",
    re.IGNORECASE,
)


class Step(msgspec.Struct, frozen=True):
    """One statement of an online migration, run outside any transaction."""

    sql: str
    repeat: bool = False
    """Run again, each run its own transaction, until it changes no row (a batched move)."""


class Migration(msgspec.Struct, frozen=True):
    """One migration file of this code."""

    version: int
    name: str
    sql: str
    checksum: str
    """SHA-256 of the file, recorded when applied (a later edit of an applied file shows)."""
    steps: tuple[Step, ...] = ()
    """An online migration's steps (see the module docstring); empty for one run in a
    transaction."""

    @property
    def online(self) -> bool:
        return bool(self.steps)


def parse_migration(version: int, name: str, text: str) -> Migration:
    """The migration of file ``NNNN_name.sql`` holding ``text``; an online one (first line
    :data:`ONLINE_HEADER`) split into its steps, each a single statement."""
    checksum = hashlib.sha256(text.encode()).hexdigest()
    if text.split("\n", 1)[0].strip() != ONLINE_HEADER:
        return Migration(version=version, name=name, sql=text, checksum=checksum)
    markers = list(_STEP.finditer(text))
    if not markers or _code(text[: markers[0].start()]):
        raise AssertionError(f"online migration {version}: SQL before its first '-- step' line")
    steps = []
    for marker, following in zip(markers, [*markers[1:], None], strict=True):
        body = text[marker.end() : None if following is None else following.start()].strip()
        if not _code(body):
            raise AssertionError(f"online migration {version}: an empty step")
        steps.append(Step(sql=body, repeat=marker["repeat"] is not None))
    return Migration(version=version, name=name, sql=text, checksum=checksum, steps=tuple(steps))


def _code(text: str) -> str:
    """``text`` without its comment lines and blank space: what PostgreSQL would run."""
    lines = (line for line in text.splitlines() if not line.strip().startswith("--"))
    return "\n".join(lines).strip()


class AppliedMigration(msgspec.Struct, frozen=True):
    version: int
    name: str
    applied_at: datetime
    modified: bool
    """The file of this version differs from what was applied (``False`` if unknown)."""


class MigrationReport(msgspec.Struct, frozen=True):
    """What one :func:`migrate` run did."""

    applied: list[Migration]
    """Migrations applied by this run, in order (empty: the schema was up to date)."""
    schema_version: int
    partition_count: int
    partitions_created: int
    """Lease rows created by this run (the partition count on a fresh database, else 0)."""


class MigrationStatus(msgspec.Struct, frozen=True):
    applied: list[AppliedMigration]
    pending: list[Migration]
    schema_version: int
    """The newest applied version (0: none)."""
    latest_version: int
    """The newest version this code knows."""
    partition_count: int | None


def known_migrations() -> list[Migration]:
    """The migration files shipped with this code, by version (1, 2, ... without gaps)."""
    folder = resources.files("engine.ledger.postgres").joinpath("migrations")
    found = []
    for entry in folder.iterdir():
        match = _FILE_NAME.match(entry.name)
        if match is None:
            continue
        text = entry.read_text(encoding="utf-8")
        found.append(parse_migration(int(match["version"]), match["name"], text))
    found.sort(key=lambda migration: migration.version)
    if [m.version for m in found] != list(range(1, len(found) + 1)):
        raise AssertionError(f"migration versions must be 1..n: {[m.version for m in found]}")
    return found


def latest_version() -> int:
    return len(known_migrations())


def check_partitions(partitions: int | None) -> int | None:
    if partitions is not None and not 1 <= partitions <= PARTITIONS_MAX:
        raise InvalidField(
            f"the partition count must be between 1 and {PARTITIONS_MAX}, got {partitions}"
        )
    return partitions


async def migrate(
    connection: asyncpg.Connection,
    *,
    partitions: int | None = None,
    migrations: list[Migration] | None = None,
) -> MigrationReport:
    """Apply the pending migrations over ``connection`` (asyncio; any event loop).

    ``partitions`` fixes the partition count on a fresh database (default 64) and must
    equal the stored count afterwards (``None``: keep it). Raises ``InvalidField`` for a
    count outside 1..4096 and ``ConfigError`` for a refused migration. ``migrations``
    replaces the shipped files (tests of the machinery only).
    """
    check_partitions(partitions)
    known = known_migrations() if migrations is None else migrations
    while not await connection.fetchval(sql.MIGRATION_TRY_LOCK):
        await asyncio.sleep(MIGRATION_LOCK_POLL_S)  # see sql.MIGRATION_TRY_LOCK
    try:
        await connection.execute(sql.MIGRATIONS_TABLE_CREATE)
        applied = {row["version"] for row in await connection.fetch(sql.MIGRATIONS_APPLIED)}
        _refuse_newer(applied, known)
        stored = await _stored_partition_count(connection)
        if partitions is not None and stored is not None and partitions != stored:
            raise ConfigError(
                f"the partition count is fixed at {stored} when a cluster is first migrated; "
                f"it cannot become {partitions} (omit --partitions, or migrate a new database)"
            )
        pending = [migration for migration in known if migration.version not in applied]
        count, created = 0, 0
        for migration in pending:
            if migration.online:
                await _run_steps(connection, migration)
            async with connection.transaction():
                if not migration.online:
                    await connection.execute(migration.sql)
                await connection.execute(
                    sql.MIGRATION_RECORD, migration.version, migration.name, migration.checksum
                )
                if migration is pending[-1]:
                    count, created = await _initialize_cluster(connection, partitions)
        if not pending:
            async with connection.transaction():  # repairs a database set up by hand
                count, created = await _initialize_cluster(connection, partitions)
    finally:
        # A lost connection has released the lock with its session already.
        with contextlib.suppress(OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
            if not connection.is_closed():
                await connection.execute(sql.MIGRATION_UNLOCK)
    return MigrationReport(
        applied=pending,
        schema_version=known[-1].version,
        partition_count=count,
        partitions_created=created,
    )


async def migration_status(connection: asyncpg.Connection) -> MigrationStatus:
    """Which migrations are applied and pending, and the partition count (read only)."""
    known = known_migrations()
    applied: list[AppliedMigration] = []
    if await connection.fetchval(sql.MIGRATIONS_TABLE_EXISTS):
        checksums = {m.version: m.checksum for m in known}
        applied = [
            AppliedMigration(
                version=row["version"],
                name=row["name"],
                applied_at=row["applied_at"],
                modified=checksums.get(row["version"], row["checksum"]) != row["checksum"],
            )
            for row in await connection.fetch(sql.MIGRATIONS_APPLIED)
        ]
    versions = {migration.version for migration in applied}
    return MigrationStatus(
        applied=applied,
        pending=[migration for migration in known if migration.version not in versions],
        schema_version=max(versions, default=0),
        latest_version=known[-1].version,
        partition_count=await _stored_partition_count(connection),
    )


# --- trio entry points (one bridge hop each) ------------------------------------------------


async def migrate_database(
    url: str, *, partitions: int | None = None, bridge: DatabaseBridge | None = None
) -> MigrationReport:
    """:func:`migrate` the database at ``url`` from trio, on a connection of its own."""
    check_partitions(partitions)
    async with _bridge(bridge) as opened:
        return await opened.call(_migrate_url, url, partitions)


async def read_migration_status(
    url: str, *, bridge: DatabaseBridge | None = None
) -> MigrationStatus:
    """:func:`migration_status` of the database at ``url``, from trio."""
    async with _bridge(bridge) as opened:
        return await opened.call(_status_url, url)


async def create_database(
    server_url: str, name: str, *, bridge: DatabaseBridge | None = None
) -> bool:
    """Create database ``name`` on the server of ``server_url`` unless it exists; returns
    whether it was created. Safe when several processes do it at once."""
    async with _bridge(bridge) as opened:
        return await opened.call(_create_database, server_url, name)


IDENTIFIER_BYTES_MAX: Final = 63
"""PostgreSQL's identifier length (NAMEDATALEN - 1); a longer name would be cut silently."""


def quote_identifier(name: str) -> str:
    """``name`` as a quoted SQL identifier (double quotes doubled), for statements that take
    no parameters there (``CREATE DATABASE``); a name PostgreSQL would change or refuse is a
    :class:`~engine.errors.ConfigError`."""
    if not name or "\x00" in name or len(name.encode()) > IDENTIFIER_BYTES_MAX:
        raise ConfigError(
            f"{name!r} cannot name a database: 1 to {IDENTIFIER_BYTES_MAX} bytes, no NUL"
        )
    return '"' + name.replace('"', '""') + '"'


async def _create_database(server_url: str, name: str) -> bool:
    statement = f"CREATE DATABASE {quote_identifier(name)}"
    connection = await connect(server_url)
    try:
        with translate_errors(server_url):
            if await connection.fetchval(sql.DATABASE_EXISTS, name):
                return False
            try:
                await connection.execute(statement)
            except asyncpg.DuplicateDatabaseError:
                return False  # another process created it meanwhile
            return True
    finally:
        await _close_quietly(connection)


async def _migrate_url(url: str, partitions: int | None) -> MigrationReport:
    connection = await connect(url)
    try:
        with translate_errors(url):
            return await migrate(connection, partitions=partitions)
    finally:
        await _close_quietly(connection)


async def _status_url(url: str) -> MigrationStatus:
    connection = await connect(url)
    try:
        with translate_errors(url):
            return await migration_status(connection)
    finally:
        await _close_quietly(connection)


@asynccontextmanager
async def _bridge(bridge: DatabaseBridge | None) -> AsyncIterator[DatabaseBridge]:
    if bridge is not None:
        yield bridge
        return
    async with open_bridge() as opened:
        yield opened


# --- helpers --------------------------------------------------------------------------------


async def _run_steps(connection: asyncpg.Connection, migration: Migration) -> None:
    """Run an online migration's steps, each outside any transaction (see the module
    docstring); an index an interrupted run left invalid is dropped before it is built."""
    for step in migration.steps:
        for match in _CONCURRENT_INDEX.finditer(step.sql):
            name = match["name"]
            if await connection.fetchval(sql.INDEX_INVALID, name):
                await connection.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")
        while True:
            status = await connection.execute(step.sql)
            if not step.repeat or _rows_changed(status) == 0:
                break


def _rows_changed(status: str) -> int:
    """The row count of a command status (``UPDATE 10000``, ``INSERT 0 5``, ``DELETE 0``)."""
    last = status.rsplit(" ", 1)[-1]
    return int(last) if last.isdigit() else 0


def _refuse_newer(applied: set[int], known: list[Migration]) -> None:
    newest = max(applied, default=0)
    if newest > known[-1].version:
        raise ConfigError(
            f"the database schema is at version {newest}, newer than the newest this "
            f"Carillon knows ({known[-1].version}): upgrade Carillon before using this "
            "database; nothing was changed"
        )


async def _stored_partition_count(connection: asyncpg.Connection) -> int | None:
    if not await connection.fetchval(sql.CLUSTER_SETTINGS_EXISTS):
        return None
    count: int | None = await connection.fetchval(sql.CLUSTER_PARTITION_COUNT)
    return count


async def _initialize_cluster(
    connection: asyncpg.Connection, partitions: int | None
) -> tuple[int, int]:
    """Store the partition count if none is, and make sure every lease row exists."""
    count: int | None = await connection.fetchval(sql.CLUSTER_PARTITION_COUNT_FOR_UPDATE)
    if count is None:
        count = PARTITIONS_DEFAULT if partitions is None else partitions
        await connection.execute(sql.CLUSTER_INITIALIZE, count)
    created = await connection.fetch(sql.LEASES_CREATE, count)
    return count, len(created)


async def _close_quietly(connection: asyncpg.Connection) -> None:
    try:
        await connection.close(timeout=5.0)
    except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError):
        connection.terminate()
