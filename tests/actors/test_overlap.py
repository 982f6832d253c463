"""Overlap policies: a fire due while its schedule's previous run is still going is run
(``allow``), skipped (``skip``) or buffered once (``buffer_one``); the schedule's own policy
wins over its task type's default."""

from __future__ import annotations

import itertools
from datetime import datetime, timedelta

import trio
import trio.testing

from engine.ledger.params import SchedulesCreate, TaskTypesPut
from engine.model import Execution, ExecutionStatus, HandlerKind, OverlapPolicy, Schedule, TaskType
from tests.actors import overlap_handlers
from tests.actors.harness import START, TEST_TENANTS, all_executions, cluster, within
from tests.actors.overlap_handlers import PEAK, RUN_S

MINUTE = timedelta(minutes=1)
FIRST = START.replace(second=0) + MINUTE
"""The first fire of the every-minute schedules (00:01)."""
SLOW = TaskType(
    name="slow",
    kind=HandlerKind.PYTHON,
    allowed_tenants=TEST_TENANTS,
    settings={"callable": "tests.actors.overlap_handlers:slow", "timeout_s": 300},
    timeout_s=300,
    overlap=OverlapPolicy.SKIP,
)
"""Its default, ``skip``, applies to schedules without a policy of their own."""


def every_minute(schedule_id: str, overlap: OverlapPolicy | None) -> Schedule:
    return Schedule(
        schedule_id=schedule_id,
        tenant_id="acme",
        cron_expr="* * * * *",
        task_type="slow",
        next_run_at=FIRST,
        overlap=overlap,
    )


async def run_minutes(schedule: Schedule, minutes: int) -> list[Execution]:
    """Run one node for ``minutes`` fires (and until their runs are over); the executions
    planned in that span, by planned time."""
    overlap_handlers.reset()
    async with cluster() as c:
        await c.ledger.task_types_put(TaskTypesPut(SLOW))
        await c.ledger.schedules_create(SchedulesCreate([schedule]))
        await c.start_node("n1")
        await trio.sleep((minutes + 3) * 60)
    end = FIRST + (minutes - 1) * MINUTE
    return sorted(within(await all_executions(c.ledger), START, end), key=lambda e: e.planned_at)


def fired_at(executions: list[Execution], status: ExecutionStatus) -> list[int]:
    """The minutes (1 = the first fire) of the executions with ``status``."""
    return [int((e.planned_at - FIRST) / MINUTE) + 1 for e in executions if e.status is status]


def started(execution: Execution) -> datetime:
    assert execution.started_at is not None
    return execution.started_at


async def test_allow_runs_overlapping_fires_concurrently(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # The schedule's own "allow" wins over its task type's default "skip".
    executions = await run_minutes(every_minute("reports", OverlapPolicy.ALLOW), 9)
    assert fired_at(executions, ExecutionStatus.SUCCEEDED) == list(range(1, 10))
    assert PEAK["reports"] == 3  # 130 s runs started a minute apart
    for execution in executions:
        assert started(execution) - execution.planned_at < timedelta(seconds=1)


async def test_skip_records_fires_during_a_run_as_skipped_overlap(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # No policy of its own: the task type's default, skip, applies.
    executions = await run_minutes(every_minute("reports", None), 9)
    assert fired_at(executions, ExecutionStatus.SUCCEEDED) == [1, 4, 7]
    assert fired_at(executions, ExecutionStatus.SKIPPED) == [2, 3, 5, 6, 8, 9]
    assert PEAK["reports"] == 1
    for execution in executions:
        if execution.status is ExecutionStatus.SKIPPED:
            assert execution.error_code == "overlap"
            assert execution.attempt == 0  # never started
        else:
            assert started(execution) - execution.planned_at < timedelta(seconds=1)


async def test_buffer_one_runs_one_fire_right_after_the_run_and_skips_the_rest(
    autojump_clock: trio.testing.MockClock,
) -> None:
    executions = await run_minutes(every_minute("reports", OverlapPolicy.BUFFER_ONE), 9)
    # 1 runs 1:00-3:10; 2 waits and runs 3:10-5:20 (3 skipped); 4 runs 5:20-7:30 (5
    # skipped); 6 runs 7:30-9:40 (7 skipped); 8 runs next (9 skipped).
    assert fired_at(executions, ExecutionStatus.SUCCEEDED) == [1, 2, 4, 6, 8]
    assert fired_at(executions, ExecutionStatus.SKIPPED) == [3, 5, 7, 9]
    assert PEAK["reports"] == 1
    runs = [e for e in executions if e.status is ExecutionStatus.SUCCEEDED]
    assert started(runs[0]) - runs[0].planned_at < timedelta(seconds=1)
    for previous, buffered in itertools.pairwise(runs):
        # Started right after the previous run, not at its own instant.
        gap = started(buffered) - (started(previous) + timedelta(seconds=RUN_S))
        assert abs(gap) < timedelta(seconds=1), (previous, buffered)


async def test_after_a_takeover_a_run_left_by_the_crashed_owner_still_blocks_skip(
    autojump_clock: trio.testing.MockClock,
) -> None:
    overlap_handlers.reset()
    async with cluster() as c:
        await c.ledger.task_types_put(TaskTypesPut(SLOW))
        await c.ledger.schedules_create(SchedulesCreate([every_minute("reports", None)]))
        victim = await c.start_node("n1")
        # The 00:01 fire is running on n1. The crash falls between two renewals of its
        # attempt lease (claimed at 00:01, renewed every 20 s): a renewal sent at the very
        # instant of the crash may still land, as a real request in flight would.
        await trio.sleep(85)
        victim.ledger.down = True
        victim.scope.cancel()
        await c.start_node("n2")
        await trio.sleep(10 * 60)
    executions = sorted(
        within(await all_executions(c.ledger), START, FIRST + 7 * MINUTE),
        key=lambda e: e.planned_at,
    )
    # n2 never saw 00:01 start, but the ledger shows it running until its attempt lease
    # (60 s, last renewed by n1 shortly before the crash) runs out: the fires meanwhile (2,
    # 3) are skipped. Then it is redelivered and runs again (attempt 2, from about 02:45 for
    # 130 s), which skips 4; 5 runs (to 07:10), which skips 6 and 7; 8 runs.
    assert fired_at(executions, ExecutionStatus.SKIPPED) == [2, 3, 4, 6, 7]
    assert fired_at(executions, ExecutionStatus.SUCCEEDED) == [1, 5, 8]
    first = executions[0]
    assert (first.planned_at, first.attempt) == (FIRST, 2)
    assert {e.error_code for e in executions if e.status is ExecutionStatus.SKIPPED} == {"overlap"}
