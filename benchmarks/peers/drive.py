"""One APScheduler 4 burst, driven from the project's ``.venv`` (for ``bench_peer.py``).

The peer's own program, ``apscheduler_peer.py``, runs under ``.bench-peers/venv``; this side
only starts it, watches the database and reads the figures, with plain asyncpg:

1. ``setup`` adds N schedules due at T, a whole minute far enough ahead (adding is assumed
   to run at ``SETUP_RATE_GUESS_PER_S`` or faster; the lead actually left is reported) --
   a whole second in smoke runs, which need not wait for the minute;
2. ``SCHEDULERS`` ``run`` processes start on the same data store and say when they are ready;
3. from T, a poller waits until every schedule has a run recorded and no job is left in the
   data store (nothing can run again after that), or the timeout runs out;
4. each process's peak RSS (VmHWM) is read, they get SIGTERM and report their job outcomes.

Every figure comes from ``peer_runs`` on the database clock; a schedule's run time is its
first recorded run, and any further run of the same (schedule, fire time) is a duplicate.
"""

from __future__ import annotations

import asyncio
import json
import math
import select
import subprocess
import time
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final

import asyncpg

from benchmarks._nodes import peak_rss_mb, stop_nodes

PROGRAM: Final = Path(__file__).with_name("apscheduler_peer.py")
SCHEDULERS: Final = 2
SETUP_RATE_GUESS_PER_S: Final = 120.0
"""Measured at 250-290 schedules/s on the 2-core machine; the guess leaves room for noise
(the schedulers start once all are added, so an overrun would make the peer look slower)."""
SETUP_MARGIN_S: Final = 10.0
SETUP_TIMEOUT_S: Final = 3_600.0
READY_TIMEOUT_S: Final = 60.0
POLL_S: Final = 0.5
OUTCOME_TIMEOUT_S: Final = 30.0


@dataclass(frozen=True)
class PeerConfig:
    """How the peer runs: the scheduler options bench_peer.py reports, and T's alignment."""

    max_concurrent_jobs: int = 100
    lease_duration_s: float = 30.0
    add_concurrency: int = 8
    loop: str = "uvloop"
    whole_minute: bool = True
    """T on a whole minute, as a top-of-minute burst; else a whole second (smoke runs)."""


class PeerFailed(Exception):
    """The peer's run could not be completed; the message says where it stopped."""


def burst_instant(n: int, now: datetime, whole_minute: bool) -> datetime:
    """The first whole minute (or second) after the guessed setup time plus a margin."""
    earliest = now + timedelta(seconds=SETUP_MARGIN_S + n / SETUP_RATE_GUESS_PER_S)
    if whole_minute:
        return earliest.replace(second=0, microsecond=0) + timedelta(minutes=1)
    return earliest.replace(microsecond=0) + timedelta(seconds=1)


def _json_line(process: subprocess.Popen[bytes], timeout_s: float, what: str) -> dict[str, Any]:
    assert process.stdout is not None
    ready, _, _ = select.select([process.stdout], [], [], timeout_s)
    line = process.stdout.readline() if ready else b""
    if not line:
        raise PeerFailed(f"no {what} from the peer process (exit code {process.poll()})")
    parsed: dict[str, Any] = json.loads(line)
    return parsed


def _setup(python: Path, url: str, n: int, at: datetime, config: PeerConfig) -> dict[str, Any]:
    command = [
        str(python), str(PROGRAM), "setup", "--url", url, "--schedules", str(n), "--at",
        at.isoformat(), "--concurrency", str(config.add_concurrency), "--loop", config.loop,
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, timeout=SETUP_TIMEOUT_S, check=False)
    if done.returncode != 0:
        last = (done.stderr.decode(errors="replace").strip().splitlines() or ["no output"])[-1]
        raise PeerFailed(f"setup exited with {done.returncode}: {last}")
    parsed: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return parsed


