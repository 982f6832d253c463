"""A slow python handler with a concurrency probe, for the overlap-policy tests."""

from __future__ import annotations

from collections import Counter

import trio

from engine.handlers import ExecutionContext

RUN_S = 130.0
"""Longer than a minute: every-minute schedules overlap themselves."""
RUNNING: Counter[str] = Counter()
"""Handlers running now, per schedule id."""
PEAK: Counter[str] = Counter()
"""The most handlers seen running at once, per schedule id."""


def reset() -> None:
    RUNNING.clear()
    PEAK.clear()


async def slow(context: ExecutionContext) -> None:
    schedule_id = context.schedule_id
    RUNNING[schedule_id] += 1
    PEAK[schedule_id] = max(PEAK[schedule_id], RUNNING[schedule_id])
    try:
        await trio.sleep(RUN_S)
    finally:
        RUNNING[schedule_id] -= 1
