"""The memory ledger's :meth:`~engine.ledger.base.Ledger.manifests_apply` (a mixin of
:class:`~engine.ledger.memory.MemoryLedger`), in the area file of the same name as the
Postgres ledger's (:mod:`engine.ledger.postgres.manifests`).

An apply is one synchronous stretch after its single checkpoint, like every method of this
ledger: no other task runs between its read of the state, its planner call and its last
write, which is what the Postgres ledger gets from the set's advisory lock. Its writes
follow the rules of the single-object methods (task types known and usable, quotas, pause
and resume, the change feed); the first refusal restores the tables as they were before
the apply (a copy taken at its start, only when it writes), so a refused apply changes
nothing.
"""

from __future__ import annotations

import copy
from datetime import datetime
from typing import Any

import msgspec
import trio

from engine.errors import AlreadyExists, InvalidField, VersionConflict
from engine.ledger.common import lost_users, task_type_in_use, task_type_runs_in_use
from engine.ledger.manifests import (
    ManifestAction,
    ManifestChange,
    ManifestDone,
    ManifestKind,
    ManifestsApply,
    ManifestState,
    audit_details,
    check_changes,
    planned,
)
from engine.ledger.memory.state import MemoryState
from engine.model import (
    AuditAction,
    Schedule,
    TaskType,
    Tenant,
    check_payload_size,
    validate_actor,
    validate_identifier,
    validate_task_type,
    validate_tenant,
)


class _Snapshot:
    """The tables an apply may write, as they were before it: :meth:`restore` puts them
    back. Taken only when an apply writes. Records are immutable, so the dictionaries are
    copied shallowly; the change feed and the audit trail only grow during an apply, so
    they are cut back in place (the feed keeps its waiters' event: a waiter woken by a
    change that is then undone wakes spuriously, which the contract allows)."""

    def __init__(self, ledger: ManifestMethods) -> None:
        self.schedules = dict(ledger._schedules)
        self.tombstones = dict(ledger._tombstones)
        self.labels = dict(ledger._manifest_labels)
        self.executions = copy.deepcopy(ledger._executions)
        self.task_types = copy.copy(ledger._task_types)
        self.task_types._rows = dict(ledger._task_types._rows)
        self.tenants = copy.copy(ledger._tenants)
        self.tenants._rows = dict(ledger._tenants._rows)
        feed = ledger._feed
        self.feed = (feed._last_seq, len(feed._changes))
        self.audit = len(ledger._audit._events)

    def restore(self, ledger: ManifestMethods) -> None:
        ledger._schedules = self.schedules
        ledger._tombstones = self.tombstones
        ledger._manifest_labels = self.labels
        ledger._executions = self.executions
        ledger._task_types = self.task_types
        ledger._tenants = self.tenants
        feed = ledger._feed
        feed._last_seq, kept = self.feed
        del feed._changes[kept:]
        del feed._appended_at[kept:]
        del ledger._audit._events[self.audit :]


