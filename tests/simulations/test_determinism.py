"""The determinism canary: a seed is a run. Same seed, same trace hash; another seed, another.

If a trio upgrade changes its scheduling hook, or nondeterminism creeps into the engine (set
iteration, ambient time or randomness) or the simulator, these fail first.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from simulations.params import derive
from simulations.runner import run_simulation

ROOT = Path(__file__).resolve().parents[2]
DAYS = 0.01  # a quarter-hour safety phase: enough events, a second of wall time


def test_the_same_seed_gives_the_same_trace_and_another_seed_another() -> None:
    first = run_simulation(derive(7, "random", days=DAYS))
    again = run_simulation(derive(7, "random", days=DAYS))
    other = run_simulation(derive(8, "random", days=DAYS))
    assert first.events > 1000
    assert first.digest == again.digest
    assert first.events == again.events
    assert other.digest != first.digest


def test_a_seed_replays_identically_in_another_process_with_another_hash_seed() -> None:
    here = run_simulation(derive(7, "random", days=DAYS))
    environment = {**os.environ, "PYTHONHASHSEED": "12345"}
    completed = subprocess.run(
        [sys.executable, "-m", "simulations", "run", "--seed", "7", "--days", str(DAYS)],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert f"hash {here.digest}" in completed.stdout, completed.stdout[-2000:]
    assert completed.stdout.startswith("seed 7  scenario random")  # parameters come first
