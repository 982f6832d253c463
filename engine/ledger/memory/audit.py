"""Operators' actions and the audit trail they write, in memory (the twin of
:mod:`engine.ledger.postgres.audit`): running a schedule now, backfilling past fires,
replaying and purging dead letters, each audited in the same call; and reading the trail.

None is fenced: any node may serve them. An added execution is written under no lease
(``fencing_token`` unset).
"""

from __future__ import annotations

import trio

from engine.ledger.common import (
    backfill_audit_details,
    backfill_in_future,
    dead_letter_purge_details,
    not_purged,
    replay_audit_details,
    trigger_audit_details,
    trigger_ids_taken,
    trigger_instants,
)
from engine.ledger.memory import tables as transitions
from engine.ledger.memory.state import MemoryState
from engine.ledger.params import (
    AuditQuery,
    Backfilled,
    ChangeKind,
    DeadLettersPurge,
    DeadLettersReplay,
    ExecutionsBackfill,
    ExecutionsTrigger,
)
from engine.model import AuditAction, AuditEvent, Execution, ExecutionStatus, execution_id


class AuditMethods(MemoryState):
    """Trigger, backfill, dead-letter replay and purge, and the audit trail."""

    # operator-added executions ---------------------------------------------------------------

    async def executions_trigger(self, params: ExecutionsTrigger) -> Execution:
        await trio.lowlevel.checkpoint()
        params = params.checked()
        actor, reason = params.actor, params.reason
        schedule = self._live_schedule(params.schedule_id)
        now = self._now()
        for at in trigger_instants(now):
            if self._executions.get(execution_id(schedule.schedule_id, at)) is None:
                break
        else:
            raise trigger_ids_taken(schedule.schedule_id)
        execution = transitions.added(schedule, at, now)
        self._executions.put(execution)
        details = trigger_audit_details(schedule.schedule_id, reason)
        action = AuditAction.SCHEDULE_TRIGGER.value
        self._audit.append(now, actor, action, execution.execution_id, details)
        self._record_change(schedule, ChangeKind.EXECUTIONS_ADDED)
        return execution

    async def executions_backfill(self, params: ExecutionsBackfill) -> Backfilled:
        await trio.lowlevel.checkpoint()
        params = params.checked()
        instants, actor, reason = params.planned_at, params.actor, params.reason
        schedule = self._live_schedule(params.schedule_id)
        horizon = self._executions.purged_through.get(schedule.schedule_id)
        if not instants:
            return Backfilled([], horizon)
        now = self._now()
        future = backfill_in_future(instants, now)
        if future is not None:
            raise future
        kept = not_purged(instants, horizon)
        inserted = []
        for at in kept:
            execution = transitions.added(schedule, at, now)
            existing = self._executions.get(execution.execution_id)
            if existing is None or transitions.revivable(existing, schedule):
                self._executions.put(execution)
                inserted.append(execution.execution_id)
        skipped = len(instants) - len(kept)
        details = backfill_audit_details(len(inserted), instants, reason, skipped)
        action = AuditAction.SCHEDULE_BACKFILL.value
        self._audit.append(now, actor, action, schedule.schedule_id, details)
        if inserted:
            self._record_change(schedule, ChangeKind.EXECUTIONS_ADDED)
        return Backfilled(inserted, horizon, skipped)

    # dead letters and the audit trail -------------------------------------------------------

    async def dead_letters_replay(self, params: DeadLettersReplay) -> list[str]:
        await trio.lowlevel.checkpoint()
        params = params.checked()
        actor, reason = params.actor, params.reason
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
        params = params.checked()
        actor, reason = params.actor, params.reason
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
        params = params.checked()
        return self._audit.matching(
            params.target, params.action, params.after_event_id, params.limit
        )
