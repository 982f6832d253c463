"""The layering rules of docs/architecture.md ("Layering"), enforced on the source tree."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ENGINE = Path(__file__).resolve().parents[1] / "engine"

# Module -> prefixes of imports it must not make.
CORE_FORBIDDEN = (
    "trio",
    "asyncpg",
    "uvloop",
    "asyncio",
    "engine.clock",
    "engine.ledger",
    "engine.actors",
    "engine.api",
    "engine.cli",
    "engine.testing",
    "time",
    "random",
    "socket",
)
ASYNCPG_IMPORTERS = ("ledger/postgres/", "ledger/bridge.py")
"""Modules (exact path) or packages (trailing slash: every module below) that may."""
WEB_IMPORTERS_PREFIX = "api/"


def imports_of(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def engine_modules() -> list[Path]:
    return sorted(ENGINE.rglob("*.py"))


def matches(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def test_core_is_pure() -> None:
    offenders = {
        str(path.relative_to(ENGINE)): sorted(
            name for name in imports_of(path) if any(matches(name, p) for p in CORE_FORBIDDEN)
        )
        for path in (ENGINE / "core").rglob("*.py")
    }
    assert {module: names for module, names in offenders.items() if names} == {}


def test_only_the_postgres_ledger_touches_asyncpg() -> None:
    importers = {
        str(path.relative_to(ENGINE))
        for path in engine_modules()
        if any(matches(name, "asyncpg") or matches(name, "uvloop") for name in imports_of(path))
    }
    assert {module for module in importers if not module.startswith(ASYNCPG_IMPORTERS)} == set()


def test_only_the_api_touches_the_web_stack() -> None:
    importers = {
        str(path.relative_to(ENGINE))
        for path in engine_modules()
        if any(
            matches(name, lib) for name in imports_of(path) for lib in ("hypercorn", "starlette")
        )
    }
    assert all(module.startswith(WEB_IMPORTERS_PREFIX) for module in importers)


def test_actors_never_import_the_node() -> None:
    """The node wires the actors (``engine/node.py``); they get what they share as a
    ``NodeContext`` (``engine/actors/context.py``), never by reaching back into the node."""
    importers = {
        str(path.relative_to(ENGINE))
        for path in (ENGINE / "actors").rglob("*.py")
        if any(matches(name, "engine.node") for name in imports_of(path))
    }
    assert importers == set()


def test_engine_never_imports_simulations_or_tests() -> None:
    importers = {
        str(path.relative_to(ENGINE))
        for path in engine_modules()
        if any(matches(name, "simulations") or matches(name, "tests") for name in imports_of(path))
    }
    assert importers == set(LAZY_SIMULATIONS_IMPORTERS)


LAZY_SIMULATIONS_IMPORTERS = ("cli/simulate.py",)
"""``carillon simulate`` runs the simulator; it imports it inside the command, never when the
engine (or the ``carillon`` command) is imported."""


def module_level_imports_of(path: Path) -> set[str]:
    """Imports outside any function (what importing the module executes)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    stack: list[ast.AST] = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            continue
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
        stack.extend(ast.iter_child_nodes(node))
    return names


def test_the_simulate_command_imports_simulations_only_when_it_runs() -> None:
    for relative in LAZY_SIMULATIONS_IMPORTERS:
        names = module_level_imports_of(ENGINE / relative)
        assert not any(matches(name, "simulations") for name in names), relative


def test_engine_reads_no_ambient_time_outside_the_system_clock() -> None:
    offenders = []
    for path in engine_modules():
        relative = str(path.relative_to(ENGINE))
        if relative == "clock.py":
            continue
        text = path.read_text()
        for needle in ("datetime.now(", "time.time(", "datetime.utcnow(", "time.monotonic("):
            if needle in text:
                offenders.append(f"{relative}: {needle}")
    assert offenders == []


FORBIDDEN_EDGES = (
    # (package or module below engine/, import prefix it must not make)
    ("metrics", "engine.node"),
    ("metrics", "engine.actors"),
    ("actors", "engine.node"),
    ("ledger", "engine.actors"),
)
"""Edges that would close a cycle in the import graph (issue #28): the node wires the actors
and the metrics; the actors move the metrics and use the ledger; the metrics know neither the
node nor the actors (the node hands them gauges assembled from the actors' statistics). Any
import counts, including one made only for type checking."""


@pytest.mark.parametrize(("below", "prefix"), FORBIDDEN_EDGES)
def test_no_import_closes_a_cycle(below: str, prefix: str) -> None:
    offenders = {
        str(path.relative_to(ENGINE)): sorted(
            name for name in imports_of(path) if matches(name, prefix)
        )
        for path in (ENGINE / below).rglob("*.py")
    }
    assert {module: names for module, names in offenders.items() if names} == {}
    assert offenders, f"engine/{below} has no modules"


def test_relative_imports_are_not_used_where_the_edges_are_checked() -> None:
    # imports_of reads absolute imports only: a relative one would slip past the checks above.
    relative = [
        str(path.relative_to(ENGINE))
        for below in {below for below, _ in FORBIDDEN_EDGES}
        for path in (ENGINE / below).rglob("*.py")
        if any(
            isinstance(node, ast.ImportFrom) and node.level > 0
            for node in ast.walk(ast.parse(path.read_text()))
        )
    ]
    assert relative == []


def test_only_the_testing_kit_imports_it_and_only_its_contract_suite_imports_pytest() -> None:
    """``engine.testing`` is for tests: the engine never depends on it, and importing it
    needs no pytest (only the contract suite's modules, imported on their own, do)."""
    testing_importers = set()
    pytest_importers = set()
    for path in engine_modules():
        relative = str(path.relative_to(ENGINE))
        names = imports_of(path)
        if any(matches(name, "engine.testing") for name in names):
            testing_importers.add(relative)
        if any(matches(name, "pytest") or matches(name, "_pytest") for name in names):
            pytest_importers.add(relative)
    assert {m for m in testing_importers if not m.startswith("testing/")} == set()
    assert {m for m in pytest_importers if not m.startswith("testing/ledger_contract/")} == set()


OTEL_SDK_IMPORTERS = ("tracing.py",)
"""Where the OpenTelemetry SDK and exporters (the ``tracing`` extra) may be imported: inside
a function only, so that with tracing off they are never imported (docs/tracing.md)."""


def test_only_the_tracing_module_imports_the_opentelemetry_sdk_and_only_lazily() -> None:
    sdk = ("opentelemetry.sdk", "opentelemetry.exporter")
    importers = {
        str(path.relative_to(ENGINE))
        for path in engine_modules()
        if any(matches(name, prefix) for name in imports_of(path) for prefix in sdk)
    }
    assert importers <= set(OTEL_SDK_IMPORTERS)
    for relative in OTEL_SDK_IMPORTERS:
        names = module_level_imports_of(ENGINE / relative)
        assert not any(matches(name, prefix) for name in names for prefix in sdk), relative
