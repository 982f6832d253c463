"""The JSON shapes of the API: what requests carry and responses return.

Requests are decoded by msgspec straight into these structs (unknown fields are refused, so
a typo such as ``"timzone"`` is a 422 rather than a silently ignored setting); responses
reuse the engine's own records (:class:`~engine.model.Schedule`, :class:`~engine.model.
Execution` ...) wherever they are already the right shape, so the API cannot drift from the
model. The OpenAPI document (:mod:`engine.api.openapi`) is generated from these same types.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, Final

import msgspec
from msgspec import UNSET, Meta, UnsetType

from engine.core.cron import MAX_EXPRESSION_LENGTH
from engine.core.dst import DstGap, DstOverlap
from engine.handlers.base import SettingsWarning
from engine.ledger.params import BATCH_ROWS_MAX
from engine.model import (
    BACKOFF_BASE_S_DEFAULT,
    BACKOFF_MAX_S_DEFAULT,
    BACKOFF_S_MAX,
    CATCH_UP_WINDOW_S_DEFAULT,
    CATCH_UP_WINDOW_S_MAX,
    CONCURRENCY_MAX,
    IDENTIFIER_LENGTH_MAX,
    IDENTIFIER_PATTERN,
    MAX_ATTEMPTS_DEFAULT,
    MAX_ATTEMPTS_MAX,
    PAYLOAD_BYTES_MAX,
    REASON_LENGTH_MAX,
    SETTINGS_BYTES_MAX,
    TASK_TIMEOUT_S_DEFAULT,
    TASK_TIMEOUT_S_MAX,
    TENANT_BURST_MAX,
    TENANT_RATE_PER_S_MAX,
    TENANT_SCHEDULES_MAX,
    TENANT_WEIGHT_MAX,
    CatchUpPolicy,
    HandlerKind,
    OverlapPolicy,
    TaskType,
    validate_reason,
)

# Every constraint the server enforces on a request is stated here, on the type it is
# decoded with, so the OpenAPI document (generated from these types) shows a client generator
# or a fuzzer exactly the bounds the server holds to; tests/api/test_constraints.py tries a
# value at each stated bound and one just past it. Two kinds:
#
# * ``Meta`` constraints msgspec enforces while decoding (a 422 naming the field): where
#   the API is the only check (page sizes, batch sizes).
# * ``_stated`` ones, for the document only, where an engine validator (engine.model,
#   engine.core.cron) enforces the same constant with a message that says how to fix it,
#   for the API and the CLI alike: ids, cron expressions, the catch-up window, task types'
#   and tenants' numbers, reasons. A batch then names every invalid item, not only the
#   first.


def _stated(**schema: Any) -> Meta:
    """Constraints for the document that an engine validator enforces (same constants)."""
    return Meta(extra_json_schema=schema)


NO_NUL: Final = "^[^\\x00]*$"
"""No string may hold a NUL character (PostgreSQL cannot store one; the API refuses a body
with ``\\u0000`` anywhere in it)."""
INSTANT_MIN: Final = datetime(1900, 1, 1, tzinfo=UTC)
INSTANT_MAX: Final = datetime(9000, 1, 1, tzinfo=UTC)
"""The instants a client may send, ``[INSTANT_MIN, INSTANT_MAX)``: far enough from years 1
and 9999 that the date arithmetic of previews, forecasts and backfills cannot overflow."""
INSTANT_YEARS: Final = "^(19[0-9]{2}|[2-8][0-9]{3})-"
"""RFC 3339 text of a year in ``[1900, 9000)``: what the document states of every instant
a client sends (the offset must be there too, and the instant in UTC in that range)."""
INSTANT_RULE: Final = (
    f"RFC 3339 with a UTC offset, from {INSTANT_MIN.year} up to (not including) {INSTANT_MAX.year}"
)

Identifier = Annotated[
    str,
    _stated(
        minLength=1,
        maxLength=IDENTIFIER_LENGTH_MAX,
        pattern=IDENTIFIER_PATTERN,
        description=f"1-{IDENTIFIER_LENGTH_MAX} letters, digits and . _ ~ -, starting with a "
        "letter or digit",
    ),
]
"""Enforced by :func:`engine.model.validate_identifier`."""
Reason = Annotated[
    str,
    _stated(
        minLength=1,
        maxLength=REASON_LENGTH_MAX,
        pattern="^[^\\x00]*[^\\x00\\s][^\\x00]*$",
        description=f"why, kept in the audit trail: up to {REASON_LENGTH_MAX} printable "
        "characters (line breaks allowed), not all blank",
    ),
]
"""Enforced by :func:`engine.model.validate_reason` as the body is decoded (each struct
carrying one checks it in ``__post_init__``), so every route refuses a bad reason alike."""
REASON_MAX: Final = REASON_LENGTH_MAX
ExecutionId = Annotated[
    str,
    _stated(
        minLength=3,
        pattern=IDENTIFIER_PATTERN.removesuffix("$") + ":",
        description="the schedule id, a colon and the planned instant (RFC 3339 UTC)",
    ),
]
Instant = Annotated[datetime, _stated(pattern=INSTANT_YEARS, description=INSTANT_RULE)]
"""Enforced by :func:`engine.api.endpoint.check_instant`."""
CronExpr = Annotated[
    str,
    _stated(
        minLength=1,
        maxLength=MAX_EXPRESSION_LENGTH,
        pattern=NO_NUL,
        description="5 fields (or 6, seconds first), or a macro such as @daily; H hashes; "
        f"at most {MAX_EXPRESSION_LENGTH} characters once runs of spaces are one",
    ),
]
Zone = Annotated[str, _stated(minLength=1, pattern=NO_NUL, description="an IANA time zone")]
Payload = Annotated[
    dict[str, Any],
    _stated(description=f"any JSON object of at most {PAYLOAD_BYTES_MAX} bytes (compact UTF-8)"),
]
CatchUpWindow = Annotated[float, _stated(exclusiveMinimum=0, maximum=CATCH_UP_WINDOW_S_MAX)]
Seconds = Annotated[float, _stated(exclusiveMinimum=0, maximum=TASK_TIMEOUT_S_MAX)]
BackoffSeconds = Annotated[float, _stated(exclusiveMinimum=0, maximum=BACKOFF_S_MAX)]
Concurrency = Annotated[int, _stated(minimum=1, maximum=CONCURRENCY_MAX)]


def _count(maximum: int) -> Meta:
    return _stated(minimum=1, maximum=maximum)


class _In(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    """A request body: unknown fields are refused."""


class ScheduleSpec(_In, frozen=True):
    """A schedule as a client writes it (``POST /v1/schedules``, ``PUT``, batches)."""

    cron_expr: CronExpr
    task_type: Identifier
    schedule_id: Identifier | None = None
    """Set by the client (``PUT`` takes it from the path); ``POST`` generates one if absent."""
    tenant_id: Identifier | None = None
    """Defaults to the token's tenant; an admin token must name one (else ``default``)."""
    timezone: Zone = "UTC"
    payload: Payload = msgspec.field(default_factory=dict)
    enabled: bool = True
    catch_up: CatchUpPolicy = CatchUpPolicy.LATEST
    catch_up_window_s: CatchUpWindow = CATCH_UP_WINDOW_S_DEFAULT
    dst_gap: DstGap = DstGap.AUTO
    dst_overlap: DstOverlap = DstOverlap.AUTO
    overlap: OverlapPolicy | None = None


