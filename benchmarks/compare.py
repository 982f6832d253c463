"""Revisions side by side: one burst run per revision, in alternation, on the same machine.

A machine shared with others drifts by 10-15 % over half an hour, so two revisions measured
one after the other -- or each against a third, at different times -- differ by more than
most changes do. This runs each revision's own ``bench_burst.py`` from a git worktree of it
(its engine on ``PYTHONPATH``), one run at a time, in ABBA order (the first revision first in
even rounds, last in odd ones), so that a drift weighs on every revision alike, and reports
for each revision its runs, their median, and the median of its per-round ratio to the first
revision: the figure to quote.

Usage: python benchmarks/compare.py [--rounds N] [--schedules N] [--workers W] [--no-docs]
                                    [--instructions SMALL,LARGE] REVISION REVISION [...]

A revision is anything ``git rev-parse`` takes, or ``.`` for the working tree as it is
(uncommitted changes included). Runs are ``bench_burst --runs 1 --workers W --rate 0
--nodes "" --no-ceiling --no-docs``; unless ``--no-docs``, the table replaces the
``bench_compare`` section of ``docs/benchmarks.md``. ``make bench-compare REVS="a b"``.

**Instructions instead of time** (``--instructions SMALL,LARGE``, ``make bench-instructions``):
on a machine shared with others even ABBA rounds scatter by 10-20 % (CPU steal, frequency), more
than a change of a few microseconds an execution. Instructions do not: each revision's burst
runs under ``valgrind --tool=cachegrind`` at SMALL and at LARGE schedules, and the instructions
the node process (node, bridge, the benchmark's own setup and poller) executed per execution is
the difference of the two counts over the difference of the sizes -- the set-up both runs share
(imports, database creation, the node's start) cancels out. One round by default: a run's
batching still depends on timing, so the count is steady only on a machine that is otherwise
idle (about 2 % between runs of one revision here); while other work loaded the machine, the
same revision counted from 727k to 890k and unchanged revisions scattered by 20 % (2026-12-03).
PostgreSQL's instructions are not counted (its processes are not under valgrind), nor is the
kernel's work for the node's system calls.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._report import ROOT, machine, write_section

RUN_TIMEOUT_S: Final = 900.0
INSTRUCTION_SIZES_DEFAULT: Final = "3000,9000"
"""Schedules of the two counted bursts: about 2 and 4 minutes under valgrind on 2 cores."""
_INSTRUCTIONS = re.compile(r"I\s+refs:\s+(?P<count>[\d,]+)")
"""One burst run, schedules created to figures read: about 2 minutes at 200,000."""
FIGURES: Final = {
    "executions/s end to end": "rate",
    "CPU per execution after T, node process (µs)": "node_us",
    "CPU per execution after T, PostgreSQL (µs)": "server_us",
    "duplicates": "duplicates",
}
"""Rows of bench_burst's table read from each run (first column), and their names here."""
_ROW = re.compile(r"^\|\s*(?P<name>[^|]+?)\s*\|\s*(?P<value>[^|]*?)\s*\|")


class CompareError(Exception):
    """A revision could not be checked out or run; the message says which and why."""


@dataclass(frozen=True)
class Revision:
    name: str
    """As given on the command line."""
    sha: str
    """Short commit id, ``+dirty`` for the working tree with changes."""
    subject: str


def parse_figures(output: str) -> dict[str, float]:
    """The figures of one bench_burst run from its printed table (its first value column)."""
    figures: dict[str, float] = {}
    for line in output.splitlines():
        match = _ROW.match(line)
        if match and match["name"] in FIGURES:
            number = match["value"].split(" ", 1)[0].replace(",", "")
            try:
                figures[FIGURES[match["name"]]] = float(number)
            except ValueError:
                continue
    if "rate" not in figures:
        raise CompareError("no 'executions/s end to end' row in the benchmark's output")
    return figures


def run_order(count: int, rounds: int) -> Iterator[tuple[int, int]]:
    """(round, revision index) in ABBA order: forwards in even rounds, backwards in odd."""
    for round_ in range(rounds):
        indexes = range(count) if round_ % 2 == 0 else range(count - 1, -1, -1)
        for index in indexes:
            yield round_, index


def _git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise CompareError(f"git {' '.join(args)}: {done.stderr.strip() or done.returncode}")
    return done.stdout.strip()


def resolve(repo: Path, name: str) -> Revision:
    if name == ".":
        sha = _git(repo, "rev-parse", "--short", "HEAD")
        dirty = _git(repo, "status", "--porcelain", "--untracked-files=no")
        return Revision(name, sha + ("+dirty" if dirty else ""), "the working tree")
    sha = _git(repo, "rev-parse", "--short", "--verify", f"{name}^{{commit}}")
    return Revision(name, sha, _git(repo, "log", "-1", "--format=%s", sha))


