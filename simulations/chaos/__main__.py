"""``python -m simulations.chaos``: run real ``carillon run`` processes through faults.

Exit status: 0 when every check passed, 1 on any violation, 2 for a bad command line or a
run that could not be carried out (setup failed, interrupted).
"""

from __future__ import annotations

import argparse
import dataclasses
import signal
import sys
from pathlib import Path

from simulations.chaos.config import ChaosConfig, quick_config, with_window


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m simulations.chaos",
        description="Three carillon run processes against a private PostgreSQL and a webhook "
        "sink, through SIGKILL, SIGSTOP/SIGCONT past the lease and a PostgreSQL restart; then "
        "checks effects, misses, start delay and fencing (docs/chaos.md).",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="the short variant: 100 schedules every 10 s, under 2 minutes",
    )
    parser.add_argument("--schedules", type=int, help="schedules (default 2000; quick 100)")
    parser.add_argument(
        "--minutes", type=float, help="checked window in minutes (default 5; quick: just enough)"
    )
    parser.add_argument("--nodes", type=int, help="carillon run processes (default 3)")
    parser.add_argument("--partitions", type=int, help="partitions (default 64; quick 16)")
    parser.add_argument(
        "--lease-ttl", type=float, help="lease TTL of the nodes (default 5 s; quick 4)"
    )
    parser.add_argument("--pg-down", type=float, help="seconds PostgreSQL stays stopped (2)")
    parser.add_argument(
        "--slow-receiver-ms",
        type=float,
        help="how late the receiver answers in the slow-receiver fault (1500; 0: no such fault)",
    )
    parser.add_argument(
        "--workdir",
        type=Path,
        help="keep logs and the sink's records here (default: a temporary "
        "directory, removed unless the run fails)",
    )
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write a JSON summary")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    return parser


def config_from(args: argparse.Namespace) -> ChaosConfig:
    config = quick_config() if args.quick else ChaosConfig()
    changes = {
        "schedules": args.schedules,
        "nodes": args.nodes,
        "partitions": args.partitions,
        "lease_ttl_s": args.lease_ttl,
        "pg_down_s": args.pg_down,
        "slow_receiver_ms": args.slow_receiver_ms,
    }
    config = dataclasses.replace(config, **{k: v for k, v in changes.items() if v is not None})
    if config.nodes < 2 or config.schedules < 1:
        raise ValueError("a chaos run needs at least 2 nodes and 1 schedule")
    if not config.lease_safety_margin_s < config.lease_ttl_s / 3:
        config = dataclasses.replace(config, lease_safety_margin_s=config.lease_ttl_s / 5)
    minutes = args.minutes if args.minutes is not None or config.quick else 5.0
    return with_window(config, minutes)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # SIGTERM cleans up like Ctrl-C


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        config = config_from(args)
    except ValueError as exc:
        print(f"chaos: {exc}", file=sys.stderr)
        return 2
    from simulations.chaos.report import render, write_json
    from simulations.chaos.runner import run

    try:
        result = run(config, workdir=args.workdir, quiet=args.quiet)
    except KeyboardInterrupt:
        print("chaos: interrupted; everything started was stopped", file=sys.stderr)
        return 2
    except (RuntimeError, OSError) as exc:
        print(f"chaos: the run could not be carried out: {exc}", file=sys.stderr)
        return 2
    print(render(result))
    if args.json is not None:
        write_json(result, args.json)
    return 1 if result.violations else 0


if __name__ == "__main__":
    sys.exit(main())
