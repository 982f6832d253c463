"""When a schedule fires: cron expression + time zone + DST policy -> UTC instants.

A :class:`Timetable` answers ``next_fire(after)``: the earliest instant strictly after
``after`` at which the schedule fires. Guarantees (property-tested):

* the result is an aware UTC datetime and ``next_fire(t) > t``;
* ``next_fire`` is constant for every ``t`` in ``[t0, next_fire(t0))``;
* no result is a wall time that does not exist in the zone.

How: croniter iterates *naive wall-clock* times, which have no DST; each matching wall time is
resolved to zero, one or two instants by :mod:`engine.core.dst`. Because of overlaps the map
from wall time to instant is not monotonic, so the scan starts early enough (at the start of
the overlap when ``after`` lies in one) and stops only once no later wall time can resolve to
an earlier instant (see :meth:`Timetable._compute_next`).

Cost: cron iteration is slow (tens of microseconds a step), so parsed timetables are shared
through :class:`TimetableCache` and each memoises ``next_fire`` by ``after`` -- a burst of
schedules sharing an expression, a zone and a planned instant costs one computation.
"""

from __future__ import annotations

from collections import OrderedDict
from datetime import UTC, datetime, timedelta
from typing import Final
from zoneinfo import ZoneInfo

import msgspec

from engine.core.cron import CronSpec, iterator_for, parse_cron, resolve_hash
from engine.core.dst import (
    Adjustment,
    DstGap,
    DstOverlap,
    effective_policy,
    fold_instants,
    resolve_folds,
)
from engine.core.zones import load_zone
from engine.errors import InvalidField, ScheduleNeverFires

MEMO_ENTRIES_MAX: Final = 4096
"""Distinct ``after`` values remembered per timetable; the oldest is evicted first."""
TIMETABLES_MAX: Final = 20_000
"""Distinct (expression, zone, policy) timetables kept by a cache; least recently used goes."""
FIRES_PER_CALL_MAX: Final = 10_000
SCAN_HORIZON: Final = timedelta(days=366 * 11)
_UTC_KEYS: Final = frozenset(
    {
        "UTC",
        "Etc/UTC",
        "Etc/UCT",
        "UCT",
        "Etc/Universal",
        "Universal",
        "Zulu",
        "Etc/Zulu",
        "GMT",
        "Etc/GMT",
    }
)


class Fire(msgspec.Struct, frozen=True):
    """One instant a schedule fires at.

    ``planned_at`` is aware UTC; ``wall`` is the naive local time the expression matched
    (different from the local time of ``planned_at`` when a gap shifted it); ``adjustment``
    says whether a DST rule moved or doubled it.
    """

    planned_at: datetime
    wall: datetime
    adjustment: Adjustment

    def local(self, zone: ZoneInfo) -> datetime:
        """``planned_at`` in ``zone``."""
        return self.planned_at.astimezone(zone)


