"""Folded claims (docs/ledger.md, "Folded claims"): short attempts of out-of-process kinds
start without a recorded claim, and their completion writes claim and outcome in one step --
never at the cost of a second run."""

from __future__ import annotations

from datetime import timedelta

import msgspec
import trio
import trio.testing

from engine.core.hashing import partition_of
from engine.ledger.params import TaskTypesPut
from engine.metrics import DISPATCHED_CLAIMED, DISPATCHED_FOLDED
from engine.model import Execution, ExecutionStatus, HandlerKind, Schedule, TaskType
from engine.node import Node
from engine.testing import Cluster
from tests.actors import probe_handlers
from tests.actors.harness import (
    PARTITIONS,
    START,
    TEST_TENANTS,
    all_executions,
    cluster,
    create,
    make_schedules,
    within,
)

PROBE = TaskType(
    name="probe",
    kind=HandlerKind.PYTHON,
    allowed_tenants=TEST_TENANTS,
    settings={"callable": "tests.actors.probe_handlers:probe"},
)
"""A python task type: it runs in the node's process, so it is never folded."""
CAPPED = TaskType(
    name="capped", kind=HandlerKind.NOOP, allowed_tenants=("*",), max_concurrency_cluster=1_000
)
"""A noop task type with a cluster cap: the cap counts ``running`` rows, so it is claimed."""


def minutely(count: int, task_type: str = "noop", prefix: str = "sched") -> list[Schedule]:
    return [
        msgspec.structs.replace(s, schedule_id=f"{prefix}-{n:05d}", task_type=task_type)
        for n, s in enumerate(make_schedules(count, START, lambda n: ("* * * * *", "UTC")))
    ]


def dispatched(node: Node) -> dict[str, float | None]:
    registry = node.metrics.registry
    return {
        path: registry.get_sample_value("carillon_attempts_dispatched_total", {"path": path})
        for path in (DISPATCHED_CLAIMED, DISPATCHED_FOLDED)
    }


async def ran_once_each(c: Cluster, minutes: int) -> list[Execution]:
    """The executions of the first ``minutes`` minutes, checked to have succeeded at their
    first attempt, each handler run counted once by the nodes' workers and no completion
    refused (a second run of a folded attempt would have met a stale finish)."""
    window = within(await all_executions(c.ledger), START, START + timedelta(minutes=minutes))
    assert {(e.status, e.attempt) for e in window} == {(ExecutionStatus.SUCCEEDED, 1)}
    finished = sum(
        member.node.workers.statistics().finished.get("succeeded", 0) for member in c.nodes.values()
    )
    everything = await all_executions(c.ledger)
    assert finished == sum(e.status is ExecutionStatus.SUCCEEDED for e in everything)
    for member in c.nodes.values():
        assert member.node.completions.statistics().stale == 0
    return window


async def test_a_noop_burst_folds_every_claim_and_runs_each_execution_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with cluster() as c:
        await create(c.ledger, minutely(300))
        member = await c.start_node("n1")
        await trio.sleep(300)
        window = await ran_once_each(c, 4)
        assert len(window) == 300 * 4
        # Not one claim: each execution was written twice (planned, finished), not three times.
        assert member.ledger.calls["executions_claim"] == 0
        assert member.ledger.calls["executions_finish"] > 0
        stats = member.node.dispatcher.statistics()
        assert stats.claimed == 0
        assert stats.folded == len(await all_executions(c.ledger))  # the fifth minute's too
        assert dispatched(member.node) == {DISPATCHED_CLAIMED: 0.0, DISPATCHED_FOLDED: stats.folded}
        detail = await c.ledger.executions_get(window[0].execution_id)
        assert [(a.attempt, a.outcome) for a in detail.attempts] == [(1, "succeeded")]
        assert detail.execution.started_at is not None
        assert detail.execution.started_at >= detail.execution.planned_at
        # Folded noops run in the workers' inline batches (one turn, one scope for many),
        # each under its next attempt number and with its start recorded.
        assert member.node.workers.statistics().inline_batches > 0


async def test_python_and_capped_task_types_are_still_claimed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    probe_handlers.reset(run_s=0.5)
    async with cluster() as c:
        for task_type in (PROBE, CAPPED):
            await c.ledger.task_types_put(TaskTypesPut(task_type))
        await create(
            c.ledger,
            minutely(20, "noop", "fold")
            + minutely(20, "probe", "probe")
            + minutely(20, "capped", "capped"),
        )
        member = await c.start_node("n1")
        await trio.sleep(300)
        window = await ran_once_each(c, 4)
        by_type = {name: sum(e.task_type == name for e in window) for name in ("noop", "probe")}
        assert by_type == {"noop": 80, "probe": 80}
        stats = member.node.dispatcher.statistics()
        started = await all_executions(c.ledger)
        noop = sum(e.task_type == "noop" and e.attempt == 1 for e in started)
        assert stats.folded == noop
        assert stats.claimed == len([e for e in started if e.attempt == 1]) - noop
        assert member.ledger.calls["executions_claim"] > 0
        assert probe_handlers.RUNS
        assert set(probe_handlers.RUNS.values()) == {1}


