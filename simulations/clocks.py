"""The simulation's clocks: one true time, the database's clock, and each host's imperfect one.

Everything derives from trio's ``MockClock``: ``trio.current_time()`` is *true* elapsed time.

* The **database clock** is true time from the run's start instant. It never jumps: the
  ledger's ``now()`` is the reference every expiry is judged by, as Postgres ``now()`` is.
* A **host clock** (one per simulated machine, kept across process restarts) reads true time
  plus a settable skew, plus drift accumulated since its last NTP sync. Faults set the skew
  or jump it; :meth:`HostClock.ntp_sync` removes the accumulated drift (a healthy host's NTP
  keeps it to milliseconds). ``monotonic()`` is trio's clock itself: the engine sets trio
  deadlines from it, so it must be trio's time (monotonic drift is not simulated).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import trio


class DatabaseClock:
    """True time as an aware UTC instant: ``start`` plus trio's elapsed time."""

    def __init__(self, start: datetime) -> None:
        if start.tzinfo is None:
            raise ValueError("start must be timezone-aware")
        self.start = start.astimezone(UTC)
        self._origin = trio.current_time()

    def elapsed_s(self) -> float:
        return trio.current_time() - self._origin

    def monotonic(self) -> float:
        return trio.current_time()

    def now(self) -> datetime:
        return self.start + timedelta(seconds=self.elapsed_s())

    def at(self, elapsed_s: float) -> datetime:
        """The instant ``elapsed_s`` seconds after the start."""
        return self.start + timedelta(seconds=elapsed_s)


class HostClock:
    """A host's :class:`~engine.clock.Clock`: true time + skew + drift since the last sync."""

    def __init__(self, truth: DatabaseClock, *, skew_s: float = 0.0, drift_ppm: float = 0.0):
        self._truth = truth
        self.skew_s = skew_s
        self.drift_ppm = drift_ppm
        self._synced_at = truth.elapsed_s()

    def monotonic(self) -> float:
        return trio.current_time()

    def error_s(self) -> float:
        """How far this clock reads from true time now (positive: ahead)."""
        drifted = (self._truth.elapsed_s() - self._synced_at) * self.drift_ppm / 1e6
        return self.skew_s + drifted

    def now(self) -> datetime:
        return self._truth.now() + timedelta(seconds=self.error_s())

    def set_skew(self, skew_s: float) -> None:
        self.skew_s = skew_s

    def jump(self, delta_s: float) -> None:
        self.skew_s += delta_s

    def ntp_sync(self) -> None:
        """Discard the drift accumulated so far (the skew, a fault, stays)."""
        self._synced_at = self._truth.elapsed_s()
