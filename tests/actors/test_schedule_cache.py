"""The schedule cache: read in bulk, kept for a while, and read afresh when asked."""

from __future__ import annotations

import trio
import trio.testing

from engine.actors.schedule_cache import ScheduleCache
from engine.ledger.memory import MemoryLedger
from engine.ledger.params import SchedulesCreate
from engine.model import Schedule
from engine.testing import SkewedClock
from tests.actors.harness import START
from tests.ledger.backends import put_noop_task_type


async def test_refresh_reads_past_a_cached_deletion_and_caches_the_answer(
    autojump_clock: trio.testing.MockClock,
) -> None:
    clock = SkewedClock(START)
    ledger = MemoryLedger(clock=clock, partition_count=1)
    await put_noop_task_type(ledger)
    cache = ScheduleCache(ledger, clock, ttl_s=10)
    assert await cache.get("report") is None  # absent: cached as deleted
    schedule = Schedule(schedule_id="report", tenant_id="acme", cron_expr="* * * * *",
                        task_type="noop", payload={"n": 2})  # fmt: skip
    [stored] = await ledger.schedules_create(SchedulesCreate([schedule]))
    assert cache.cached("report") is None  # for ttl_s, as documented
    assert await cache.refresh("report") == stored
    assert cache.cached("report") == stored
