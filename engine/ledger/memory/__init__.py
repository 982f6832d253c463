"""The ledger in process memory: deterministic, for unit tests and simulations.

Laid out as :mod:`engine.ledger.postgres` is, one file per protocol area of
:class:`~engine.ledger.base.Ledger`, each the twin of the Postgres file of the same name::

    ledger.py      MemoryLedger: the mixins below, composed (postgres: PostgresLedger)
    cluster.py     database clock, settings, region failover, leases, node membership
    schedules.py   schedules, quotas, census and the change feed
    catalog.py     task types and tenants (dispatch settings)
    executions.py  planning, the due read, claim, extend, complete, skip, re-queue,
                   retention, and the execution history (get, query, statistics)
    audit.py       operators' audited actions (trigger, backfill, dead-letter replay and
                   purge) and the audit trail
    tokens.py      API tokens and console sessions
    state.py       the tables every area shares and the one clock, ``_now()``
    tables.py      the tables and the row transitions (the schema and statements' twin)
"""

from engine.ledger.memory.ledger import MemoryLedger

__all__ = ["MemoryLedger"]
