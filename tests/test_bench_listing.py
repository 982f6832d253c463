"""The listing benchmark's ledger shape and report helpers (the smoke test runs the rest)."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest
from croniter import croniter

from benchmarks.bench_listing import (
    FUTURE_SHARE,
    Shape,
    percentile,
    plan_shape,
    rows_label,
    schedule_plan,
)
from engine.core.hashing import partition_of
from engine.ledger.postgres import PARTITIONS_DEFAULT

SHAPE = Shape(rows=50_000, schedules=1_000, tenants=20, seed=1)


def test_two_schedules_in_a_hundred_fire_hourly_eight_every_six_hours_the_rest_daily() -> None:
    periods = Counter(period for _, _, _, period, _, _ in schedule_plan(SHAPE))
    assert periods == {60: 20, 360: 80, 1440: 900}


def test_each_schedules_cron_fires_at_the_instants_its_executions_are_planned() -> None:
    origin = datetime(2026, 11, 1, tzinfo=UTC)
    for _, _, _, period, phase, cron in schedule_plan(SHAPE)[:60]:
        fires = croniter(cron, origin - timedelta(seconds=1), ret_type=datetime)
        expected = [origin + timedelta(minutes=phase + k * period) for k in range(3)]
        assert [fires.get_next() for _ in range(3)] == expected, cron


def test_each_schedule_lives_in_the_partition_the_engine_gives_it() -> None:
    for schedule_id, _, partition, _, _, _ in schedule_plan(SHAPE):
        assert partition == partition_of(schedule_id, PARTITIONS_DEFAULT)


def test_tenants_own_schedules_unevenly_and_the_plan_is_the_same_for_the_same_seed() -> None:
    owned = Counter(tenant for _, tenant, _, _, _, _ in schedule_plan(SHAPE))
    biggest, *_, smallest = sorted(owned.values(), reverse=True)
    assert owned.most_common(1)[0][0] == "tenant-0000"
    assert biggest > 3 * smallest
    assert schedule_plan(SHAPE) == schedule_plan(SHAPE)


def test_the_span_holds_the_rows_asked_for_and_the_future_its_share_of_them() -> None:
    assert SHAPE.rate_per_min * SHAPE.span_min == pytest.approx(SHAPE.rows, rel=0.001)
    assert SHAPE.future_min / SHAPE.span_min == pytest.approx(FUTURE_SHARE, rel=0.01)


def test_a_percentile_is_the_nearest_rank() -> None:
    samples = [float(n) for n in range(100, 0, -1)]
    assert percentile(samples, 0.5) == 50.0
    assert percentile(samples, 0.95) == 95.0
    assert percentile(samples, 0.99) == 99.0
    assert percentile([7.0], 0.99) == 7.0


def test_a_plans_shape_is_its_nodes_without_figures_or_values() -> None:
    custom = """Limit  (cost=0.56..229.35 rows=101 width=158) (actual time=0.036..0.108 rows=101)
  ->  Index Scan using executions_tenant_idx on executions  (cost=0.56..390045.75 rows=1)
        Index Cond: (tenant_id = 'tenant-0000'::text)
Execution Time: 0.144 ms"""
    generic = custom.replace("'tenant-0000'::text", "$1").replace("0.108", "9.5")
    bitmap = custom.replace("Index Scan using", "Bitmap Heap Scan on")
    assert plan_shape(custom) == plan_shape(generic)
    assert plan_shape(custom) == [
        "Limit",
        "Index Scan using executions_tenant_idx on executions",
    ]
    assert plan_shape(bitmap) != plan_shape(custom)


@pytest.mark.parametrize(
    ("rows", "label"),
    [(5_000_007, "5M"), (5_000_000, "5M"), (1_020_000, "1,020,000"), (20_003, "20,003")],
)
def test_a_ledger_is_called_by_its_round_millions_when_it_is_within_one_percent(
    rows: int, label: str
) -> None:
    assert rows_label(rows) == label