class ManifestMethods(MemoryState):
    """Manifest sets on the memory ledger's tables."""

    # Helpers of the other areas this one uses (schedules, catalog): theirs come first in
    # MemoryLedger's bases, so these are only what the type checker sees.
    def _require_task_types(self, schedules: list[Schedule]) -> None:
        raise NotImplementedError

    def _require_quotas(self, schedules: list[Schedule]) -> None:
        raise NotImplementedError

    def _skip_pending(self, schedule_id: str, now: datetime, code: str, message: str) -> None:
        raise NotImplementedError

    def _revive_lifecycle_skips(self, schedule: Schedule, now: datetime) -> None:
        raise NotImplementedError

    def _check_no_lost_users(self, task_type: TaskType) -> None:
        raise NotImplementedError

    def _store_created(
        self, schedule: Schedule, tombstone: Schedule | None, now: datetime
    ) -> Schedule:
        raise NotImplementedError

    def _store_updated(self, current: Schedule, replacement: Schedule, now: datetime) -> Schedule:
        raise NotImplementedError

    def _store_deleted(self, current: Schedule, now: datetime) -> None:
        raise NotImplementedError

    async def manifests_apply(self, params: ManifestsApply) -> list[ManifestDone]:
        await trio.lowlevel.checkpoint()
        manifest_set = validate_identifier(params.manifest_set, kind="manifest set")
        actor = validate_actor(params.actor)
        now = self._now()
        wanted = set(params.schedule_ids) | {
            name
            for (kind, name), owner in self._manifest_labels.items()
            if kind is ManifestKind.SCHEDULE and owner == manifest_set
        }
        listed = set(params.labels)
        state = ManifestState(
            now=now,
            manifest_set=manifest_set,
            schedules={
                key: self._schedules[key] for key in sorted(wanted) if key in self._schedules
            },
            task_types={row.name: row for row in self._task_types.rows()},
            tenants={row.tenant_id: row for row in self._tenants.rows()},
            labels={
                key: owner
                for key, owner in self._manifest_labels.items()
                if owner == manifest_set or key in listed
            },
        )
        changes = check_changes(params.plan(state))
        if params.dry_run or not changes:
            return [planned(change) for change in changes]
        saved = _Snapshot(self)
        try:
            done = [self._apply_one(change, now) for change in changes]
            for change, result in zip(changes, done, strict=True):
                self._audit.append(
                    now,
                    actor,
                    AuditAction.MANIFEST_APPLY.value,
                    change.name,
                    audit_details(manifest_set, change, result.version),
                )
                key = (change.kind, change.name)
                if change.action in (ManifestAction.DELETE, ManifestAction.RELEASE):
                    self._manifest_labels.pop(key, None)
                else:
                    self._manifest_labels[key] = manifest_set
        except BaseException:
            saved.restore(self)
            raise
        return done

    def _apply_one(self, change: ManifestChange, now: datetime) -> ManifestDone:
        record = change.record
        version: int | None = None
        if change.action in (ManifestAction.ADOPT, ManifestAction.RELEASE):
            version = self._unchanged(change)
        elif change.kind is ManifestKind.SCHEDULE:
            version = self._schedule_change(change, now)
        elif change.kind is ManifestKind.TASK_TYPE:
            version = self._task_type_change(change, now)
        else:
            if not isinstance(record, Tenant):
                raise InvalidField(f"tenant change {change.name!r} carries no tenant")
            tenant = validate_tenant(record)
            version = self._tenants.put(
                tenant.tenant_id, tenant, change.expected_version, now
            ).version
        return ManifestDone(
            change.kind, change.name, change.action, change.fields, version, change.source
        )

    def _unchanged(self, change: ManifestChange) -> int | None:
        """Check that an object whose label alone changes is still as planned: its version
        (adopt; release of a tenant) or absent (release of a label whose object is gone)."""
        current: Schedule | TaskType | Tenant | None
        if change.kind is ManifestKind.SCHEDULE:
            current = self._schedules.get(change.name)
        elif change.kind is ManifestKind.TASK_TYPE:
            current = self._task_types.find(change.name)
        else:
            current = self._tenants.find(change.name)
        if (0 if current is None else current.version) != change.expected_version:
            raise _moved(str(change.kind), change, current)
        return current.version if change.action is ManifestAction.ADOPT and current else None

    def _schedule_change(self, change: ManifestChange, now: datetime) -> int | None:
        current = self._schedules.get(change.name)
        if (0 if current is None else current.version) != change.expected_version:
            raise _moved("schedule", change, current)
        if change.action is ManifestAction.DELETE:
            assert current is not None  # the version check above
            self._store_deleted(current, now)
            return None
        schedule = change.record
        if not isinstance(schedule, Schedule) or schedule.schedule_id != change.name:
            raise InvalidField(f"schedule change {change.name!r} carries no such schedule")
        validate_identifier(schedule.schedule_id, kind="schedule id")
        check_payload_size(schedule.payload)
        self._require_task_types([schedule])
        if current is None:
            tombstone = self._tombstones.get(schedule.schedule_id)
            if tombstone is not None and tombstone.tenant_id != schedule.tenant_id:
                raise AlreadyExists(
                    f"schedule(s) {[schedule.schedule_id]} exist already",
                    ids=(schedule.schedule_id,),
                )
            self._require_quotas([schedule])
            self._tombstones.pop(schedule.schedule_id, None)
            return self._store_created(schedule, tombstone, now).version
        return self._store_updated(current, schedule, now).version

    def _task_type_change(self, change: ManifestChange, now: datetime) -> int | None:
        current = self._task_types.find(change.name)
        if (0 if current is None else current.version) != change.expected_version:
            raise _moved("task type", change, current)
        if change.action is ManifestAction.DELETE:
            users = sorted(key for key, s in self._schedules.items() if s.task_type == change.name)
            if users:
                raise task_type_in_use(change.name, len(users), users)
            runs = self._executions.unfinished_of_task_type(change.name)
            if runs:
                raise task_type_runs_in_use(change.name, runs)
            self._task_types.delete(change.name)
            return None
        if not isinstance(change.record, TaskType) or change.record.name != change.name:
            raise InvalidField(f"task type change {change.name!r} carries no such task type")
        task_type = validate_task_type(change.record)
        settings = msgspec.json.decode(msgspec.json.encode(task_type.settings))
        task_type = msgspec.structs.replace(task_type, settings=settings)
        if current is not None and lost_users(current, task_type):
            self._check_no_lost_users(task_type)
        return self._task_types.put(task_type.name, task_type, change.expected_version, now).version


def _moved(what: str, change: ManifestChange, current: Any) -> VersionConflict:
    state = "does not exist" if current is None else f"is at version {current.version}"
    return VersionConflict(
        f"{what} {change.name!r} {state}, not version {change.expected_version} as planned"
    )
