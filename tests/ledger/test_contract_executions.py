"""The ledger contract's ``executions`` area, on every backend (memory and real Postgres)."""

from engine.testing.ledger_contract.executions import *  # noqa: F403
