"""A whole node dispatching a burst: fair across tenants, weighted, capped, paced.

The handler is a probe (``tests/actors/probe_handlers.py``) that records the order and the
(mock) time of every start and the most executions running at once per task type and
tenant; every execution of a test is due at the same instant.
"""

from __future__ import annotations

from collections import Counter
from datetime import timedelta

import msgspec
import trio
import trio.testing

from engine.ledger.params import SchedulesCreate, TaskTypesPut, TenantsPut
from engine.model import HandlerKind, Schedule, TaskType, Tenant
from tests.actors import probe_handlers
from tests.actors.harness import START, TEST_TENANTS, cluster, make_schedules
from tests.ledger.backends import put_noop_task_type

INSTANT = START.replace(minute=0, second=0) + timedelta(hours=1)
"""When every execution of these tests is due (01:00)."""
PROBE = TaskType(
    name="probe",
    kind=HandlerKind.PYTHON,
    allowed_tenants=TEST_TENANTS,
    settings={"callable": "tests.actors.probe_handlers:probe"},
)


def due_at_once(
    prefix: str, count: int, *, tenant: str, task_type: str = "probe"
) -> list[Schedule]:
    [template] = make_schedules(1, START, lambda n: ("0 * * * *", "UTC"))
    return [
        msgspec.structs.replace(
            template, schedule_id=f"{prefix}-{n:05d}", tenant_id=tenant, task_type=task_type
        )
        for n in range(count)
    ]


async def store(ledger: object, *task_types: TaskType, schedules: list[Schedule]) -> None:
    await put_noop_task_type(ledger)  # type: ignore[arg-type]
    for task_type in (PROBE, *task_types):
        await ledger.task_types_put(TaskTypesPut(task_type))  # type: ignore[attr-defined]
    for first in range(0, len(schedules), 1000):
        await ledger.schedules_create(  # type: ignore[attr-defined]
            SchedulesCreate(schedules[first : first + 1000])
        )


def last_start_of(tenant: str) -> int:
    return max(i for i, (_, t, _) in enumerate(probe_handlers.STARTS) if t == tenant)


async def test_nine_small_tenants_finish_long_before_a_big_one_with_10000_due(
    autojump_clock: trio.testing.MockClock,
) -> None:
    probe_handlers.reset(run_s=0.0)
    schedules = due_at_once("big", 10_000, tenant="big")
    for n in range(9):
        schedules += due_at_once(f"small{n}", 100, tenant=f"small-{n}")
    async with cluster(workers=16) as c:
        await store(c.ledger, schedules=schedules)
        await c.start_node("n1")
        await trio.sleep((INSTANT - START).total_seconds() + 120)
    starts = probe_handlers.STARTS
    assert Counter(tenant for _, tenant, _ in starts) == {
        "big": 10_000,
        **{f"small-{n}": 100 for n in range(9)},
    }
    # Round-robin over ten tenants: the 900 small executions are among the first ~1,000
    # starts (a claim batch's slack aside), not behind the big tenant's 10,000.
    for n in range(9):
        assert last_start_of(f"small-{n}") < 1_500
    first_thousand = Counter(tenant for _, tenant, _ in starts[:1000])
    assert first_thousand["big"] <= 250  # a fair 100, and a claim batch of slack


async def test_starts_follow_the_tenants_weights(
    autojump_clock: trio.testing.MockClock,
) -> None:
    probe_handlers.reset(run_s=0.0)
    schedules = due_at_once("a", 2_000, tenant="heavy") + due_at_once("b", 2_000, tenant="light")
    async with cluster(workers=16) as c:
        await store(c.ledger, schedules=schedules)
        await c.ledger.tenants_put(TenantsPut(Tenant(tenant_id="heavy", weight=3)))
        await c.start_node("n1")
        await trio.sleep((INSTANT - START).total_seconds() + 120)
    first = Counter(tenant for _, tenant, _ in probe_handlers.STARTS[:2_000])
    assert 0.70 <= first["heavy"] / 2_000 <= 0.80  # 3 : 1
    assert len(probe_handlers.STARTS) == 4_000


async def test_caps_and_quotas_are_reached_and_never_exceeded(
    autojump_clock: trio.testing.MockClock,
) -> None:
    probe_handlers.reset(run_s=1.0)
    capped = msgspec.structs.replace(PROBE, name="capped", max_concurrency=3)
    clustered = msgspec.structs.replace(PROBE, name="clustered", max_concurrency_cluster=2)
    schedules = (
        due_at_once("cap", 30, tenant="t1", task_type="capped")
        + due_at_once("quota", 20, tenant="quota")
        + due_at_once("clu", 40, tenant="t2", task_type="clustered")
        + due_at_once("free", 40, tenant="t3")
    )
    async with cluster(workers=32) as c:
        await store(c.ledger, capped, clustered, schedules=schedules)
        await c.ledger.tenants_put(TenantsPut(Tenant(tenant_id="quota", concurrency_quota=2)))
        await c.start_node("n1")
        await c.start_node("n2")  # the cluster-wide cap binds both nodes together
        await trio.sleep((INSTANT - START).total_seconds() + 600)
    peak = probe_handlers.PEAK
    assert len(probe_handlers.STARTS) == 130
    assert peak["type:capped"] <= 3 * 2  # per node, two nodes
    assert peak["tenant:quota"] <= 2 * 2
    assert peak["type:clustered"] == 2  # reached, never exceeded, across both nodes
    assert peak["tenant:t3"] > 6  # the uncapped ones ran wide


async def test_a_node_rate_spreads_a_burst_within_ten_percent(
    autojump_clock: trio.testing.MockClock,
) -> None:
    probe_handlers.reset(run_s=0.0)
    async with cluster(workers=32, dispatch_rate_per_s=50, dispatch_burst=10) as c:
        await store(c.ledger, schedules=due_at_once("r", 1_000, tenant="t"))
        await c.start_node("n1")
        await trio.sleep((INSTANT - START).total_seconds() + 60)
    times = [at for at, _, _ in probe_handlers.STARTS]
    assert len(times) == 1_000
    first = times[0]
    per_second = Counter(int(at - first) for at in times)
    # After the burst allowance, 50 a second: every whole second of the spread within 10 %.
    spread_s = int(times[-1] - first)
    assert 18 <= spread_s <= 21  # (1,000 - 10) / 50 = 19.8 s
    for second in range(1, spread_s):
        assert 45 <= per_second[second] <= 55, (second, per_second[second])
