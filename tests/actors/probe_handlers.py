"""A python handler that records what ran when, for the dispatch tests: the order and the
(mock) time of each start, and the most executions running at once per task type and per
tenant -- a concurrency probe the caps and quotas are checked against."""

from __future__ import annotations

from collections import Counter

import trio

from engine.handlers import ExecutionContext

STARTS: list[tuple[float, str, str]] = []
"""(trio time, tenant, task type) of every start, in order."""
RUNNING: Counter[str] = Counter()
PEAK: Counter[str] = Counter()
"""The most running at once, keyed ``type:<task type>`` and ``tenant:<tenant>``."""
RUN_S = 1.0
RUNS: Counter[str] = Counter()
"""How many times each execution id started."""


def reset(run_s: float = 1.0) -> None:
    global RUN_S
    STARTS.clear()
    RUNS.clear()
    RUNNING.clear()
    PEAK.clear()
    RUN_S = run_s


async def probe(context: ExecutionContext) -> None:
    keys = (f"type:{context.task_type}", f"tenant:{context.tenant_id}")
    STARTS.append((trio.current_time(), context.tenant_id, context.task_type))
    RUNS[context.execution_id] += 1
    for key in keys:
        RUNNING[key] += 1
        PEAK[key] = max(PEAK[key], RUNNING[key])
    try:
        if RUN_S > 0:
            await trio.sleep(RUN_S)
    finally:
        for key in keys:
            RUNNING[key] -= 1