async def test_a_noop_too_long_for_the_lease_trust_window_is_claimed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # 20 s of work: longer than the trust window of a 15 s partition lease (13 s at most), so
    # only an attempt lease may keep another node from running it meanwhile.
    slow = TaskType(
        name="slow",
        kind=HandlerKind.NOOP,
        allowed_tenants=("*",),
        settings={"delay_s": 20, "timeout_s": 60},
        timeout_s=60,
    )
    async with cluster() as c:
        await c.ledger.task_types_put(TaskTypesPut(slow))
        await create(c.ledger, minutely(10, "slow"))
        member = await c.start_node("n1")
        await trio.sleep(300)
        window = await ran_once_each(c, 4)
        stats = member.node.dispatcher.statistics()
        assert stats.folded == 0
        assert stats.claimed >= len(window) == 40


async def test_a_folded_attempt_starts_only_within_its_partitions_trust_window(
    autojump_clock: trio.testing.MockClock,
) -> None:
    keys = ("fits", "too-long", "handed-back")
    async with cluster() as c:
        # Live schedules firing once a year: nothing but the attempts below runs.
        await create(
            c.ledger,
            [
                Schedule(schedule_id=key, tenant_id="t", cron_expr="0 0 1 1 *", task_type="noop")
                for key in keys
            ],
        )
        node = (await c.start_node("n1")).node
        with trio.fail_after(60):
            while len(node.table) < PARTITIONS:
                await trio.sleep(1)

        async def run(key: str, bound_s: float, *, draining: bool = False) -> None:
            partition = partition_of(key, PARTITIONS)
            owned = node.table.get(partition)
            assert owned is not None
            owned.draining = draining
            execution = Execution(
                execution_id=f"{key}:2026-03-02T00:00:00Z", schedule_id=key, tenant_id="t",
                task_type="noop", planned_at=START, partition_id=partition,
            )  # fmt: skip
            # As a claimer hands on an attempt it folded: no claim, its bound set.
            attempt = node.pipeline.room.admit(execution)
            attempt.folded, attempt.fold_bound_s = True, bound_s
            node.pipeline.hand_over(attempt)
            await trio.sleep(0.5)
            owned.draining = False

        workers = node.workers
        await run("fits", 1.0)
        assert (workers.statistics().finished, workers.statistics().abandoned) == (
            {"succeeded": 1},
            0,
        )
        await run("too-long", 60.0)  # ends after any trust window of a 15 s lease
        await run("handed-back", 1.0, draining=True)  # the new owner will run it
        assert (workers.statistics().finished, workers.statistics().abandoned) == (
            {"succeeded": 1},
            2,
        )


async def test_a_fetch_that_read_a_folded_execution_before_its_finish_does_not_queue_it_again(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A folded execution is startable in the ledger until its completion is written. A
    fetch whose read was answered before that, and came back after the attempt was closed,
    still lists it: queued again, it would run again (its finish stale, its effect twice)."""
    # A backlog paged through a small queue: reads go out while folded attempts finish.
    async with cluster(dispatch_queue_max=100, workers=20) as c:
        await create(c.ledger, minutely(1_000))
        member = await c.start_node("n1")
        member.ledger.delay_reply("executions_due", 0.05)
        await trio.sleep(300)
        window = await ran_once_each(c, 4)
        assert len(window) == 1_000 * 4
        folded = member.node.dispatcher.statistics().folded
        assert folded == len(await all_executions(c.ledger))


async def test_a_hand_back_waits_for_folded_attempts_before_releasing_the_lease(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The drain of a hand-back waits 5 s for the attempts in flight. A folded attempt still
    running then has no attempt lease to hold the joining node back: released, its
    execution (still queued) would run there at once, beside it."""
    twenty_seconds = TaskType(
        name="slow",
        kind=HandlerKind.NOOP,
        allowed_tenants=("*",),
        settings={"delay_s": 20},
    )
    async with cluster(lease_ttl_s=60) as c:  # a trust window that holds 20 s of work
        await c.ledger.task_types_put(TaskTypesPut(twenty_seconds))
        await create(c.ledger, minutely(64, "slow"))
        first = await c.start_node("n1")
        # n2 joins while n1's attempts of 00:02 run: n1 hands half its partitions back.
        joins_at = START + timedelta(seconds=91)
        await trio.sleep((joins_at - c.db_clock.now()).total_seconds())
        await c.start_node("n2")
        await trio.sleep(300)
        assert first.node.dispatcher.statistics().folded > 0
        assert c.nodes["n2"].node.dispatcher.statistics().folded > 0
        await ran_once_each(c, 5)
