"""Task types and tenants, the settings dispatch reads, in memory (the twin of
:mod:`engine.ledger.postgres.catalog`). Both are versioned tables (:class:`~engine.ledger.
memory.tables.VersionedTable`); a task type cannot be deleted while a live schedule or an
unfinished execution names it.
"""

from __future__ import annotations

from collections import Counter

import trio

from engine.ledger.common import (
    lost_users,
    task_type_grant_in_use,
    task_type_in_use,
    task_type_runs_in_use,
)
from engine.ledger.memory.state import MemoryState
from engine.ledger.params import TaskTypesPut, TenantsPut
from engine.model import TaskType, Tenant


class CatalogMethods(MemoryState):
    """Task types and tenants."""

    async def task_types_put(self, params: TaskTypesPut) -> TaskType:
        await trio.lowlevel.checkpoint()
        task_type = params.checked().task_type
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
        params = params.checked()
        tenant = params.tenant
        return self._tenants.put(tenant.tenant_id, tenant, params.expected_version, self._now())

    async def tenants_get(self, tenant_id: str) -> Tenant:
        await trio.lowlevel.checkpoint()
        return self._tenants.get(tenant_id)

    async def tenants_list(self) -> list[Tenant]:
        await trio.lowlevel.checkpoint()
        return self._tenants.rows()
