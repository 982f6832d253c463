"""The ledger contract suite, one module per area of the :class:`~engine.ledger.base.Ledger`
protocol, to run against any ledger: Carillon's own (memory and Postgres) or yours.

=================  ==============================================================
``schedules``      schedules, the change feed, the schedule quota and census
``task_types``     task types, their grants to tenants, tenants
``leases``         the ledger's clock, leases and fencing, membership, planning writes
``executions``     due, claims, completions, retries, dead letters, retention, caps, stats
``lifecycle``      pausing, resuming, deleting, re-creating, trigger and backfill
``api``            API tokens, console sessions, replay audit, forged cursors
``regions``        the active region, its epoch, failover fencing
=================  ==============================================================

Every test takes a ``backend`` fixture: a :class:`~engine.testing.ledger_contract.backend.Backend`
with a fresh ledger of :data:`~engine.testing.ledger_contract.backend.PARTITIONS` partitions
holding the task type :data:`~engine.testing.ledger_contract.backend.NOOP`, and a way to move
that ledger's clock. Import the areas into a test module of yours and provide the fixture
(docs/testing.md has the whole example)::

    from engine.testing.ledger_contract.schedules import *  # noqa: F403

These modules need pytest (and pytest-trio, or another runner of ``async def`` tests);
``import engine.testing`` does not import them.
"""

import pytest

from engine.testing.ledger_contract.backend import (
    NOOP,
    PARTITIONS,
    START,
    Backend,
    memory_backend,
    put_noop_task_type,
)

AREAS = ("schedules", "task_types", "leases", "executions", "lifecycle", "api", "regions")
"""The contract's modules, one per protocol area."""

# Failed asserts in the areas' tests explain themselves, as in a test module of your own.
pytest.register_assert_rewrite(
    *(f"engine.testing.ledger_contract.{area}" for area in (*AREAS, "support"))
)

__all__ = [
    "AREAS",
    "NOOP",
    "PARTITIONS",
    "START",
    "Backend",
    "memory_backend",
    "put_noop_task_type",
]
