"""Planning, dispatch and the execution history, in memory (the twin of
:mod:`engine.ledger.postgres.executions`): the planner's writes, the due read, claim,
attempt-lease renewal, completion, finish (a claim folded into its completion), skip,
re-queue of expired attempts and retention, then the reads of one execution, a query, and
the statistics a dashboard charts.

Every fenced call checks its input (``params.checked()``, then the routing of every id to
a fenced partition) and then every fence before changing anything, so a refused call
changes nothing. Whether an execution may start is :func:`~engine.model.startable_at`.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Final

import msgspec
import trio

from engine.ledger.checks import check_executions_routed, check_schedules_routed
from engine.ledger.common import decode_planned_cursor, encode_planned_cursor, not_found
from engine.ledger.memory import tables as transitions
from engine.ledger.memory.state import MemoryState
from engine.ledger.params import (
    CompleteResult,
    ExecutionDetail,
    ExecutionsBucket,
    ExecutionsClaim,
    ExecutionsComplete,
    ExecutionsDue,
    ExecutionsExtend,
    ExecutionsFinish,
    ExecutionsPlan,
    ExecutionsPurge,
    ExecutionsQuery,
    ExecutionsRequeueExpired,
    ExecutionsSkip,
    ExecutionsStats,
    Fence,
    Page,
    PlannedExecution,
    PlanResult,
    ScheduleAdvance,
    due_cursor,
)
from engine.model import (
    Execution,
    ExecutionStatus,
    PlannerCheckpoint,
    execution_id,
    is_startable,
)

_PURGEABLE: Final = frozenset({ExecutionStatus.SUCCEEDED, ExecutionStatus.SKIPPED})
_NOT_STARTED: Final = frozenset({ExecutionStatus.QUEUED, ExecutionStatus.FAILED})
_DEAD_LETTERS: Final = frozenset({ExecutionStatus.DEAD_LETTER})


class ExecutionMethods(MemoryState):
    """Planning, dispatch, retention and the execution history."""

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
        params = params.checked()
        fence, planned, advances = params.fence, params.executions, params.advances
        named = [item.schedule_id for item in planned] + [item.schedule_id for item in advances]
        check_schedules_routed(named, [fence.partition_id], self._settings.partition_count)
        checkpoint = params.checkpoint
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
        params = params.checked()
        before, after = params.before, params.after
        rows = []
        for execution in self._executions.open_in(params.partition_ids):
            if not is_startable(execution, before) or (
                params.tenant_id is not None and execution.tenant_id != params.tenant_id
            ):
                continue
            cursor = due_cursor(execution)
            key = (cursor.startable_at, cursor.execution_id)
            if after is None or key > (after.startable_at, after.execution_id):
                rows.append((key, execution))
        rows.sort(key=lambda row: row[0])
        return [execution for _, execution in rows[: params.limit]]

    async def executions_claim(self, params: ExecutionsClaim) -> list[Execution]:
        await trio.lowlevel.checkpoint()
        params = params.checked()
        lease = timedelta(seconds=params.attempt_lease_s)
        self._require_fenced_ids(params.execution_ids, params.fences)
        now = self._now()
        tokens = self._leases.require(params.fences, now)
        room: dict[str, int | None] = {}
        started = []
        for key in dict.fromkeys(params.execution_ids):
            execution = self._executions.get(key)
            if (
                execution is None
                or not is_startable(execution, now)
                or not self._take_cap_slot(execution.task_type, room)
            ):
                continue
            token = tokens[execution.partition_id]
            running = transitions.claimed(execution, token, now, lease)
            self._executions.put(running)
            started.append(running)
        return sorted(started, key=transitions.by_planned_time)

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
        params = params.checked()
        lease = timedelta(seconds=params.attempt_lease_s)
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
        params = params.checked()
        completions = params.completions
        self._require_fenced_ids([c.execution_id for c in completions], params.fences)
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

    async def executions_finish(self, params: ExecutionsFinish) -> CompleteResult:
        await trio.lowlevel.checkpoint()
        params = params.checked()
        completions = params.completions
        self._require_fenced_ids([c.execution_id for c in completions], params.fences)
        now = self._now()
        tokens = self._leases.require(params.fences, now)
        applied: list[str] = []
        stale: list[str] = []
        for completion in completions:
            execution = self._executions.get(completion.execution_id)
            if (
                execution is None
                or not is_startable(execution, now)
                or execution.attempt != completion.attempt - 1
            ):
                stale.append(completion.execution_id)
                continue
            token = tokens[execution.partition_id]
            started = completion.started_at
            assert started is not None  # checked()
            self._executions.put(
                *transitions.folded(execution, completion, token, min(started, now), now)
            )
            applied.append(completion.execution_id)
        return CompleteResult(applied=applied, stale=stale)

    async def executions_skip(self, params: ExecutionsSkip) -> list[str]:
        await trio.lowlevel.checkpoint()
        params = params.checked()
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
        params = params.checked()
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
        params = params.checked()
        finished_before = params.finished_before
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
        check_executions_routed(
            execution_ids,
            (fence.partition_id for fence in fences),
            self._settings.partition_count,
        )

    # execution history -----------------------------------------------------------------------

    async def executions_get(self, execution_id: str) -> ExecutionDetail:
        await trio.lowlevel.checkpoint()
        execution = self._executions.get(execution_id)
        if execution is None:
            raise not_found("execution", execution_id)
        return ExecutionDetail(
            execution=execution, attempts=self._executions.attempts(execution_id)
        )

    async def executions_query(self, params: ExecutionsQuery) -> Page[Execution]:
        await trio.lowlevel.checkpoint()
        params = params.checked()
        after = None if params.cursor is None else decode_planned_cursor(params.cursor)
        planned_from, planned_to = params.planned_from, params.planned_to
        finished_from = params.finished_from
        candidates = (
            self._executions.everything()
            if params.schedule_id is None
            else self._executions.of_schedule(params.schedule_id)
        )
        matching = []
        for execution in candidates:
            if (
                (after is not None and transitions.by_planned_time(execution) <= after)
                or params.tenant_id not in (None, execution.tenant_id)
                or params.status not in (None, execution.status)
                or (planned_from is not None and execution.planned_at < planned_from)
                or (planned_to is not None and execution.planned_at >= planned_to)
                or params.task_type not in (None, execution.task_type)
                or (finished_from is not None and not _finished_since(execution, finished_from))
            ):
                continue
            matching.append(execution)
            if len(matching) > params.limit:
                break
        items = matching[: params.limit]
        if len(matching) <= params.limit:
            return Page(items=items, next_cursor=None)
        last = items[-1]
        return Page(
            items=items,
            next_cursor=encode_planned_cursor(last.planned_at, last.execution_id),
        )

    # execution statistics --------------------------------------------------------------------

    async def executions_stats(self, params: ExecutionsStats) -> list[ExecutionsBucket]:
        await trio.lowlevel.checkpoint()
        params = params.checked()
        start = params.planned_from
        bucket_s = params.bucket_s
        end = start + timedelta(seconds=bucket_s * params.buckets)
        on_time = timedelta(seconds=params.on_time_s)
        rows = [_Bucket() for _ in range(params.buckets)]

        def at(instant: datetime) -> _Bucket | None:
            index = int((instant - start).total_seconds() // bucket_s)
            return rows[index] if 0 <= index < len(rows) else None

        for execution in self._executions.everything():
            planned_at = execution.planned_at
            if not start <= planned_at < end or params.tenant_id not in (
                None,
                execution.tenant_id,
            ):
                continue
            first = self._first_start(execution)
            row = rows[int((planned_at - start).total_seconds() // bucket_s)]
            row.planned += 1
            row.dead_letters += execution.status is ExecutionStatus.DEAD_LETTER
            written = min(filter(None, (execution.enqueued_at, first)), default=planned_at)
            row.plan_lag_s_max = max(row.plan_lag_s_max, (written - planned_at).total_seconds())
            if first is not None:
                row.started += 1
                row.on_time += first - planned_at <= on_time
                if (when := at(first)) is not None:
                    when.starts += 1
            elif (
                execution.status is ExecutionStatus.SKIPPED
                and execution.finished_at is not None
                and (when := at(execution.finished_at)) is not None
            ):
                when.skips += 1
        return [row.frozen() for row in rows]

    def _first_start(self, execution: Execution) -> datetime | None:
        """When the execution's first attempt started (``None``: it has not)."""
        if execution.attempt == 1:
            return execution.started_at
        if execution.attempt > 1:
            history = self._executions.attempts(execution.execution_id)
            return next((a.started_at for a in history if a.attempt == 1), None)
        return None


def _finished_since(execution: Execution, instant: datetime) -> bool:
    return execution.finished_at is not None and execution.finished_at >= instant


class _Bucket:
    """A bucket of :meth:`ExecutionMethods.executions_stats` while it is counted."""

    def __init__(self) -> None:
        self.planned = self.started = self.on_time = self.dead_letters = 0
        self.starts = self.skips = 0
        self.plan_lag_s_max = 0.0

    def frozen(self) -> ExecutionsBucket:
        return ExecutionsBucket(
            self.planned,
            self.started,
            self.on_time,
            self.dead_letters,
            self.plan_lag_s_max,
            self.starts,
            self.skips,
        )
