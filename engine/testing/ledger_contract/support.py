"""Helpers the contract areas share: owning a partition, planning, what is due now."""

from __future__ import annotations

from datetime import datetime, timedelta

from engine.ledger.params import (
    ExecutionsClaim,
    ExecutionsDue,
    ExecutionsPlan,
    Fence,
    LeasesAcquire,
    PlannedExecution,
    ScheduleAdvance,
)
from engine.model import (
    execution_id,
)
from engine.testing.ledger_contract.backend import (
    Backend,
)

TTL_S = 0.6
"""The suite's short TTLs: expiry is reached by advancing the ledger's clock, never by
waiting; on a ledger whose clock also runs by itself (a database server's), short enough
that no test's own run time comes near it."""


async def own(backend: Backend, partition: int, owner: str = "node-a") -> Fence:
    [lease] = await backend.ledger.leases_acquire(
        LeasesAcquire(owner_id=owner, partition_ids=[partition], ttl_s=TTL_S * 50)
    )
    return Fence(lease.partition_id, owner, lease.fencing_token)


async def planned(
    backend: Backend, fence: Fence, schedule_ids: list[str], at: datetime
) -> list[str]:
    stored = [await backend.ledger.schedules_get(sid) for sid in schedule_ids]
    result = await backend.ledger.executions_plan(
        ExecutionsPlan(
            fence=fence,
            executions=[
                PlannedExecution(s.schedule_id, s.tenant_id, s.task_type, at) for s in stored
            ],
            advances=[
                ScheduleAdvance(s.schedule_id, at + timedelta(minutes=1), s.version) for s in stored
            ],
            checkpoint=at,
        )
    )
    return result.inserted


async def due_now(backend: Backend, partition: int, after: float = 0.0) -> list[str]:
    now = await backend.ledger.database_now()
    due = await backend.ledger.executions_due(
        ExecutionsDue([partition], now + timedelta(seconds=after))
    )
    return [e.execution_id for e in due]


async def claim_now(
    backend: Backend, fence: Fence, schedule_ids: list[str], lease_s: float
) -> list[str]:
    """Plan one fire of each schedule a second ago and claim them; their execution ids."""
    at = (await backend.ledger.database_now()).replace(microsecond=0) - timedelta(seconds=1)
    await planned(backend, fence, schedule_ids, at)
    eids = [execution_id(s, at) for s in schedule_ids]
    claimed = await backend.ledger.executions_claim(ExecutionsClaim([fence], eids, lease_s, "n"))
    assert sorted(e.execution_id for e in claimed) == sorted(eids)
    return eids
