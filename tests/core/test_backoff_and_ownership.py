"""Backoff delays and the fair-share ownership decision."""

from __future__ import annotations

import random
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest

from engine.core.backoff import Backoff
from engine.core.ownership import fair_share, plan_ownership, preferred_owner
from engine.model import Lease

NOW = datetime(2026, 1, 1, tzinfo=UTC)


class Fixed:
    def __init__(self, value: float) -> None:
        self.value = value

    def random(self) -> float:
        return self.value


def test_backoff_grows_exponentially_to_a_cap_with_bounded_jitter() -> None:
    backoff = Backoff(base_s=1, max_s=60, jitter=0.2)
    assert [backoff.delay_s(n, Fixed(0.0)) for n in range(8)] == [1, 2, 4, 8, 16, 32, 60, 60]
    assert backoff.delay_s(2, Fixed(0.999)) == pytest.approx(4 * 1.1998)
    rng = random.Random(7)
    delays = [backoff.delay_s(3, rng) for _ in range(1000)]
    assert 8 <= min(delays) < max(delays) <= 9.6
    assert backoff.delay_s(10_000, Fixed(0.0)) == 60


def test_backoff_refuses_nonsense() -> None:
    with pytest.raises(ValueError, match="base_s"):
        Backoff(base_s=0)
    with pytest.raises(ValueError, match="jitter"):
        Backoff(jitter=2)


def leases(
    owners: dict[int, str | None], partitions: int = 8, expired: set[int] = frozenset()
) -> list[Lease]:  # type: ignore[assignment]
    return [
        Lease(
            partition_id=p,
            owner_id=owners.get(p),
            fencing_token=1,
            expires_at=(NOW - timedelta(seconds=1))
            if p in expired
            else NOW + timedelta(seconds=30),
        )
        for p in range(partitions)
    ]


def test_fair_shares_add_up_to_the_partition_count() -> None:
    for partitions, count in [(64, 1), (64, 3), (16, 3), (8, 5), (4, 9)]:
        nodes = [f"n{i}" for i in range(count)]
        shares = [fair_share(partitions, nodes, me) for me in nodes]
        assert sum(shares) == partitions
        assert max(shares) - min(shares) <= 1
    assert fair_share(64, [], "alone") == 64


def test_a_lone_node_takes_everything_free() -> None:
    plan = plan_ownership("a", leases({}), ["a"], NOW)
    assert (plan.target, sorted(plan.acquire), plan.release) == (8, list(range(8)), [])


def test_a_joining_node_makes_holders_release_to_it_and_it_takes_them() -> None:
    everything = dict.fromkeys(range(8), "a")
    plan_a = plan_ownership("a", leases(everything), ["a", "b"], NOW)
    assert plan_a.target == 4
    assert len(plan_a.release) == 4
    # The released ones are those rendezvous hashing prefers for b, where possible.
    preferred_b = {p for p in range(8) if preferred_owner(p, ["a", "b"]) == "b"}
    assert set(plan_a.release) & preferred_b == set(plan_a.release) or preferred_b <= set(
        plan_a.release
    )
    after = {p: ("a" if p not in plan_a.release else None) for p in range(8)}
    plan_b = plan_ownership("b", leases(after), ["a", "b"], NOW)
    assert sorted(plan_b.acquire) == sorted(plan_a.release)


def test_expired_leases_count_as_free_and_own_expired_ones_do_not_count_as_held() -> None:
    owners = dict.fromkeys(range(8), "gone")
    plan = plan_ownership("a", leases(owners, expired={1, 2}), ["a", "b", "c"], NOW)
    assert plan.target == 3  # 8 over 3 nodes: a and b get 3, c gets 2
    assert sorted(plan.acquire) == [1, 2]


def test_rendezvous_spreads_partitions_evenly_and_stably() -> None:
    nodes = ["n1", "n2", "n3", "n4"]
    owners = Counter(preferred_owner(p, nodes) for p in range(256))
    assert set(owners) == set(nodes)
    assert max(owners.values()) < 2 * min(owners.values())
    # Removing a node moves only that node's partitions.
    before = {p: preferred_owner(p, nodes) for p in range(256)}
    after = {p: preferred_owner(p, nodes[:-1]) for p in range(256)}
    moved = {p for p in range(256) if before[p] != after[p]}
    assert moved == {p for p in range(256) if before[p] == "n4"}
