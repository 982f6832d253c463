"""CPU time spent by this process and by the PostgreSQL server, for a per-execution budget.

A burst on one machine is bounded by its cores: if running one execution costs ``c`` seconds
of CPU in the node and the database together, no scheduling of the work can do better than
``cores / c`` executions a second. The burst benchmark samples both before and after the
window it measures and reports the difference per execution.

The server's CPU is the sum of user and system time of every process named ``postgres``
visible in ``/proc`` (the postmaster's children included: backends, WAL writer,
checkpointer). It is ``None`` when none is visible -- a server on another machine, or no
``/proc`` -- and the figures that need it are left out rather than guessed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

PROC: Path = Path("/proc")


def _ticks_per_s() -> int:
    return os.sysconf("SC_CLK_TCK")


def process_cpu_s(stat: str) -> float:
    """User + system seconds from the text of a ``/proc/<pid>/stat`` file."""
    # The command name (field 2) is in parentheses and may hold spaces: split after it.
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _ticks_per_s()


def postgres_cpu_s(proc: Path = PROC) -> float | None:
    """CPU seconds used so far by every visible ``postgres`` process, or ``None``."""
    total, seen = 0.0, False
    for entry in proc.iterdir() if proc.is_dir() else ():
        if not entry.name.isdigit():
            continue
        try:
            if (entry / "comm").read_text().strip() != "postgres":
                continue
            total += process_cpu_s((entry / "stat").read_text())
        except OSError:  # the process ended meanwhile, or is not ours to read
            continue
        seen = True
    return total if seen else None


def cpu_s() -> float:
    """User + system seconds this process has used so far, all its threads."""
    times = os.times()
    return times.user + times.system


def cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


@dataclass(frozen=True)
class CpuSample:
    node_s: float
    postgres_s: float | None

    @classmethod
    def now(cls) -> CpuSample:
        return cls(cpu_s(), postgres_cpu_s())


def cpu_figures(before: CpuSample, after: CpuSample, executions: int) -> dict[str, float]:
    """Microseconds of CPU per execution in this process and in PostgreSQL between two
    samples, and the rate the machine's cores would allow at that cost. Empty without
    executions; without the server's figure, only the node's."""
    if executions <= 0:
        return {}
    figures = {"node_cpu_us": (after.node_s - before.node_s) / executions * 1e6}
    if before.postgres_s is not None and after.postgres_s is not None:
        figures["postgres_cpu_us"] = (after.postgres_s - before.postgres_s) / executions * 1e6
        total_us = figures["node_cpu_us"] + figures["postgres_cpu_us"]
        if total_us > 0:
            figures["cpu_bound_per_s"] = cores() * 1e6 / total_us
    return figures
