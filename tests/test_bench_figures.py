"""Benchmark figures: the burst's CPU budget per execution, the scale report's catch-up note."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from benchmarks._cpu import CpuSample, cores, cpu_figures, postgres_cpu_s, process_cpu_s

TICKS = os.sysconf("SC_CLK_TCK")


def _stat(comm: str, utime: int, stime: int) -> str:
    # pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime
    return f"42 ({comm}) S 1 1 1 0 -1 0 0 0 0 0 {utime} {stime} 0 0 20 0 1 0"


def _process(proc: Path, pid: int, comm: str, utime: int, stime: int) -> None:
    entry = proc / str(pid)
    entry.mkdir()
    (entry / "comm").write_text(comm + "\n")
    (entry / "stat").write_text(_stat(comm, utime, stime))


def test_a_command_name_with_spaces_and_parentheses_does_not_shift_the_fields() -> None:
    assert process_cpu_s(_stat("odd ) name (x", 3 * TICKS, TICKS)) == pytest.approx(4.0)


def test_the_servers_cpu_sums_every_postgres_process_and_nothing_else(tmp_path: Path) -> None:
    _process(tmp_path, 10, "postgres", 2 * TICKS, TICKS)
    _process(tmp_path, 11, "postgres", TICKS, 0)
    _process(tmp_path, 12, "python3", 50 * TICKS, 0)
    (tmp_path / "self").mkdir()
    assert postgres_cpu_s(tmp_path) == pytest.approx(4.0)


def test_no_visible_server_gives_no_figure_rather_than_zero(tmp_path: Path) -> None:
    _process(tmp_path, 12, "python3", TICKS, 0)
    assert postgres_cpu_s(tmp_path) is None
    assert postgres_cpu_s(tmp_path / "missing") is None
    figures = cpu_figures(CpuSample(1.0, None), CpuSample(3.0, None), 1_000)
    assert figures == {"node_cpu_us": pytest.approx(2_000.0)}


def test_the_bound_is_the_cores_divided_by_the_cpu_one_execution_costs() -> None:
    figures = cpu_figures(CpuSample(10.0, 100.0), CpuSample(11.0, 102.0), 20_000)
    assert figures["node_cpu_us"] == pytest.approx(50.0)
    assert figures["postgres_cpu_us"] == pytest.approx(100.0)
    assert figures["cpu_bound_per_s"] == pytest.approx(cores() * 1e6 / 150.0)


def test_no_executions_give_no_figures() -> None:
    assert cpu_figures(CpuSample(1.0, 1.0), CpuSample(2.0, 2.0), 0) == {}


def test_a_size_whose_planners_stayed_behind_says_its_steady_rows_are_a_catch_up() -> None:
    from benchmarks.bench_scale import catch_up_note

    behind = [{"lag_p50_s": 220.0}, {"lag_p50_s": 203.0}, {"lag_p50_s": 238.0}]
    note = " ".join(catch_up_note(behind, 60.0))
    assert "Not a steady state" in note
    assert "220 s" in note
    assert catch_up_note([{"lag_p50_s": 0.0}] * 3, 60.0) == []
    assert catch_up_note([{}], 60.0) == []
