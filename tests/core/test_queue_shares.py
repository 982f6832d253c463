"""Queue shares: a bounded queue holds backlogged tenants by weight, the rest left to refills."""

from __future__ import annotations

from collections import Counter

from engine.core.fair_queue import FairQueue, PushOutcome
from engine.core.queue_shares import SHARE_MIN, Position, QueueShares, Refill
from tests.core.queued_items import T0, Item


def page(tenants: list[str], first: int, count: int) -> tuple[list[Item], list[Position]]:
    """``count`` items of the ledger's order from index ``first``, the tenants interleaved."""
    items = [Item(f"e{n:06d}", tenants[n % len(tenants)]) for n in range(first, first + count)]
    return items, [(T0, item.execution_id) for item in items]


def queue_of(max_items: int, **weights: int) -> FairQueue[Item]:
    return FairQueue(max_items=max_items, weights=weights)


def test_a_full_pass_queues_each_tenant_up_to_its_weighted_share_and_spills_the_rest() -> None:
    queue = queue_of(700, a=4, b=2, c=1)
    shares = QueueShares(queue)
    items, positions = page(["a", "b", "c"], 0, 900)

    sorted_ = shares.sort(items, positions, None, room=queue.room, is_new=lambda _: True)
    for item in sorted_.queue:
        assert queue.push(item) is PushOutcome.QUEUED

    assert queue.counts() == {"a": 300, "b": 200, "c": 100}  # c's and b's shares, a's backlog
    assert "b" in shares
    assert "c" in shares
    assert "a" not in shares
    assert sorted_.open  # a has not spilled: the next page may hold more of it
    assert shares.refills(16, 1000) == []  # b and c hold their shares: nothing to read yet


def test_a_page_of_spilled_tenants_only_closes_the_pass() -> None:
    queue = queue_of(30, a=1, b=1, c=1)
    shares = QueueShares(queue)
    first, first_positions = page(["a", "b", "c"], 0, 60)
    for item in shares.sort(first, first_positions, None, room=30, is_new=lambda _: True).queue:
        queue.push(item)
    second, second_positions = page(["a", "b", "c"], 60, 30)

    sorted_ = shares.sort(
        second, second_positions, first_positions[-1], room=0, is_new=lambda _: True
    )

    assert sorted_.queue == []
    assert not sorted_.open
    assert queue.counts() == {"a": 10, "b": 10, "c": 10}


def test_the_emptiest_spilled_tenant_is_refilled_first_from_where_it_spilled() -> None:
    queue = queue_of(70, a=4, b=2, c=1)
    shares = QueueShares(queue)
    items, positions = page(["a", "b", "c"], 0, 300)
    for item in shares.sort(items, positions, None, room=70, is_new=lambda _: True).queue:
        queue.push(item)
    assert queue.counts() == {"a": 40, "b": 20, "c": 10}
    for _ in range(35):  # the fair queue serves 4 : 2 : 1: each tenant to half its share
        item = queue.pop(T0)
        assert item is not None
        queue.limits.finished(item.tenant_id, item.task_type)
    counts = queue.counts()
    share = {"a": 40, "b": 20, "c": 10}

    refills = shares.refills(16, 1000)

    assert [r.tenant_id for r in refills] == sorted(share, key=lambda t: (counts[t] / share[t], t))
    # a spilled at its 41st item (index 120), b at its 21st (61), c at its 11th (32): their
    # reads resume just before.
    assert {r.tenant_id: r for r in refills} == {
        "a": Refill("a", (T0, "e000119"), 40 - counts["a"]),
        "b": Refill("b", (T0, "e000060"), 20 - counts["b"]),
        "c": Refill("c", (T0, "e000031"), 10 - counts["c"]),
    }
    assert shares.refills(1, 1000) == refills[:1]


def test_a_short_refill_ends_the_spill_and_a_full_one_moves_its_resume_position() -> None:
    queue = queue_of(30, a=1, b=1, c=1)
    shares = QueueShares(queue)
    items, positions = page(["a", "b", "c"], 0, 60)
    shares.sort(items, positions, None, room=30, is_new=lambda _: True)
    assert len(shares) == 3

    shares.refilled("a", (T0, "e000999"), complete=False)
    shares.refilled("b", None, complete=True)

    assert "a" in shares
    assert "b" not in shares
    assert [r.after for r in shares.refills(16, 1000) if r.tenant_id == "a"] == [(T0, "e000999")]


def test_the_pass_queues_a_spilled_tenants_work_before_its_resume_position() -> None:
    queue = queue_of(30, a=1, b=1, c=1)
    shares = QueueShares(queue)
    items, positions = page(["a", "b", "c"], 0, 60)
    for item in shares.sort(items, positions, None, room=30, is_new=lambda _: True).queue:
        queue.push(item)
    for _ in range(9):
        item = queue.pop(T0)
        assert item is not None
        queue.limits.finished(item.tenant_id, item.task_type)
    # A new pass from the start meets what is queued (not new) and a re-queued item of a's
    # that sorts before where a's refills resume: it is queued, a's share permitting.
    late = Item("e000000-requeued", "a")
    again = [late, *items]
    again_positions = [(T0, late.execution_id), *positions]
    queued_ids = {item.execution_id for item in items[:30]}

    sorted_ = shares.sort(
        again,
        again_positions,
        None,
        room=queue.room,
        is_new=lambda item: item.execution_id not in queued_ids,
    )

    assert late in sorted_.queue


def test_every_tenant_gets_at_least_the_minimum_share_however_many_there_are() -> None:
    queue = queue_of(100)
    shares = QueueShares(queue)
    tenants = [f"t{n:03d}" for n in range(50)]
    items, positions = page(tenants, 0, 50 * SHARE_MIN * 2)

    sorted_ = shares.sort(items, positions, None, room=queue.room, is_new=lambda _: True)

    assert len(sorted_.queue) == 100  # the room bounds what is admitted
    assert max(Counter(item.tenant_id for item in sorted_.queue).values()) <= SHARE_MIN
    assert set(shares.shares()) == set(tenants)
