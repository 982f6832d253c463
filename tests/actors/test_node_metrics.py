"""A running node's metrics move with its work: what a scrape of ``node.metrics`` shows after
executions succeed, fail, retry, dead-letter, overlap, catch up or are redelivered, and after
leases are taken, refused or run out. Every figure is checked against the ledger or against
what the scenario makes certain, never against the actors' own statistics."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta

import msgspec
import trio
import trio.testing
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from engine.config import DISPATCH_QUEUE_MAX_DEFAULT, WORKERS_DEFAULT
from engine.core.hashing import partition_of
from engine.errors import LedgerUnavailable, PermanentError
from engine.handlers import ExecutionContext
from engine.ledger.params import (
    ExecutionsExtend,
    ExecutionsPlan,
    LeasesRenew,
    PlanResult,
    SchedulesCreate,
    TaskTypesPut,
)
from engine.metrics import render
from engine.model import Execution, ExecutionStatus, HandlerKind, Lease, Schedule, TaskType
from engine.node import Node
from tests.actors import overlap_handlers, probe_handlers
from tests.actors.harness import (
    PARTITIONS,
    START,
    TEST_TENANTS,
    all_executions,
    cluster,
    create,
    make_schedules,
)
from tests.ledger.backends import put_noop_task_type
from tests.test_metrics_exposition import FAMILIES, exposed

EVERY_PARTITION = {str(p) for p in range(PARTITIONS)}
INSTANT = START.replace(minute=0, second=0) + timedelta(hours=1)
"""When the hourly schedules of these tests first fire (01:00)."""


def every_minute(n: int) -> tuple[str, str]:
    return ("* * * * *", "UTC")


def hourly(n: int) -> tuple[str, str]:
    return ("0 * * * *", "UTC")


class Scrape:
    """One scrape of a node's metrics, parsed from the text exposition as Prometheus reads it."""

    def __init__(self, node: Node) -> None:
        body, _ = render(node.metrics.registry)
        self._samples: dict[str, list[Sample]] = {}
        for family in text_string_to_metric_families(body.decode()):
            for sample in family.samples:
                self._samples.setdefault(sample.name, []).append(sample)

    def __call__(self, name: str, **labels: str) -> float | None:
        """The sample ``name`` with exactly ``labels``, or ``None`` when there is none."""
        for sample in self._samples.get(name, []):
            if sample.labels == labels:
                return sample.value
        return None

    def by(self, name: str, label: str, **fixed: str) -> dict[str, float]:
        """The samples ``name`` (with ``fixed`` labels among theirs) keyed by ``label``."""
        return {
            s.labels[label]: s.value
            for s in self._samples.get(name, [])
            if fixed.items() <= s.labels.items()
        }


def python_task_type(name: str, function: str, **fields: object) -> TaskType:
    return TaskType(
        name=name,
        kind=HandlerKind.PYTHON,
        allowed_tenants=TEST_TENANTS,
        settings={"callable": function},
        **fields,
    )  # type: ignore[arg-type]


async def always_bad(context: ExecutionContext) -> None:
    raise PermanentError("the payload is invalid")


async def run_hourly(task_type: TaskType, count: int) -> tuple[Node, list[Execution]]:
    """Run ``count`` hourly schedules of ``task_type`` through their first fire (and two
    minutes more); the node and the executions."""
    schedules = [
        msgspec.structs.replace(s, task_type=task_type.name)
        for s in make_schedules(count, START, hourly)
    ]
    async with cluster() as c:
        await c.ledger.task_types_put(TaskTypesPut(task_type))
        await create(c.ledger, schedules)
        sim = await c.start_node("n1")
        await trio.sleep((INSTANT - START).total_seconds() + 120)
    return sim.node, await all_executions(c.ledger)


# -- executions ---------------------------------------------------------------------------


