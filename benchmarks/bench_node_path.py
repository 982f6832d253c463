"""The node's own path of a noop burst: dispatcher -> workers -> completion writer, no database.

The burst benchmark's CPU per execution adds the node's and PostgreSQL's; this one takes the
database away, so a change to the node's per-execution work shows at its own size. One node
runs on the in-memory ledger (:class:`~engine.ledger.memory.MemoryLedger`) and the real trio
clock; N schedules of the ``noop`` task type all fire at one instant T, planned ahead by the
node itself. From T until the completion writer has written all N, the process's CPU time
(``time.process_time``) is the figure, per execution:

* **total**: everything the process did in that window;
* **memory ledger**: the part spent inside the ledger's methods, each call's own steps timed
  (its ``checkpoint`` leaves the clock stopped while other tasks run) -- a stand-in for the
  database, not part of the node's cost;
* **node**: total minus the memory ledger.

Usage: python benchmarks/bench_node_path.py [--executions N] [--workers W] [--runs K]
                                            [--profile] [--compare REV] [--no-docs] [--quick]

``--profile`` adds a cProfile top-20 (by own time) of one more run's window. ``--compare REV``
runs REV's engine (``git archive`` into a temporary directory, this script unchanged) and the
working tree's, one run per process, in ABBA order, ``--runs`` rounds, and reports each side's
medians and the median of the per-round ratios; unless ``--no-docs`` it replaces the
``bench_node_path`` section of ``docs/benchmarks.md`` (``make bench-node-path REV=...``).

20,000 executions by default, not more: the memory ledger's due read sorts every row it
holds, so at 50,000 it costs more than the node itself and a run takes minutes.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import random
import statistics
import subprocess
import sys
import tempfile
import time
import types
from collections import Counter
from collections.abc import Callable, Generator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final

import trio

ROOT = Path(__file__).resolve().parents[1]
EXECUTIONS_DEFAULT: Final = 20_000
PLAN_RATE_PER_S: Final = 50_000.0
"""The node's burst planning rate here: planning on the memory ledger is fast, and a lower
rate only makes each run wait longer before T."""
LOOKAHEAD_S: Final = 2.0
MARGIN_S: Final = 3.0
"""Time after the node's start for its leases, plus slack, before the burst's planning lead."""
POLL_S: Final = 0.05
TIMEOUT_S: Final = 300.0


class LedgerTimer:
    """CPU time spent inside the memory ledger's own code.

    Every ledger method is wrapped in a coroutine that steps the original one and times each
    step with ``time.process_time``: the time a method spends suspended (its checkpoint, while
    other tasks run) is not counted."""

    def __init__(self) -> None:
        self.cpu_s = 0.0
        self.calls: Counter[str] = Counter()

    def wrap(self, ledger: Any, names: frozenset[str]) -> None:
        for name in names:
            setattr(ledger, name, self._timed(name, getattr(ledger, name)))

    def _timed(self, name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        timer = self

        @types.coroutine
        def step(coro: Any) -> Generator[Any, Any, Any]:
            clock = time.process_time
            value: Any = None
            error: BaseException | None = None
            while True:
                started = clock()
                try:
                    yielded = coro.send(value) if error is None else coro.throw(error)
                except StopIteration as stop:
                    timer.cpu_s += clock() - started
                    return stop.value
                except BaseException:
                    timer.cpu_s += clock() - started
                    raise
                timer.cpu_s += clock() - started
                try:
                    value, error = (yield yielded), None
                except BaseException as thrown:
                    value, error = None, thrown

        async def timed(*args: Any, **kwargs: Any) -> Any:
            timer.calls[name] += 1
            return await step(method(*args, **kwargs))

        return timed


async def burst(
    n: int, workers: int, profile: cProfile.Profile | None, delay_s: float = 0.0
) -> dict[str, float]:
    """One run: its figures (µs per execution, executions/s)."""
    from engine.config import LogLevel, NodeConfig
    from engine.ledger.memory import MemoryLedger
    from engine.ledger.params import SchedulesCreate, TaskTypesPut
    from engine.model import HandlerKind, Schedule, TaskType
    from engine.node import Node
    from engine.testing.clock import SkewedClock
    from engine.testing.faulty import LEDGER_METHODS

    lead_s = LOOKAHEAD_S + n / PLAN_RATE_PER_S + MARGIN_S
    burst_at = datetime(2026, 3, 2, 0, 1, 0, tzinfo=UTC)  # on a minute: a cron fires there
    clock = SkewedClock(burst_at - timedelta(seconds=lead_s))
    ledger = MemoryLedger(clock=clock, partition_count=16)
    await ledger.task_types_put(
        TaskTypesPut(
            TaskType(
                name="noop",
                kind=HandlerKind.NOOP,
                allowed_tenants=("*",),
                settings={"delay_s": delay_s} if delay_s else {},
            )
        )
    )
    # Fires at T once a year: the planner has nothing else to do during the burst.
    cron = f"{burst_at.minute} {burst_at.hour} {burst_at.day} {burst_at.month} *"
    schedules = [
        Schedule(
            schedule_id=f"s{i:07d}", tenant_id=f"tenant-{i % 20:02d}", cron_expr=cron,
            task_type="noop",
        )
        for i in range(n)
    ]  # fmt: skip
    for first in range(0, n, 1000):
        await ledger.schedules_create(SchedulesCreate(schedules[first : first + 1000]))
    timer = LedgerTimer()
    timer.wrap(ledger, LEDGER_METHODS)
    config = NodeConfig(
        node_id="bench-node-path",
        log_level=LogLevel.WARNING,
        workers=workers,
        lookahead_s=LOOKAHEAD_S,
        burst_plan_rate_per_s=PLAN_RATE_PER_S,
        http="",
    )
    node = Node(config, ledger, clock, random.Random(7), tracing=None)
    async with trio.open_nursery() as nursery:
        await nursery.start(node.run)
        await trio.sleep(max((burst_at - clock.now()).total_seconds(), 0.0))
        planned = node.completions.statistics().written  # nothing may have run before T
        calls0 = timer.calls.copy()
        cpu0, ledger0, wall0 = time.process_time(), timer.cpu_s, time.perf_counter()
        if profile is not None:
            profile.enable()
        with trio.fail_after(TIMEOUT_S):
            while node.completions.statistics().written < n:
                await trio.sleep(POLL_S)
        if profile is not None:
            profile.disable()
        cpu1, ledger1, wall1 = time.process_time(), timer.cpu_s, time.perf_counter()
        calls = timer.calls - calls0
        finished = node.workers.statistics().finished
        nursery.cancel_scope.cancel()
    if planned or finished != {"succeeded": n}:
        raise SystemExit(f"the burst did not run as planned: {planned} early, {finished}")
    total_us = (cpu1 - cpu0) / n * 1e6
    ledger_us = (ledger1 - ledger0) / n * 1e6
    return {
        "total_us": total_us,
        "ledger_us": ledger_us,
        "node_us": total_us - ledger_us,
        "executions_per_s": n / (wall1 - wall0),
        **{f"calls:{name}": float(count) for name, count in calls.items()},
    }


def one_run(n: int, workers: int, profile: bool, delay_s: float = 0.0) -> dict[str, float]:
    profiler = cProfile.Profile() if profile else None
    figures = trio.run(burst, n, workers, profiler, delay_s)
    if profiler is not None:
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(20)
        print(out.getvalue())
    return figures


# --- revisions side by side -------------------------------------------------------------------


def _run_process(engine_root: Path, n: int, workers: int, delay_s: float) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(engine_root)}
    # Each process runs only the engine under ``engine_root``: said, not assumed.
    env["BENCH_NODE_PATH_ENGINE"] = str(engine_root / "engine")
    command = [sys.executable, str(Path(__file__).resolve()), "--json", "--executions", str(n)]
    command += ["--workers", str(workers), "--delay-s", str(delay_s)]
    done = subprocess.run(
        command, env=env, capture_output=True, text=True, check=False, timeout=TIMEOUT_S * 2
    )
    if done.returncode != 0:
        raise SystemExit(f"a run of {engine_root} failed:\n{done.stderr[-3000:]}")
    figures: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return figures


def _describe(rev: str) -> str:
    return subprocess.run(
        ["git", "-C", str(ROOT), "log", "-1", "--format=%h %s", rev],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip


def _load() -> str:
    """The machine's load averages (1, 5, 15 minutes): how shared it was."""
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"