def _start(
    python: Path, url: str, config: PeerConfig, logs: Path, processes: list[subprocess.Popen[bytes]]
) -> None:
    """Start the schedulers into ``processes`` (the caller stops them), wait until ready."""
    for i in range(SCHEDULERS):
        command = [
            str(python), str(PROGRAM), "run", "--url", url, "--identity", f"apscheduler-{i}",
            "--max-concurrent-jobs", str(config.max_concurrent_jobs), "--lease-duration",
            str(config.lease_duration_s), "--loop", config.loop,
        ]  # fmt: skip
        log = (logs / f"apscheduler-{i}.log").open("wb")
        processes.append(subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log))
    for process in processes:
        _json_line(process, READY_TIMEOUT_S, "ready line")


PROGRESS: Final = """
SELECT (SELECT count(DISTINCT schedule_id) FROM peer_runs) AS ran,
       (SELECT count(*) FROM jobs) AS jobs_left
"""

FIGURES: Final = """
WITH first AS (
    SELECT schedule_id, min(ran_at) AS ran_at FROM peer_runs GROUP BY schedule_id
)
SELECT (SELECT count(*) - count(DISTINCT (schedule_id, fire_time)) FROM peer_runs) AS duplicates,
       (SELECT count(*) FROM jobs) AS jobs_left,
       count(*) AS ran,
       max(ran_at) AS last_ran,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM ran_at - $1)) AS p50,
       percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM ran_at - $1)) AS p99,
       max(extract(epoch FROM ran_at - $1)) AS delay_max
FROM first
"""


async def _watch(url: str, n: int, at: datetime, timeout_s: float) -> dict[str, Any]:
    connection = await asyncpg.connect(url)
    try:
        await asyncio.sleep(max((at - datetime.now(UTC)).total_seconds(), 0.0))
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            row = await connection.fetchrow(PROGRESS)
            if row["ran"] >= n and row["jobs_left"] == 0:
                break
            await asyncio.sleep(POLL_S)
        row = await connection.fetchrow(FIGURES, at)
    finally:
        await connection.close()
    done = row["ran"] == n
    elapsed_s = (row["last_ran"] - at).total_seconds() if done else timeout_s
    return {
        "ran_share": row["ran"] / n,
        "all_ran_s": elapsed_s if done else math.inf,
        "executions_per_s": row["ran"] / max(elapsed_s, 1e-3),
        "delay_p50_s": float(row["p50"] or 0.0),
        "delay_p99_s": float(row["p99"] or 0.0),
        "delay_max_s": float(row["delay_max"] or 0.0),
        "duplicates": float(row["duplicates"]),
        "jobs_left": float(row["jobs_left"]),
    }


def _outcomes(processes: list[subprocess.Popen[bytes]]) -> Counter[str]:
    total: Counter[str] = Counter()
    for process in processes:
        try:
            total.update(_json_line(process, OUTCOME_TIMEOUT_S, "outcome line")["outcomes"])
        except (PeerFailed, ValueError, KeyError):
            total["unreported"] += 1
    return total


def peer_burst(
    python: Path, url: str, n: int, config: PeerConfig, timeout_s: float, logs: Path
) -> dict[str, Any]:
    """Run the whole burst on the (fresh, empty) database ``url``; returns its figures."""
    at = burst_instant(n, datetime.now(UTC), config.whole_minute)
    setup = _setup(python, url, n, at, config)
    result: dict[str, Any] = {
        "version": setup["version"],
        "setup_s": setup["setup_s"],
        "setup_lead_s": (at - datetime.now(UTC)).total_seconds(),
    }
    processes: list[subprocess.Popen[bytes]] = []
    try:
        _start(python, url, config, logs, processes)
        result |= asyncio.run(_watch(url, n, at, timeout_s))
        result["rss_mb"] = [peak_rss_mb(process.pid) for process in processes]
        for process in processes:
            process.terminate()
        outcomes = _outcomes(processes)
    finally:
        stop_nodes(processes)
    result["not_success"] = float(sum(outcomes.values()) - outcomes["success"])
    result["outcomes"] = dict(outcomes)
    return result
