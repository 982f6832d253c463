"""What the dispatch core needs of an execution, and the in-flight counts it must respect.

Responsibility: :class:`ConcurrencyLimits` counts the executions in flight per task type and
per tenant and answers whether one more may start: a *cap* per task type and a *quota* per
tenant (``None``: unlimited; 0 pauses). :class:`~engine.core.fair_queue.FairQueue` consults it
on every pop and reserves the slot of what it returns; the dispatcher calls
:meth:`ConcurrencyLimits.finished` when the execution ends.

Invariants: ``started`` never takes a count above its cap or quota (it raises instead: the
caller skipped ``can_start``, a bug); counts never go negative (``finished`` without a matching
``started`` raises). Lowering a limit below the current count is allowed: nothing more starts
until enough finish. Every change that may let something start again is journalled, so the
queue can wake exactly the tenants that were waiting on it (:meth:`drain_freed`).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Final, Protocol, TypeVar

from engine.model import ExecutionStatus

K = TypeVar("K")


class Dispatchable(Protocol):
    """An execution waiting to start, as the dispatch core sees it (``Execution`` is one).

    It becomes due at :func:`~engine.model.startable_at` -- its planned instant while
    ``queued``, its retry instant ``not_before`` while ``failed`` -- the ledger's own rule; the
    execution id is unique and breaks ties between items due at the same instant.
    """

    @property
    def execution_id(self) -> str: ...

    @property
    def tenant_id(self) -> str: ...

    @property
    def task_type(self) -> str: ...

    @property
    def status(self) -> ExecutionStatus: ...

    @property
    def planned_at(self) -> datetime: ...

    @property
    def not_before(self) -> datetime | None: ...


class CapExceeded(RuntimeError):
    """``started`` was called for a tenant or task type already at its limit (a caller bug)."""


def _check_limit(limit: int | None, what: str) -> int | None:
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise ValueError(f"{what} must be an integer >= 0 or None (unlimited), not {limit!r}")
    return limit


def _decrement(counts: dict[K, int], key: K) -> None:
    counts[key] -= 1
    if not counts[key]:
        del counts[key]


class ConcurrencyLimits:
    """In-flight counts per task type and per tenant, against caps and quotas."""

    def __init__(
        self,
        *,
        task_type_caps: Mapping[str, int | None] | None = None,
        tenant_quotas: Mapping[str, int | None] | None = None,
        tenant_quota_default: int | None = None,
    ) -> None:
        self._caps: dict[str, int] = {}
        self._quotas: dict[str, int] = {}
        self._quota_default = _check_limit(tenant_quota_default, "tenant_quota_default")
        self._by_type: dict[str, int] = {}
        self._by_tenant: dict[str, int] = {}
        self._by_pair: dict[tuple[str, str], int] = {}
        self._freed_tenants: set[str] = set()
        self._freed_types: set[str] = set()
        self._group_of: dict[str, str] = {}
        self._members: dict[str, set[str]] = {}
        self._group_caps: dict[str, int] = {}
        self._by_group: dict[str, int] = {}
        for task_type, cap in (task_type_caps or {}).items():
            self.set_task_type_cap(task_type, cap)
        for tenant_id, quota in (tenant_quotas or {}).items():
            self.set_tenant_quota(tenant_id, quota)
        self.drain_freed()

    def set_task_type_cap(self, task_type: str, cap: int | None) -> None:
        """Cap the executions of ``task_type`` in flight (``None``: unlimited)."""
        cap = _check_limit(cap, f"the cap of task type {task_type!r}")
        if cap is None:
            self._caps.pop(task_type, None)
        else:
            self._caps[task_type] = cap
        self._freed_types.add(task_type)

    def set_group_cap(self, group: str, cap: int | None) -> None:
        """Cap the executions of every task type of ``group`` in flight together (``None``:
        unlimited): e.g. the kinds that hold a thread or a process while they run."""
        cap = _check_limit(cap, f"the cap of group {group!r}")
        if cap is None:
            self._group_caps.pop(group, None)
        else:
            self._group_caps[group] = cap
        self._freed_types.update(self._members.get(group, ()))

    def set_task_type_group(self, task_type: str, group: str | None) -> None:
        """Put ``task_type`` in ``group`` (``None``: none). What it has in flight moves with
        it, so every execution is counted once against the group it started in or moved to,
        and given back there."""
        old = self._group_of.get(task_type)
        if old == group:
            return
        count = self._by_type.get(task_type, 0)
        if old is not None:
            self._members[old].discard(task_type)
            if not self._members[old]:
                del self._members[old]
            if count:
                left = self._by_group[old] - count
                if left:
                    self._by_group[old] = left
                else:
                    del self._by_group[old]
                self._freed_types.update(self._members.get(old, ()))
            del self._group_of[task_type]
        if group is not None:
            self._group_of[task_type] = group
            self._members.setdefault(group, set()).add(task_type)
            if count:
                self._by_group[group] = self._by_group.get(group, 0) + count
        self._freed_types.add(task_type)

    def set_tenant_quota(self, tenant_id: str, quota: int | None) -> None:
        """Limit the executions of ``tenant_id`` in flight (``None``: the default)."""
        quota = _check_limit(quota, f"the quota of tenant {tenant_id!r}")
        if quota is None:
            self._quotas.pop(tenant_id, None)
        else:
            self._quotas[tenant_id] = quota
        self._freed_tenants.add(tenant_id)

    def task_type_cap(self, task_type: str) -> int | None:
        return self._caps.get(task_type)

    def tenant_quota(self, tenant_id: str) -> int | None:
        return self._quotas.get(tenant_id, self._quota_default)

    def in_flight(self, *, tenant_id: str | None = None, task_type: str | None = None) -> int:
        """How many are running for ``tenant_id`` or ``task_type`` (give exactly one)."""
        if (tenant_id is None) == (task_type is None):
            raise TypeError("in_flight needs exactly one of tenant_id and task_type")
        if tenant_id is not None:
            return self._by_tenant.get(tenant_id, 0)
        assert task_type is not None
        return self._by_type.get(task_type, 0)

    def task_type_room(self, task_type: str) -> int | None:
        """How many more of ``task_type`` may start (``None``: unlimited), within its own
        cap and its group's."""
        cap = self._caps.get(task_type)
        room = None if cap is None else max(0, cap - self._by_type.get(task_type, 0))
        group = self._group_of.get(task_type)
        if group is not None and group in self._group_caps:
            group_room = max(0, self._group_caps[group] - self._by_group.get(group, 0))
            room = group_room if room is None else min(room, group_room)
        return room

    def tenant_has_room(self, tenant_id: str) -> bool:
        quota = self.tenant_quota(tenant_id)
        return quota is None or self._by_tenant.get(tenant_id, 0) < quota

    def task_type_has_room(self, task_type: str) -> bool:
        cap = self._caps.get(task_type)
        if cap is not None and self._by_type.get(task_type, 0) >= cap:
            return False
        group = self._group_of.get(task_type)
        if group is None:
            return True
        group_cap = self._group_caps.get(group)
        return group_cap is None or self._by_group.get(group, 0) < group_cap

    def can_start(self, tenant_id: str, task_type: str) -> bool:
        return self.tenant_has_room(tenant_id) and self.task_type_has_room(task_type)

    def started(self, tenant_id: str, task_type: str) -> None:
        """Count one more in flight; :class:`CapExceeded` if it does not fit."""
        if not self.can_start(tenant_id, task_type):
            raise CapExceeded(
                f"tenant {tenant_id!r} / task type {task_type!r} is at its limit "
                f"({self.in_flight(tenant_id=tenant_id)}/{self.tenant_quota(tenant_id)} tenant, "
                f"{self.in_flight(task_type=task_type)}/{self.task_type_cap(task_type)} type)"
            )
        self._by_tenant[tenant_id] = self._by_tenant.get(tenant_id, 0) + 1
        self._by_type[task_type] = self._by_type.get(task_type, 0) + 1
        pair = (tenant_id, task_type)
        self._by_pair[pair] = self._by_pair.get(pair, 0) + 1
        group = self._group_of.get(task_type)
        if group is not None:
            self._by_group[group] = self._by_group.get(group, 0) + 1

    def finished(self, tenant_id: str, task_type: str) -> None:
        """Count one fewer in flight (the execution ended, or was never started after all)."""
        pair = (tenant_id, task_type)
        if pair not in self._by_pair:
            raise ValueError(f"nothing of tenant {tenant_id!r} / {task_type!r} is in flight")
        _decrement(self._by_tenant, tenant_id)
        _decrement(self._by_type, task_type)
        _decrement(self._by_pair, pair)
        self._freed_tenants.add(tenant_id)
        group = self._group_of.get(task_type)
        if group is None:
            self._freed_types.add(task_type)
        else:
            _decrement(self._by_group, group)
            self._freed_types.update(self._members[group])  # any of them may start now

    def drain_freed(self) -> tuple[list[str], list[str]]:
        """The tenants and task types (each sorted) that may have room again since last asked."""
        if not self._freed_tenants and not self._freed_types:
            return [], []
        tenants, types = sorted(self._freed_tenants), sorted(self._freed_types)
        self._freed_tenants.clear()
        self._freed_types.clear()
        return tenants, types


