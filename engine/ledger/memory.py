"""An in-memory, deterministic :class:`~engine.ledger.base.Ledger` for tests and simulations.

It honours the whole contract of :mod:`engine.ledger.base` and passes the same contract suite
as the PostgreSQL ledger, so a planner, dispatcher or whole simulated cluster can run against
it with no database.

Design
------
* **Time.** The "database clock" is the injected :class:`~engine.clock.Clock`: every expiry
  is judged by, and every timestamp written is, ``clock.now()``. Simulations give the ledger
  its own (possibly skewed) clock, just as Postgres has its own ``now()``.
* **Transactions.** Each method opens with one trio checkpoint (so callers see a real
  suspension point, and cancellation may land there) and then runs to completion without
  awaiting: one method is one serializable transaction. Every method validates its whole
  input and checks every fence *before* changing anything, so a refused call changes nothing.
* **Validation order.** Malformed input (``InvalidField``) is reported before a lost lease
  (``LeaseLost``), since it is a caller bug whoever owns the partition.
* **Determinism.** No randomness, no real time, and no behaviour that depends on set or hash
  order: listings are sorted and batches are processed in the order given.
* **Soft delete.** A deleted schedule leaves the live table for a tombstone table; its id
  may be created again, and planning inserts executions only for live schedules.
* **Cluster caps.** A claim counts the running executions of a capped task type from an
  index kept by the execution table, so uncapped task types cost a dictionary lookup.
* **Layout.** This module keeps schedules, planning and dispatch; four mixins of this class
  hold the rest: :mod:`engine.ledger._memory_cluster` (clock, settings, leases, membership),
  :mod:`engine.ledger._memory_admin` (task types, tenants, execution reads, dead-letter
  replay, the audit trail), :mod:`engine.ledger._memory_api` (API tokens, trigger and
  backfill, schedule quotas and census) and :mod:`engine.ledger._memory_manifests`
  (manifest sets). The tables and row transitions are in
  :mod:`engine.ledger._memory_tables`.

Invariants
----------
* ``partition_id`` of a schedule is ``partition_of(schedule_id, partition_count)``, and an
  execution lives in its schedule's partition.
* ``attempt_expires_at`` is set exactly while an execution is ``running``; ``finished_at``
  exactly while it is terminal.
* Terminal executions never change again, except a dead letter that is replayed.
* No claim takes a task type past its ``max_concurrency_cluster`` running executions.
* Every live schedule names a stored task type (deleted schedules need not).
"""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import msgspec
import trio

from engine.clock import Clock
from engine.core.hashing import partition_of
from engine.errors import AlreadyExists, ConfigError, InvalidField, NotFound, VersionConflict
from engine.ledger import _memory_tables as transitions
from engine.ledger._memory_admin import AdminMethods
from engine.ledger._memory_api import ApiMethods, TokenTable, added, revivable
from engine.ledger._memory_cluster import ClusterMethods
from engine.ledger._memory_manifests import ManifestMethods
from engine.ledger._memory_tables import (
    AuditLog,
    ChangeFeed,
    ExecutionTable,
    LeaseTable,
    VersionedTable,
    as_utc,
    as_utc_or_none,
    by_planned_time,
    check_batch,
    check_limit,
    decode_id_cursor,
    seconds,
)
from engine.ledger.base import (
    BATCH_ROWS_MAX,
    PAGE_SIZE_MAX,
    PLAN_PAGE_MAX,
    SCHEDULE_DELETED,
    SCHEDULE_DELETED_MESSAGE,
    SCHEDULE_PAUSED,
    SCHEDULE_PAUSED_MESSAGE,
    ChangeKind,
    ClusterSettings,
    CompleteResult,
    ExecutionsClaim,
    ExecutionsComplete,
    ExecutionsDue,
    ExecutionsExtend,
    ExecutionsPlan,
    ExecutionsPurge,
    ExecutionsRequeueExpired,
    ExecutionsSkip,
    Fence,
    Ledger,
    NodeInfo,
    Outcome,
    Page,
    PlannableSchedule,
    PlannedExecution,
    PlanResult,
    ScheduleAdvance,
    ScheduleChange,
    ScheduleChangesPrune,
    ScheduleChangesSince,
    SchedulesCreate,
    SchedulesDelete,
    SchedulesList,
    SchedulesPlannable,
    SchedulesUpdate,
    due_cursor,
    encode_cursor,
    unknown_task_types,
)
from engine.ledger.common import changes_pruned, check_id_prefix, fires_among, unusable_task_types
from engine.ledger.manifests import Label
from engine.ledger.params import PARTITIONS_DEFAULT, REGION_DEFAULT, plannable
from engine.model import (
    ConsoleSession,
    Execution,
    ExecutionStatus,
    PlannerCheckpoint,
    Schedule,
    TaskType,
    Tenant,
    check_payload_size,
    execution_id,
    parse_execution_id,
    validate_identifier,
)

