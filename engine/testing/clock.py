"""A wall clock driven by trio's (mock) clock, with settable skew, drift and jumps.

Used by tests and the deterministic simulations to give each simulated node its own,
imperfect idea of the time while trio's ``MockClock`` drives the monotonic clock they share.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import trio


class SkewedClock:
    """A :class:`~engine.clock.Clock` whose wall time is ``start`` + elapsed + skew.

    ``elapsed`` is measured on ``monotonic_source`` (trio's clock by default) since
    construction and scaled by ``1 + drift_ppm / 1e6``; ``skew_s`` is a constant offset that
    :meth:`set_skew` changes and :meth:`jump` adds to (a negative jump moves wall time back,
    as an NTP step would). ``monotonic()`` is never affected.
    """

    def __init__(
        self,
        start: datetime,
        *,
        skew_s: float = 0.0,
        drift_ppm: float = 0.0,
        monotonic_source: Callable[[], float] = trio.current_time,
    ) -> None:
        if start.tzinfo is None:
            raise ValueError("start must be timezone-aware")
        self._start = start.astimezone(UTC)
        self._source = monotonic_source
        self._origin = monotonic_source()
        self.skew_s = skew_s
        self.drift_ppm = drift_ppm

    def monotonic(self) -> float:
        return self._source()

    def now(self) -> datetime:
        elapsed = (self._source() - self._origin) * (1.0 + self.drift_ppm / 1e6)
        return self._start + timedelta(seconds=elapsed + self.skew_s)

    def set_skew(self, skew_s: float) -> None:
        """Make wall time read ``skew_s`` seconds ahead of true (negative: behind)."""
        self.skew_s = skew_s

    def jump(self, seconds: float) -> None:
        """Step wall time by ``seconds`` at once (forward or back)."""
        self.skew_s += seconds


class ManualClock:
    """A :class:`~engine.clock.Clock` that moves only when told to (no trio needed).

    Both readings advance together through :meth:`advance`; :meth:`jump` moves wall time
    alone, as a stepped system clock would.
    """

    def __init__(self, start: datetime, *, monotonic_start: float = 0.0) -> None:
        if start.tzinfo is None:
            raise ValueError("start must be timezone-aware")
        self._now = start.astimezone(UTC)
        self._monotonic = monotonic_start

    def monotonic(self) -> float:
        return self._monotonic

    def now(self) -> datetime:
        return self._now

    def advance(self, seconds: float) -> None:
        """Let ``seconds`` pass on both clocks."""
        if seconds < 0:
            raise ValueError("time does not run backwards; use jump() for a wall-clock step")
        self._monotonic += seconds
        self._now += timedelta(seconds=seconds)

    def jump(self, seconds: float) -> None:
        """Step wall time by ``seconds`` (either way); monotonic time is unchanged."""
        self._now += timedelta(seconds=seconds)
