"""The ledger contract: one suite, run against every backend (memory and real Postgres).

A semantic change to the ledger lands here first. Times are taken from the ledger's own
clock (``database_now``), because Postgres judges expiry by its ``now()``.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Awaitable
from datetime import datetime, timedelta, timezone
from typing import Any

import msgspec
import pytest
import trio

from engine.core.dst import DstGap, DstOverlap
from engine.core.hashing import partition_of
from engine.core.instants import format_utc
from engine.errors import (
    AlreadyExists,
    ChangesPruned,
    InUse,
    InvalidField,
    LeaseLost,
    NotFound,
    QuotaExceeded,
    VersionConflict,
)
from engine.ledger.base import (
    BATCH_ROWS_MAX,
    CENSUS_GROUPS_MAX,
    PAGE_SIZE_MAX,
    PLAN_PAGE_MAX,
    STATS_BUCKET_S_MAX,
    STATS_BUCKETS_MAX,
    AttemptRef,
    AuditQuery,
    Backfilled,
    ChangeKind,
    Completion,
    DeadLettersPurge,
    DeadLettersReplay,
    DueCursor,
    ExecutionsBackfill,
    ExecutionsClaim,
    ExecutionsComplete,
    ExecutionsDue,
    ExecutionsExtend,
    ExecutionsPlan,
    ExecutionsPurge,
    ExecutionsQuery,
    ExecutionsRequeueExpired,
    ExecutionsSkip,
    ExecutionsStats,
    ExecutionsTrigger,
    Fence,
    LeasesAcquire,
    LeasesRelease,
    LeasesRenew,
    NodesHeartbeat,
    Outcome,
    PlannedExecution,
    ScheduleAdvance,
    ScheduleChangesPrune,
    ScheduleChangesSince,
    ScheduleGroup,
    SchedulesCensus,
    SchedulesCreate,
    SchedulesDelete,
    SchedulesList,
    SchedulesPlannable,
    SchedulesUpdate,
    SessionsCreate,
    TaskTypesPut,
    TenantsPut,
    TokensCreate,
    TokensRevoke,
    due_cursor,
    encode_cursor,
)
from engine.ledger.params import plannable
from engine.model import (
    PAYLOAD_BYTES_MAX,
    SETTINGS_BYTES_MAX,
    TENANT_SCHEDULES_MAX,
    ApiToken,
    CatchUpPolicy,
    Execution,
    ExecutionStatus,
    HandlerKind,
    OverlapPolicy,
    Schedule,
    TaskType,
    Tenant,
    execution_id,
)
from tests.ledger.backends import (
    PARTITIONS,
    Backend,
    ids_in_partition,
    schedule,
)

TTL_S = 0.6
"""Short enough that expiry tests on real Postgres wait little, long enough to not flake."""


# --- helpers ---------------------------------------------------------------------------------


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


# --- cluster ---------------------------------------------------------------------------------


async def test_database_time_is_aware_utc_and_settings_are_readable(backend: Backend) -> None:
    now = await backend.ledger.database_now()
    assert now.utcoffset() == timedelta(0)
    settings = await backend.ledger.cluster_get()
    assert settings.partition_count == PARTITIONS
    assert settings.region_epoch >= 0


# --- schedules -------------------------------------------------------------------------------


async def test_create_assigns_version_partition_and_timestamp(backend: Backend) -> None:
    [created] = await backend.ledger.schedules_create(
        SchedulesCreate(
            [
                schedule(
                    "billing",
                    payload={"plan": "pro", "n": [1, 2.5, None]},
                    version=7,
                    timezone="Europe/Paris",
                    catch_up=CatchUpPolicy.NONE,
                    catch_up_window_s=120.0,
                    dst_gap=DstGap.SKIP,
                    dst_overlap=DstOverlap.BOTH,
                    overlap=OverlapPolicy.BUFFER_ONE,
                    enabled=False,
                )
            ]
        )
    )
    assert created.version == 1
    assert created.partition_id == partition_of("billing", PARTITIONS)
    assert created.updated_at is not None
    fetched = await backend.ledger.schedules_get("billing")
    assert fetched == created
    assert fetched.payload == {"plan": "pro", "n": [1, 2.5, None]}
    assert (fetched.catch_up, fetched.dst_gap, fetched.overlap) == (
        CatchUpPolicy.NONE,
        DstGap.SKIP,
        OverlapPolicy.BUFFER_ONE,
    )
    # A schedule without an overlap policy of its own keeps none (its task type's applies).
    [plain] = await backend.ledger.schedules_create(SchedulesCreate([schedule("plain")]))
    assert plain.overlap is None
    assert (await backend.ledger.schedules_get("plain")).overlap is None


async def test_create_is_all_or_nothing_and_names_existing_ids(backend: Backend) -> None:
    await backend.ledger.schedules_create(SchedulesCreate([schedule("a")]))
    with pytest.raises(AlreadyExists) as raised:
        await backend.ledger.schedules_create(SchedulesCreate([schedule("b"), schedule("a")]))
    assert raised.value.ids == ("a",)
    with pytest.raises(NotFound):
        await backend.ledger.schedules_get("b")


async def test_get_many_returns_the_live_schedules_by_id(backend: Backend) -> None:
    created = await backend.ledger.schedules_create(
        SchedulesCreate([schedule("a"), schedule("b", payload={"n": 2}), schedule("c")])
    )
    await backend.ledger.schedules_delete(SchedulesDelete("c"))
    found = await backend.ledger.schedules_get_many(["b", "missing", "c", "a", "b"])
    assert found == {"a": created[0], "b": created[1]}
    assert await backend.ledger.schedules_get_many([]) == {}
    with pytest.raises(InvalidField):
        await backend.ledger.schedules_get_many([f"s{n}" for n in range(PAGE_SIZE_MAX + 1)])


async def test_a_schedule_id_with_a_trailing_line_break_is_refused(backend: Backend) -> None:
    with pytest.raises(InvalidField, match="is invalid"):
        await backend.ledger.schedules_create(SchedulesCreate([schedule("s-newline\n")]))
    assert (await backend.ledger.schedules_list(SchedulesList())).items == []


async def test_payload_at_the_limit_is_stored_and_over_it_refused(backend: Backend) -> None:
    overhead = len(b'{"blob":""}')
    at_limit = {"blob": "x" * (PAYLOAD_BYTES_MAX - overhead)}
    await backend.ledger.schedules_create(SchedulesCreate([schedule("big", payload=at_limit)]))
    assert (await backend.ledger.schedules_get("big")).payload == at_limit
    over = {"blob": "x" * (PAYLOAD_BYTES_MAX - overhead + 1)}
    with pytest.raises(InvalidField, match="payload"):
        await backend.ledger.schedules_create(SchedulesCreate([schedule("bigger", payload=over)]))
    with pytest.raises(NotFound):
        await backend.ledger.schedules_get("bigger")


async def test_update_needs_the_current_version(backend: Backend) -> None:
    [created] = await backend.ledger.schedules_create(SchedulesCreate([schedule("s")]))
    changed = schedule("s", cron_expr="0 * * * *", enabled=False)
    updated = await backend.ledger.schedules_update(SchedulesUpdate(changed, expected_version=1))
    assert (updated.version, updated.cron_expr, updated.enabled) == (2, "0 * * * *", False)
    assert updated.partition_id == created.partition_id
    # A second writer that read version 1 loses, and changes nothing.
    with pytest.raises(VersionConflict):
        await backend.ledger.schedules_update(
            SchedulesUpdate(schedule("s", cron_expr="5 * * * *"), expected_version=1)
        )
    assert (await backend.ledger.schedules_get("s")).cron_expr == "0 * * * *"
    with pytest.raises(NotFound):
        await backend.ledger.schedules_update(SchedulesUpdate(schedule("nope"), 1))


async def test_delete_skips_pending_executions_and_frees_the_id(backend: Backend) -> None:
    partition = 3
    [sid] = ids_in_partition(partition, 1)
    await backend.ledger.schedules_create(SchedulesCreate([schedule(sid)]))
    fence = await own(backend, partition)
    now = await backend.ledger.database_now()
    [first, second] = [now - timedelta(minutes=2), now - timedelta(minutes=1)]
    await planned(backend, fence, [sid], first)
    await planned(backend, fence, [sid], second)
    [running] = await backend.ledger.executions_claim(
        ExecutionsClaim([fence], [execution_id(sid, first)], attempt_lease_s=60, node_id="n")
    )
    with pytest.raises(VersionConflict):
        await backend.ledger.schedules_delete(SchedulesDelete(sid, expected_version=99))
    await backend.ledger.schedules_delete(SchedulesDelete(sid))
    with pytest.raises(NotFound):
        await backend.ledger.schedules_get(sid)
    pending = (await backend.ledger.executions_get(execution_id(sid, second))).execution
    assert pending.status is ExecutionStatus.SKIPPED
    assert pending.error_code == "schedule_deleted"
    still = (await backend.ledger.executions_get(running.execution_id)).execution
    assert still.status is ExecutionStatus.RUNNING
    # Planning never brings a deleted schedule back.
    result = await backend.ledger.executions_plan(
        ExecutionsPlan(fence, [PlannedExecution(sid, "acme", "noop", now)], [], None)
    )
    assert result.inserted == []
    with pytest.raises(NotFound):
        await backend.ledger.schedules_delete(SchedulesDelete(sid))
    [again] = await backend.ledger.schedules_create(SchedulesCreate([schedule(sid)]))
    assert again.version == 2  # versions never repeat across incarnations of an id
    changes = await backend.ledger.schedule_changes(ScheduleChangesSince(after_seq=0))
    assert (changes[-1].kind, changes[-1].version) == (ChangeKind.CREATED, 2)


async def test_list_filters_and_paginates_in_id_order(backend: Backend) -> None:
    batch = [
        schedule(f"s{n:02d}", tenant_id="acme" if n % 2 else "globex", enabled=n % 3 != 0)
        for n in range(25)
    ]
    await backend.ledger.schedules_create(SchedulesCreate(batch))
    seen: list[str] = []
    cursor = None
    while True:
        page = await backend.ledger.schedules_list(SchedulesList(cursor=cursor, limit=10))
        seen += [s.schedule_id for s in page.items]
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert seen == sorted(s.schedule_id for s in batch)
    acme = await backend.ledger.schedules_list(SchedulesList(tenant_id="acme", limit=100))
    assert {s.tenant_id for s in acme.items} == {"acme"}
    assert len(acme.items) == 12
    disabled = await backend.ledger.schedules_list(SchedulesList(enabled=False, limit=100))
    assert len(disabled.items) == 9
    part = await backend.ledger.schedules_list(SchedulesList(partition_id=2, limit=100))
    assert all(s.partition_id == 2 for s in part.items)
    with pytest.raises(InvalidField):
        await backend.ledger.schedules_list(SchedulesList(cursor="not-a-cursor"))
    with pytest.raises(InvalidField):
        await backend.ledger.schedules_list(SchedulesList(limit=PAGE_SIZE_MAX + 1))


async def test_a_planners_load_reads_the_enabled_live_schedules_of_its_partition(
    backend: Backend,
) -> None:
    mine = ids_in_partition(3, 12)
    other = ids_in_partition(4, 2)
    await backend.ledger.schedules_create(
        SchedulesCreate(
            [
                schedule(
                    sid,
                    tenant_id=f"t{n % 3}",
                    cron_expr="H */2 * * *",
                    timezone="Europe/Berlin",
                    catch_up=CatchUpPolicy.ALL,
                    catch_up_window_s=120.5,
                    payload={"big": "x" * 100},
                    enabled=n % 4 != 0,
                )
                for n, sid in enumerate(mine)
            ]
            + [schedule(sid) for sid in other]
        )
    )
    await backend.ledger.schedules_delete(SchedulesDelete(mine[1]))
    wanted = sorted(mine[n] for n in range(12) if n % 4 != 0 and n != 1)
    read: list[str] = []
    after: str | None = None
    while True:
        page = await backend.ledger.schedules_plannable(SchedulesPlannable(3, after, 4))
        for item in page:
            # The same values as the full schedule, payload left out.
            assert item == plannable(await backend.ledger.schedules_get(item.schedule_id))
        read += [item.schedule_id for item in page]
        if len(page) < 4:
            break
        after = page[-1].schedule_id
    assert read == wanted
    assert await backend.ledger.schedules_plannable(SchedulesPlannable(3, wanted[-1])) == []
    with pytest.raises(InvalidField):
        await backend.ledger.schedules_plannable(SchedulesPlannable(3, None, PLAN_PAGE_MAX + 1))


async def test_change_feed_lists_writes_in_order_from_a_watermark(backend: Backend) -> None:
    await backend.ledger.schedules_create(SchedulesCreate([schedule("x"), schedule("y")]))
    await backend.ledger.schedules_update(SchedulesUpdate(schedule("x", enabled=False), 1))
    await backend.ledger.schedules_delete(SchedulesDelete("y"))
    changes = await backend.ledger.schedule_changes(ScheduleChangesSince(after_seq=0))
    assert [(c.schedule_id, c.kind, c.version) for c in changes] == [
        ("x", ChangeKind.CREATED, 1),
        ("y", ChangeKind.CREATED, 1),
        ("x", ChangeKind.UPDATED, 2),
        ("y", ChangeKind.DELETED, 1),
    ]
    seqs = [c.seq for c in changes]
    assert seqs == sorted(set(seqs))
    assert changes[0].partition_id == partition_of("x", PARTITIONS)
    rest = await backend.ledger.schedule_changes(ScheduleChangesSince(after_seq=seqs[1]))
    assert [c.seq for c in rest] == seqs[2:]
    first = await backend.ledger.schedule_changes(ScheduleChangesSince(after_seq=0, limit=1))
    assert [c.seq for c in first] == seqs[:1]


async def test_change_head_is_where_a_new_reader_starts(backend: Backend) -> None:
    assert await backend.ledger.schedule_changes_head() == 0
    await backend.ledger.schedules_create(SchedulesCreate([schedule("h1"), schedule("h2")]))
    head = await backend.ledger.schedule_changes_head()
    changes = await backend.ledger.schedule_changes(ScheduleChangesSince(after_seq=0))
    assert head == changes[-1].seq
    assert await backend.ledger.schedule_changes(ScheduleChangesSince(after_seq=head)) == []


async def test_change_prune_removes_an_old_prefix_and_refuses_readers_below_it(
    backend: Backend,
) -> None:
    await backend.ledger.schedules_create(SchedulesCreate([schedule("p1"), schedule("p2")]))
    await backend.advance(0.05)
    cutoff = await backend.ledger.database_now()
    await backend.ledger.schedules_create(SchedulesCreate([schedule("p3")]))
    seqs = [c.seq for c in await backend.ledger.schedule_changes(ScheduleChangesSince(0))]
    assert await backend.ledger.schedule_changes_prune(ScheduleChangesPrune(cutoff, 1)) == 1
    assert await backend.ledger.schedule_changes_prune(ScheduleChangesPrune(cutoff)) == 1
    # p3's change is younger than the cutoff: kept, and so is everything after it.
    assert await backend.ledger.schedule_changes_prune(ScheduleChangesPrune(cutoff)) == 0
    [kept] = await backend.ledger.schedule_changes(ScheduleChangesSince(seqs[1]))
    assert (kept.seq, kept.schedule_id) == (seqs[2], "p3")
    for behind in (0, seqs[0]):
        with pytest.raises(ChangesPruned) as caught:
            await backend.ledger.schedule_changes(ScheduleChangesSince(behind))
        assert caught.value.pruned_through == seqs[1]
    # Pruned to the end, the feed still starts new readers after every pruned change.
    await backend.advance(0.05)
    now = await backend.ledger.database_now()
    assert await backend.ledger.schedule_changes_prune(ScheduleChangesPrune(now)) == 1
    assert await backend.ledger.schedule_changes_head() == seqs[2]
    assert await backend.ledger.schedule_changes(ScheduleChangesSince(seqs[2])) == []
    await backend.ledger.schedules_create(SchedulesCreate([schedule("p4")]))
    [newer] = await backend.ledger.schedule_changes(ScheduleChangesSince(seqs[2]))
    assert newer.seq > seqs[2]
    for params in (
        ScheduleChangesPrune(now.replace(tzinfo=None)),
        ScheduleChangesPrune(now, 0),
        ScheduleChangesPrune(now, BATCH_ROWS_MAX + 1),
    ):
        with pytest.raises(InvalidField):
            await backend.ledger.schedule_changes_prune(params)


async def test_change_wait_returns_at_once_for_a_pending_change_and_times_out(
    backend: Backend,
) -> None:
    assert await backend.ledger.schedule_changes_wait(after_seq=0, timeout_s=0.05) is False
    await backend.ledger.schedules_create(SchedulesCreate([schedule("w")]))
    [change] = await backend.ledger.schedule_changes(ScheduleChangesSince(after_seq=0))
    with trio.fail_after(5):
        assert await backend.ledger.schedule_changes_wait(after_seq=0, timeout_s=30) is True
    assert await backend.ledger.schedule_changes_wait(change.seq, timeout_s=0.05) is False


async def test_change_wait_wakes_when_a_change_commits(backend: Backend) -> None:
    woke: list[bool] = []

    async def waiter() -> None:
        woke.append(await backend.ledger.schedule_changes_wait(after_seq=0, timeout_s=10))

    with trio.fail_after(8):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(waiter)
            await trio.sleep(0.2)
            await backend.ledger.schedules_create(SchedulesCreate([schedule("late")]))
    assert woke == [True]


# --- task types and tenants -------------------------------------------------------------------


def webhook_type(name: str = "billing-hook", **overrides: object) -> TaskType:
    fields: dict[str, object] = {
        "name": name,
        "kind": HandlerKind.WEBHOOK,
        "settings": {
            "url": "https://hooks.example.com/billing",
            "secret": "whsec_c2VjcmV0",
            "headers": {"X-Team": "billing"},
        },
        # Shared with the tenants the suite uses, unless a test gives it an owner.
        "allowed_tenants": None if "tenant_id" in overrides else ("acme", "globex"),
    }
    fields.update(overrides)
    return TaskType(**fields)  # type: ignore[arg-type]


async def test_a_task_type_is_created_then_replaced_under_the_next_version(
    backend: Backend,
) -> None:
    wanted = webhook_type(
        timeout_s=12.5,
        max_concurrency=4,
        max_concurrency_cluster=40,
        max_attempts=3,
        backoff_base_s=0.5,
        backoff_max_s=30,
        overlap=OverlapPolicy.SKIP,
        version=42,
    )
    created = await backend.ledger.task_types_put(TaskTypesPut(wanted))
    assert created.version == 1
    assert created.updated_at is not None
    assert created == msgspec.structs.replace(
        wanted, version=1, updated_at=created.updated_at, backoff_max_s=30.0
    )
    assert await backend.ledger.task_types_get("billing-hook") == created
    await backend.advance(0.01)
    replaced = await backend.ledger.task_types_put(
        TaskTypesPut(TaskType(name="billing-hook", kind=HandlerKind.PYTHON, settings={}))
    )
    assert (replaced.version, replaced.kind, replaced.settings) == (2, HandlerKind.PYTHON, {})
    # Replacing sets every field: what the new definition leaves out takes its default.
    assert (replaced.timeout_s, replaced.max_concurrency, replaced.overlap) == (30.0, None, None)
    assert replaced.updated_at is not None
    assert replaced.updated_at > created.updated_at
    names = [t.name for t in await backend.ledger.task_types_list()]
    assert names == ["billing-hook", "noop"]


async def test_a_task_type_put_at_a_stale_version_changes_nothing(backend: Backend) -> None:
    await backend.ledger.task_types_put(TaskTypesPut(webhook_type(), expected_version=0))
    with pytest.raises(VersionConflict):
        await backend.ledger.task_types_put(TaskTypesPut(webhook_type(), expected_version=0))
    second = await backend.ledger.task_types_put(
        TaskTypesPut(webhook_type(timeout_s=5), expected_version=1)
    )
    assert second.version == 2
    with pytest.raises(VersionConflict):
        await backend.ledger.task_types_put(
            TaskTypesPut(webhook_type(timeout_s=9), expected_version=1)
        )
    with pytest.raises(VersionConflict):
        await backend.ledger.task_types_put(TaskTypesPut(webhook_type("new"), expected_version=3))
    assert await backend.ledger.task_types_get("billing-hook") == second
    with pytest.raises(NotFound):
        await backend.ledger.task_types_get("new")


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"name": "has space"}, "task type name"),
        ({"kind": "ftp"}, "kind must be one of webhook, python, shell, noop"),
        ({"timeout_s": 0}, "timeout_s"),
        ({"timeout_s": float("inf")}, "timeout_s"),
        ({"max_attempts": 0}, "max_attempts"),
        ({"max_concurrency": 0}, "max_concurrency"),
        ({"max_concurrency_cluster": -1}, "max_concurrency_cluster"),
        ({"backoff_base_s": 10.0, "backoff_max_s": 5.0}, "backoff_max_s"),
        ({"overlap": "sometimes"}, "overlap"),
        ({"settings": {"when": datetime.now}}, "JSON"),
        ({"settings": {"blob": "x" * SETTINGS_BYTES_MAX}}, "limit"),
    ],
)
async def test_malformed_task_types_are_refused_with_the_field_named(
    backend: Backend, overrides: dict[str, object], match: str
) -> None:
    with pytest.raises(InvalidField, match=match):
        await backend.ledger.task_types_put(TaskTypesPut(webhook_type(**overrides)))
    assert [t.name for t in await backend.ledger.task_types_list()] == ["noop"]


@pytest.mark.parametrize("kind", list(HandlerKind))
async def test_every_handler_kind_is_stored_and_read_back(
    backend: Backend, kind: HandlerKind
) -> None:
    """Every kind the registry knows fits the ledger's kind check (Postgres: migration 0009
    added the broker kinds)."""
    settings = {"url": "redis://10.0.0.5:6379/0", "stream": "ticks"}
    wanted = TaskType(name=f"of-{kind}", kind=kind, settings=settings, allowed_tenants=("acme",))
    stored = await backend.ledger.task_types_put(TaskTypesPut(wanted))
    assert (stored.kind, stored.settings) == (kind, settings)
    assert await backend.ledger.task_types_get(f"of-{kind}") == stored


async def test_unknown_task_types_are_not_found(backend: Backend) -> None:
    with pytest.raises(NotFound):
        await backend.ledger.task_types_get("nope")
    with pytest.raises(NotFound):
        await backend.ledger.task_types_delete("nope")


async def test_schedules_naming_an_unknown_task_type_are_refused_at_creation(
    backend: Backend,
) -> None:
    with pytest.raises(InvalidField, match=r"unknown task type 'nope'.*task-type set nope"):
        await backend.ledger.schedules_create(
            SchedulesCreate([schedule("known"), schedule("unknown", task_type="nope")])
        )
    with pytest.raises(NotFound):
        await backend.ledger.schedules_get("known")  # all or nothing
    with pytest.raises(InvalidField, match=r"unknown task types 'a' for tenant 'acme', 'b' for"):
        await backend.ledger.schedules_create(
            SchedulesCreate([schedule("x", task_type="b"), schedule("y", task_type="a")])
        )
    [created] = await backend.ledger.schedules_create(SchedulesCreate([schedule("known")]))
    with pytest.raises(InvalidField, match="unknown task type 'nope'"):
        await backend.ledger.schedules_update(
            SchedulesUpdate(schedule("known", task_type="nope"), expected_version=1)
        )
    assert await backend.ledger.schedules_get("known") == created
    assert await backend.ledger.schedule_changes_head() == 1


async def test_a_schedule_names_only_task_types_its_tenant_may_use(backend: Backend) -> None:
    ledger = backend.ledger
    await ledger.task_types_put(TaskTypesPut(webhook_type("acme-hook", tenant_id="acme")))
    await ledger.task_types_put(TaskTypesPut(webhook_type("shared", allowed_tenants=("acme",))))
    await ledger.task_types_put(TaskTypesPut(webhook_type("plain", allowed_tenants=None)))
    own = await ledger.schedules_create(
        SchedulesCreate(
            [
                schedule("a1", task_type="acme-hook"),
                schedule("a2", task_type="shared"),
                schedule("d1", task_type="plain", tenant_id="default"),
            ]
        )
    )
    assert [s.schedule_id for s in own] == ["a1", "a2", "d1"]
    # Another tenant's task type reads exactly like one that does not exist.
    refusals = []
    for name in ("acme-hook", "shared", "plain", "nope"):
        with pytest.raises(InvalidField) as refused:
            await ledger.schedules_create(
                SchedulesCreate([schedule("g1", tenant_id="globex", task_type=name)])
            )
        refusals.append(str(refused.value).replace(name, "NAME"))
    assert len(set(refusals)) == 1, refusals
    assert "unknown task type 'NAME' for tenant 'globex'" in refusals[0]
    # Nor can a schedule be moved onto one.
    [g1] = await ledger.schedules_create(SchedulesCreate([schedule("g1", tenant_id="globex")]))
    with pytest.raises(InvalidField, match="unknown task type 'acme-hook' for tenant 'globex'"):
        await ledger.schedules_update(
            SchedulesUpdate(schedule("g1", tenant_id="globex", task_type="acme-hook"), 1)
        )
    assert await ledger.schedules_get("g1") == g1


async def test_shared_task_types_are_granted_by_name_or_to_every_tenant(backend: Backend) -> None:
    stored = await backend.ledger.task_types_put(
        TaskTypesPut(webhook_type("hook", allowed_tenants=["globex", "acme", "acme"]))
    )
    assert (stored.tenant_id, stored.allowed_tenants) == (None, ("acme", "globex"))
    assert [stored.usable_by(t) for t in ("acme", "globex", "initech")] == [True, True, False]
    everyone = await backend.ledger.task_types_put(
        TaskTypesPut(webhook_type("hook", allowed_tenants=("*",)))
    )
    assert everyone.usable_by("initech")
    # Not given: the default tenant only, what a one-tenant installation needs.
    plain = await backend.ledger.task_types_put(TaskTypesPut(webhook_type("plain")))
    assert plain.allowed_tenants == ("acme", "globex")  # webhook_type's own grants
    bare = await backend.ledger.task_types_put(
        TaskTypesPut(TaskType(name="bare", kind=HandlerKind.NOOP))
    )
    assert bare.allowed_tenants == ("default",)
    owned = await backend.ledger.task_types_put(
        TaskTypesPut(TaskType(name="mine", kind=HandlerKind.NOOP, tenant_id="acme"))
    )
    assert (owned.tenant_id, owned.allowed_tenants) == ("acme", ())
    assert await backend.ledger.task_types_get("mine") == owned


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (
            {"kind": HandlerKind.SHELL, "settings": {"argv": ["true"]}, "allowed_tenants": ("*",)},
            "granted to tenants by name only",
        ),
        (
            {
                "kind": HandlerKind.PYTHON,
                "settings": {"callable": "m:f"},
                "allowed_tenants": ("*",),
            },
            "granted to tenants by name only",
        ),
        ({"tenant_id": "acme", "allowed_tenants": ("globex",)}, "usable by that tenant only"),
        ({"allowed_tenants": ("has space",)}, "allowed_tenants entry 'has space' is invalid"),
        ({"allowed_tenants": "acme"}, "must be a list of tenant ids"),
        ({"tenant_id": ""}, "tenant_id '' is invalid"),
        ({"allowed_tenants": tuple(f"t{n}" for n in range(1001))}, "at most 1000"),
    ],
)
async def test_malformed_grants_are_refused_and_change_nothing(
    backend: Backend, fields: dict[str, Any], message: str
) -> None:
    with pytest.raises(InvalidField, match=message):
        await backend.ledger.task_types_put(TaskTypesPut(webhook_type("hook", **fields)))
    with pytest.raises(NotFound):
        await backend.ledger.task_types_get("hook")


async def test_a_grant_cannot_be_withdrawn_from_tenants_with_live_schedules(
    backend: Backend,
) -> None:
    ledger = backend.ledger
    await ledger.task_types_put(TaskTypesPut(webhook_type("hook", allowed_tenants=("*",))))
    await ledger.schedules_create(
        SchedulesCreate(
            [
                schedule("a1", task_type="hook"),
                schedule("a2", task_type="hook"),
                schedule("g1", task_type="hook", tenant_id="globex"),
            ]
        )
    )
    for narrower in (("globex",), ("initech",)):
        with pytest.raises(InUse, match=r"no longer be available to: 'acme' \(2\)"):
            await ledger.task_types_put(
                TaskTypesPut(webhook_type("hook", allowed_tenants=narrower))
            )
    with pytest.raises(InUse, match=r"'acme' \(2\), 'globex' \(1\)"):
        await ledger.task_types_put(TaskTypesPut(webhook_type("hook", tenant_id="initech")))
    assert (await ledger.task_types_get("hook")).version == 1
    # Granting more, or keeping every user, is a plain change; deleted schedules hold nothing.
    kept = await ledger.task_types_put(
        TaskTypesPut(webhook_type("hook", allowed_tenants=("acme", "globex")))
    )
    assert kept.version == 2
    await ledger.schedules_delete(SchedulesDelete("g1"))
    owned = await ledger.task_types_put(TaskTypesPut(webhook_type("hook", tenant_id="acme")))
    assert (owned.version, owned.tenant_id) == (3, "acme")
    # A stale version is reported as such, before who uses it is looked at.
    with pytest.raises(VersionConflict):
        await ledger.task_types_put(
            TaskTypesPut(webhook_type("hook", tenant_id="globex"), expected_version=1)
        )


async def test_a_deleted_id_is_revived_only_for_its_own_tenant(backend: Backend) -> None:
    ledger = backend.ledger
    await ledger.schedules_create(SchedulesCreate([schedule("once", tenant_id="globex")]))
    await ledger.schedules_delete(SchedulesDelete("once"))
    with pytest.raises(AlreadyExists) as taken:
        await ledger.schedules_create(SchedulesCreate([schedule("once", tenant_id="acme")]))
    assert taken.value.ids == ("once",)
    with pytest.raises(NotFound):
        await ledger.schedules_get("once")
    [again] = await ledger.schedules_create(SchedulesCreate([schedule("once", tenant_id="globex")]))
    assert (again.tenant_id, again.version) == ("globex", 2)


async def test_a_task_type_cannot_be_deleted_while_live_schedules_name_it(
    backend: Backend,
) -> None:
    await backend.ledger.task_types_put(TaskTypesPut(webhook_type("report")))
    batch = [schedule(f"r{n}", task_type="report") for n in range(7)]
    await backend.ledger.schedules_create(SchedulesCreate(batch))
    with pytest.raises(InUse, match=r"used by 7 schedules \(r0, r1, r2, r3, r4 and 2 more"):
        await backend.ledger.task_types_delete("report")
    assert (await backend.ledger.task_types_get("report")).version == 1
    for n in range(6):
        await backend.ledger.schedules_delete(SchedulesDelete(f"r{n}"))
    # A schedule moved to another task type no longer holds it; deleted ones never do.
    await backend.ledger.schedules_update(SchedulesUpdate(schedule("r6"), expected_version=1))
    deleted = await backend.ledger.task_types_delete("report")
    assert deleted.name == "report"
    with pytest.raises(NotFound):
        await backend.ledger.task_types_get("report")
    # A deleted schedule of the gone type cannot come back under it.
    with pytest.raises(InvalidField, match="unknown task type 'report'"):
        await backend.ledger.schedules_create(SchedulesCreate([schedule("r0", task_type="report")]))


async def test_one_live_schedule_blocks_a_delete_and_is_named(backend: Backend) -> None:
    await backend.ledger.schedules_create(SchedulesCreate([schedule("only")]))
    with pytest.raises(InUse, match=r"'noop' is still used by 1 schedule \(only\)"):
        await backend.ledger.task_types_delete("noop")


async def succeeds(call: Awaitable[object], outcomes: dict[str, bool], key: str) -> None:
    """Record whether ``call`` succeeded or was refused (a create naming a task type that is
    gone: ``InvalidField``; a delete of one still in use: ``InUse``)."""
    try:
        await call
        outcomes[key] = True
    except (InvalidField, InUse):
        outcomes[key] = False


async def test_racing_creates_and_a_delete_never_leave_a_schedule_without_its_task_type(
    backend: Backend,
) -> None:
    for round_ in range(5):
        name = f"racy-{round_}"
        await backend.ledger.task_types_put(TaskTypesPut(webhook_type(name)))
        outcomes: dict[str, bool] = {}
        async with trio.open_nursery() as nursery:
            for n in range(3):
                sid = f"{name}-{n}"
                create = SchedulesCreate([schedule(sid, task_type=name)])
                nursery.start_soon(succeeds, backend.ledger.schedules_create(create), outcomes, sid)
            nursery.start_soon(succeeds, backend.ledger.task_types_delete(name), outcomes, "delete")
        created = [key for key, ok in outcomes.items() if ok and key != "delete"]
        if outcomes["delete"]:
            assert created == []
        else:
            assert created
            assert (await backend.ledger.task_types_get(name)).name == name
        for sid in created:
            assert (await backend.ledger.schedules_get(sid)).task_type == name


async def test_tenants_are_stored_versioned_and_listed_by_id(backend: Backend) -> None:
    assert await backend.ledger.tenants_list() == []
    with pytest.raises(NotFound):
        await backend.ledger.tenants_get("acme")  # never put: the caller uses the defaults
    assert Tenant(tenant_id="acme").weight == 1
    big = await backend.ledger.tenants_put(
        TenantsPut(
            Tenant(tenant_id="globex", weight=5, concurrency_quota=20, rate_per_s=2, burst=10)
        )
    )
    assert (big.version, big.weight, big.rate_per_s, big.burst) == (1, 5, 2.0, 10)
    assert big.updated_at is not None
    small = await backend.ledger.tenants_put(TenantsPut(Tenant(tenant_id="acme")))
    assert await backend.ledger.tenants_list() == [small, big]
    assert await backend.ledger.tenants_get("globex") == big
    again = await backend.ledger.tenants_put(
        TenantsPut(Tenant(tenant_id="globex", weight=7), expected_version=1)
    )
    assert (again.version, again.weight, again.concurrency_quota, again.rate_per_s) == (
        2,
        7,
        None,
        None,
    )
    with pytest.raises(VersionConflict):
        await backend.ledger.tenants_put(
            TenantsPut(Tenant(tenant_id="globex", weight=9), expected_version=1)
        )
    assert await backend.ledger.tenants_get("globex") == again


@pytest.mark.parametrize(
    ("tenant", "match"),
    [
        (Tenant(tenant_id="a b"), "tenant id"),
        (Tenant(tenant_id="t", weight=0), "weight"),
        (Tenant(tenant_id="t", weight=1001), "weight"),
        (Tenant(tenant_id="t", concurrency_quota=0), "concurrency_quota"),
        (Tenant(tenant_id="t", rate_per_s=0.0), "rate_per_s"),
        (Tenant(tenant_id="t", rate_per_s=float("nan")), "rate_per_s"),
        (Tenant(tenant_id="t", burst=5), "burst only applies with a rate"),
        (Tenant(tenant_id="t", schedules_max=0), "schedules_max"),
        (Tenant(tenant_id="t", schedules_max=TENANT_SCHEDULES_MAX + 1), "schedules_max"),
    ],
)
async def test_malformed_tenants_are_refused_with_the_field_named(
    backend: Backend, tenant: Tenant, match: str
) -> None:
    with pytest.raises(InvalidField, match=match):
        await backend.ledger.tenants_put(TenantsPut(tenant))
    assert await backend.ledger.tenants_list() == []


# --- leases and membership --------------------------------------------------------------------


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


# --- planning ---------------------------------------------------------------------------------


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


# --- execution ------------------------------------------------------------------------------


async def test_due_and_claim_never_start_early(backend: Backend) -> None:
    sids = ids_in_partition(2, 2)
    await backend.ledger.schedules_create(SchedulesCreate([schedule(s) for s in sids]))
    fence = await own(backend, 2)
    now = (await backend.ledger.database_now()).replace(microsecond=0)
    past, future = now - timedelta(seconds=1), now + timedelta(minutes=10)
    await planned(backend, fence, sids[:1], past)
    await planned(backend, fence, sids[1:], future)
    assert await due_now(backend, 2) == [execution_id(sids[0], past)]
    later = await due_now(backend, 2, after=3600)
    assert later == [execution_id(sids[0], past), execution_id(sids[1], future)]
    claimed = await backend.ledger.executions_claim(
        ExecutionsClaim(
            [fence],
            [execution_id(sids[0], past), execution_id(sids[1], future)],
            attempt_lease_s=30,
            node_id="n1",
        )
    )
    assert [c.execution_id for c in claimed] == [execution_id(sids[0], past)]
    [running] = claimed
    assert (running.status, running.attempt) == (ExecutionStatus.RUNNING, 1)
    assert running.started_at is not None
    assert running.attempt_expires_at is not None
    assert running.attempt_expires_at > running.started_at
    # Already running: a second claim (another worker, a redelivery) gets nothing.
    assert (
        await backend.ledger.executions_claim(
            ExecutionsClaim([fence], [running.execution_id], 30, "n2")
        )
        == []
    )


async def test_due_pages_one_tenants_backlog_after_a_cursor_in_due_order(
    backend: Backend,
) -> None:
    sids = ids_in_partition(3, 9)
    tenants = ["acme", "beta", "gamma"]
    await backend.ledger.schedules_create(
        SchedulesCreate([schedule(s, tenant_id=tenants[n % 3]) for n, s in enumerate(sids)])
    )
    fence = await own(backend, 3)
    now = (await backend.ledger.database_now()).replace(microsecond=0)
    early, late = now - timedelta(seconds=2), now - timedelta(seconds=1)
    await planned(backend, fence, sids[:6], early)
    await planned(backend, fence, sids[6:], late)
    everything = await backend.ledger.executions_due(ExecutionsDue([3], now))
    betas = [e for e in everything if e.tenant_id == "beta"]
    assert [e.execution_id for e in betas] == [
        *sorted(execution_id(s, early) for s in sids[1:6:3]),
        execution_id(sids[7], late),
    ]

    def beta_due(after: DueCursor | None, limit: int) -> Awaitable[list[Execution]]:
        return backend.ledger.executions_due(
            ExecutionsDue([3], now, limit, after=after, tenant_id="beta")
        )

    # Only beta's, in due order, paged after a cursor that may be another tenant's.
    assert await beta_due(None, 10) == betas
    assert await beta_due(None, 1) == betas[:1]
    for execution in everything:
        position = due_cursor(execution)
        key = (position.startable_at, position.execution_id)
        assert await beta_due(position, 10) == [
            b for b in betas if (due_cursor(b).startable_at, b.execution_id) > key
        ]
    assert await backend.ledger.executions_due(ExecutionsDue([3], now, tenant_id="nobody")) == []
    other_partition = ExecutionsDue([4], now, tenant_id="beta")
    assert await backend.ledger.executions_due(other_partition) == []


async def test_only_the_current_attempt_completes(backend: Backend) -> None:
    [sid] = ids_in_partition(1, 1)
    await backend.ledger.schedules_create(SchedulesCreate([schedule(sid)]))
    fence = await own(backend, 1)
    at = (await backend.ledger.database_now()).replace(microsecond=0) - timedelta(seconds=1)
    await planned(backend, fence, [sid], at)
    eid = execution_id(sid, at)
    [running] = await backend.ledger.executions_claim(ExecutionsClaim([fence], [eid], 30, "n"))
    result = await backend.ledger.executions_complete(
        ExecutionsComplete(
            [fence],
            [Completion(eid, running.attempt + 1, Outcome.SUCCEEDED)],
        )
    )
    assert (result.applied, result.stale) == ([], [eid])
    done = await backend.ledger.executions_complete(
        ExecutionsComplete([fence], [Completion(eid, running.attempt, Outcome.SUCCEEDED)])
    )
    assert done.applied == [eid]
    again = await backend.ledger.executions_complete(
        ExecutionsComplete([fence], [Completion(eid, running.attempt, Outcome.SUCCEEDED)])
    )
    assert again.stale == [eid]
    detail = await backend.ledger.executions_get(eid)
    assert detail.execution.status is ExecutionStatus.SUCCEEDED
    assert detail.execution.finished_at is not None
    assert [(a.attempt, a.outcome) for a in detail.attempts] == [(1, "succeeded")]


async def test_failed_attempts_retry_after_not_before_then_dead_letter_and_replay(
    backend: Backend,
) -> None:
    [sid] = ids_in_partition(3, 1)
    await backend.ledger.schedules_create(SchedulesCreate([schedule(sid)]))
    fence = await own(backend, 3)
    at = (await backend.ledger.database_now()).replace(microsecond=0) - timedelta(seconds=1)
    await planned(backend, fence, [sid], at)
    eid = execution_id(sid, at)
    claim = ExecutionsClaim([fence], [eid], attempt_lease_s=30, node_id="n")
    [first] = await backend.ledger.executions_claim(claim)
    retry_at = (await backend.ledger.database_now()) + timedelta(seconds=TTL_S)
    await backend.ledger.executions_complete(
        ExecutionsComplete(
            [fence],
            [Completion(eid, first.attempt, Outcome.FAILED, retry_at, "http_503", "busy")],
        )
    )
    failed = (await backend.ledger.executions_get(eid)).execution
    assert (failed.status, failed.not_before, failed.error_code) == (
        ExecutionStatus.FAILED,
        retry_at,
        "http_503",
    )
    assert await due_now(backend, 3) == []
    assert await backend.ledger.executions_claim(claim) == []
    await backend.advance(TTL_S + 0.1)
    assert await due_now(backend, 3) == [eid]
    [second] = await backend.ledger.executions_claim(claim)
    assert second.attempt == 2
    await backend.ledger.executions_complete(
        ExecutionsComplete(
            [fence],
            [Completion(eid, 2, Outcome.DEAD_LETTER, error_code="http_404", error_message="gone")],
        )
    )
    letters = await backend.ledger.executions_query(
        ExecutionsQuery(status=ExecutionStatus.DEAD_LETTER)
    )
    assert [e.execution_id for e in letters.items] == [eid]
    assert await backend.ledger.dead_letters_replay(
        DeadLettersReplay([eid, "nope:x"], actor="ops")
    ) == [eid]
    replayed = (await backend.ledger.executions_get(eid)).execution
    assert replayed.status is ExecutionStatus.QUEUED
    [third] = await backend.ledger.executions_claim(claim)
    assert third.execution_id == eid  # the same id: the idempotency key is unchanged
    assert third.attempt == 3
    history = (await backend.ledger.executions_get(eid)).attempts
    assert [(a.attempt, a.outcome, a.error_code) for a in history] == [
        (1, "failed", "http_503"),
        (2, "dead-letter", "http_404"),
    ]
    # Only dead letters are replayed.
    assert await backend.ledger.dead_letters_replay(DeadLettersReplay([eid], actor="ops")) == []


async def test_skip_ends_only_unstarted_executions_fenced_and_idempotently(
    backend: Backend,
) -> None:
    sids = ids_in_partition(4, 4)
    await backend.ledger.schedules_create(SchedulesCreate([schedule(s) for s in sids]))
    fence = await own(backend, 4)
    now = (await backend.ledger.database_now()).replace(microsecond=0)
    past, future = now - timedelta(seconds=1), now + timedelta(minutes=10)
    await planned(backend, fence, sids[:3], past)
    await planned(backend, fence, sids[3:], future)
    queued, running, failed, not_due = (
        execution_id(sids[0], past),
        execution_id(sids[1], past),
        execution_id(sids[2], past),
        execution_id(sids[3], future),
    )
    await backend.ledger.executions_claim(ExecutionsClaim([fence], [running, failed], 30, "n"))
    retry_at = now + timedelta(hours=1)
    await backend.ledger.executions_complete(
        ExecutionsComplete([fence], [Completion(failed, 1, Outcome.FAILED, retry_at, "http_503")])
    )
    skip = ExecutionsSkip(
        [fence], [not_due, running, queued, failed, queued], "overlap", "still running"
    )
    # Not-yet-due, queued and failed-awaiting-retry ones are skipped; running ones are not.
    assert await backend.ledger.executions_skip(skip) == [not_due, queued, failed]
    assert await backend.ledger.executions_skip(skip) == []
    for eid in (not_due, queued, failed):
        detail = await backend.ledger.executions_get(eid)
        row = detail.execution
        assert (row.status, row.error_code, row.error_message) == (
            ExecutionStatus.SKIPPED,
            "overlap",
            "still running",
        )
        assert row.finished_at is not None
        assert row.not_before is None
        assert row.fencing_token == fence.fencing_token
        assert len(detail.attempts) == (1 if eid == failed else 0)  # a skip is no attempt
    assert (await backend.ledger.executions_get(running)).execution.status is (
        ExecutionStatus.RUNNING
    )
    assert await due_now(backend, 4, after=3600) == []
    with pytest.raises(InvalidField):
        await backend.ledger.executions_skip(ExecutionsSkip([fence], [running], ""))
    [other] = ids_in_partition(5, 1)
    with pytest.raises(InvalidField):
        await backend.ledger.executions_skip(
            ExecutionsSkip([fence], [execution_id(other, past)], "overlap")
        )
    # A stale fence changes nothing.
    await backend.ledger.leases_release(LeasesRelease([fence]))
    newer = await own(backend, 4, owner="node-b")
    await planned(backend, newer, sids[:1], now)
    with pytest.raises(LeaseLost):
        await backend.ledger.executions_skip(
            ExecutionsSkip([fence], [execution_id(sids[0], now)], "overlap")
        )
    assert (await backend.ledger.executions_get(execution_id(sids[0], now))).execution.status is (
        ExecutionStatus.QUEUED
    )


async def test_queries_filter_by_task_type_and_finished_since(backend: Backend) -> None:
    await backend.ledger.task_types_put(
        TaskTypesPut(TaskType(name="other", kind=HandlerKind.NOOP, allowed_tenants=("*",)))
    )
    sids = ids_in_partition(4, 3, prefix="ft")
    kinds = ["noop", "other", "other"]
    await backend.ledger.schedules_create(
        SchedulesCreate([schedule(s, task_type=k) for s, k in zip(sids, kinds, strict=True)])
    )
    fence = await own(backend, 4)
    at = (await backend.ledger.database_now()).replace(microsecond=0) - timedelta(seconds=1)
    await planned(backend, fence, sids, at)
    eids = [execution_id(s, at) for s in sids]
    others = await backend.ledger.executions_query(ExecutionsQuery(task_type="other"))
    assert [e.execution_id for e in others.items] == sorted(eids[1:])
    before = await backend.ledger.database_now()
    [claimed] = await backend.ledger.executions_claim(ExecutionsClaim([fence], [eids[1]], 30, "n"))
    await backend.ledger.executions_complete(
        ExecutionsComplete([fence], [Completion(eids[1], claimed.attempt, Outcome.DEAD_LETTER)])
    )
    since = await backend.ledger.executions_query(
        ExecutionsQuery(task_type="other", finished_from=before)
    )
    assert [e.execution_id for e in since.items] == [eids[1]]  # unfinished ones never match
    await backend.advance(0.05)
    later = await backend.ledger.database_now()
    assert (await backend.ledger.executions_query(ExecutionsQuery(finished_from=later))).items == []


async def test_expired_attempts_are_requeued_and_their_late_completion_is_stale(
    backend: Backend,
) -> None:
    [sid] = ids_in_partition(5, 1)
    await backend.ledger.schedules_create(SchedulesCreate([schedule(sid)]))
    fence = await own(backend, 5)
    at = (await backend.ledger.database_now()).replace(microsecond=0) - timedelta(seconds=1)
    await planned(backend, fence, [sid], at)
    eid = execution_id(sid, at)
    [hung] = await backend.ledger.executions_claim(
        ExecutionsClaim([fence], [eid], attempt_lease_s=TTL_S, node_id="n")
    )
    requeue = ExecutionsRequeueExpired([fence])
    assert await backend.ledger.executions_requeue_expired(requeue) == []
    await backend.advance(TTL_S + 0.1)
    assert await backend.ledger.executions_requeue_expired(requeue) == [eid]
    requeued = (await backend.ledger.executions_get(eid)).execution
    assert requeued.status is ExecutionStatus.QUEUED
    assert requeued.attempt_expires_at is None
    late = await backend.ledger.executions_complete(
        ExecutionsComplete([fence], [Completion(eid, hung.attempt, Outcome.SUCCEEDED)])
    )
    assert late.stale == [eid]
    [retry] = await backend.ledger.executions_claim(ExecutionsClaim([fence], [eid], 30, "n2"))
    assert retry.attempt == hung.attempt + 1
    history = (await backend.ledger.executions_get(eid)).attempts
    assert [(a.attempt, a.outcome) for a in history] == [(1, "expired")]


async def test_claims_are_fenced_per_partition(backend: Backend) -> None:
    [mine] = ids_in_partition(0, 1)
    [theirs] = ids_in_partition(1, 1)
    await backend.ledger.schedules_create(SchedulesCreate([schedule(mine), schedule(theirs)]))
    fence = await own(backend, 0, "a")
    other = await own(backend, 1, "b")
    at = (await backend.ledger.database_now()).replace(microsecond=0) - timedelta(seconds=1)
    await planned(backend, fence, [mine], at)
    await planned(backend, other, [theirs], at)
    with pytest.raises(InvalidField):
        await backend.ledger.executions_claim(
            ExecutionsClaim([fence], [execution_id(theirs, at)], 30, "a")
        )
    stale = Fence(1, "a", other.fencing_token)
    with pytest.raises(LeaseLost) as raised:
        await backend.ledger.executions_claim(
            ExecutionsClaim(
                [fence, stale], [execution_id(mine, at), execution_id(theirs, at)], 30, "a"
            )
        )
    assert raised.value.partitions == (1,)
    mine_now = (await backend.ledger.executions_get(execution_id(mine, at))).execution
    assert mine_now.status is ExecutionStatus.QUEUED  # all or nothing


async def test_queries_filter_and_paginate_and_unknown_ids_are_not_found(
    backend: Backend,
) -> None:
    sids = ids_in_partition(6, 3)
    await backend.ledger.schedules_create(
        SchedulesCreate([schedule(s, tenant_id=f"t{n}") for n, s in enumerate(sids)])
    )
    fence = await own(backend, 6)
    base = (await backend.ledger.database_now()).replace(microsecond=0) - timedelta(hours=1)
    for minute in range(4):
        await planned(backend, fence, sids, base + timedelta(minutes=minute))
    everything: list[str] = []
    cursor = None
    while True:
        page = await backend.ledger.executions_query(ExecutionsQuery(cursor=cursor, limit=5))
        everything += [e.execution_id for e in page.items]
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert len(everything) == 12
    assert len(set(everything)) == 12
    one = await backend.ledger.executions_query(ExecutionsQuery(schedule_id=sids[0]))
    assert [e.planned_at for e in one.items] == [base + timedelta(minutes=m) for m in range(4)]
    ranged = await backend.ledger.executions_query(
        ExecutionsQuery(
            tenant_id="t1",
            planned_from=base + timedelta(minutes=1),
            planned_to=base + timedelta(minutes=3),
        )
    )
    assert [e.planned_at for e in ranged.items] == [
        base + timedelta(minutes=1),
        base + timedelta(minutes=2),
    ]
    with pytest.raises(NotFound):
        await backend.ledger.executions_get("nope:2026-01-01T00:00:00Z")


async def test_retention_purges_old_terminal_rows_but_keeps_dead_letters(
    backend: Backend,
) -> None:
    sids = ids_in_partition(7, 3)
    await backend.ledger.schedules_create(SchedulesCreate([schedule(s) for s in sids]))
    fence = await own(backend, 7)
    at = (await backend.ledger.database_now()).replace(microsecond=0) - timedelta(seconds=1)
    await planned(backend, fence, sids, at)
    eids = [execution_id(s, at) for s in sids]
    claimed = await backend.ledger.executions_claim(ExecutionsClaim([fence], eids, 30, "n"))
    outcomes = [Outcome.SUCCEEDED, Outcome.SKIPPED, Outcome.DEAD_LETTER]
    await backend.ledger.executions_complete(
        ExecutionsComplete(
            [fence],
            [
                Completion(c.execution_id, c.attempt, o)
                for c, o in zip(claimed, outcomes, strict=True)
            ],
        )
    )
    await backend.advance(0.05)
    cutoff = await backend.ledger.database_now()
    purge = ExecutionsPurge(fence, finished_before=cutoff, limit=1)
    assert await backend.ledger.executions_purge(purge) == 1
    assert await backend.ledger.executions_purge(ExecutionsPurge(fence, cutoff)) == 1
    assert await backend.ledger.executions_purge(ExecutionsPurge(fence, cutoff)) == 0
    remaining = await backend.ledger.executions_query(ExecutionsQuery())
    assert [e.status for e in remaining.items] == [ExecutionStatus.DEAD_LETTER]
    with pytest.raises(LeaseLost):
        await backend.ledger.executions_purge(
            ExecutionsPurge(Fence(7, "x", fence.fencing_token), cutoff)
        )


async def finished(
    backend: Backend, fence: Fence, sids: list[str], at: datetime, outcome: Outcome
) -> list[str]:
    """Plan ``sids`` at ``at``, run them once and finish them with ``outcome``."""
    await planned(backend, fence, sids, at)
    eids = [execution_id(s, at) for s in sids]
    claimed = await backend.ledger.executions_claim(ExecutionsClaim([fence], eids, 30, "n"))
    await backend.ledger.executions_complete(
        ExecutionsComplete(
            [fence], [Completion(c.execution_id, c.attempt, outcome) for c in claimed]
        )
    )
    return eids


async def test_retention_of_dead_letters_purges_only_old_dead_letters(backend: Backend) -> None:
    sids = ids_in_partition(5, 2, prefix="dl")
    await backend.ledger.schedules_create(SchedulesCreate([schedule(s) for s in sids]))
    fence = await own(backend, 5)
    at = (await backend.ledger.database_now()).replace(microsecond=0) - timedelta(minutes=2)
    [letter] = await finished(backend, fence, sids[:1], at, Outcome.DEAD_LETTER)
    [done] = await finished(backend, fence, sids[1:], at, Outcome.SUCCEEDED)
    await backend.advance(0.05)
    cutoff = await backend.ledger.database_now()
    await finished(backend, fence, sids[:1], at + timedelta(minutes=1), Outcome.DEAD_LETTER)
    purge = ExecutionsPurge(fence, cutoff, dead_letters=True)
    assert await backend.ledger.executions_purge(purge) == 1
    assert await backend.ledger.executions_purge(purge) == 0
    with pytest.raises(NotFound):
        await backend.ledger.executions_get(letter)
    left = await backend.ledger.executions_query(ExecutionsQuery())
    assert [(e.execution_id, e.status) for e in left.items] == [
        (done, ExecutionStatus.SUCCEEDED),
        (execution_id(sids[0], at + timedelta(minutes=1)), ExecutionStatus.DEAD_LETTER),
    ]


async def test_dead_letter_purge_deletes_dead_letters_only_and_audits_each(
    backend: Backend,
) -> None:
    sids = ids_in_partition(6, 3, prefix="purge")
    await backend.ledger.schedules_create(SchedulesCreate([schedule(s) for s in sids]))
    fence = await own(backend, 6)
    at = (await backend.ledger.database_now()).replace(microsecond=0) - timedelta(minutes=3)
    letters = await finished(backend, fence, sids[:2], at, Outcome.DEAD_LETTER)
    [done] = await finished(backend, fence, sids[2:], at, Outcome.SUCCEEDED)
    for refused, match in (
        (DeadLettersPurge(letters, ""), "actor"),
        (DeadLettersPurge(letters, "ops", ""), "reason"),
        (DeadLettersPurge(["x"] * (BATCH_ROWS_MAX + 1), "ops"), str(BATCH_ROWS_MAX)),
    ):
        with pytest.raises(InvalidField, match=match):
            await backend.ledger.dead_letters_purge(refused)
    asked = [letters[1], done, "nope:2026-01-01T00:00:00Z", letters[0], letters[1]]
    purged = await backend.ledger.dead_letters_purge(DeadLettersPurge(asked, "ops", "noise"))
    assert purged == [letters[1], letters[0]]
    for key in letters:
        with pytest.raises(NotFound):
            await backend.ledger.executions_get(key)
    assert (await backend.ledger.executions_get(done)).execution.status is ExecutionStatus.SUCCEEDED
    events = await backend.ledger.audit_list(AuditQuery(action="dead_letter.purge"))
    assert [(e.actor, e.target, e.details) for e in events] == [
        (
            "ops",
            key,
            {"reason": "noise", "attempt": 1, "error_code": None, "schedule_id": sid},
        )
        for key, sid in ((letters[1], sids[1]), (letters[0], sids[0]))
    ]
    assert await backend.ledger.dead_letters_purge(DeadLettersPurge(letters, "ops")) == []
    assert len(await backend.ledger.audit_list(AuditQuery(action="dead_letter.purge"))) == 2
    # A purged dead letter is purged history: a backfill does not run its fire again.
    result = await backend.ledger.executions_backfill(ExecutionsBackfill(sids[0], [at], "ops"))
    assert result == Backfilled([], at, 1)


async def test_backfill_skips_the_fires_whose_history_retention_purged(
    backend: Backend,
) -> None:
    partition = 4
    [sid] = ids_in_partition(partition, 1, prefix="kept")
    await backend.ledger.schedules_create(SchedulesCreate([schedule(sid)]))
    fence = await own(backend, partition)
    t0 = (await backend.ledger.database_now()).replace(microsecond=0) - timedelta(minutes=10)
    t1 = t0 + timedelta(minutes=1)
    await finished(backend, fence, [sid], t0, Outcome.SUCCEEDED)
    await finished(backend, fence, [sid], t1, Outcome.SUCCEEDED)
    await backend.advance(0.05)
    cutoff = await backend.ledger.database_now()
    assert await backend.ledger.executions_purge(ExecutionsPurge(fence, cutoff)) == 2
    asked = [t0 - timedelta(minutes=1), t0, t1, t1 + timedelta(minutes=1)]
    result = await backend.ledger.executions_backfill(ExecutionsBackfill(sid, asked, "ops"))
    assert result == Backfilled([execution_id(sid, asked[3])], t1, 3)
    [event] = await backend.ledger.audit_list(AuditQuery(action="schedule.backfill"))
    assert (event.details["inserted"], event.details["skipped_purged"]) == (1, 3)
    # The horizon outlives the schedule: its id created again has the same execution ids.
    await backend.ledger.schedules_delete(SchedulesDelete(sid))
    await backend.ledger.schedules_create(SchedulesCreate([schedule(sid)]))
    again = await backend.ledger.executions_backfill(ExecutionsBackfill(sid, [t1], "ops"))
    assert again == Backfilled([], t1, 1)
    assert await backend.ledger.executions_backfill(ExecutionsBackfill(sid, [], "ops")) == (
        Backfilled([], t1)
    )
    # Purging an older fire later never moves the horizon back.
    await backend.ledger.executions_skip(
        ExecutionsSkip([fence], [execution_id(sid, asked[3])], "test")
    )
    await backend.advance(0.05)
    cutoff = await backend.ledger.database_now()
    assert await backend.ledger.executions_purge(ExecutionsPurge(fence, cutoff)) == 1
    latest = await backend.ledger.executions_backfill(ExecutionsBackfill(sid, [t1], "ops"))
    assert latest.purged_through == asked[3]


async def test_batches_over_the_limit_are_refused(backend: Backend) -> None:
    fence = await own(backend, 0)
    at = await backend.ledger.database_now()
    [sid] = ids_in_partition(0, 1)
    await backend.ledger.schedules_create(SchedulesCreate([schedule(sid)]))
    too_many = [
        PlannedExecution(sid, "acme", "noop", at + timedelta(seconds=n))
        for n in range(BATCH_ROWS_MAX + 1)
    ]
    with pytest.raises(InvalidField):
        await backend.ledger.executions_plan(ExecutionsPlan(fence, too_many, [], None))
    with pytest.raises(InvalidField):
        await backend.ledger.schedules_create(
            SchedulesCreate([schedule(f"s{n}") for n in range(BATCH_ROWS_MAX + 1)])
        )


# --- attempt-lease renewal -------------------------------------------------------------------


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


async def test_an_extended_attempt_lease_outlives_its_old_expiry(backend: Backend) -> None:
    [sid] = ids_in_partition(6, 1, prefix="long")
    await backend.ledger.schedules_create(SchedulesCreate([schedule(sid)]))
    fence = await own(backend, 6)
    [eid] = await claim_now(backend, fence, [sid], lease_s=TTL_S)
    running = (await backend.ledger.executions_get(eid)).execution
    extend = ExecutionsExtend([fence], [AttemptRef(eid, running.attempt)], TTL_S * 2)
    assert await backend.ledger.executions_extend(extend) == [eid]
    extended = (await backend.ledger.executions_get(eid)).execution
    assert running.attempt_expires_at is not None
    assert extended.attempt_expires_at is not None
    assert extended.attempt_expires_at - running.attempt_expires_at >= timedelta(seconds=TTL_S)
    assert msgspec.structs.replace(extended, attempt_expires_at=running.attempt_expires_at) == (
        running
    )  # nothing else changed: same attempt, same start
    requeue = ExecutionsRequeueExpired([fence])
    await backend.advance(TTL_S + 0.1)  # past the old expiry, before the new one
    assert await backend.ledger.executions_requeue_expired(requeue) == []
    assert (await backend.ledger.executions_get(eid)).execution.status is ExecutionStatus.RUNNING
    await backend.advance(TTL_S)  # past the new expiry: the worker stopped renewing
    assert await backend.ledger.executions_requeue_expired(requeue) == [eid]
    # The re-queued attempt can no longer be extended: its worker learns it lost it.
    assert await backend.ledger.executions_extend(extend) == []
    requeued = (await backend.ledger.executions_get(eid)).execution
    assert (requeued.status, requeued.attempt_expires_at) == (ExecutionStatus.QUEUED, None)


async def test_only_attempts_running_under_their_number_are_extended(backend: Backend) -> None:
    sids = ids_in_partition(1, 4, prefix="ext")
    [ghost] = ids_in_partition(1, 1, prefix="ghost")
    await backend.ledger.schedules_create(SchedulesCreate([schedule(s) for s in sids]))
    fence = await own(backend, 1)
    first, second, done = await claim_now(backend, fence, sids[:3], lease_s=30)
    at = (await backend.ledger.database_now()).replace(microsecond=0) - timedelta(seconds=1)
    await planned(backend, fence, sids[3:], at)
    queued = execution_id(sids[3], at)
    await backend.ledger.executions_complete(
        ExecutionsComplete([fence], [Completion(done, 1, Outcome.SUCCEEDED)])
    )
    before = {
        eid: (await backend.ledger.executions_get(eid)).execution
        for eid in (first, second, done, queued)
    }
    refs = [
        AttemptRef(second, 1),
        AttemptRef(first, 2),  # another attempt
        AttemptRef(done, 1),  # finished
        AttemptRef(queued, 0),  # not started
        AttemptRef(execution_id(ghost, at), 1),  # unknown
        AttemptRef(first, 1),
        AttemptRef(second, 1),  # repeated: extended once
    ]
    extended = await backend.ledger.executions_extend(ExecutionsExtend([fence], refs, 60))
    assert extended == [second, first]  # in the order given, without repeats
    for eid in (done, queued):
        assert (await backend.ledger.executions_get(eid)).execution == before[eid]
    for eid in (first, second):
        row = (await backend.ledger.executions_get(eid)).execution
        old = before[eid].attempt_expires_at
        assert row.attempt_expires_at is not None
        assert old is not None
        assert row.attempt_expires_at > old
    assert await backend.ledger.executions_extend(ExecutionsExtend([fence], [], 60)) == []
    [elsewhere] = ids_in_partition(2, 1, prefix="ext")
    for bad in (
        ExecutionsExtend([fence], [AttemptRef(first, 1)], 0),
        ExecutionsExtend([fence], [AttemptRef(first, 1)], -1),
        ExecutionsExtend([fence], [AttemptRef(execution_id(elsewhere, at), 1)], 60),
        ExecutionsExtend([fence], [AttemptRef(first, 1)] * (BATCH_ROWS_MAX + 1), 60),
    ):
        with pytest.raises(InvalidField):
            await backend.ledger.executions_extend(bad)


async def test_a_lost_fence_extends_nothing(backend: Backend) -> None:
    [sid] = ids_in_partition(5, 1, prefix="ext")
    await backend.ledger.schedules_create(SchedulesCreate([schedule(sid)]))
    fence = await own(backend, 5)
    [eid] = await claim_now(backend, fence, [sid], lease_s=30)
    before = (await backend.ledger.executions_get(eid)).execution
    stale = Fence(5, fence.owner_id, fence.fencing_token + 1)
    with pytest.raises(LeaseLost) as raised:
        await backend.ledger.executions_extend(ExecutionsExtend([stale], [AttemptRef(eid, 1)], 60))
    assert raised.value.partitions == (5,)
    await backend.ledger.leases_release(LeasesRelease([fence]))
    await own(backend, 5, owner="node-b")
    with pytest.raises(LeaseLost):
        await backend.ledger.executions_extend(ExecutionsExtend([fence], [AttemptRef(eid, 1)], 60))
    assert (await backend.ledger.executions_get(eid)).execution == before


# --- dead-letter replay audit ----------------------------------------------------------------


async def dead_lettered(
    backend: Backend, fence: Fence, schedule_ids: list[str], error_codes: list[str]
) -> list[str]:
    """Dead-letter one fire of each schedule with its error code, after as many failed
    attempts before it as its position in the list; their execution ids."""
    eids = await claim_now(backend, fence, schedule_ids, lease_s=30)
    for failures, (eid, code) in enumerate(zip(eids, error_codes, strict=True)):
        for attempt in range(1, failures + 1):
            await backend.ledger.executions_complete(
                ExecutionsComplete([fence], [Completion(eid, attempt, Outcome.FAILED)])
            )
            await backend.ledger.executions_claim(ExecutionsClaim([fence], [eid], 30, "n"))
        done = await backend.ledger.executions_complete(
            ExecutionsComplete(
                [fence], [Completion(eid, failures + 1, Outcome.DEAD_LETTER, error_code=code)]
            )
        )
        assert done.applied == [eid]
    return eids


async def test_a_replay_is_audited_with_who_why_which_attempt_and_error(
    backend: Backend,
) -> None:
    sids = ids_in_partition(3, 2, prefix="audit")
    await backend.ledger.schedules_create(SchedulesCreate([schedule(s) for s in sids]))
    fence = await own(backend, 3)
    first, second = await dead_lettered(backend, fence, sids, ["http_404", "http_410"])
    assert await backend.ledger.audit_list(AuditQuery()) == []
    before = await backend.ledger.database_now()
    replay = DeadLettersReplay([second, "nope:x"], "cli:alice@ops-1", "the endpoint is back")
    assert await backend.ledger.dead_letters_replay(replay) == [second]
    anonymous = DeadLettersReplay([first, second, first], actor="retention-test")
    assert await backend.ledger.dead_letters_replay(anonymous) == [first]
    assert await backend.ledger.dead_letters_replay(anonymous) == []  # nothing left: no event
    after = await backend.ledger.database_now()
    events = await backend.ledger.audit_list(AuditQuery())
    assert [(e.actor, e.action, e.target, e.details) for e in events] == [
        (
            "cli:alice@ops-1",
            "dead_letter.replay",
            second,
            {"reason": "the endpoint is back", "attempt": 2, "error_code": "http_410"},
        ),
        (
            "retention-test",
            "dead_letter.replay",
            first,
            {"reason": None, "attempt": 1, "error_code": "http_404"},
        ),
    ]
    assert events[0].event_id < events[1].event_id
    assert all(before <= e.at <= after for e in events)
    assert await backend.ledger.audit_list(AuditQuery(target=first)) == events[1:]
    assert await backend.ledger.audit_list(AuditQuery(action="dead_letter.replay")) == events
    assert await backend.ledger.audit_list(AuditQuery(action="schedule.delete")) == []
    assert await backend.ledger.audit_list(AuditQuery(limit=1)) == events[:1]
    watermark = AuditQuery(after_event_id=events[0].event_id)
    assert await backend.ledger.audit_list(watermark) == events[1:]
    assert await backend.ledger.audit_list(AuditQuery(after_event_id=events[1].event_id)) == []
    for limit in (0, PAGE_SIZE_MAX + 1):
        with pytest.raises(InvalidField):
            await backend.ledger.audit_list(AuditQuery(limit=limit))


async def test_a_replay_with_a_malformed_actor_or_reason_changes_nothing(
    backend: Backend,
) -> None:
    [sid] = ids_in_partition(7, 1, prefix="audit")
    await backend.ledger.schedules_create(SchedulesCreate([schedule(sid)]))
    fence = await own(backend, 7)
    [eid] = await dead_lettered(backend, fence, [sid], ["http_404"])
    bad = [
        DeadLettersReplay([eid], ""),
        DeadLettersReplay([eid], " ops"),
        DeadLettersReplay([eid], "ops\n"),
        DeadLettersReplay([eid], "x" * 201),
        DeadLettersReplay([eid], "ops", ""),
        DeadLettersReplay([eid], "ops", "  "),
        DeadLettersReplay([eid], "ops", "x" * 1001),
        DeadLettersReplay([eid], "ops", "nul\x00byte"),
        DeadLettersReplay([eid] * (BATCH_ROWS_MAX + 1), "ops"),
    ]
    for params in bad:
        with pytest.raises(InvalidField):
            await backend.ledger.dead_letters_replay(params)
    assert (await backend.ledger.executions_get(eid)).execution.status is (
        ExecutionStatus.DEAD_LETTER
    )
    assert await backend.ledger.audit_list(AuditQuery()) == []
    longest = DeadLettersReplay([eid], "a" * 200, "line one\nline two\t" + "r" * 980)
    assert await backend.ledger.dead_letters_replay(longest) == [eid]
    [event] = await backend.ledger.audit_list(AuditQuery(target=eid))
    assert (event.actor, event.details["reason"]) == (longest.actor, longest.reason)


# --- cluster-wide concurrency caps -----------------------------------------------------------


async def test_a_cluster_cap_starts_at_most_that_many_of_a_task_type(backend: Backend) -> None:
    capped = TaskType(
        name="capped", kind=HandlerKind.NOOP, allowed_tenants=("*",), max_concurrency_cluster=2
    )
    await backend.ledger.task_types_put(TaskTypesPut(capped))
    mine = ids_in_partition(2, 5, prefix="cap")
    [theirs] = ids_in_partition(3, 1, prefix="cap")
    [free] = ids_in_partition(2, 1, prefix="free")
    await backend.ledger.schedules_create(
        SchedulesCreate(
            [schedule(s, task_type="capped") for s in [*mine, theirs]] + [schedule(free)]
        )
    )
    fence = await own(backend, 2, "node-a")
    other = await own(backend, 3, "node-b")
    at = (await backend.ledger.database_now()).replace(microsecond=0) - timedelta(seconds=1)
    await planned(backend, fence, [*mine, free], at)
    await planned(backend, other, [theirs], at)
    # The order the ids are given in decides which start, not their planned order.
    given = sorted((execution_id(s, at) for s in mine), reverse=True)
    free_id, theirs_id = execution_id(free, at), execution_id(theirs, at)

    async def claim(by: Fence, ids: list[str]) -> list[str]:
        started = await backend.ledger.executions_claim(ExecutionsClaim([by], ids, 30, "n"))
        return sorted(e.execution_id for e in started)

    assert await claim(fence, [*given, free_id]) == sorted([*given[:2], free_id])
    # The cap is cluster-wide: another node's partition starts none while two run.
    assert await claim(other, [theirs_id]) == []
    assert await due_now(backend, 3) == [theirs_id]  # still queued
    await backend.ledger.executions_complete(
        ExecutionsComplete([fence], [Completion(given[0], 1, Outcome.SUCCEEDED)])
    )
    assert await claim(fence, given) == [given[2]]
    assert await claim(fence, given) == []
    assert await claim(other, [theirs_id]) == []
    # A higher cap binds the next claim.
    higher = msgspec.structs.replace(capped, max_concurrency_cluster=5)
    await backend.ledger.task_types_put(TaskTypesPut(higher))
    assert await claim(fence, given) == sorted(given[3:])
    assert await claim(other, [theirs_id]) == [theirs_id]
    running = await backend.ledger.executions_query(
        ExecutionsQuery(status=ExecutionStatus.RUNNING, task_type="capped")
    )
    assert len(running.items) == 5


# --- forged cursors --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "parts",
    [
        ("\u0000",),
        ("2026-01-01T00:00:00Z", "\u0000"),
        ("0001-01-01T00:00:00+01:00", "x"),  # out of range once in UTC
        ("2026-01-01T00:00:00", "x"),  # naive
        ("yesterday", "x"),
        (1, 2),
    ],
)
async def test_forged_cursors_are_refused_as_malformed(
    backend: Backend, parts: tuple[object, ...]
) -> None:
    await backend.ledger.schedules_create(SchedulesCreate([schedule("s")]))
    cursor = encode_cursor(*parts)
    with pytest.raises(InvalidField, match="cursor is malformed"):
        await backend.ledger.schedules_list(SchedulesList(cursor=cursor))
    with pytest.raises(InvalidField, match="cursor"):
        await backend.ledger.executions_query(ExecutionsQuery(cursor=cursor))


# --- API tokens ------------------------------------------------------------------------------


def digest(secret: str) -> bytes:
    """What the API stores of a token's secret: its SHA-256."""
    return hashlib.sha256(secret.encode()).digest()