@contextmanager
def checkouts(repo: Path, revisions: Sequence[Revision]) -> Iterator[list[Path]]:
    """A directory per revision holding its tree: a detached worktree, removed afterwards
    (the working tree itself for ``.``)."""
    with tempfile.TemporaryDirectory(prefix="carillon-compare-") as scratch:
        paths: list[Path] = []
        try:
            for index, revision in enumerate(revisions):
                if revision.name == ".":
                    paths.append(repo)
                    continue
                path = Path(scratch) / f"{index}-{revision.sha}"
                _git(repo, "worktree", "add", "--detach", str(path), revision.sha)
                paths.append(path)
            yield paths
        finally:
            for path in paths:
                if path != repo:
                    subprocess.run(
                        ["git", "worktree", "remove", "--force", str(path)],
                        cwd=repo,
                        capture_output=True,
                        check=False,
                    )


def burst_command(schedules: int, workers: int) -> list[str]:
    return [
        *("benchmarks/bench_burst.py", "--runs", "1", "--workers", str(workers)),
        *("--rate", "0", "--nodes", "", "--no-ceiling", "--no-docs"),
        *("--schedules", str(schedules)),
    ]


def run_in(tree: Path, command: Sequence[str], *, wrapper: Sequence[str] = ()) -> dict[str, float]:
    """One run of ``command`` (a script and its arguments) with ``tree``'s code, under
    ``wrapper`` (e.g. valgrind) when given."""
    return parse_figures(_run(tree, command, wrapper).stdout)


def _run(
    tree: Path, command: Sequence[str], wrapper: Sequence[str]
) -> subprocess.CompletedProcess[str]:
    env = os.environ | {"PYTHONPATH": str(tree)}
    try:
        done = subprocess.run(
            [*wrapper, sys.executable, *command],
            cwd=tree,
            env=env,
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise CompareError(f"{tree.name}: no result within {RUN_TIMEOUT_S:.0f} s") from exc
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-5:])
        raise CompareError(f"{tree.name}: the benchmark exited {done.returncode}:\n{tail}")
    return done


def counted_command(valgrind: str) -> list[str]:
    """The wrapper that counts a run's instructions (no cache simulation: a count only)."""
    return [valgrind, "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null"]


def instructions_in(
    tree: Path,
    command_for: Callable[[int], Sequence[str]],
    sizes: tuple[int, int],
    valgrind: str = "valgrind",
) -> dict[str, float]:
    """Instructions per execution of ``tree``'s burst: the counts of runs at both ``sizes``,
    their difference over the sizes' difference (see the module docstring). A run with a
    duplicate is an error, not a figure."""
    small, large = sizes
    if not 0 < small < large:
        raise CompareError(f"the sizes must be 0 < SMALL < LARGE, not {small},{large}")
    counts: list[int] = []
    for size in sizes:
        done = _run(tree, command_for(size), counted_command(valgrind))
        figures = parse_figures(done.stdout)
        if figures.get("duplicates", 0):
            raise CompareError(f"{tree.name}: {figures['duplicates']:.0f} duplicates at {size:,}")
        found = _INSTRUCTIONS.findall(done.stderr)
        if not found:
            raise CompareError(f"{tree.name}: no 'I refs' count in valgrind's output")
        counts.append(int(found[-1].replace(",", "")))
    return {"instructions": (counts[1] - counts[0]) / (large - small)}


@dataclass(frozen=True)
class Comparison:
    revisions: list[Revision]
    runs: list[list[dict[str, float]]]
    """Per revision, its runs' figures by round."""


def compare(
    repo: Path,
    names: Sequence[str],
    rounds: int,
    run: Callable[[Path], dict[str, float]],
    progress: Callable[[str], None] = lambda line: None,
) -> Comparison:
    revisions = [resolve(repo, name) for name in names]
    runs: list[list[dict[str, float]]] = [[{} for _ in range(rounds)] for _ in revisions]
    with checkouts(repo, revisions) as trees:
        for round_, index in run_order(len(revisions), rounds):
            figures = run(trees[index])
            runs[index][round_] = figures
            shown = (
                f"{figures['rate']:,.0f}/s"
                if "rate" in figures
                else f"{figures['instructions'] / 1000:,.1f}k instructions per execution"
            )
            progress(f"round {round_ + 1} {revisions[index].sha}: {shown}")
    return Comparison(revisions, runs)


def _median(runs: Sequence[dict[str, float]], key: str) -> float | None:
    values = [figures[key] for figures in runs if key in figures]
    return statistics.median(values) if values else None


def ratios(comparison: Comparison, index: int, key: str = "rate") -> list[float]:
    """Revision ``index``'s figure ``key`` over the first revision's, round by round."""
    return [
        mine[key] / base[key]
        for mine, base in zip(comparison.runs[index], comparison.runs[0], strict=True)
    ]


