"""The supervisor: restart with backoff, escalate a crash loop, never restart on cancel."""

from __future__ import annotations

import random
from typing import Any

import pytest
import trio
import trio.testing

from engine.actors.supervisor import ChildSpec, Supervisor, SupervisorConfig
from engine.clock import SystemClock
from engine.core.backoff import Backoff
from engine.errors import ActorCrashLoop


class Flaky:
    """Crashes ``crashes`` times after becoming ready, then runs forever."""

    starts = 0

    def __init__(self, crashes: int) -> None:
        self.crashes = crashes

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        Flaky.starts += 1
        task_status.started()
        await trio.sleep(1)
        if Flaky.starts <= self.crashes:
            raise RuntimeError(f"crash {Flaky.starts}")
        await trio.sleep_forever()


def supervisor(factory: Any, max_restarts: int = 3) -> Supervisor:
    return Supervisor(
        [ChildSpec("flaky", factory)],
        clock=SystemClock(),
        rng=random.Random(0),
        config=SupervisorConfig(
            max_restarts=max_restarts, window_s=60, backoff=Backoff(base_s=1, max_s=4)
        ),
    )


async def test_a_crashed_actor_is_restarted_with_backoff(
    autojump_clock: trio.testing.MockClock,
) -> None:
    Flaky.starts = 0
    sup = supervisor(lambda: Flaky(crashes=2))
    async with trio.open_nursery() as nursery:
        await nursery.start(sup.run)
        await trio.sleep(30)
        assert Flaky.starts == 3
        assert sup.statistics().restarts == {"flaky": 2}
        nursery.cancel_scope.cancel()


async def test_an_actor_that_keeps_crashing_stops_everything(
    autojump_clock: trio.testing.MockClock,
) -> None:
    Flaky.starts = 0
    sup = supervisor(lambda: Flaky(crashes=100), max_restarts=3)
    with pytest.raises(ExceptionGroup) as raised:
        async with trio.open_nursery() as nursery:
            await nursery.start(sup.run)
    assert raised.group_contains(ActorCrashLoop, match="flaky crashed 4 times", depth=None)
    assert Flaky.starts == 4


async def test_an_actor_that_cannot_start_fails_the_start() -> None:
    class Broken:
        async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
            raise RuntimeError("no config")

    with pytest.raises(ExceptionGroup) as raised:
        async with trio.open_nursery() as nursery:
            await nursery.start(supervisor(Broken).run)
    assert raised.group_contains(RuntimeError, match="no config", depth=None)