async def test_a_token_is_stored_as_its_hash_found_by_it_and_audited(backend: Backend) -> None:
    before = await backend.ledger.database_now()
    admin = await backend.ledger.tokens_create(
        TokensCreate(
            ApiToken(token_id="ops", scope="admin", description="on-call rotation"),
            digest("s1"),
            "cli:alice@ops-1",
        )
    )
    after = await backend.ledger.database_now()
    assert (admin.token_id, admin.scope, admin.description, admin.revoked_at) == (
        "ops",
        "admin",
        "on-call rotation",
        None,
    )
    assert admin.created_at is not None
    assert before <= admin.created_at <= after
    tenant = await backend.ledger.tokens_create(
        TokensCreate(ApiToken(token_id="acme-ci", scope="tenant:acme"), digest("s2"), "ops")
    )
    assert await backend.ledger.tokens_get_by_hash(digest("s1")) == admin
    assert await backend.ledger.tokens_get_by_hash(digest("s2")) == tenant
    assert await backend.ledger.tokens_list() == [tenant, admin]  # by token id
    with pytest.raises(NotFound):
        await backend.ledger.tokens_get_by_hash(digest("unknown"))
    with pytest.raises(InvalidField, match="32-byte"):
        await backend.ledger.tokens_get_by_hash(b"short")
    with pytest.raises(AlreadyExists, match="'ops'"):
        await backend.ledger.tokens_create(
            TokensCreate(ApiToken(token_id="ops", scope="admin"), digest("s3"), "ops")
        )
    with pytest.raises(AlreadyExists, match="secret"):
        await backend.ledger.tokens_create(
            TokensCreate(ApiToken(token_id="other", scope="admin"), digest("s1"), "ops")
        )
    assert await backend.ledger.tokens_list() == [tenant, admin]
    events = await backend.ledger.audit_list(AuditQuery(action="token.create"))
    assert [(e.actor, e.target, e.details) for e in events] == [
        ("cli:alice@ops-1", "ops", {"scope": "admin", "description": "on-call rotation"}),
        ("ops", "acme-ci", {"scope": "tenant:acme", "description": ""}),
    ]


