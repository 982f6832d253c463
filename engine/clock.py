"""The two clocks every component receives instead of reading ambient time.

* ``monotonic()`` — seconds on trio's clock: timeouts, lease trust windows, backoff. It never
  jumps, and under a ``trio.testing.MockClock`` it is fully simulated.
* ``now()`` — aware UTC wall time: cron evaluation and timestamps shown to people. It may be
  skewed or jump (NTP); correctness-critical comparisons (lease expiry) use the database's
  clock instead.

``engine/`` never calls ``time.time()`` or ``datetime.now()`` outside :class:`SystemClock`.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Protocol, runtime_checkable

import trio


@runtime_checkable
class Clock(Protocol):
    """A source of monotonic and wall time."""

    def monotonic(self) -> float:
        """Seconds from an arbitrary origin; never decreases."""
        ...

    def now(self) -> datetime:
        """The current wall time as an aware UTC datetime."""
        ...


class SystemClock:
    """The host's clocks: trio's monotonic clock and the system wall clock."""

    def monotonic(self) -> float:
        return trio.current_time()

    def now(self) -> datetime:
        return datetime.now(UTC)
