"""Clocks: the system clock's contract and the skewed test clock on trio's mock clock."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import trio
import trio.testing

from engine.clock import Clock, SystemClock
from engine.testing import SkewedClock

START = datetime(2026, 3, 8, 6, 59, tzinfo=UTC)


async def test_system_clock_gives_aware_utc_and_trio_time() -> None:
    clock = SystemClock()
    assert isinstance(clock, Clock)
    assert clock.now().tzinfo is UTC
    assert clock.monotonic() == pytest.approx(trio.current_time(), abs=1.0)


async def test_skewed_clock_follows_trio_time_with_skew_and_jumps(
    autojump_clock: trio.testing.MockClock,
) -> None:
    clock = SkewedClock(START, skew_s=2.5)
    assert isinstance(clock, Clock)
    assert clock.now() == START + timedelta(seconds=2.5)
    await trio.sleep(60)
    assert clock.now() == START + timedelta(seconds=62.5)
    clock.jump(-30)
    assert clock.now() == START + timedelta(seconds=32.5)
    clock.set_skew(0)
    assert clock.now() == START + timedelta(seconds=60)
    monotonic = clock.monotonic()
    clock.jump(-3600)
    assert clock.monotonic() == monotonic


async def test_skewed_clock_drifts(autojump_clock: trio.testing.MockClock) -> None:
    clock = SkewedClock(START, drift_ppm=100)
    await trio.sleep(10_000)
    assert clock.now() == START + timedelta(seconds=10_001)


def test_skewed_clock_refuses_naive_start() -> None:
    with pytest.raises(ValueError, match="aware"):
        SkewedClock(datetime(2026, 1, 1), monotonic_source=lambda: 0.0)
