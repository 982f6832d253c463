"""Manifest sets on PostgreSQL (asyncio side): :meth:`~engine.ledger.base.Ledger.
manifests_apply` as one transaction.

Order inside the transaction, which is what keeps it free of interleaving and deadlocks:

1. ``pg_advisory_xact_lock(MANIFEST_LOCK_SPACE, hashtext(set))``: a second apply of the
   same set waits here until the first commits, then plans against its result. Applies of
   other sets do not wait (until step 3).
2. The state: the listed and owned schedules ``FOR UPDATE`` in id order (a concurrent
   update, trigger or backfill of one of them finishes first, or waits for the apply),
   every task type and tenant, the labels. Then the planner runs, once. A dry run, and a
   plan without changes, end here.
3. The audit lock, held to commit: taken *before* any schedule write takes the change-feed
   lock, in the order an operator's trigger or backfill takes the two (``sql_api``), so the
   pair cannot deadlock. Write phases of applies (and audited actions) queue here.
4. The writes, each through the single-object operation of its kind
   (:mod:`~engine.ledger.postgres.schedules`, :mod:`~engine.ledger.postgres.catalog`) run
   on this transaction's connection (their own transactions become savepoints), so their
   rules -- task types known and usable, quotas, pausing and resuming, the change feed and
   its NOTIFY -- hold unchanged; then the labels and the audit events.

Any exception rolls the whole transaction back. A deadlock the database still detects (a
concurrent writer of a task type the apply changes) is retried by :meth:`Store.run`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Final, cast

import asyncpg

from engine.errors import InvalidField, VersionConflict
from engine.ledger.manifests import (
    Label,
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
from engine.ledger.params import (
    SchedulesCreate,
    SchedulesDelete,
    SchedulesUpdate,
    TaskTypesPut,
    TenantsPut,
)
from engine.ledger.postgres import catalog, schedules, sql
from engine.ledger.postgres.rows import schedule_from_row, task_type_from_row, tenant_from_row
from engine.ledger.postgres.store import Store
from engine.model import (
    AuditAction,
    Schedule,
    TaskType,
    Tenant,
    validate_actor,
    validate_identifier,
)

MANIFEST_LOCK_SPACE: Final = 0x6D616E69  # "mani"
"""First key of the two-key transaction advisory lock of a manifest set (the second is the
set name's ``hashtext``). Two-key locks never collide with the one-key locks of the change
feed, the audit trail and migrations."""

_UNLABELLING: Final = (ManifestAction.DELETE, ManifestAction.RELEASE)
MANIFEST_LOCK: Final = f"SELECT pg_advisory_xact_lock({MANIFEST_LOCK_SPACE}, hashtext($1))"
LABELS_READ: Final = """
SELECT kind, name, manifest_set FROM manifest_labels
WHERE manifest_set = $1
   OR (kind, name) IN (SELECT * FROM unnest($2::text[], $3::text[]))
"""
LABELS_PUT: Final = """
INSERT INTO manifest_labels (kind, name, manifest_set)
SELECT * FROM unnest($1::text[], $2::text[], $3::text[])
ON CONFLICT (kind, name) DO UPDATE SET manifest_set = EXCLUDED.manifest_set
"""
LABELS_DROP: Final = """
DELETE FROM manifest_labels WHERE (kind, name) IN (SELECT * FROM unnest($1::text[], $2::text[]))
"""
SCHEDULES_LOCK_MANY: Final = sql.SCHEDULES_GET_MANY + "ORDER BY schedule_id FOR UPDATE"
SCHEDULE_VERSION: Final = (
    "SELECT version FROM schedules WHERE schedule_id = $1 AND deleted_at IS NULL"
)
TASK_TYPE_VERSION: Final = "SELECT version FROM task_types WHERE name = $1"
TENANT_VERSION: Final = "SELECT version FROM tenants WHERE tenant_id = $1"


class _InTransaction:
    """A :class:`Store` whose connection and transactions are one open transaction's: the
    single-object operations run inside the apply (their transactions as savepoints)."""

    def __init__(self, store: Store, connection: asyncpg.Connection) -> None:
        self._store = store
        self._connection = connection
        self.partition_count = store.partition_count

    @asynccontextmanager
    async def connection(self, **_: Any) -> AsyncIterator[asyncpg.Connection]:
        yield self._connection

    @asynccontextmanager
    async def transaction(self, **_: Any) -> AsyncIterator[asyncpg.Connection]:
        async with self._connection.transaction():
            yield self._connection

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


async def manifests_apply(store: Store, params: ManifestsApply) -> list[ManifestDone]:
    manifest_set = validate_identifier(params.manifest_set, kind="manifest set")
    actor = validate_actor(params.actor)
    async with store.transaction() as connection:
        await connection.execute(MANIFEST_LOCK, manifest_set)
        state = await _read_state(connection, manifest_set, params)
        changes = check_changes(params.plan(state))
        if params.dry_run or not changes:
            return [planned(change) for change in changes]
        await connection.execute(sql.AUDIT_LOCK)
        inner = cast(Store, _InTransaction(store, connection))
        done = [await _apply_one(inner, connection, change) for change in changes]
        kept = [
            c for c in changes if c.action not in (ManifestAction.DELETE, ManifestAction.RELEASE)
        ]
        gone = [c for c in changes if c.action in (ManifestAction.DELETE, ManifestAction.RELEASE)]
        if kept:
            await connection.execute(
                LABELS_PUT,
                [str(c.kind) for c in kept],
                [c.name for c in kept],
                [manifest_set] * len(kept),
            )
        if gone:
            await connection.execute(
                LABELS_DROP, [str(c.kind) for c in gone], [c.name for c in gone]
            )
        await connection.execute(
            sql.AUDIT_APPEND,
            actor,
            AuditAction.MANIFEST_APPLY.value,
            [change.name for change in changes],
            [
                audit_details(manifest_set, change, result.version)
                for change, result in zip(changes, done, strict=True)
            ],
        )
    return done


async def _read_state(
    connection: asyncpg.Connection, manifest_set: str, params: ManifestsApply
) -> ManifestState:
    kinds = [str(kind) for kind, _ in params.labels]
    names = [name for _, name in params.labels]
    labels: dict[Label, str] = {
        (ManifestKind(row["kind"]), row["name"]): row["manifest_set"]
        for row in await connection.fetch(LABELS_READ, manifest_set, kinds, names)
    }
    owned = {
        name
        for (kind, name), owner in labels.items()
        if kind is ManifestKind.SCHEDULE and owner == manifest_set
    }
    ids = sorted(set(params.schedule_ids) | owned)
    rows = await connection.fetch(SCHEDULES_LOCK_MANY, ids)
    found = [schedule_from_row(row) for row in rows]
    return ManifestState(
        # After the set's lock: a transaction that waited for another apply plans from the
        # time it got the lock (next fires of new schedules), not from when it began.
        now=await connection.fetchval("SELECT statement_timestamp()"),
        manifest_set=manifest_set,
        schedules={schedule.schedule_id: schedule for schedule in found},
        task_types={
            row["name"]: task_type_from_row(row)
            for row in await connection.fetch(sql.TASK_TYPES_LIST)
        },
        tenants={
            row["tenant_id"]: tenant_from_row(row)
            for row in await connection.fetch(sql.TENANTS_LIST)
        },
        labels=labels,
    )


async def _apply_one(
    inner: Store, connection: asyncpg.Connection, change: ManifestChange
) -> ManifestDone:
    kind, action, record = change.kind, change.action, change.record
    query = {
        ManifestKind.SCHEDULE: SCHEDULE_VERSION,
        ManifestKind.TASK_TYPE: TASK_TYPE_VERSION,
        ManifestKind.TENANT: TENANT_VERSION,
    }[kind]
    current = await connection.fetchval(query, change.name)
    if (current or 0) != change.expected_version:
        state = "does not exist" if current is None else f"is at version {current}"
        raise VersionConflict(
            f"{kind} {change.name!r} {state}, not version {change.expected_version} as planned"
        )
    version: int | None = None
    if action is ManifestAction.ADOPT:
        version = current
    elif action is ManifestAction.RELEASE:
        version = None
    elif kind is ManifestKind.SCHEDULE:
        if action is ManifestAction.DELETE:
            await schedules.schedules_delete(
                inner, SchedulesDelete(change.name, change.expected_version)
            )
        elif not isinstance(record, Schedule) or record.schedule_id != change.name:
            raise InvalidField(f"schedule change {change.name!r} carries no such schedule")
        elif current is None:
            [stored] = await schedules.schedules_create(inner, SchedulesCreate([record]))
            version = stored.version
        else:
            updated = await schedules.schedules_update(
                inner, SchedulesUpdate(record, change.expected_version)
            )
            version = updated.version
    elif kind is ManifestKind.TASK_TYPE:
        if action is ManifestAction.DELETE:
            await catalog.task_types_delete(inner, change.name)
        elif not isinstance(record, TaskType) or record.name != change.name:
            raise InvalidField(f"task type change {change.name!r} carries no such task type")
        else:
            put = await catalog.task_types_put(inner, TaskTypesPut(record, change.expected_version))
            version = put.version
    else:
        if not isinstance(record, Tenant) or record.tenant_id != change.name:
            raise InvalidField(f"tenant change {change.name!r} carries no such tenant")
        stored_tenant = await catalog.tenants_put(
            inner, TenantsPut(record, change.expected_version)
        )
        version = stored_tenant.version
    return ManifestDone(kind, change.name, action, change.fields, version, change.source)
