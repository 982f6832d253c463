"""Both ledgers are laid out along the same lines: one file per protocol area, same names.

A reader who finds ``executions_query`` in ``engine/ledger/memory/executions.py`` finds its
Postgres twin in ``engine/ledger/postgres/executions.py``, and the other way round.
"""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

from engine.ledger.base import Ledger
from engine.ledger.memory import MemoryLedger

AREAS = ("cluster", "schedules", "catalog", "executions", "audit", "tokens", "manifests")
"""The protocol areas: each a module of both ``engine.ledger.memory`` and
``engine.ledger.postgres``."""
NOT_A_STATEMENT = {"schedule_changes_wait": "listener"}
"""Methods whose Postgres side is not a transaction of an area module (LISTEN)."""
LEDGER = Path(__file__).resolve().parents[2] / "engine" / "ledger"


def protocol_methods() -> list[str]:
    return [name for name, value in vars(Ledger).items() if inspect.iscoroutinefunction(value)]


def test_every_method_lives_in_the_same_area_file_in_both_backends() -> None:
    postgres = {area: importlib.import_module(f"engine.ledger.postgres.{area}") for area in AREAS}
    misplaced = {}
    for name in protocol_methods():
        memory_area = getattr(MemoryLedger, name).__module__.rsplit(".", 1)[1]
        postgres_areas = [
            area
            for area, module in postgres.items()
            if inspect.iscoroutinefunction(getattr(module, name, None))
        ]
        expected = [] if name in NOT_A_STATEMENT else [memory_area]
        if memory_area not in AREAS or postgres_areas != expected:
            misplaced[name] = (memory_area, postgres_areas)
    assert misplaced == {}


def test_both_backends_have_a_file_for_each_area() -> None:
    for backend in ("memory", "postgres"):
        assert {area for area in AREAS if (LEDGER / backend / f"{area}.py").is_file()} == set(AREAS)


def test_the_protocol_module_is_imported_for_the_protocol_only() -> None:
    """``engine.ledger.base`` is the protocol and its docstrings: the records and parameters
    are imported from ``engine.ledger.params``, the shared checks and messages from
    ``engine.ledger.checks`` and ``engine.ledger.common``."""
    root = LEDGER.parents[1]
    elsewhere = {}
    for folder in ("engine", "simulations", "tests", "benchmarks"):
        for path in sorted((root / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
                if isinstance(node, ast.ImportFrom) and node.module == "engine.ledger.base":
                    names = sorted(alias.name for alias in node.names if alias.name != "Ledger")
                    if names:
                        elsewhere[str(path.relative_to(root))] = names
    assert elsewhere == {}
