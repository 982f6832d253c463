"""The ledger contract's ``lifecycle`` area, on every backend (memory and real Postgres)."""

from engine.testing.ledger_contract.lifecycle import *  # noqa: F403
