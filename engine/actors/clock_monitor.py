"""Measures this node's clocks against the database's and gates planning on the result.

Every ``interval_s`` it reads the database time between two local readings. A probe whose
round trip exceeds the bound is discarded: it cannot measure to that precision.

The *corrected* time that planning, dispatch and retries use, :meth:`ClockMonitor.now`, is
the database time measured by the probes carried forward on the **monotonic** clock (the
median over the last ``samples`` probes of ``db - monotonic midpoint``). It never reads the
local wall clock, so a node whose wall clock runs fast does not plan early, and a wall-clock
step between two probes -- or during a database outage, when no probe succeeds -- cannot
move it. (Carried forward on the wall clock instead, a clock stepped five minutes ahead
while the database was down made the planner, back in business before the next probe,
record the next five minutes of fires as missed, and skip them.)

Planning pauses while that corrected time is *uncertain*: before the first probe succeeds,
and while the samples spread more than ``bound_s`` (the database clock stepped, or the
monotonic clock runs at a wrong rate) until the window holds only consistent samples.

The wall clock's offset from the database is measured and reported (``offset_s``, the
``carillon_clock_offset_seconds`` gauge, a warning in the log) but does not stop planning:
nothing that decides when a fire runs reads it. An earlier version paused planning while the
offset exceeded the bound, and the deterministic simulator showed the cost: the node kept
renewing its leases, so its partitions went unplanned for as long as its clock was wrong
(24 minutes of fires skipped by catch-up for a 63 s skew) while healthy nodes stood idle.
"""

from __future__ import annotations

import logging
import math
import random
import statistics
from collections import deque
from datetime import datetime, timedelta
from typing import Any, Final

import msgspec
import trio

from engine.clock import Clock
from engine.errors import LedgerUnavailable
from engine.ledger.base import Ledger

log = logging.getLogger("carillon.clock")

SAMPLES_DEFAULT: Final = 5


class ClockMonitorConfig(msgspec.Struct, frozen=True):
    bound_s: float
    interval_s: float
    samples: int = SAMPLES_DEFAULT


class ClockStatistics(msgspec.Struct, frozen=True):
    offset_s: float | None
    spread_s: float | None
    planning_allowed: bool
    reason: str


class ClockMonitor:
    def __init__(
        self, config: ClockMonitorConfig, *, ledger: Ledger, clock: Clock, rng: random.Random
    ) -> None:
        self.config = config
        self._ledger = ledger
        self._clock = clock
        self._rng = rng
        self._offsets: deque[float] = deque(maxlen=config.samples)
        self._offset_s = 0.0
        self._anchors: deque[datetime] = deque(maxlen=config.samples)
        """``db - monotonic midpoint`` of each sample, as an instant at monotonic zero."""
        self._anchor: datetime | None = None
        self._half_trips: deque[float] = deque(maxlen=config.samples)
        """Half the round trip of each sample: how far its midpoint may be off."""
        self.uncertainty_s = math.inf
        """How far :meth:`now` may be from the database's clock, at most: half the longest
        round trip of the samples, plus their spread (infinite before the first probe).
        What the node starts without asking the database -- a folded attempt -- waits
        until its instant is this far behind (docs/ledger.md, "Folded claims")."""
        self._allowed = False
        self._reason = "no measurement yet"
        self._wall_off = False
        self._changed = trio.Event()

    async def run(self, *, task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            try:
                await self.step()
            except LedgerUnavailable as exc:
                log.warning("clock probe failed: %s", exc)
            await trio.sleep(self.config.interval_s)

    async def step(self) -> None:
        """Probe once and update the verdict."""
        before_mono = self._clock.monotonic()
        before = self._clock.now()
        database = await self._ledger.database_now()
        elapsed = self._clock.monotonic() - before_mono
        if elapsed > self.config.bound_s:
            # The round trip alone is wider than the bound: this sample cannot tell.
            log.info("clock probe discarded: round trip took %.3f s", elapsed)
            return
        midpoint = before + timedelta(seconds=elapsed / 2)
        self._offsets.append((database - midpoint).total_seconds())
        self._offset_s = statistics.median(self._offsets)
        self._anchors.append(database - timedelta(seconds=before_mono + elapsed / 2))
        self._anchor = statistics.median_low(self._anchors)
        spread = (max(self._anchors) - min(self._anchors)).total_seconds()
        self._half_trips.append(elapsed / 2)
        self.uncertainty_s = max(self._half_trips) + spread
        bound = self.config.bound_s
        self._note_wall_offset(bound)
        if spread > bound:
            self._set(
                False,
                f"database time unstable against the monotonic clock: samples spread "
                f"{spread:.3f} s (bound {bound} s)",
            )
        else:
            self._set(True, "ok")

    def _note_wall_offset(self, bound: float) -> None:
        """Warn (once per episode) while the wall clock is further off than the bound: only
        people read it (log timestamps), but it means time sync is broken on this host."""
        off = abs(self._offset_s) > bound
        if off and not self._wall_off:
            log.warning(
                "wall clock is %+.3f s off the database (bound %s s); planning and dispatch "
                "use the database time, but fix time synchronisation on this host",
                -self._offset_s,
                bound,
            )
        elif self._wall_off and not off:
            log.info("wall clock back within %s s of the database", bound)
        self._wall_off = off

    def now(self) -> datetime:
        """The database time, as measured by the probes and carried forward on the monotonic
        clock; the local wall time until the first probe succeeds."""
        if self._anchor is None:
            return self._clock.now()
        return self._anchor + timedelta(seconds=self._clock.monotonic())

    @property
    def planning_allowed(self) -> bool:
        return self._allowed

    async def wait_planning_allowed(self) -> None:
        while not self._allowed:
            await self._changed.wait()

    def statistics(self) -> ClockStatistics:
        """``offset_s``: database minus wall clock (median); ``spread_s``: how far the
        corrected clock's samples disagree (what gates planning)."""
        if not self._anchors:
            return ClockStatistics(None, None, self._allowed, self._reason)
        spread = (max(self._anchors) - min(self._anchors)).total_seconds()
        return ClockStatistics(self._offset_s, spread, self._allowed, self._reason)

    def clock(self) -> Clock:
        """A :class:`Clock` whose ``now()`` is the corrected time (for handlers and retry
        times) and whose ``monotonic()`` is the node's."""
        return CorrectedClock(self, self._clock)

    def _set(self, allowed: bool, reason: str) -> None:
        if allowed != self._allowed:
            if allowed:
                log.info("planning allowed: database time measured")
            else:
                log.warning("planning paused: %s", reason)
        self._allowed = allowed
        self._reason = reason
        self._changed.set()
        self._changed = trio.Event()


class CorrectedClock:
    """The node's clocks with the wall time replaced by the database-corrected time."""

    def __init__(self, monitor: ClockMonitor, base: Clock) -> None:
        self._monitor = monitor
        self._base = base

    def monotonic(self) -> float:
        return self._base.monotonic()

    def now(self) -> datetime:
        return self._monitor.now()
