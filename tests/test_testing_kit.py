"""The public test toolkit (engine.testing): what it promises people testing their own handlers
and ledgers -- the fault-injecting ledger, the cluster harness, the contract suite's layout."""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
import trio
import trio.testing

import engine.testing
from engine.errors import LeaseLost, LedgerUnavailable, NotFound
from engine.ledger.params import ExecutionsPlan, Fence, LeasesAcquire, LeasesRenew, SchedulesCreate
from engine.model import Schedule
from engine.testing import (
    LEDGER_METHODS,
    FaultyLedger,
    ManualClock,
    MemoryLedger,
    SkewedClock,
    all_executions,
    open_cluster,
)
from engine.testing.ledger_contract import AREAS, put_noop_task_type

ROOT = Path(__file__).resolve().parents[1]
START = datetime(2026, 3, 2, tzinfo=UTC)


async def memory() -> MemoryLedger:
    ledger = MemoryLedger(clock=ManualClock(START), partition_count=4)
    await put_noop_task_type(ledger)
    return ledger


def minutely(schedule_id: str) -> Schedule:
    return Schedule(
        schedule_id=schedule_id, tenant_id="acme", cron_expr="* * * * *", task_type="noop"
    )


# --- importing it --------------------------------------------------------------------------


def test_importing_the_toolkit_needs_no_pytest() -> None:
    """``import engine.testing`` works where pytest cannot be imported, and imports none of
    the contract suite (which needs it)."""
    script = (
        "import sys\n"
        "class NoPytest:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'pytest' or name.startswith(('pytest.', '_pytest')):\n"
        "            raise ImportError(f'no {name} here')\n"
        "sys.meta_path.insert(0, NoPytest())\n"
        "import engine.testing\n"
        "from engine.testing import FaultyLedger, MemoryLedger, open_cluster\n"
        "assert not any(m.startswith(('pytest', '_pytest')) for m in sys.modules)\n"
        "assert 'engine.testing.ledger_contract' not in sys.modules\n"
        "print(engine.testing.__file__)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == engine.testing.__file__


def test_the_contract_areas_are_the_modules_of_the_suite_and_all_of_them_run_here() -> None:
    """Every area's tests are collected by tests/ledger/test_contract.py, none shadowed by
    another area's test of the same name."""
    package = ROOT / "engine" / "testing" / "ledger_contract"
    modules = {path.stem for path in package.glob("*.py")} - {"__init__", "backend", "support"}
    assert set(AREAS) == modules
    runner = importlib.import_module("tests.ledger.test_contract")
    tests: dict[str, str] = {}
    for area in AREAS:
        module = importlib.import_module(f"engine.testing.ledger_contract.{area}")
        for name, value in vars(module).items():
            if name.startswith("test_") and getattr(value, "__module__", None) == module.__name__:
                assert name not in tests, f"{name} is in both {tests[name]} and {area}"
                tests[name] = area
                assert getattr(runner, name) is value, name
    assert len(tests) >= 100


# --- FaultyLedger ----------------------------------------------------------------------------


async def test_a_faulty_ledger_forwards_every_protocol_method_and_nothing_else() -> None:
    inner = await memory()
    faulty = FaultyLedger(inner)
    assert {"schedules_create", "executions_claim", "leases_acquire"} <= LEDGER_METHODS
    assert all(callable(getattr(faulty, name)) for name in LEDGER_METHODS)
    with pytest.raises(AttributeError):
        faulty.partition_count  # type: ignore[attr-defined]  # noqa: B018
    ledger = faulty.as_ledger()
    await ledger.schedules_create(SchedulesCreate([minutely("a")]))
    assert (await inner.schedules_get("a")).schedule_id == "a"
    with pytest.raises(NotFound):
        await ledger.schedules_get("missing")
    assert faulty.calls == {"schedules_create": 1, "schedules_get": 1}
    assert faulty.history == [("schedules_create", "ok"), ("schedules_get", "error")]


async def test_faults_are_set_by_method_name_and_a_misspelt_name_is_refused() -> None:
    faulty = FaultyLedger(await memory())
    for inject in (
        lambda: faulty.fail_next("schedule_create", RuntimeError()),
        lambda: faulty.lose_reply("executions_claims"),
        lambda: faulty.delay("leases_renewal", 1.0),
        lambda: faulty.hold("database_time"),
        lambda: faulty.pause_at_next("plan"),
    ):
        with pytest.raises(ValueError, match="not a method of the ledger protocol"):
            inject()


async def test_down_fails_every_call_before_it_reaches_the_ledger() -> None:
    inner = await memory()
    faulty = FaultyLedger(inner)
    faulty.down = True
    with pytest.raises(LedgerUnavailable):
        await faulty.as_ledger().schedules_create(SchedulesCreate([minutely("a")]))
    assert faulty.calls == {}
    assert await inner.schedules_count("acme") == 0
    faulty.down = False
    await faulty.as_ledger().schedules_create(SchedulesCreate([minutely("a")]))
    assert await inner.schedules_count("acme") == 1
    assert faulty.history == [("schedules_create", "down"), ("schedules_create", "ok")]


async def test_an_injected_error_is_raised_as_many_times_as_asked_then_calls_go_through() -> None:
    faulty = FaultyLedger(await memory())
    ledger = faulty.as_ledger()
    faulty.fail_next("database_now", RuntimeError("a bug"), times=2)
    for _ in range(2):
        with pytest.raises(RuntimeError, match="a bug"):
            await ledger.database_now()
    assert await ledger.database_now() == START
    faulty.fail_next("cluster_get", LedgerUnavailable("gone"), times=None)
    for _ in range(3):
        with pytest.raises(LedgerUnavailable):
            await ledger.cluster_get()
    assert faulty.calls == {"database_now": 1}


async def test_a_lost_reply_commits_the_write_yet_fails_the_call() -> None:
    """Crash after commit: the caller cannot tell the write happened, the ledger has it."""
    inner = await memory()
    faulty = FaultyLedger(inner)
    faulty.lose_reply("schedules_create")
    with pytest.raises(LedgerUnavailable, match="commit unknown"):
        await faulty.as_ledger().schedules_create(SchedulesCreate([minutely("a")]))
    assert (await inner.schedules_get("a")).version == 1
    assert faulty.history == [("schedules_create", "reply-lost")]


async def test_a_delay_makes_each_call_take_that_long_on_the_mock_clock(
    autojump_clock: trio.testing.MockClock,
) -> None:
    faulty = FaultyLedger(await memory())
    faulty.delay("database_now", 3.0)
    began = trio.current_time()
    await faulty.as_ledger().database_now()
    assert trio.current_time() - began == 3.0
    faulty.delay("database_now", 0)
    began = trio.current_time()
    await faulty.as_ledger().database_now()
    assert trio.current_time() == began


async def test_a_delay_applies_only_to_the_calls_its_condition_picks(
    autojump_clock: trio.testing.MockClock,
) -> None:
    faulty = FaultyLedger(await memory())
    faulty.delay("leases_acquire", 5.0, when=lambda args: 1 in args[0].partition_ids)
    ledger = faulty.as_ledger()
    began = trio.current_time()
    await ledger.leases_acquire(LeasesAcquire("n1", [0], 60))
    assert trio.current_time() == began
    await ledger.leases_acquire(LeasesAcquire("n1", [1], 60))
    assert trio.current_time() - began == 5.0


async def test_concurrent_calls_in_flight_are_counted(
    autojump_clock: trio.testing.MockClock,
) -> None:
    faulty = FaultyLedger(await memory())
    faulty.delay("database_now", 1.0)
    async with trio.open_nursery() as nursery:
        for _ in range(3):
            nursery.start_soon(faulty.as_ledger().database_now)
    assert faulty.most_in_flight["database_now"] == 3
    assert faulty.in_flight["database_now"] == 0


async def test_a_held_call_is_in_flight_and_survives_its_callers_cancellation(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A request already sent reaches the ledger even if the caller gave up meanwhile."""
    inner = await memory()
    faulty = FaultyLedger(inner)
    hold = faulty.hold("schedules_create")
    caller = trio.CancelScope()

    async def send() -> None:
        with caller:
            await faulty.as_ledger().schedules_create(SchedulesCreate([minutely("late")]))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(send)
        await hold.reached.wait()
        caller.cancel()  # the caller gives up
        await trio.sleep(1)
        assert hold.held == 1
        assert await inner.schedules_count("acme") == 0
        hold.release()
    assert (await inner.schedules_get("late")).schedule_id == "late"
    await faulty.as_ledger().schedules_create(SchedulesCreate([minutely("free")]))  # released
    assert faulty.calls["schedules_create"] == 2


async def test_a_pause_caught_in_flight_lets_the_write_go_out_after_the_lease_is_lost(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A frozen process's plan is refused when it thaws: its lease expired meanwhile."""
    db_clock = SkewedClock(START)
    inner = MemoryLedger(clock=db_clock, partition_count=1)
    await put_noop_task_type(inner)
    [lease] = await inner.leases_acquire(LeasesAcquire("n1", [0], 15))
    fence = Fence(0, "n1", lease.fencing_token)
    faulty = FaultyLedger(inner)
    faulty.pause_at_next("executions_plan")
    outcome: list[str] = []

    async def plan() -> None:
        try:
            await faulty.as_ledger().executions_plan(ExecutionsPlan(fence, [], []))
        except LeaseLost:
            outcome.append("lease-lost")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(plan)
        await faulty.paused_in_flight.wait()
        assert faulty.paused
        await trio.sleep(60)
        assert await inner.leases_acquire(LeasesAcquire("n2", [0], 15))
        faulty.resume()
    assert outcome == ["lease-lost"]
    assert faulty.history == [("executions_plan", "lease-lost")]
    assert await faulty.as_ledger().leases_renew(LeasesRenew([fence], 15)) == []


# --- the cluster -----------------------------------------------------------------------------


async def test_a_cluster_node_whose_ledger_is_down_loses_its_partitions_to_the_other(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with open_cluster(partitions=8) as cluster:
        await put_noop_task_type(cluster.ledger)
        await cluster.ledger.schedules_create(SchedulesCreate([minutely(f"s{n}") for n in "ab"]))
        first = await cluster.start_node("n1")
        await cluster.start_node("n2")
        await trio.sleep(60)
        assert sorted(len(owned) for owned in cluster.owners().values()) == [4, 4]
        first.ledger.down = True
        first.scope.cancel()
        await trio.sleep(60)
        assert len(cluster.owners()["n2"]) == 8
    fired = {(e.schedule_id, e.planned_at) for e in await all_executions(cluster.ledger)}
    assert {sid for sid, _ in fired} == {"sa", "sb"}


# --- the documented example ----------------------------------------------------------------

MY_LEDGER_STAND_IN = """
from contextlib import asynccontextmanager

from engine.testing import MemoryLedger


class MyLedger:
    @staticmethod
    @asynccontextmanager
    async def open(*, clock, partition_count):
        yield MemoryLedger(clock=clock, partition_count=partition_count)
"""


def documented_contract_example() -> str:
    doc = (ROOT / "docs" / "testing.md").read_text()
    section = doc.split("## Running the contract suite on your ledger", 1)[1]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


def test_the_documented_contract_example_runs_the_suite_on_a_ledger_of_ones_own(
    tmp_path: Path,
) -> None:
    example = documented_contract_example()
    assert "from my_project import MyLedger\n" in example
    module = tmp_path / "test_my_ledger_contract.py"
    module.write_text(example.replace("from my_project import MyLedger\n", MY_LEDGER_STAND_IN))
    functions = 0
    for area in ("schedules", "executions"):
        assert f"from engine.testing.ledger_contract.{area} import *" in example
        imported = importlib.import_module(f"engine.testing.ledger_contract.{area}")
        functions += sum(name.startswith("test_") for name in vars(imported))
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "trio_mode=true"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    summary = re.search(r"(\d+) passed in", done.stdout)
    assert summary is not None, done.stdout
    assert int(summary.group(1)) >= functions  # every test ran, parametrized ones more than once
