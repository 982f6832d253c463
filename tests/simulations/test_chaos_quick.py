"""The short real-process chaos run (``python -m simulations.chaos --quick``) passes its checks.

Three ``carillon run`` processes, a private PostgreSQL and a webhook sink; 100 schedules every
10 s; one SIGKILL, one SIGSTOP past the lease, one PostgreSQL restart (about 80 s). The run
checks itself (``docs/chaos.md``); this test runs it as a separate process, as a user would,
and asserts on its JSON summary so that a failure names the check that failed.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.processes import run_module

pytestmark = pytest.mark.postgres

MUST_PASS = (
    "missing: no succeeded execution",
    "missing: no delivery at the sink",
    "duplicate effects (of every key received)",
    "handlers started after their attempt lease ran out",
    "late requests of the frozen node (begun before)",
    "unexpected effects (no such fire)",
    "early starts (first delivery before planned)",
    "start delay max (first delivery - planned)",
    "writes outside their lease",
    "writes naming no lease",
    "zombie: partitions taken over during the pause",
    "zombie: stale writes accepted",
    "zombie: completions accepted after takeover",
    "zombie: lease losses counted after SIGCONT",
)


def _run_chaos(*args: str) -> subprocess.CompletedProcess[str]:
    return run_module("simulations.chaos", *args, what="the quick chaos run")


def test_quick_chaos_run_has_no_duplicate_effect_miss_late_start_or_accepted_stale_write(
    tmp_path: Path,
) -> None:
    summary_path = tmp_path / "summary.json"
    done = _run_chaos(
        "--quick", "--quiet", "--json", str(summary_path), "--workdir", str(tmp_path / "work")
    )
    assert summary_path.exists(), f"no summary (exit {done.returncode}):\n{done.stderr}"
    summary = json.loads(summary_path.read_text())
    verdicts = {figure["name"]: figure["ok"] for figure in summary["figures"]}
    for name in MUST_PASS:
        assert verdicts.get(name) is True, f"{name}: {verdicts.get(name)}\n{done.stdout}"
    assert summary["passed"], done.stdout
    assert done.returncode == 0, done.stdout + done.stderr
    effects = summary["details"]["fires"]
    assert effects["effects"] == effects["expected"] > 0
    # The faults really happened: the zombie lost what it held, the database went away.
    assert summary["details"]["zombie"]["held_at_stop"], done.stdout
    assert any("PostgreSQL accepts connections again" in what for _, what in summary["timeline"])
    assert any(what.startswith("SIGKILL") for _, what in summary["timeline"])
