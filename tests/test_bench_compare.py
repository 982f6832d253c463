"""``benchmarks/compare.py``: revisions measured side by side, each from its own checkout.

The real tool runs a two-minute burst per run; here the runs are a script of a throwaway git
repository (or a function), so that what is checked is the tool's own part: which tree each
run sees, the ABBA order, the figures read back, the ratios and that no worktree is left.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import compare
from benchmarks._report import ROOT

BURST_OUTPUT = """\
## Burst execution (`benchmarks/bench_burst.py`)

| figure | 32 workers, smoothing off |
|---|---:|
| lead before T (s) | 5.59 |
| executions/s end to end | 11,865 |
| start delay p50 (s) | 8.61 |
| CPU per execution after T, node process (µs) | 69 |
| CPU per execution after T, PostgreSQL (µs) | 59 |
| executions/s the cores allow at that CPU cost | 15,643 |
| duplicates | 0 |
"""

FAKE_BENCH = """\
import os, sys
from pathlib import Path
here = Path(__file__).resolve().parents[1]
assert os.environ["PYTHONPATH"] == str(here), "the run must see its own tree's code"
rate = (here / "rate.txt").read_text().strip()
if rate == "fail":
    print("the database went away", file=sys.stderr)
    sys.exit(3)
print("| figure | x |")
print(f"| executions/s end to end | {rate} |")
print("| duplicates | 0 |")
"""


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args],
        cwd=repo,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A repository with two commits: the burst runs 1,000/s at the first, 1,100/s at the
    second."""
    repo = tmp_path / "repo"
    (repo / "benchmarks").mkdir(parents=True)
    git(repo, "init", "-q")
    (repo / "benchmarks" / "bench_burst.py").write_text(FAKE_BENCH)
    for rate, subject in (("1,000", "slow"), ("1,100", "fast | leaner")):
        (repo / "rate.txt").write_text(rate)
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", subject)
    return repo


def run_fake(tree: Path) -> dict[str, float]:
    return compare.run_in(tree, ["benchmarks/bench_burst.py"])


def worktrees(repo: Path) -> list[str]:
    return [line for line in git(repo, "worktree", "list").splitlines() if line]


def test_the_figures_of_a_burst_run_are_read_from_its_table() -> None:
    assert compare.parse_figures(BURST_OUTPUT) == {
        "rate": 11_865.0,
        "node_us": 69.0,
        "server_us": 59.0,
        "duplicates": 0.0,
    }


def test_output_without_a_rate_is_an_error_not_a_zero() -> None:
    with pytest.raises(compare.CompareError, match="executions/s end to end"):
        compare.parse_figures("| figure | x |\n| duplicates | 0 |\n")


def test_rounds_alternate_abba_so_a_drift_weighs_on_every_revision_alike() -> None:
    assert list(compare.run_order(2, 4)) == [
        (0, 0), (0, 1), (1, 1), (1, 0), (2, 0), (2, 1), (3, 1), (3, 0)
    ]  # fmt: skip
    assert [index for _, index in compare.run_order(3, 2)] == [0, 1, 2, 2, 1, 0]


def test_each_revision_runs_its_own_code_and_the_worktrees_are_removed(repo: Path) -> None:
    before = worktrees(repo)
    lines: list[str] = []
    result = compare.compare(repo, ["HEAD~1", "HEAD"], 3, run_fake, progress=lines.append)

    assert [figures["rate"] for figures in result.runs[0]] == [1000.0] * 3
    assert [figures["rate"] for figures in result.runs[1]] == [1100.0] * 3
    assert compare.ratios(result, 1) == pytest.approx([1.1] * 3)
    abba = ((1, 0), (1, 1), (2, 1), (2, 0), (3, 0), (3, 1))
    assert [line.split(":")[0] for line in lines] == [
        f"round {r} {result.revisions[i].sha}" for r, i in abba
    ]
    assert worktrees(repo) == before

    text = compare.report(result, schedules=1_000, workers=4)
    first, second = (line for line in text.splitlines() if " slow |" in line or " fast" in line)
    assert "1,000 / 1,000 / 1,000 | 1,000 | 1.000" in first
    assert "fast / leaner" in second  # a | in a subject would break the table
    assert "1,100 | 1.100" in second


