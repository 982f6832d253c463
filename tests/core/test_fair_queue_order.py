"""The fair queue's order within a tenant and its batch pop, against plain references.

A tenant's lane releases items by ``(due_at, execution_id)`` however they were pushed (in
order, as a burst arrives from the ledger, or not), and ``pop_many`` returns what as many
``pop`` calls would, in the same order, leaving the queue in the same state.
"""

from __future__ import annotations

import random
from datetime import datetime, timedelta

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.core.dispatch import ConcurrencyLimits
from engine.core.fair_queue import FairQueue
from tests.core.queued_items import T0, Item


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 3), st.integers(0, 60), st.booleans()),
        min_size=1,
        max_size=80,
    )
)
def test_one_lane_releases_by_due_instant_then_execution_id(
    steps: list[tuple[int, int, bool]],
) -> None:
    """Pushes at a few instants, ids in any order, with pops in between."""
    queue: FairQueue[Item] = FairQueue()
    held: set[tuple[datetime, str]] = set()
    now = T0 + timedelta(seconds=10)
    for offset_s, number, pop_first in steps:
        if pop_first and held:
            item = queue.pop(now)
            assert item is not None
            queue.limits.finished(item.tenant_id, item.task_type)
            first = min(held)
            assert (item.planned_at, item.execution_id) == first
            held.remove(first)
        item = Item(f"e{number:03d}", "acme", planned_at=T0 + timedelta(seconds=offset_s))
        if item.execution_id not in queue:
            queue.push(item)
            held.add((item.planned_at, item.execution_id))
    popped = queue.pop_many(now, len(held) + 1)
    assert [(item.planned_at, item.execution_id) for item in popped] == sorted(held)


def _drive(seed: int, *, batched: bool) -> list[list[str]]:
    """A random run of pushes, finishes, limit changes and pops; what each pop step gave."""
    rng = random.Random(seed)
    limits = ConcurrencyLimits()
    queue: FairQueue[Item] = FairQueue(max_items=200, limits=limits, weights={"b": 3})
    running: list[Item] = []
    now = T0
    steps: list[list[str]] = []
    for n in range(300):
        action = rng.random()
        if action < 0.5:
            planned = T0 + timedelta(seconds=rng.choice([0, 0, 1, 2, 4]))
            retry = None if rng.random() < 0.8 else planned + timedelta(seconds=rng.choice([1, 3]))
            queue.push(
                Item(
                    f"e{rng.randrange(400):03d}",
                    rng.choice("abc"),
                    rng.choice(["x", "y"]),
                    planned,
                    retry,
                )
            )
        elif action < 0.65 and running:
            item = running.pop(rng.randrange(len(running)))
            limits.finished(item.tenant_id, item.task_type)
        elif action < 0.7:
            limits.set_task_type_cap(rng.choice(["x", "y"]), rng.choice([None, 1, 3]))
        elif action < 0.75:
            queue.set_tenant_rate(rng.choice("abc"), rng.choice([None, 2.0, 50.0]), None)
        else:
            if rng.random() < 0.3:
                now += timedelta(seconds=rng.choice([0.5, 1, 2]))
            limit = rng.choice([1, 3, 10])
            if batched:
                popped = queue.pop_many(now, limit)
            else:
                popped = []
                while len(popped) < limit and (next_item := queue.pop(now)) is not None:
                    popped.append(next_item)
            running += popped
            steps.append([item.execution_id for item in popped])
        if n % 50 == 0:
            steps.append([repr(msgspec.structs.asdict(queue.statistics())), str(len(queue))])
    return steps


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32))
def test_pop_many_returns_what_as_many_pops_would(seed: int) -> None:
    assert _drive(seed, batched=True) == _drive(seed, batched=False)
