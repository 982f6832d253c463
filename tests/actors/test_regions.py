"""Regions on the mock clock: only the active region plans; a failover hands everything over
to the other region, fires continue exactly once, and the demoted nodes are fenced."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta

import trio
import trio.testing

from engine.ledger.params import RegionFailover
from tests.actors.harness import (
    PARTITIONS,
    START,
    all_executions,
    cluster,
    create,
    expected_fires,
    make_schedules,
    within,
)


async def test_only_the_active_region_owns_partitions_and_the_standby_takes_none(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with cluster() as c:
        west = [await c.start_node(n, region="default") for n in ("a1", "a2")]
        east = await c.start_node("b1", region="east")
        await trio.sleep(120)
        owners = c.owners()
        stats = east.node.membership.statistics()
    assert sorted(len(owners[n]) for n in ("a1", "a2")) == [PARTITIONS // 2] * 2
    assert owners["b1"] == []
    assert stats.standby
    assert (stats.active_region, stats.region_epoch) == ("default", 1)
    assert all(not w.node.membership.statistics().standby for w in west)


async def test_a_failover_moves_every_partition_to_the_new_region_and_no_fire_twice(
    autojump_clock: trio.testing.MockClock,
) -> None:
    schedules = make_schedules(200, START, lambda n: ("* * * * *", "UTC"))
    async with cluster() as c:
        await create(c.ledger, schedules)
        for name in ("a1", "a2"):
            await c.start_node(name)
        for name in ("b1", "b2"):
            await c.start_node(name, region="east")
        await trio.sleep(600)
        change = await c.ledger.region_failover(RegionFailover("east", actor="test"))
        switched_at = c.db_clock.now()
        await trio.sleep(30)  # a renewal cycle (TTL 15 s / 3) and a rebalance
        owners = c.owners()
        await trio.sleep(600)
        standby = c.nodes["a1"].node.membership.statistics()
    assert change.revoked == PARTITIONS
    assert owners["a1"] == owners["a2"] == []
    assert sorted(len(owners[n]) for n in ("b1", "b2")) == [PARTITIONS // 2] * 2
    assert standby.standby
    assert standby.region_epoch == 2
    executions = await all_executions(c.ledger)
    end = START + timedelta(minutes=19)
    window = within(executions, START, end)
    counts = Counter((e.schedule_id, e.planned_at) for e in window)
    assert set(counts) == expected_fires(schedules, START, end)
    assert max(counts.values()) == 1
    # Everything planned after the switch was planned by the new region, under epoch 2.
    after = [e for e in window if e.planned_at > switched_at + timedelta(seconds=30)]
    assert after
    assert all(e.fencing_token >= 1 << 32 for e in after)