class SchedulePatch(_In, frozen=True):
    """The fields to change (``PATCH``); those left out keep their values."""

    cron_expr: CronExpr | UnsetType = UNSET
    task_type: Identifier | UnsetType = UNSET
    timezone: Zone | UnsetType = UNSET
    payload: Payload | UnsetType = UNSET
    enabled: bool | UnsetType = UNSET
    catch_up: CatchUpPolicy | UnsetType = UNSET
    catch_up_window_s: CatchUpWindow | UnsetType = UNSET
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

    def __post_init__(self) -> None:
        validate_reason(self.reason)


class BackfillIn(_In, frozen=True, rename={"from_": "from"}):
    from_: Instant
    to: Instant
    """Exclusive."""
    reason: Reason | None = None

    def __post_init__(self) -> None:
        validate_reason(self.reason)


class BackfillResult(msgspec.Struct, frozen=True):
    requested: int
    """Occurrences of the schedule in ``[from, to)``."""
    inserted: int
    """Those that had no execution yet; the others are left exactly as they were."""
    execution_ids: list[str]
    skipped_purged: int = 0
    """Occurrences at or before ``purged_through``, not backfilled: retention (or a
    dead-letter purge) removed the schedule's history up to there, and they may have run."""
    purged_through: datetime | None = None
    """The latest planned instant of the schedule's purged history (``null``: none purged)."""


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
    schedule_id: Identifier | None = None
    tenant_id: Identifier | None = None
    task_type: Identifier | None = None
    planned_from: Instant | None = None
    planned_to: Instant | None = None
    limit: Annotated[int, Meta(ge=1, le=BATCH_ROWS_MAX)] = 1000
    reason: Reason | None = None

    def __post_init__(self) -> None:
        validate_reason(self.reason)


