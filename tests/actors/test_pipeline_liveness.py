"""The execution pipeline keeps moving: through slow handlers, a frozen process, unexpected
errors and handlers that raise what they should not -- and says so when it does not.

Each test here failed on the pipeline it replaced (see docs/execution.md, "Liveness"):
a claim threshold computed once and never again stalled a node for good after a slow
period; handler durations measured from the hand-off let a freeze poison the capacity; a
dispatcher restarted as the same instance kept the overlap counts of the crash; a python
callable raising ``SystemExit`` ended the node.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import msgspec
import pytest
import trio
import trio.testing

from engine.handlers import ExecutionContext, HandlerResult
from engine.ledger.params import TaskTypesPut
from engine.model import Execution, ExecutionStatus, HandlerKind, OverlapPolicy, TaskType
from tests.actors.harness import (
    START,
    TEST_TENANTS,
    Cluster,
    all_executions,
    cluster,
    create,
    make_schedules,
    within,
)

LATENCY_S = [0.01]
"""What :func:`answer` takes now (the receiver's latency); tests change it as they go."""


async def answer(context: ExecutionContext) -> None:
    await trio.sleep(LATENCY_S[0])


async def exits(context: ExecutionContext) -> None:
    raise SystemExit(3)


async def interrupts(context: ExecutionContext) -> None:
    raise KeyboardInterrupt


def exits_in_a_thread(context: ExecutionContext) -> None:
    raise SystemExit("from a thread")


def python_type(name: str, function: str, timeout_s: float = 30.0, **fields: Any) -> TaskType:
    return TaskType(
        name=name,
        kind=HandlerKind.PYTHON,
        allowed_tenants=TEST_TENANTS,
        settings={"callable": f"{__name__}:{function}", "timeout_s": timeout_s},
        timeout_s=timeout_s,
        **fields,
    )


async def setup(c: Cluster, count: int, expression: str, task_type: TaskType) -> None:
    schedules = [
        msgspec.structs.replace(s, task_type=task_type.name)
        for s in make_schedules(count, START, lambda n: (expression, "UTC"))
    ]
    await c.ledger.task_types_put(TaskTypesPut(task_type))
    await create(c.ledger, schedules)


def planned_by(executions: list[Execution], end: datetime) -> list[Execution]:
    return [e for e in executions if e.planned_at <= end]


async def test_a_slow_period_is_followed_by_a_drained_backlog_and_every_fire_runs(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # The stall this pipeline replaced: 10 ms handlers grow the hand-off to 800, a burst of
    # 700 fills it just as the receiver slows to 1.5 s, and the old dispatcher waited for
    # 200 free slots (a quarter of the capacity it had computed then) while the slow
    # handlers shrank the capacity to 16. Once the burst drained, nothing ran again -- so
    # the average never saw a fast handler again either: 7,200 fires stayed queued.
    LATENCY_S[0] = 0.01
    hook = python_type("hook", "answer", timeout_s=5)
    async with cluster(workers=8) as c:
        await setup(c, 20, "* * * * * *", hook)
        burst = [
            msgspec.structs.replace(s, schedule_id=f"burst-{n}", task_type="hook")
            for n, s in enumerate(make_schedules(700, START, lambda n: ("0 2 0 * * *", "UTC")))
        ]
        await create(c.ledger, burst)
        await c.start_node("n1")
        await trio.sleep(89.5)  # to half a second before the burst
        LATENCY_S[0] = 1.5
        await trio.sleep(180)
        LATENCY_S[0] = 0.01
        await trio.sleep(240)
        executions = await all_executions(c.ledger)
    end = START + timedelta(seconds=450)
    due = planned_by(executions, end)
    assert len(due) == 700 + 20 * 450
    assert {(e.status, e.attempt) for e in due} == {(ExecutionStatus.SUCCEEDED, 1)}
    # Drained: the last minute of fires started on time again.
    recent = [e for e in due if e.planned_at > end - timedelta(seconds=60)]
    assert max((e.started_at - e.planned_at).total_seconds() for e in recent if e.started_at) < 1


async def test_a_backlog_of_python_attempts_waits_in_the_queue_not_in_the_workers(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Python attempts hold a thread each, at most ``blocking_workers`` (2) at once. 200 of
    them due at once, 10 s each, beside 50 ``noop`` fires of the same instant: the noop
    fires start at once, since the python backlog waits in the dispatcher's queue instead of
    holding the 8 worker slots while it waits for a thread (as it did: the noop fires then
    waited behind it for minutes)."""
    LATENCY_S[0] = 10.0
    slow = python_type("slowpy", "answer", timeout_s=60)
    async with cluster(workers=8, blocking_workers=2) as c:
        await setup(c, 200, "0 2 0 * * *", slow)
        noops = [
            msgspec.structs.replace(s, schedule_id=f"z-noop-{n}")  # queued after the python ones
            for n, s in enumerate(make_schedules(50, START, lambda n: ("0 2 0 * * *", "UTC")))
        ]
        await create(c.ledger, noops)
        await c.start_node("n1")
        await trio.sleep(150)  # to a minute after the instant (at 00:02:00)
        executions = await all_executions(c.ledger)
    noop = [e for e in executions if e.task_type == "noop"]
    assert len(noop) == 50
    assert max((e.started_at - e.planned_at).total_seconds() for e in noop if e.started_at) < 2
    python = [e for e in executions if e.task_type == "slowpy"]
    assert len(python) == 200
    # Two at a time, 10 s each, for a minute: the blocking kinds kept their own pace.
    assert 10 <= sum(1 for e in python if e.status is ExecutionStatus.SUCCEEDED) <= 12


async def test_a_node_frozen_with_attempts_in_flight_dispatches_again_after_it_resumes(
    autojump_clock: trio.testing.MockClock,
) -> None:
    LATENCY_S[0] = 0.1  # 4 workers: 40 a second, five times the 8 a second that come due
    async with cluster(workers=4) as c:
        await setup(c, 40, "*/5 * * * * *", python_type("hook", "answer", timeout_s=5))
        await c.start_node("n1")
        await trio.sleep(30)
        autojump_clock.jump(90)  # SIGSTOP for 90 s, handlers in the middle of their run
        await trio.sleep(300)
        executions = await all_executions(c.ledger)
    resumed = START + timedelta(seconds=120 + 60)  # its leases re-acquired, the backlog run
    window = [e for e in executions if resumed < e.planned_at <= START + timedelta(seconds=400)]
    assert len(window) == 40 * 44
    assert {(e.status, e.attempt) for e in window} == {(ExecutionStatus.SUCCEEDED, 1)}
    assert max((e.started_at - e.planned_at).total_seconds() for e in window if e.started_at) < 2


async def test_an_unexpected_claim_error_does_not_keep_a_skip_schedule_skipping(
    autojump_clock: trio.testing.MockClock,
) -> None:
    LATENCY_S[0] = 0.1
    skip = python_type("report", "answer", overlap=OverlapPolicy.SKIP, timeout_s=5)
    async with cluster() as c:
        await setup(c, 5, "*/10 * * * * *", skip)
        sim = await c.start_node("n1")
        await trio.sleep(25)
        sim.ledger.fail_next("executions_claim", RuntimeError("injected claim bug"))
        await trio.sleep(300)
        statistics = sim.node.statistics()
        executions = await all_executions(c.ledger)
    later = within(executions, START + timedelta(seconds=60), START + timedelta(seconds=300))
    assert len(later) == 5 * 24
    assert {e.status for e in later} == {ExecutionStatus.SUCCEEDED}
    assert statistics.dispatcher.claim_errors == 1
    assert statistics.supervisor.restarts["pipeline"] == 0


async def test_a_crashed_pipeline_is_replaced_by_a_fresh_one_that_holds_nothing_of_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    LATENCY_S[0] = 0.1
    async with cluster() as c:
        await setup(c, 5, "*/10 * * * * *", python_type("hook", "answer", timeout_s=5))
        sim = await c.start_node("n1")
        await trio.sleep(25)
        crashed = sim.node.pipeline
        sim.ledger.fail_next("executions_complete", RuntimeError("injected writer bug"))
        await trio.sleep(300)
        node = sim.node
        assert node.pipeline is not crashed
        assert node.statistics().supervisor.restarts["pipeline"] == 1
        # Nothing the crashed pipeline took outlives it: no slot, no in-flight count.
        assert crashed.room.open == set()
        assert crashed.room.in_flight == 0
        assert all(node.table.attempts_in_flight(p) <= 5 for p in node.table)
        # Its broker bridge (and every broker connection) closed with it; the new one has its own.
        old_brokers, new_brokers = crashed.task_kinds.brokers, node.pipeline.task_kinds.brokers
        assert old_brokers is not None
        assert new_brokers is not None
        assert old_brokers.closed
        assert new_brokers is not old_brokers
        assert not new_brokers.closed
        executions = await all_executions(c.ledger)
    later = within(executions, START + timedelta(seconds=120), START + timedelta(seconds=300))
    assert len(later) == 5 * 18
    assert {e.status for e in later} == {ExecutionStatus.SUCCEEDED}


@pytest.mark.parametrize("function", ["exits", "interrupts", "exits_in_a_thread"])
async def test_a_callable_raising_system_exit_fails_its_attempt_and_the_node_lives(
    autojump_clock: trio.testing.MockClock, function: str
) -> None:
    LATENCY_S[0] = 0.01
    async with cluster() as c:
        await setup(c, 3, "0 * * * *", python_type("doomed", function, max_attempts=2))
        healthy = make_schedules(3, START, lambda n: ("*/10 * * * * *", "UTC"))
        await create(
            c.ledger,
            [msgspec.structs.replace(s, schedule_id=f"ok-{s.schedule_id}") for s in healthy],
        )
        sim = await c.start_node("n1")
        await trio.sleep(3600 + 600)
        restarts = sim.node.statistics().supervisor.restarts
        executions = await all_executions(c.ledger)
    doomed = [e for e in executions if e.task_type == "doomed"]
    assert len(doomed) == 3
    error = {"exits": "SystemExit", "interrupts": "KeyboardInterrupt"}.get(function, "SystemExit")
    for execution in doomed:
        assert execution.status is ExecutionStatus.DEAD_LETTER
        assert execution.error_code == f"exception:{error}"
    ok = within(
        [e for e in executions if e.task_type == "noop"], START, START + timedelta(minutes=65)
    )
    assert ok
    assert {e.status for e in ok} == {ExecutionStatus.SUCCEEDED}
    assert restarts["pipeline"] == 0


class _Raising:
    """A handler that breaks the handler contract: ``run`` raises instead of returning."""

    def __init__(self, error: BaseException) -> None:
        self._error = error

    async def run(self, context: ExecutionContext) -> HandlerResult:
        raise self._error


async def test_a_handler_that_raises_is_walled_off_as_a_crashed_attempt(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    from engine.actors import task_kinds

    real = task_kinds.build_handler

    def build(kind: str, settings: dict[str, Any], **kwargs: Any) -> Any:
        if kind == "python":
            return _Raising(SystemExit(1))
        return real(kind, settings, **kwargs)

    monkeypatch.setattr(task_kinds, "build_handler", build)
    async with cluster() as c:
        await setup(c, 2, "0 * * * *", python_type("broken", "answer", max_attempts=1))
        sim = await c.start_node("n1")
        await trio.sleep(3600 + 60)
        statistics = sim.node.statistics()
        executions = await all_executions(c.ledger)
    assert [e.status for e in executions] == [ExecutionStatus.DEAD_LETTER] * 2
    assert {e.error_code for e in executions} == {"handler_crashed"}
    assert statistics.workers.crashed == 2
    assert statistics.supervisor.restarts["pipeline"] == 0


async def test_a_stalled_pipeline_is_measured_logged_and_fails_readiness(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    # A stall cannot be produced through the pipeline's front door any more; so break its
    # admission the way the old threshold did -- it admits nothing -- and watch the watchdog.
    async with cluster(dispatch_stall_after_s=30) as c:
        await create(c.ledger, make_schedules(20, START, lambda n: ("* * * * * *", "UTC")))
        sim = await c.start_node("n1")
        await trio.sleep(20)
        pipeline = sim.node.pipeline
        assert pipeline.stall_check() is None
        never: Callable[[], int] = lambda: 0  # noqa: E731
        monkeypatch_room = pipeline.room
        monkeypatch_room.claim_size = never  # type: ignore[method-assign]
        with caplog.at_level(logging.ERROR, logger="carillon.pipeline"):
            await trio.sleep(45)
        stalled = sim.node.statistics().pipeline.stalled_s
        check = pipeline.stall_check()
        gauges = sim.node.metrics.registry.get_sample_value("carillon_dispatch_stalled_seconds")
    assert stalled >= 30
    assert check is not None
    assert "not been dispatched" in check
    assert gauges is not None
    assert gauges >= 30
    assert any("dispatch stalled" in r.getMessage() for r in caplog.records)


async def test_saturated_or_capped_work_is_not_a_stall(
    autojump_clock: trio.testing.MockClock,
) -> None:
    LATENCY_S[0] = 600.0  # every worker busy for ten minutes: saturated, not stalled
    async with cluster(workers=2, dispatch_stall_after_s=30) as c:
        await setup(c, 10, "* * * * *", python_type("long", "answer", timeout_s=900))
        sim = await c.start_node("n1")
        worst = 0.0
        for _ in range(30):
            await trio.sleep(10)
            worst = max(worst, sim.node.statistics().pipeline.stalled_s)
    assert worst < 30
