"""The ledger contract's ``leases`` area, on every backend (memory and real Postgres)."""

from engine.testing.ledger_contract.leases import *  # noqa: F403
