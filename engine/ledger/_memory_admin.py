"""The operator-facing half of :class:`~engine.ledger.memory.MemoryLedger`.

Configuration (task types, tenants), reads of the execution history, dead-letter replay and
the audit trail it writes: what operators, the CLI and the API call, as opposed to the hot
path of planning and dispatch that :mod:`engine.ledger.memory` keeps. It is a mixin of that
one class, split out to keep each module small; it owns no state of its own, but declares
the tables of the ledger it reads and writes, and follows the ledger's rules (one trio
checkpoint, then the whole call without awaiting; the whole input is checked before
anything changes).
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime

import msgspec
import trio

from engine.errors import NotFound
from engine.ledger import _memory_tables as transitions
from engine.ledger._memory_tables import (
    AuditLog,
    ExecutionTable,
    VersionedTable,
    as_utc_or_none,
    by_planned_time,
    check_batch,
    check_limit,
    decode_planned_cursor,
)
from engine.ledger.base import (
    BATCH_ROWS_MAX,
    PAGE_SIZE_MAX,
    AuditQuery,
    DeadLettersPurge,
    DeadLettersReplay,
    ExecutionDetail,
    ExecutionsQuery,
    Page,
    TaskTypesPut,
    TenantsPut,
    encode_cursor,
    replay_audit_details,
    task_type_in_use,
)
from engine.ledger.common import (
    dead_letter_purge_details,
    lost_users,
    task_type_grant_in_use,
    task_type_runs_in_use,
)
from engine.model import (
    AuditAction,
    AuditEvent,
    Execution,
    ExecutionStatus,
    Schedule,
    TaskType,
    Tenant,
    validate_actor,
    validate_reason,
    validate_task_type,
    validate_tenant,
)


class AdminMethods:
    """Task types, tenants, execution reads, dead-letter replay and the audit trail."""

    # The ledger's tables this half uses (set by MemoryLedger.__init__).
    _schedules: dict[str, Schedule]
    _executions: ExecutionTable
    _task_types: VersionedTable[TaskType]
    _tenants: VersionedTable[Tenant]
    _audit: AuditLog

    def _now(self) -> datetime:
        raise NotImplementedError  # the ledger's clock, provided by MemoryLedger

    # task types and tenants ----------------------------------------------------------------

    async def task_types_put(self, params: TaskTypesPut) -> TaskType:
        await trio.lowlevel.checkpoint()
        task_type = validate_task_type(params.task_type)
        # Stored as a JSON round trip, as Postgres stores it: later changes to the caller's
        # dict cannot reach the ledger, and what is read back is what JSON can carry.
        settings = msgspec.json.decode(msgspec.json.encode(task_type.settings))
        task_type = msgspec.structs.replace(task_type, settings=settings)
        current = self._task_types.find(task_type.name)
        self._task_types.check_version(task_type.name, params.expected_version)
        if current is not None and lost_users(current, task_type):
            self._check_no_lost_users(task_type)
        return self._task_types.put(task_type.name, task_type, params.expected_version, self._now())

    def _check_no_lost_users(self, task_type: TaskType) -> None:
        """Refuse a change that takes ``task_type`` away from tenants with live schedules
        naming it."""
        lost = Counter(
            schedule.tenant_id
            for schedule in self._schedules.values()
            if schedule.task_type == task_type.name and not task_type.usable_by(schedule.tenant_id)
        )
        if lost:
            raise task_type_grant_in_use(task_type.name, sorted(lost.items()))

    async def task_types_get(self, name: str) -> TaskType:
        await trio.lowlevel.checkpoint()
        return self._task_types.get(name)

    async def task_types_list(self) -> list[TaskType]:
        await trio.lowlevel.checkpoint()
        return self._task_types.rows()

    async def task_types_delete(self, name: str) -> TaskType:
        await trio.lowlevel.checkpoint()
        self._task_types.get(name)
        users = sorted(key for key, s in self._schedules.items() if s.task_type == name)
        if users:
            raise task_type_in_use(name, len(users), users)
        runs = self._executions.unfinished_of_task_type(name)
        if runs:
            raise task_type_runs_in_use(name, runs)
        return self._task_types.delete(name)

    async def tenants_put(self, params: TenantsPut) -> Tenant:
        await trio.lowlevel.checkpoint()
        tenant = validate_tenant(params.tenant)
        return self._tenants.put(tenant.tenant_id, tenant, params.expected_version, self._now())

    async def tenants_get(self, tenant_id: str) -> Tenant:
        await trio.lowlevel.checkpoint()
        return self._tenants.get(tenant_id)

    async def tenants_list(self) -> list[Tenant]:
        await trio.lowlevel.checkpoint()
        return self._tenants.rows()

    # execution history -----------------------------------------------------------------------

    async def executions_get(self, execution_id: str) -> ExecutionDetail:
        await trio.lowlevel.checkpoint()
        execution = self._executions.get(execution_id)
        if execution is None:
            raise NotFound(f"execution {execution_id!r} does not exist")
        return ExecutionDetail(
            execution=execution, attempts=self._executions.attempts(execution_id)
        )

    async def executions_query(self, params: ExecutionsQuery) -> Page[Execution]:
        await trio.lowlevel.checkpoint()
        check_limit(params.limit, PAGE_SIZE_MAX)
        after = None if params.cursor is None else decode_planned_cursor(params.cursor)
        planned_from = as_utc_or_none(params.planned_from, field="planned_from")
        planned_to = as_utc_or_none(params.planned_to, field="planned_to")
        finished_from = as_utc_or_none(params.finished_from, field="finished_from")
        candidates = (
            self._executions.everything()
            if params.schedule_id is None
            else self._executions.of_schedule(params.schedule_id)
        )
        matching = []
        for execution in candidates:
            if (
                (after is not None and by_planned_time(execution) <= after)
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
            next_cursor=encode_cursor(last.planned_at.isoformat(), last.execution_id),
        )

    # dead letters and the audit trail -------------------------------------------------------

    async def dead_letters_replay(self, params: DeadLettersReplay) -> list[str]:
        await trio.lowlevel.checkpoint()
        check_batch(len(params.execution_ids), BATCH_ROWS_MAX, field="execution_ids")
        actor = validate_actor(params.actor)
        reason = validate_reason(params.reason)
        now = self._now()
        replayed = []
        for key in dict.fromkeys(params.execution_ids):
            execution = self._executions.get(key)
            if execution is None or execution.status is not ExecutionStatus.DEAD_LETTER:
                continue
            schedule = self._schedules.get(execution.schedule_id)
            if schedule is None or schedule.tenant_id != execution.tenant_id:
                continue  # its schedule is deleted: it could not run (no payload)
            self._executions.put(transitions.replayed(execution, now))
            details = replay_audit_details(reason, execution.attempt, execution.error_code)
            self._audit.append(now, actor, AuditAction.DEAD_LETTER_REPLAY.value, key, details)
            replayed.append(key)
        return replayed

    async def dead_letters_purge(self, params: DeadLettersPurge) -> list[str]:
        await trio.lowlevel.checkpoint()
        check_batch(len(params.execution_ids), BATCH_ROWS_MAX, field="execution_ids")
        actor = validate_actor(params.actor)
        reason = validate_reason(params.reason)
        now = self._now()
        purged = []
        for key in dict.fromkeys(params.execution_ids):
            execution = self._executions.get(key)
            if execution is None or execution.status is not ExecutionStatus.DEAD_LETTER:
                continue
            self._executions.purge(key)
            details = dead_letter_purge_details(
                reason, execution.attempt, execution.error_code, execution.schedule_id
            )
            self._audit.append(now, actor, AuditAction.DEAD_LETTER_PURGE.value, key, details)
            purged.append(key)
        return purged

    async def audit_list(self, params: AuditQuery) -> list[AuditEvent]:
        await trio.lowlevel.checkpoint()
        check_limit(params.limit, PAGE_SIZE_MAX)
        return self._audit.matching(
            params.target, params.action, params.after_event_id, params.limit
        )


def _finished_since(execution: Execution, instant: datetime) -> bool:
    return execution.finished_at is not None and execution.finished_at >= instant
