"""Planned executions run: on time, never early, retried by class, dead-lettered when hopeless."""

from __future__ import annotations

from datetime import timedelta

import msgspec
import trio
import trio.testing

from engine.errors import LedgerUnavailable, PermanentError
from engine.handlers import ExecutionContext
from engine.ledger.params import ExecutionsQuery, SchedulesUpdate, TaskTypesPut
from engine.model import ExecutionStatus, HandlerKind, TaskType
from tests.actors import user_handlers
from tests.actors.harness import (
    START,
    TEST_TENANTS,
    all_executions,
    cluster,
    create,
    make_schedules,
    within,
)


async def test_executions_run_at_their_instant_never_early(
    autojump_clock: trio.testing.MockClock,
) -> None:
    schedules = make_schedules(50, START, lambda n: ("* * * * *", "UTC"))
    async with cluster() as c:
        await create(c.ledger, schedules)
        await c.start_node("n1")
        await trio.sleep(600)
    window = within(await all_executions(c.ledger), START, START + timedelta(minutes=9))
    assert len(window) == 50 * 9
    assert {e.status for e in window} == {ExecutionStatus.SUCCEEDED}
    for execution in window:
        assert execution.started_at is not None
        delay = execution.started_at - execution.planned_at
        assert timedelta(0) <= delay < timedelta(seconds=1), execution


async def always_bad(context: ExecutionContext) -> None:
    """Like ``user_handlers.always_bad``, but async: a plain function runs in a real worker
    thread, during which the autojump clock may race past its attempt lease and have it
    redelivered (the thread path is covered in ``tests/handlers/test_python.py``)."""
    user_handlers.CALLS[context.execution_id] += 1
    raise PermanentError("the payload is invalid")


async def test_transient_failures_retry_with_the_same_key_and_permanent_ones_dead_letter(
    autojump_clock: trio.testing.MockClock,
) -> None:
    user_handlers.CALLS.clear()
    async with cluster() as c:
        for name, function in (
            ("flaky", "tests.actors.user_handlers:flaky_once"),
            ("bad", f"{__name__}:always_bad"),
        ):
            await c.ledger.task_types_put(
                TaskTypesPut(
                    TaskType(
                        name=name,
                        kind=HandlerKind.PYTHON,
                        allowed_tenants=TEST_TENANTS,
                        settings={"callable": function},
                    )
                )
            )
        schedules = [
            msgspec.structs.replace(s, task_type="flaky" if n % 2 else "bad")
            for n, s in enumerate(make_schedules(4, START, lambda n: ("0 * * * *", "UTC")))
        ]
        await create(c.ledger, schedules)
        await c.start_node("n1")
        await trio.sleep(3600 + 120)
        executions = (await c.ledger.executions_query(ExecutionsQuery(limit=100))).items
    flaky = [e for e in executions if e.task_type == "flaky"]
    bad = [e for e in executions if e.task_type == "bad"]
    assert len(flaky) == 2
    assert len(bad) == 2
    for execution in flaky:
        assert execution.status is ExecutionStatus.SUCCEEDED
        assert execution.attempt == 2
        assert user_handlers.CALLS[execution.execution_id] == 2  # one key, two deliveries
    for execution in bad:
        assert execution.status is ExecutionStatus.DEAD_LETTER
        assert execution.attempt == 1
        assert execution.error_code is not None


