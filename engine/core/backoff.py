"""Exponential backoff with jitter, for retries of handlers and of the engine's own calls.

``delay = min(max_s, base_s * multiplier ** attempt)``, plus a random extra of up to
``jitter`` of that delay, so that many clients failing together do not retry together.
Randomness comes from an injected source, so tests and simulations are reproducible.
"""

from __future__ import annotations

from typing import Protocol

import msgspec


class RandomSource(Protocol):
    """What backoff needs of ``random.Random``: a float in [0, 1)."""

    def random(self) -> float: ...


class Backoff(msgspec.Struct, frozen=True):
    base_s: float = 1.0
    max_s: float = 60.0
    multiplier: float = 2.0
    jitter: float = 0.2
    """The random extra, as a fraction of the delay (0 disables it)."""

    def __post_init__(self) -> None:
        if not 0 < self.base_s <= self.max_s:
            raise ValueError("backoff needs 0 < base_s <= max_s")
        if self.multiplier < 1 or not 0 <= self.jitter <= 1:
            raise ValueError("backoff needs multiplier >= 1 and 0 <= jitter <= 1")

    def delay_s(self, attempt: int, rng: RandomSource) -> float:
        """Seconds to wait before retry number ``attempt`` (0 for the first retry)."""
        exponent = min(max(attempt, 0), 64)
        delay = min(self.max_s, self.base_s * self.multiplier**exponent)
        return delay + delay * self.jitter * rng.random()