async def test_revoked_token_is_still_found_with_revoked_at(backend: Backend) -> None:
    created = await backend.ledger.tokens_create(
        TokensCreate(ApiToken(token_id="ci", scope="tenant:acme"), digest("s"), "ops")
    )
    revoked = await backend.ledger.tokens_revoke(TokensRevoke("ci", "cli:bob@ops-2"))
    assert revoked.revoked_at is not None
    assert revoked == msgspec.structs.replace(created, revoked_at=revoked.revoked_at)
    assert await backend.ledger.tokens_get_by_hash(digest("s")) == revoked
    await backend.advance(0.01)
    assert await backend.ledger.tokens_revoke(TokensRevoke("ci", "ops")) == revoked  # once
    assert await backend.ledger.tokens_list() == [revoked]
    events = await backend.ledger.audit_list(AuditQuery(action="token.revoke"))
    assert [(e.actor, e.target, e.details) for e in events] == [
        ("cli:bob@ops-2", "ci", {"scope": "tenant:acme"})
    ]
    with pytest.raises(NotFound):
        await backend.ledger.tokens_revoke(TokensRevoke("nope", "ops"))
    with pytest.raises(InvalidField):
        await backend.ledger.tokens_revoke(TokensRevoke("ci", " ops"))
    with pytest.raises(AlreadyExists):  # a revoked token's id is never reused
        await backend.ledger.tokens_create(
            TokensCreate(ApiToken(token_id="ci", scope="admin"), digest("t"), "ops")
        )


