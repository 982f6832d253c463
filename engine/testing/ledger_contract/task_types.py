"""The ledger contract: task types, their grants to tenants, and tenants."""

from __future__ import annotations

from collections.abc import Awaitable
from datetime import datetime
from typing import Any

import msgspec
import pytest
import trio

from engine.errors import (
    AlreadyExists,
    InUse,
    InvalidField,
    NotFound,
    VersionConflict,
)
from engine.ledger.params import (
    SchedulesCreate,
    SchedulesDelete,
    SchedulesUpdate,
    TaskTypesPut,
    TenantsPut,
)
from engine.model import (
    SETTINGS_BYTES_MAX,
    TENANT_SCHEDULES_MAX,
    HandlerKind,
    OverlapPolicy,
    TaskType,
    Tenant,
)
from engine.testing.ledger_contract.backend import (
    Backend,
    schedule,
)


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
    backend: Backend, overrides: dict[str, Any], match: str
) -> None:
    with pytest.raises(InvalidField, match=match):
        await backend.ledger.task_types_put(TaskTypesPut(webhook_type(**overrides)))
    assert [t.name for t in await backend.ledger.task_types_list()] == ["noop"]


@pytest.mark.parametrize("kind", list(HandlerKind))
async def test_every_handler_kind_is_stored_and_read_back(
    backend: Backend, kind: HandlerKind
) -> None:
    """Every kind the registry knows fits the ledger's kind check (Postgres: migration 0010
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