TOKEN_WAIT_MIN_S: Final = 0.001
"""The shortest wait for a token (a bucket that says "now" is asked again this soon)."""


def idle_wait_s(
    *, fallback_s: float, next_due_in_s: float | None, token_wait_s: float | None
) -> float:
    """How long the dispatch loop may sleep after a pop (unless nudged): until the next
    queued instant comes, the token the last pop lacked, or the fallback interval.

    ``next_due_in_s``: seconds until the earliest queued item not yet due (``None``: none;
    past means due but not popped -- the bucket or the room decides, or this would spin).
    ``token_wait_s``: the bucket's wait *as of now*, only when the last pop was held back by
    the bucket (``None`` otherwise: an idle node with a rate must not wake every millisecond,
    its bucket full and its wait zero). It may be 0 by now -- real time moves on between the
    pop that found no token and this question -- and then the loop looks again at once
    rather than sleeping the fallback interval with work due and every worker idle (what
    made a paced 200,000 burst on PostgreSQL stop for 4-5 s several times per run).
    """
    wait_s = fallback_s
    if next_due_in_s is not None and next_due_in_s > 0:
        wait_s = min(wait_s, next_due_in_s)
    if token_wait_s is not None:
        wait_s = min(wait_s, max(token_wait_s, TOKEN_WAIT_MIN_S))
    return wait_s
