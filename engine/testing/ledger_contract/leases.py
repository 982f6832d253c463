"""The ledger contract: the ledger's clock, partition leases and their fencing tokens, node
membership (with clock offsets and planner lags), and the fenced planning writes.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from engine.errors import (
    InvalidField,
    LeaseLost,
    NotFound,
)
from engine.ledger.params import (
    Completion,
    ExecutionsClaim,
    ExecutionsComplete,
    ExecutionsPlan,
    ExecutionsRequeueExpired,
    Fence,
    LeasesAcquire,
    LeasesRelease,
    LeasesRenew,
    NodesHeartbeat,
    Outcome,
    PlannedExecution,
    ScheduleAdvance,
    SchedulesCreate,
    SchedulesUpdate,
)
from engine.model import (
    ExecutionStatus,
    execution_id,
)
from engine.testing.ledger_contract.backend import (
    PARTITIONS,
    Backend,
    ids_in_partition,
    schedule,
)
from engine.testing.ledger_contract.support import TTL_S, due_now, own, planned


async def test_database_time_is_aware_utc_and_settings_are_readable(backend: Backend) -> None:
    now = await backend.ledger.database_now()
    assert now.utcoffset() == timedelta(0)
    settings = await backend.ledger.cluster_get()
    assert settings.partition_count == PARTITIONS
    assert settings.region_epoch >= 0


async def test_leases_start_free_and_acquisition_increments_the_token(backend: Backend) -> None:
    leases = await backend.ledger.leases_list()
    assert [lease.partition_id for lease in leases] == list(range(PARTITIONS))
    assert all(lease.owner_id is None for lease in leases)
    acquired = await backend.ledger.leases_acquire(LeasesAcquire("a", [0, 1], ttl_s=TTL_S))
    assert [(x.partition_id, x.owner_id) for x in acquired] == [(0, "a"), (1, "a")]
    tokens = {x.partition_id: x.fencing_token for x in acquired}
    now = await backend.ledger.database_now()
    assert all(x.expires_at is not None and x.expires_at > now for x in acquired)
    # Held partitions are not taken -- not by another node, not again by the holder.
    assert await backend.ledger.leases_acquire(LeasesAcquire("b", [0, 1], TTL_S)) == []
    assert await backend.ledger.leases_acquire(LeasesAcquire("a", [0], TTL_S)) == []
    await backend.advance(TTL_S + 0.1)
    [taken] = await backend.ledger.leases_acquire(LeasesAcquire("b", [0], ttl_s=TTL_S))
    assert taken.owner_id == "b"
    assert taken.fencing_token > tokens[0]


async def test_renew_extends_only_leases_whose_fence_holds(backend: Backend) -> None:
    fence = await own(backend, 2, "a")
    stale = Fence(2, "a", fence.fencing_token - 1)
    other = Fence(2, "b", fence.fencing_token)
    [renewed] = await backend.ledger.leases_renew(LeasesRenew([fence], ttl_s=TTL_S * 100))
    assert renewed.fencing_token == fence.fencing_token
    assert await backend.ledger.leases_renew(LeasesRenew([stale, other], TTL_S)) == []
    [lease] = await backend.ledger.leases_acquire(LeasesAcquire("a", [4], ttl_s=TTL_S))
    short = Fence(4, "a", lease.fencing_token)
    await backend.advance(TTL_S + 0.1)
    # Once expired in the ledger's clock a lease cannot be renewed, only re-acquired.
    assert await backend.ledger.leases_renew(LeasesRenew([short], TTL_S)) == []


async def test_release_hands_over_at_once_and_tokens_are_never_reused(backend: Backend) -> None:
    tokens = []
    for owner in ["a", "b", "a", "c"]:
        fence = await own(backend, 5, owner)
        tokens.append(fence.fencing_token)
        assert await backend.ledger.leases_release(LeasesRelease([fence])) == 1
        assert await backend.ledger.leases_release(LeasesRelease([fence])) == 0
    assert tokens == sorted(set(tokens))
    [lease] = [x for x in await backend.ledger.leases_list() if x.partition_id == 5]
    assert lease.owner_id is None
    assert lease.fencing_token == tokens[-1]


async def test_membership_lists_live_nodes_by_ledger_time(backend: Backend) -> None:
    await backend.ledger.nodes_heartbeat(NodesHeartbeat("n1", "eu", ttl_s=TTL_S))
    info = await backend.ledger.nodes_heartbeat(NodesHeartbeat("n2", "eu", ttl_s=TTL_S * 100))
    assert info.expires_at > info.last_seen_at
    assert [n.node_id for n in await backend.ledger.nodes_live()] == ["n1", "n2"]
    await backend.advance(TTL_S + 0.1)
    assert [n.node_id for n in await backend.ledger.nodes_live()] == ["n2"]
    await backend.ledger.nodes_leave("n2")
    assert await backend.ledger.nodes_live() == []


async def test_plan_inserts_advances_and_checkpoints_idempotently(backend: Backend) -> None:
    partition = 1
    sids = ids_in_partition(partition, 3)
    await backend.ledger.schedules_create(SchedulesCreate([schedule(s) for s in sids]))
    fence = await own(backend, partition)
    at = (await backend.ledger.database_now()).replace(microsecond=0) + timedelta(seconds=30)
    inserted = await planned(backend, fence, sids, at)
    assert sorted(inserted) == sorted(execution_id(s, at) for s in sids)
    for sid in sids:
        stored = await backend.ledger.schedules_get(sid)
        assert stored.next_run_at == at + timedelta(minutes=1)
        detail = await backend.ledger.executions_get(execution_id(sid, at))
        assert detail.execution.status is ExecutionStatus.QUEUED
        assert detail.execution.fencing_token == fence.fencing_token
        assert detail.execution.partition_id == partition
        assert detail.execution.enqueued_at is not None
    [checkpoint] = await backend.ledger.checkpoints_get([partition])
    assert checkpoint.last_evaluated_at == at
    # Re-planning (a restarted planner, a lost reply) inserts nothing new.
    again = await backend.ledger.executions_plan(
        ExecutionsPlan(
            fence,
            [PlannedExecution(s, "acme", "noop", at) for s in sids],
            [],
            checkpoint=at - timedelta(hours=1),
        )
    )
    assert again.inserted == []
    [checkpoint] = await backend.ledger.checkpoints_get([partition])
    assert checkpoint.last_evaluated_at == at  # never moves backwards


async def test_plan_does_not_advance_a_schedule_updated_meanwhile(backend: Backend) -> None:
    [sid] = ids_in_partition(6, 1)
    await backend.ledger.schedules_create(SchedulesCreate([schedule(sid)]))
    fence = await own(backend, 6)
    await backend.ledger.schedules_update(SchedulesUpdate(schedule(sid, cron_expr="0 * * * *"), 1))
    at = await backend.ledger.database_now()
    result = await backend.ledger.executions_plan(
        ExecutionsPlan(fence, [], [ScheduleAdvance(sid, at, expected_version=1)], None)
    )
    assert (result.advanced, result.stale) == ([], [sid])
    assert (await backend.ledger.schedules_get(sid)).next_run_at is None


async def test_plan_records_skipped_fires_as_terminal(backend: Backend) -> None:
    [sid] = ids_in_partition(0, 1)
    await backend.ledger.schedules_create(SchedulesCreate([schedule(sid)]))
    fence = await own(backend, 0)
    at = (await backend.ledger.database_now()).replace(microsecond=0) - timedelta(hours=3)
    skipped = PlannedExecution(
        sid, "acme", "noop", at, ExecutionStatus.SKIPPED, "catchup_window", "missed"
    )
    await backend.ledger.executions_plan(ExecutionsPlan(fence, [skipped], [], None))
    execution = (await backend.ledger.executions_get(execution_id(sid, at))).execution
    assert execution.status is ExecutionStatus.SKIPPED
    assert execution.error_code == "catchup_window"
    assert execution.finished_at is not None
    assert await due_now(backend, 0) == []


async def test_plan_refuses_schedules_of_another_partition(backend: Backend) -> None:
    [sid] = ids_in_partition(2, 1)
    await backend.ledger.schedules_create(SchedulesCreate([schedule(sid)]))
    fence = await own(backend, 3)
    at = await backend.ledger.database_now()
    with pytest.raises(InvalidField):
        await backend.ledger.executions_plan(
            ExecutionsPlan(fence, [PlannedExecution(sid, "acme", "noop", at)], [], None)
        )


async def test_a_stale_or_expired_fence_changes_nothing(backend: Backend) -> None:
    [sid] = ids_in_partition(7, 1)
    await backend.ledger.schedules_create(SchedulesCreate([schedule(sid)]))
    [lease] = await backend.ledger.leases_acquire(LeasesAcquire("a", [7], ttl_s=TTL_S))
    fence = Fence(7, "a", lease.fencing_token)
    at = (await backend.ledger.database_now()).replace(microsecond=0)
    plan = ExecutionsPlan(
        Fence(7, "a", lease.fencing_token + 1),
        [PlannedExecution(sid, "acme", "noop", at)],
        [ScheduleAdvance(sid, at, 1)],
        checkpoint=at,
    )
    with pytest.raises(LeaseLost) as raised:
        await backend.ledger.executions_plan(plan)
    assert raised.value.partitions == (7,)
    await backend.advance(TTL_S + 0.1)
    with pytest.raises(LeaseLost):
        await backend.ledger.executions_plan(
            ExecutionsPlan(fence, plan.executions, plan.advances, at)
        )
    with pytest.raises(NotFound):
        await backend.ledger.executions_get(execution_id(sid, at))
    assert (await backend.ledger.schedules_get(sid)).next_run_at is None
    assert await backend.ledger.checkpoints_get([7]) == []


async def test_a_zombie_cannot_plan_claim_or_complete_after_a_takeover(backend: Backend) -> None:
    [sid] = ids_in_partition(4, 1)
    await backend.ledger.schedules_create(SchedulesCreate([schedule(sid)]))
    [lease] = await backend.ledger.leases_acquire(LeasesAcquire("zombie", [4], ttl_s=TTL_S))
    zombie = Fence(4, "zombie", lease.fencing_token)
    at = (await backend.ledger.database_now()).replace(microsecond=0) - timedelta(seconds=5)
    await planned(backend, zombie, [sid], at)
    eid = execution_id(sid, at)
    [claimed] = await backend.ledger.executions_claim(
        ExecutionsClaim([zombie], [eid], attempt_lease_s=TTL_S, node_id="zombie")
    )
    await backend.advance(TTL_S + 0.1)  # the zombie pauses past its lease
    successor = await own(backend, 4, "successor")
    assert successor.fencing_token > zombie.fencing_token
    with pytest.raises(LeaseLost):
        await planned(backend, zombie, [sid], at + timedelta(minutes=1))
    with pytest.raises(LeaseLost):
        await backend.ledger.executions_claim(ExecutionsClaim([zombie], [eid], 60, "zombie"))
    with pytest.raises(LeaseLost):
        await backend.ledger.executions_complete(
            ExecutionsComplete([zombie], [Completion(eid, claimed.attempt, Outcome.SUCCEEDED)])
        )
    with pytest.raises(LeaseLost):
        await backend.ledger.executions_requeue_expired(ExecutionsRequeueExpired([zombie]))
    assert (await backend.ledger.executions_get(eid)).execution.status is ExecutionStatus.RUNNING
    # The successor recovers the abandoned attempt.
    assert await backend.ledger.executions_requeue_expired(
        ExecutionsRequeueExpired([successor])
    ) == [eid]


async def test_membership_carries_each_nodes_clock_offset(backend: Backend) -> None:
    info = await backend.ledger.nodes_heartbeat(
        NodesHeartbeat("n1", "eu", ttl_s=60, clock_offset_s=-0.25)
    )
    assert info.clock_offset_s == -0.25
    await backend.ledger.nodes_heartbeat(NodesHeartbeat("n2", "eu", ttl_s=60))
    live = await backend.ledger.nodes_live()
    assert [(n.node_id, n.clock_offset_s) for n in live] == [("n1", -0.25), ("n2", None)]
    await backend.ledger.nodes_heartbeat(NodesHeartbeat("n1", "eu", ttl_s=60, clock_offset_s=1))
    await backend.ledger.nodes_heartbeat(NodesHeartbeat("n2", "eu", ttl_s=60, clock_offset_s=0.5))
    live = await backend.ledger.nodes_live()
    assert [(n.node_id, n.clock_offset_s) for n in live] == [("n1", 1.0), ("n2", 0.5)]
    for bad in (float("nan"), float("inf")):
        with pytest.raises(InvalidField, match="clock_offset_s"):
            await backend.ledger.nodes_heartbeat(
                NodesHeartbeat("n1", "eu", ttl_s=60, clock_offset_s=bad)
            )
    assert [n.clock_offset_s for n in await backend.ledger.nodes_live()] == [1.0, 0.5]


async def test_membership_carries_each_nodes_planner_lags(backend: Backend) -> None:
    lags = {0: 0.0, 3: 12.5}
    info = await backend.ledger.nodes_heartbeat(
        NodesHeartbeat("n1", "eu", ttl_s=60, planner_lag_s=lags)
    )
    assert info.planner_lag_s == lags
    await backend.ledger.nodes_heartbeat(NodesHeartbeat("n2", "eu", ttl_s=60))
    live = await backend.ledger.nodes_live()
    assert [(n.node_id, n.planner_lag_s) for n in live] == [("n1", lags), ("n2", {})]
    for bad in ({PARTITIONS: 0.0}, {-1: 0.0}, {0: -1.0}, {0: float("nan")}):
        with pytest.raises(InvalidField, match="planner_lag_s"):
            await backend.ledger.nodes_heartbeat(
                NodesHeartbeat("n1", "eu", ttl_s=60, planner_lag_s=bad)
            )
    assert (await backend.ledger.nodes_live())[0].planner_lag_s == lags
