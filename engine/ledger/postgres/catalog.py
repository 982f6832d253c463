"""The catalog: task types and tenants, the settings dispatch reads (asyncio side).

Both are small tables of operator-managed rows, written with optimistic versions: a put is
one upsert statement that applies only at the expected version (see ``sql.TASK_TYPE_PUT``).
A task type cannot be deleted while a live schedule names it; the lock order that makes the
check race-free with concurrent schedule writers is explained in :mod:`~engine.ledger.
postgres.sql` (task types and tenants), and a foreign key backs it in the schema.
"""

from __future__ import annotations

import asyncpg

from engine.errors import InUse
from engine.ledger.common import (
    IN_USE_SHOWN_MAX,
    TENANT_DEFAULTS,
    lost_users,
    not_found,
    task_type_grant_in_use,
    task_type_in_use,
    task_type_runs_in_use,
    version_conflict,
)
from engine.ledger.params import TaskTypesPut, TenantsPut
from engine.ledger.postgres import sql
from engine.ledger.postgres.rows import task_type_from_row, tenant_from_row
from engine.ledger.postgres.store import Store
from engine.model import TaskType, Tenant


async def task_types_put(store: Store, params: TaskTypesPut) -> TaskType:
    task_type = params.checked().task_type
    overlap = None if task_type.overlap is None else str(task_type.overlap)
    async with store.transaction() as connection:
        current = await connection.fetchrow(sql.TASK_TYPE_LOCK_FOR_CHANGE, task_type.name)
        version = None if current is None else current["version"]
        if params.expected_version is not None and params.expected_version != (version or 0):
            raise version_conflict("task type", task_type.name, version, params.expected_version)
        if current is not None and lost_users(task_type_from_row(current), task_type):
            keeps = [task_type.tenant_id] if task_type.tenant_id is not None else []
            keeps += list(task_type.allowed_tenants or ())
            lost = await connection.fetch(sql.TASK_TYPE_TENANT_USERS, task_type.name, keeps)
            if lost:
                pairs = [(row["tenant_id"], row["live"]) for row in lost]
                raise task_type_grant_in_use(task_type.name, pairs)
        row = await connection.fetchrow(
            sql.TASK_TYPE_PUT,
            task_type.name,
            str(task_type.kind),
            task_type.settings,
            task_type.timeout_s,
            task_type.max_concurrency,
            task_type.max_concurrency_cluster,
            task_type.max_attempts,
            task_type.backoff_base_s,
            task_type.backoff_max_s,
            overlap,
            params.expected_version,
            task_type.tenant_id,
            list(task_type.allowed_tenants or ()),
        )
        if row is None:  # pragma: no cover - the lock rules it out
            raise version_conflict("task type", task_type.name, version, params.expected_version)
    return task_type_from_row(row)


async def task_types_get(store: Store, name: str) -> TaskType:
    async with store.connection() as connection:
        row = await connection.fetchrow(sql.TASK_TYPE_GET, name)
    if row is None:
        raise not_found("task type", name)
    return task_type_from_row(row)


async def task_types_list(store: Store, _: None) -> list[TaskType]:
    async with store.connection() as connection:
        rows = await connection.fetch(sql.TASK_TYPES_LIST)
    return [task_type_from_row(row) for row in rows]


async def task_types_delete(store: Store, name: str) -> TaskType:
    async with store.transaction() as connection:
        if await connection.fetchval(sql.TASK_TYPE_LOCK_FOR_DELETE, name) is None:
            raise not_found("task type", name)
        # A later statement than the lock: it sees every schedule committed while we waited.
        users = await connection.fetch(sql.TASK_TYPE_USERS, name, IN_USE_SHOWN_MAX)
        if users:
            ids = [row["schedule_id"] for row in users]
            raise task_type_in_use(name, users[0]["total"], ids)
        runs = await connection.fetch(sql.TASK_TYPE_UNFINISHED_RUNS, name)
        if runs:
            raise task_type_runs_in_use(name, {row["status"]: row["runs"] for row in runs})
        try:
            row = await connection.fetchrow(sql.TASK_TYPE_DELETE, name)
        except asyncpg.ForeignKeyViolationError:  # pragma: no cover - the lock rules it out
            raise InUse(
                f"task type {name!r} is still used by a live schedule; delete it or move it "
                "to another task type first"
            ) from None
    return task_type_from_row(row)


async def tenants_put(store: Store, params: TenantsPut) -> Tenant:
    tenant = params.checked().tenant
    async with store.connection() as connection:
        row = await connection.fetchrow(
            sql.TENANT_PUT,
            tenant.tenant_id,
            tenant.weight,
            tenant.concurrency_quota,
            tenant.rate_per_s,
            tenant.burst,
            params.expected_version,
            tenant.schedules_max,
        )
        if row is None:
            current = await connection.fetchval(sql.TENANT_VERSION, tenant.tenant_id)
            raise version_conflict("tenant", tenant.tenant_id, current, params.expected_version)
    return tenant_from_row(row)


async def tenants_get(store: Store, tenant_id: str) -> Tenant:
    async with store.connection() as connection:
        row = await connection.fetchrow(sql.TENANT_GET, tenant_id)
    if row is None:
        raise not_found("tenant", tenant_id, TENANT_DEFAULTS)
    return tenant_from_row(row)


async def tenants_list(store: Store, _: None) -> list[Tenant]:
    async with store.connection() as connection:
        rows = await connection.fetch(sql.TENANTS_LIST)
    return [tenant_from_row(row) for row in rows]
