"""Measures this node's wall clock against the database's and gates planning on it.

Every ``interval_s`` it reads the database time between two local readings and takes
``offset = db - local midpoint`` (a probe whose round trip exceeds the bound is discarded:
it cannot measure to that precision). If the median offset of the last ``samples`` probes
exceeds ``bound_s`` or the offsets spread more than ``bound_s`` (the clock is jumping),
planning pauses until the measurements recover; before the first successful probe it is
paused too.

The *corrected* time that planning and dispatch use, :meth:`ClockMonitor.now`, is the
database time measured by the probes carried forward on the **monotonic** clock (the median
over the same samples of ``db - monotonic midpoint``), so it never reads the local wall
clock: a node whose clock runs fast does not plan early, and a wall-clock step between two
probes -- or during a database outage, when no probe succeeds -- cannot move it. (Carried
forward on the wall clock instead, a clock stepped five minutes ahead while the database was
down made the planner, back in business before the next probe, record the next five
minutes of fires as missed, and skip them.)
"""

from __future__ import annotations

import logging
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
        self, config: ClockMonitorConfig, ledger: Ledger, clock: Clock, rng: random.Random
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
        self._allowed = False
        self._reason = "no measurement yet"
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
        spread = max(self._offsets) - min(self._offsets)
        bound = self.config.bound_s
        if abs(self._offset_s) > bound:
            self._set(False, f"clock is {self._offset_s:+.3f} s off the database (bound {bound} s)")
        elif spread > bound:
            self._set(False, f"clock offset unstable: spread {spread:.3f} s (bound {bound} s)")
        else:
            self._set(True, "ok")

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
        spread = max(self._offsets) - min(self._offsets) if self._offsets else None
        offset = self._offset_s if self._offsets else None
        return ClockStatistics(offset, spread, self._allowed, self._reason)

    def _set(self, allowed: bool, reason: str) -> None:
        if allowed != self._allowed:
            if allowed:
                log.info("planning allowed: clock offset %+.3f s", self._offset_s)
            else:
                log.warning("planning paused: %s", reason)
        self._allowed = allowed
        self._reason = reason
        self._changed.set()
        self._changed = trio.Event()