SECRET_HASH = digest("secret")


@pytest.mark.parametrize(
    ("token", "token_hash", "actor", "match"),
    [
        (ApiToken(token_id="a b", scope="admin"), SECRET_HASH, "ops", "token id"),
        (ApiToken(token_id="t", scope="root"), SECRET_HASH, "ops", "scope"),
        (ApiToken(token_id="t", scope="Admin"), SECRET_HASH, "ops", "scope"),
        (ApiToken(token_id="t", scope="tenants:acme"), SECRET_HASH, "ops", "scope"),
        (ApiToken(token_id="t", scope="tenant:"), SECRET_HASH, "ops", "tenant id"),
        (ApiToken(token_id="t", scope="tenant:a:b"), SECRET_HASH, "ops", "tenant id"),
        (ApiToken(token_id="t", scope="admin", description="x" * 201), SECRET_HASH, "ops", "200"),
        (ApiToken(token_id="t", scope="admin", description="a\nb"), SECRET_HASH, "ops", "print"),
        (ApiToken(token_id="t", scope="admin"), SECRET_HASH[:31], "ops", "32-byte"),
        (ApiToken(token_id="t", scope="admin"), SECRET_HASH, "", "actor"),
    ],
)
async def test_malformed_tokens_are_refused_and_change_nothing(
    backend: Backend, token: ApiToken, token_hash: bytes, actor: str, match: str
) -> None:
    with pytest.raises(InvalidField, match=match):
        await backend.ledger.tokens_create(TokensCreate(token, token_hash, actor))
    assert await backend.ledger.tokens_list() == []
    assert await backend.ledger.audit_list(AuditQuery()) == []