REPLAY_FILTERS: Final = ("schedule_id", "tenant_id", "task_type")
"""The fields of which a replay by filter must name one, unless it says ``"all": true``."""


class ReplayResult(msgspec.Struct, frozen=True):
    replayed: list[str]


class PurgeFilter(_In, frozen=True):
    """Which dead letters to delete for good (``POST /v1/dead-letters:purge``): at least one
    filter, or ``all``."""

    schedule_id: Identifier | None = None
    tenant_id: Identifier | None = None
    task_type: Identifier | None = None
    planned_from: Instant | None = None
    planned_to: Instant | None = None
    all: bool = False
    """Every dead letter the token may see (a tenant token: its tenant's); refused with a
    filter, which is what it would ignore."""
    limit: Annotated[int, Meta(ge=1, le=BATCH_ROWS_MAX)] = 1000
    reason: Reason | None = None

    def __post_init__(self) -> None:
        validate_reason(self.reason)


class PurgeResult(msgspec.Struct, frozen=True):
    purged: list[str]
    """The ids deleted (each audited as ``dead_letter.purge``); fewer than ``limit`` means
    none matching is left."""


class TaskTypeSpec(_In, frozen=True):
    """A task type as written by ``PUT /v1/task-types/{name}``."""

    kind: HandlerKind
    settings: Annotated[
        dict[str, Any],
        _stated(description=f"the handler's, at most {SETTINGS_BYTES_MAX} bytes of JSON"),
    ] = msgspec.field(default_factory=dict)
    timeout_s: Seconds = TASK_TIMEOUT_S_DEFAULT
    max_concurrency: Concurrency | None = None
    max_concurrency_cluster: Concurrency | None = None
    max_attempts: Annotated[int, _count(MAX_ATTEMPTS_MAX)] = MAX_ATTEMPTS_DEFAULT
    backoff_base_s: BackoffSeconds = BACKOFF_BASE_S_DEFAULT
    backoff_max_s: BackoffSeconds = BACKOFF_MAX_S_DEFAULT
    overlap: OverlapPolicy | None = None
    tenant_id: Identifier | None = None
    """The tenant that owns it (only its schedules may name it); none: shared."""
    allowed_tenants: tuple[str, ...] | None = None
    """A shared task type's tenants (``"*"``: all; not for python and shell); not given: the
    default tenant only."""


class TaskTypeWritten(TaskType, frozen=True, kw_only=True):
    """The answer to ``PUT /v1/task-types/{name}``: the task type as stored (secrets as
    fingerprints), and what its writer should know about it."""

    warnings: Annotated[
        list[SettingsWarning],
        Meta(
            description="what the writer should know that does not stop the write: for a nats "
            "task type, nats_duplicate_window_short (the stream's duplicate_window is shorter "
            "than the task type's worst retry horizon) or nats_stream_unchecked (it could not "
            "be read, and why); empty for every other kind"
        ),
    ] = msgspec.field(default_factory=list)
    """Conditions outside Carillon that weaken what the task type's kind promises, found
    when it was written (a ``nats`` stream's duplicate window shorter than the retry
    horizon: ``nats_duplicate_window_short``; or unreadable: ``nats_stream_unchecked``).
    The task type is stored all the same; empty for every kind that looks at nothing."""


ROTATION_OVERLAP_S_MAX: Final = 30 * 86400.0
"""The longest a rotated-out secret keeps signing."""


class SecretRotation(_In, frozen=True):
    """``POST /v1/task-types/{name}:rotate-secret``: the new signing secret, and how long
    requests are signed with the old one too."""

    secret: str
    overlap_s: Annotated[float, Meta(ge=0, le=ROTATION_OVERLAP_S_MAX)] = 86400.0
    """Seconds during which both secrets sign (0: switch at once), at most 30 days."""


class TenantSpec(_In, frozen=True):
    """A tenant's settings as written by ``PUT /v1/tenants/{id}``."""

    weight: Annotated[int, _count(TENANT_WEIGHT_MAX)] = 1
    concurrency_quota: Concurrency | None = None
    rate_per_s: (
        Annotated[float, _stated(exclusiveMinimum=0, maximum=TENANT_RATE_PER_S_MAX)] | None
    ) = None
    burst: Annotated[int, _count(TENANT_BURST_MAX)] | None = None
    schedules_max: Annotated[int, _count(TENANT_SCHEDULES_MAX)] | None = None


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

    to_region: Identifier
    reason: Reason | None = None

    def __post_init__(self) -> None:
        validate_reason(self.reason)


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
