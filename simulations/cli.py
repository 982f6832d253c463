"""``python -m simulations``: run one seed, or sweep many.

::

    python -m simulations run --seed 42 [--scenario random] [--nodes 3] [--days 0.1]
                                        [--trace FILE]
    python -m simulations sweep --seeds 1..500 [--jobs 2] [--scenario random] ...
    python -m simulations sweep --file simulations/seeds.txt

``run`` prints the seed and every derived parameter first, then the summary, and exits 1 on
any violation. ``sweep`` runs the seeds in worker processes and lists the failing ones with
the command that reproduces each.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from simulations.params import derive
from simulations.runner import run_simulation, summary
from simulations.scenarios import SCENARIOS
from simulations.sweep import Job, parse_seed_file, parse_seeds, sweep


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--scenario", default="random", choices=sorted(SCENARIOS))
    parser.add_argument("--nodes", type=int, default=None, help="initial nodes (default: drawn)")
    parser.add_argument(
        "--days", type=float, default=None, help="length of the safety phase (default: drawn)"
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m simulations", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run one seed and check it")
    run.add_argument("--seed", type=int, required=True)
    _common(run)
    run.add_argument("--trace", default=None, help="write every trace event to this file")
    run.add_argument("--tail", type=int, default=0, help="print the last N trace events")
    many = commands.add_parser("sweep", help="run many seeds; list the failing ones")
    group = many.add_mutually_exclusive_group(required=True)
    group.add_argument("--seeds", help="a range A..B (inclusive) or a list 1,5,9")
    group.add_argument("--file", help="a seed file (one seed and its options per line)")
    many.add_argument("--jobs", type=int, default=1, help="worker processes")
    _common(many)
    return parser


def _run(args: argparse.Namespace) -> int:
    params = derive(args.seed, args.scenario, nodes=args.nodes, days=args.days)
    for line in params.lines():
        print(line)
    print(flush=True)
    if args.trace:
        with open(args.trace, "w") as trace_file:
            result = run_simulation(params, trace_file=trace_file)
    else:
        result = run_simulation(params)
    if args.tail:
        print(f"last {args.tail} trace events:")
        for line in result.tail[-args.tail :]:
            print(f"  {line}")
    for line in summary(result):
        print(line)
    return 0 if result.ok else 1


def _sweep(args: argparse.Namespace) -> int:
    if args.file:
        jobs = parse_seed_file(args.file)
    else:
        jobs = [Job(seed, args.scenario, args.nodes, args.days) for seed in parse_seeds(args.seeds)]
    outcome = sweep(jobs, processes=args.jobs, progress=sys.stdout)
    for line in outcome.lines():
        print(line)
    return 0 if not outcome.failures else 1


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "run":
        return _run(args)
    return _sweep(args)
