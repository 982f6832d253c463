"""The ledger contract for regions: the active region, its epoch, and failover fencing."""

from __future__ import annotations

import pytest

from engine.errors import InvalidField, LeaseLost
from engine.ledger.params import (
    AuditQuery,
    ExecutionsClaim,
    Fence,
    LeasesAcquire,
    LeasesRenew,
    RegionFailover,
    SchedulesCreate,
    token_floor,
)
from engine.model import AuditAction
from engine.testing.ledger_contract.backend import PARTITIONS, Backend, ids_in_partition, schedule
from engine.testing.ledger_contract.support import TTL_S, planned

LONG_S = TTL_S * 50


async def test_only_nodes_of_the_active_region_acquire_leases(backend: Backend) -> None:
    settings = await backend.ledger.cluster_get()
    assert (settings.active_region, settings.region_epoch) == ("default", 1)
    away = LeasesAcquire("b1", [0, 1], LONG_S, region="east")
    assert await backend.ledger.leases_acquire(away) == []
    home = await backend.ledger.leases_acquire(LeasesAcquire("a1", [0, 1], LONG_S))
    assert [lease.owner_id for lease in home] == ["a1", "a1"]
    assert all(lease.fencing_token < token_floor(2) for lease in home)


async def test_a_failover_moves_the_epoch_and_revokes_every_lease_at_once(
    backend: Backend,
) -> None:
    [held] = await backend.ledger.leases_acquire(LeasesAcquire("a1", [3], LONG_S))
    fence = Fence(3, "a1", held.fencing_token)
    change = await backend.ledger.region_failover(
        RegionFailover("east", actor="cli:ops", reason="game day")
    )
    assert change.changed
    assert change.revoked == 1
    assert (change.settings.active_region, change.settings.region_epoch) == ("east", 2)
    assert await backend.ledger.cluster_get() == change.settings
    # The old region's fence holds no more, long before its expiry: no renewal, no write.
    assert await backend.ledger.leases_renew(LeasesRenew([fence], LONG_S)) == []
    assert await backend.ledger.leases_acquire(LeasesAcquire("a1", [3], LONG_S)) == []
    # The new region takes it at once, with a token above every token of the old epoch.
    taken, other = await backend.ledger.leases_acquire(
        LeasesAcquire("b1", [3, 4], LONG_S, region="east")
    )
    assert (taken.owner_id, taken.partition_id, other.partition_id) == ("b1", 3, 4)
    assert other.fencing_token >= token_floor(2)
    assert taken.fencing_token >= token_floor(2) > held.fencing_token


async def test_a_fenced_write_of_the_demoted_region_is_refused(backend: Backend) -> None:
    [sid] = ids_in_partition(6, 1)
    await backend.ledger.schedules_create(SchedulesCreate([schedule(sid)]))
    [held] = await backend.ledger.leases_acquire(LeasesAcquire("a1", [6], LONG_S))
    fence = Fence(6, "a1", held.fencing_token)
    now = await backend.ledger.database_now()
    [execution_id] = await planned(backend, fence, [sid], now)
    await backend.ledger.region_failover(RegionFailover("east", actor="cli:ops"))
    with pytest.raises(LeaseLost):
        await backend.ledger.executions_claim(
            ExecutionsClaim([fence], [execution_id], LONG_S, "a1")
        )


async def test_running_a_failover_twice_changes_nothing_the_second_time(backend: Backend) -> None:
    first = await backend.ledger.region_failover(RegionFailover("east", actor="cli:ops"))
    [taken] = await backend.ledger.leases_acquire(LeasesAcquire("b1", [2], LONG_S, region="east"))
    again = await backend.ledger.region_failover(RegionFailover("east", actor="cli:ops"))
    assert not again.changed
    assert again.revoked == 0
    assert again.settings == first.settings
    [lease] = [x for x in await backend.ledger.leases_list() if x.partition_id == 2]
    assert lease.owner_id == "b1"  # the second run revoked nothing
    assert lease.fencing_token == taken.fencing_token
    events = await backend.ledger.audit_list(AuditQuery(action=AuditAction.REGION_FAILOVER))
    assert len(events) == 1
    assert events[0].target == "east"
    assert events[0].details == {
        "from_region": "default",
        "from_epoch": 1,
        "to_epoch": 2,
        "revoked": 0,
        "reason": None,
    }


async def test_fencing_an_old_primary_lifts_its_epoch_to_the_new_primarys(
    backend: Backend,
) -> None:
    """The same call on the old primary, with the new primary's epoch: its nodes are fenced
    and its epoch matches, so the two databases agree on what is active."""
    change = await backend.ledger.region_failover(
        RegionFailover("east", actor="cli:ops", epoch_at_least=5)
    )
    assert change.settings.region_epoch == 5
    same = await backend.ledger.region_failover(
        RegionFailover("east", actor="cli:ops", epoch_at_least=5)
    )
    assert not same.changed
    back = await backend.ledger.region_failover(RegionFailover("default", actor="cli:ops"))
    assert (back.settings.active_region, back.settings.region_epoch) == ("default", 6)
    [lease] = await backend.ledger.leases_acquire(LeasesAcquire("a1", [1], LONG_S))
    assert lease.fencing_token >= token_floor(6)


@pytest.mark.parametrize("region", ["", "east west", "a:b", "x" * 129])
async def test_a_malformed_region_is_refused_and_changes_nothing(
    backend: Backend, region: str
) -> None:
    before = await backend.ledger.cluster_get()
    with pytest.raises(InvalidField):
        await backend.ledger.region_failover(RegionFailover(region, actor="cli:ops"))
    assert await backend.ledger.cluster_get() == before
    assert before.partition_count == PARTITIONS
