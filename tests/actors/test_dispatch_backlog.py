"""Weighted shares through a backlog far bigger than the dispatcher's queue.

The fair queue can only weigh what it holds; these tests make the ledger hold much more
startable work than the queue's bound, so that the fetch decides what the queue holds. The
handler is a probe (``tests/actors/probe_handlers.py``) that records every start.
"""

from __future__ import annotations

from collections import Counter

import msgspec
import trio
import trio.testing

from engine.ledger.params import TenantsPut
from engine.model import Schedule, Tenant
from tests.actors import probe_handlers
from tests.actors.harness import START, cluster
from tests.actors.test_dispatch import INSTANT, due_at_once, store

WEIGHTS = {"heavy": 4, "middle": 2, "light": 1}
BACKLOG_PER_TENANT = 2_500
QUEUE_MAX = 1_500
"""A fifth of the backlog: the rest stays in the ledger until the queue makes room."""


def interleaved(per_tenant: int) -> list[Schedule]:
    """``per_tenant`` executions for each tenant of ``WEIGHTS``, due at :data:`INSTANT`,
    their ids interleaving the tenants (``s00000`` heavy, ``s00001`` middle, ...): every
    page the ledger returns in its order holds the tenants alike, as in the burst benchmark."""
    [template] = due_at_once("s", 1, tenant="heavy")
    tenants = list(WEIGHTS)
    return [
        msgspec.structs.replace(
            template, schedule_id=f"s{n:05d}", tenant_id=tenants[n % len(tenants)]
        )
        for n in range(per_tenant * len(tenants))
    ]


def contended_shares(starts: list[tuple[float, str, str]]) -> dict[str, float]:
    """Each tenant's share of the starts until the first tenant's last one: the period in
    which every tenant had work waiting (the burst benchmark's contended period)."""
    last = {tenant: index for index, (_, tenant, _) in enumerate(starts)}
    contended = starts[: min(last.values()) + 1]
    counts = Counter(tenant for _, tenant, _ in contended)
    return {tenant: counts[tenant] / len(contended) for tenant in WEIGHTS}


async def test_backlogged_tenants_start_by_weight_beyond_the_queue_bound(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # 32 workers of 0.25 s each start 128 a second, below the node's pacing of 400 a second
    # smoothed over 2 s: the workers set the pace, and the queue the order.
    probe_handlers.reset(run_s=0.25)
    async with cluster(workers=32, dispatch_rate_per_s=400, dispatch_smoothing_window_s=2.0) as c:
        await store(c.ledger, schedules=interleaved(BACKLOG_PER_TENANT))
        for tenant, weight in WEIGHTS.items():
            await c.ledger.tenants_put(TenantsPut(Tenant(tenant_id=tenant, weight=weight)))
        sim = await c.start_node("n1", dispatch_queue_max=QUEUE_MAX)
        await trio.sleep((INSTANT - START).total_seconds() + 120)
        assert sim.node.dispatcher.statistics().queued <= QUEUE_MAX
        await trio.sleep(120)
    starts = probe_handlers.STARTS
    assert Counter(tenant for _, tenant, _ in starts) == dict.fromkeys(WEIGHTS, BACKLOG_PER_TENANT)
    shares = contended_shares(starts)
    total = sum(WEIGHTS.values())
    for tenant, weight in WEIGHTS.items():
        assert abs(shares[tenant] - weight / total) < 0.03, shares
