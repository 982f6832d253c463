"""Revisions side by side: one burst run per revision, in alternation, on the same machine.

A machine shared with others drifts by 10-15 % over half an hour, so two revisions measured
one after the other -- or each against a third, at different times -- differ by more than
most changes do. This runs each revision's own ``bench_burst.py`` from a git worktree of it
(its engine on ``PYTHONPATH``), one run at a time, in ABBA order (the first revision first in
even rounds, last in odd ones), so that a drift weighs on every revision alike, and reports
for each revision its runs, their median, and the median of its per-round ratio to the first
revision: the figure to quote.

Usage: python benchmarks/compare.py [--rounds N] [--schedules N] [--workers W] [--no-docs]
                                    REVISION REVISION [...]

A revision is anything ``git rev-parse`` takes, or ``.`` for the working tree as it is
(uncommitted changes included). Runs are ``bench_burst --runs 1 --workers W --rate 0
--nodes "" --no-ceiling --no-docs``; unless ``--no-docs``, the table replaces the
``bench_compare`` section of ``docs/benchmarks.md``. ``make bench-compare REVS="a b"``.
"""

from __future__ import annotations

import argparse
import os
import re
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


def run_in(tree: Path, command: Sequence[str]) -> dict[str, float]:
    """One run of ``command`` (a script and its arguments) with ``tree``'s code."""
    env = os.environ | {"PYTHONPATH": str(tree)}
    try:
        done = subprocess.run(
            [sys.executable, *command],
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
    return parse_figures(done.stdout)


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
            progress(f"round {round_ + 1} {revisions[index].sha}: {figures['rate']:,.0f}/s")
    return Comparison(revisions, runs)


def _median(runs: Sequence[dict[str, float]], key: str) -> float | None:
    values = [figures[key] for figures in runs if key in figures]
    return statistics.median(values) if values else None


def ratios(comparison: Comparison, index: int) -> list[float]:
    """Revision ``index``'s rate over the first revision's, round by round."""
    return [
        mine["rate"] / base["rate"]
        for mine, base in zip(comparison.runs[index], comparison.runs[0], strict=True)
    ]


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
    args = parser.parse_args(argv)
    if len(args.revisions) < 2 or args.rounds < 1:
        parser.error("give at least two revisions and one round")
    command = burst_command(args.schedules, args.workers)
    try:
        comparison = compare(
            ROOT,
            args.revisions,
            args.rounds,
            lambda tree: run_in(tree, command),
            progress=lambda line: print(line, flush=True),
        )
    except CompareError as exc:
        print(f"compare: {exc}", file=sys.stderr)
        return 1
    text = report(comparison, schedules=args.schedules, workers=args.workers)
    print(text)
    if not args.no_docs:
        write_section("bench_compare", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
