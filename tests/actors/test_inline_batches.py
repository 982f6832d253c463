"""Inline attempts run in batches: a worker runs a handful of ``noop`` attempts in one turn and
one cancel scope (``engine/actors/workers.py``), keeping per attempt everything the one-by-one
path keeps -- the abandonment and start checks, the deadline, the duration, the metrics, the
completion, and the resources given back exactly once.

Most tests drive a :class:`WorkerPool` alone between two channels, as the pipeline wires it, so
that what goes in and what comes out can be counted exactly; the inline handler there is a
recording stand-in for ``noop`` (inline like it, checked below), so that which attempts ran
can be told. The burst and tracing tests run whole nodes."""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import msgspec
import pytest
import trio
import trio.testing
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from engine.actors import task_kinds
from engine.actors.announcements import Announcements
from engine.actors.attempts import Attempt, Room
from engine.actors.schedule_cache import ScheduleCache
from engine.actors.task_kinds import TaskKinds
from engine.actors.workers import INLINE_BATCH_MAX, WorkerPool, WorkerPoolConfig
from engine.core.admission import HandoffSizer
from engine.core.hashing import partition_of
from engine.handlers import ExecutionContext, Handler, HandlerOptions, HandlerResult
from engine.handlers.base import is_inline
from engine.handlers.noop import NoopHandler
from engine.handlers.registry import build_handler
from engine.ledger.memory import MemoryLedger
from engine.ledger.params import Fence, Outcome, SchedulesCreate, TaskTypesPut
from engine.metrics import render
from engine.model import Execution, ExecutionStatus, HandlerKind, Schedule, TaskType
from engine.testing.clock import SkewedClock
from engine.tracing import Tracing
from tests.actors import probe_handlers
from tests.actors.harness import (
    PARTITIONS,
    START,
    TEST_TENANTS,
    all_executions,
    cluster,
    create,
    make_schedules,
    node_context,
)
from tests.ledger.backends import NOOP

PROBE = TaskType(
    name="probe",
    kind=HandlerKind.PYTHON,
    allowed_tenants=TEST_TENANTS,
    settings={"callable": "tests.actors.probe_handlers:probe"},
)
"""A python task type: never inline, run the one-by-one way."""


class RecordingNoop:
    """``noop`` that records each run: inline as ``noop`` is (see
    :func:`test_noop_without_a_delay_is_inline_and_every_other_handler_is_not`), and told per
    execution id to misbehave: ``"hang"`` (wait forever, breaking an inline handler's word),
    ``"raise"``."""

    inline = True

    def __init__(self) -> None:
        self.runs: Counter[str] = Counter()
        self.misbehave: dict[str, str] = {}

    async def run(self, context: ExecutionContext) -> HandlerResult:
        self.runs[context.execution_id] += 1
        how = self.misbehave.get(context.execution_id)
        if how == "hang":
            await trio.sleep_forever()
        if how == "raise":
            raise RuntimeError("a bug in the handler")
        return HandlerResult.succeeded()


@dataclass
class Pool:
    """A running worker pool, the channels around it, and what it shares."""

    pool: WorkerPool
    room: Room
    claimed: trio.MemorySendChannel[Attempt]
    completed: trio.MemoryReceiveChannel[Attempt]
    noop: RecordingNoop
    metrics_registry: CollectorRegistry
    handed: list[Attempt] = field(default_factory=list)

    def hand_over(
        self, key: str, task_type: str = "noop", *, claimed_s_ago: float = 0.0
    ) -> Attempt:
        """Send a claimed attempt of schedule ``key``'s execution, as a claimer does."""
        execution = Execution(
            execution_id=f"{key}:2026-03-02T00:00:00Z", schedule_id=key, tenant_id="t",
            task_type=task_type, planned_at=START, status=ExecutionStatus.RUNNING, attempt=1,
            fencing_token=1, partition_id=partition_of(key, PARTITIONS),
        )  # fmt: skip
        attempt = self.room.admit(execution)
        attempt.claimed, attempt.lease_s = True, 60.0
        attempt.renewed_at = trio.current_time() - claimed_s_ago
        self.claimed.send_nowait(attempt)
        self.handed.append(attempt)
        return attempt

    def take_completed(self) -> list[Attempt]:
        """The attempts handed on so far, closed as the completion writer closes them."""
        taken = []
        while True:
            try:
                attempt = self.completed.receive_nowait()
            except trio.WouldBlock:
                return taken
            attempt.close()
            taken.append(attempt)


