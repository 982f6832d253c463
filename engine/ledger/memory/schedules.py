"""Schedules, their quotas and census, and the change feed, in memory (the twin of
:mod:`engine.ledger.postgres.schedules`).

A deleted schedule leaves the live table for a tombstone table; its id may be created
again, and planning inserts executions only for live schedules. Every schedule write
appends to the change feed in the same call. Pausing or deleting a schedule skips its
executions that have not started; resuming or re-creating it queues again those of its
fires still to come.
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime
from typing import Final

import msgspec
import trio

from engine.core.dst import DstGap, DstOverlap
from engine.ledger.checks import check_limit, check_wait_timeout
from engine.ledger.common import (
    changes_pruned,
    decode_id_cursor,
    encode_cursor,
    fires_among,
    quota_exceeded,
    schedules_exist,
    unknown_task_types,
    unusable_task_types,
    version_conflict,
)
from engine.ledger.memory.state import MemoryState
from engine.ledger.memory.tables import added, revivable, skipped_by_schedule
from engine.ledger.params import (
    PAGE_SIZE_MAX,
    SCHEDULE_DELETED,
    SCHEDULE_DELETED_MESSAGE,
    SCHEDULE_PAUSED,
    SCHEDULE_PAUSED_MESSAGE,
    ChangeKind,
    Page,
    PlannableSchedule,
    ScheduleChange,
    ScheduleChangesPrune,
    ScheduleChangesSince,
    ScheduleGroup,
    SchedulesCensus,
    SchedulesCreate,
    SchedulesDelete,
    SchedulesList,
    SchedulesPlannable,
    SchedulesUpdate,
    plannable,
)
from engine.model import ExecutionStatus, Schedule

_NOT_STARTED: Final = frozenset({ExecutionStatus.QUEUED, ExecutionStatus.FAILED})

_GroupKey = tuple[str, str, str, str, str, str]
"""cron_expr, timezone, dst_gap, dst_overlap, tenant_id, task_type."""


class ScheduleMethods(MemoryState):
    """Schedules, quotas, the census and the change feed."""

    async def schedules_create(self, params: SchedulesCreate) -> list[Schedule]:
        await trio.lowlevel.checkpoint()
        checked = params.checked().schedules
        self._require_task_types(checked)
        existing = sorted(
            schedule.schedule_id
            for schedule in checked
            if schedule.schedule_id in self._schedules
            # A deleted id is only ever revived for the tenant that had it.
            or self._tombstones.get(schedule.schedule_id, schedule).tenant_id != schedule.tenant_id
        )
        if existing:
            raise schedules_exist(existing)
        self._require_quotas(checked)
        now = self._now()
        created = []
        for schedule in checked:
            tombstone = self._tombstones.pop(schedule.schedule_id, None)
            created.append(self._store_created(schedule, tombstone, now))
        return created

    async def schedules_update(self, params: SchedulesUpdate) -> Schedule:
        await trio.lowlevel.checkpoint()
        replacement = params.checked().schedule
        self._require_task_types([replacement])
        current = self._live_schedule(replacement.schedule_id)
        if current.version != params.expected_version:
            raise version_conflict(
                "schedule", current.schedule_id, current.version, params.expected_version
            )
        now = self._now()
        return self._store_updated(current, replacement, now)

    async def schedules_delete(self, params: SchedulesDelete) -> Schedule:
        await trio.lowlevel.checkpoint()
        current = self._live_schedule(params.schedule_id)
        expected = params.expected_version
        if expected is not None and current.version != expected:
            raise version_conflict("schedule", current.schedule_id, current.version, expected)
        self._store_deleted(current, self._now())
        return current

    # The three writes of a schedule, each with its effects on the executions and the change
    # feed; the single-object methods above and a manifest apply both make them.

    def _store_created(
        self, schedule: Schedule, tombstone: Schedule | None, now: datetime
    ) -> Schedule:
        """Store a new schedule (``tombstone``: the deleted one of its id, popped by the
        caller, whose version it continues and whose lifecycle skips it may revive)."""
        stored = msgspec.structs.replace(
            schedule,
            version=1 if tombstone is None else tombstone.version + 1,
            partition_id=self._partition(schedule.schedule_id),
            updated_at=now,
        )
        self._schedules[stored.schedule_id] = stored
        if tombstone is not None and stored.enabled:
            self._revive_lifecycle_skips(stored, now)
        self._record_change(stored, ChangeKind.CREATED)
        return stored

    def _store_updated(self, current: Schedule, replacement: Schedule, now: datetime) -> Schedule:
        """Replace ``current`` (its partition kept, its version moved on); a pause skips its
        pending fires, a resume revives the skips a pause made."""
        stored = msgspec.structs.replace(
            replacement,
            version=current.version + 1,
            partition_id=current.partition_id,
            updated_at=now,
        )
        self._schedules[stored.schedule_id] = stored
        if current.enabled and not stored.enabled:
            self._skip_pending(stored.schedule_id, now, SCHEDULE_PAUSED, SCHEDULE_PAUSED_MESSAGE)
        elif stored.enabled and not current.enabled:
            self._revive_lifecycle_skips(stored, now)
        self._record_change(stored, ChangeKind.UPDATED)
        return stored

    def _store_deleted(self, current: Schedule, now: datetime) -> None:
        """Move ``current`` to the tombstones and skip its pending fires."""
        del self._schedules[current.schedule_id]
        self._tombstones[current.schedule_id] = current
        self._skip_pending(current.schedule_id, now, SCHEDULE_DELETED, SCHEDULE_DELETED_MESSAGE)
        self._record_change(current, ChangeKind.DELETED)

    async def schedules_get(self, schedule_id: str) -> Schedule:
        await trio.lowlevel.checkpoint()
        return self._live_schedule(schedule_id)

    async def schedules_get_many(self, schedule_ids: list[str]) -> dict[str, Schedule]:
        await trio.lowlevel.checkpoint()
        if schedule_ids:
            check_limit(len(schedule_ids), PAGE_SIZE_MAX, field="schedule_ids")
        found = (self._schedules.get(schedule_id) for schedule_id in schedule_ids)
        return {schedule.schedule_id: schedule for schedule in found if schedule is not None}

    async def schedules_list(self, params: SchedulesList) -> Page[Schedule]:
        await trio.lowlevel.checkpoint()
        params = params.checked()
        after = None if params.cursor is None else decode_id_cursor(params.cursor)
        prefix = params.id_prefix or ""
        matching = []
        for key in sorted(self._schedules):
            schedule = self._schedules[key]
            if after is not None and key <= after:
                continue
            if (
                not key.startswith(prefix)
                or params.tenant_id not in (None, schedule.tenant_id)
                or params.task_type not in (None, schedule.task_type)
                or params.enabled not in (None, schedule.enabled)
                or params.partition_id not in (None, schedule.partition_id)
            ):
                continue
            matching.append(schedule)
            if len(matching) > params.limit:
                break
        items = matching[: params.limit]
        more = len(matching) > params.limit
        return Page(items=items, next_cursor=encode_cursor(items[-1].schedule_id) if more else None)

    async def schedules_plannable(self, params: SchedulesPlannable) -> list[PlannableSchedule]:
        await trio.lowlevel.checkpoint()
        params = params.checked()
        found: list[PlannableSchedule] = []
        for key in sorted(self._schedules):
            schedule = self._schedules[key]
            if (
                (params.after is not None and key <= params.after)
                or schedule.partition_id != params.partition_id
                or not schedule.enabled
            ):
                continue
            found.append(plannable(schedule))
            if len(found) == params.limit:
                break
        return found

    async def schedule_changes(self, params: ScheduleChangesSince) -> list[ScheduleChange]:
        await trio.lowlevel.checkpoint()
        params = params.checked()
        pruned_through = self._feed.pruned_through
        if params.after_seq < pruned_through:
            raise changes_pruned(params.after_seq, pruned_through)
        return self._feed.since(params.after_seq, params.limit)

    async def schedule_changes_head(self) -> int:
        await trio.lowlevel.checkpoint()
        return self._feed.last_seq

    async def schedule_changes_prune(self, params: ScheduleChangesPrune) -> int:
        await trio.lowlevel.checkpoint()
        params = params.checked()
        return self._feed.prune(params.before, params.limit)

    async def schedule_changes_wait(self, after_seq: int, timeout_s: float) -> bool:
        await trio.lowlevel.checkpoint()
        check_wait_timeout(timeout_s)
        return await self._feed.wait_after(after_seq, timeout_s)

    def _skip_pending(self, schedule_id: str, now: datetime, code: str, message: str) -> None:
        """Skip the executions of a schedule that have not started (deleted or paused)."""
        for execution in self._executions.of_schedule(schedule_id):
            if execution.status in _NOT_STARTED:
                self._executions.put(skipped_by_schedule(execution, now, code, message))

    def _revive_lifecycle_skips(self, schedule: Schedule, now: datetime) -> None:
        """Queue again the fires of ``schedule`` from ``now`` on that a pause or a delete
        skipped before they started, if its timetable still has them (resume, re-create)."""
        candidates = [
            execution
            for execution in self._executions.of_schedule(schedule.schedule_id)
            if execution.planned_at >= now and revivable(execution, schedule)
        ]
        fires = fires_among(schedule, (execution.planned_at for execution in candidates))
        for execution in candidates:
            if execution.planned_at in fires:
                self._executions.put(added(schedule, execution.planned_at, now))

    def _require_task_types(self, schedules: list[Schedule]) -> None:
        found = {
            name: task_type
            for name in {schedule.task_type for schedule in schedules}
            if (task_type := self._task_types.find(name)) is not None
        }
        unknown = unusable_task_types(schedules, found)
        if unknown:
            raise unknown_task_types(unknown)

    # quotas and census -----------------------------------------------------------------------

    def _require_quotas(self, schedules: list[Schedule]) -> None:
        """``QuotaExceeded`` for the first tenant (by id) that ``schedules``, all new, would
        take past its ``schedules_max``."""
        asked = Counter(schedule.tenant_id for schedule in schedules)
        for tenant_id in sorted(asked):
            tenant = self._tenants.find(tenant_id)
            if tenant is None or tenant.schedules_max is None:
                continue
            count = self._live_count(tenant_id)
            if count + asked[tenant_id] > tenant.schedules_max:
                raise quota_exceeded(tenant_id, tenant.schedules_max, count, asked[tenant_id])

    def _live_count(self, tenant_id: str) -> int:
        return sum(1 for schedule in self._schedules.values() if schedule.tenant_id == tenant_id)

    async def schedules_count(self, tenant_id: str) -> int:
        await trio.lowlevel.checkpoint()
        return self._live_count(tenant_id)

    async def schedules_census(self, params: SchedulesCensus) -> list[ScheduleGroup]:
        await trio.lowlevel.checkpoint()
        params = params.checked()
        groups: dict[_GroupKey, tuple[int, str]] = {}
        for schedule in self._schedules.values():
            if not schedule.enabled or params.tenant_id not in (None, schedule.tenant_id):
                continue
            key = (
                schedule.cron_expr,
                schedule.timezone,
                str(schedule.dst_gap),
                str(schedule.dst_overlap),
                schedule.tenant_id,
                schedule.task_type,
            )
            count, sample = groups.get(key, (0, schedule.schedule_id))
            groups[key] = (count + 1, min(sample, schedule.schedule_id))
        ordered = sorted(groups.items(), key=lambda item: (-item[1][0], item[0]))
        return [
            ScheduleGroup(
                cron_expr=cron_expr,
                timezone=timezone,
                dst_gap=DstGap(dst_gap),
                dst_overlap=DstOverlap(dst_overlap),
                tenant_id=tenant_id,
                task_type=task_type,
                count=count,
                sample_schedule_id=sample,
            )
            for (cron_expr, timezone, dst_gap, dst_overlap, tenant_id, task_type), (
                count,
                sample,
            ) in ordered[: params.limit]
        ]
