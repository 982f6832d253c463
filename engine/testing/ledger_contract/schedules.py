"""The ledger contract: schedules (create, update, delete, list, load), the change feed, the
schedule quota and census.
"""

from __future__ import annotations

from datetime import timedelta

import msgspec
import pytest
import trio
import trio.testing

from engine.core.dst import DstGap, DstOverlap
from engine.core.hashing import partition_of
from engine.errors import (
    AlreadyExists,
    ChangesPruned,
    InvalidField,
    NotFound,
    QuotaExceeded,
    VersionConflict,
)
from engine.ledger.params import (
    BATCH_ROWS_MAX,
    CENSUS_GROUPS_MAX,
    PAGE_SIZE_MAX,
    PLAN_PAGE_MAX,
    ChangeKind,
    ExecutionsClaim,
    ExecutionsPlan,
    PlannedExecution,
    ScheduleChangesPrune,
    ScheduleChangesSince,
    ScheduleGroup,
    SchedulesCensus,
    SchedulesCreate,
    SchedulesDelete,
    SchedulesList,
    SchedulesPlannable,
    SchedulesUpdate,
    TenantsPut,
    plannable,
)
from engine.model import (
    PAYLOAD_BYTES_MAX,
    CatchUpPolicy,
    ExecutionStatus,
    OverlapPolicy,
    Tenant,
    execution_id,
)
from engine.testing.ledger_contract.backend import (
    PARTITIONS,
    Backend,
    ids_in_partition,
    schedule,
)
from engine.testing.ledger_contract.support import own, planned


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
            # Once the waiter is parked (on a ledger that waits in another thread, as the
            # Postgres one does, the change may still commit first: the wait then returns
            # at once, as the test above pins).
            await trio.testing.wait_all_tasks_blocked()
            await backend.ledger.schedules_create(SchedulesCreate([schedule("late")]))
    assert woke == [True]


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