# --- console sessions ------------------------------------------------------------------------

SESSION_IDLE_S = 1.2
"""A session's idle timeout in these tests: waits of a third of it keep it alive with room
to spare on a loaded machine, and its expiry costs real Postgres little waiting."""


async def token_for_sessions(backend: Backend, token_id: str, scope: str = "admin") -> None:
    await backend.ledger.tokens_create(
        TokensCreate(ApiToken(token_id=token_id, scope=scope), digest(token_id), "ops")
    )


def open_session(
    name: str, token_id: str, idle_s: float = SESSION_IDLE_S, lifetime_s: float = 3600.0
) -> SessionsCreate:
    return SessionsCreate(digest("session:" + name), token_id, idle_s, lifetime_s)


async def test_a_console_session_is_stored_as_its_hash_and_acts_as_its_token(
    backend: Backend,
) -> None:
    await token_for_sessions(backend, "acme-ops", "tenant:acme")
    before = await backend.ledger.database_now()
    opened = await backend.ledger.sessions_create(open_session("a", "acme-ops"))
    after = await backend.ledger.database_now()
    assert (opened.token_id, opened.scope, opened.idle_timeout_s, opened.revoked_at) == (
        "acme-ops",
        "tenant:acme",
        SESSION_IDLE_S,
        None,
    )
    assert before <= opened.created_at <= after
    assert opened.last_seen_at == opened.created_at
    assert opened.expires_at == opened.created_at + timedelta(hours=1)
    await backend.advance(0.3)
    touched = await backend.ledger.sessions_touch(digest("session:a"))
    assert touched == msgspec.structs.replace(opened, last_seen_at=touched.last_seen_at)
    assert touched.last_seen_at > opened.last_seen_at
    with pytest.raises(NotFound):
        await backend.ledger.sessions_touch(digest("session:unknown"))
    with pytest.raises(NotFound):  # the token's own hash is no session
        await backend.ledger.sessions_touch(digest("acme-ops"))
    with pytest.raises(AlreadyExists):
        await backend.ledger.sessions_create(open_session("a", "acme-ops"))
    for malformed in (b"short", digest("x")[:31]):
        with pytest.raises(InvalidField, match="32-byte"):
            await backend.ledger.sessions_touch(malformed)
        with pytest.raises(InvalidField, match="32-byte"):
            await backend.ledger.sessions_revoke(malformed)
    assert await backend.ledger.sessions_touch(digest("session:a")) is not None


