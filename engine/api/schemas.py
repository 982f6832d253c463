"""The JSON shapes of the API: what requests carry and responses return.

Requests are decoded by msgspec straight into these structs (unknown fields are refused, so
a typo such as ``"timzone"`` is a 422 rather than a silently ignored setting); responses
reuse the engine's own records (:class:`~engine.model.Schedule`, :class:`~engine.model.
Execution` ...) wherever they are already the right shape, so the API cannot drift from the
model. The OpenAPI document (:mod:`engine.api.openapi`) is generated from these same types.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Final

import msgspec
from msgspec import UNSET, Meta, UnsetType

from engine.core.dst import DstGap, DstOverlap
from engine.ledger.base import BATCH_ROWS_MAX
from engine.model import (
    CATCH_UP_WINDOW_S_DEFAULT,
    CatchUpPolicy,
    HandlerKind,
    OverlapPolicy,
)

REASON_MAX: Final = 1000
Reason = Annotated[str, Meta(max_length=REASON_MAX)]


class _In(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    """A request body: unknown fields are refused."""


class ScheduleSpec(_In, frozen=True):
    """A schedule as a client writes it (``POST /v1/schedules``, ``PUT``, batches)."""

    cron_expr: str
    task_type: str
    schedule_id: str | None = None
    """Set by the client (``PUT`` takes it from the path); ``POST`` generates one if absent."""
    tenant_id: str | None = None
    """Defaults to the token's tenant; an admin token must name one (else ``default``)."""
    timezone: str = "UTC"
    payload: dict[str, Any] = msgspec.field(default_factory=dict)
    enabled: bool = True
    catch_up: CatchUpPolicy = CatchUpPolicy.LATEST
    catch_up_window_s: float = CATCH_UP_WINDOW_S_DEFAULT
    dst_gap: DstGap = DstGap.AUTO
    dst_overlap: DstOverlap = DstOverlap.AUTO
    overlap: OverlapPolicy | None = None


class SchedulePatch(_In, frozen=True):
    """The fields to change (``PATCH``); those left out keep their values."""

    cron_expr: str | UnsetType = UNSET
    task_type: str | UnsetType = UNSET
    timezone: str | UnsetType = UNSET
    payload: dict[str, Any] | UnsetType = UNSET
    enabled: bool | UnsetType = UNSET
    catch_up: CatchUpPolicy | UnsetType = UNSET
    catch_up_window_s: float | UnsetType = UNSET
    dst_gap: DstGap | UnsetType = UNSET
    dst_overlap: DstOverlap | UnsetType = UNSET
    overlap: OverlapPolicy | UnsetType | None = UNSET


class ScheduleBatch(_In, frozen=True):
    schedules: Annotated[list[ScheduleSpec], Meta(min_length=1, max_length=BATCH_ROWS_MAX)]


class BatchResult(msgspec.Struct, frozen=True):
    created: int
    schedule_ids: list[str]


class ReasonIn(_In, frozen=True):
    """An operator action's body: why (kept in the audit trail)."""

    reason: Reason | None = None


class BackfillIn(_In, frozen=True, rename={"from_": "from"}):
    from_: datetime
    to: datetime
    """Exclusive."""
    reason: Reason | None = None


class BackfillResult(msgspec.Struct, frozen=True):
    requested: int
    """Occurrences of the schedule in ``[from, to)``."""
    inserted: int
    """Those that had no execution yet; the others are left exactly as they were."""
    execution_ids: list[str]


class PreviewFire(msgspec.Struct, frozen=True):
    planned_at: datetime
    local_time: str
    adjustment: str


class Preview(msgspec.Struct, frozen=True):
    schedule_id: str
    timezone: str
    fires: list[PreviewFire]


class ReplayFilter(_In, frozen=True):
    """Which dead letters to replay (``POST /v1/dead-letters:replay``): those of a schedule,
    a tenant or a task type (:data:`REPLAY_FILTERS`), or with ``all`` every one the token
    may see; ``planned_from``/``planned_to`` narrow either."""

    all: bool = False
    """Replay without naming a schedule, tenant or task type: every dead letter of the
    cluster (a tenant token: of its own tenant). Required when no such filter is given."""
    schedule_id: str | None = None
    tenant_id: str | None = None
    task_type: str | None = None
    planned_from: datetime | None = None
    planned_to: datetime | None = None
    limit: Annotated[int, Meta(ge=1, le=BATCH_ROWS_MAX)] = 1000
    reason: Reason | None = None


