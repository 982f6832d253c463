"""Admin routes: task types, tenants, the cluster's state, and the load forecast.

Task types carry handler settings (webhook URLs and secrets), so only admin tokens read or
write them. A tenant token may read its own tenant (its quota and how much of it is used),
and ask for the forecast of its own schedules; everything else here is admin only.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Final

import msgspec
import trio

from engine.api import problems
from engine.api.endpoint import Access, Call, Endpoint, QueryParam, Reply
from engine.api.schemas import (
    ClusterView,
    Forecast,
    ForecastSeries,
    NodeView,
    PartitionView,
    RegionFailoverSpec,
    RegionView,
    SecretRotation,
    TaskTypeSpec,
    TaskTypeWritten,
    TenantSpec,
    TenantView,
)
from engine.core import redaction
from engine.core.instants import format_utc
from engine.core.load_forecast import Group, LoadForecast, forecast
from engine.errors import NotFound
from engine.handlers.registry import check_settings, retry_horizon_of, settings_warnings
from engine.ledger.params import (
    RegionFailover,
    ScheduleGroup,
    SchedulesCensus,
    TaskTypesPut,
    TenantsPut,
)
from engine.model import HandlerKind, TaskType, Tenant, validate_identifier, validate_task_type

_BUCKETS: Final = {"s": 1, "m": 60, "h": 3600, "d": 86400}
FORECAST_DEFAULT: Final = timedelta(hours=24)
_forecasts = trio.CapacityLimiter(1)
"""One forecast computes at a time per process: it is CPU work in a worker thread."""


def _shown(task_type: TaskType) -> TaskType:
    """A task type as the API shows it: its secrets as fingerprints (write-only)."""
    return msgspec.structs.replace(
        task_type, settings=redaction.redact(task_type.kind, task_type.settings)
    )


async def list_task_types(call: Call) -> Reply:
    task_types: list[TaskType] = await call.api.ledger.task_types_list()
    return Reply([_shown(task_type) for task_type in task_types])


async def get_task_type(call: Call) -> Reply:
    return Reply(_shown(await call.api.ledger.task_types_get(call.path("name"))))


async def put_task_type(call: Call) -> Reply:
    spec: TaskTypeSpec = call.body
    name = validate_identifier(call.path("name"), kind="task type")
    task_type = validate_task_type(TaskType(name=name, **msgspec.structs.asdict(spec)))
    expected: int | None = None
    if redaction.holds_fingerprints(task_type.kind, task_type.settings):
        # Fingerprints sent back stand for the secrets they were read from, and only if
        # nothing changed the task type since: the write is conditional on that version.
        try:
            current: TaskType | None = await call.api.ledger.task_types_get(name)
        except NotFound:
            current = None
        settings = redaction.restore(
            task_type.kind, task_type.settings, None if current is None else current.settings
        )
        task_type = msgspec.structs.replace(task_type, settings=settings)
        expected = None if current is None else current.version
    stored = await _put_checked(call, task_type, expected)
    # Once stored, and never failing the write: what the writer should know about the
    # broker the settings name (a nats stream's duplicate window), looked up now, bounded.
    warnings = await settings_warnings(
        [stored],
        brokers=call.api.brokers,
        options=call.api.handler_options,
        timeout_s=call.api.broker_lookup_timeout_s,
    )
    shown = msgspec.structs.asdict(_shown(stored))
    return Reply(TaskTypeWritten(**shown, warnings=warnings.get(stored.name, [])))


async def _put_checked(call: Call, task_type: TaskType, expected: int | None) -> TaskType:
    check_settings(task_type.kind, task_type.settings, retry_horizon_s=retry_horizon_of(task_type))
    stored: TaskType = await call.api.ledger.task_types_put(TaskTypesPut(task_type, expected))
    return stored


async def rotate_secret(call: Call) -> Reply:
    body: SecretRotation = call.body
    name = call.path("name")
    current: TaskType = await call.api.ledger.task_types_get(name)
    if current.kind is not HandlerKind.WEBHOOK:
        raise problems.invalid(f"task type {name!r} is {current.kind}: only webhooks sign")
    now = await call.api.ledger.database_now()
    settings = {
        key: value
        for key, value in current.settings.items()
        if key not in ("previous_secret", "previous_secret_until")
    }
    old = settings.get("secret")
    settings["secret"] = body.secret
    if isinstance(old, str) and old != body.secret and body.overlap_s > 0:
        settings["previous_secret"] = old
        until = now + timedelta(seconds=body.overlap_s)
        settings["previous_secret_until"] = format_utc(until)
    rotated = msgspec.structs.replace(current, settings=settings)
    return Reply(_shown(await _put_checked(call, rotated, current.version)))


async def delete_task_type(call: Call) -> Reply:
    await call.api.ledger.task_types_delete(call.path("name"))
    return Reply(None, 204)


async def _tenant_view(call: Call, tenant_id: str) -> TenantView:
    try:
        tenant: Tenant = await call.api.ledger.tenants_get(tenant_id)
    except NotFound:
        tenant = Tenant(tenant_id=tenant_id, version=0)
    count: int = await call.api.ledger.schedules_count(tenant_id)
    return TenantView(
        tenant.tenant_id,
        tenant.weight,
        tenant.concurrency_quota,
        tenant.rate_per_s,
        tenant.burst,
        tenant.schedules_max,
        count,
        tenant.version,
        tenant.updated_at,
    )


async def list_tenants(call: Call) -> Reply:
    tenants: list[Tenant] = await call.api.ledger.tenants_list()
    return Reply(tenants)


async def get_tenant(call: Call) -> Reply:
    tenant_id = validate_identifier(call.path("tenant_id"), kind="tenant id")
    call.who.check_tenant(tenant_id, f"tenant {tenant_id!r}")
    return Reply(await _tenant_view(call, tenant_id))


async def put_tenant(call: Call) -> Reply:
    spec: TenantSpec = call.body
    tenant_id = validate_identifier(call.path("tenant_id"), kind="tenant id")
    tenant = Tenant(tenant_id=tenant_id, **msgspec.structs.asdict(spec))
    await call.api.ledger.tenants_put(TenantsPut(tenant))
    return Reply(await _tenant_view(call, tenant_id))


async def cluster(call: Call) -> Reply:
    ledger = call.api.ledger
    now: datetime = await ledger.database_now()
    settings = await ledger.cluster_get()
    leases = sorted(await ledger.leases_list(), key=lambda lease: lease.partition_id)
    checkpoints = {
        c.partition_id: c.last_evaluated_at
        for c in await ledger.checkpoints_get(list(range(settings.partition_count)))
    }
    live_nodes = sorted(await ledger.nodes_live(), key=lambda n: n.node_id)
    lags = {node.node_id: node.planner_lag_s for node in live_nodes}
    owned: dict[str, int] = {}
    partitions = []
    for lease in leases:
        live = lease.owner_id is not None and (lease.expires_at or now) > now
        owner = lease.owner_id if live else None
        if owner is not None:
            owned[owner] = owned.get(owner, 0) + 1
        checkpoint = checkpoints.get(lease.partition_id)
        partitions.append(
            PartitionView(
                lease.partition_id,
                owner,
                lease.fencing_token,
                lease.expires_at,
                checkpoint,
                None if checkpoint is None else (now - checkpoint).total_seconds(),
                lags.get(owner, {}).get(lease.partition_id) if owner else None,
            )
        )
    nodes = [
        NodeView(
            n.node_id,
            n.region,
            n.started_at,
            n.last_seen_at,
            n.expires_at,
            n.clock_offset_s,
            owned.get(n.node_id, 0),
            "active" if n.region == settings.active_region else "standby",
        )
        for n in live_nodes
    ]
    return Reply(
        ClusterView(
            now,
            settings.partition_count,
            settings.active_region,
            settings.region_epoch,
            nodes,
            partitions,
        )
    )


def _bucket_s(text: str | None) -> int:
    if text is None:
        return 60
    unit = _BUCKETS.get(text[-1:])
    number = text[:-1]
    if (
        unit is None
        or not (number.isascii() and number.isdigit())
        or not 1 <= int(number) <= 10_000
    ):
        raise problems.invalid("bucket must be a number and a unit s, m, h or d, such as 1m or 15m")
    return int(number) * unit


async def get_forecast(call: Call) -> Reply:
    bucket_s = _bucket_s(call.query_str("bucket"))
    now: datetime = await call.api.ledger.database_now()
    start = call.query_instant("from") or now
    end = call.query_instant("to") or start + FORECAST_DEFAULT
    by = set((call.query_str("by") or "").split(",")) - {""}
    if not by <= {"tenant", "task_type"}:
        raise problems.invalid("by must be tenant, task_type or tenant,task_type")
    tenant = call.who.tenant_id
    census: list[ScheduleGroup] = await call.api.ledger.schedules_census(
        SchedulesCensus(tenant_id=tenant)
    )
    groups = [Group(**msgspec.structs.asdict(g)) for g in census]
    load: LoadForecast = await trio.to_thread.run_sync(
        lambda: forecast(
            groups,
            start,
            end,
            bucket_s,
            by_tenant="tenant" in by,
            by_task_type="task_type" in by,
        ),
        limiter=_forecasts,
    )
    series = [
        ForecastSeries(tenant_id, task_type, counts, sum(counts))
        for (tenant_id, task_type), counts in sorted(
            load.by_key.items(), key=lambda item: (-sum(item[1]), str(item[0]))
        )
    ]
    return Reply(
        Forecast(
            start,
            end,
            bucket_s,
            [start + timedelta(seconds=i * bucket_s) for i in range(load.buckets)],
            load.total,
            series,
            load.approximated,
        )
    )


async def region_failover(call: Call) -> Reply:
    """Make another region active on this node's database (a planned switch-over, or the
    forced failover once this database is the promoted primary). Safe to repeat."""
    spec: RegionFailoverSpec = call.body
    change = await call.api.ledger.region_failover(
        RegionFailover(spec.to_region, call.who.actor, spec.reason)
    )
    settings = change.settings
    return Reply(
        RegionView(settings.active_region, settings.region_epoch, change.changed, change.revoked)
    )


_ADMIN = Access.ADMIN
ENDPOINTS: Final = (
    Endpoint(
        "GET",
        "/v1/task-types",
        list_task_types,
        "List task types",
        access=_ADMIN,
        response=list[TaskType],
        tag="admin",
    ),
    Endpoint(
        "GET",
        "/v1/task-types/{name}",
        get_task_type,
        "Read a task type",
        access=_ADMIN,
        response=TaskType,
        tag="admin",
    ),
    Endpoint(
        "PUT",
        "/v1/task-types/{name}",
        put_task_type,
        "Create or replace a task type",
        access=_ADMIN,
        body=TaskTypeSpec,
        response=TaskTypeWritten,
        tag="admin",
    ),
    Endpoint(
        "POST",
        "/v1/task-types/{name}:rotate-secret",
        rotate_secret,
        "Rotate a webhook's signing secret, signing with both for an overlap",
        access=_ADMIN,
        body=SecretRotation,
        response=TaskType,
        tag="admin",
    ),
    Endpoint(
        "DELETE",
        "/v1/task-types/{name}",
        delete_task_type,
        "Delete a task type no schedule uses",
        access=_ADMIN,
        status=204,
        tag="admin",
    ),
    Endpoint(
        "GET",
        "/v1/tenants",
        list_tenants,
        "List tenants with settings of their own",
        access=_ADMIN,
        response=list[Tenant],
        tag="admin",
    ),
    Endpoint(
        "GET",
        "/v1/tenants/{tenant_id}",
        get_tenant,
        "Read a tenant's settings and schedule count (a tenant token: its own)",
        response=TenantView,
        tag="admin",
    ),
    Endpoint(
        "PUT",
        "/v1/tenants/{tenant_id}",
        put_tenant,
        "Set a tenant's settings",
        access=_ADMIN,
        body=TenantSpec,
        response=TenantView,
        tag="admin",
    ),
    Endpoint(
        "GET",
        "/v1/cluster",
        cluster,
        "Nodes, partitions, owners, fencing tokens, lag",
        access=_ADMIN,
        response=ClusterView,
        tag="admin",
    ),
    Endpoint(
        "POST",
        "/v1/region:failover",
        region_failover,
        "Make a region the active one: bump the region epoch, revoke every lease",
        access=_ADMIN,
        body=RegionFailoverSpec,
        response=RegionView,
        tag="admin",
    ),
    Endpoint(
        "GET",
        "/v1/forecast",
        get_forecast,
        "Executions due per time bucket (a tenant token: its own schedules)",
        response=Forecast,
        tag="admin",
        query=(
            QueryParam("from", "date-time", "start (default now)"),
            QueryParam("to", "date-time", "end, at most 7 days after from (default +24h)"),
            QueryParam("bucket", "string", "bucket size: 1m (default), 15m, 1h ..."),
            QueryParam("by", "string", "tenant, task_type or tenant,task_type"),
        ),
    ),
)
