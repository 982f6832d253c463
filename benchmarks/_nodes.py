"""Real ``carillon run`` processes for the benchmarks: start, wait until balanced, measure, stop.

Shared by ``bench_failover.py`` (K nodes, one of them SIGKILLed), ``bench_peer.py`` (one
and two nodes beside the peer) and ``bench_burst.py`` (K nodes on the same burst):
:func:`carillon_burst` is the whole burst on K processes, measured as ``_burst`` measures it.
Node ids are ``<name>-<index>``, so a lease owner maps back
to its process by the suffix. Every node logs JSON lines at warning level to
``<logs>/<name>-<index>.log`` and serves no HTTP API.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

import asyncpg
import trio
import uvloop

from benchmarks._burst import (
    admin,
    create_schedules,
    fresh_database,
    ledger_figures,
    poll_until_succeeded,
)

STOP_TIMEOUT_S: Final = 20.0

BALANCE_POLL_S: Final = 0.2
LEASES: Final = "SELECT partition_id, owner_id, expires_at > now() AS live FROM partition_leases"


def start_nodes(
    url: str, k: int, logs: Path, *, name: str, options: Sequence[str] = ()
) -> list[subprocess.Popen[bytes]]:
    """Start K ``carillon run`` processes on ``url`` with ``options`` added to each."""
    processes = []
    for i in range(k):
        log = (logs / f"{name}-{i}.log").open("wb")
        command = [
            sys.executable, "-m", "engine", "run", "--database-url", url, "--node-id",
            f"{name}-{i}", *options, "--http", "", "--log-format", "json",
            "--log-level", "warning",
        ]  # fmt: skip
        processes.append(subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT))
    return processes


def stop_nodes(processes: Sequence[subprocess.Popen[bytes]]) -> None:
    """SIGTERM the live ones, wait for a graceful stop, SIGKILL whatever outlasts it."""
    for process in processes:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    for process in processes:
        try:
            process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def peak_rss_mb(pid: int) -> float:
    """The process's peak resident set (VmHWM) so far, in MB; NaN once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


async def wait_balanced(connection: asyncpg.Connection, k: int, timeout_s: float) -> bool:
    """Wait until K live owners share every partition within one; False on timeout."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        rows = await connection.fetch(LEASES)
        owners: dict[str, int] = {}
        for row in rows:
            if row["live"] and row["owner_id"]:
                owners[row["owner_id"]] = owners.get(row["owner_id"], 0) + 1
        balanced = len(owners) == k and max(owners.values()) - min(owners.values()) <= 1
        if balanced and sum(owners.values()) == len(rows):
            return True
        await asyncio.sleep(BALANCE_POLL_S)
    return False


async def _balanced_before(url: str, k: int, burst_at: datetime) -> bool:
    connection = await asyncpg.connect(url)
    try:
        until_t = (burst_at - datetime.now(UTC)).total_seconds()
        return await wait_balanced(connection, k, max(until_t, 0.0))
    finally:
        await connection.close()


def carillon_burst(
    server_url: str,
    n: int,
    k: int,
    timeout_s: float,
    logs: Path,
    *,
    prefix: str,
    settle_s: float = 0.0,
) -> dict[str, Any]:
    """The burst of N on K ``carillon run`` processes (default settings) sharing a fresh
    database: schedules first, then the nodes, which share the partitions before T (set
    ``settle_s`` later than one node needs). Returns ``ledger_figures`` plus
    ``setup_s`` (creating the schedules), ``setup_lead_s`` (T - the end of that),
    ``balanced`` (shared by T), ``balanced_lead_s`` (T - when they were; negative when not by
    T) and ``rss_mb`` (each process's peak RSS)."""
    name, url = fresh_database(server_url, prefix)
    processes: list[subprocess.Popen[bytes]] = []
    try:
        started = time.perf_counter()
        burst_at = trio.run(create_schedules, url, n, None, settle_s)
        result: dict[str, Any] = {
            "setup_s": time.perf_counter() - started,
            "setup_lead_s": (burst_at - datetime.now(UTC)).total_seconds(),
        }
        processes = start_nodes(url, k, logs, name=f"carillon-{k}")
        result["balanced"] = uvloop.run(_balanced_before(url, k, burst_at))
        result["balanced_lead_s"] = (burst_at - datetime.now(UTC)).total_seconds()
        polled = poll_until_succeeded(url, n, burst_at, timeout_s)
        if "wal_per_execution_b" in polled:  # the nodes' RSS is theirs, not the poller's
            result["wal_per_execution_b"] = polled["wal_per_execution_b"]
        result["rss_mb"] = [peak_rss_mb(process.pid) for process in processes]
        stop_nodes(processes)
        figures = uvloop.run(ledger_figures(url, n, burst_at, timeout_s))
    finally:
        stop_nodes(processes)  # a no-op for nodes already stopped
        admin(server_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    return result | figures
