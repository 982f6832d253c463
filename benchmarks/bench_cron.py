"""Cost of computing fires: cold and warm per call, and a 200k-schedule burst.

The burst models a planner at the top of an hour: 200,000 schedules over 100 distinct
(expression, zone) pairs all ask for their next fire after the same instant. The target is
under 0.2 s on a 2-core machine; parsing once per expression and memoising next-fire per
(timetable, after) is what makes it possible (raw croniter is shown beside it for scale).

Usage: python benchmarks/bench_cron.py [--quick] [--runs N]
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from croniter import croniter

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._report import machine, revision, summary, write_section
from engine.core import cron
from engine.core.timetable import Timetable, TimetableCache

EXPRESSIONS = [
    "* * * * *", "*/5 * * * *", "*/15 * * * *", "0 * * * *", "30 * * * *",
    "0 */2 * * *", "0 0 * * *", "30 2 * * *", "0 9 * * MON-FRI", "0 0 1 * *",
]  # fmt: skip
ZONES = [
    "UTC", "America/New_York", "Europe/London", "Europe/Berlin", "Asia/Tokyo",
    "Australia/Sydney", "America/Los_Angeles", "Asia/Kolkata", "America/Sao_Paulo",
    "Australia/Lord_Howe",
]  # fmt: skip
AFTER = datetime(2026, 11, 29, 11, 59, 59, tzinfo=UTC)
TARGET_BURST_S = 0.2


def per_call_us(calls: int) -> dict[str, float]:
    """Mean microseconds per call, for each way of computing a next fire."""
    pairs = [(e, z) for e in EXPRESSIONS for z in ZONES]
    afters = [AFTER + timedelta(seconds=7 * n) for n in range(calls)]
    results: dict[str, float] = {}

    elapsed = 0.0
    for n in range(calls):
        expression, zone = pairs[n % len(pairs)]
        cron._parse_cached.cache_clear()
        started = time.perf_counter()
        Timetable.compile(expression, zone).next_fire(afters[n])
        elapsed += time.perf_counter() - started
    results["carillon cold (validate + parse + first next)"] = elapsed / calls

    started = time.perf_counter()
    for n in range(calls):
        expression, zone = pairs[n % len(pairs)]
        Timetable.compile(expression, zone).next_fire(afters[n])
    results["carillon new timetable, expression parsed before"] = (
        time.perf_counter() - started
    ) / calls

    timetable = Timetable.compile("*/15 * * * *", "America/New_York")
    started = time.perf_counter()
    for n in range(calls):
        timetable.next_fire(afters[n])
    results["carillon warm parse, new instant"] = (time.perf_counter() - started) / calls

    started = time.perf_counter()
    for _ in range(calls):
        timetable.next_fire(AFTER)
    results["carillon memo hit"] = (time.perf_counter() - started) / calls

    naive = AFTER.replace(tzinfo=None)
    started = time.perf_counter()
    for n in range(calls):
        croniter(EXPRESSIONS[n % len(EXPRESSIONS)], naive, ret_type=datetime).get_next()
    results["raw croniter cold (parse + next)"] = (time.perf_counter() - started) / calls

    iterator = croniter("*/15 * * * *", naive, ret_type=datetime)
    started = time.perf_counter()
    for _ in range(calls):
        iterator.set_current(naive, force=True)
        iterator.get_next()
    results["raw croniter warm next"] = (time.perf_counter() - started) / calls
    return {name: seconds * 1e6 for name, seconds in results.items()}


def burst_s(schedules: int) -> float:
    pairs = [(e, z) for e in EXPRESSIONS for z in ZONES]
    work = [(f"sched-{n}", *pairs[n % len(pairs)]) for n in range(schedules)]
    cache = TimetableCache()
    started = time.perf_counter()
    for schedule_id, expression, zone in work:
        cache.get(expression, zone, schedule_id=schedule_id).next_fire(AFTER)
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run; docs are not written")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    runs = 1 if args.quick else args.runs
    calls = 200 if args.quick else 3000
    schedules = 2_000 if args.quick else 200_000

    per_call: dict[str, list[float]] = {}
    bursts: list[float] = []
    for _ in range(runs):
        for name, value in per_call_us(calls).items():
            per_call.setdefault(name, []).append(value)
        bursts.append(burst_s(schedules))

    lines = [
        "## Cron calculator (`benchmarks/bench_cron.py`)",
        "",
        f"Machine: {machine()}; revision {revision()}; {runs} runs.",
        "",
        "| per call | median µs | min µs | max µs |",
        "|---|---:|---:|---:|",
    ]
    for name, samples in per_call.items():
        median, low, high = summary(samples)
        lines.append(f"| {name} | {median:.1f} | {low:.1f} | {high:.1f} |")
    median, low, high = summary(bursts)
    verdict = "meets" if median < TARGET_BURST_S else "MISSES"
    lines += [
        "",
        f"Burst: next fire for {schedules:,} schedules over {len(EXPRESSIONS) * len(ZONES)} "
        f"distinct (expression, zone) pairs, one shared instant: median {median * 1000:.1f} ms "
        f"(min {low * 1000:.1f}, max {high * 1000:.1f}); {verdict} the {TARGET_BURST_S * 1000:.0f} "
        "ms target.",
    ]
    report = "\n".join(lines)
    print(report)
    if not args.quick:
        write_section("bench_cron", report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
