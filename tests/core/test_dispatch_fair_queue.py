"""The dispatcher's fair queue: tenant fairness, weights, due instants, caps and bounds."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.core.dispatch import CapExceeded, ConcurrencyLimits
from engine.core.fair_queue import WEIGHT_MAX, FairQueue, PushOutcome
from engine.model import Execution, ExecutionStatus, execution_id
from tests.core.queued_items import T0, Item


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def fill(queue: FairQueue[Item], tenant: str, count: int, task_type: str = "noop") -> None:
    for n in range(count):
        assert queue.push(Item(f"{tenant}-{n:05}", tenant, task_type)) is PushOutcome.QUEUED


def pop_all(queue: FairQueue[Item], now: datetime = T0, *, limit: int = 1_000_000) -> list[Item]:
    """Pop until nothing can start, finishing each execution at once."""
    popped: list[Item] = []
    while len(popped) < limit and (item := queue.pop(now)) is not None:
        queue.limits.finished(item.tenant_id, item.task_type)
        popped.append(item)
    return popped


def tenants_of(items: list[Item]) -> str:
    return "".join(item.tenant_id for item in items)


# -- fairness and weights ------------------------------------------------------------------


def test_small_tenants_finish_before_the_big_tenant_reaches_its_1000th_item() -> None:
    queue: FairQueue[Item] = FairQueue(max_items=20_000)
    fill(queue, "big", 10_000)
    for n in range(9):
        fill(queue, f"small{n}", 100)
    order = [item.tenant_id for item in pop_all(queue)]
    assert len(order) == 10_900
    big_1000th = [i for i, tenant in enumerate(order) if tenant == "big"][999]
    last_small = max(i for i, tenant in enumerate(order) if tenant != "big")
    assert last_small < big_1000th
    # Equal weights: strict rotation while all ten are backlogged (the big one has no head start).
    assert last_small == 999
    assert Counter(order[:1000]) == {"big": 100, **{f"small{n}": 100 for n in range(9)}}


def test_weights_3_1_1_interleave_as_a_b_a_c_a() -> None:
    queue: FairQueue[Item] = FairQueue(weights={"A": 3})
    for tenant in "ABC":
        fill(queue, tenant, 30)
    assert tenants_of(pop_all(queue, limit=20)) == "ABACA" * 4


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 12), min_size=1, max_size=7))
def test_every_prefix_is_within_one_item_of_the_weighted_share(weights: list[int]) -> None:
    total = sum(weights)
    tenants = [f"t{i}" for i in range(len(weights))]
    queue: FairQueue[Item] = FairQueue(weights=dict(zip(tenants, weights, strict=True)))
    for tenant, weight in zip(tenants, weights, strict=True):
        fill(queue, tenant, 4 * weight)  # more than any can pop in 3 rounds: all stay backlogged
    counts = dict.fromkeys(tenants, 0)
    for k, item in enumerate(pop_all(queue, limit=3 * total), start=1):
        counts[item.tenant_id] += 1
        for tenant, weight in zip(tenants, weights, strict=True):
            # |c_i - k * w_i / W| < 1, in integers.
            assert abs(counts[tenant] * total - k * weight) < total


def test_a_weight_change_takes_effect_at_once() -> None:
    queue: FairQueue[Item] = FairQueue()
    fill(queue, "A", 100)
    fill(queue, "B", 100)
    assert tenants_of(pop_all(queue, limit=4)) == "ABAB"
    queue.set_weight("A", 3)
    shares = Counter(tenants_of(pop_all(queue, limit=40)))
    assert abs(shares["A"] - 30) <= 1
    queue.set_weight("A", None)
    assert queue.weight("A") == 1
    shares = Counter(tenants_of(pop_all(queue, limit=40)))
    assert abs(shares["A"] - 20) <= 1


def test_a_tenant_arriving_late_gets_its_share_from_then_on_without_back_credit() -> None:
    queue: FairQueue[Item] = FairQueue()
    fill(queue, "A", 200)
    fill(queue, "B", 200)
    pop_all(queue, limit=100)
    fill(queue, "C", 200)
    shares = Counter(tenants_of(pop_all(queue, limit=90)))
    assert all(abs(shares[tenant] - 30) <= 1 for tenant in "ABC")


@settings(max_examples=40, deadline=None)
@given(st.permutations([(tenant, n) for tenant in "wxyz" for n in range(6)]))
def test_the_pop_order_does_not_depend_on_the_push_order(pushes: list[tuple[str, int]]) -> None:
    def order(sequence: list[tuple[str, int]]) -> list[str]:
        queue: FairQueue[Item] = FairQueue(weights={"x": 2})
        for tenant, n in sequence:
            queue.push(Item(f"{tenant}-{n}", tenant, planned_at=at(n % 3)))
        return [item.execution_id for item in pop_all(queue, at(10))]

    assert order(pushes) == order(sorted(pushes))


def test_weights_are_validated() -> None:
    queue: FairQueue[Item] = FairQueue()
    for weight in (0, WEIGHT_MAX + 1, True):
        with pytest.raises(ValueError, match="weight"):
            queue.set_weight("A", weight)


# -- due instants and order within a tenant ------------------------------------------------


def test_an_execution_that_may_not_start_is_refused() -> None:
    queue: FairQueue[Item] = FairQueue()
    for status in (ExecutionStatus.RUNNING, ExecutionStatus.SUCCEEDED, ExecutionStatus.SKIPPED):
        with pytest.raises(ValueError, match="only a queued or failed one can start"):
            queue.push(Item(f"e-{status}", "A", status=status))
    assert queue.pop(at(100)) is None


def test_a_retry_is_due_at_its_retry_instant_even_before_its_planned_one() -> None:
    queue: FairQueue[Item] = FairQueue()
    queue.push(
        Item("retry", "A", status=ExecutionStatus.FAILED, planned_at=at(10), not_before=at(5))
    )
    assert queue.next_due_at() == at(5)


def test_nothing_is_released_before_its_due_instant() -> None:
    queue: FairQueue[Item] = FairQueue()
    queue.push(Item("later", "A", planned_at=at(10)))
    queue.push(
        Item("retry", "A", status=ExecutionStatus.FAILED, planned_at=at(0), not_before=at(5))
    )
    assert queue.pop(at(4.999)) is None
    assert queue.next_due_at() == at(5)
    item = queue.pop(at(5))
    assert item is not None
    assert item.execution_id == "retry"
    assert queue.pop(at(9)) is None
    assert queue.next_due_at() == at(10)
    item = queue.pop(at(10))
    assert item is not None
    assert item.execution_id == "later"
    assert queue.next_due_at() is None


def test_a_clock_stepping_back_does_not_recall_released_items() -> None:
    queue: FairQueue[Item] = FairQueue()
    assert queue.pop(at(10)) is None
    queue.push(Item("due", "A", planned_at=at(8)))
    queue.push(Item("not-yet", "A", planned_at=at(12)))
    assert [i.execution_id for i in pop_all(queue, at(3))] == ["due"]


def test_a_tenants_items_come_out_by_due_instant_then_execution_id() -> None:
    queue: FairQueue[Item] = FairQueue()
    for name, planned in [("c", 2), ("b", 1), ("a", 2), ("d", 0)]:
        queue.push(Item(name, "A", planned_at=at(planned)))
    assert [item.execution_id for item in pop_all(queue, at(5))] == ["d", "b", "a", "c"]


def test_an_execution_record_can_be_queued() -> None:
    planned = at(60)
    execution = Execution(
        execution_id=execution_id("s1", planned),
        schedule_id="s1",
        tenant_id="acme",
        task_type="webhook",
        planned_at=planned,
        partition_id=0,
    )
    queue: FairQueue[Execution] = FairQueue()
    assert queue.push(execution) is PushOutcome.QUEUED
    assert queue.pop(at(59)) is None
    assert queue.pop(planned) == execution


# -- bounds --------------------------------------------------------------------------------


def test_push_reports_duplicates_and_overflow_and_changes_nothing() -> None:
    queue: FairQueue[Item] = FairQueue(max_items=2)
    assert queue.push(Item("a", "A")) is PushOutcome.QUEUED
    assert queue.push(Item("a", "A")) is PushOutcome.DUPLICATE
    assert queue.push(Item("b", "B")) is PushOutcome.QUEUED
    assert queue.room == 0
    assert queue.push(Item("c", "A")) is PushOutcome.FULL
    assert len(queue) == 2
    assert "c" not in queue
    assert queue.counts() == {"A": 1, "B": 1}
    stats = queue.statistics()
    assert (stats.duplicates_total, stats.overflows_total, stats.queued) == (1, 1, 2)
    assert queue.pop(T0) is not None
    assert queue.room == 1
    assert queue.push(Item("c", "A")) is PushOutcome.QUEUED


# -- concurrency caps ----------------------------------------------------------------------


def test_a_capped_task_type_does_not_hold_up_the_tenants_other_types() -> None:
    queue: FairQueue[Item] = FairQueue(limits=ConcurrencyLimits(task_type_caps={"slow": 1}))
    queue.push(Item("s1", "A", task_type="slow", planned_at=at(0)))
    queue.push(Item("s2", "A", task_type="slow", planned_at=at(1)))
    queue.push(Item("f1", "A", task_type="fast", planned_at=at(2)))
    first, second = queue.pop(at(5)), queue.pop(at(5))
    assert first is not None
    assert second is not None
    assert [first.execution_id, second.execution_id] == ["s1", "f1"]
    assert queue.pop(at(5)) is None
    queue.limits.finished("A", "slow")
    item = queue.pop(at(5))
    assert item is not None
    assert item.execution_id == "s2"


def test_a_group_cap_bounds_its_task_types_together_and_leaves_the_others_running() -> None:
    """The blocking kinds (python, shell) share one cap: at it, their executions wait in the
    queue -- not in a worker -- while a webhook type goes on; one ending lets either start."""
    limits = ConcurrencyLimits()
    limits.set_group_cap("blocking", 2)
    limits.set_task_type_group("py", "blocking")
    limits.set_task_type_group("sh", "blocking")
    queue: FairQueue[Item] = FairQueue(limits=limits)
    for n, task_type in enumerate(["py", "sh", "py", "sh", "hook", "hook"]):
        queue.push(Item(f"{task_type}{n}", "A", task_type=task_type, planned_at=at(n)))
    popped = [item.execution_id for item in queue.pop_many(at(9), 10)]
    assert popped == ["py0", "sh1", "hook4", "hook5"]
    assert limits.task_type_room("py") == limits.task_type_room("sh") == 0
    limits.finished("A", "py")
    assert [item.execution_id for item in queue.pop_many(at(9), 10)] == ["py2"]
    limits.finished("A", "sh")
    assert [item.execution_id for item in queue.pop_many(at(9), 10)] == ["sh3"]


def test_a_task_type_moving_out_of_its_group_takes_what_it_has_in_flight_along() -> None:
    """Its kind changed while two ran: the group's count drops by two at once, and the two
    are given back once, to the type alone -- no slot of the group leaks or is freed twice."""
    limits = ConcurrencyLimits()
    limits.set_group_cap("blocking", 2)
    limits.set_task_type_group("py", "blocking")
    limits.set_task_type_group("sh", "blocking")
    limits.started("A", "py")
    limits.started("A", "py")
    assert not limits.task_type_has_room("sh")
    limits.set_task_type_group("py", None)
    assert limits.task_type_room("sh") == 2
    limits.finished("A", "py")
    limits.finished("A", "py")
    assert limits.task_type_room("sh") == 2
    limits.set_task_type_group("py", "blocking")
    limits.started("A", "sh")
    limits.started("A", "py")
    assert not limits.task_type_has_room("py")


def test_a_tenant_at_its_quota_is_skipped_then_served_as_soon_as_it_has_room() -> None:
    queue: FairQueue[Item] = FairQueue(limits=ConcurrencyLimits(tenant_quotas={"A": 1}))
    for tenant in "ABC":
        fill(queue, tenant, 50)
    popped = []
    for _ in range(9):
        item = queue.pop(T0)
        assert item is not None
        popped.append(item.tenant_id)
        if item.tenant_id != "A":
            queue.limits.finished(item.tenant_id, item.task_type)
    assert "".join(popped) == "ABCBCBCBC"  # A holds its one slot; B and C share the rest
    queue.limits.finished("A", "noop")
    item = queue.pop(T0)
    assert item is not None
    assert item.tenant_id == "A"  # it kept its place: first in line once it has room


def test_a_quota_that_frees_at_once_costs_the_tenant_nothing() -> None:
    queue: FairQueue[Item] = FairQueue(limits=ConcurrencyLimits(tenant_quotas={"A": 1}))
    for tenant in "ABC":
        fill(queue, tenant, 100)
    assert Counter(tenants_of(pop_all(queue, limit=90))) == {"A": 30, "B": 30, "C": 30}


def test_a_tenant_rate_bounds_its_starts_while_the_others_go_on() -> None:
    queue: FairQueue[Item] = FairQueue()
    queue.set_tenant_rate("A", 10.0, 2)
    fill(queue, "A", 500)
    fill(queue, "B", 500)
    started: Counter[str] = Counter()
    for tick in range(101):  # 10 s in steps of 0.1 s
        started.update(tenants_of(pop_all(queue, at(tick / 10), limit=4)))
    assert started["A"] == 2 + 10 * 10  # the burst, then 10 a second
    assert started["B"] == 101 * 4 - started["A"]  # B took every start A could not


def test_a_tenant_out_of_tokens_is_reported_by_next_due_at_and_keeps_its_place() -> None:
    queue: FairQueue[Item] = FairQueue()
    queue.set_tenant_rate("A", 2.0, 1)
    fill(queue, "A", 10)
    assert tenants_of(pop_all(queue, T0)) == "A"
    assert queue.next_due_at() == at(0.5)  # its next token
    assert queue.pop(at(0.4)) is None
    fill(queue, "B", 1)
    assert tenants_of(pop_all(queue, at(0.5))) == "AB"  # A first: it kept its place
    queue.set_tenant_rate("A", None, None)  # no rate of its own any more
    assert len(pop_all(queue, at(0.5))) == 8


def test_room_a_woken_tenant_cannot_use_passes_to_the_next_one_waiting() -> None:
    limits = ConcurrencyLimits(task_type_caps={"X": 1})
    queue: FairQueue[Item] = FairQueue(limits=limits)
    for tenant in "PQR":
        fill(queue, tenant, 2, task_type="X")
    first = queue.pop(T0)
    assert first is not None
    assert first.tenant_id == "P"
    assert queue.pop(T0) is None  # everyone now waits on X
    limits.finished("P", "X")
    limits.set_tenant_quota("Q", 0)  # after X freed, before the next pop
    limits.set_tenant_quota("P", 0)
    item = queue.pop(T0)
    assert item is not None
    assert item.tenant_id == "R"


@dataclass(frozen=True)
class Push:
    tenant: str
    task_type: str
    due_in_s: int


@dataclass(frozen=True)
class Pop:
    advance_s: int


@dataclass(frozen=True)
class Finish:
    pick: int


@dataclass(frozen=True)
class SetCap:
    task_type: str
    cap: int | None


@dataclass(frozen=True)
class SetQuota:
    tenant: str
    quota: int | None


@dataclass(frozen=True)
class SetWeight:
    tenant: str
    weight: int


TENANTS, TYPES = "ABC", "xy"
operations = st.one_of(
    st.builds(Push, st.sampled_from(TENANTS), st.sampled_from(TYPES), st.integers(0, 3)),
    st.builds(Pop, st.integers(0, 2)),
    st.builds(Finish, st.integers(0, 50)),
    st.builds(SetCap, st.sampled_from(TYPES), st.one_of(st.none(), st.integers(0, 3))),
    st.builds(SetQuota, st.sampled_from(TENANTS), st.one_of(st.none(), st.integers(0, 2))),
    st.builds(SetWeight, st.sampled_from(TENANTS), st.integers(1, 4)),
)


class Model:
    """What the queue should do, by brute force, checked after every pop."""

    def __init__(self) -> None:
        self.limits = ConcurrencyLimits()
        self.queue: FairQueue[Item] = FairQueue(limits=self.limits)
        self.caps: dict[str, int | None] = {}
        self.quotas: dict[str, int | None] = {}
        self.queued: dict[str, Item] = {}
        self.running: list[Item] = []
        self.popped: set[str] = set()
        self.now_s = 0
        self.serial = 0

    def can_start(self, item: Item) -> bool:
        cap, quota = self.caps.get(item.task_type), self.quotas.get(item.tenant_id)
        by_type = sum(1 for r in self.running if r.task_type == item.task_type)
        by_tenant = sum(1 for r in self.running if r.tenant_id == item.tenant_id)
        return (cap is None or by_type < cap) and (quota is None or by_tenant < quota)

    def pop(self) -> Item | None:
        now = at(self.now_s)
        item = self.queue.pop(now)
        if item is None:
            stuck = [i for i in self.queued.values() if i.planned_at <= now and self.can_start(i)]
            assert stuck == [], "pop returned None while something could start"
            return None
        assert self.can_start(item), "a cap or quota would be exceeded"
        assert item.planned_at <= now, "released before due"
        assert item.execution_id not in self.popped
        self.popped.add(item.execution_id)
        del self.queued[item.execution_id]
        self.running.append(item)
        return item

    def apply(self, op: Push | Pop | Finish | SetCap | SetQuota | SetWeight) -> None:
        match op:
            case Push(tenant, task_type, due_in_s):
                item = Item(f"e{self.serial}", tenant, task_type, at(self.now_s + due_in_s))
                self.serial += 1
                assert self.queue.push(item) is PushOutcome.QUEUED
                self.queued[item.execution_id] = item
            case Pop(advance_s):
                self.now_s += advance_s
                self.pop()
            case Finish(pick) if self.running:
                done = self.running.pop(pick % len(self.running))
                self.limits.finished(done.tenant_id, done.task_type)
            case SetCap(task_type, cap):
                self.caps[task_type] = cap
                self.limits.set_task_type_cap(task_type, cap)
            case SetQuota(tenant, quota):
                self.quotas[tenant] = quota
                self.limits.set_tenant_quota(tenant, quota)
            case SetWeight(tenant, weight):
                self.queue.set_weight(tenant, weight)
        for task_type in TYPES:
            running = sum(1 for r in self.running if r.task_type == task_type)
            assert self.limits.in_flight(task_type=task_type) == running
        for tenant in TENANTS:
            running = sum(1 for r in self.running if r.tenant_id == tenant)
            assert self.limits.in_flight(tenant_id=tenant) == running


@settings(max_examples=150, deadline=None)
@given(st.lists(operations, max_size=120))
def test_caps_hold_and_nothing_startable_is_left_waiting(
    ops: list[Push | Pop | Finish | SetCap | SetQuota | SetWeight],
) -> None:
    model = Model()
    for op in ops:
        model.apply(op)
    # Lift every limit and let time pass: everything still queued comes out, once.
    for task_type in TYPES:
        model.apply(SetCap(task_type, None))
    for tenant in TENANTS:
        model.apply(SetQuota(tenant, None))
    model.now_s += 10
    while model.pop() is not None:
        pass
    assert model.queued == {}
    assert len(model.queue) == 0
    assert model.popped == {f"e{n}" for n in range(model.serial)}


def test_caps_are_never_exceeded_under_a_long_random_run() -> None:
    limits = ConcurrencyLimits(task_type_caps={"x": 3, "y": 5}, tenant_quotas={"A": 2, "B": 4})
    queue: FairQueue[Item] = FairQueue(limits=limits)
    running: list[Item] = []
    peak: Counter[str] = Counter()
    for step in range(3_000):
        tenant, task_type = "ABCD"[step % 4], "xy"[step % 3 % 2]
        queue.push(Item(f"e{step}", tenant, task_type))
        if (item := queue.pop(T0)) is not None:
            running.append(item)
        if step % 2 and running:
            done = running.pop((step * 7919) % len(running))
            limits.finished(done.tenant_id, done.task_type)
        by = Counter(r.task_type for r in running) + Counter(r.tenant_id for r in running)
        peak |= by
    limit = {"x": 3, "y": 5, "A": 2, "B": 4}
    assert {key: peak[key] for key in limit} == limit  # reached, never exceeded


# -- the limits on their own ---------------------------------------------------------------


def test_limits_count_in_flight_and_refuse_a_start_beyond_a_cap() -> None:
    limits = ConcurrencyLimits(task_type_caps={"x": 1}, tenant_quota_default=2)
    assert limits.can_start("A", "x")
    limits.started("A", "x")
    assert not limits.can_start("B", "x")
    assert limits.task_type_room("x") == 0
    assert limits.task_type_room("y") is None
    with pytest.raises(CapExceeded):
        limits.started("B", "x")
    limits.started("A", "y")
    assert not limits.can_start("A", "y")  # the default quota of 2
    assert limits.in_flight(tenant_id="A") == 2
    assert limits.in_flight(task_type="x") == 1
    limits.set_task_type_cap("x", 0)  # lowering below the count is allowed
    limits.finished("A", "x")
    assert not limits.can_start("B", "x")
    with pytest.raises(ValueError, match="in flight"):
        limits.finished("A", "x")
    assert limits.drain_freed() == (["A"], ["x"])
    assert limits.drain_freed() == ([], [])


def test_limits_are_validated() -> None:
    with pytest.raises(ValueError, match="cap of task type 'x'"):
        ConcurrencyLimits(task_type_caps={"x": -1})
    with pytest.raises(ValueError, match="quota of tenant 'A'"):
        ConcurrencyLimits(tenant_quotas={"A": True})
    with pytest.raises(TypeError):
        ConcurrencyLimits().in_flight()
