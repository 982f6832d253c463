"""The ledger on PostgreSQL: the product's durable store (asyncpg, behind the bridge).

Layout (SQL lives only in the ``sql*.py`` modules and ``migrations/*.sql``). The first six
modules are one per protocol area of :class:`~engine.ledger.base.Ledger`, each the twin of
the memory ledger's file of the same name (:mod:`engine.ledger.memory`)::

    ledger.py      PostgresLedger + open_postgres_ledger: the trio face, one hop per method
    cluster.py     settings, region failover, leases, membership      ┐ asyncio coroutines
    schedules.py   schedules, quotas, census and the change feed      │ run on the bridge's
    catalog.py     task types and tenants (dispatch settings)         │ loop, one
    executions.py  checkpoints, planning, dispatch, history, retention│ transaction each
    audit.py       trigger, backfill, dead letters, the audit trail   │
    tokens.py      API tokens and console sessions                    ┘
    caps.py        the claim's statements, cluster-wide concurrency caps
    fencing.py     the fence checks: locked (transactions) and in-statement (claim, complete)
    listener.py    LISTEN on a dedicated connection for schedule_changes_wait
    store.py       the pool, error translation and conflict retries around each operation
    connection.py  connection options, codecs, driver errors -> Carillon errors
    rows.py        rows -> records; batches -> array literals
    sql.py         the statements of most areas (+ sql_columns.py: keys, column lists)
    sql_executions.py  the execution statements: due, claim, extend, complete, skip, replay
    sql_api.py     the statements of tokens, sessions, trigger, backfill, census, statistics
    migrate.py     versioned migrations, the partition count, `carillon migrate`'s engine

Input is checked by the parameter objects (``params.checked()``, :mod:`engine.ledger.params`)
before any round trip, by the same rules and with the same messages as in memory.

This package and :mod:`engine.ledger.bridge` are the only importers of asyncpg/uvloop
(``tests/test_layering.py``).
"""

from engine.ledger.postgres.ledger import (
    POOL_MAX_DEFAULT,
    STATEMENT_TIMEOUT_S_DEFAULT,
    PostgresLedger,
    open_postgres_ledger,
)
from engine.ledger.postgres.migrate import (
    PARTITIONS_DEFAULT,
    MigrationReport,
    MigrationStatus,
    create_database,
    migrate,
    migrate_database,
    migration_status,
    read_migration_status,
)

__all__ = [
    "PARTITIONS_DEFAULT",
    "POOL_MAX_DEFAULT",
    "STATEMENT_TIMEOUT_S_DEFAULT",
    "MigrationReport",
    "MigrationStatus",
    "PostgresLedger",
    "create_database",
    "migrate",
    "migrate_database",
    "migration_status",
    "open_postgres_ledger",
    "read_migration_status",
]
