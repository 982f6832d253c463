"""A schedule's lifecycle against running nodes: pausing and resuming inside the lookahead
loses no fire and runs none twice; an execution never runs without its schedule's payload."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import msgspec
import trio
import trio.testing

from engine.api.schedule_input import paused, resumed
from engine.handlers import ExecutionContext
from engine.ledger.params import (
    ExecutionsClaim,
    SchedulesCreate,
    SchedulesDelete,
    SchedulesUpdate,
    TaskTypesPut,
)
from engine.model import Execution, ExecutionStatus, HandlerKind, Schedule, TaskType
from tests.actors.harness import START, TEST_TENANTS, all_executions, cluster
from tests.ledger.backends import put_noop_task_type

runs: list[tuple[str, int, dict[str, Any]]] = []
"""What :func:`record` was run with: execution id, attempt, payload."""


async def record(context: ExecutionContext) -> None:
    runs.append((context.execution_id, context.attempt, dict(context.payload)))


async def recording_schedule(ledger: Any, cron_expr: str) -> Schedule:
    """A schedule of task type ``record`` with payload ``{"n": 1}``, stored."""
    await put_noop_task_type(ledger)
    await ledger.task_types_put(
        TaskTypesPut(
            TaskType(
                name="record",
                kind=HandlerKind.PYTHON,
                allowed_tenants=TEST_TENANTS,
                settings={"callable": f"{__name__}:record"},
                max_attempts=1,
            )
        )
    )
    first = START.replace(second=0) + timedelta(minutes=1)
    schedule = Schedule(
        schedule_id="s",
        tenant_id="acme",
        cron_expr=cron_expr,
        task_type="record",
        payload={"n": 1},
        next_run_at=first,
    )
    [stored] = await ledger.schedules_create(SchedulesCreate([schedule]))
    return stored


async def test_a_pause_at_57_and_a_resume_at_58_run_the_00_fire_exactly_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The issue's case: with fires planned up to 60 s ahead, the :00 fire was planned before
    the pause, skipped by it, and -- its id taken -- never planned again after the resume."""
    runs.clear()
    async with cluster(lookahead_s=60) as c:
        stored = await recording_schedule(c.ledger, "1 0 * * *")  # daily at 00:01:00
        fire = START.replace(second=0) + timedelta(minutes=1)
        await c.start_node("n1")
        await trio.sleep((fire - timedelta(seconds=3) - c.db_clock.now()).total_seconds())
        key = f"s:{fire.strftime('%Y-%m-%dT%H:%M:%SZ')}"
        planned = (await c.ledger.executions_get(key)).execution  # planned ahead
        assert planned.status is ExecutionStatus.QUEUED
        stopped = await c.ledger.schedules_update(SchedulesUpdate(paused(stored), stored.version))
        assert (await c.ledger.executions_get(key)).execution.status is ExecutionStatus.SKIPPED
        await trio.sleep(1)  # :58
        now = c.db_clock.now()
        await c.ledger.schedules_update(SchedulesUpdate(resumed(stopped, now=now), stopped.version))
        await trio.sleep(120)
        executions = await all_executions(c.ledger)
    assert runs == [(key, 1, {"n": 1})]
    assert [(e.execution_id, e.status, e.attempt) for e in executions] == [
        (key, ExecutionStatus.SUCCEEDED, 1)
    ]


async def test_a_delete_at_57_and_a_create_again_at_58_run_the_00_fire_exactly_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    runs.clear()
    async with cluster(lookahead_s=60) as c:
        stored = await recording_schedule(c.ledger, "1 0 * * *")
        fire = START.replace(second=0) + timedelta(minutes=1)
        await c.start_node("n1")
        await trio.sleep((fire - timedelta(seconds=3) - c.db_clock.now()).total_seconds())
        key = f"s:{fire.strftime('%Y-%m-%dT%H:%M:%SZ')}"
        assert (await c.ledger.executions_get(key)).execution.status is ExecutionStatus.QUEUED
        await c.ledger.schedules_delete(SchedulesDelete("s"))
        await trio.sleep(1)
        again = msgspec.structs.replace(stored, payload={"n": 2}, next_run_at=fire)
        await c.ledger.schedules_create(SchedulesCreate([again]))
        await trio.sleep(120)
        executions = await all_executions(c.ledger)
    assert runs == [(key, 1, {"n": 2})]
    assert [(e.execution_id, e.status) for e in executions] == [(key, ExecutionStatus.SUCCEEDED)]


async def test_an_execution_whose_schedule_is_deleted_after_its_claim_is_skipped_not_run(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """It used to run with the payload ``{}``: the worker found no schedule and ran anyway."""
    runs.clear()
    async with cluster() as c:
        await recording_schedule(c.ledger, "* * * * *")
        claim = c.ledger.executions_claim

        async def claim_then_delete(params: ExecutionsClaim) -> list[Execution]:
            claimed = await claim(params)
            if claimed:
                await c.ledger.schedules_delete(SchedulesDelete("s"))
                # Long enough for the schedule read before the claim to be out of date.
                await trio.sleep(15)
            return claimed

        c.ledger.executions_claim = claim_then_delete  # type: ignore[method-assign]
        await c.start_node("n1")
        await trio.sleep(120)
        executions = await all_executions(c.ledger)
    assert runs == []
    [execution] = executions
    assert (execution.status, execution.attempt, execution.error_code) == (
        ExecutionStatus.SKIPPED,
        1,
        "schedule_deleted",
    )
    detail = await c.ledger.executions_get(execution.execution_id)
    assert [(a.attempt, a.outcome, a.error_code) for a in detail.attempts] == [
        (1, "skipped", "schedule_deleted")
    ]
