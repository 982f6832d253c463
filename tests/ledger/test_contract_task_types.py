"""The ledger contract's ``task_types`` area, on every backend (memory and real Postgres)."""

from engine.testing.ledger_contract.task_types import *  # noqa: F403