def compare(rev: str, n: int, workers: int, rounds: int, delay_s: float = 0.0) -> str:
    """ABBA rounds of REV's engine against the working tree's; the markdown report."""
    load_before = _load()
    with tempfile.TemporaryDirectory(prefix="bench-node-path-") as scratch:
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", rev, "engine"], capture_output=True, check=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", scratch], input=archive, check=True)
        sides = {"before": Path(scratch), "after": ROOT}
        runs: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
        for round_ in range(rounds):
            order = ("before", "after") if round_ % 2 == 0 else ("after", "before")
            for side in order:
                runs[side].append(_run_process(sides[side], n, workers, delay_s))
                print(side, runs[side][-1], file=sys.stderr)
    load_after = _load()
    dirty = subprocess.run(
        ["git", "-C", str(ROOT), "status", "--porcelain", "engine"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    rows = []
    for key, label in (
        ("node_us", "node CPU per execution (µs)"),
        ("ledger_us", "memory ledger CPU per execution (µs)"),
        ("total_us", "process CPU per execution (µs)"),
        ("executions_per_s", "executions/s (wall, T to the last completion written)"),
    ):
        before = [r[key] for r in runs["before"]]
        after = [r[key] for r in runs["after"]]
        ratio = statistics.median(a / b for a, b in zip(after, before, strict=True))
        rows.append(
            f"| {label} | {statistics.median(before):,.1f} | {statistics.median(after):,.1f} "
            f"| {ratio:.3f} | {', '.join(f'{b:,.1f}' for b in before)} "
            f"| {', '.join(f'{a:,.1f}' for a in after)} |"
        )
    return "\n".join(
        [
            "## The node's own path of a noop burst (`benchmarks/bench_node_path.py`)",
            "",
            f"One node, the in-memory ledger, the real trio clock, {n:,} noop executions due at "
            f"one instant{f' (noop delay {delay_s:g} s: not inline)' if delay_s else ''}, "
            f"{workers:,} workers; CPU of the process from T until the last "
            "completion is written, per execution, the memory ledger's own time apart (see the "
            f"script). {rounds} ABBA rounds in one run, each run its own process; medians, and "
            "the median of the per-round ratios (after / before).",
            "",
            f"- before: `{_describe(rev)}`",
            f"- after: `{_describe('HEAD')}`"
            + (" with uncommitted changes to the engine" if dirty else ""),
            f"- {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {os.cpu_count()} cores, Python "
            f"{sys.version.split()[0]}; load averages {load_before} before, {load_after} after "
            "(the machine is shared)",
            "",
            "| figure | before | after | ratio | before, each run | after, each run |",
            "|---|---:|---:|---:|---|---|",
            *rows,
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--executions", type=int, default=EXECUTIONS_DEFAULT)
    parser.add_argument("--workers", type=int, default=1_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--profile", action="store_true", help="a cProfile top-20 of one run")
    parser.add_argument("--compare", metavar="REV", help="ABBA against REV's engine")
    parser.add_argument("--no-docs", action="store_true")
    parser.add_argument(
        "--delay-s",
        type=float,
        default=0.0,
        help="the noop's delay: above 0 it waits, so it is not inline (the one-by-one path)",
    )
    parser.add_argument("--quick", action="store_true", help="a small run: does it work")
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:
        args.executions, args.runs, args.no_docs = 2_000, 1, True
    if args.json:  # the engine on PYTHONPATH: this tree's, or the revision compared with
        import engine

        expected = os.environ.get("BENCH_NODE_PATH_ENGINE")
        if expected and Path(engine.__file__).resolve().parent != Path(expected).resolve():
            raise SystemExit(f"imported {engine.__file__}, not the engine in {expected}")

        print(json.dumps(one_run(args.executions, args.workers, False, args.delay_s)))
        return
    if args.compare:
        report = compare(args.compare, args.executions, args.workers, args.runs, args.delay_s)
        print(report)
        if not args.no_docs:
            sys.path.insert(0, str(ROOT))
            from benchmarks._report import write_section

            write_section("bench_node_path", report)
        return
    sys.path.insert(0, str(ROOT))
    results = [
        one_run(args.executions, args.workers, False, args.delay_s) for _ in range(args.runs)
    ]
    for key in ("node_us", "ledger_us", "total_us", "executions_per_s"):
        values = [r[key] for r in results]
        each = ", ".join(f"{v:,.1f}" for v in values)
        print(f"{key}: median {statistics.median(values):,.1f}  ({each})")
    if args.profile:
        one_run(args.executions, args.workers, True, args.delay_s)


if __name__ == "__main__":
    main()
