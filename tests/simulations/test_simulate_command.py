"""``carillon simulate``: a user's schedule set on the simulator, and its report.

Runs are kept small (one or two nodes, under an hour and a half of simulated time, seed 7,
whose drawn settings are cheap to simulate) so the whole file takes seconds per run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from engine.cli import main
from engine.cli.simulate import next_whole_hour
from simulations.user.report import dst_moves
from simulations.workload import SimSchedule

FAST = ("--nodes", "1", "--seed", "7")


def simulate(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["simulate", *args])
    out, err = capsys.readouterr()
    return code, out, err


def report_of(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    code, out, err = simulate(capsys, *args, "--output", "json")
    assert code == 0, err
    report: dict[str, Any] = json.loads(out)
    return report


def schedules_file(tmp_path: Path, entries: list[dict[str, Any]], name: str = "s.json") -> str:
    path = tmp_path / name
    path.write_text(json.dumps(entries))
    return str(path)


def entry(schedule_id: str, cron_expr: str, **fields: Any) -> dict[str, Any]:
    return {"schedule_id": schedule_id, "cron_expr": cron_expr, "task_type": "t", **fields}


def by_id(items: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {item["schedule_id"]: item for item in items}


def test_json_schedules_are_simulated_and_reported_per_schedule(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = schedules_file(
        tmp_path,
        [
            entry("every-10", "*/10 * * * *", tenant_id="acme"),
            entry("hourly", "@hourly", catch_up="all"),
            entry("paused", "0 9 * * *", enabled=False),
        ],
    )
    report = report_of(
        capsys, "--schedules", path, "--days", "0.05", "--start", "2026-06-01T00:00:00Z", *FAST
    )
    rows = by_id(report["schedules"])
    assert rows["every-10"]["expected"] == rows["every-10"]["succeeded"] == 7
    assert rows["every-10"]["first_fire"] == "2026-06-01T00:10:00+00:00"
    assert rows["every-10"]["last_fire"] == "2026-06-01T01:10:00+00:00"
    assert rows["hourly"]["evaluated_expr"] == "0 * * * *"
    assert rows["hourly"]["expected"] == rows["hourly"]["succeeded"] == 1
    assert rows["hourly"]["max_start_delay_s"] < report["totals"]["healthy_bound_s"]
    assert report["not_simulated"] == ["paused"]
    assert "replaces every task type" in report["handler"]
    assert report["violations"] == []


def test_a_crontab_is_read_with_its_zone_lines_and_reported_as_a_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    crontab = tmp_path / "jobs"
    crontab.write_text(
        "# nightly work\nCRON_TZ=America/New_York\n*/20 * * * * /bin/backup\n@hourly echo hi\n"
    )
    code, out, _ = simulate(
        capsys, "--schedules", str(crontab), "--days", "0.05",
        "--start", "2026-06-01T04:00:00Z", *FAST,
    )  # fmt: skip
    assert code == 0
    rows = [line.split() for line in out.splitlines() if line.startswith("crontab-")]
    assert [(row[1:6], row[6]) for row in rows if "*/20" in row] == [
        (["*/20", "*", "*", "*", "*"], "America/New_York")
    ]
    assert any(row[1] == "@hourly" and row[2] == "(0" for row in rows)
    assert "--format crontab --tz UTC" in out
    assert "violations: 0" in out


def test_new_york_0230_moves_to_0300_across_the_march_gap(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = schedules_file(
        tmp_path,
        [
            entry("ny-shift", "30 2 * * *", timezone="America/New_York"),
            entry("ny-skip", "30 2 * * *", timezone="America/New_York", dst_gap="skip"),
        ],
    )
    report = report_of(
        capsys, "--schedules", path, "--days", "0.03", "--start", "2026-03-08T06:30:00Z", *FAST
    )
    moves = by_id(report["dst_moves"])
    assert moves["ny-shift"] | {"fires": None} == {
        "schedule_id": "ny-shift",
        "zone": "America/New_York",
        "wall": "2026-03-08T02:30:00",
        "kind": "gap",
        "policy": "shift",
        "auto": True,
        "transition": "2026-03-08T07:00:00Z",
        "offset_before": "EST -05:00",
        "offset_after": "EDT -04:00",
        "fires": None,
        "passes_not_fired": [],
        "same_fire_as": None,
    }
    assert moves["ny-shift"]["fires"] == [
        {
            "planned_at": "2026-03-08T07:00:00Z",
            "local": "2026-03-08T03:00:00-04:00",
            "status": "succeeded",
        }
    ]
    assert (moves["ny-skip"]["policy"], moves["ny-skip"]["fires"]) == ("skip", [])
    rows = by_id(report["schedules"])
    assert (rows["ny-shift"]["succeeded"], rows["ny-skip"]["expected"]) == (1, 0)
    assert report["violations"] == []


def test_new_york_0130_fires_once_or_twice_across_the_november_overlap(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = schedules_file(
        tmp_path,
        [
            entry("ny-first", "30 1 * * *", timezone="America/New_York"),
            entry("ny-both", "30 1 * * *", timezone="America/New_York", dst_overlap="both"),
        ],
    )
    report = report_of(
        capsys, "--schedules", path, "--days", "0.07", "--start", "2026-11-01T05:00:00Z", *FAST
    )
    moves = by_id(report["dst_moves"])
    assert moves["ny-first"]["policy"] == "first"
    assert [f["local"] for f in moves["ny-first"]["fires"]] == ["2026-11-01T01:30:00-04:00"]
    assert moves["ny-first"]["passes_not_fired"] == ["2026-11-01T06:30:00Z"]
    assert [(f["planned_at"], f["status"]) for f in moves["ny-both"]["fires"]] == [
        ("2026-11-01T05:30:00Z", "succeeded"),
        ("2026-11-01T06:30:00Z", "succeeded"),
    ]
    assert by_id(report["schedules"])["ny-both"]["succeeded"] == 2
    assert report["violations"] == []


def sim(cron_expr: str, zone: str, **policies: str) -> SimSchedule:
    return SimSchedule("s", "t", cron_expr, zone, **policies)


def at(text: str) -> datetime:
    return datetime.fromisoformat(text).astimezone(UTC)


def test_london_and_lord_howe_dst_moves_are_named_with_their_transition() -> None:
    london = dst_moves(
        sim("30 1 * * *", "Europe/London"), at("2026-03-28T12:00Z"), at("2026-03-30T00:00Z"), {}
    )
    assert [(m.kind, m.policy, m.before, m.after) for m in london] == [
        ("gap", "shift", "GMT +00:00", "BST +01:00")
    ]
    assert [f.instant for f in london[0].fires] == [at("2026-03-29T01:00Z")]
    spring = dst_moves(
        sim("15 2 * * *", "Australia/Lord_Howe"),
        at("2026-10-03T00:00Z"),
        at("2026-10-04T00:00Z"),
        {},
    )
    assert [(m.wall.time().isoformat(), m.after, [f.instant for f in m.fires]) for m in spring] == [
        ("02:15:00", "+11 +11:00", [at("2026-10-04T02:30+11:00")])
    ]
    autumn = dst_moves(
        sim("45 1 * * *", "Australia/Lord_Howe", dst_overlap="last"),
        at("2026-04-04T00:00Z"),
        at("2026-04-05T00:00Z"),
        {},
    )
    assert [(m.kind, [f.instant for f in m.fires], m.passes_not_fired) for m in autumn] == [
        ("overlap", [at("2026-04-05T01:45+10:30")], (at("2026-04-05T01:45+11:00"),))
    ]


def test_wall_times_shifted_to_one_instant_are_reported_as_one_fire() -> None:
    moves = dst_moves(
        sim("*/30 1-2 * * *", "Europe/London", dst_gap="shift"),
        at("2026-03-28T12:00Z"),
        at("2026-03-30T00:00Z"),
        {},
    )
    assert [(m.wall.strftime("%H:%M"), m.same_fire_as) for m in moves] == [
        ("01:00", "02:00"),
        ("01:30", "02:00"),
    ]


def test_fifty_schedules_at_the_same_minute_are_reported_as_a_burst(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    entries = [entry(f"job-{n}", "0 * * * *", tenant_id="ab"[n % 2]) for n in range(50)]
    entries.append(entry("quiet", "*/5 * * * *", timezone="Asia/Kolkata"))
    path = schedules_file(tmp_path, entries)
    report = report_of(
        capsys, "--schedules", path, "--days", "0.02", "--start", "2026-06-01T00:45:00Z", *FAST
    )
    [top, *others] = report["bursts"]["busiest_minutes"]
    assert (top["minute"], top["fires"], top["tenants"]) == (
        "2026-06-01T01:00:00Z",
        51,
        {"a": 25, "b": 25, "default": 1},
    )
    assert top["zones"] == {"UTC": 50, "Asia/Kolkata": 1}
    assert all(other["fires"] == 1 for other in others)
    assert report["bursts"]["busiest_second"] == {"at": "2026-06-01T01:00:00Z", "fires": 51}
    assert report["totals"]["succeeded"] == report["totals"]["expected"] == 55
    assert report["violations"] == []


def test_crash_and_zombie_faults_finish_without_a_violation(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = schedules_file(
        tmp_path, [entry("every-2", "*/2 * * * *"), entry("hourly", "0 * * * *", catch_up="all")]
    )
    report = report_of(
        capsys, "--schedules", path, "--days", "0.04", "--faults", "crash,zombie",
        "--start", "2026-06-01T00:00:00Z", "--nodes", "2", "--seed", "7",
    )  # fmt: skip
    timeline = report["parameters"]["fault_timeline"]
    assert any(" crash " in line for line in timeline)
    assert any(" pause " in line for line in timeline)
    assert report["faults_injected"]
    assert report["violations"] == []


def test_the_same_command_prints_the_same_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = schedules_file(tmp_path, [entry("every-5", "*/5 * * * *")])
    args = ("--schedules", path, "--days", "0.02", "--start", "2026-06-01T00:00:00+02:00", *FAST)
    first = simulate(capsys, *args)
    second = simulate(capsys, *args)
    assert first[0] == second[0] == 0
    assert first[1] == second[1]
    assert (
        f"reproduce: carillon simulate --schedules {path} --days 0.02 --faults none --nodes 1 "
        "--seed 7 --start 2026-05-31T22:00:00+00:00 --format json"
    ) in first[1]


def test_the_window_starts_by_default_at_the_next_whole_hour() -> None:
    assert next_whole_hour(at("2026-03-02T09:59:59.5+00:00")) == at("2026-03-02T10:00Z")
    assert next_whole_hour(at("2026-03-02T10:00:00+05:30")) == at("2026-03-02T05:00Z")


BAD_ENTRIES: list[tuple[Any, str]] = [
    ([], "holds no schedules: nothing to simulate"),
    ({"rows": []}, 'expected a list of schedules, or {"items": [...]}'),
    ([entry("a", "61 * * * *")], "entry 1: the minute field '61'"),
    ([entry("a", "0 * * * *", timezone="Mars/Olympus")], "entry 1: unknown time zone 'Mars"),
    ([entry("a", "0 * * * *", dst_gap="sometimes")], "entry 1: does not fit the schedule body"),
    ([entry("a", "0 * * * *", timzone="UTC")], "unknown field `timzone`"),
    ([{"cron_expr": "0 * * * *"}], "missing required field `task_type`"),
    ([entry("a", "0 0 L * *")], "syntax the simulator's oracle does not model"),
    ([entry("a", "*/10 * * * * *")], "has a seconds field"),
    ([entry("a", "0 * * * *", overlap="buffer_one")], "'buffer_one' is not modelled"),
    ([entry("a", "0 * * * *"), entry("a", "5 * * * *")], "entry 2: schedule_id 'a' is also"),
    (
        [entry("a", "0 * * * *"), entry("b", "x"), entry("c", "0 0 31 2 *")],
        "2 of 3 entries are invalid (nothing was simulated): entry 2: ",
    ),
    ([entry(f"s{n}", "* * * * *") for n in range(1000)], "over the limit of 250,000 (about"),
]


@pytest.mark.parametrize(("entries", "message"), BAD_ENTRIES)
def test_a_bad_schedule_set_is_one_error_line_and_exit_code_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], entries: Any, message: str
) -> None:
    path = schedules_file(tmp_path, entries)
    code, out, err = simulate(
        capsys, "--schedules", path, "--days", "0.2", "--start", "2026-06-01T00:00:00Z", *FAST
    )
    assert (code, out) == (2, "")
    assert err.count("\n") == 1, err
    assert err.startswith("carillon: error: ")
    assert message in err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--schedules", "missing.json"), "cannot read missing.json"),
        (("--schedules", "."), "cannot read ."),
        (("--days", "0"), "--days must be a number more than 0, got 0"),
        (("--days", "-1"), "--days must be a number more than 0, got -1"),
        (("--faults", "crash,meteor"), "unknown fault 'meteor'; choose from crash, zombie"),
        (("--faults", "churn"), "unknown fault 'churn'"),
        (("--start", "2026-06-01T00:00:00"), "has no UTC offset"),
        (("--nodes", "0"), "a whole number from 1"),
        (("--days", "400", "--nodes", "16"), "node-hours, over the limit"),
    ],
)
def test_bad_options_and_files_are_one_error_line_and_exit_code_2(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    args: tuple[str, ...],
    message: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    schedules_file(tmp_path, [entry("a", "0 0 1 1 *")])
    code, out, err = simulate(capsys, "--schedules", "s.json", "--days", "0.01", *FAST, *args)
    assert (code, out) == (2, "")
    assert err.count("\n") == 1, err
    assert err.startswith("carillon")
    assert message in err


def test_invalid_json_and_rejected_crontab_lines_are_refused_with_their_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "broken.json").write_text('[{"cron_expr": "0 * * * *",]')
    code, _, err = simulate(capsys, "--schedules", str(tmp_path / "broken.json"))
    assert code == 2
    assert "is not valid JSON (line 1, column 28" in err
    (tmp_path / "crontab").write_text("@reboot /bin/warm\n0 * * * * /bin/ok\n")
    code, _, err = simulate(capsys, "--schedules", str(tmp_path / "crontab"))
    assert code == 2
    assert "line 1: @reboot runs a job when the machine boots" in err


def test_the_carillon_console_script_simulates_from_any_directory(tmp_path: Path) -> None:
    path = schedules_file(tmp_path, [entry("every-15", "*/15 * * * *")])
    script = Path(sys.executable).with_name("carillon")
    done = subprocess.run(
        [str(script), "simulate", "--schedules", path, "--days", "0.02", *FAST,
         "--start", "2026-06-01T00:00:00Z", "--output", "json"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": ""},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["schedules"][0]["succeeded"] == 1
    assert "simulated" in done.stderr


def test_importing_the_command_line_does_not_import_the_simulator() -> None:
    code = "import sys, engine.cli; print(any(m.startswith('simulations') for m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"
