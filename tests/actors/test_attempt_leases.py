"""Attempt leases: renewed while a handler runs, given up when the ledger took them away."""

from __future__ import annotations

from datetime import timedelta

import trio
import trio.testing

from engine.core.hashing import partition_of
from engine.ledger.params import ExecutionsExtend, TaskTypesPut
from engine.model import Execution, ExecutionStatus, HandlerKind, Schedule, TaskType
from tests.actors import probe_handlers
from tests.actors.harness import (
    PARTITIONS,
    START,
    TEST_TENANTS,
    all_executions,
    cluster,
    create,
    make_schedules,
)

SLOW = TaskType(
    name="noop",
    kind=HandlerKind.NOOP,
    allowed_tenants=("*",),
    settings={"delay_s": 300, "timeout_s": 600},
    timeout_s=600,
)
"""Five minutes of work: five times the attempt lease (60 s)."""


async def test_a_handler_longer_than_its_attempt_lease_keeps_its_attempt(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with cluster() as c:
        await create(c.ledger, make_schedules(3, START, lambda n: ("0 * * * *", "UTC")))
        await c.ledger.task_types_put(TaskTypesPut(SLOW))
        node = (await c.start_node("n1")).node
        await trio.sleep(3600 + 600)
        renewed = node.workers.statistics().renewed
        abandoned = node.workers.statistics().abandoned
    executions = await all_executions(c.ledger)
    assert len(executions) == 3
    for execution in executions:
        assert execution.status is ExecutionStatus.SUCCEEDED
        assert execution.attempt == 1  # never re-queued, though it ran 5x its lease
        assert execution.finished_at is not None
        assert execution.started_at is not None
        assert execution.finished_at - execution.started_at >= timedelta(seconds=300)
        detail = await c.ledger.executions_get(execution.execution_id)
        assert [a.outcome for a in detail.attempts] == ["succeeded"]
    assert renewed >= 3 * 4  # every 20 s of 300 s, per execution
    assert abandoned == 0


async def test_an_attempt_the_ledger_took_away_is_abandoned_and_its_successor_counts(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with cluster() as c:
        await create(c.ledger, make_schedules(1, START, lambda n: ("0 * * * *", "UTC")))
        await c.ledger.task_types_put(TaskTypesPut(SLOW))
        sim = await c.start_node("n1")
        extend = c.ledger.executions_extend
        refusing = True

        async def lost_renewals(params: ExecutionsExtend) -> list[str]:
            # As if the renewals were lost on the way: the lease runs out meanwhile.
            if refusing:
                await trio.lowlevel.checkpoint()
                return []
            return await extend(params)

        sim.ledger.executions_extend = lost_renewals  # type: ignore[method-assign]
        first_planned = START.replace(minute=0) + timedelta(hours=1)
        await trio.sleep((first_planned - START).total_seconds() + 30)
        # 20 s in, the first renewal came back without the attempt: it was given up.
        statistics = sim.node.workers.statistics()
        assert statistics.abandoned == 1
        assert statistics.busy == 0  # its handler was cancelled, not left running
        refusing = False
        await trio.sleep(600)
    [execution] = await all_executions(c.ledger)
    assert execution.status is ExecutionStatus.SUCCEEDED
    assert execution.attempt == 2  # re-queued after the lease ran out, then run again
    detail = await c.ledger.executions_get(execution.execution_id)
    assert [a.outcome for a in detail.attempts] == ["expired", "succeeded"]


async def test_the_hand_off_shrinks_to_one_per_worker_when_handlers_are_slow(
    autojump_clock: trio.testing.MockClock,
) -> None:
    two_seconds = TaskType(
        name="noop", kind=HandlerKind.NOOP, allowed_tenants=("*",), settings={"delay_s": 2}
    )
    async with cluster(workers=4) as c:
        await create(c.ledger, make_schedules(200, START, lambda n: ("0 * * * *", "UTC")))
        node = (await c.start_node("n1")).node
        pool, sizer = node.workers, node.pipeline.room.sizer
        assert sizer.capacity == 4 + 4  # before anything ran: one waiting per worker
        await c.ledger.task_types_put(TaskTypesPut(two_seconds))
        await trio.sleep(3600 + 180)
        assert pool.statistics().finished == {"succeeded": 200}
        # 2 s per execution, 4 workers: 2 finish per second, fewer than one per worker.
        assert sizer.capacity == 4 + 4
        await c.ledger.task_types_put(
            TaskTypesPut(TaskType(name="noop", kind=HandlerKind.NOOP, allowed_tenants=("*",)))
        )
        await trio.sleep(3600)
        assert pool.statistics().finished == {"succeeded": 400}
        assert sizer.capacity == 4 + 1_000  # instant handlers: a full hand-off


PROBE = TaskType(
    name="probe",
    kind=HandlerKind.PYTHON,
    allowed_tenants=TEST_TENANTS,
    settings={"callable": "tests.actors.probe_handlers:probe"},
)


async def test_a_claimed_execution_never_starts_once_its_attempt_lease_may_have_run_out(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # Found by the real-process chaos run (docs/chaos.md): a node resumed after SIGSTOP
    # started the handlers of executions it had claimed before the pause -- whose attempt
    # leases had run out meanwhile, so the new owner had re-queued and re-run them already.
    probe_handlers.reset(run_s=0.0)
    keys = ("just-claimed", "waited-half-its-lease", "claimed-before-a-45-s-freeze")
    async with cluster() as c:
        await c.ledger.task_types_put(TaskTypesPut(PROBE))
        # Live schedules (a worker never runs an execution whose schedule is gone), firing
        # only once a year, so nothing but the attempts below runs.
        await create(
            c.ledger,
            [
                Schedule(schedule_id=key, tenant_id="t", cron_expr="0 0 1 1 *", task_type="probe")
                for key in keys
            ],
        )
        node = (await c.start_node("n1")).node
        with trio.fail_after(60):
            while len(node.table) < PARTITIONS:
                await trio.sleep(1)

        async def run(key: str, claimed_s_ago: float) -> None:
            partition = partition_of(key, PARTITIONS)  # as the ledger places it
            owned = node.table.get(partition)
            assert owned is not None
            execution = Execution(
                execution_id=f"{key}:2026-03-02T00:00:00Z", schedule_id=key, tenant_id="t",
                task_type="probe", planned_at=START, status=ExecutionStatus.RUNNING, attempt=1,
                fencing_token=owned.fence.fencing_token, partition_id=partition,
            )  # fmt: skip
            # As the dispatcher hands on what it claimed: an attempt holding its slot.
            attempt = node.pipeline.room.admit(execution)
            attempt.claimed, attempt.lease_s = True, 60.0
            attempt.renewed_at = trio.current_time() - claimed_s_ago
            node.pipeline.hand_over(attempt)
            await trio.sleep(0.5)

        await run("just-claimed", 0.0)
        await run("waited-half-its-lease", 30.0)
        assert len(probe_handlers.STARTS) == 2
        abandoned = node.workers.statistics().abandoned
        await run("claimed-before-a-45-s-freeze", 45.0)
        assert len(probe_handlers.STARTS) == 2
        assert node.workers.statistics().abandoned == abandoned + 1


async def test_an_attempt_lease_shorter_than_the_renewal_check_is_renewed_in_time(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Found by the simulator (seeds 130 and 152): attempt leases were looked at every 5 s
    whatever their length, so a 3 s lease ran out before its first renewal; the attempt was
    re-queued, the renewal then found it gone and abandoned it, and a handler longer than
    the lease never finished, attempt after attempt."""
    twenty_seconds = TaskType(
        name="noop",
        kind=HandlerKind.NOOP,
        allowed_tenants=("*",),
        settings={"delay_s": 20, "timeout_s": 60},
        timeout_s=60,
    )
    async with cluster(attempt_lease_s=3) as c:
        await create(c.ledger, make_schedules(3, START, lambda n: ("0 * * * *", "UTC")))
        await c.ledger.task_types_put(TaskTypesPut(twenty_seconds))
        node = (await c.start_node("n1")).node
        await trio.sleep(3600 + 300)
        statistics = node.workers.statistics()
    executions = await all_executions(c.ledger)
    assert len(executions) == 3
    for execution in executions:
        assert execution.status is ExecutionStatus.SUCCEEDED
        assert execution.attempt == 1
    assert statistics.abandoned == 0
    assert statistics.renewed >= 3 * 10  # every second or so of 20 s, per execution
