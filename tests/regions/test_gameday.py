"""The quick forced-failover game day (``python -m simulations.regions gameday --quick
--variant forced``) passes its checks.

A primary and its streaming hot standby, two ``carillon run --region a`` nodes on the primary,
one ``--region b`` node on the standby, 100 schedules every 10 s delivered to a webhook sink;
then the primary crashes inside a replication-lag window, the standby is promoted, ``carillon
region failover --to b`` runs, and the old primary is fenced and reopened (about 85 s). The
run checks itself (``docs/multi-region.md``); this test runs it as a separate process, as a
user would, and asserts on its JSON summary so that a failure names the check that failed.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from simulations.regions.replication import missing_prerequisites
from tests.processes import run_module

# About 80 s: run by `make gameday` (both variants, full size) and by `pytest -m slow`.
pytestmark = [pytest.mark.postgres, pytest.mark.slow]

MUST_PASS = (
    "missing: no succeeded execution",
    "missing: no delivery at the sink",
    "duplicate effects (of every key received)",
    "unexpected effects (no such fire)",
    "fires planned after the fault: delivered of expected",
    "duplicate deliveries planned outside the window",
    "RTO, planning: every partition held by region B",
    "RTO, delivering: first delivery by region B",
    "failover with the old primary down: exit 0, old primary",
    "failover again (old isolated): new unchanged, old fenced",
    "old primary: lease acquisitions/renewals after the fence",
    "old primary: execution writes after the fence",
    "region A requests later than the fence + attempt lease",
    "region A nodes standing by at the new epoch (/metrics)",
    "  with a token below the epoch's floor",
)


def _run_gameday(*args: str) -> subprocess.CompletedProcess[str]:
    return run_module("simulations.regions", "gameday", *args, what="the quick game day")


def test_forced_failover_delivers_every_fire_once_in_effect_and_fences_region_a(
    tmp_path: Path,
) -> None:
    missing = missing_prerequisites()
    if missing:
        pytest.skip(missing)
    summary_path = tmp_path / "summary.json"
    done = _run_gameday(
        "--quick", "--variant", "forced", "--quiet", "--json", str(summary_path),
        "--workdir", str(tmp_path / "work"),
    )  # fmt: skip
    assert summary_path.exists(), f"no summary (exit {done.returncode}):\n{done.stderr}"
    forced = json.loads(summary_path.read_text())["variants"]["forced"]
    verdicts = {figure["name"]: figure["ok"] for figure in forced["figures"]}
    for name in MUST_PASS:
        assert verdicts.get(name) is True, f"{name}: {verdicts.get(name)}\n{done.stdout}"
    assert forced["passed"], done.stdout
    assert done.returncode == 0, done.stdout + done.stderr
    values = {figure["name"]: figure["value"] for figure in forced["figures"]}
    # The crash met a burst inside the loss window: region B delivered it again, same keys.
    assert values["duplicate deliveries by source (token epoch)"].startswith("A then B"), (
        done.stdout
    )
    assert any("primary crashed" in what for _, what in forced["timeline"])
