"""The benchmarks' report helpers: results files, the Targets section, docs sections, plots."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from benchmarks import _plots, _report


@pytest.fixture(autouse=True)
def no_git(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_report, "revision", lambda: "abc1234")
    monkeypatch.setattr(_report, "machine", lambda: "2 cores, test CPU")


def burst_results(directory: Path, rate: list[float], **context: object) -> None:
    _report.write_results(
        "bench_burst",
        {
            "executions_per_s": rate,
            "ceiling_ratio": [0.46, 0.42, 0.49],
            "duplicates": [0.0, 0.0, 0.0],
            "lead_s": [18.2, 17.9, math.inf],
        },
        {"schedules": 200_000, "base_variant": "32 workers, smoothing off"} | context,
        directory=directory,
    )


def rows(directory: Path) -> dict[str, list[str]]:
    section = _report.targets_section(_report.read_results(directory))
    table = [line.strip("|").split(" | ") for line in section.splitlines() if line[:2] == "| "]
    return {cells[0].strip(): [c.strip() for c in cells[1:]] for cells in table[1:]}


def test_results_file_keeps_median_min_max_and_runs_with_timeouts_as_null(tmp_path: Path) -> None:
    burst_results(tmp_path, [12_000.0, 11_000.0, 12_500.0])

    document = json.loads((tmp_path / "bench_burst.json").read_text())

    assert document["revision"] == "abc1234"
    assert document["machine"] == "2 cores, test CPU"
    assert document["figures"]["executions_per_s"] == {
        "median": 12_000.0,
        "min": 11_000.0,
        "max": 12_500.0,
        "runs": [12_000.0, 11_000.0, 12_500.0],
    }
    assert document["figures"]["lead_s"]["runs"][-1] is None


def test_targets_without_results_are_not_measured_yet(tmp_path: Path) -> None:
    table = rows(tmp_path)

    assert [t.wording for t in _report.TARGETS] == list(table)
    assert all(cells[0] == "not measured yet" for cells in table.values())


def test_targets_say_met_by_median_or_by_every_run(tmp_path: Path) -> None:
    burst_results(tmp_path, [21_000.0, 19_000.0, 22_000.0])
    _report.write_results(
        "bench_failover",
        {"rto_s": [16.0, 16.5, 17.5]},
        {"rto_limit_s": 17.0},
        directory=tmp_path,
    )

    table = rows(tmp_path)
    rate, duplicates, ceiling, lead, *_ = (table[t.wording] for t in _report.TARGETS)
    (rto,) = (table[t.wording] for t in _report.TARGETS if t.source == "bench_failover")
    (peer,) = (table[t.wording] for t in _report.TARGETS if t.source == "bench_peer")

    assert rate[0] == "21,000/s (19,000/s)"
    assert rate[2] == "met"  # the median meets it
    assert duplicates[2] == "met"
    assert ceiling[0] == "46% (42%)"
    assert ceiling[2] == "**not met**"
    assert lead[2] == "**not met**"  # one run had no lead at all
    assert rto[2] == "**not met**"  # the worst run is past TTL + 2 s
    assert "`bench_failover` abc1234" in rto[1]
    assert peer[0] == "not measured yet"


def test_targets_of_a_run_at_another_size_are_not_judged(tmp_path: Path) -> None:
    burst_results(tmp_path, [25_000.0] * 3, schedules=2_000)

    rate = rows(tmp_path)[_report.TARGETS[0].wording]

    assert rate[2].startswith("n/a (run with schedules=200000")


def test_targets_section_goes_before_the_first_section_and_is_replaced(tmp_path: Path) -> None:
    doc = tmp_path / "benchmarks.md"
    doc.write_text(_report.HEADER + "\n<!-- bench_cron:start -->\ncron\n<!-- bench_cron:end -->\n")

    _report.write_targets(directory=tmp_path, doc=doc)
    _report.write_targets(directory=tmp_path, doc=doc)

    text = doc.read_text()
    assert text.count("<!-- targets:start -->") == 1
    assert text.index("<!-- targets:end -->") < text.index("<!-- bench_cron:start -->")
    assert text.startswith(_report.HEADER)


# --- the plots ----------------------------------------------------------------------------------


def test_every_plot_is_a_non_empty_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    quantiles = {f"tenant-{i:02d}": [0.1 * i, 1.0 + i, 2.0 + i, 3.0 + i, 5.0 + i] for i in range(4)}
    paths = [
        _plots.burst_rate(
            tmp_path / "rate.png", {"off": [(0, 9_000), (1, 12_000)], "paced": [(0, 5_000)]}
        ),
        _plots.burst_tenants(tmp_path / "tenants.png", quantiles, "per tenant"),
        _plots.burst_weights(
            tmp_path / "weights.png", [("w4", 0.49, 0.5), ("w2", 0.26, 0.25), ("w1", 0.25, 0.25)]
        ),
        _plots.scale(
            tmp_path / "scale.png",
            [(1_000_000, (431.0, 425.0, 436.0), (53.0, 51.0, 60.0))],
            400.0,
            15.0,
        ),
        _plots.failover(
            tmp_path / "failover.png", [(-1, 900), (0, 600), (5, 0), (9, 800)], 8.5, 9.0
        ),
        _plots.peer(
            tmp_path / "peer.png",
            [("Carillon", (9_000.0, 8_000.0, 9_500.0)), ("peer", (120.0, 110.0, 130.0))],
        ),
    ]

    for path in paths:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert path.stat().st_size > 1_000


def test_a_plot_without_matplotlib_is_skipped_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def missing(path: Path) -> Path:
        raise ImportError("No module named 'matplotlib'")

    _plots._SKIPPED.clear()
    assert _plots.draw(missing, "a.png", directory=tmp_path) is None
    assert _plots.draw(missing, "b.png", directory=tmp_path) is None

    assert capsys.readouterr().err.count("plots skipped") == 1
    assert not list(tmp_path.iterdir())
