"""Many seeds at once, in worker processes, and the seed file format.

A seed file (``simulations/seeds.txt``) has one run per line: the seed, optionally the
options that shaped it, and a comment naming what it found::

    1234 --scenario zombie --nodes 2   # planner wrote after its trust window (fixed in ...)

Each worker process runs seeds one after another (a process per seed would spend most of
its time importing). Results come back as small records; a failure names the command that
reproduces it.
"""

from __future__ import annotations

import multiprocessing
import shlex
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from simulations.params import derive
from simulations.runner import run_simulation


@dataclass(frozen=True)
class Job:
    seed: int
    scenario: str = "random"
    nodes: int | None = None
    days: float | None = None
    note: str = ""

    def command(self) -> str:
        parts = [f"python -m simulations run --seed {self.seed} --scenario {self.scenario}"]
        if self.nodes is not None:
            parts.append(f"--nodes {self.nodes}")
        if self.days is not None:
            parts.append(f"--days {self.days:g}")
        return " ".join(parts)


@dataclass(frozen=True)
class Outcome:
    job: Job
    ok: bool
    violations: tuple[str, ...]
    node_hours: float
    wall_s: float
    digest: str


@dataclass
class SweepResult:
    outcomes: list[Outcome] = field(default_factory=list)
    wall_s: float = 0.0

    @property
    def failures(self) -> list[Outcome]:
        return [o for o in self.outcomes if not o.ok]

    def lines(self) -> list[str]:
        node_hours = sum(o.node_hours for o in self.outcomes)
        out = [
            f"{len(self.outcomes)} seeds, {len(self.failures)} failing, {node_hours:.0f} "
            f"simulated node-hours in {self.wall_s:.1f}s wall "
            f"({node_hours / max(self.wall_s, 1e-9):.1f} node-hours per wall-second)"
        ]
        for o in sorted(self.failures, key=lambda o: o.job.seed):
            out.append(f"FAIL seed {o.job.seed}: {o.job.command()}")
            out += [f"    {v}" for v in o.violations[:3]]
        return out


def parse_seeds(text: str) -> list[int]:
    """``"1..500"`` (inclusive) or ``"3,7,9"``."""
    if ".." in text:
        first, last = text.split("..")
        return list(range(int(first), int(last) + 1))
    return [int(part) for part in text.split(",") if part.strip()]


def parse_seed_file(path: str | Path) -> list[Job]:
    jobs = []
    for raw in Path(path).read_text().splitlines():
        line, _, note = raw.partition("#")
        words = shlex.split(line)
        if not words:
            continue
        if len(words) % 2 == 0:
            raise ValueError(f"{path}: every option needs a value: {raw!r}")
        options = dict(zip(words[1::2], words[2::2], strict=True))
        jobs.append(
            Job(
                seed=int(words[0]),
                scenario=options.get("--scenario", "random"),
                nodes=int(options["--nodes"]) if "--nodes" in options else None,
                days=float(options["--days"]) if "--days" in options else None,
                note=note.strip(),
            )
        )
    return jobs


def run_job(job: Job) -> Outcome:
    """Run one seed; a simulator error is a failure of that seed, not of the sweep."""
    try:
        params = derive(job.seed, job.scenario, nodes=job.nodes, days=job.days)
        result = run_simulation(params)
    except Exception as exc:
        return Outcome(job, False, (f"simulator error: {exc!r}",), 0.0, 0.0, "")
    return Outcome(
        job,
        result.ok,
        tuple(result.violations[:10]),
        result.node_hours,
        result.wall_s,
        result.digest,
    )


def _outcomes(jobs: list[Job], processes: int) -> Iterator[Outcome]:
    if processes <= 1:
        yield from map(run_job, jobs)
        return
    context = multiprocessing.get_context("spawn")  # a fresh interpreter: no state carried over
    with context.Pool(processes) as pool:
        yield from pool.imap_unordered(run_job, jobs)


def sweep(jobs: list[Job], *, processes: int = 1, progress: TextIO | None = None) -> SweepResult:
    result = SweepResult()
    started = time.perf_counter()
    for outcome in _outcomes(jobs, processes):
        result.outcomes.append(outcome)
        if progress is not None and not outcome.ok:
            progress.write(f"seed {outcome.job.seed} FAILED: {outcome.violations[:1]}\n")
            progress.flush()
    result.wall_s = time.perf_counter() - started
    return result