def report_instructions(comparison: Comparison, *, sizes: tuple[int, int], workers: int) -> str:
    first = comparison.revisions[0].sha
    rounds = len(comparison.runs[0])
    lines = [
        "## Revisions side by side, in instructions (`benchmarks/compare.py --instructions`)",
        "",
        f"Machine: {machine()}; {datetime.now(UTC):%Y-%m-%d %H:%M} UTC; {rounds} round(s) in "
        f"ABBA order; each revision's own `bench_burst.py` (`noop`, one node, {workers} "
        "workers, smoothing off) under `valgrind --tool=cachegrind` at "
        f"{sizes[0]:,} and {sizes[1]:,} schedules: instructions of the node process per "
        "execution = the difference of the two counts over the difference of the sizes "
        "(PostgreSQL and the kernel not counted). A count varies by about 2 % between runs of "
        "one revision on an otherwise idle machine, and by up to 20 % while other work loads "
        "it (a burst's batching depends on timing); lower is better, and the ratio is to "
        f"{first}.",
        "",
        f"| revision | instructions per execution by round | median | vs {first} |",
        "|---|---|---:|---:|",
    ]
    for index, revision in enumerate(comparison.revisions):
        runs = comparison.runs[index]
        by_round = " / ".join(f"{figures['instructions'] / 1000:,.1f}k" for figures in runs)
        median = _median(runs, "instructions") or 0.0
        ratio = statistics.median(ratios(comparison, index, "instructions"))
        label = f"{revision.sha} {revision.subject.replace('|', '/')}"
        lines.append(f"| {label} | {by_round} | {median / 1000:,.1f}k | {ratio:.3f} |")
    return "\n".join(lines) + "\n"


def report(comparison: Comparison, *, schedules: int, workers: int) -> str:
    first = comparison.revisions[0].sha
    rounds = len(comparison.runs[0])
    lines = [
        "## Revisions side by side (`benchmarks/compare.py`)",
        "",
        f"Machine: {machine()}; {datetime.now(UTC):%Y-%m-%d %H:%M} UTC; {rounds} rounds, one "
        f"burst run per revision per round in ABBA order; {schedules:,} `noop` schedules, "
        f"one node, {workers} workers, smoothing off, no raw ceiling. Each revision ran its "
        "own `bench_burst.py` from a git worktree. The ratio is the median of the per-round "
        f"ratios to {first}: the runs of a round are minutes apart, so a drift of the "
        "machine's speed over the whole comparison mostly cancels out of it.",
        "",
        f"| revision | executions/s by round | median | vs {first} | CPU µs node + PostgreSQL "
        "| duplicates |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for index, revision in enumerate(comparison.revisions):
        runs = comparison.runs[index]
        node, server = _median(runs, "node_us"), _median(runs, "server_us")
        cpu = "" if node is None or server is None else f"{node:.0f} + {server:.0f}"
        duplicates = sum(int(figures.get("duplicates", 0)) for figures in runs)
        by_round = " / ".join(f"{figures['rate']:,.0f}" for figures in runs)
        rate = _median(runs, "rate") or 0.0
        ratio = statistics.median(ratios(comparison, index))
        label = f"{revision.sha} {revision.subject.replace('|', '/')}"
        lines.append(f"| {label} | {by_round} | {rate:,.0f} | {ratio:.3f} | {cpu} | {duplicates} |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("revisions", nargs="+", help="git revisions, or . for the working tree")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--schedules", type=int, default=200_000)
    parser.add_argument("--workers", type=int, default=32)
    parser.add_argument("--no-docs", action="store_true", help="print only")
    parser.add_argument(
        "--instructions",
        metavar="SMALL,LARGE",
        help=f"count instructions per execution under valgrind (e.g. {INSTRUCTION_SIZES_DEFAULT})",
    )
    parser.add_argument("--valgrind", default="valgrind", help="the valgrind executable")
    args = parser.parse_args(argv)
    if len(args.revisions) < 2 or args.rounds < 1:
        parser.error("give at least two revisions and one round")
    sizes: tuple[int, int] | None = None
    if args.instructions is not None:
        try:
            small, large = (int(part) for part in args.instructions.split(","))
        except ValueError:
            parser.error("--instructions takes two schedule counts, SMALL,LARGE")
        sizes = (small, large)
        if shutil.which(args.valgrind) is None:
            print(
                f"compare: {args.valgrind!r} not found (Debian: apt install valgrind)",
                file=sys.stderr,
            )
            return 1
    workers = args.workers

    def run(tree: Path) -> dict[str, float]:
        if sizes is None:
            return run_in(tree, burst_command(args.schedules, workers))
        return instructions_in(
            tree, lambda size: burst_command(size, workers), sizes, args.valgrind
        )

    try:
        comparison = compare(
            ROOT, args.revisions, args.rounds, run, progress=lambda line: print(line, flush=True)
        )
    except CompareError as exc:
        print(f"compare: {exc}", file=sys.stderr)
        return 1
    if sizes is None:
        text = report(comparison, schedules=args.schedules, workers=workers)
        section = "bench_compare"
    else:
        text = report_instructions(comparison, sizes=sizes, workers=workers)
        section = "bench_instructions"
    print(text)
    if not args.no_docs:
        write_section(section, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
