"""``python -m simulations.regions gameday``: the multi-region game day (docs/multi-region.md).

Exit status: 0 when every check of every variant passed, 1 on any violation, 2 for a bad
command line or a run that could not be carried out (set-up failed, interrupted).
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import signal
import sys
import tempfile
from pathlib import Path

from simulations.regions.config import GameDayConfig, quick_config

VARIANT_CHOICES = ("forced", "switchover", "both")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m simulations.regions",
        description="Multi-region game days on a PostgreSQL primary and its hot standby.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    gameday = commands.add_parser(
        "gameday",
        help="forced failover and planned switch-over from region a to region b, checked",
        description="Region A's nodes on a primary, region B's on its streaming standby, "
        "minutely schedules delivered to an idempotent webhook sink; then a forced failover "
        "(primary crash inside a replication-lag window, promotion, carillon region "
        "failover, the old primary fenced and reopened) and a planned switch-over; checks "
        "misses, duplicates, RTO and fencing (docs/multi-region.md).",
    )
    gameday.add_argument(
        "--quick",
        action="store_true",
        help="100 schedules every 10 s, about 2 minutes a variant",
    )
    gameday.add_argument("--variant", choices=VARIANT_CHOICES, default="both")
    gameday.add_argument("--schedules", type=int, help="schedules (default 500; quick 100)")
    gameday.add_argument(
        "--no-unsafe",
        action="store_true",
        help="skip the staged unsafe restart of the old primary (the documented hazard)",
    )
    gameday.add_argument(
        "--keep",
        action="store_true",
        help="keep the work directory (node logs, the sink's records) even when all passed",
    )
    gameday.add_argument("--workdir", type=Path, help="the work directory (default: temporary)")
    gameday.add_argument("--json", type=Path, metavar="PATH", help="also write a JSON summary")
    gameday.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    return parser


def config_from(args: argparse.Namespace) -> GameDayConfig:
    config = quick_config() if args.quick else GameDayConfig()
    if args.schedules is not None:
        if args.schedules < 1:
            raise ValueError("a game day needs at least 1 schedule")
        config = dataclasses.replace(config, schedules=args.schedules)
    if args.no_unsafe:
        config = dataclasses.replace(config, unsafe_restart=False)
    return config


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # SIGTERM cleans up like Ctrl-C


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        config = config_from(args)
    except ValueError as exc:
        print(f"gameday: {exc}", file=sys.stderr)
        return 2
    from simulations.regions.gameday import run_variant
    from simulations.regions.report import render, write_json

    names = ["forced", "switchover"] if args.variant == "both" else [args.variant]
    work = args.workdir or Path(tempfile.mkdtemp(prefix="carillon-gameday-"))
    results = []
    try:
        for name in names:
            (work / name).mkdir(parents=True, exist_ok=True)
            results.append(run_variant(name, config, work / name, args.quiet))
            print(render(results[-1]) + "\n", flush=True)
    except KeyboardInterrupt:
        print(f"gameday: interrupted; everything started was stopped (logs: {work})",
              file=sys.stderr)  # fmt: skip
        return 2
    except (RuntimeError, OSError) as exc:
        print(f"gameday: the run could not be carried out: {exc}\nlogs: {work}", file=sys.stderr)
        return 2
    failed = any(result.violations for result in results)
    if args.json is not None:
        write_json(results, args.json)
    if failed or args.keep or args.workdir is not None:
        print(f"logs: {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    verdicts = ", ".join(f"{r.record.name} {'FAIL' if r.violations else 'PASS'}" for r in results)
    print(f"GAME DAY: {'FAIL' if failed else 'PASS'} ({verdicts})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