REGION_EPOCH_INITIAL = 1
"""The region epoch of a fresh cluster (no failover has happened yet)."""

_PURGEABLE = frozenset({ExecutionStatus.SUCCEEDED, ExecutionStatus.SKIPPED})
_NOT_STARTED = frozenset({ExecutionStatus.QUEUED, ExecutionStatus.FAILED})
_DEAD_LETTERS = frozenset({ExecutionStatus.DEAD_LETTER})


class MemoryLedger(ClusterMethods, AdminMethods, ApiMethods, ManifestMethods):
    """The ledger contract in process memory, on an injected clock.

    ``partition_count`` and ``active_region`` are the cluster settings a ``migrate`` would
    fix; every partition starts with a free lease row (no owner, token 0).
    """

    def __init__(
        self,
        *,
        clock: Clock,
        partition_count: int = PARTITIONS_DEFAULT,
        active_region: str = REGION_DEFAULT,
    ) -> None:
        if partition_count < 1:
            raise ConfigError(f"partition_count must be at least 1, got {partition_count}")
        self._clock = clock
        self._settings = ClusterSettings(
            partition_count=partition_count,
            active_region=active_region,
            region_epoch=REGION_EPOCH_INITIAL,
        )
        self._schedules: dict[str, Schedule] = {}
        # Deleted schedules, as they were: the soft delete of the Postgres schema. Nothing
        # reads them back (a deleted schedule is absent to every method), but a simulation or
        # a debugger can inspect what was deleted.
        self._tombstones: dict[str, Schedule] = {}
        self._feed = ChangeFeed()
        self._leases = LeaseTable(partition_count)
        self._nodes: dict[str, NodeInfo] = {}
        self._checkpoints: dict[int, datetime] = {}
        self._executions = ExecutionTable()
        self._task_types = VersionedTable[TaskType]("task type")
        self._tenants = VersionedTable[Tenant](
            "tenant", absent="has no stored settings (it has the defaults)"
        )
        self._audit = AuditLog()
        self._tokens = TokenTable()
        self._sessions: dict[bytes, ConsoleSession] = {}
        """Console sessions by the hash of their id."""
        self._manifest_labels: dict[Label, str] = {}
        """Ownership labels of manifest sets: (kind, name) -> set name."""

    def _now(self) -> datetime:
        now = self._clock.now()
        if now.tzinfo is None:
            raise ConfigError("the ledger's clock must return aware datetimes")
        return now.astimezone(UTC)

    def _partition(self, schedule_id: str) -> int:
        return partition_of(schedule_id, self._settings.partition_count)

    # schedules -------------------------------------------------------------------------------

    def _checked_schedule(self, schedule: Schedule) -> Schedule:
        """``schedule`` validated, with ``next_run_at`` in UTC."""
        validate_identifier(schedule.schedule_id, kind="schedule id")
        check_payload_size(schedule.payload)
        next_run_at = as_utc_or_none(schedule.next_run_at, field="next_run_at")
        return msgspec.structs.replace(schedule, next_run_at=next_run_at)

    async def schedules_create(self, params: SchedulesCreate) -> list[Schedule]:
        await trio.lowlevel.checkpoint()
        check_batch(len(params.schedules), BATCH_ROWS_MAX, field="schedules")
        checked = [self._checked_schedule(schedule) for schedule in params.schedules]
        ids = [schedule.schedule_id for schedule in checked]
        repeated = sorted(key for key, count in Counter(ids).items() if count > 1)
        if repeated:
            raise InvalidField(f"schedule id(s) {repeated} appear more than once in the batch")
        self._require_task_types(checked)
        existing = sorted(
            schedule.schedule_id
            for schedule in checked
            if schedule.schedule_id in self._schedules
            # A deleted id is only ever revived for the tenant that had it.
            or self._tombstones.get(schedule.schedule_id, schedule).tenant_id != schedule.tenant_id
        )
        if existing:
            raise AlreadyExists(f"schedule(s) {existing} exist already", ids=tuple(existing))
        self._require_quotas(checked)
        now = self._now()
        created = []
        for schedule in checked:
            tombstone = self._tombstones.pop(schedule.schedule_id, None)
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
            created.append(stored)
        return created

    async def schedules_update(self, params: SchedulesUpdate) -> Schedule:
        await trio.lowlevel.checkpoint()
        replacement = self._checked_schedule(params.schedule)
        self._require_task_types([replacement])
        current = self._live_schedule(replacement.schedule_id)
        if current.version != params.expected_version:
            raise VersionConflict(
                f"schedule {current.schedule_id!r} is at version {current.version}, not "
                f"{params.expected_version}; re-read it and apply the change again"
            )
        now = self._now()
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

    async def schedules_delete(self, params: SchedulesDelete) -> Schedule:
        await trio.lowlevel.checkpoint()
        current = self._live_schedule(params.schedule_id)
        expected = params.expected_version
        if expected is not None and current.version != expected:
            raise VersionConflict(
                f"schedule {current.schedule_id!r} is at version {current.version}, not {expected}"
            )
        now = self._now()
        del self._schedules[current.schedule_id]
        self._tombstones[current.schedule_id] = current
        self._skip_pending(current.schedule_id, now, SCHEDULE_DELETED, SCHEDULE_DELETED_MESSAGE)
        self._record_change(current, ChangeKind.DELETED)
        return current

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
        check_limit(params.limit, PAGE_SIZE_MAX)
        after = None if params.cursor is None else decode_id_cursor(params.cursor)
        prefix = check_id_prefix(params.id_prefix) or ""
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
        check_limit(params.limit, PLAN_PAGE_MAX)
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
        check_limit(params.limit, PAGE_SIZE_MAX)
        pruned_through = self._feed.pruned_through
        if params.after_seq < pruned_through:
            raise changes_pruned(params.after_seq, pruned_through)
        return self._feed.since(params.after_seq, params.limit)

    async def schedule_changes_head(self) -> int:
        await trio.lowlevel.checkpoint()
        return self._feed.last_seq

    async def schedule_changes_prune(self, params: ScheduleChangesPrune) -> int:
        await trio.lowlevel.checkpoint()
        check_limit(params.limit, BATCH_ROWS_MAX)
        before = as_utc(params.before, field="before")
        return self._feed.prune(before, params.limit)

    async def schedule_changes_wait(self, after_seq: int, timeout_s: float) -> bool:
        await trio.lowlevel.checkpoint()
        if not timeout_s >= 0:
            raise InvalidField(f"timeout_s must be zero or more seconds, got {timeout_s}")
        return await self._feed.wait_after(after_seq, timeout_s)

    def _skip_pending(self, schedule_id: str, now: datetime, code: str, message: str) -> None:
        """Skip the executions of a schedule that have not started (deleted or paused)."""
        for execution in self._executions.of_schedule(schedule_id):
            if execution.status in _NOT_STARTED:
                self._executions.put(transitions.skipped_by_schedule(execution, now, code, message))

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

    def _live_schedule(self, schedule_id: str) -> Schedule:
        schedule = self._schedules.get(schedule_id)
        if schedule is None:
            raise NotFound(f"schedule {schedule_id!r} does not exist")
        return schedule

    def _record_change(self, schedule: Schedule, kind: ChangeKind) -> None:
        partition = self._partition(schedule.schedule_id)
        self._feed.append(schedule.schedule_id, partition, kind, schedule.version, self._now())

    def _require_task_types(self, schedules: list[Schedule]) -> None:
        found = {
            name: task_type
            for name in {schedule.task_type for schedule in schedules}
            if (task_type := self._task_types.find(name)) is not None
        }
        unknown = unusable_task_types(schedules, found)
        if unknown:
            raise unknown_task_types(unknown)

    # planning --------------------------------------------------------------------------------

    async def checkpoints_get(self, partition_ids: list[int]) -> list[PlannerCheckpoint]:
        await trio.lowlevel.checkpoint()
        return [
            PlannerCheckpoint(
                partition_id=partition, last_evaluated_at=self._checkpoints[partition]
            )
            for partition in sorted(set(partition_ids))
            if partition in self._checkpoints
        ]

    async def executions_plan(self, params: ExecutionsPlan) -> PlanResult:
        await trio.lowlevel.checkpoint()
        fence = params.fence
        check_batch(len(params.executions), BATCH_ROWS_MAX, field="executions")
        check_batch(len(params.advances), BATCH_ROWS_MAX, field="advances")
        planned = [self._checked_planned(item, fence) for item in params.executions]
        advances = [self._checked_advance(item, fence) for item in params.advances]
        checkpoint = as_utc_or_none(params.checkpoint, field="checkpoint")
        now = self._now()
        self._leases.require([fence], now)
        inserted = self._insert_planned(planned, fence, now)
        advanced, stale = self._apply_advances(advances)
        if checkpoint is not None:
            current = self._checkpoints.get(fence.partition_id)
            self._checkpoints[fence.partition_id] = (
                checkpoint if current is None else max(current, checkpoint)
            )
        return PlanResult(inserted=inserted, advanced=advanced, stale=stale)

    def _require_in_partition(self, schedule_id: str, fence: Fence) -> None:
        partition = self._partition(schedule_id)
        if partition != fence.partition_id:
            raise InvalidField(
                f"schedule {schedule_id!r} belongs to partition {partition}, not to the fenced "
                f"partition {fence.partition_id}"
            )

    def _checked_planned(self, item: PlannedExecution, fence: Fence) -> PlannedExecution:
        self._require_in_partition(item.schedule_id, fence)
        status = ExecutionStatus(item.status)
        if status is ExecutionStatus.SKIPPED:
            if item.error_code is None:
                raise InvalidField("a skipped execution must carry an error_code saying why")
        elif status is not ExecutionStatus.QUEUED:
            raise InvalidField(f"a planned execution is queued or skipped, not {status}")
        planned_at = as_utc(item.planned_at, field="planned_at")
        return msgspec.structs.replace(item, status=status, planned_at=planned_at)

    def _checked_advance(self, item: ScheduleAdvance, fence: Fence) -> ScheduleAdvance:
        self._require_in_partition(item.schedule_id, fence)
        next_run_at = as_utc_or_none(item.next_run_at, field="next_run_at")
        return msgspec.structs.replace(item, next_run_at=next_run_at)

    def _insert_planned(
        self, planned: list[PlannedExecution], fence: Fence, now: datetime
    ) -> list[str]:
        inserted = []
        for item in planned:
            key = execution_id(item.schedule_id, item.planned_at)
            schedule = self._schedules.get(item.schedule_id)
            if schedule is None or not schedule.enabled or self._executions.get(key) is not None:
                continue
            self._executions.put(transitions.planned(item, key, fence, now))
            inserted.append(key)
        return inserted

    def _apply_advances(self, advances: list[ScheduleAdvance]) -> tuple[list[str], list[str]]:
        advanced: list[str] = []
        stale: list[str] = []
        for item in advances:
            current = self._schedules.get(item.schedule_id)
            if current is None or current.version != item.expected_version:
                stale.append(item.schedule_id)
                continue
            self._schedules[item.schedule_id] = msgspec.structs.replace(
                current, next_run_at=item.next_run_at
            )
            advanced.append(item.schedule_id)
        return advanced, stale

    # execution -------------------------------------------------------------------------------

    async def executions_due(self, params: ExecutionsDue) -> list[Execution]:
        await trio.lowlevel.checkpoint()
        check_limit(params.limit, PAGE_SIZE_MAX)
        before = as_utc(params.before, field="before")
        after = params.after
        rows = []
        for execution in self._executions.open_in(params.partition_ids):
            if not transitions.is_startable(execution, before) or (
                params.tenant_id is not None and execution.tenant_id != params.tenant_id
            ):
                continue
            cursor = due_cursor(execution)
            key = (cursor.startable_at, cursor.execution_id)
            if after is None or key > (
                as_utc(after.startable_at, field="after"),
                after.execution_id,
            ):
                rows.append((key, execution))
        rows.sort(key=lambda row: row[0])
        return [execution for _, execution in rows[: params.limit]]

    async def executions_claim(self, params: ExecutionsClaim) -> list[Execution]:
        await trio.lowlevel.checkpoint()
        check_batch(len(params.execution_ids), BATCH_ROWS_MAX, field="execution_ids")
        lease = seconds(params.attempt_lease_s, field="attempt_lease_s")
        self._require_fenced_ids(params.execution_ids, params.fences)
        now = self._now()
        tokens = self._leases.require(params.fences, now)
        room: dict[str, int | None] = {}
        started = []
        for key in dict.fromkeys(params.execution_ids):
            execution = self._executions.get(key)
            if (
                execution is None
                or not transitions.is_startable(execution, now)
                or not self._take_cap_slot(execution.task_type, room)
            ):
                continue
            token = tokens[execution.partition_id]
            running = transitions.claimed(execution, token, now, lease)
            self._executions.put(running)
            started.append(running)
        return sorted(started, key=by_planned_time)

    def _take_cap_slot(self, task_type: str, room: dict[str, int | None]) -> bool:
        """Whether one more execution of ``task_type`` may start under its cluster cap, and
        if so count it. ``room``: per task type met in this claim, the starts it has left
        (``None``: no cap), worked out at its first execution, before any of them started."""
        if task_type not in room:
            stored = self._task_types.find(task_type)
            cap = None if stored is None else stored.max_concurrency_cluster
            room[task_type] = (
                None if cap is None else cap - self._executions.running_count(task_type)
            )
        left = room[task_type]
        if left is None:
            return True
        if left <= 0:
            return False
        room[task_type] = left - 1
        return True

    async def executions_extend(self, params: ExecutionsExtend) -> list[str]:
        await trio.lowlevel.checkpoint()
        check_batch(len(params.attempts), BATCH_ROWS_MAX, field="attempts")
        lease = seconds(params.attempt_lease_s, field="attempt_lease_s")
        self._require_fenced_ids([ref.execution_id for ref in params.attempts], params.fences)
        now = self._now()
        tokens = self._leases.require(params.fences, now)
        extended: dict[str, None] = {}
        for ref in params.attempts:
            execution = self._executions.get(ref.execution_id)
            if (
                execution is None
                or execution.status is not ExecutionStatus.RUNNING
                or execution.attempt != ref.attempt
                or ref.execution_id in extended
            ):
                continue
            token = tokens[execution.partition_id]
            self._executions.put(transitions.extended(execution, token, now, lease))
            extended[ref.execution_id] = None
        return list(extended)

    async def executions_complete(self, params: ExecutionsComplete) -> CompleteResult:
        await trio.lowlevel.checkpoint()
        check_batch(len(params.completions), BATCH_ROWS_MAX, field="completions")
        self._require_fenced_ids([c.execution_id for c in params.completions], params.fences)
        completions = [
            msgspec.structs.replace(
                completion,
                outcome=Outcome(completion.outcome),
                not_before=as_utc_or_none(completion.not_before, field="not_before"),
            )
            for completion in params.completions
        ]
        now = self._now()
        tokens = self._leases.require(params.fences, now)
        applied: list[str] = []
        stale: list[str] = []
        for completion in completions:
            execution = self._executions.get(completion.execution_id)
            if (
                execution is None
                or execution.status is not ExecutionStatus.RUNNING
                or execution.attempt != completion.attempt
            ):
                stale.append(completion.execution_id)
                continue
            token = tokens[execution.partition_id]
            self._executions.put(*transitions.finished(execution, completion, token, now))
            applied.append(completion.execution_id)
        return CompleteResult(applied=applied, stale=stale)

    async def executions_skip(self, params: ExecutionsSkip) -> list[str]:
        await trio.lowlevel.checkpoint()
        check_batch(len(params.execution_ids), BATCH_ROWS_MAX, field="execution_ids")
        if not params.error_code:
            raise InvalidField("a skipped execution must carry an error_code saying why")
        self._require_fenced_ids(params.execution_ids, params.fences)
        now = self._now()
        tokens = self._leases.require(params.fences, now)
        done = []
        for key in dict.fromkeys(params.execution_ids):
            execution = self._executions.get(key)
            if execution is None or execution.status not in _NOT_STARTED:
                continue
            token = tokens[execution.partition_id]
            self._executions.put(
                transitions.skipped(execution, token, now, params.error_code, params.error_message)
            )
            done.append(key)
        return done

    async def executions_requeue_expired(self, params: ExecutionsRequeueExpired) -> list[str]:
        await trio.lowlevel.checkpoint()
        check_limit(params.limit, BATCH_ROWS_MAX)
        now = self._now()
        tokens = self._leases.require(params.fences, now)
        requeued: list[str] = []
        for execution in self._executions.open_in(tokens):
            if len(requeued) == params.limit:
                break
            if transitions.attempt_expired(execution, now):
                token = tokens[execution.partition_id]
                self._executions.put(*transitions.requeued(execution, token, now))
                requeued.append(execution.execution_id)
        return requeued

    async def executions_purge(self, params: ExecutionsPurge) -> int:
        await trio.lowlevel.checkpoint()
        check_limit(params.limit, BATCH_ROWS_MAX)
        finished_before = as_utc(params.finished_before, field="finished_before")
        self._leases.require([params.fence], self._now())
        statuses = _DEAD_LETTERS if params.dead_letters else _PURGEABLE
        purgeable: list[tuple[datetime, str]] = []
        for execution in self._executions.in_partition_unordered(params.fence.partition_id):
            finished_at = execution.finished_at
            if (
                execution.status in statuses
                and finished_at is not None
                and finished_at < finished_before
            ):
                purgeable.append((finished_at, execution.execution_id))
        doomed = sorted(purgeable)[: params.limit]
        for _, key in doomed:
            self._executions.purge(key)
        return len(doomed)

    def _require_fenced_ids(self, execution_ids: list[str], fences: list[Fence]) -> None:
        """``InvalidField`` unless every id belongs to one of the fenced partitions."""
        fenced = {fence.partition_id for fence in fences}
        for key in execution_ids:
            stored = self._executions.get(key)
            if stored is not None:
                partition = stored.partition_id
            else:
                partition = self._partition(parse_execution_id(key)[0])
            if partition not in fenced:
                raise InvalidField(
                    f"execution {key!r} belongs to partition {partition}, which none of the "
                    f"fences cover ({sorted(fenced)})"
                )


if TYPE_CHECKING:
    # mypy proves the class still satisfies the whole protocol whenever the contract grows.
    _CONFORMS: type[Ledger] = MemoryLedger