@pytest.mark.parametrize(
    ("idle_s", "lifetime_s"),
    [(0.0, 60.0), (-1.0, 60.0), (61.0, 60.0), (60.0, 31 * 86_400.0), (float("nan"), 60.0)],
)
async def test_a_session_with_impossible_durations_is_refused(
    backend: Backend, idle_s: float, lifetime_s: float
) -> None:
    await token_for_sessions(backend, "ops")
    with pytest.raises(InvalidField, match="idle_timeout_s"):
        await backend.ledger.sessions_create(open_session("a", "ops", idle_s, lifetime_s))
    with pytest.raises(NotFound):
        await backend.ledger.sessions_touch(digest("session:a"))


async def test_no_session_is_opened_with_an_unknown_or_revoked_token(backend: Backend) -> None:
    with pytest.raises(NotFound, match="'ghost'"):
        await backend.ledger.sessions_create(open_session("a", "ghost"))
    await token_for_sessions(backend, "old")
    await backend.ledger.tokens_revoke(TokensRevoke("old", "ops"))
    with pytest.raises(NotFound, match="'old'"):
        await backend.ledger.sessions_create(open_session("b", "old"))
    for name in ("a", "b"):
        with pytest.raises(NotFound):
            await backend.ledger.sessions_touch(digest("session:" + name))


async def test_a_session_left_unused_for_its_idle_timeout_ends_and_use_keeps_it_open(
    backend: Backend,
) -> None:
    await token_for_sessions(backend, "ops")
    await backend.ledger.sessions_create(open_session("busy", "ops"))
    await backend.ledger.sessions_create(open_session("idle", "ops"))
    for _ in range(4):  # 1.6 s in all, more than the idle timeout, used every 0.4 s
        await backend.advance(SESSION_IDLE_S / 3)
        await backend.ledger.sessions_touch(digest("session:busy"))
    with pytest.raises(NotFound):
        await backend.ledger.sessions_touch(digest("session:idle"))
    await backend.advance(SESSION_IDLE_S + 0.1)
    with pytest.raises(NotFound):
        await backend.ledger.sessions_touch(digest("session:busy"))
    await backend.ledger.sessions_revoke(digest("session:busy"))  # ended already: no error


async def test_a_session_ends_at_its_lifetime_however_busy(backend: Backend) -> None:
    await token_for_sessions(backend, "ops")
    await backend.ledger.sessions_create(open_session("a", "ops", SESSION_IDLE_S, 1.5))
    for _ in range(2):
        await backend.advance(0.5)
        await backend.ledger.sessions_touch(digest("session:a"))
    await backend.advance(0.6)  # 1.6 s after it opened, 0.6 s after its last use
    with pytest.raises(NotFound):
        await backend.ledger.sessions_touch(digest("session:a"))


async def test_signing_out_ends_that_session_for_good(backend: Backend) -> None:
    await token_for_sessions(backend, "ops")
    await backend.ledger.sessions_create(open_session("laptop", "ops"))
    await backend.ledger.sessions_create(open_session("phone", "ops"))
    await backend.ledger.sessions_revoke(digest("session:laptop"))
    with pytest.raises(NotFound):
        await backend.ledger.sessions_touch(digest("session:laptop"))
    await backend.ledger.sessions_revoke(digest("session:laptop"))  # twice: no error
    await backend.ledger.sessions_revoke(digest("session:unknown"))
    assert (await backend.ledger.sessions_touch(digest("session:phone"))).token_id == "ops"
    with pytest.raises(AlreadyExists):  # a revoked session's id is not reused
        await backend.ledger.sessions_create(open_session("laptop", "ops"))


async def test_revoking_a_token_ends_its_sessions_and_only_those(backend: Backend) -> None:
    await token_for_sessions(backend, "alice")
    await token_for_sessions(backend, "bob", "tenant:acme")
    for name, token_id in (("a1", "alice"), ("a2", "alice"), ("b1", "bob")):
        await backend.ledger.sessions_create(open_session(name, token_id))
    await backend.ledger.tokens_revoke(TokensRevoke("alice", "ops"))
    for name in ("a1", "a2"):
        with pytest.raises(NotFound):
            await backend.ledger.sessions_touch(digest("session:" + name))
    assert (await backend.ledger.sessions_touch(digest("session:b1"))).scope == "tenant:acme"
    with pytest.raises(NotFound):
        await backend.ledger.sessions_create(open_session("a3", "alice"))


async def test_sessions_past_their_lifetime_are_forgotten_by_the_next_sign_in(
    backend: Backend,
) -> None:
    await token_for_sessions(backend, "ops")
    await backend.ledger.sessions_create(open_session("old", "ops", 0.5, 0.5))
    await backend.ledger.sessions_create(open_session("revoked", "ops", 0.5, 0.5))
    await backend.ledger.sessions_revoke(digest("session:revoked"))
    await backend.ledger.sessions_create(open_session("current", "ops"))
    with pytest.raises(AlreadyExists):
        await backend.ledger.sessions_create(open_session("old", "ops"))
    await backend.advance(0.6)
    # Past their lifetime, both rows are deleted by the next create: their hashes are free.
    await backend.ledger.sessions_create(open_session("next", "ops"))
    for name in ("old", "revoked"):
        reopened = await backend.ledger.sessions_create(open_session(name, "ops"))
        assert reopened.revoked_at is None
    with pytest.raises(AlreadyExists):  # a live session is not forgotten
        await backend.ledger.sessions_create(open_session("current", "ops"))


# --- pausing ---------------------------------------------------------------------------------


async def test_pausing_skips_queued_executions(backend: Backend) -> None:
    partition = 4
    [sid] = ids_in_partition(partition, 1, prefix="pause")
    await backend.ledger.schedules_create(SchedulesCreate([schedule(sid)]))
    fence = await own(backend, partition)
    now = await backend.ledger.database_now()
    at = now.replace(second=0, microsecond=0)  # fires of its minutely timetable
    instants = [at - timedelta(minutes=3), at - timedelta(minutes=2), at + timedelta(minutes=1)]
    for instant in instants:
        await planned(backend, fence, [sid], instant)
    running, failed, queued = (execution_id(sid, instant) for instant in instants)
    claimed = await backend.ledger.executions_claim(
        ExecutionsClaim([fence], [running, failed], 60, "n")
    )
    assert len(claimed) == 2
    retry = Completion(failed, 1, Outcome.FAILED, not_before=now + timedelta(hours=1))
    await backend.ledger.executions_complete(ExecutionsComplete([fence], [retry]))
    current = await backend.ledger.schedules_get(sid)
    paused = await backend.ledger.schedules_update(
        SchedulesUpdate(msgspec.structs.replace(current, enabled=False), current.version)
    )
    for key in (failed, queued):
        execution = (await backend.ledger.executions_get(key)).execution
        assert (execution.status, execution.error_code) == (
            ExecutionStatus.SKIPPED,
            "schedule_paused",
        )
        assert execution.finished_at is not None
        assert execution.not_before is None
    # A running attempt finishes normally.
    assert (await backend.ledger.executions_get(running)).execution.status is (
        ExecutionStatus.RUNNING
    )
    done = await backend.ledger.executions_complete(
        ExecutionsComplete([fence], [Completion(running, 1, Outcome.SUCCEEDED)])
    )
    assert done.applied == [running]
    # Enabling it again queues the fire to come again (the lifecycle tests below), but not
    # the one that failed and awaited a retry: it started, and its instant has passed.
    await backend.ledger.schedules_update(
        SchedulesUpdate(msgspec.structs.replace(paused, enabled=True), paused.version)
    )
    assert (await backend.ledger.executions_get(failed)).execution.status is (
        ExecutionStatus.SKIPPED
    )
    assert await due_now(backend, partition, after=7200) == [queued]
    changes = await backend.ledger.schedule_changes(ScheduleChangesSince(after_seq=0))
    assert [c.kind for c in changes] == [ChangeKind.CREATED, ChangeKind.UPDATED, ChangeKind.UPDATED]


async def test_a_paused_schedule_is_not_planned_until_enabled_again(backend: Backend) -> None:
    partition = 2
    [sid] = ids_in_partition(partition, 1, prefix="paused")
    [created] = await backend.ledger.schedules_create(
        SchedulesCreate([schedule(sid, enabled=False)])
    )
    fence = await own(backend, partition)
    at = (await backend.ledger.database_now()).replace(microsecond=0) - timedelta(seconds=1)
    fire = PlannedExecution(sid, "acme", "noop", at)
    # A planner that has not heard of the pause yet plans nothing for it.
    result = await backend.ledger.executions_plan(ExecutionsPlan(fence, [fire], []))
    assert result.inserted == []
    await backend.ledger.schedules_update(
        SchedulesUpdate(msgspec.structs.replace(created, enabled=True), created.version)
    )
    result = await backend.ledger.executions_plan(ExecutionsPlan(fence, [fire], []))
    assert result.inserted == [execution_id(sid, at)]


# --- lifecycle: resuming, re-creating and backfilling over what a pause or delete skipped ------

QUEUED = ExecutionStatus.QUEUED
SKIPPED = ExecutionStatus.SKIPPED


async def state(backend: Backend, key: str) -> tuple[ExecutionStatus, str | None, int]:
    execution = (await backend.ledger.executions_get(key)).execution
    return execution.status, execution.error_code, execution.attempt


async def set_enabled(backend: Backend, schedule_id: str, enabled: bool) -> Schedule:
    current = await backend.ledger.schedules_get(schedule_id)
    wanted = msgspec.structs.replace(current, enabled=enabled)
    return await backend.ledger.schedules_update(SchedulesUpdate(wanted, current.version))


async def whole_minute(backend: Backend) -> datetime:
    """The ledger's clock, down to the minute: minutely fires are this plus whole minutes."""
    return (await backend.ledger.database_now()).replace(second=0, microsecond=0)


async def test_resume_queues_again_the_fires_to_come_that_the_pause_skipped(
    backend: Backend,
) -> None:
    partition = 1
    [sid] = ids_in_partition(partition, 1, prefix="resume")
    await backend.ledger.schedules_create(SchedulesCreate([schedule(sid)]))
    fence = await own(backend, partition)
    minute = await whole_minute(backend)
    # One fire already due, two within the lookahead (planned ahead, as a planner does).
    instants = [minute - timedelta(minutes=1), minute + timedelta(minutes=1)]
    instants.append(minute + timedelta(minutes=2))
    for at in instants:
        await planned(backend, fence, [sid], at)
    keys = [execution_id(sid, at) for at in instants]
    before = [(await backend.ledger.executions_get(key)).execution for key in keys]
    await set_enabled(backend, sid, False)
    assert [await state(backend, key) for key in keys] == [(SKIPPED, "schedule_paused", 0)] * 3
    assert await due_now(backend, partition, after=600) == []
    head = await backend.ledger.schedule_changes_head()
    await backend.advance(0.01)
    resumed = await set_enabled(backend, sid, True)
    resumed_by = await backend.ledger.database_now()
    # The fire whose instant had passed stays skipped; the two to come are queued again.
    assert await state(backend, keys[0]) == (SKIPPED, "schedule_paused", 0)
    for key, old in zip(keys[1:], before[1:], strict=True):
        detail = await backend.ledger.executions_get(key)
        revived = detail.execution
        assert (
            revived.status,
            revived.attempt,
            revived.error_code,
            revived.error_message,
            revived.finished_at,
            revived.not_before,
            revived.started_at,
        ) == (QUEUED, 0, None, None, None, None, None)
        assert (revived.planned_at, revived.partition_id, revived.tenant_id) == (
            old.planned_at,
            partition,
            "acme",
        )
        assert old.enqueued_at is not None
        assert revived.enqueued_at is not None
        assert old.enqueued_at < revived.enqueued_at <= resumed_by
        assert detail.attempts == []
    assert await due_now(backend, partition, after=600) == keys[1:]
    # The owning planner, told of the change, plans those fires again: nothing twice.
    assert await planned(backend, fence, [sid], instants[1]) == []
    assert await due_now(backend, partition, after=600) == keys[1:]
    changes = await backend.ledger.schedule_changes(ScheduleChangesSince(head))
    assert [(c.kind, c.version) for c in changes] == [(ChangeKind.UPDATED, resumed.version)]


async def test_resume_revives_no_other_skip_and_nothing_that_started(backend: Backend) -> None:
    partition = 3
    [sid] = ids_in_partition(partition, 1, prefix="keep")
    await backend.ledger.schedules_create(SchedulesCreate([schedule(sid)]))
    fence = await own(backend, partition)
    now = await backend.ledger.database_now()
    minute = now.replace(second=0, microsecond=0)
    overlap_at, catch_up_at, foreign_at, mine_at = (
        minute + timedelta(minutes=n) for n in (1, 2, 3, 4)
    )
    await planned(backend, fence, [sid], overlap_at)
    overlap = execution_id(sid, overlap_at)
    await backend.ledger.executions_skip(ExecutionsSkip([fence], [overlap], "overlap"))
    await backend.ledger.executions_plan(
        ExecutionsPlan(
            fence,
            [
                PlannedExecution(
                    sid, "acme", "noop", catch_up_at, SKIPPED, error_code="catchup_window"
                ),
                PlannedExecution(sid, "globex", "noop", foreign_at),  # another tenant's row
                PlannedExecution(sid, "acme", "noop", mine_at),
            ],
            [],
        )
    )
    # A fire that started (it failed and awaits a retry), and an operator's run.
    ran_at = minute - timedelta(minutes=1)
    await planned(backend, fence, [sid], ran_at)
    ran = execution_id(sid, ran_at)
    await backend.ledger.executions_claim(ExecutionsClaim([fence], [ran], 60, "n"))
    retry = Completion(ran, 1, Outcome.FAILED, not_before=now + timedelta(hours=1))
    await backend.ledger.executions_complete(ExecutionsComplete([fence], [retry]))
    triggered = await backend.ledger.executions_trigger(ExecutionsTrigger(sid, "ops"))
    await set_enabled(backend, sid, False)
    await set_enabled(backend, sid, True)
    assert [
        await state(backend, key)
        for key in (
            overlap,
            execution_id(sid, catch_up_at),
            execution_id(sid, foreign_at),
            execution_id(sid, mine_at),
            ran,
            triggered.execution_id,
        )
    ] == [
        (SKIPPED, "overlap", 0),
        (SKIPPED, "catchup_window", 0),
        (SKIPPED, "schedule_paused", 0),
        (QUEUED, None, 0),
        (SKIPPED, "schedule_paused", 1),
        (SKIPPED, "schedule_paused", 0),  # not a fire of its timetable: never revived
    ]


async def test_a_timing_change_while_paused_revives_only_the_fires_the_new_timetable_has(
    backend: Backend,
) -> None:
    partition = 5
    cron_sid, zone_sid = ids_in_partition(partition, 2, prefix="retime")
    await backend.ledger.schedules_create(
        SchedulesCreate([schedule(cron_sid), schedule(zone_sid, cron_expr="0 * * * *")])
    )
    fence = await own(backend, partition)
    minute = await whole_minute(backend)
    first, second = minute + timedelta(minutes=1), minute + timedelta(minutes=2)
    hour = minute.replace(minute=0) + timedelta(hours=1)
    for at in (first, second):
        await planned(backend, fence, [cron_sid], at)
    await planned(backend, fence, [zone_sid], hour)
    paused = await set_enabled(backend, cron_sid, False)
    # Now fires only at the second instant's minute of each hour.
    retimed = msgspec.structs.replace(paused, cron_expr=f"{second.minute} * * * *")
    await backend.ledger.schedules_update(SchedulesUpdate(retimed, paused.version))
    paused = await set_enabled(backend, zone_sid, False)
    # Kolkata is UTC+05:30: "0 * * * *" there fires at half past each UTC hour.
    moved = msgspec.structs.replace(paused, timezone="Asia/Kolkata")
    await backend.ledger.schedules_update(SchedulesUpdate(moved, paused.version))
    await set_enabled(backend, cron_sid, True)
    await set_enabled(backend, zone_sid, True)
    assert await state(backend, execution_id(cron_sid, first)) == (SKIPPED, "schedule_paused", 0)
    assert await state(backend, execution_id(cron_sid, second)) == (QUEUED, None, 0)
    assert await state(backend, execution_id(zone_sid, hour)) == (SKIPPED, "schedule_paused", 0)


