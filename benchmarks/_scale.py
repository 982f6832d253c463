"""Helpers of ``bench_scale.py``: the schedule mix, process memory, the ledger's figures.

Memory figures are of this process, read from ``/proc/self/status`` (``VmRSS``, ``VmHWM``)
and ``/proc/meminfo`` (``MemAvailable``); MB means 2^20 bytes throughout.
"""

from __future__ import annotations

import asyncio
import enum
import math
import resource
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Final

import msgspec

from engine.core.timetable import Timetable, TimetableCache
from engine.model import Schedule

if TYPE_CHECKING:
    from engine.node import Node

MB: Final = 1 << 20
SPREAD: Final = ["H * * * *", "H/15 * * * *", "H H * * *", "H/5 * * * *", "H H(8-18) * * MON-FRI"]
ZONES: Final = ["UTC", "Europe/Berlin", "America/New_York", "Asia/Tokyo"]
TENANTS: Final = 50
MEMORY_HEADROOM: Final = 1.5
"""Factor on the measured bytes per schedule: fragmentation, the burst, executions in flight."""
MEMORY_RESERVE_MB: Final = 2_048.0
"""Left to PostgreSQL, the creators and the rest of the machine."""
SIZE_SAMPLE_PARTITIONS: Final = 4
STARTS_SETTLE_S: Final = 10.0
"""The node runs on this long after the steady window, so that its last fires can start; one
still not started by then counts as starting then (its delay is a lower bound)."""
BURST_POLL_S: Final = 1.0


def burst_expression(burst_at: datetime) -> str:
    """The cron expression of the schedules due at ``burst_at`` (UTC)."""
    return f"{burst_at.second} {burst_at.minute} {burst_at.hour} * * *"


def make_schedules(
    first: int,
    stop: int,
    burst: int,
    burst_at: datetime | None,
    now: datetime,
    cache: TimetableCache,
) -> list[Schedule]:
    """Schedules number ``first`` .. ``stop - 1``; those below ``burst`` fire at ``burst_at``."""
    schedules = []
    for n in range(first, stop):
        sid = f"s{n:07d}"
        if n < burst and burst_at is not None:
            expr = burst_expression(burst_at)
            zone, next_at = "UTC", burst_at
        else:
            expr, zone = SPREAD[n % len(SPREAD)], ZONES[n % len(ZONES)]
            next_at = cache.get(expr, zone, schedule_id=sid).next_fire(now).planned_at
        schedules.append(
            Schedule(
                schedule_id=sid,
                tenant_id=f"tenant-{n % TENANTS:02d}",
                cron_expr=expr,
                timezone=zone,
                task_type="noop",
                next_run_at=next_at,
            )
        )
    return schedules


def _status_kb(field: str) -> float | None:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field):
            return float(line.split()[1])
    return None


def rss_mb() -> float:
    kb = _status_kb("VmRSS:")
    if kb is None:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return kb / 1024


def rss_peak_mb() -> float:
    kb = _status_kb("VmHWM:")
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 if kb is None else kb / 1024


def mem_available_mb() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 1024
    return math.inf


def memory_needed_mb(total: int, bytes_per_schedule: float) -> float:
    """What a run with ``total`` schedules is expected to need, with headroom and reserve."""
    return total * bytes_per_schedule * MEMORY_HEADROOM / MB + MEMORY_RESERVE_MB


def quantile(samples: Sequence[float], q: float) -> float:
    """The ``q`` quantile by linear interpolation; NaN without samples."""
    if not samples:
        return math.nan
    ordered = sorted(samples)
    position = q * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def deep_size(roots: Sequence[object]) -> int:
    """Bytes of ``roots`` and everything they reach through containers and Structs, each
    object once; shared objects of the node (timetables, enums, classes) are not counted."""
    seen: set[int] = set()
    stack = list(roots)
    total = 0
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, Timetable | enum.Enum | type):
            continue
        seen.add(id(obj))
        total += sys.getsizeof(obj)
        if isinstance(obj, dict):
            stack.extend(obj.keys())
            stack.extend(obj.values())
        elif isinstance(obj, list | tuple | set | frozenset):
            stack.extend(obj)
        elif isinstance(obj, msgspec.Struct):
            stack.extend(getattr(obj, field) for field in obj.__struct_fields__)
    return total


def planner_bytes_per_schedule(node: Node) -> float:
    """Bytes per schedule of the planners' entries and plan heaps, from a deep size of a few
    partitions (an estimate; reads the planners' private fields, NaN if they moved)."""
    planners = getattr(node.planners, "_planners", {})
    sample = [planners[p] for p in sorted(planners)[:SIZE_SAMPLE_PARTITIONS]]
    try:
        roots = [part for p in sample for part in (p._entries, p._heap.__dict__)]
    except AttributeError:
        return math.nan
    schedules = sum(len(p._entries) for p in sample)
    return deep_size(roots) / schedules if schedules else math.nan


UNFINISHED: Final = """
SELECT count(*) FROM executions
WHERE planned_at = $1 AND status NOT IN ('succeeded', 'dead-letter', 'skipped')
"""

BURST: Final = """
SELECT count(*) AS n, min(e.enqueued_at) AS first, max(e.enqueued_at) AS last
FROM executions AS e JOIN schedules AS s USING (schedule_id)
WHERE e.planned_at = $1 AND s.cron_expr = $2
"""
"""The burst schedules' executions at T: the spread schedules may fire at T too (an ``H``
minute equal to T's, when T falls on a minute), and are not counted."""

STEADY: Final = """
SELECT count(*) AS planned,
       percentile_cont(0.99) WITHIN GROUP (
           ORDER BY extract(epoch FROM coalesce(started_at, $3) - planned_at)
       ) AS delay_p99
FROM executions WHERE planned_at > $1 AND planned_at <= $2
"""


def wait_burst_done(url: str, burst_at: datetime, timeout_s: float) -> None:
    """From a worker thread: poll until no burst execution is left to run, or the timeout."""

    async def poll() -> None:
        import asyncpg

        connection = await asyncpg.connect(url)
        try:
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline and await connection.fetchval(UNFINISHED, burst_at):
                await asyncio.sleep(BURST_POLL_S)
        finally:
            await connection.close()

    asyncio.run(poll())


def database_figures(
    url: str,
    burst_at: datetime | None,
    steady_from: datetime,
    steady_to: datetime,
    stopped_at: datetime,
) -> dict[str, float]:
    """From a worker thread: the burst's planning and the steady window, from the ledger;
    ``stopped_at``: when the node stopped (the start of fires it had not started)."""

    async def query() -> dict[str, float]:
        import asyncpg

        connection = await asyncpg.connect(url)
        try:
            steady = await connection.fetchrow(STEADY, steady_from, steady_to, stopped_at)
            burst = (
                await connection.fetchrow(BURST, burst_at, burst_expression(burst_at))
                if burst_at
                else None
            )
        finally:
            await connection.close()
        window_s = (steady_to - steady_from).total_seconds()
        figures = {
            "steady_planned_per_s": steady["planned"] / window_s,
            "steady_start_delay_p99_s": math.nan
            if steady["delay_p99"] is None
            else float(steady["delay_p99"]),
        }
        if burst is not None and burst_at is not None and burst["n"]:
            figures["burst_rows"] = float(burst["n"])
            figures["burst_plan_s"] = (burst["last"] - burst["first"]).total_seconds()
            figures["burst_lead_s"] = (burst_at - burst["last"].astimezone(UTC)).total_seconds()
        elif burst_at is not None:
            figures["burst_rows"] = 0.0
        return figures

    return asyncio.run(query())