REPLAY_FILTERS: Final = ("schedule_id", "tenant_id", "task_type")
"""The fields of which a replay by filter must name one, unless it says ``"all": true``."""


class ReplayResult(msgspec.Struct, frozen=True):
    replayed: list[str]


class TaskTypeSpec(_In, frozen=True):
    """A task type as written by ``PUT /v1/task-types/{name}``."""

    kind: HandlerKind
    settings: dict[str, Any] = msgspec.field(default_factory=dict)
    timeout_s: float = 30.0
    max_concurrency: int | None = None
    max_concurrency_cluster: int | None = None
    max_attempts: int = 5
    backoff_base_s: float = 1.0
    backoff_max_s: float = 60.0
    overlap: OverlapPolicy | None = None


class TenantSpec(_In, frozen=True):
    """A tenant's settings as written by ``PUT /v1/tenants/{id}``."""

    weight: int = 1
    concurrency_quota: int | None = None
    rate_per_s: float | None = None
    burst: int | None = None
    schedules_max: int | None = None


class TenantView(msgspec.Struct, frozen=True):
    tenant_id: str
    weight: int
    concurrency_quota: int | None
    rate_per_s: float | None
    burst: int | None
    schedules_max: int | None
    schedules: int
    """Live schedules of the tenant now (what ``schedules_max`` caps)."""
    version: int
    updated_at: datetime | None


class ForecastSeries(msgspec.Struct, frozen=True):
    tenant_id: str | None
    task_type: str | None
    counts: list[int]
    total: int


class Forecast(msgspec.Struct, frozen=True):
    from_: datetime = msgspec.field(name="from")
    to: datetime = msgspec.field(name="to")
    bucket_s: int = 60
    bucket_starts: list[datetime] = msgspec.field(default_factory=list)
    total: list[int] = msgspec.field(default_factory=list)
    series: list[ForecastSeries] = msgspec.field(default_factory=list)
    approximated_schedules: int = 0
    """Schedules with ``H`` in their expression, counted as their group's sample fires."""


class NodeView(msgspec.Struct, frozen=True):
    node_id: str
    region: str
    started_at: datetime
    last_seen_at: datetime
    expires_at: datetime
    clock_offset_s: float | None
    partitions: int
    state: str = "active"
    """``active`` (its region is the active one) or ``standby``."""


class RegionFailoverSpec(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``POST /v1/region:failover``: make ``to_region`` active (see docs/multi-region.md)."""

    to_region: str
    reason: str | None = None


class RegionView(msgspec.Struct, frozen=True):
    active_region: str
    region_epoch: int
    changed: bool
    """False when the region was active already (running a failover twice is safe)."""
    revoked: int
    """Partition leases revoked: the demoted region's nodes stop at their next write."""


class PartitionView(msgspec.Struct, frozen=True):
    partition_id: int
    owner_id: str | None
    fencing_token: int
    lease_expires_at: datetime | None
    checkpoint_at: datetime | None
    """Every fire up to here has been planned. It moves when the planner writes, so on a
    quiet partition it stays at the last fire planned."""
    checkpoint_age_s: float | None
    """Now minus the checkpoint (negative while planning runs ahead, the lookahead)."""
    planner_lag_s: float | None
    """How long ago the partition's earliest unplanned fire was due, as its owner last
    reported in its heartbeat (0 while it keeps up; ``None``: no live owner reported)."""


class ClusterView(msgspec.Struct, frozen=True):
    database_now: datetime
    partition_count: int
    active_region: str
    region_epoch: int
    nodes: list[NodeView]
    partitions: list[PartitionView]


class Health(msgspec.Struct, frozen=True):
    status: str
    checks: dict[str, str] = msgspec.field(default_factory=dict)