async def test_pausing_and_resuming_again_and_again_keeps_one_queued_execution_per_fire(
    backend: Backend,
) -> None:
    partition = 6
    [sid] = ids_in_partition(partition, 1, prefix="again")
    await backend.ledger.schedules_create(SchedulesCreate([schedule(sid)]))
    fence = await own(backend, partition)
    at = await whole_minute(backend) + timedelta(minutes=1)
    await planned(backend, fence, [sid], at)
    key = execution_id(sid, at)
    for _ in range(3):
        await set_enabled(backend, sid, False)
        assert await state(backend, key) == (SKIPPED, "schedule_paused", 0)
        await set_enabled(backend, sid, True)
        assert await state(backend, key) == (QUEUED, None, 0)
        assert await planned(backend, fence, [sid], at) == []
    page = await backend.ledger.executions_query(ExecutionsQuery(schedule_id=sid))
    assert [(e.execution_id, e.status) for e in page.items] == [(key, QUEUED)]
    assert await due_now(backend, partition, after=600) == [key]


async def test_a_fire_whose_instant_passed_during_the_pause_stays_skipped_until_backfilled(
    backend: Backend,
) -> None:
    partition = 7
    [sid] = ids_in_partition(partition, 1, prefix="passed")
    await backend.ledger.schedules_create(SchedulesCreate([schedule(sid, cron_expr="* * * * * *")]))
    fence = await own(backend, partition)
    now = await backend.ledger.database_now()
    at = now.replace(microsecond=0) + timedelta(seconds=1)
    await planned(backend, fence, [sid], at)
    key = execution_id(sid, at)
    await set_enabled(backend, sid, False)
    await backend.advance((at - now).total_seconds() + 0.05)
    await set_enabled(backend, sid, True)
    assert await state(backend, key) == (SKIPPED, "schedule_paused", 0)
    # It never ran: a backfill over its instant queues it again, under its own id.
    backfilled = await backend.ledger.executions_backfill(ExecutionsBackfill(sid, [at], "ops"))
    assert backfilled.inserted == [key]
    assert await state(backend, key) == (QUEUED, None, 0)
    assert await due_now(backend, partition) == [key]


async def test_recreating_a_deleted_schedule_revives_the_fires_to_come_it_still_has(
    backend: Backend,
) -> None:
    partition = 2
    sid, later_sid = ids_in_partition(partition, 2, prefix="recreate")
    await backend.ledger.schedules_create(SchedulesCreate([schedule(sid), schedule(later_sid)]))
    fence = await own(backend, partition)
    minute = await whole_minute(backend)
    instants = [minute - timedelta(minutes=1), minute + timedelta(minutes=1)]
    instants.append(minute + timedelta(minutes=2))
    for at in instants:
        await planned(backend, fence, [sid, later_sid], at)
    past, first, second = (execution_id(sid, at) for at in instants)
    await backend.ledger.schedules_delete(SchedulesDelete(sid))
    assert await state(backend, second) == (SKIPPED, "schedule_deleted", 0)
    # Created again with an expression that keeps only the second instant.
    head = await backend.ledger.schedule_changes_head()
    [created] = await backend.ledger.schedules_create(
        SchedulesCreate([schedule(sid, cron_expr=f"{instants[2].minute} * * * *")])
    )
    assert await state(backend, past) == (SKIPPED, "schedule_deleted", 0)
    assert await state(backend, first) == (SKIPPED, "schedule_deleted", 0)
    assert await state(backend, second) == (QUEUED, None, 0)
    due = [execution_id(later_sid, at) for at in instants] + [second]
    assert sorted(await due_now(backend, partition, after=600)) == sorted(due)
    changes = await backend.ledger.schedule_changes(ScheduleChangesSince(head))
    assert [(c.kind, c.version) for c in changes] == [(ChangeKind.CREATED, created.version)]
    # Created again disabled, nothing comes back until it is resumed; then the delete's
    # skips and the pause's alike.
    await set_enabled(backend, later_sid, False)
    await backend.ledger.schedules_delete(SchedulesDelete(later_sid))
    await backend.ledger.schedules_create(SchedulesCreate([schedule(later_sid, enabled=False)]))
    later = [execution_id(later_sid, at) for at in instants[1:]]
    assert [await state(backend, key) for key in later] == [(SKIPPED, "schedule_paused", 0)] * 2
    await set_enabled(backend, later_sid, True)
    assert [await state(backend, key) for key in later] == [(QUEUED, None, 0)] * 2


async def test_recreating_after_a_delete_revives_a_deleted_skip_on_resume(
    backend: Backend,
) -> None:
    partition = 4
    [sid] = ids_in_partition(partition, 1, prefix="gone")
    await backend.ledger.schedules_create(SchedulesCreate([schedule(sid)]))
    fence = await own(backend, partition)
    at = await whole_minute(backend) + timedelta(minutes=1)
    await planned(backend, fence, [sid], at)
    await backend.ledger.schedules_delete(SchedulesDelete(sid))
    await backend.ledger.schedules_create(SchedulesCreate([schedule(sid, enabled=False)]))
    assert await state(backend, execution_id(sid, at)) == (SKIPPED, "schedule_deleted", 0)
    await set_enabled(backend, sid, True)
    assert await state(backend, execution_id(sid, at)) == (QUEUED, None, 0)


async def test_backfill_revives_what_a_pause_or_delete_skipped_but_never_what_started(
    backend: Backend,
) -> None:
    partition = 0
    sid, gone = ids_in_partition(partition, 2, prefix="refill")
    await backend.ledger.schedules_create(SchedulesCreate([schedule(sid), schedule(gone)]))
    fence = await own(backend, partition)
    now = await backend.ledger.database_now()
    minute = now.replace(second=0, microsecond=0)
    paused_at, ran_at, retry_at, overlap_at, catch_up_at, running_at = (
        minute - timedelta(minutes=n) for n in (6, 5, 4, 3, 2, 1)
    )
    for at in (paused_at, ran_at, retry_at, overlap_at, running_at):
        await planned(backend, fence, [sid], at)
    key = {at: execution_id(sid, at) for at in (paused_at, ran_at, retry_at, overlap_at)}
    key |= {catch_up_at: execution_id(sid, catch_up_at), running_at: execution_id(sid, running_at)}
    await backend.ledger.executions_claim(
        ExecutionsClaim([fence], [key[ran_at], key[retry_at], key[running_at]], 60, "n")
    )
    await backend.ledger.executions_complete(
        ExecutionsComplete(
            [fence],
            [
                Completion(key[ran_at], 1, Outcome.SUCCEEDED),
                Completion(key[retry_at], 1, Outcome.FAILED, not_before=now + timedelta(hours=1)),
            ],
        )
    )
    await backend.ledger.executions_skip(ExecutionsSkip([fence], [key[overlap_at]], "overlap"))
    catch_up = PlannedExecution(
        sid, "acme", "noop", catch_up_at, SKIPPED, error_code="catchup_window"
    )
    await backend.ledger.executions_plan(ExecutionsPlan(fence, [catch_up], []))
    await set_enabled(backend, sid, False)
    everything = [paused_at, ran_at, retry_at, overlap_at, catch_up_at, running_at]
    filled = await backend.ledger.executions_backfill(ExecutionsBackfill(sid, everything, "ops"))
    assert filled.inserted == [key[paused_at]]
    assert [await state(backend, key[at]) for at in everything] == [
        (QUEUED, None, 0),
        (ExecutionStatus.SUCCEEDED, None, 1),
        (SKIPPED, "schedule_paused", 1),
        (SKIPPED, "overlap", 0),
        (SKIPPED, "catchup_window", 0),
        (ExecutionStatus.RUNNING, None, 1),
    ]
    [event] = await backend.ledger.audit_list(AuditQuery(action="schedule.backfill"))
    assert (event.details["inserted"], event.details["requested"]) == (1, 6)
    # A delete's skip of a fire that never started, once the schedule exists again.
    await planned(backend, fence, [gone], paused_at)
    await backend.ledger.schedules_delete(SchedulesDelete(gone))
    await backend.ledger.schedules_create(SchedulesCreate([schedule(gone)]))
    revived = await backend.ledger.executions_backfill(ExecutionsBackfill(gone, [paused_at], "ops"))
    assert revived.inserted == [execution_id(gone, paused_at)]
    assert await state(backend, revived.inserted[0]) == (QUEUED, None, 0)


async def test_a_dead_letter_of_a_deleted_schedule_is_not_replayed(backend: Backend) -> None:
    partition = 5
    [sid] = ids_in_partition(partition, 1, prefix="letter")
    await backend.ledger.schedules_create(SchedulesCreate([schedule(sid)]))
    fence = await own(backend, partition)
    at = await whole_minute(backend) - timedelta(minutes=1)
    await planned(backend, fence, [sid], at)
    key = execution_id(sid, at)
    await backend.ledger.executions_claim(ExecutionsClaim([fence], [key], 60, "n"))
    dead = Completion(key, 1, Outcome.DEAD_LETTER, error_code="http_404", error_message="gone")
    await backend.ledger.executions_complete(ExecutionsComplete([fence], [dead]))
    await backend.ledger.schedules_delete(SchedulesDelete(sid))
    # What it would run with went with its schedule: it stays a dead letter, unaudited.
    assert await backend.ledger.dead_letters_replay(DeadLettersReplay([key], "ops")) == []
    assert await state(backend, key) == (ExecutionStatus.DEAD_LETTER, "http_404", 1)
    assert await backend.ledger.audit_list(AuditQuery(action="dead_letter.replay")) == []
    # Once its schedule exists again, it runs with the new schedule's payload.
    await backend.ledger.schedules_create(SchedulesCreate([schedule(sid, payload={"n": 2})]))
    assert await backend.ledger.dead_letters_replay(DeadLettersReplay([key], "ops")) == [key]
    assert await state(backend, key) == (QUEUED, None, 1)


BURST_SCHEDULES = os.environ.get("CARILLON_TEST_BURST_SCHEDULES")
"""Schedules due at one instant in the burst test; by default 2,000 on the memory ledger and
300 on Postgres (each is paused and resumed on its own: two transactions). The issue's case
is 200,000 fires: set this to run it."""


async def test_a_burst_planned_ahead_paused_and_resumed_is_queued_again_exactly_once(
    backend: Backend,
) -> None:
    partition = 3
    count = int(BURST_SCHEDULES or (2_000 if backend.clock is not None else 300))
    ids = ids_in_partition(partition, count, prefix="burst")
    for first in range(0, len(ids), BATCH_ROWS_MAX):
        chunk = ids[first : first + BATCH_ROWS_MAX]
        await backend.ledger.schedules_create(SchedulesCreate([schedule(sid) for sid in chunk]))
    fence = await own(backend, partition)
    # Within the lookahead (a minute ahead) -- on Postgres, whose clock runs while the test
    # pauses and resumes each schedule, with a minute more per 200 schedules, so the instant
    # is still to come when the last one resumes.
    ahead = 1 if backend.clock is not None else 1 + count // 200
    at = await whole_minute(backend) + timedelta(minutes=ahead)
    for first in range(0, len(ids), BATCH_ROWS_MAX):
        chunk = ids[first : first + BATCH_ROWS_MAX]
        plan = [PlannedExecution(sid, "acme", "noop", at) for sid in chunk]
        await backend.ledger.executions_plan(ExecutionsPlan(fence, plan, []))
    for enabled in (False, True):
        for sid in ids:
            await set_enabled(backend, sid, enabled)
    queued: list[str] = []
    cursor: str | None = None
    while True:
        page = await backend.ledger.executions_query(
            ExecutionsQuery(planned_from=at, cursor=cursor, limit=PAGE_SIZE_MAX)
        )
        assert {e.status for e in page.items} <= {QUEUED}
        queued += [e.execution_id for e in page.items]
        cursor = page.next_cursor
        if cursor is None:
            break
    assert sorted(queued) == sorted(execution_id(sid, at) for sid in ids)


# --- operator-added executions: trigger and backfill -----------------------------------------


async def test_a_trigger_queues_a_run_due_at_once_and_is_audited(backend: Backend) -> None:
    partition = 6
    [sid] = ids_in_partition(partition, 1, prefix="trig")
    [stored] = await backend.ledger.schedules_create(
        SchedulesCreate([schedule(sid, tenant_id="globex")])
    )
    head = await backend.ledger.schedule_changes_head()
    before = await backend.ledger.database_now()
    execution = await backend.ledger.executions_trigger(
        ExecutionsTrigger(sid, "cli:alice@ops-1", "rerun after the fix")
    )
    after = await backend.ledger.database_now()
    # Ledger now, or a microsecond after it if now is a whole second (a cron fire's instant).
    assert before <= execution.planned_at <= after + timedelta(microseconds=1)
    assert execution.planned_at.microsecond != 0
    assert execution.execution_id == execution_id(sid, execution.planned_at)
    assert (
        execution.schedule_id,
        execution.tenant_id,
        execution.task_type,
        execution.partition_id,
        execution.status,
        execution.attempt,
    ) == (sid, "globex", "noop", partition, ExecutionStatus.QUEUED, 0)
    assert execution.enqueued_at is not None
    assert (await backend.ledger.executions_get(execution.execution_id)).execution == execution
    await backend.advance(0.001)
    assert await due_now(backend, partition) == [execution.execution_id]
    fence = await own(backend, partition)
    [started] = await backend.ledger.executions_claim(
        ExecutionsClaim([fence], [execution.execution_id], 60, "n")
    )
    assert started.attempt == 1
    [event] = await backend.ledger.audit_list(AuditQuery(action="schedule.trigger"))
    assert (event.actor, event.target, event.details) == (
        "cli:alice@ops-1",
        execution.execution_id,
        {"schedule_id": sid, "reason": "rerun after the fix"},
    )
    [change] = await backend.ledger.schedule_changes(ScheduleChangesSince(head))
    assert (change.schedule_id, change.partition_id, change.kind, change.version) == (
        sid,
        partition,
        ChangeKind.EXECUTIONS_ADDED,
        stored.version,
    )
    for bad in (ExecutionsTrigger(sid, ""), ExecutionsTrigger(sid, "ops", "  ")):
        with pytest.raises(InvalidField):
            await backend.ledger.executions_trigger(bad)
    with pytest.raises(NotFound):
        await backend.ledger.executions_trigger(ExecutionsTrigger("nope", "ops"))
    await backend.ledger.schedules_delete(SchedulesDelete(sid))
    with pytest.raises(NotFound):
        await backend.ledger.executions_trigger(ExecutionsTrigger(sid, "ops"))
    assert len(await backend.ledger.audit_list(AuditQuery(action="schedule.trigger"))) == 1


async def test_trigger_twice_in_one_microsecond_gets_two_ids(backend: Backend) -> None:
    partition = 1
    [sid] = ids_in_partition(partition, 1, prefix="twice")
    await backend.ledger.schedules_create(SchedulesCreate([schedule(sid)]))
    fence = await own(backend, partition)
    now = await backend.ledger.database_now()
    taken = now + timedelta(microseconds=2)
    await planned(backend, fence, [sid], taken)
    runs = [await backend.ledger.executions_trigger(ExecutionsTrigger(sid, "ops")) for _ in "abc"]
    ids = [run.execution_id for run in runs]
    assert len({*ids, execution_id(sid, taken)}) == 4
    assert [run.planned_at for run in runs] == sorted({run.planned_at for run in runs})
    if backend.clock is not None:
        # The memory ledger's clock stands still (on a whole second, which a trigger leaves
        # to the cron fires): each trigger moves on by a microsecond, and past the fire
        # planned at that very instant.
        assert now.microsecond == 0
        assert [run.planned_at - now for run in runs] == [
            timedelta(microseconds=1),
            timedelta(microseconds=3),
            timedelta(microseconds=4),
        ]
    assert len(await backend.ledger.audit_list(AuditQuery(action="schedule.trigger"))) == 3


async def test_a_trigger_never_takes_the_instant_of_a_cron_fire(backend: Backend) -> None:
    partition = 3
    [sid] = ids_in_partition(partition, 1, prefix="dot")
    await backend.ledger.schedules_create(SchedulesCreate([schedule(sid)]))
    run = await backend.ledger.executions_trigger(ExecutionsTrigger(sid, "ops"))
    assert run.planned_at.microsecond != 0
    # The fire of that second (every fire is at a whole second) is still planned.
    second = run.planned_at.replace(microsecond=0)
    fence = await own(backend, partition)
    assert await planned(backend, fence, [sid], second) == [execution_id(sid, second)]


