"""The planner's bucketed heap."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from engine.core.plan_heap import PlanHeap

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def at(minutes: int) -> datetime:
    return T0 + timedelta(minutes=minutes)


def test_schedules_due_together_come_out_as_one_bucket_in_push_order() -> None:
    heap = PlanHeap()
    for n in range(5):
        heap.push(f"s{n}", at(1))
    heap.push("later", at(2))
    assert heap.next_instant() == at(1)
    assert heap.pop_until(at(1), limit=100) == [(at(1), ["s0", "s1", "s2", "s3", "s4"])]
    assert len(heap) == 1
    assert heap.next_instant() == at(2)


def test_pushing_again_moves_a_schedule_and_remove_forgets_it() -> None:
    heap = PlanHeap()
    heap.push("a", at(1))
    heap.push("a", at(3))
    heap.push("b", at(2))
    assert heap.due_at("a") == at(3)
    assert heap.next_instant() == at(2)
    assert heap.remove("b")
    assert not heap.remove("b")
    assert heap.next_instant() == at(3)
    assert "b" not in heap
    assert heap.pop_until(at(10), limit=10) == [(at(3), ["a"])]
    assert heap.next_instant() is None


def test_pop_respects_the_limit_and_leaves_the_rest_of_a_bucket_on_top() -> None:
    heap = PlanHeap()
    for n in range(5):
        heap.push(f"s{n}", at(1))
    heap.push("t", at(2))
    assert heap.pop_until(at(5), limit=3) == [(at(1), ["s0", "s1", "s2"])]
    assert heap.pop_until(at(5), limit=3) == [(at(1), ["s3", "s4"]), (at(2), ["t"])]


def test_a_two_hundred_thousand_burst_pops_in_one_bucket() -> None:
    heap = PlanHeap()
    for n in range(200_000):
        heap.push(f"s{n}", at(60))
    [(instant, ids)] = heap.pop_until(at(60), limit=1_000_000)
    assert instant == at(60)
    assert len(ids) == 200_000


@given(st.lists(st.tuples(st.integers(0, 30), st.integers(0, 50)), max_size=200))
def test_pop_order_matches_a_sorted_model(pushes: list[tuple[int, int]]) -> None:
    heap = PlanHeap()
    model: dict[str, int] = {}
    for schedule, minute in pushes:
        heap.push(f"s{schedule}", at(minute))
        model[f"s{schedule}"] = minute
    popped = [
        (instant, sid) for instant, ids in heap.pop_until(at(100), limit=10_000) for sid in ids
    ]
    assert [instant for instant, _ in popped] == sorted(at(m) for m in model.values())
    assert {sid: instant for instant, sid in popped} == {s: at(m) for s, m in model.items()}
    assert len(heap) == 0


def test_schedules_due_at_one_instant_share_the_heaps_datetime_object() -> None:
    heap = PlanHeap()
    first = heap.push("a", at(1))
    second = heap.push("b", at(0) + timedelta(minutes=1))  # equal, but another object
    assert first == second == at(1)
    assert first is second
    assert heap.due_at("b") is first


def test_an_instant_gets_a_fresh_shared_object_once_its_bucket_is_gone() -> None:
    heap = PlanHeap()
    heap.push("a", at(1))
    heap.pop_until(at(1), limit=10)
    again = at(1)
    assert heap.push("b", again) is again
