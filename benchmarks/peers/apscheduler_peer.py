"""The APScheduler 4 side of ``benchmarks/bench_peer.py``; runs under ``.bench-peers/venv``.

Two commands, both against one PostgreSQL database given as a libpq URL:

* ``setup --schedules N --at T``: creates the data store's tables (``SQLAlchemyDataStore`` on
  asyncpg, as the APScheduler 4 documentation sets it up), the results table ``peer_runs``,
  one task ``peer-noop`` with no limit on its concurrent jobs, and N schedules
  ``s0000000``... whose ``CronTrigger`` fires daily at T's hour, minute and second (UTC),
  ``--concurrency`` ``add_schedule`` calls at a time through the public scheduler API. Prints
  one JSON line: the installed version and the seconds the adding took.
* ``run --identity ID``: one scheduler process (role ``both``: it turns due schedules into
  jobs and runs jobs) on that data store with the ``AsyncpgEventBroker`` (LISTEN/NOTIFY, the
  documented broker for several schedulers on one store). Prints ``{"ready": ...}`` once
  started, runs until SIGTERM, then prints the outcomes of the jobs it released.

The task is the peer's ``noop``: it does nothing but record its run, one INSERT of (schedule
id, fire time, ``clock_timestamp()``, scheduler) into ``peer_runs`` through a small asyncpg
pool, so the database counts runs and duplicates and times them on its own clock.

This program never imports ``engine``: it measures APScheduler as a user would run it.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from importlib.metadata import version
from typing import Any, Final

import anyio
import asyncpg
from apscheduler import AsyncScheduler, JobReleased, current_job
from apscheduler.datastores.sqlalchemy import SQLAlchemyDataStore
from apscheduler.eventbrokers.asyncpg import AsyncpgEventBroker
from apscheduler.triggers.cron import CronTrigger

TASK_ID: Final = "peer-noop"
SINK_POOL_SIZE: Final = 8
RESULTS_TABLE: Final = """
CREATE TABLE IF NOT EXISTS peer_runs (
    schedule_id text NOT NULL,
    fire_time timestamptz NOT NULL,
    ran_at timestamptz NOT NULL,
    scheduler text NOT NULL
)
"""
RECORD: Final = "INSERT INTO peer_runs VALUES ($1, $2, clock_timestamp(), $3)"


class Sink:
    """Where the task records its runs: set once per process before the scheduler starts."""

    pool: asyncpg.Pool | None = None
    identity = ""


async def record_run() -> None:
    """The peer's noop: one INSERT naming the schedule and fire time of the current job."""
    job = current_job.get()
    assert Sink.pool is not None
    await Sink.pool.execute(RECORD, job.schedule_id, job.scheduled_fire_time, Sink.identity)


def open_scheduler(url: str, **options: Any) -> AsyncScheduler:
    """The data store gets a URL, so it creates and disposes of its SQLAlchemy engine."""
    return AsyncScheduler(
        SQLAlchemyDataStore(url.replace("postgresql://", "postgresql+asyncpg://", 1)),
        AsyncpgEventBroker(url),
        **options,
    )


async def configure(scheduler: AsyncScheduler) -> None:
    # max_running_jobs defaults to 1 per task in APScheduler 4, which would serialise the
    # whole burst; Carillon's noop task type has no such cap either.
    await scheduler.configure_task(TASK_ID, func=record_run, max_running_jobs=None)


async def setup(args: argparse.Namespace) -> None:
    at = datetime.fromisoformat(args.at).astimezone(UTC)
    connection = await asyncpg.connect(args.url)
    try:
        await connection.execute(RESULTS_TABLE)
    finally:
        await connection.close()
    started = time.perf_counter()
    start_time = datetime.now(UTC) - timedelta(seconds=1)
    async with open_scheduler(args.url) as scheduler:
        await configure(scheduler)
        ids = iter(f"s{i:07d}" for i in range(args.schedules))

        async def adder() -> None:
            for schedule_id in ids:
                # start_time pins the first fire to T even should adding overrun T (the
                # benchmark reports it; a fresh trigger would skip to tomorrow instead).
                trigger = CronTrigger(
                    hour=at.hour,
                    minute=at.minute,
                    second=at.second,
                    timezone=UTC,
                    start_time=start_time,
                )
                await scheduler.add_schedule(TASK_ID, trigger, id=schedule_id)

        async with anyio.create_task_group() as group:
            for _ in range(args.concurrency):
                group.start_soon(adder)
    seconds = time.perf_counter() - started
    print(json.dumps({"version": version("apscheduler"), "setup_s": seconds}), flush=True)


async def run(args: argparse.Namespace) -> None:
    Sink.identity = args.identity
    Sink.pool = await asyncpg.create_pool(args.url, min_size=1, max_size=SINK_POOL_SIZE)
    outcomes: Counter[str] = Counter()

    def released(event: JobReleased) -> None:
        if event.scheduler_id == args.identity:
            outcomes[event.outcome.name] += 1

    options = {
        "identity": args.identity,
        "max_concurrent_jobs": args.max_concurrent_jobs,
        "lease_duration": timedelta(seconds=args.lease_duration),
    }
    try:
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async with open_scheduler(args.url, **options) as scheduler:
                await configure(scheduler)
                scheduler.subscribe(released, JobReleased)
                await scheduler.start_in_background()
                print(json.dumps({"ready": args.identity}), flush=True)
                async for _ in signals:
                    break
                await scheduler.stop()
                await scheduler.wait_until_stopped()
    finally:
        await Sink.pool.close()
    print(json.dumps({"outcomes": dict(outcomes)}), flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=("setup", "run"))
    parser.add_argument("--url", required=True, help="libpq URL of the benchmark's database")
    parser.add_argument("--schedules", type=int, default=20_000)
    parser.add_argument("--at", help="the burst instant T, ISO 8601 (setup)")
    parser.add_argument("--concurrency", type=int, default=8, help="add_schedule calls at once")
    parser.add_argument("--identity", default="peer-0", help="scheduler id (run)")
    parser.add_argument("--max-concurrent-jobs", type=int, default=100)
    parser.add_argument("--lease-duration", type=float, default=30.0, help="seconds")
    parser.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    command = setup if args.command == "setup" else run
    anyio.run(
        command, args, backend="asyncio", backend_options={"use_uvloop": args.loop == "uvloop"}
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
