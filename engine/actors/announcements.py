"""When to fetch: the instants at which new work becomes startable, announced ahead.

Planners announce every instant they planned, workers the instant of every retry, the
change feed an API trigger or backfill; the dispatcher's fetch loop reads them. The board is
owned by the node, not by the dispatcher, so what was announced survives a restart of the
execution pipeline (a fresh dispatcher reads the same board), and no announcer holds a
reference to the dispatcher.

Each announcement asks for a fetch ``fetch_ahead_s`` before its instant, so the work is
queued, with its schedule read, when its instant comes. Every distinct instant gets its
fetch (rounded up to the tenth of a second, so jittered retries share one): a fetch reads
only what is startable within ``fetch_ahead_s``, so keeping just the earliest announcement
left the later instants of a planner's batch to the fallback interval. At most
:data:`ANNOUNCED_MAX` are kept; beyond that the latest are dropped and counted, and the
fallback interval fetches them.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Final

import trio

ANNOUNCE_GRAIN_US: Final = 100_000
ANNOUNCED_MAX: Final = 4_096
"""Distinct announced instants kept. Cron instants fall on whole seconds and planners write a
few seconds ahead, so a handful are pending at a time."""


class Announcements:
    """Pending fetch times, sorted and distinct, with a wake-up for the fetch loop."""

    def __init__(self, now: Callable[[], datetime], fetch_ahead_s: float) -> None:
        self._now = now
        self._fetch_ahead = timedelta(seconds=fetch_ahead_s)
        self._pending: list[datetime] = []
        self._wake = trio.Event()
        self.dropped = 0
        """Announced instants beyond :data:`ANNOUNCED_MAX`, left to the fallback fetch."""
        self.generation = 0
        """Counts announcements: a reader can tell whether anything new came since it looked."""

    def announce(self, at: datetime) -> None:
        """Something becomes startable at ``at``: fetch ``fetch_ahead_s`` before it."""
        self.generation += 1
        fetch_at = at - self._fetch_ahead
        # Up to the next tenth of a second: a fetch then still reads ``at`` (it reads what is
        # startable within fetch_ahead_s), and jittered retry instants share fetches.
        fetch_at += timedelta(microseconds=-fetch_at.microsecond % ANNOUNCE_GRAIN_US)
        pending = self._pending
        if pending and pending[0] <= fetch_at and fetch_at <= self._now():
            return  # a fetch is due already, and reads this too
        index = bisect.bisect_left(pending, fetch_at)
        if index < len(pending) and pending[index] == fetch_at:
            return
        pending.insert(index, fetch_at)
        if len(pending) > ANNOUNCED_MAX:
            pending.pop()  # the latest: the fallback interval fetches it at the latest
            self.dropped += 1
        if index == 0:
            self.wake()  # sooner than the fetch loop means to wake

    def take_due(self, now: datetime) -> None:
        """Forget the fetch times up to ``now``: the fetch about to run answers them."""
        del self._pending[: bisect.bisect_right(self._pending, now)]

    def next_at(self) -> datetime | None:
        """The earliest pending fetch time."""
        return self._pending[0] if self._pending else None

    def __len__(self) -> int:
        return len(self._pending)

    def wake(self) -> None:
        """Wake the fetch loop now."""
        self._wake.set()

    async def wait(self, timeout_s: float) -> None:
        """Sleep until :meth:`wake` or ``timeout_s``, whichever comes first. Call it with no
        checkpoint since the fetch loop last looked, or a wake-up could be missed."""
        self._wake = trio.Event()
        with trio.move_on_after(timeout_s):
            await self._wake.wait()
