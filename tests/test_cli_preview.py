"""``carillon preview``: the user-facing contract of the cron calculator."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from engine import __version__
from engine.cli import main


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_json_output_lists_utc_and_local_instants(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        capsys, "preview", "30 2 * * *", "--tz", "America/New_York",
        "--after", "2026-03-07T00:00:00Z", "--count", "3", "--json",
    )  # fmt: skip
    assert code == 0
    assert json.loads(out) == [
        {"planned_at": "2026-03-07T07:30:00Z", "local": "2026-03-07T02:30:00-05:00",
         "wall": "2026-03-07T02:30:00", "dst": None},
        {"planned_at": "2026-03-08T07:00:00Z", "local": "2026-03-08T03:00:00-04:00",
         "wall": "2026-03-08T02:30:00", "dst": "shifted"},
        {"planned_at": "2026-03-09T06:30:00Z", "local": "2026-03-09T02:30:00-04:00",
         "wall": "2026-03-09T02:30:00", "dst": None},
    ]  # fmt: skip


def test_json_output_carries_execution_ids_for_a_schedule(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = run(
        capsys, "preview", "H 4 * * *", "--id", "nightly-export",
        "--after", "2026-01-01T00:00:00+01:00", "--count", "1", "--json",
    )  # fmt: skip
    assert code == 0
    [row] = json.loads(out)
    assert row["execution_id"] == f"nightly-export:{row['planned_at']}"


def test_human_output_marks_moved_and_doubled_fires(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        capsys, "preview", "30 1 * * *", "--tz", "America/New_York", "--dst-overlap", "both",
        "--after", "2026-11-01T00:00:00Z", "--count", "3",
    )  # fmt: skip
    assert code == 0
    lines = out.splitlines()
    assert "fixed-time" in lines[0]
    assert lines[1].startswith("2026-11-01T05:30:00Z  2026-11-01T01:30:00-04:00")
    assert "first of two fires" in lines[1]
    assert lines[2].startswith("2026-11-01T06:30:00Z  2026-11-01T01:30:00-05:00")
    assert "second of two fires" in lines[2]
    assert lines[3] == "2026-11-02T06:30:00Z  2026-11-02T01:30:00-05:00"

    code, out, _ = run(
        capsys, "preview", "30 2 * * *", "--tz", "America/New_York",
        "--after", "2026-03-08T00:00:00Z", "--count", "1",
    )  # fmt: skip
    assert "moved: 02:30 does not exist" in out.splitlines()[1]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["0 0 30 2 *"], "never fires"),
        (["61 * * * *"], "minute field '61'"),
        (["0 * * * *", "--tz", "Mars/Base"], "unknown time zone 'Mars/Base'"),
        (["0 * * * *", "--tz", "europe/paris"], "did you mean 'Europe/Paris'"),
        (["0 * * * *", "--after", "yesterday"], "not an RFC 3339 timestamp"),
        (["0 * * * *", "--after", "2026-01-01T00:00:00"], "has no UTC offset"),
        (["0 * * * *", "--count", "0"], "--count must be between"),
        (["0 * * * *", "--count", "many"], "invalid int value"),
        (["0 * * * *", "--dst-gap", "sometimes"], "invalid choice"),
        (["H * * * *"], "give the schedule id"),
        (["0 * * * *", "--id", "bad:id"], "schedule id 'bad:id' is invalid"),
    ],
)
def test_bad_input_exits_2_with_one_line_and_no_traceback(
    capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    code, out, err = run(capsys, "preview", *args)
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1
    assert message in err
    assert "Traceback" not in err


def test_console_entry_points_run_as_processes() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "engine", "preview", "0 0 30 2 *"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith("carillon: error:")

    version = subprocess.run(
        [sys.executable, "-m", "engine", "--version"], capture_output=True, text=True, check=True
    )
    assert version.stdout.strip() == f"carillon {__version__}"