def test_the_working_tree_runs_as_it_is_uncommitted_changes_included(repo: Path) -> None:
    (repo / "rate.txt").write_text("1,210")
    result = compare.compare(repo, ["HEAD", "."], 1, run_fake)
    assert result.revisions[1].sha.endswith("+dirty")
    assert result.runs[1][0]["rate"] == 1210.0
    assert compare.ratios(result, 1) == pytest.approx([1.1])


def test_a_failing_run_names_its_exit_status_and_leaves_no_worktree(repo: Path) -> None:
    (repo / "rate.txt").write_text("fail")
    git(repo, "commit", "-q", "-am", "broken")
    before = worktrees(repo)
    with pytest.raises(compare.CompareError, match="exited 3") as caught:
        compare.compare(repo, ["HEAD~1", "HEAD"], 1, run_fake)
    assert "the database went away" in str(caught.value)
    assert worktrees(repo) == before


def test_an_unknown_revision_is_a_message_and_exit_status_not_a_traceback() -> None:
    done = subprocess.run(
        [sys.executable, "benchmarks/compare.py", "--no-docs", "HEAD", "no-such-revision-x"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 1
    assert done.stderr.startswith("compare: git rev-parse")
    assert "no-such-revision-x" in done.stderr
    assert "Traceback" not in done.stderr


FAKE_VALGRIND = """\
#!/usr/bin/env python3
# Counts nothing: runs the command and reports 1,000,000 + rate x schedules instructions,
# so the per-execution figure is the tree's rate.txt.
import subprocess, sys
command = sys.argv[1:]
while command[0].startswith("--"):  # valgrind's own options come first
    command.pop(0)
done = subprocess.run(command, capture_output=True, text=True)
sys.stdout.write(done.stdout)
schedules = int(command[command.index("--schedules") + 1]) if "--schedules" in command else 0
rate = float(done.stdout.split("executions/s end to end |")[1].split("|")[0].replace(",", ""))
print(f"==1== I   refs:      {1_000_000 + int(rate) * schedules:,}", file=sys.stderr)
sys.exit(done.returncode)
"""


@pytest.fixture
def valgrind(tmp_path: Path) -> str:
    path = tmp_path / "valgrind"
    path.write_text(FAKE_VALGRIND)
    path.chmod(0o755)
    return str(path)


def test_instructions_per_execution_are_the_slope_between_two_burst_sizes(
    repo: Path, valgrind: str
) -> None:
    def count(tree: Path) -> dict[str, float]:
        return compare.instructions_in(
            tree, lambda size: ["benchmarks/bench_burst.py", "--schedules", str(size)],
            (3_000, 9_000), valgrind,
        )  # fmt: skip

    before = worktrees(repo)
    result = compare.compare(repo, ["HEAD~1", "HEAD"], 1, count)

    # The fixed 1,000,000 (imports, set-up) cancels out; what is left is per execution.
    assert result.runs[0][0] == {"instructions": pytest.approx(1_000.0)}
    assert result.runs[1][0] == {"instructions": pytest.approx(1_100.0)}
    assert compare.ratios(result, 1, "instructions") == pytest.approx([1.1])
    assert worktrees(repo) == before
    text = compare.report_instructions(result, sizes=(3_000, 9_000), workers=32)
    assert "| 1.0k | 1.000 |" in text
    assert "| 1.1k | 1.100 |" in text


def test_a_counted_run_with_duplicates_or_without_a_count_is_an_error(
    repo: Path, valgrind: str, tmp_path: Path
) -> None:
    (repo / "benchmarks" / "bench_burst.py").write_text(
        FAKE_BENCH.replace('"| duplicates | 0 |"', '"| duplicates | 2 |"')
    )
    with pytest.raises(compare.CompareError, match="2 duplicates at 10"):
        compare.instructions_in(
            repo, lambda size: ["benchmarks/bench_burst.py"], (10, 20), valgrind
        )
    silent = tmp_path / "silent"
    silent.write_text('#!/bin/sh\nwhile [ "${1#--}" != "$1" ]; do shift; done\nexec "$@"\n')
    silent.chmod(0o755)
    (repo / "benchmarks" / "bench_burst.py").write_text(FAKE_BENCH)
    with pytest.raises(compare.CompareError, match="no 'I refs' count"):
        compare.instructions_in(
            repo, lambda size: ["benchmarks/bench_burst.py"], (10, 20), str(silent)
        )
    with pytest.raises(compare.CompareError, match="0 < SMALL < LARGE"):
        compare.instructions_in(repo, lambda size: [], (20, 10), valgrind)
