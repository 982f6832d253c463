"""The ledger contract's ``schedules`` area, on every backend (memory and real Postgres)."""

from engine.testing.ledger_contract.schedules import *  # noqa: F403
