"""The ledger on PostgreSQL: the product's durable store (asyncpg, behind the bridge).

Layout (SQL lives only in :mod:`.sql` and ``migrations/*.sql``)::

    ledger.py      PostgresLedger + open_postgres_ledger: the trio face, one hop per method
    schedules.py   schedule operations and the change feed       ┐ asyncio coroutines run on
    executions.py  planning, claiming, completing, querying      │ the bridge's loop, one
    cluster.py     settings, leases, membership, checkpoints     │ transaction each
    catalog.py     task types and tenants (dispatch settings)    │
    audit.py       dead-letter replay and the audit trail        ┘
    caps.py        the claim's statements, cluster-wide concurrency caps
    fencing.py     the fence checks: locked (transactions) and in-statement (claim, complete)
    listener.py    LISTEN on a dedicated connection for schedule_changes_wait
    store.py       the pool, error translation and conflict retries around each operation
    connection.py  connection options, codecs, driver errors -> Carillon errors
    rows.py        rows -> records; input checks
    sql.py         every statement but the executions' (+ sql_columns.py: keys, column lists)
    sql_executions.py  the execution statements: due, claim, extend, complete, skip, replay
    migrate.py     versioned migrations, the partition count, `carillon migrate`'s engine

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