async def test_a_trigger_runs_a_paused_schedule_and_a_later_update_keeps_it(
    backend: Backend,
) -> None:
    partition = 5
    [sid] = ids_in_partition(partition, 1, prefix="manual")
    [created] = await backend.ledger.schedules_create(
        SchedulesCreate([schedule(sid, enabled=False)])
    )
    execution = await backend.ledger.executions_trigger(ExecutionsTrigger(sid, "ops"))
    assert execution.status is ExecutionStatus.QUEUED
    changed = msgspec.structs.replace(created, cron_expr="0 * * * *")  # still disabled
    await backend.ledger.schedules_update(SchedulesUpdate(changed, created.version))
    await backend.advance(0.001)
    assert await due_now(backend, partition) == [execution.execution_id]


async def test_backfill_inserts_past_fires_once_each_and_is_audited_once(
    backend: Backend,
) -> None:
    partition = 2
    [sid] = ids_in_partition(partition, 1, prefix="fill")
    # A disabled schedule may be backfilled too.
    [stored] = await backend.ledger.schedules_create(
        SchedulesCreate([schedule(sid, enabled=False)])
    )
    head = await backend.ledger.schedule_changes_head()
    now = await backend.ledger.database_now()
    hour = now.replace(minute=0, second=0, microsecond=0)
    instants = [hour - timedelta(hours=2), hour - timedelta(hours=1), now]
    paris = instants[1].astimezone(timezone(timedelta(hours=2)))  # the same instant again
    asked = [instants[1], instants[0], paris, instants[2]]
    result = await backend.ledger.executions_backfill(
        ExecutionsBackfill(sid, asked, "ops", "the outage of 1 March")
    )
    ids = [execution_id(sid, instant) for instant in instants]
    assert result == Backfilled([ids[1], ids[0], ids[2]], None, 0)
    for key, instant in zip(ids, instants, strict=True):
        execution = (await backend.ledger.executions_get(key)).execution
        assert (execution.status, execution.planned_at, execution.partition_id) == (
            ExecutionStatus.QUEUED,
            instant,
            partition,
        )
    assert sorted(await due_now(backend, partition)) == sorted(ids)
    [event] = await backend.ledger.audit_list(AuditQuery(action="schedule.backfill"))
    assert (event.actor, event.target, event.details) == (
        "ops",
        sid,
        {
            "inserted": 3,
            "requested": 3,
            "first": format_utc(instants[0]),
            "last": format_utc(instants[2]),
            "reason": "the outage of 1 March",
            "skipped_purged": 0,
        },
    )
    [change] = await backend.ledger.schedule_changes(ScheduleChangesSince(head))
    assert (change.kind, change.version) == (ChangeKind.EXECUTIONS_ADDED, stored.version)
    assert await backend.ledger.executions_backfill(ExecutionsBackfill(sid, [], "ops")) == (
        Backfilled([])
    )
    assert len(await backend.ledger.audit_list(AuditQuery(action="schedule.backfill"))) == 1


async def test_backfill_over_runs_that_happened_inserts_nothing(backend: Backend) -> None:
    partition = 3
    [sid] = ids_in_partition(partition, 1, prefix="ran")
    await backend.ledger.schedules_create(SchedulesCreate([schedule(sid)]))
    fence = await own(backend, partition)
    at = (await backend.ledger.database_now()).replace(microsecond=0) - timedelta(minutes=5)
    ran, skipped, pending = at, at + timedelta(minutes=1), at + timedelta(minutes=2)
    await planned(backend, fence, [sid], ran)
    await planned(backend, fence, [sid], pending)
    catch_up = PlannedExecution(
        sid, "acme", "noop", skipped, ExecutionStatus.SKIPPED, error_code="catchup_window"
    )
    await backend.ledger.executions_plan(ExecutionsPlan(fence, [catch_up], []))
    await backend.ledger.executions_claim(
        ExecutionsClaim([fence], [execution_id(sid, ran)], 60, "n")
    )
    await backend.ledger.executions_complete(
        ExecutionsComplete([fence], [Completion(execution_id(sid, ran), 1, Outcome.SUCCEEDED)])
    )
    ids = [execution_id(sid, instant) for instant in (ran, skipped, pending)]
    before = [(await backend.ledger.executions_get(key)).execution for key in ids]
    head = await backend.ledger.schedule_changes_head()
    backfill = ExecutionsBackfill(sid, [ran, skipped, pending], "ops")
    assert await backend.ledger.executions_backfill(backfill) == Backfilled([])
    assert [(await backend.ledger.executions_get(key)).execution for key in ids] == before
    assert [e.status for e in before] == [
        ExecutionStatus.SUCCEEDED,
        ExecutionStatus.SKIPPED,
        ExecutionStatus.QUEUED,
    ]
    [event] = await backend.ledger.audit_list(AuditQuery(action="schedule.backfill"))
    assert (event.details["inserted"], event.details["requested"]) == (0, 3)
    assert await backend.ledger.schedule_changes(ScheduleChangesSince(head)) == []


async def test_backfill_refuses_future_naive_or_too_many_instants_and_changes_nothing(
    backend: Backend,
) -> None:
    [sid] = ids_in_partition(7, 1, prefix="bad")
    await backend.ledger.schedules_create(SchedulesCreate([schedule(sid)]))
    now = await backend.ledger.database_now()
    past = now - timedelta(hours=1)
    refused = [
        (ExecutionsBackfill(sid, [past, now + timedelta(hours=1)], "ops"), "later than"),
        (ExecutionsBackfill(sid, [past.replace(tzinfo=None)], "ops"), "UTC offset"),
        (
            ExecutionsBackfill(
                sid, [past - timedelta(seconds=n) for n in range(BATCH_ROWS_MAX + 1)], "ops"
            ),
            "at most",
        ),
        (ExecutionsBackfill(sid, [past], ""), "actor"),
        (ExecutionsBackfill(sid, [past], "ops", ""), "reason"),
    ]
    for params, match in refused:
        with pytest.raises(InvalidField, match=match):
            await backend.ledger.executions_backfill(params)
    with pytest.raises(NotFound):
        await backend.ledger.executions_backfill(ExecutionsBackfill("nope", [past], "ops"))
    page = await backend.ledger.executions_query(ExecutionsQuery(schedule_id=sid))
    assert page.items == []
    assert await backend.ledger.audit_list(AuditQuery()) == []


# --- schedule quota and census ---------------------------------------------------------------


async def test_schedule_quota_refuses_whole_batch(backend: Backend) -> None:
    await backend.ledger.tenants_put(TenantsPut(Tenant(tenant_id="acme", schedules_max=3)))
    assert (await backend.ledger.tenants_get("acme")).schedules_max == 3
    await backend.ledger.schedules_create(SchedulesCreate([schedule("a1"), schedule("a2")]))
    assert await backend.ledger.schedules_count("acme") == 2
    batch = [schedule("a3"), schedule("g1", tenant_id="globex"), schedule("a4")]
    with pytest.raises(QuotaExceeded) as refused:
        await backend.ledger.schedules_create(SchedulesCreate(batch))
    error = refused.value
    assert (error.tenant_id, error.quota, error.count, error.requested) == ("acme", 3, 2, 2)
    for part in ("'acme'", "at most 3", "owns 2", "2 more"):
        assert part in str(error)
    for sid in ("a3", "g1", "a4"):  # all or none: the other tenant's schedule too
        with pytest.raises(NotFound):
            await backend.ledger.schedules_get(sid)
    await backend.ledger.schedules_create(
        SchedulesCreate([schedule("a3", enabled=False), schedule("g1", tenant_id="globex")])
    )
    assert await backend.ledger.schedules_count("acme") == 3  # disabled ones count
    with pytest.raises(AlreadyExists):  # checked before the quota
        await backend.ledger.schedules_create(SchedulesCreate([schedule("a2"), schedule("a9")]))
    # A deleted schedule frees its place; creating its id again takes it back.
    await backend.ledger.schedules_delete(SchedulesDelete("a1"))
    assert await backend.ledger.schedules_count("acme") == 2
    await backend.ledger.schedules_create(SchedulesCreate([schedule("a1")]))
    with pytest.raises(QuotaExceeded):
        await backend.ledger.schedules_create(SchedulesCreate([schedule("a5")]))
    # Updates never count: moving a schedule into the full tenant is allowed.
    g1 = await backend.ledger.schedules_get("g1")
    moved = msgspec.structs.replace(g1, tenant_id="acme")
    await backend.ledger.schedules_update(SchedulesUpdate(moved, g1.version))
    assert await backend.ledger.schedules_count("acme") == 4
    assert await backend.ledger.schedules_count("globex") == 0
    # Without a quota (or without a row) a tenant is unlimited.
    await backend.ledger.tenants_put(TenantsPut(Tenant(tenant_id="acme")))
    await backend.ledger.schedules_create(SchedulesCreate([schedule("a5"), schedule("a6")]))
    await backend.ledger.schedules_create(
        SchedulesCreate([schedule(f"n{n}", tenant_id="newcomer") for n in range(5)])
    )
    assert await backend.ledger.schedules_count("acme") == 6
    assert await backend.ledger.schedules_count("nobody") == 0


async def test_census_groups_enabled_schedules(backend: Backend) -> None:
    every5 = "*/5 * * * *"
    await backend.ledger.schedules_create(
        SchedulesCreate(
            [
                schedule("m3", cron_expr=every5),
                schedule("m1", cron_expr=every5),
                schedule("m2", cron_expr=every5),
                schedule("p2", cron_expr=every5, timezone="Europe/Paris"),
                schedule("p1", cron_expr=every5, timezone="Europe/Paris"),
                schedule("off", cron_expr=every5, enabled=False),
                schedule("gap", cron_expr=every5, timezone="Europe/Paris", dst_gap=DstGap.SKIP),
                schedule("g1", cron_expr="0 * * * *", tenant_id="globex"),
                schedule("gone", cron_expr="0 * * * *", tenant_id="globex"),
            ]
        )
    )
    await backend.ledger.schedules_delete(SchedulesDelete("gone"))
    auto, paris = (DstGap.AUTO, DstOverlap.AUTO), "Europe/Paris"
    expected = [
        ScheduleGroup(every5, "UTC", *auto, "acme", "noop", count=3, sample_schedule_id="m1"),
        ScheduleGroup(every5, paris, *auto, "acme", "noop", count=2, sample_schedule_id="p1"),
        ScheduleGroup(
            every5, paris, DstGap.SKIP, DstOverlap.AUTO, "acme", "noop", 1, sample_schedule_id="gap"
        ),
        ScheduleGroup("0 * * * *", "UTC", *auto, "globex", "noop", 1, sample_schedule_id="g1"),
    ]
    assert await backend.ledger.schedules_census(SchedulesCensus()) == expected
    assert await backend.ledger.schedules_census(SchedulesCensus(limit=2)) == expected[:2]
    globex = await backend.ledger.schedules_census(SchedulesCensus(tenant_id="globex"))
    assert globex == expected[3:]
    assert await backend.ledger.schedules_census(SchedulesCensus(tenant_id="nobody")) == []
    for limit in (0, CENSUS_GROUPS_MAX + 1):
        with pytest.raises(InvalidField):
            await backend.ledger.schedules_census(SchedulesCensus(limit=limit))


# --- membership: clock offsets ---------------------------------------------------------------


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


# --- schedules by id prefix ------------------------------------------------------------------


async def test_list_by_id_prefix_keeps_the_ids_that_start_with_it(backend: Backend) -> None:
    ids = ["ap", "app", "apple", "apple-pie", "apple.2", "apples", "apq", "b-apple", "APPLE"]
    await backend.ledger.schedules_create(
        SchedulesCreate(
            [schedule(sid, tenant_id="globex" if sid == "apples" else "acme") for sid in ids]
        )
    )
    seen: list[str] = []
    cursor = None
    while True:
        page = await backend.ledger.schedules_list(
            SchedulesList(id_prefix="apple", cursor=cursor, limit=2)
        )
        seen += [s.schedule_id for s in page.items]
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert seen == ["apple", "apple-pie", "apple.2", "apples"]
    acme = await backend.ledger.schedules_list(SchedulesList(id_prefix="apple", tenant_id="acme"))
    assert [s.schedule_id for s in acme.items] == ["apple", "apple-pie", "apple.2"]
    everything = await backend.ledger.schedules_list(SchedulesList(id_prefix=""))
    assert len(everything.items) == len(ids)
    assert (await backend.ledger.schedules_list(SchedulesList(id_prefix="zz"))).items == []
    with pytest.raises(InvalidField):
        await backend.ledger.schedules_list(SchedulesList(id_prefix="a" * 129))


# --- execution statistics --------------------------------------------------------------------


async def test_stats_count_planned_started_on_time_dead_letters_starts_and_skips(
    backend: Backend,
) -> None:
    first, skipped, retried, other = ids_in_partition(5, 4)
    await backend.ledger.schedules_create(
        SchedulesCreate(
            [
                schedule(first),
                schedule(skipped),
                schedule(retried),
                schedule(other, tenant_id="globex"),
            ]
        )
    )
    fence = await own(backend, 5)
    now = (await backend.ledger.database_now()).replace(microsecond=0)
    start = now - timedelta(minutes=10)
    early, late = start + timedelta(seconds=5), start + timedelta(seconds=130)
    await planned(backend, fence, [first], start - timedelta(seconds=1))  # before the range
    await planned(backend, fence, [first, skipped, other], early)
    await planned(backend, fence, [retried], late)
    claim = ExecutionsClaim(
        [fence],
        [execution_id(first, early), execution_id(retried, late)],
        attempt_lease_s=30,
        node_id="n",
    )
    assert len(await backend.ledger.executions_claim(claim)) == 2
    done = [
        Completion(execution_id(first, early), 1, Outcome.DEAD_LETTER, error_code="boom"),
        Completion(execution_id(retried, late), 1, Outcome.FAILED, now - timedelta(seconds=1)),
    ]
    await backend.ledger.executions_complete(ExecutionsComplete([fence], done))
    [again] = await backend.ledger.executions_claim(claim)
    assert again.attempt == 2  # its first start is attempt 1's, from the history
    await backend.ledger.executions_skip(
        ExecutionsSkip([fence], [execution_id(skipped, early)], "overlap")
    )

    stats = await backend.ledger.executions_stats(
        ExecutionsStats(planned_from=start, bucket_s=60, buckets=12, on_time_s=500)
    )
    assert len(stats) == 12
    b0, b2, b10 = stats[0], stats[2], stats[10]
    assert (b0.planned, b0.started, b0.on_time, b0.dead_letters) == (3, 1, 0, 1)
    assert (b2.planned, b2.started, b2.on_time, b2.dead_letters) == (1, 1, 1, 0)
    assert 595 <= b0.plan_lag_s_max < 620  # written ten minutes after their instant
    assert 470 <= b2.plan_lag_s_max < 495
    assert (b10.starts, b10.skips) == (2, 1)  # the retry is no first start
    quiet = [b for i, b in enumerate(stats) if i not in (0, 2, 10)]
    assert all(b == type(b)() for b in quiet)
    assert sum(b.planned for b in stats) == 4  # the fire before the range is not counted

    globex = await backend.ledger.executions_stats(
        ExecutionsStats(start, 60, 12, 500, tenant_id="globex")
    )
    assert [b.planned for b in globex] == [1] + [0] * 11
    assert sum(b.starts + b.skips for b in globex) == 0
    strict = await backend.ledger.executions_stats(ExecutionsStats(start, 60, 12, 0.0))
    assert sum(b.on_time for b in strict) == 0
    nobody = await backend.ledger.executions_stats(ExecutionsStats(start, 60, 3, 1, "nobody"))
    assert nobody == [type(nobody[0])()] * 3


@pytest.mark.parametrize(
    "change",
    [
        {"planned_from": datetime(2026, 1, 1)},
        {"buckets": 0},
        {"buckets": STATS_BUCKETS_MAX + 1},
        {"bucket_s": 0},
        {"bucket_s": STATS_BUCKET_S_MAX + 1},
        {"on_time_s": -1.0},
        {"on_time_s": float("nan")},
    ],
)
async def test_stats_refuse_out_of_bounds_ranges(
    backend: Backend, change: dict[str, object]
) -> None:
    now = await backend.ledger.database_now()
    params = msgspec.structs.replace(ExecutionsStats(now, 60, 60, 1.0), **change)
    with pytest.raises(InvalidField):
        await backend.ledger.executions_stats(params)