class Timetable:
    """The fires of one cron expression in one zone under one DST policy."""

    def __init__(
        self,
        spec: CronSpec,
        zone: ZoneInfo,
        *,
        dst_gap: DstGap = DstGap.AUTO,
        dst_overlap: DstOverlap = DstOverlap.AUTO,
    ) -> None:
        self.spec = spec
        self.zone = zone
        self.dst_gap, self.dst_overlap = effective_policy(
            dst_gap, dst_overlap, fixed_time=spec.fixed_time
        )
        self._iterator = iterator_for(spec.expression, spec.has_seconds)
        self._memo: dict[datetime, Fire] = {}
        self._utc = zone.key in _UTC_KEYS

    @classmethod
    def compile(
        cls,
        expression: str,
        timezone: str = "UTC",
        *,
        dst_gap: DstGap = DstGap.AUTO,
        dst_overlap: DstOverlap = DstOverlap.AUTO,
        schedule_id: str | None = None,
    ) -> Timetable:
        """Validate and build; raises the :class:`~engine.errors.ValidationError` subclasses."""
        spec = parse_cron(expression, hash_key=schedule_id)
        return cls(spec, load_zone(timezone), dst_gap=dst_gap, dst_overlap=dst_overlap)

    def next_fire(self, after: datetime) -> Fire:
        """The first fire strictly after ``after`` (which must be timezone-aware)."""
        if after.tzinfo is not UTC:
            if after.tzinfo is None:
                raise InvalidField(f"{after.isoformat()} has no UTC offset; pass an aware datetime")
            after = after.astimezone(UTC)
        fire = self._memo.get(after)
        if fire is None:
            fire = self._compute_next(after)
            if len(self._memo) >= MEMO_ENTRIES_MAX:
                del self._memo[next(iter(self._memo))]
            self._memo[after] = fire
        return fire

    def fires(self, after: datetime, count: int) -> list[Fire]:
        """The next ``count`` fires after ``after``, in order."""
        if not 1 <= count <= FIRES_PER_CALL_MAX:
            raise InvalidField(f"count must be between 1 and {FIRES_PER_CALL_MAX}, got {count}")
        result: list[Fire] = []
        for _ in range(count):
            fire = self.next_fire(after)
            result.append(fire)
            after = fire.planned_at
        return result

    def _compute_next(self, after: datetime) -> Fire:
        if self._utc:
            # No transitions: a wall time is its instant.
            self._iterator.set_current(after.replace(tzinfo=None, microsecond=0), force=True)
            wall: datetime = self._iterator.get_next(datetime)
            return Fire(planned_at=wall.replace(tzinfo=UTC), wall=wall, adjustment=Adjustment.NONE)
        zone = self.zone
        wall_after = after.astimezone(zone).replace(tzinfo=None, microsecond=0)
        start = wall_after
        first, second = fold_instants(wall_after, zone)
        if first < second:
            # ``after`` lies in a repeated hour: wall times before it may still have a pass
            # ahead, so start scanning from the beginning of the overlap.
            start = wall_after - (second - first)
        horizon = wall_after + SCAN_HORIZON
        self._iterator.set_current(start, force=True)
        best: Fire | None = None
        best_wall = wall_after
        while True:
            wall = self._iterator.get_next(datetime)
            if wall > horizon:
                raise ScheduleNeverFires(
                    f"{self.spec.source!r} in {zone.key} does not fire within "
                    f"{SCAN_HORIZON.days // 366} years after {after.isoformat()} under DST "
                    f"policy gap={self.dst_gap} overlap={self.dst_overlap}"
                )
            first, second = fold_instants(wall, zone)
            if best is not None:
                # Stop once no later wall time can resolve to an instant before ``best``:
                # a unique wall time later than best's, or a repeated one whose first pass
                # is already no earlier than best (later passes are later still).
                if first < second:
                    if first >= best.planned_at:
                        break
                elif wall > best_wall:
                    break
            for resolved in resolve_folds(first, second, zone, self.dst_gap, self.dst_overlap):
                instant = resolved.instant
                if instant > after and (best is None or instant < best.planned_at):
                    best = Fire(planned_at=instant, wall=wall, adjustment=resolved.adjustment)
                    best_wall = instant.astimezone(zone).replace(tzinfo=None)
        if best is None:  # pragma: no cover - the loop only breaks once best is set
            raise AssertionError("scan ended without a fire")
        return best


class TimetableCache:
    """Shares compiled timetables (and so their memos) between schedules.

    Keyed by the *resolved* expression (``H`` replaced by the schedule's numbers), zone and
    policy, so schedules whose ``H`` lands on the same minute share one timetable and its
    memo. Bounded by :data:`TIMETABLES_MAX` (LRU).
    """

    def __init__(self, max_entries: int = TIMETABLES_MAX) -> None:
        self._max_entries = max_entries
        self._entries: OrderedDict[tuple[str, str, DstGap, DstOverlap], Timetable] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def get(
        self,
        expression: str,
        timezone: str = "UTC",
        *,
        dst_gap: DstGap = DstGap.AUTO,
        dst_overlap: DstOverlap = DstOverlap.AUTO,
        schedule_id: str | None = None,
    ) -> Timetable:
        """The timetable for these settings, compiled on first use.

        Looked up by the expression as written with ``H`` resolved, before any parsing: a
        planner loading a million schedules pays the validation once per distinct
        expression, not once per schedule. Only a miss parses (and validates) it."""
        key = (resolve_hash(expression, schedule_id), timezone, dst_gap, dst_overlap)
        timetable = self._entries.get(key)
        if timetable is not None:
            self.hits += 1
            self._entries.move_to_end(key)
            return timetable
        self.misses += 1
        spec = parse_cron(expression, hash_key=schedule_id)
        timetable = Timetable(spec, load_zone(timezone), dst_gap=dst_gap, dst_overlap=dst_overlap)
        self._entries[key] = timetable
        if len(self._entries) > self._max_entries:
            self._entries.popitem(last=False)
        return timetable

    def __len__(self) -> int:
        return len(self._entries)
