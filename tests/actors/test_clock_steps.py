"""A node's wall clock stepping while it plans: the corrected time must not move with it."""

from __future__ import annotations

from datetime import timedelta

import msgspec
import trio
import trio.testing

from engine.model import CatchUpPolicy, ExecutionStatus
from tests.actors.harness import START, all_executions, cluster, create, make_schedules, within


async def test_a_clock_stepped_forward_during_an_outage_skips_no_upcoming_fire(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Found by the simulator (seed 54): the corrected time was the wall clock plus the
    last measured offset, so a clock stepped 5 minutes ahead while the database was down
    (no probe could notice) put the planner 5 minutes in the future as soon as the database
    came back: it recorded the next few minutes of fires as missed and skipped them."""
    schedules = [
        msgspec.structs.replace(s, catch_up=CatchUpPolicy.NONE)
        for s in make_schedules(20, START, lambda n: ("* * * * *", "UTC"))
    ]
    async with cluster() as c:
        await create(c.ledger, schedules)
        sim = await c.start_node("n1")
        await trio.sleep(300 + 23)  # 00:05:53, just before the 00:06 fire is planned
        sim.ledger.down = True  # the database is unreachable for 5 s
        await trio.sleep(1)
        sim.clock.jump(300)
        await trio.sleep(4)
        sim.ledger.down = False
        await trio.sleep(20)
        sim.clock.jump(-300)  # NTP puts it right
        await trio.sleep(900)
    executions = within(await all_executions(c.ledger), START, START + timedelta(minutes=15))
    assert len(executions) == 20 * 15
    # Before the fix, the planner came back 5 minutes ahead and recorded the fires of the
    # next four minutes as missed (catch-up policy none: skipped, never run).
    assert {e.status for e in executions} == {ExecutionStatus.SUCCEEDED}
