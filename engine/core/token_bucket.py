"""The node's start-rate limit: a token bucket whose burst can be paced over a window.

Responsibility: decide whether the dispatcher may start ``n`` more executions at a given
instant, and how long it must wait otherwise. Time is a float of seconds from any monotonic
origin, passed in by the caller; nothing here reads a clock.

Semantics
---------
*Sustained limit* (always on). A token bucket of capacity ``burst``, full at first, refilled
continuously at ``rate_per_s``; each admitted item takes one token. It is kept as a GCRA
("theoretical arrival time"), which is the same bucket without floating-point token counts
drifting. Over any interval of length ``L`` the admissions are at most
``burst + rate_per_s * L``, and a long backlog is admitted at ``rate_per_s``.

*Smoothing* (``smoothing_window_s > 0``). A plain bucket releases its whole burst at once.
With smoothing, admissions are also paced at ``pace_per_s = rate_per_s + burst /
smoothing_window_s``: the burst allowance is spread *on top of* the rate, so a full bucket
drains over ``smoothing_window_s`` (it loses ``burst / smoothing_window_s`` tokens per second
net) and the backlog then continues at ``rate_per_s``. The pacer is idle-then-advance: it
admits when idle and a batch of ``n`` keeps it busy for ``n / pace_per_s``. So over any
interval of length ``L`` the admissions are at most ``n_max + pace_per_s * L`` as well
(``n_max`` the largest batch taken; 1 for single takes, which is what smooth pacing wants).

Invariants: a refused ``take`` changes nothing; ``take(now_s + wait_s(now_s, n), n)`` succeeds
if nothing else was taken meanwhile; a clock that steps back only delays admissions.
"""

from __future__ import annotations

import math
from typing import Final

ADMIT_TOLERANCE_S: Final = 1e-9
"""Slack on the admission test so that waking exactly at ``wait_s`` is never refused for a
rounding error; it can admit at most ``rate * 1e-9`` tokens early."""


class TokenBucket:
    """A rate limit of ``rate_per_s`` with ``burst`` tokens of tolerance, optionally paced."""

    def __init__(self, rate_per_s: float, burst: int, *, smoothing_window_s: float = 0.0) -> None:
        if not (math.isfinite(rate_per_s) and rate_per_s > 0):
            raise ValueError(f"token bucket rate_per_s must be a positive number, not {rate_per_s}")
        if isinstance(burst, bool) or not isinstance(burst, int) or burst < 1:
            raise ValueError(f"token bucket burst must be an integer >= 1, not {burst!r}")
        if not (math.isfinite(smoothing_window_s) and smoothing_window_s >= 0):
            raise ValueError(
                "token bucket smoothing_window_s must be >= 0 seconds (0 turns smoothing off), "
                f"not {smoothing_window_s}"
            )
        self._rate_per_s = float(rate_per_s)
        self._burst = burst
        self._smoothing_window_s = float(smoothing_window_s)
        self._interval_s = 1.0 / self._rate_per_s
        self._pace_interval_s = (
            1.0 / (self._rate_per_s + burst / self._smoothing_window_s)
            if self._smoothing_window_s > 0
            else 0.0
        )
        self._arrival_s = -math.inf
        """When the bucket would be full again if nothing more were taken, minus ``burst``
        intervals: the GCRA's theoretical arrival time (``-inf`` while full)."""
        self._pace_free_s = -math.inf
        """When the pacer is idle again."""

    @property
    def rate_per_s(self) -> float:
        return self._rate_per_s

    @property
    def burst(self) -> int:
        return self._burst

    @property
    def smoothing_window_s(self) -> float:
        return self._smoothing_window_s

    @property
    def pace_per_s(self) -> float | None:
        """The pacing rate with smoothing on (``rate + burst / window``); ``None`` when off."""
        return 1.0 / self._pace_interval_s if self._pace_interval_s else None

    def available(self, now_s: float) -> float:
        """Tokens in the bucket at ``now_s`` (fractional; ignores the pacer)."""
        debt_s = max(self._arrival_s, now_s) - now_s
        return max(0.0, self._burst - debt_s / self._interval_s)

    def wait_s(self, now_s: float, n: int = 1) -> float:
        """Seconds from ``now_s`` until ``take(·, n)`` would succeed (0 if it would now)."""
        self._check_count(n)
        bucket_wait_s = max(self._arrival_s, now_s) + (n - self._burst) * self._interval_s - now_s
        pace_wait_s = self._pace_free_s - now_s
        wait = max(bucket_wait_s, pace_wait_s)
        return wait if wait > ADMIT_TOLERANCE_S else 0.0

    def take(self, now_s: float, n: int = 1) -> bool:
        """Admit ``n`` items at ``now_s`` if both the bucket and the pacer allow; else nothing."""
        if self.wait_s(now_s, n) > 0:
            return False
        self._arrival_s = max(self._arrival_s, now_s) + n * self._interval_s
        if self._pace_interval_s:
            self._pace_free_s = max(self._pace_free_s, now_s) + n * self._pace_interval_s
        return True

    def _check_count(self, n: int) -> None:
        if not 1 <= n <= self._burst:
            raise ValueError(f"can take 1 to burst={self._burst} tokens at once, not {n}")