KEYS = [f"k{n:03d}" for n in range(300)]
YEARLY = "0 0 1 1 *"


@asynccontextmanager
async def open_pool(
    monkeypatch: pytest.MonkeyPatch, *, workers: int = 4, completed_max: int = 1_000
) -> AsyncIterator[Pool]:
    """A worker pool on a memory ledger owning every partition, its caches warm (the noop and
    probe task types, the schedules of :data:`KEYS`), running until the block ends."""
    clock = SkewedClock(START)
    ledger = MemoryLedger(clock=clock, partition_count=PARTITIONS)
    # A deadline (5 s + the grace) that comes before the first attempt lease renewal (20 s):
    # the pool's partitions are not leased in the ledger, so a renewal would lose them.
    await ledger.task_types_put(TaskTypesPut(msgspec.structs.replace(NOOP, timeout_s=5.0)))
    await ledger.task_types_put(TaskTypesPut(PROBE))
    await ledger.schedules_create(
        SchedulesCreate(
            [
                Schedule(schedule_id=k, tenant_id="t", cron_expr="0 0 1 1 *", task_type="noop")
                for k in KEYS
            ]
        )
    )
    noop = RecordingNoop()
    real_build = task_kinds.build_handler

    def build(kind: str, settings: Mapping[str, Any], **kwargs: Any) -> Handler:
        return noop if kind == "noop" else real_build(kind, settings, **kwargs)

    monkeypatch.setattr(task_kinds, "build_handler", build)
    ctx = node_context(ledger, clock)
    for partition in range(PARTITIONS):
        ctx.table.add(Fence(partition, "n1", 1), trusted_until=1e9)
    room = Room(HandoffSizer(workers, 1_000, 1.0), 1_000)
    kinds = TaskKinds(ledger, clock, HandlerOptions(enable_python=True), wall_clock=clock)
    schedules = ScheduleCache(ledger, clock, 600.0)
    await kinds.get("noop")
    await kinds.get("probe")
    for key in KEYS:
        await schedules.get(key)
    pool = WorkerPool(
        WorkerPoolConfig(workers=workers, blocking_workers=2),
        ctx=ctx,
        kinds=kinds,
        schedules=schedules,
        announcements=Announcements(clock.now, 1.0),
        room=room,
    )
    claimed_send, claimed_receive = trio.open_memory_channel[Attempt](1_000)
    completed_send, completed_receive = trio.open_memory_channel[Attempt](completed_max)
    async with trio.open_nursery() as nursery:
        await nursery.start(pool.run, claimed_receive, completed_send)
        yield Pool(pool, room, claimed_send, completed_receive, noop, ctx.metrics.registry)
        nursery.cancel_scope.cancel()


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    """The value of sample ``name`` with exactly ``labels`` in a scrape of ``registry``."""
    body, _ = render(registry)
    for family in text_string_to_metric_families(body.decode()):
        for found in family.samples:
            if found.name == name and found.labels == labels:
                return found.value
    return None


def ids(attempts: list[Attempt]) -> Counter[str]:
    return Counter(a.execution.execution_id for a in attempts)


def outcomes(attempts: list[Attempt]) -> Counter[str]:
    return Counter(
        a.completion.outcome.value if a.completion else "none" for a in attempts
    )  # fmt: skip


def test_noop_without_a_delay_is_inline_and_every_other_handler_is_not() -> None:
    assert is_inline(NoopHandler({}))
    assert not is_inline(NoopHandler({"delay_s": 1}))  # it waits: one by one
    python = build_handler(
        "python",
        {"callable": "tests.actors.probe_handlers:probe"},
        options=HandlerOptions(enable_python=True),
    )
    assert not is_inline(python)

    class Truthy:
        inline = "yes"

    assert not is_inline(Truthy())  # type: ignore[arg-type]  # only a literal True counts


