"""The ledger contract's ``regions`` area, on every backend (memory and real Postgres)."""

from engine.testing.ledger_contract.regions import *  # noqa: F403
