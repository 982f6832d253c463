"""How many fires fall in each time bucket: the load that is *about* to arrive.

The API's ``/v1/forecast`` reads the enabled schedules grouped by expression, zone, DST
policy, tenant and task type (one ``GROUP BY``, so a million schedules that share a few
hundred expressions cost a few hundred timetable walks, not a million), and this module
counts each group's fires per bucket and multiplies by the group's size.

Expressions with the Jenkins ``H`` token fire at a minute derived from each schedule's id, so
a group of them is spread, not stacked: its count is shared out over up to
:data:`HASHED_SAMPLES_MAX` stand-in ids, whose hashed minutes spread the way the real ones
do. The result is an approximation for those groups (reported as such), and exact for all
others.

Bounds: at most :data:`BUCKETS_MAX` buckets and :data:`FIRE_STEPS_MAX` timetable steps per
forecast; past either, :class:`~engine.errors.InvalidField` asks for a narrower range or a
larger bucket. Pure and synchronous: the API runs it in a worker thread.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Final

from engine.core.cron import uses_hash
from engine.core.dst import DstGap, DstOverlap
from engine.core.timetable import Timetable
from engine.errors import InvalidField

BUCKETS_MAX: Final = 10_080
"""A week of minutes."""
RANGE_MAX: Final = timedelta(days=7)
FIRE_STEPS_MAX: Final = 300_000
"""A timetable step costs some 20-30 us of CPU: this keeps one forecast within seconds (any
token may ask for one, and the thread shares the interpreter with the node's actors)."""
HASHED_SAMPLES_MAX: Final = 60


@dataclass(frozen=True)
class Group:
    """Enabled schedules that fire identically (but for ``H``): a census row."""

    cron_expr: str
    timezone: str
    dst_gap: DstGap
    dst_overlap: DstOverlap
    tenant_id: str
    task_type: str
    count: int
    sample_schedule_id: str


@dataclass
class LoadForecast:
    start: datetime
    bucket_s: int
    buckets: int
    total: list[int]
    by_key: dict[tuple[str | None, str | None], list[int]] = field(default_factory=dict)
    approximated: int = 0
    steps: int = 0


def forecast(
    groups: Sequence[Group],
    start: datetime,
    end: datetime,
    bucket_s: int,
    *,
    by_tenant: bool = False,
    by_task_type: bool = False,
) -> LoadForecast:
    """Fires per ``bucket_s`` bucket in ``[start, end)``, in total and per requested key."""
    if start.tzinfo is None or end.tzinfo is None:
        raise InvalidField("'from' and 'to' need a UTC offset (e.g. 2026-03-08T07:00:00Z)")
    if end <= start:
        raise InvalidField("'to' must be after 'from'")
    if end - start > RANGE_MAX:
        raise InvalidField("a forecast covers at most 7 days")
    if bucket_s < 1:
        raise InvalidField("the bucket must be at least one second")
    span_s = (end - start).total_seconds()
    buckets = int(-(-span_s // bucket_s))
    if buckets > BUCKETS_MAX:
        raise InvalidField(
            f"{buckets} buckets asked for; at most {BUCKETS_MAX}: use a larger bucket"
        )
    result = LoadForecast(start, bucket_s, buckets, [0] * buckets)
    walked: dict[tuple[str, str, DstGap, DstOverlap, str], list[tuple[int, int]]] = {}
    for group in groups:
        hashed = uses_hash(group.cron_expr)  # not "H" in it: THU is a day name
        samples = min(group.count, HASHED_SAMPLES_MAX) if hashed else 1
        key = (
            group.tenant_id if by_tenant else None,
            group.task_type if by_task_type else None,
        )
        series = result.by_key.get(key)
        if series is None and (by_tenant or by_task_type):
            series = result.by_key[key] = [0] * buckets
        if hashed:
            result.approximated += group.count
        for sample in range(samples):
            share = group.count // samples + (1 if sample < group.count % samples else 0)
            sample_id = (
                group.sample_schedule_id if sample == 0 else f"{group.sample_schedule_id}.{sample}"
            )
            memo_key = (
                group.cron_expr,
                group.timezone,
                group.dst_gap,
                group.dst_overlap,
                sample_id if hashed else "",
            )
            hits = walked.get(memo_key)
            if hits is None:
                hits = walked[memo_key] = _walk(group, sample_id, start, end, bucket_s, result)
            for bucket, fires in hits:
                result.total[bucket] += fires * share
                if series is not None:
                    series[bucket] += fires * share
    return result


def _walk(
    group: Group,
    sample_id: str,
    start: datetime,
    end: datetime,
    bucket_s: int,
    result: LoadForecast,
) -> list[tuple[int, int]]:
    """``(bucket, fires)`` for one timetable, sparse, in bucket order."""
    timetable = Timetable.compile(
        group.cron_expr,
        group.timezone,
        dst_gap=group.dst_gap,
        dst_overlap=group.dst_overlap,
        schedule_id=sample_id,
    )
    hits: list[tuple[int, int]] = []
    fire = timetable.next_fire(start - timedelta(microseconds=1))
    while fire.planned_at < end:
        result.steps += 1
        if result.steps > FIRE_STEPS_MAX:
            raise InvalidField(
                f"forecasting this range takes more than {FIRE_STEPS_MAX} steps (schedules "
                "firing every second); narrow the range"
            )
        bucket = int((fire.planned_at - start).total_seconds() // bucket_s)
        if hits and hits[-1][0] == bucket:
            hits[-1] = (bucket, hits[-1][1] + 1)
        else:
            hits.append((bucket, 1))
        fire = timetable.next_fire(fire.planned_at)
    return hits