async def test_executions_run_to_success_count_as_enqueued_started_and_succeeded(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with cluster() as c:
        await create(c.ledger, make_schedules(5, START, every_minute))
        sim = await c.start_node("n1")
        await trio.sleep(615)  # to 00:10:45: ten fires each, all run; 00:11 not planned yet
    executions = await all_executions(c.ledger)
    assert len(executions) == 50
    assert {e.status for e in executions} == {ExecutionStatus.SUCCEEDED}
    m = Scrape(sim.node)
    assert m("due_jobs_enqueued_total") == 50
    assert m("carillon_enqueue_delay_seconds_bucket", le="0.0") == 50  # all written ahead
    assert m.by("execution_attempts_total", "status", task_type="noop") == {"succeeded": 50}
    assert m("execution_duration_ms_count", task_type="noop") == 50
    assert m.by("dead_letter_total", "task_type") == {}
    # First attempts, without a tenant label (tenant labels are opt-in), all well on time.
    assert m("carillon_starts_total") == 50
    assert m("carillon_start_delay_seconds_bucket", le="1.0") == 50
    assert m("carillon_starts_late_total") == 0
    assert m("carillon_start_slo_ratio") == 1.0
    assert m("carillon_start_slo_target_seconds") == 60.0
    assert m("carillon_retries_total") == 0


async def test_dead_lettered_execution_counts_in_dead_letter_total(
    autojump_clock: trio.testing.MockClock,
) -> None:
    bad = python_task_type("bad", f"{__name__}:always_bad")
    node, executions = await run_hourly(bad, 3)
    assert [e.status for e in executions] == [ExecutionStatus.DEAD_LETTER] * 3
    m = Scrape(node)
    assert m("dead_letter_total", task_type="bad") == 3
    assert m.by("execution_attempts_total", "status", task_type="bad") == {"dead-letter": 3}
    assert m("execution_duration_ms_count", task_type="bad") == 3
    assert m("carillon_starts_total") == 3


async def test_a_retried_execution_counts_a_failed_attempt_a_retry_start_and_a_success(
    autojump_clock: trio.testing.MockClock,
) -> None:
    flaky = python_task_type("flaky", "tests.actors.user_handlers:flaky_once")
    node, executions = await run_hourly(flaky, 2)
    assert [(e.status, e.attempt) for e in executions] == [(ExecutionStatus.SUCCEEDED, 2)] * 2
    m = Scrape(node)
    assert m.by("execution_attempts_total", "status", task_type="flaky") == {
        "failed": 2,
        "succeeded": 2,
    }
    assert m("carillon_retries_total") == 2
    # The SLO judges first attempts only: a retry starts late on purpose.
    assert m("carillon_starts_total") == 2
    assert m("carillon_start_delay_seconds_count") == 2
    assert m.by("dead_letter_total", "task_type") == {}


async def test_an_attempt_redelivered_after_its_lease_ran_out_counts_as_expired_and_retried(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # Five minutes of work, five times the attempt lease (60 s).
    slow = TaskType(
        name="slow",
        kind=HandlerKind.NOOP,
        allowed_tenants=("*",),
        settings={"delay_s": 300, "timeout_s": 600},
        timeout_s=600,
    )
    async with cluster() as c:
        await c.ledger.task_types_put(TaskTypesPut(slow))
        [schedule] = make_schedules(1, START, hourly)
        await create(c.ledger, [msgspec.structs.replace(schedule, task_type="slow")])
        sim = await c.start_node("n1")
        extend = c.ledger.executions_extend
        refusing = True

        async def lost_renewals(params: ExecutionsExtend) -> list[str]:
            # As if the renewals were lost on the way: the attempt lease runs out meanwhile.
            if refusing:
                await trio.lowlevel.checkpoint()
                return []
            return await extend(params)

        sim.ledger.executions_extend = lost_renewals  # type: ignore[method-assign]
        await trio.sleep((INSTANT - START).total_seconds() + 30)
        refusing = False
        await trio.sleep(600)
    [execution] = await all_executions(c.ledger)
    assert (execution.status, execution.attempt) == (ExecutionStatus.SUCCEEDED, 2)
    m = Scrape(sim.node)
    assert m("carillon_attempts_expired_total") == 1
    assert m("carillon_retries_total") == 1
    assert m("carillon_starts_total") == 1
    # The abandoned first attempt wrote no completion, so it is not a finished attempt.
    assert m.by("execution_attempts_total", "status", task_type="slow") == {"succeeded": 1}


# -- skips --------------------------------------------------------------------------------


async def test_fires_skipped_for_overlap_count_in_skipped_total(
    autojump_clock: trio.testing.MockClock,
) -> None:
    overlap_handlers.reset()
    slow = python_task_type("slow", "tests.actors.overlap_handlers:slow", timeout_s=300)
    schedule = Schedule(
        schedule_id="reports",
        tenant_id="acme",
        cron_expr="* * * * *",
        task_type="slow",
        next_run_at=START.replace(second=0) + timedelta(minutes=1),
        overlap="skip",  # type: ignore[arg-type]
    )
    async with cluster() as c:
        await c.ledger.task_types_put(TaskTypesPut(slow))
        await c.ledger.schedules_create(SchedulesCreate([schedule]))
        sim = await c.start_node("n1")
        await trio.sleep(9 * 60 + 10)  # nine fires; 130 s runs start at the 1st, 4th, 7th
    statuses = Counter(e.status for e in await all_executions(c.ledger))
    assert statuses[ExecutionStatus.SKIPPED] == 6
    m = Scrape(sim.node)
    assert m.by("carillon_skipped_total", "reason") == {"overlap": 6}
    assert m("due_jobs_enqueued_total") == 9  # planned as queued; skipped at dispatch


async def test_missed_fires_count_in_skipped_total_by_catch_up_reason_and_bulk_range(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # A per-second schedule last planned two hours ago: far more missed fires than the
    # catch-up records one by one, so the oldest are skipped as one range.
    [schedule] = make_schedules(1, START, lambda n: ("* * * * * *", "UTC"))
    schedule = msgspec.structs.replace(schedule, next_run_at=START - timedelta(hours=2))
    async with cluster() as c:
        await create(c.ledger, [schedule])
        sim = await c.start_node("n1")
        await trio.sleep(20)
    executions = await all_executions(c.ledger)
    reasons = Counter(e.error_code for e in executions if e.status is ExecutionStatus.SKIPPED)
    assert reasons["catchup_latest_only"] > 0  # the default policy: run the latest only
    m = Scrape(sim.node)
    assert m.by("carillon_skipped_total", "reason") == {**reasons, "catchup_bulk": 1}
    queued = sum(1 for e in executions if e.status is not ExecutionStatus.SKIPPED)
    assert m("due_jobs_enqueued_total") == queued
    assert m("carillon_enqueue_delay_seconds_count") == queued


async def test_a_batch_planned_again_after_its_answer_was_lost_counts_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with cluster() as c:
        plan = c.ledger.executions_plan
        answers_lost = 0

        async def answer_lost_once(params: ExecutionsPlan) -> PlanResult:
            # The transaction commits, then the connection drops before the answer arrives:
            # the planner retries the same batch, and the ledger inserts nothing new.
            nonlocal answers_lost
            result = await plan(params)
            if params.executions and not answers_lost:
                answers_lost += 1
                raise LedgerUnavailable("connection lost after commit")
            return result

        c.ledger.executions_plan = answer_lost_once  # type: ignore[method-assign]
        await create(c.ledger, make_schedules(5, START, every_minute))
        sim = await c.start_node("n1")
        await trio.sleep(165)  # to 00:03:15: three fires each
    assert answers_lost == 1
    assert len(await all_executions(c.ledger)) == 15
    assert Scrape(sim.node)("due_jobs_enqueued_total") == 15


# -- the start SLO ------------------------------------------------------------------------


async def test_start_delays_are_measured_on_the_database_corrected_clock(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # The node's clock runs 1.5 s fast (within the 2 s bound): measured on it, every start
    # would look 1.5 s late; corrected by the measured offset, each is on its instant.
    async with cluster() as c:
        await create(c.ledger, make_schedules(5, START, every_minute))
        sim = await c.start_node("n1", skew_s=1.5)
        await trio.sleep(315)
    m = Scrape(sim.node)
    assert m("carillon_clock_offset_seconds") == -1.5
    assert m("carillon_starts_total") == 25
    assert m("carillon_start_delay_seconds_bucket", le="0.5") == 25


async def test_starts_later_than_the_configured_slo_target_count_as_late_per_tenant(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # One worker, 10 s handlers, five executions due at once: they start 0, 10, 20, 30 and
    # 40 s after their instant, so three miss a 15 s target.
    probe_handlers.reset(run_s=10.0)
    probe = python_task_type("probe", "tests.actors.probe_handlers:probe")
    schedules = [
        msgspec.structs.replace(s, task_type="probe", tenant_id=f"tenant-{n}")
        for n, s in enumerate(make_schedules(5, START, hourly))
    ]
    async with cluster(workers=1, slo_target_s=15, metrics_tenant_labels=True) as c:
        await put_noop_task_type(c.ledger)
        await c.ledger.task_types_put(TaskTypesPut(probe))
        await create(c.ledger, schedules)
        sim = await c.start_node("n1")
        await trio.sleep((INSTANT - START).total_seconds() + 120)
    assert [round(at - probe_handlers.STARTS[0][0]) for at, _, _ in probe_handlers.STARTS] == [
        0,
        10,
        20,
        30,
        40,
    ]
    m = Scrape(sim.node)
    tenants = {f"tenant-{n}" for n in range(5)}
    assert m.by("carillon_starts_total", "tenant") == dict.fromkeys(tenants, 1.0)
    assert sum(m.by("carillon_starts_late_total", "tenant").values()) == 3
    on_time = m.by("carillon_start_delay_seconds_bucket", "tenant", le="15.0")
    assert sum(on_time.values()) == 2  # the target is a bucket boundary
    assert m("carillon_start_slo_ratio") == 0.4
    assert m("carillon_start_slo_target_seconds") == 15.0


# -- leases and scrape-time gauges ---------------------------------------------------------


async def test_scrapes_show_owned_partitions_planner_lag_and_checkpoints_while_they_are_true(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with cluster() as c:
        await create(c.ledger, make_schedules(20, START, every_minute))
        sim = await c.start_node("n1")
        await trio.sleep(300)
        running = Scrape(sim.node)
    planned_in = {str(e.partition_id) for e in await all_executions(c.ledger)}
    assert running("carillon_partitions_owned") == 16
    assert running.by("carillon_planner_lag_seconds", "partition") == dict.fromkeys(
        EVERY_PARTITION, 0.0
    )
    assert running("scheduler_lag_seconds") == 0.0
    # A partition has a checkpoint once its planner wrote a batch; every-minute schedules
    # keep it within a minute behind (or the lookahead ahead of) now.
    ages = running.by("carillon_checkpoint_age_seconds", "partition")
    assert set(ages) == planned_in
    assert all(-5.0 <= age < 60.0 for age in ages.values()), ages
    assert running("carillon_queue_capacity") == DISPATCH_QUEUE_MAX_DEFAULT
    assert running("carillon_workers_capacity") == WORKERS_DEFAULT
    assert running("carillon_live_nodes") == 1
    assert running("carillon_clock_planning_allowed") == 1
    assert running("carillon_clock_offset_seconds") == 0.0
    assert running("carillon_lease_acquisitions_total") == 16
    assert running("carillon_lease_releases_total") == 0
    stopped = Scrape(sim.node)
    assert stopped("carillon_lease_releases_total") == 16  # handed back on shutdown
    assert stopped("carillon_partitions_owned") == 0
    assert stopped.by("carillon_planner_lag_seconds", "partition") == {}
    assert stopped.by("carillon_lease_losses_total", "reason") == {"refused": 0, "expired": 0}


async def test_a_running_node_exposes_exactly_the_pinned_families(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with cluster() as c:
        await create(c.ledger, make_schedules(5, START, every_minute))
        sim = await c.start_node("n1")
        await trio.sleep(120)
        body, _ = render(sim.node.metrics.registry)
    families = exposed(body)
    assert [(n, k, h) for n, k, _, h in families] == [(n, k, h) for n, k, _, h in FAMILIES]
    for (name, _, labels, _), (_, _, pinned, _) in zip(families, FAMILIES, strict=True):
        assert set(labels) <= set(pinned), name
    labelled = {name: labels for name, _, labels, _ in families}
    assert labelled["carillon_planner_lag_seconds"] == ("partition",)
    assert labelled["execution_attempts"] == ("status", "task_type")


async def test_planner_lag_grows_per_partition_while_the_clock_monitor_pauses_planning(
    autojump_clock: trio.testing.MockClock,
) -> None:
    schedules = make_schedules(20, START, every_minute)
    async with cluster() as c:
        await create(c.ledger, schedules)
        # Probes slower than the bound cannot measure the database time: planning waits.
        sim = await c.start_node("n1", delays={"database_now": 3.0})
        await trio.sleep(600)  # to 00:10:30; the first fire, 00:01, is still unplanned
        m = Scrape(sim.node)
    with_schedules = {str(partition_of(s.schedule_id, PARTITIONS)) for s in schedules}
    lag = m.by("carillon_planner_lag_seconds", "partition")
    assert {p for p, s in lag.items() if s} == with_schedules
    assert set(lag.values()) == {0.0, 570.0}
    assert m("scheduler_lag_seconds") == 570.0
    assert m("carillon_clock_planning_allowed") == 0
    assert m("due_jobs_enqueued_total") == 0


async def test_queue_depth_and_busy_workers_are_read_from_the_node_at_each_scrape(
    autojump_clock: trio.testing.MockClock,
) -> None:
    probe_handlers.reset(run_s=10.0)
    probe = python_task_type("probe", "tests.actors.probe_handlers:probe")
    schedules = [
        msgspec.structs.replace(s, task_type="probe") for s in make_schedules(20, START, hourly)
    ]
    async with cluster(workers=1) as c:
        await put_noop_task_type(c.ledger)
        await c.ledger.task_types_put(TaskTypesPut(probe))
        await create(c.ledger, schedules)
        sim = await c.start_node("n1")
        await trio.sleep((INSTANT - START).total_seconds() + 1)
        during = Scrape(sim.node)
        waiting = sim.node.workers.statistics().waiting  # claimed, handed off to the worker
        await trio.sleep(20 * 10)
        after = Scrape(sim.node)
    assert during("carillon_workers_capacity") == 1
    assert during("carillon_workers_busy") == 1
    depth = during("carillon_queue_depth")
    assert depth is not None
    assert depth >= 10
    assert depth + 1 + waiting == 20
    assert after("carillon_queue_depth") == 0
    assert after("carillon_workers_busy") == 0


async def test_partitions_handed_to_a_joining_node_count_as_releases_and_acquisitions(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with cluster() as c:
        first = await c.start_node("n1")
        await trio.sleep(30)
        second = await c.start_node("n2")
        await trio.sleep(60)
        assert sorted(len(p) for p in c.owners().values()) == [8, 8]
        handing, joining = Scrape(first.node), Scrape(second.node)
    assert handing("carillon_lease_acquisitions_total") == 16
    assert handing("carillon_lease_releases_total") == 8
    assert joining("carillon_lease_acquisitions_total") == 8
    assert joining("carillon_lease_releases_total") == 0
    assert handing.by("carillon_lease_losses_total", "reason") == {"refused": 0, "expired": 0}


async def test_a_refused_renewal_counts_each_partition_as_a_lease_loss_refused(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with cluster() as c:
        sim = await c.start_node("n1")
        await trio.sleep(30)
        renew = c.ledger.leases_renew
        refused = 0

        async def refused_once(params: LeasesRenew) -> list[Lease]:
            # As if another node held every partition now.
            nonlocal refused
            if refused:
                return await renew(params)
            refused = len(params.fences)
            await trio.lowlevel.checkpoint()
            return []

        c.ledger.leases_renew = refused_once  # type: ignore[method-assign]
        await trio.sleep(30)
        m = Scrape(sim.node)
    assert refused == 16
    assert m.by("carillon_lease_losses_total", "reason") == {"refused": 16, "expired": 0}


async def test_a_database_outage_counts_each_partition_stepped_down_as_a_lease_loss_expired(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with cluster() as c:
        await create(c.ledger, make_schedules(20, START, every_minute))
        sim = await c.start_node("n1")
        await trio.sleep(60)
        sim.ledger.down = True  # every call fails: renewals cannot succeed
        await trio.sleep(60)
        assert list(sim.node.table) == []
        during = Scrape(sim.node)
        sim.ledger.down = False
        await trio.sleep(60)
        after = Scrape(sim.node)
    assert during.by("carillon_lease_losses_total", "reason") == {"refused": 0, "expired": 16}
    assert during("carillon_partitions_owned") == 0
    assert during("carillon_lease_acquisitions_total") == 16
    assert after("carillon_lease_acquisitions_total") == 32  # all taken back
    assert after("carillon_partitions_owned") == 16
