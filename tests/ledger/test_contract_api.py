"""The ledger contract's ``api`` area, on every backend (memory and real Postgres)."""

from engine.testing.ledger_contract.api import *  # noqa: F403
