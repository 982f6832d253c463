"""Every benchmark runs end to end in --quick mode (figures are not checked: machines are noisy).

The smoke runs mostly wait -- for a burst's instant, a lease to run out, the peer's
processes -- so they run side by side, started when the first of these tests asks, and each
test then waits for its own. One after another they took about 2.5 minutes. At most
:data:`SMOKE_AT_ONCE` run at a time: with every one of them started at once, their
connections and the rest of the suite's passed the server's ``max_connections`` (100 here)
and runs failed with "too many clients". Each benchmark makes its own databases, so they do
not meet. Under pytest-xdist (``make test``) they form one group, so one test process starts
them, once.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

BENCHMARKS = sorted((Path(__file__).resolve().parents[1] / "benchmarks").glob("bench_*.py"))
SMOKE_TIMEOUT_S = 480.0
"""For all of them together, from their start."""
SMOKE_AT_ONCE = 4
"""Smoke runs in progress at a time (see the module docstring)."""


@dataclass
class SmokeRun:
    script: Path
    stdout: Path
    stderr: Path
    deadline: float
    process: subprocess.Popen[bytes] | None = None
    started: threading.Event = field(default_factory=threading.Event)


def launch(runs: list[SmokeRun], stop: threading.Event) -> None:
    """Start ``runs`` in order, at most :data:`SMOKE_AT_ONCE` at a time (a thread's work)."""
    for run in runs:
        while not stop.is_set():
            running = sum(1 for r in runs if r.process is not None and r.process.poll() is None)
            if running < SMOKE_AT_ONCE:
                break
            time.sleep(0.1)
        if stop.is_set():
            return
        # Files, not pipes: nobody reads a run's output until its test comes up.
        with run.stdout.open("wb") as out, run.stderr.open("wb") as err:
            run.process = subprocess.Popen(
                [sys.executable, str(run.script), "--quick"], stdout=out, stderr=err
            )
        run.started.set()


@pytest.fixture(scope="module")
def smoke_runs(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, SmokeRun]]:
    """The selected benchmarks' smoke runs, started side by side."""
    selected = {
        item.callspec.params["script"]
        for item in request.session.items
        if item.nodeid.startswith(request.node.nodeid) and hasattr(item, "callspec")
    }
    logs = tmp_path_factory.mktemp("bench-smoke")
    deadline = time.monotonic() + SMOKE_TIMEOUT_S
    runs = [
        SmokeRun(script, logs / f"{script.stem}.out", logs / f"{script.stem}.err", deadline)
        for script in BENCHMARKS
        if script in selected
    ]
    stop = threading.Event()
    launcher = threading.Thread(target=launch, args=(runs, stop), daemon=True)
    launcher.start()
    try:
        yield {run.script.stem: run for run in runs}
    finally:
        stop.set()
        launcher.join()
        for run in runs:
            if run.process is None:
                continue
            if run.process.poll() is None:
                run.process.kill()
            run.process.wait()


@pytest.mark.xdist_group("benchmark-smoke")  # one test process starts them all, once
@pytest.mark.parametrize("script", BENCHMARKS, ids=lambda path: path.stem)
def test_benchmark_runs_in_quick_mode(script: Path, smoke_runs: dict[str, SmokeRun]) -> None:
    run = smoke_runs[script.stem]
    assert run.started.wait(timeout=max(run.deadline - time.monotonic(), 1.0)), "never started"
    assert run.process is not None
    returncode = run.process.wait(timeout=max(run.deadline - time.monotonic(), 1.0))
    assert returncode == 0, run.stderr.read_text()
    assert run.stdout.read_text().strip()
