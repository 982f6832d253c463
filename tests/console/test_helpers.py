"""The console's pure pieces: chart geometry, DST transitions, the overview's derived series,
form input normalisation and return paths."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from engine.api.console.charts import HEAT_LEVELS, bar_chart, heat_level, heat_map, line_chart
from engine.api.console.cluster import overview_charts
from engine.api.console.executions import instant_text
from engine.api.console.schedules import next_transitions
from engine.api.console.web import safe_return_path
from engine.ledger.params import ExecutionsBucket

T0 = datetime(2026, 3, 27, 13, 0, tzinfo=UTC)
MINUTES = [T0 + timedelta(minutes=i) for i in range(4)]


def test_bars_scale_to_the_largest_value_and_name_their_minute() -> None:
    chart = bar_chart("t", "s", [0.0, 2.0, 4.0, 1.0], MINUTES, str)
    heights = [bar.height for bar in chart.bars]
    assert heights[2] == max(heights)
    assert heights[0] == 0
    assert heights[1] == heights[2] / 2
    assert chart.bars[3].title == "13:03 UTC: 1.0"
    assert (chart.start, chart.end, chart.top) == ("13:00", "13:03", "4.0")


def test_a_line_breaks_where_a_bucket_has_no_value() -> None:
    chart = line_chart("t", "s", [1.0, None, 0.5, 0.5], MINUTES, str, top=1.0)
    assert chart.line.count("M") == 2
    assert chart.line.count("L") == 1
    assert [t.title for t in chart.targets][1] == "13:01 UTC: no data"


def test_heat_levels_are_logarithmic_so_small_and_huge_counts_both_show() -> None:
    assert heat_level(0, 10_000) == 0
    assert heat_level(1, 10_000) == 1
    assert heat_level(5, 10_000) >= 1
    assert heat_level(10_000, 10_000) == HEAT_LEVELS


def test_a_heat_map_has_a_cell_per_busy_minute_and_ticks_on_clock_hours() -> None:
    start = datetime(2026, 3, 27, 14, 20, tzinfo=UTC)
    counts = [0] * 1440
    counts[40] = 300  # 15:00
    heat = heat_map([("acme / noop", counts)], counts, start, 60)
    [row] = heat.rows
    assert [cell.x for cell in row.cells] == [40]
    assert row.cells[0].title == "acme / noop at 15:00 UTC: 300 due"
    assert heat.peak == 300
    assert heat.ticks[0] == (100, "16:00")  # every two hours over a day
    assert heat.cell_width == 3


def test_london_moves_its_clocks_on_the_last_sundays_of_march_and_october() -> None:
    found = next_transitions(ZoneInfo("Europe/London"), T0)
    assert [(t.at, t.kind, t.change) for t in found] == [
        (datetime(2026, 3, 29, 1, 0, tzinfo=UTC), "gap", "+1:00"),
        (datetime(2026, 10, 25, 1, 0, tzinfo=UTC), "overlap", "-1:00"),
    ]
    assert next_transitions(ZoneInfo("UTC"), T0) == []
    [lord_howe] = next_transitions(ZoneInfo("Australia/Lord_Howe"), T0, count=1)
    assert lord_howe.change == "-0:30"


def test_queue_depth_is_what_was_planned_and_neither_started_nor_skipped() -> None:
    buckets = [
        ExecutionsBucket(planned=10, started=10, on_time=9, starts=4),
        ExecutionsBucket(planned=5, started=3, on_time=3, starts=6, skips=1),
        ExecutionsBucket(dead_letters=2, plan_lag_s_max=3.5, starts=3),
        ExecutionsBucket(),
    ]
    slo, rate, depth, dead, lag = overview_charts(buckets, MINUTES, 60.0)
    assert [t.title.split(": ")[1] for t in depth.targets] == ["6", "4", "1", "1"]
    assert slo.summary == "92.3 % of 13 first starts"
    assert rate.summary == "0.05/s on average, 0.10/s at most"
    assert dead.summary == "2 this hour"
    assert lag.summary == "3.5 s at worst"


@pytest.mark.parametrize(
    ("typed", "sent"),
    [
        ("2026-03-02", "2026-03-02T00:00Z"),
        ("2026-03-02 14:00", "2026-03-02T14:00Z"),
        ("2026-03-02T14:00:30", "2026-03-02T14:00:30Z"),
        ("2026-03-02T14:00:00+02:00", "2026-03-02T14:00:00+02:00"),
        ("yesterday", "yesterday"),
        (None, None),
    ],
)
def test_typed_instants_are_read_as_utc_unless_they_say_otherwise(
    typed: str | None, sent: str | None
) -> None:
    assert instant_text(typed) == sent


@pytest.mark.parametrize(
    ("asked", "kept"),
    [
        ("/ui/schedules?id_prefix=a", "/schedules?id_prefix=a"),
        ("/ui/", "/"),
        ("//evil.example/ui/", "/overview"),
        ("https://evil.example/ui/x", "/overview"),
        ("/ui\\evil", "/overview"),
        ("/uix/other", "/overview"),
        ("/ui/a\nb", "/overview"),
        (None, "/overview"),
    ],
)
def test_only_console_paths_are_returned_to(asked: str | None, kept: str) -> None:
    assert safe_return_path(asked, "/overview") == kept
