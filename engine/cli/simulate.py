"""``carillon simulate``: run the deterministic simulator over a user's own schedule set.

It shows a schedule set's behaviour before it is deployed: what fires when, which fires DST
moves, drops or doubles, where the bursts are, and whether the engine kept its promises
under the chosen faults (``docs/simulation.md``, "For users"). It needs neither a database
nor a node.

The simulator is the ``simulations`` package, which the engine itself never imports; this
command imports it only when it runs (``tests/test_layering.py`` allows this one module to,
inside a function), so ``carillon`` starts as fast as before and the layering holds.
"""

from __future__ import annotations

import argparse
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from engine.cli.client import CommandFailed
from engine.cli.flags import positive
from engine.clock import SystemClock
from engine.core.instants import parse_instant

FORMATS: Final = ("auto", "json", "crontab")
_EPILOG: Final = """\
Faults (comma-separated, default none): crash, zombie, skew, outage, commit-unknown,
redelivery, rebalance, dst. Exit status: 0 when no checker found a violation; 1 when one
did; 2 for bad input (an unreadable or invalid schedule file, a bad option, a run over the
size limits). The report ends with the command that repeats the run exactly."""


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "simulate",
        help="simulate a schedule set on a simulated cluster, with faults (no database)",
        description="Run your schedules (JSON as for POST /v1/schedules, or a crontab) on "
        "simulated nodes for some days, and report what fired when, DST moves, bursts and "
        "any violation of the engine's guarantees.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--schedules", required=True, metavar="FILE", help="the schedule set; - for stdin"
    )
    parser.add_argument(
        "--days",
        type=float,
        default=7.0,
        metavar="D",
        help="days to simulate, may be fractional [7]",
    )
    parser.add_argument("--faults", default="none", metavar="LIST", help="fault kinds [none]")
    parser.add_argument("--nodes", type=positive, default=3, metavar="K", help="nodes [3]")
    parser.add_argument(
        "--seed", type=int, default=1, metavar="N", help="draws the cluster and faults [1]"
    )
    parser.add_argument(
        "--start",
        metavar="INSTANT",
        help="when the window starts, with an offset (default: the next whole hour)",
    )
    parser.add_argument("--format", choices=FORMATS, default="auto", help="input format [auto]")
    parser.add_argument(
        "--tz", default="UTC", metavar="ZONE", help="crontab zone of lines without CRON_TZ [UTC]"
    )
    parser.add_argument(
        "-o", "--output", choices=("table", "json"), default="table", help="report format [table]"
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    start = (
        parse_instant(args.start, field="--start")
        if args.start is not None
        else next_whole_hour(SystemClock().now())
    )
    try:
        from simulations.user.command import simulate  # only now: see the module docstring
    except ImportError as exc:
        raise CommandFailed(
            f"carillon simulate needs the simulations package, which this installation lacks "
            f"({exc})"
        ) from None
    return simulate(
        path=args.schedules,
        days=args.days,
        faults=args.faults,
        nodes=args.nodes,
        seed=args.seed,
        start=start,
        input_format=args.format,
        tz=args.tz,
        output=args.output,
    )


def next_whole_hour(now: datetime) -> datetime:
    """The first whole hour (UTC) after ``now``."""
    return now.astimezone(UTC).replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)