async def test_a_burst_of_inline_attempts_runs_in_batches_each_attempt_once_and_counted(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with open_pool(monkeypatch) as p:
        for key in KEYS:
            p.hand_over(key)
        await trio.sleep(1)
        done = p.take_completed()
        statistics = p.pool.statistics()
        in_flight, still_open = p.room.in_flight, len(p.room.open)
    assert ids(done) == Counter({a.execution.execution_id: 1 for a in p.handed})
    assert outcomes(done) == {"succeeded": len(KEYS)}
    assert p.noop.runs == ids(done)
    # In batches: at most INLINE_BATCH_MAX a turn, far fewer turns than attempts.
    assert -(-len(KEYS) // INLINE_BATCH_MAX) <= statistics.inline_batches < len(KEYS) // 4
    assert statistics.finished == {"succeeded": len(KEYS)}
    assert (in_flight, still_open) == (0, 0)
    # Every attempt is in the metrics, one observation each, as one by one.
    registry = p.metrics_registry
    assert sample(registry, "carillon_starts_total") == len(KEYS)
    assert sample(registry, "carillon_start_delay_seconds_count") == len(KEYS)
    succeeded = {"status": "succeeded", "task_type": "noop"}
    assert sample(registry, "execution_attempts_total", **succeeded) == len(KEYS)
    assert sample(registry, "execution_duration_ms_count", task_type="noop") == len(KEYS)


async def test_an_abandoned_attempt_in_a_batch_never_runs_and_writes_no_completion(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with open_pool(monkeypatch) as p:
        for key in KEYS[:4]:
            p.hand_over(key)
        given_up = p.hand_over(KEYS[4])
        given_up.abandoned = True  # re-queued by the ledger while it waited
        stale = p.hand_over(KEYS[5], claimed_s_ago=45.0)  # its lease may have run out
        for key in KEYS[6:10]:
            p.hand_over(key)
        await trio.sleep(1)
        done = p.take_completed()
        abandoned = p.pool.statistics().abandoned
        in_flight, still_open = p.room.in_flight, len(p.room.open)
    skipped = {given_up.execution.execution_id, stale.execution.execution_id}
    assert set(ids(done)) == {a.execution.execution_id for a in p.handed} - skipped
    assert outcomes(done) == {"succeeded": 8}
    assert set(p.noop.runs) == set(ids(done))  # neither of the two ran
    assert given_up.closed
    assert stale.closed
    assert stale.abandoned
    assert abandoned == 1  # the stale one; the other was abandoned elsewhere
    assert (in_flight, still_open) == (0, 0)


async def test_a_batch_mixing_inline_and_python_attempts_runs_each_once_the_python_one_alone(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    probe_handlers.reset(run_s=0.5)
    async with open_pool(monkeypatch) as p:
        kinds = ["noop", "noop", "probe", "noop", "probe", "noop", "noop"]
        for key, task_type in zip(KEYS, kinds, strict=False):
            p.hand_over(key, task_type)
        await trio.sleep(5)
        done = p.take_completed()
        in_flight, still_open = p.room.in_flight, len(p.room.open)
    assert ids(done) == Counter({a.execution.execution_id: 1 for a in p.handed})
    assert outcomes(done) == {"succeeded": len(kinds)}
    probes = {a.execution.execution_id for a in p.handed if a.execution.task_type == "probe"}
    assert Counter(dict.fromkeys(probes, 1)) == probe_handlers.RUNS
    assert set(p.noop.runs) == set(ids(done)) - probes
    assert set(p.noop.runs.values()) == {1}
    assert (in_flight, still_open) == (0, 0)


async def test_an_inline_handler_that_hangs_is_stopped_by_the_deadline_and_the_rest_still_run(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with open_pool(monkeypatch) as p:
        p.noop.misbehave[f"{KEYS[2]}:2026-03-02T00:00:00Z"] = "hang"
        p.noop.misbehave[f"{KEYS[5]}:2026-03-02T00:00:00Z"] = "raise"
        for key in KEYS[:8]:
            p.hand_over(key)
        await trio.sleep(15)  # past the noop task type's 5 s timeout and the grace
        done = p.take_completed()
        statistics = p.pool.statistics()
        in_flight, still_open = p.room.in_flight, len(p.room.open)
    assert ids(done) == Counter({a.execution.execution_id: 1 for a in p.handed})
    by_key = {a.execution.schedule_id: a.completion for a in done}
    hung, crashed = by_key.pop(KEYS[2]), by_key.pop(KEYS[5])
    assert hung is not None
    assert (hung.outcome, hung.error_code) == (Outcome.FAILED, "timeout")  # retried later
    assert crashed is not None
    assert crashed.error_code == "handler_crashed"
    assert {c.outcome for c in by_key.values() if c} == {Outcome.SUCCEEDED}
    assert len(by_key) == 6
    assert set(p.noop.runs.values()) == {1}  # none ran twice, none was skipped
    assert (statistics.crashed, statistics.busy) == (1, 0)
    assert (in_flight, still_open) == (0, 0)


async def test_stopping_in_the_middle_of_a_batch_gives_everything_back_exactly_once(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Room for one completion, and nobody writing them: the worker waits handing its batch on.
    async with open_pool(monkeypatch, workers=1, completed_max=1) as p:
        for key in KEYS[:10]:
            p.hand_over(key)
        await trio.sleep(1)
        assert p.pool.statistics().finished == {"succeeded": 10}
    # The pool is stopped: its batch was cut short while the second completion waited.
    [passed_on] = [a for a in p.handed if not a.closed]
    assert p.completed.receive_nowait() is passed_on  # the one the completions now own
    assert p.room.in_flight == 0  # every slot given back: nine closed, one run to its end
    assert p.room.open == {passed_on}
    passed_on.close()  # as the completion writer (or the pipeline's teardown) does
    assert not p.room.open


async def test_stopping_while_an_inline_handler_hangs_gives_everything_back_exactly_once(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with open_pool(monkeypatch, workers=1) as p:
        p.noop.misbehave[f"{KEYS[2]}:2026-03-02T00:00:00Z"] = "hang"
        for key in KEYS[:6]:
            p.hand_over(key)
        await trio.sleep(1)  # before its deadline: the node stops with the handler hanging
        assert p.pool.statistics().busy == 1
    # Two ran (their completions not handed on yet), one hung, three were not reached.
    assert set(p.noop.runs) == {f"{key}:2026-03-02T00:00:00Z" for key in KEYS[:3]}
    assert all(attempt.closed for attempt in p.handed)
    assert (p.room.in_flight, p.room.open) == (0, set())
    assert p.pool.statistics().busy == 0


def sdk_tracing(exporter: InMemorySpanExporter) -> Tracing:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return Tracing(provider.get_tracer("carillon"))


HOURLY: Callable[[int], tuple[str, str]] = lambda n: ("0 * * * *", "UTC")  # noqa: E731


async def test_a_noop_burst_through_a_node_succeeds_once_each_in_batches(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with cluster() as c:
        await create(c.ledger, make_schedules(400, START, HOURLY))
        # Not on the dispatcher's 10 s settings refresh, whose task types expire just then:
        # an attempt finding its task type expired runs alone (and reads it again).
        await trio.sleep(5)
        node = (await c.start_node("n1")).node
        await trio.sleep(3600 + 60)
        statistics = node.workers.statistics()
        room = node.pipeline.room
        in_flight, still_open = room.in_flight, len(room.open)
    executions = await all_executions(c.ledger)
    assert len(executions) == 400
    assert {(e.status, e.attempt) for e in executions} == {(ExecutionStatus.SUCCEEDED, 1)}
    assert statistics.finished == {"succeeded": 400}
    assert 0 < statistics.inline_batches < 400 // 4
    assert (in_flight, still_open) == (0, 0)


async def test_with_tracing_on_each_inline_attempt_still_has_its_own_span(
    autojump_clock: trio.testing.MockClock,
) -> None:
    exporter = InMemorySpanExporter()
    async with cluster() as c:
        await create(c.ledger, make_schedules(50, START, HOURLY))
        node = (await c.start_node("n1", tracing=sdk_tracing(exporter))).node
        await trio.sleep(3600 + 60)
        statistics = node.workers.statistics()
    spans = [s for s in exporter.get_finished_spans() if s.name == "carillon.attempt"]
    executions = await all_executions(c.ledger)
    assert Counter(dict(s.attributes or {})["carillon.execution.id"] for s in spans) == Counter(
        {e.execution_id: 1 for e in executions}
    )
    assert {dict(s.attributes or {})["carillon.outcome"] for s in spans} == {"succeeded"}
    assert statistics.inline_batches == 0  # one by one, as before


def test_the_recording_stand_in_is_the_noop_kind_in_every_respect_but_recording() -> None:
    """The stand-in replaces ``noop`` only where a test asks which attempts ran: same kind of
    result, and inline like the real one."""
    real = NoopHandler({})
    assert is_inline(real)
    assert is_inline(RecordingNoop())
    context = ExecutionContext(
        execution_id="k:2026-03-02T00:00:00Z", schedule_id="k", tenant_id="t",
        task_type="noop", planned_at=START, attempt=1, fencing_token=1,
    )  # fmt: skip
    assert trio.run(real.run, context) == trio.run(RecordingNoop().run, context)
    assert msgspec.structs.asdict(trio.run(real.run, context)) == {
        "kind": "succeeded",
        "error_code": None,
        "error_message": None,
        "retry_after_s": None,
    }