async def test_a_task_type_this_node_cannot_run_stops_only_its_own_executions(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A shell task type on a node without --enable-shell used to make every settings
    refresh fail, and with it every fetch: nothing at all was dispatched any more."""
    async with cluster() as c:
        await c.ledger.task_types_put(
            TaskTypesPut(
                TaskType(
                    name="sh",
                    kind=HandlerKind.SHELL,
                    allowed_tenants=TEST_TENANTS,
                    settings={"argv": ["true"]},
                    max_attempts=1,
                )
            )
        )
        schedules = [
            msgspec.structs.replace(s, task_type="sh" if n == 0 else s.task_type)
            for n, s in enumerate(make_schedules(5, START, lambda n: ("* * * * *", "UTC")))
        ]
        await create(c.ledger, schedules)
        await c.start_node("n1")  # shell is off by default
        await trio.sleep(300)
    window = within(await all_executions(c.ledger), START, START + timedelta(minutes=4))
    runnable = [e for e in window if e.task_type != "sh"]
    shell = [e for e in window if e.task_type == "sh"]
    assert len(runnable) == 4 * 4
    assert {e.status for e in runnable} == {ExecutionStatus.SUCCEEDED}
    assert len(shell) == 4
    assert {(e.status, e.error_code) for e in shell} == {
        (ExecutionStatus.DEAD_LETTER, "setup_error")
    }


async def test_a_database_blip_while_preparing_an_execution_spends_no_attempt(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Found by the simulator (seed 5): a worker whose read of the task type failed with
    ``LedgerUnavailable`` failed the attempt as an unknown ``setup_error`` (and logged an
    error): a few database blips could dead-letter an execution that never ran."""
    async with cluster() as c:
        await create(c.ledger, make_schedules(1, START, lambda n: ("0 * * * *", "UTC")))
        sim = await c.start_node("n1")
        get_task_type = c.ledger.task_types_get
        refusals = 3

        async def blip_then_get(name: str) -> TaskType:
            nonlocal refusals
            await trio.lowlevel.checkpoint()
            if refusals:
                refusals -= 1
                raise LedgerUnavailable("connection reset")
            return await get_task_type(name)

        async def none_listed() -> list[TaskType]:
            # The dispatcher's periodic read would otherwise keep the workers' cache warm.
            await trio.lowlevel.checkpoint()
            return []

        sim.ledger.task_types_get = blip_then_get  # type: ignore[method-assign]
        sim.ledger.task_types_list = none_listed  # type: ignore[method-assign]
        await trio.sleep(3600 + 120)
    assert refusals == 0
    [execution] = await all_executions(c.ledger)
    assert execution.status is ExecutionStatus.SUCCEEDED
    assert execution.attempt == 1
    detail = await c.ledger.executions_get(execution.execution_id)
    assert [a.outcome for a in detail.attempts] == ["succeeded"]


async def counted(context: ExecutionContext) -> None:
    user_handlers.CALLS[context.execution_id] += 1


async def test_a_run_whose_tenant_lost_its_task_type_fails_for_good_without_running(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The ledger lets no live schedule name a task type its tenant may not use, but a run
    queued earlier still names it: the worker checks again, and never runs it."""
    user_handlers.CALLS.clear()
    probe = TaskType(
        name="probe",
        kind=HandlerKind.PYTHON,
        allowed_tenants=("tenant-0",),
        settings={"callable": f"{__name__}:counted"},
        max_attempts=3,
    )
    async with cluster() as c:
        await c.ledger.task_types_put(TaskTypesPut(probe))
        [schedule] = make_schedules(1, START, lambda n: ("1 * * * *", "UTC"))
        assert schedule.tenant_id == "tenant-0"
        await create(c.ledger, [msgspec.structs.replace(schedule, task_type="probe")])
        await c.start_node("n1")
        await trio.sleep(30)  # planned ahead: the 12:01 run is queued, naming "probe"
        [queued] = await all_executions(c.ledger)
        assert (queued.task_type, queued.status) == ("probe", ExecutionStatus.QUEUED)
        # The schedule moves to another task type; then "probe" is withdrawn from tenant-0.
        stored = await c.ledger.schedules_get(schedule.schedule_id)
        await c.ledger.schedules_update(
            SchedulesUpdate(msgspec.structs.replace(stored, task_type="noop"), stored.version)
        )
        await c.ledger.task_types_put(
            TaskTypesPut(msgspec.structs.replace(probe, allowed_tenants=("acme",)))
        )
        await trio.sleep(120)
        ran = await c.ledger.executions_get(queued.execution_id)
    assert ran.execution.status is ExecutionStatus.DEAD_LETTER
    assert ran.execution.error_code == "task_type_unavailable"
    assert ran.execution.attempt == 1  # a permanent failure: never retried
    assert "not available to tenant 'tenant-0'" in (ran.execution.error_message or "")
    assert user_handlers.CALLS[queued.execution_id] == 0
