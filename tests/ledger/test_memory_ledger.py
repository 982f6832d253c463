"""What only the in-memory ledger promises, beyond the shared contract (``test_contract.py``).

Its database clock is the injected clock, it is deterministic down to hash seeds, every call
is a trio checkpoint that a cancellation can stop before anything changes, and its change
feed wait runs on trio's (mock) clock.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from datetime import UTC, datetime, timedelta
from pathlib import Path

import msgspec
import pytest
import trio
import trio.testing

from engine.errors import ConfigError, InvalidField
from engine.ledger.base import Ledger
from engine.ledger.memory import MemoryLedger
from engine.ledger.params import (
    Completion,
    ExecutionsClaim,
    ExecutionsComplete,
    ExecutionsDue,
    ExecutionsPlan,
    Fence,
    LeasesAcquire,
    Outcome,
    PlannedExecution,
    ScheduleChangesSince,
    SchedulesCreate,
    TaskTypesPut,
)
from engine.model import ExecutionStatus, HandlerKind, Schedule, TaskType, execution_id
from engine.testing import ManualClock, SkewedClock

START = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
ROOT = Path(__file__).resolve().parents[2]


def schedule(schedule_id: str) -> Schedule:
    return Schedule(schedule_id=schedule_id, tenant_id="acme", cron_expr="* * * * *", task_type="t")


async def put_task_type(ledger: MemoryLedger) -> None:
    """Store the task type ``t`` that :func:`schedule` names."""
    await ledger.task_types_put(
        TaskTypesPut(TaskType(name="t", kind=HandlerKind.NOOP, allowed_tenants=("*",)))
    )


async def test_it_satisfies_the_ledger_protocol_and_starts_with_free_leases() -> None:
    ledger: Ledger = MemoryLedger(clock=ManualClock(START), partition_count=3, active_region="eu")
    settings = await ledger.cluster_get()
    assert (settings.partition_count, settings.active_region) == (3, "eu")
    leases = await ledger.leases_list()
    assert [(x.partition_id, x.owner_id, x.fencing_token, x.expires_at) for x in leases] == [
        (0, None, 0, None),
        (1, None, 0, None),
        (2, None, 0, None),
    ]


def test_a_cluster_without_partitions_is_refused() -> None:
    with pytest.raises(ConfigError, match="partition_count"):
        MemoryLedger(clock=ManualClock(START), partition_count=0)


async def test_database_time_and_every_timestamp_come_from_the_injected_clock() -> None:
    clock = ManualClock(START)
    ledger = MemoryLedger(clock=clock, partition_count=1)
    await put_task_type(ledger)
    assert await ledger.database_now() == START
    clock.advance(5)
    [created] = await ledger.schedules_create(SchedulesCreate([schedule("s")]))
    assert created.updated_at == START + timedelta(seconds=5)
    [lease] = await ledger.leases_acquire(LeasesAcquire("a", [0], ttl_s=30))
    assert lease.expires_at == START + timedelta(seconds=35)
    fence = Fence(0, "a", lease.fencing_token)
    clock.advance(1)
    planned_at = START - timedelta(minutes=1)
    await ledger.executions_plan(
        ExecutionsPlan(fence, [PlannedExecution("s", "acme", "t", planned_at)], [])
    )
    [running] = await ledger.executions_claim(
        ExecutionsClaim([fence], [execution_id("s", planned_at)], attempt_lease_s=10, node_id="n")
    )
    assert running.enqueued_at == running.started_at == START + timedelta(seconds=6)
    assert running.attempt_expires_at == START + timedelta(seconds=16)


async def test_a_wall_clock_step_of_the_ledger_expires_leases_without_monotonic_time() -> None:
    clock = ManualClock(START)
    ledger = MemoryLedger(clock=clock, partition_count=1)
    [held] = await ledger.leases_acquire(LeasesAcquire("a", [0], ttl_s=30))
    clock.jump(31)  # only the ledger's clock moved: expiry is judged by it alone
    [taken] = await ledger.leases_acquire(LeasesAcquire("b", [0], ttl_s=30))
    assert (taken.owner_id, taken.fencing_token) == ("b", held.fencing_token + 1)


async def test_a_skewed_clock_on_trio_mock_time_drives_expiry(
    autojump_clock: trio.testing.MockClock,
) -> None:
    ledger = MemoryLedger(clock=SkewedClock(START, skew_s=-7.5), partition_count=1)
    assert await ledger.database_now() == START - timedelta(seconds=7.5)
    await ledger.leases_acquire(LeasesAcquire("a", [0], ttl_s=10))
    await trio.sleep(9.9)
    assert await ledger.leases_acquire(LeasesAcquire("b", [0], ttl_s=10)) == []
    await trio.sleep(0.1)
    [taken] = await ledger.leases_acquire(LeasesAcquire("b", [0], ttl_s=10))
    assert taken.owner_id == "b"


async def test_naive_instants_are_refused_instead_of_compared() -> None:
    ledger = MemoryLedger(clock=ManualClock(START), partition_count=1)
    with pytest.raises(InvalidField, match="UTC offset"):
        await ledger.executions_due(ExecutionsDue([0], before=datetime(2026, 1, 1)))


async def test_a_call_cancelled_at_its_checkpoint_changes_nothing() -> None:
    ledger = MemoryLedger(clock=ManualClock(START), partition_count=1)
    await put_task_type(ledger)
    with trio.CancelScope() as scope:
        scope.cancel()
        await ledger.schedules_create(SchedulesCreate([schedule("s")]))
    assert scope.cancelled_caught
    assert await ledger.schedule_changes(ScheduleChangesSince(after_seq=0)) == []


# --- determinism -------------------------------------------------------------------------------


async def scripted_history(ledger: MemoryLedger, clock: ManualClock) -> bytes:
    """A busy scenario on four partitions; everything it observes, as JSON."""
    observed: list[object] = []
    await put_task_type(ledger)
    ids = [f"job-{n}" for n in range(40)]
    observed.append(await ledger.schedules_create(SchedulesCreate([schedule(s) for s in ids])))
    leases = await ledger.leases_acquire(LeasesAcquire("node", [3, 1, 2, 0], ttl_s=600))
    fences = [Fence(x.partition_id, "node", x.fencing_token) for x in leases]
    for fence in fences:
        mine = [
            s for s in ids if (await ledger.schedules_get(s)).partition_id == fence.partition_id
        ]
        for minutes in (3, 1, 2):
            at = START - timedelta(minutes=minutes)
            batch = [PlannedExecution(s, "acme", "t", at) for s in reversed(mine)]
            observed.append(await ledger.executions_plan(ExecutionsPlan(fence, batch, [])))
    clock.advance(1)
    due = await ledger.executions_due(ExecutionsDue([2, 0, 3, 1], before=START, limit=1000))
    observed.append(due)
    claimed = await ledger.executions_claim(
        ExecutionsClaim(fences, [e.execution_id for e in reversed(due)], 30, "node")
    )
    observed.append(claimed)
    outcomes = [Outcome.SUCCEEDED, Outcome.FAILED, Outcome.DEAD_LETTER]
    completions = [
        Completion(e.execution_id, e.attempt, outcomes[n % 3]) for n, e in enumerate(claimed)
    ]
    observed.append(await ledger.executions_complete(ExecutionsComplete(fences, completions)))
    observed.append(await ledger.executions_due(ExecutionsDue([0, 1, 2, 3], START, limit=1000)))
    observed.append(await ledger.leases_list())
    return msgspec.json.encode(observed)


async def test_identical_call_sequences_give_identical_results() -> None:
    histories = []
    for _ in range(2):
        clock = ManualClock(START)
        histories.append(
            await scripted_history(MemoryLedger(clock=clock, partition_count=4), clock)
        )
    assert histories[0] == histories[1]


def test_results_do_not_depend_on_the_hash_seed() -> None:
    """Set and dict order of strings changes with ``PYTHONHASHSEED``; results must not."""
    program = textwrap.dedent(
        """
        import hashlib, trio
        from engine.ledger.memory import MemoryLedger
        from engine.testing import ManualClock
        from tests.ledger.test_memory_ledger import START, scripted_history

        async def main():
            clock = ManualClock(START)
            history = await scripted_history(MemoryLedger(clock=clock, partition_count=4), clock)
            print(hashlib.sha256(history).hexdigest())

        trio.run(main)
        """
    )
    digests = set()
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        done = subprocess.run(
            [sys.executable, "-c", program],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        )
        digests.add(done.stdout.strip())
    assert len(digests) == 1


async def test_a_failure_without_not_before_may_be_retried_at_once() -> None:
    clock = ManualClock(START)
    ledger = MemoryLedger(clock=clock, partition_count=4)
    await scripted_history(ledger, clock)
    # The script completes every third claim as failed without ``not_before``.
    due = await ledger.executions_due(ExecutionsDue([0, 1, 2, 3], clock.now(), limit=1000))
    assert len(due) == 40
    assert all(e.status is ExecutionStatus.FAILED and e.not_before == clock.now() for e in due)


# --- change feed wait on trio's clock ------------------------------------------------------------


async def test_change_wait_times_out_on_the_mock_clock(
    autojump_clock: trio.testing.MockClock,
) -> None:
    ledger = MemoryLedger(clock=ManualClock(START), partition_count=1)
    started = trio.current_time()
    assert await ledger.schedule_changes_wait(after_seq=0, timeout_s=30) is False
    assert trio.current_time() - started == pytest.approx(30)


async def test_change_wait_wakes_every_waiter_when_a_change_commits(
    autojump_clock: trio.testing.MockClock,
) -> None:
    ledger = MemoryLedger(clock=ManualClock(START), partition_count=1)
    await put_task_type(ledger)
    woke: list[tuple[bool, float]] = []

    async def waiter() -> None:
        result = await ledger.schedule_changes_wait(after_seq=0, timeout_s=60)
        woke.append((result, trio.current_time()))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiter)
        nursery.start_soon(waiter)
        await trio.sleep(5)
        await ledger.schedules_create(SchedulesCreate([schedule("s")]))
    assert [result for result, _ in woke] == [True, True]
    assert [at for _, at in woke] == pytest.approx([5, 5])
    # The event that woke them is spent: a waiter past the new change parks until timeout.
    assert await ledger.schedule_changes_wait(after_seq=1, timeout_s=10) is False
    assert await ledger.schedule_changes_wait(after_seq=0, timeout_s=10) is True


async def test_a_negative_wait_timeout_is_refused() -> None:
    ledger = MemoryLedger(clock=ManualClock(START), partition_count=1)
    with pytest.raises(InvalidField):
        await ledger.schedule_changes_wait(after_seq=0, timeout_s=-1)
