"""Every benchmark runs end to end in --quick mode (figures are not checked: machines are noisy).

The smoke runs mostly wait -- for a burst's instant, a lease to run out, the peer's
processes -- so they start together, when the first of these tests asks, and each test then
waits for its own. One after another they took about 2.5 minutes; together, about as long
as the slowest. Each benchmark makes its own databases, so they do not meet. Under
pytest-xdist (``make test``) they form one group, so one test process starts them, once.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

BENCHMARKS = sorted((Path(__file__).resolve().parents[1] / "benchmarks").glob("bench_*.py"))
SMOKE_TIMEOUT_S = 420.0
"""For all of them together, from their start."""


@dataclass(frozen=True)
class SmokeRun:
    process: subprocess.Popen[bytes]
    stdout: Path
    stderr: Path
    deadline: float


@pytest.fixture(scope="module")
def smoke_runs(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, SmokeRun]]:
    """The selected benchmarks' smoke runs, started together."""
    selected = {
        item.callspec.params["script"]
        for item in request.session.items
        if item.nodeid.startswith(request.node.nodeid) and hasattr(item, "callspec")
    }
    logs = tmp_path_factory.mktemp("bench-smoke")
    deadline = time.monotonic() + SMOKE_TIMEOUT_S
    runs: dict[str, SmokeRun] = {}
    try:
        for script in (script for script in BENCHMARKS if script in selected):
            stdout, stderr = logs / f"{script.stem}.out", logs / f"{script.stem}.err"
            # Files, not pipes: nobody reads a run's output until its test comes up.
            with stdout.open("wb") as out, stderr.open("wb") as err:
                process = subprocess.Popen(
                    [sys.executable, str(script), "--quick"], stdout=out, stderr=err
                )
            runs[script.stem] = SmokeRun(process, stdout, stderr, deadline)
        yield runs
    finally:
        for run in runs.values():
            if run.process.poll() is None:
                run.process.kill()
            run.process.wait()


@pytest.mark.xdist_group("benchmark-smoke")  # one test process starts them all, once
@pytest.mark.parametrize("script", BENCHMARKS, ids=lambda path: path.stem)
def test_benchmark_runs_in_quick_mode(script: Path, smoke_runs: dict[str, SmokeRun]) -> None:
    run = smoke_runs[script.stem]
    returncode = run.process.wait(timeout=max(run.deadline - time.monotonic(), 1.0))
    assert returncode == 0, run.stderr.read_text()
    assert run.stdout.read_text().strip()
