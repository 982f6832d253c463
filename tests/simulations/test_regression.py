"""Every seed that ever failed (``simulations/seeds.txt``), and a small fixed sweep.

A seed file line names the bug its seed found; the run must pass now. The sweep covers a
fixed range of fresh seeds under the ``random`` scenario. Both run in two worker processes
and fit in about a minute on a 2-core machine; ``-m slow`` runs thousands (``make sim-long``).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from simulations.sweep import Job, SweepResult, parse_seed_file, sweep

ROOT = Path(__file__).resolve().parents[2]
SEED_FILE = ROOT / "simulations" / "seeds.txt"
SWEEP_SEEDS = range(10_001, 10_009)
LONG_SEEDS = range(1, 2_001)
PROCESSES = 2


def _report(result: SweepResult) -> str:
    return "\n".join(result.lines())


def test_every_seed_that_ever_failed_passes_now() -> None:
    jobs = parse_seed_file(SEED_FILE)
    assert jobs, "simulations/seeds.txt lists no seed"
    assert all(job.note for job in jobs), "every seed names what it found"
    result = sweep(jobs, processes=PROCESSES)
    assert result.failures == [], _report(result)


def test_a_small_sweep_of_fresh_seeds_passes() -> None:
    result = sweep([Job(seed) for seed in SWEEP_SEEDS], processes=PROCESSES)
    assert result.failures == [], _report(result)
    print(_report(result))


@pytest.mark.slow
def test_thousands_of_seeds_pass() -> None:
    jobs = [Job(seed) for seed in LONG_SEEDS]
    result = sweep(jobs, processes=os.cpu_count() or PROCESSES)
    print(_report(result))
    assert result.failures == [], _report(result)
