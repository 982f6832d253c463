"""The records Carillon stores and passes around (msgspec Structs, immutable).

Instants are aware UTC datetimes everywhere; time zones matter only when a cron expression is
turned into instants (:mod:`engine.core.timetable`).

An execution is identified by ``"{schedule_id}:{planned_at}"`` (``planned_at`` in RFC 3339
UTC, :func:`execution_id`). Every node computes the same id for the same planned fire, so
the ledger can deduplicate re-planning and the id doubles as the idempotency key sent to the
handler: the queue may deliver twice, the effect happens once.
"""

from __future__ import annotations

import enum
import math
import re
from datetime import UTC, datetime
from typing import Any, Final, Protocol, TypeVar

import msgspec

from engine.core.dst import DstGap, DstOverlap
from engine.core.instants import format_utc, parse_instant
from engine.errors import InvalidField

IDENTIFIER_LENGTH_MAX: Final = 128
PAYLOAD_BYTES_MAX: Final = 64 * 1024
"""Largest JSON-encoded payload a schedule may carry."""
CATCH_UP_WINDOW_S_DEFAULT: Final = 3600.0
CATCH_UP_WINDOW_S_MAX: Final = 7 * 24 * 3600.0
TASK_TIMEOUT_S_DEFAULT: Final = 30.0
"""How long one attempt of a task type that names no ``timeout_s`` may run."""
TASK_TIMEOUT_S_MAX: Final = 24 * 3600.0
"""Longest a task type may let one attempt run."""
MAX_ATTEMPTS_DEFAULT: Final = 5
MAX_ATTEMPTS_MAX: Final = 100
BACKOFF_BASE_S_DEFAULT: Final = 1.0
BACKOFF_MAX_S_DEFAULT: Final = 60.0
BACKOFF_S_MAX: Final = 24 * 3600.0
"""Longest retry delay a task type may ask for."""
CONCURRENCY_MAX: Final = 1_000_000
"""Largest concurrency cap or quota (per node or cluster-wide)."""
TENANT_WEIGHT_MAX: Final = 1000
TENANT_RATE_PER_S_MAX: Final = 1_000_000.0
TENANT_BURST_MAX: Final = 1_000_000
TENANT_SCHEDULES_MAX: Final = 10_000_000
"""Largest schedule quota a tenant may be given."""
SETTINGS_BYTES_MAX: Final = 16 * 1024
"""Largest JSON-encoded handler settings a task type may carry."""
ALLOWED_TENANTS_MAX: Final = 1000
"""Most tenants a shared task type may be granted to by name."""
DEFAULT_TENANT: Final = "default"
"""The tenant of schedules created without one (by an admin token or the CLI)."""
ALL_TENANTS: Final = "*"
"""In a shared task type's ``allowed_tenants``: every tenant (webhook and noop kinds only)."""
ACTOR_LENGTH_MAX: Final = 200
"""Longest actor an audit event may name (``cli:alice@build-host-7``)."""
REASON_LENGTH_MAX: Final = 1000
"""Longest reason an operator may give for an audited action."""
TOKEN_DESCRIPTION_LENGTH_MAX: Final = 200
SCOPE_ADMIN: Final = "admin"
"""The scope of an API token that may do everything."""
SCOPE_TENANT_PREFIX: Final = "tenant:"
"""``tenant:<tenant id>``: the scope of an API token confined to one tenant."""

IDENTIFIER_PATTERN: Final = r"^[A-Za-z0-9][A-Za-z0-9._~-]*$"
"""What an identifier looks like (as the OpenAPI document states it); matched whole, so
a trailing line break does not slip past ``$``."""
_IDENTIFIER: Final = re.compile(IDENTIFIER_PATTERN)
_LINE_BREAKS_AND_TABS: Final = str.maketrans("", "", "\r\n\t")


class ExecutionStatus(enum.StrEnum):
    """Where an execution is in its life (``docs/ledger.md`` draws the state machine)."""

    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    """The attempt failed; a retry is queued for ``not_before`` unless retries are exhausted."""
    DEAD_LETTER = "dead-letter"
    SKIPPED = "skipped"
    """Deliberately not run (catch-up or overlap policy); ``error_code`` says why."""

    @property
    def is_terminal(self) -> bool:
        return self in _TERMINAL


_TERMINAL: Final = frozenset(
    {ExecutionStatus.SUCCEEDED, ExecutionStatus.DEAD_LETTER, ExecutionStatus.SKIPPED}
)


class CatchUpPolicy(enum.StrEnum):
    """What a planner does with fires missed while nobody owned the schedule's partition.

    Only fires within the schedule's ``catch_up_window_s`` are considered; older ones are
    recorded as skipped with the reason ``catchup_window``.
    """

    NONE = "none"
    """Run none of the missed fires; record them as skipped."""
    LATEST = "latest"
    """Run the most recent missed fire once; record the others as skipped (the default)."""
    ALL = "all"
    """Run every missed fire within the window, each under its own id."""


class OverlapPolicy(enum.StrEnum):
    """What happens when a fire is due while the schedule's previous run is still going.

    A schedule's own policy wins; a schedule without one (``None``) takes its task type's
    default, and without that too it is ``allow`` (:func:`overlap_policy`).
    """

    ALLOW = "allow"
    """Run it concurrently (the default)."""
    SKIP = "skip"
    """Record the new fire as skipped with the reason ``overlap``."""
    BUFFER_ONE = "buffer_one"
    """Run it right after the running one finishes; further fires meanwhile are skipped."""


class HandlerKind(enum.StrEnum):
    """Which handler runs the executions of a task type (``engine/handlers``)."""

    WEBHOOK = "webhook"
    """HTTP POST; settings ``url``, optional ``secret`` (signing) and ``headers``."""
    PYTHON = "python"
    """An imported function; settings ``callable`` (``package.module:function``)."""
    SHELL = "shell"
    """A process; settings ``argv`` (a list, never a shell string) and optional ``env``."""
    NOOP = "noop"
    """Succeeds, optionally after ``delay_s``: for benchmarks and smoke tests."""
    REDIS = "redis"
    """Appends to a Redis stream once per execution id; settings ``url``, ``stream``."""
    NATS = "nats"
    """Publishes to a NATS JetStream subject, ``Nats-Msg-Id`` = the execution id; settings
    ``url``, ``subject``."""
    RABBITMQ = "rabbitmq"
    """Publishes a persistent, confirmed message to a RabbitMQ exchange, ``message_id`` = the
    execution id; settings ``url``, ``exchange``, ``routing_key``."""


GRANTED_BY_NAME_KINDS: Final = frozenset({HandlerKind.PYTHON, HandlerKind.SHELL})
"""Kinds that run code on the nodes: a shared task type of these kinds names each tenant it
is granted to, never :data:`ALL_TENANTS`."""


class TaskType(msgspec.Struct, frozen=True, kw_only=True):
    """What running an execution of a schedule's ``task_type`` means, and its limits.

    Stored in the ledger so every node agrees; a schedule may only name a task type that
    exists. ``settings`` are kind-specific and checked by the handler registry, not here.
    """

    name: str
    kind: HandlerKind
    settings: dict[str, Any] = msgspec.field(default_factory=dict)
    timeout_s: float = TASK_TIMEOUT_S_DEFAULT
    """How long one attempt may run before it is abandoned as failed."""
    max_concurrency: int | None = None
    """Most executions of this type running at once on one node (``None``: no cap)."""
    max_concurrency_cluster: int | None = None
    """Most executions of this type running at once in the whole cluster (``None``: no cap)."""
    max_attempts: int = MAX_ATTEMPTS_DEFAULT
    """Attempts before a failing execution is dead-lettered (1: never retried)."""
    backoff_base_s: float = BACKOFF_BASE_S_DEFAULT
    backoff_max_s: float = BACKOFF_MAX_S_DEFAULT
    overlap: OverlapPolicy | None = None
    """The overlap policy of schedules of this type that do not choose one."""
    tenant_id: str | None = None
    """The tenant that owns this task type: only its schedules may name it. ``None``: a
    shared task type, which the tenants in :attr:`allowed_tenants` may use."""
    allowed_tenants: tuple[str, ...] | None = None
    """The tenants whose schedules may name a shared task type, by id, sorted; ``"*"`` grants
    it to every tenant (not for python and shell kinds, which are granted by name only).
    Empty on a task type owned by a tenant. Not given (``None``): the default tenant only --
    what a one-tenant installation needs, and nothing more (:func:`validate_task_type` stores
    it as ``("default",)``)."""
    updated_at: datetime | None = None
    """Set by the ledger."""
    version: int = 1
    """Set by the ledger: 1 when created, incremented on every change."""

    def usable_by(self, tenant_id: str) -> bool:
        """Whether schedules of ``tenant_id`` may name this task type."""
        if self.tenant_id is not None:
            return tenant_id == self.tenant_id
        allowed = (DEFAULT_TENANT,) if self.allowed_tenants is None else self.allowed_tenants
        return tenant_id in allowed or ALL_TENANTS in allowed


class Tenant(msgspec.Struct, frozen=True, kw_only=True):
    """A tenant's share of the dispatcher. A tenant never stored has these defaults."""

    tenant_id: str
    weight: int = 1
    """Relative share in the weighted round-robin across tenants, 1-1000."""
    concurrency_quota: int | None = None
    """Most executions of this tenant running at once on one node (``None``: no quota)."""
    rate_per_s: float | None = None
    """Sustained starts per second for this tenant (``None``: only the node's rate)."""
    burst: int | None = None
    """Starts allowed at once above ``rate_per_s`` (needs a rate)."""
    schedules_max: int | None = None
    """Most live schedules the tenant may own (``None``: no quota); creates beyond it are
    refused with :class:`~engine.errors.QuotaExceeded`."""
    updated_at: datetime | None = None
    version: int = 1


class Schedule(msgspec.Struct, frozen=True, kw_only=True):
    """A cron schedule owned by a tenant."""

    schedule_id: str
    tenant_id: str
    cron_expr: str
    task_type: str
    timezone: str = "UTC"
    payload: dict[str, Any] = msgspec.field(default_factory=dict)
    enabled: bool = True
    next_run_at: datetime | None = None
    """The next planned instant, materialised by the owning planner; ``None`` until planned."""
    updated_at: datetime | None = None
    version: int = 1
    """Incremented on every update; updates carrying an older version are refused."""
    partition_id: int | None = None
    """Assigned by the ledger: ``partition_of(schedule_id, partition_count)``."""
    catch_up: CatchUpPolicy = CatchUpPolicy.LATEST
    catch_up_window_s: float = CATCH_UP_WINDOW_S_DEFAULT
    dst_gap: DstGap = DstGap.AUTO
    dst_overlap: DstOverlap = DstOverlap.AUTO
    overlap: OverlapPolicy | None = None
    """``None``: the task type's default (:attr:`TaskType.overlap`), else ``allow``."""


class Execution(msgspec.Struct, frozen=True, kw_only=True):
    """One planned fire of a schedule and what became of it."""

    execution_id: str
    schedule_id: str
    tenant_id: str
    task_type: str
    planned_at: datetime
    status: ExecutionStatus = ExecutionStatus.QUEUED
    attempt: int = 0
    """Attempts started so far; only the current attempt may complete the execution."""
    enqueued_at: datetime | None = None
    not_before: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    error_code: str | None = None
    error_message: str | None = None
    fencing_token: int | None = None
    """The fencing token of the lease under which it was last written."""
    partition_id: int
    """The partition of its schedule (set by the ledger that planned or triggered it; every
    partition, 0 included, is a real one)."""
    attempt_expires_at: datetime | None = None
    """While running: when the attempt lease expires and the execution may be re-queued."""


# --- startability: the one definition -------------------------------------------------------

STARTABLE_AT_ONCE: Final = datetime.min.replace(tzinfo=UTC)
"""The instant a ``failed`` execution without a retry time may start from: the beginning of
time, so at once (``'-infinity'`` in the SQL column that mirrors :func:`startable_at`)."""


class Startable(Protocol):
    """What decides whether an execution may start (an :class:`Execution` is one)."""

    @property
    def status(self) -> ExecutionStatus: ...

    @property
    def planned_at(self) -> datetime: ...

    @property
    def not_before(self) -> datetime | None: ...


def startable_at(execution: Startable) -> datetime | None:
    """The instant from which ``execution`` may start, or ``None`` if it may not start at all.

    The one definition of "may this execution start?": ``queued`` at its planned instant;
    ``failed`` at its retry instant ``not_before`` (without one, at once:
    :data:`STARTABLE_AT_ONCE`); every other status never (running, or terminal). The ledger's
    ``executions_due`` and ``executions_claim`` return and start exactly the executions whose
    instant is at or before theirs, ordered by it; the dispatcher queues each until it.
    PostgreSQL mirrors it in the generated column ``executions.startable_at``
    (``engine/ledger/postgres/migrations/0001_initial.sql``), read under ``status IN
    ('queued', 'failed')``; ``tests/ledger/test_startability.py`` pins the two against each
    other on a grid of rows.
    """
    status = execution.status
    if status is ExecutionStatus.QUEUED:
        return execution.planned_at
    if status is ExecutionStatus.FAILED:
        not_before = execution.not_before
        return STARTABLE_AT_ONCE if not_before is None else not_before
    return None


def is_startable(execution: Startable, by: datetime) -> bool:
    """Whether ``execution`` may start at or before ``by`` (:func:`startable_at`)."""
    at = startable_at(execution)
    return at is not None and at <= by


class AuditAction(enum.StrEnum):
    """What an audit event records (its ``action``)."""

    DEAD_LETTER_REPLAY = "dead_letter.replay"
    """A dead letter was put back in the queue. ``target``: its execution id; ``details``:
    ``reason`` (the operator's, or ``None``), ``attempt`` (its attempt count when replayed)
    and ``error_code`` (the error it was dead-lettered with)."""
    REGION_FAILOVER = "region.failover"
    """The active region changed (``carillon region failover``). ``target``: the region made
    active; ``details``: ``from_region``, ``from_epoch``, ``to_epoch``, ``revoked`` (leases
    whose owner was cleared) and ``reason``."""
    SCHEDULE_TRIGGER = "schedule.trigger"
    """An operator ran a schedule now. ``target``: the execution id; ``details``:
    ``schedule_id`` and ``reason``."""
    SCHEDULE_BACKFILL = "schedule.backfill"
    """An operator added past fires of a schedule. ``target``: the schedule id; ``details``:
    ``inserted`` and ``requested`` (counts), ``first`` and ``last`` (the earliest and latest
    instant asked for, RFC 3339 UTC), ``reason`` and ``skipped_purged`` (instants left out
    because the schedule's history up to them was purged)."""
    DEAD_LETTER_PURGE = "dead_letter.purge"
    """A dead letter was deleted for good. ``target``: its execution id; ``details``:
    ``reason``, ``attempt``, ``error_code`` and ``schedule_id``."""
    TOKEN_CREATE = "token.create"
    """An API token was created. ``target``: its token id; ``details``: ``scope`` and
    ``description``."""
    TOKEN_REVOKE = "token.revoke"
    """An API token was revoked. ``target``: its token id; ``details``: ``scope``."""
    MANIFEST_APPLY = "manifest.apply"
    """A manifest set changed an object (``carillon apply``). ``target``: the object's id or
    name; ``details``: ``manifest_set``, ``kind`` (schedule, task_type, tenant), ``change``
    (create, update, adopt, delete, release), ``fields`` (what an update changed),
    ``version`` (after the change) and ``source`` (the manifest's file and line, if sent)."""


class AuditEvent(msgspec.Struct, frozen=True, kw_only=True):
    """One entry of the append-only audit trail: who did what to which target, and when."""

    event_id: int
    """Assigned by the ledger: 1, 2, 3 ... in commit order (there may be gaps)."""
    at: datetime
    """The ledger's clock when the action was taken."""
    actor: str
    """Who acted, e.g. ``cli:alice@ops-1`` (:func:`validate_actor`)."""
    action: str
    """An :class:`AuditAction` value (kept a plain string, so that events written by a newer
    Carillon can still be read)."""
    target: str
    details: dict[str, Any] = msgspec.field(default_factory=dict)


class ApiToken(msgspec.Struct, frozen=True, kw_only=True):
    """A bearer token of the HTTP API, as the ledger stores it: never the secret itself,
    only its SHA-256 beside this record (:func:`validate_api_token`)."""

    token_id: str
    """The public handle (an identifier): what listings show and revocation names."""
    scope: str
    """``admin``, or ``tenant:<tenant id>`` for a token confined to one tenant."""
    description: str = ""
    """Up to 200 printable characters saying whose it is and what for."""
    created_at: datetime | None = None
    """Set by the ledger."""
    revoked_at: datetime | None = None
    """Set by the ledger when revoked; a revoked token is kept, and refused by its users."""


class ConsoleSession(msgspec.Struct, frozen=True, kw_only=True):
    """A signed-in console session, as the ledger stores it: never the session id itself,
    only its SHA-256 beside this record. It lasts while it is used at least every
    ``idle_timeout_s`` and until ``expires_at`` at the latest, unless revoked (sign-out, or
    its token's revocation) first."""

    token_id: str
    """The API token it was opened with; the session acts as that token."""
    scope: str
    """That token's scope (read from the token, which never changes it)."""
    created_at: datetime
    last_seen_at: datetime
    """When it was last used (set by the ledger's ``sessions_touch``)."""
    idle_timeout_s: float
    expires_at: datetime
    """``created_at`` + its lifetime: the latest instant it is valid, however busy."""
    revoked_at: datetime | None = None


class Lease(msgspec.Struct, frozen=True, kw_only=True):
    """Ownership of one partition, valid until ``expires_at`` by the database's clock."""

    partition_id: int
    owner_id: str | None
    fencing_token: int
    """Incremented on every acquisition, never reused; every fenced write carries it."""
    expires_at: datetime | None


class PlannerCheckpoint(msgspec.Struct, frozen=True, kw_only=True):
    """How far a partition's planner has durably planned."""

    partition_id: int
    last_evaluated_at: datetime


def validate_identifier(value: str, *, kind: str) -> str:
    """Check a schedule, tenant or task-type id: 1-128 of ``A-Z a-z 0-9 . _ ~ -``.

    Colons are excluded so an execution id splits unambiguously at its first colon.
    """
    if not 1 <= len(value) <= IDENTIFIER_LENGTH_MAX or not _IDENTIFIER.fullmatch(value):
        raise InvalidField(
            f"{kind} {value!r} is invalid: use 1-{IDENTIFIER_LENGTH_MAX} characters from "
            "letters, digits and . _ ~ -, starting with a letter or digit"
        )
    return value


def validate_actor(actor: str) -> str:
    """Check the actor of an audited action: 1-200 printable characters, no surrounding
    spaces. Unlike an identifier it may hold ``:``, ``@`` and spaces (``cli:alice@host``)."""
    if (
        not isinstance(actor, str)
        or not 1 <= len(actor) <= ACTOR_LENGTH_MAX
        or not actor.isprintable()
        or actor != actor.strip()
    ):
        raise InvalidField(
            f"actor {actor!r} is invalid: use 1-{ACTOR_LENGTH_MAX} printable characters "
            "without leading or trailing spaces, e.g. 'cli:alice@ops-1'"
        )
    return actor


def validate_reason(reason: str | None) -> str | None:
    """Check an operator's reason: ``None``, or up to 1000 printable characters (line breaks
    and tabs allowed) that are not all blank."""
    if reason is None:
        return None
    if not isinstance(reason, str) or not reason.strip():
        raise InvalidField("reason must not be blank; leave it out instead")
    if len(reason) > REASON_LENGTH_MAX:
        raise InvalidField(
            f"reason is {len(reason)} characters long; at most {REASON_LENGTH_MAX} are kept"
        )
    if not reason.translate(_LINE_BREAKS_AND_TABS).isprintable():
        raise InvalidField("reason must hold printable characters only (and line breaks)")
    return reason


def validate_scope(scope: str) -> str:
    """Check an API token's scope: exactly ``admin``, or ``tenant:`` and a tenant id."""
    if isinstance(scope, str) and scope.startswith(SCOPE_TENANT_PREFIX):
        validate_identifier(scope.removeprefix(SCOPE_TENANT_PREFIX), kind="scope's tenant id")
        return scope
    if scope != SCOPE_ADMIN:
        raise InvalidField(
            f"scope {scope!r} is invalid: use {SCOPE_ADMIN!r} or '{SCOPE_TENANT_PREFIX}<tenant id>'"
        )
    return scope


def validate_api_token(token: ApiToken) -> ApiToken:
    """``token``'s id, scope and description checked; ``InvalidField`` naming the first bad
    one. The times are the ledger's to set, so they are not checked."""
    validate_identifier(token.token_id, kind="token id")
    validate_scope(token.scope)
    description = token.description
    if (
        not isinstance(description, str)
        or len(description) > TOKEN_DESCRIPTION_LENGTH_MAX
        or not description.isprintable()
    ):
        raise InvalidField(
            f"token {token.token_id!r}: description must be at most "
            f"{TOKEN_DESCRIPTION_LENGTH_MAX} printable characters"
        )
    return token


def execution_id(schedule_id: str, planned_at: datetime) -> str:
    """The deterministic id of the fire of ``schedule_id`` at ``planned_at``."""
    return f"{schedule_id}:{format_utc(planned_at)}"


def parse_execution_id(value: str) -> tuple[str, datetime]:
    """Split an execution id back into ``(schedule_id, planned_at)``."""
    schedule_id, sep, instant = value.partition(":")
    if not sep or not schedule_id:
        raise InvalidField(f"execution id {value!r} is not of the form schedule_id:planned_at")
    return validate_identifier(schedule_id, kind="schedule id"), parse_instant(
        instant, field="execution id instant"
    )


def overlap_policy(schedule: Schedule, task_type: TaskType | None) -> OverlapPolicy:
    """The overlap policy in force for ``schedule``: its own, else its task type's default
    (``task_type`` may be ``None`` when it cannot be read), else ``allow``."""
    if schedule.overlap is not None:
        return schedule.overlap
    if task_type is not None and task_type.overlap is not None:
        return task_type.overlap
    return OverlapPolicy.ALLOW


def check_payload_size(payload: dict[str, Any]) -> int:
    """The JSON size of ``payload`` in bytes; :class:`InvalidField` above the limit."""
    size = len(msgspec.json.encode(payload))
    if size > PAYLOAD_BYTES_MAX:
        raise InvalidField(
            f"payload is {size} bytes of JSON; the limit is {PAYLOAD_BYTES_MAX} bytes "
            "(store large data elsewhere and pass a reference)"
        )
    return size


def validate_task_type(task_type: TaskType) -> TaskType:
    """``task_type`` checked, with its enums and numbers normalised; ``InvalidField`` naming
    the first bad field. Handler settings are only checked to be a small JSON object here;
    what they must contain is the handler registry's business."""
    name = validate_identifier(task_type.name, kind="task type name")
    where = f"task type {name!r}"
    kind = _enum(HandlerKind, task_type.kind, f"{where}: kind")
    overlap = (
        None
        if task_type.overlap is None
        else _enum(OverlapPolicy, task_type.overlap, f"{where}: overlap")
    )
    check_settings_size(task_type.settings, where=where)
    timeout_s = _seconds(task_type.timeout_s, TASK_TIMEOUT_S_MAX, f"{where}: timeout_s")
    base_s = _seconds(task_type.backoff_base_s, BACKOFF_S_MAX, f"{where}: backoff_base_s")
    max_s = _seconds(task_type.backoff_max_s, BACKOFF_S_MAX, f"{where}: backoff_max_s")
    if max_s < base_s:
        raise InvalidField(
            f"{where}: backoff_max_s ({max_s:g}) must not be less than backoff_base_s ({base_s:g})"
        )
    owner, allowed = _task_type_users(task_type, kind, where)
    return msgspec.structs.replace(
        task_type,
        kind=kind,
        overlap=overlap,
        tenant_id=owner,
        allowed_tenants=allowed,
        timeout_s=timeout_s,
        max_concurrency=_count_or_none(
            task_type.max_concurrency, CONCURRENCY_MAX, f"{where}: max_concurrency"
        ),
        max_concurrency_cluster=_count_or_none(
            task_type.max_concurrency_cluster,
            CONCURRENCY_MAX,
            f"{where}: max_concurrency_cluster",
        ),
        max_attempts=_count(task_type.max_attempts, MAX_ATTEMPTS_MAX, f"{where}: max_attempts"),
        backoff_base_s=base_s,
        backoff_max_s=max_s,
    )


def _task_type_users(
    task_type: TaskType, kind: HandlerKind, where: str
) -> tuple[str | None, tuple[str, ...]]:
    """The checked owner and grants of ``task_type``: one owner, or a shared type's grants."""
    owner = task_type.tenant_id
    if owner is not None:
        owner = validate_identifier(owner, kind=f"{where}: tenant_id")
    grants = task_type.allowed_tenants
    if grants is None:
        grants = () if owner is not None else (DEFAULT_TENANT,)
    if isinstance(grants, str) or not isinstance(grants, tuple | list):
        raise InvalidField(f"{where}: allowed_tenants must be a list of tenant ids")
    if len(grants) > ALLOWED_TENANTS_MAX:
        raise InvalidField(
            f"{where}: allowed_tenants names {len(grants)} tenants; at most "
            f'{ALLOWED_TENANTS_MAX} (or "*" for every tenant)'
        )
    allowed = tuple(
        sorted(
            {
                grant
                if grant == ALL_TENANTS
                else validate_identifier(grant, kind=f"{where}: allowed_tenants entry")
                for grant in grants
            }
        )
    )
    if owner is not None and allowed:
        raise InvalidField(
            f"{where}: a task type owned by tenant {owner!r} is usable by that tenant only; "
            "leave allowed_tenants empty, or make it shared (no tenant_id) and list the tenants"
        )
    if ALL_TENANTS in allowed and kind in GRANTED_BY_NAME_KINDS:
        raise InvalidField(
            f"{where}: a {kind} task type runs code on the nodes, so it is granted to tenants "
            f'by name only, never to "{ALL_TENANTS}"'
        )
    return owner, allowed


def validate_tenant(tenant: Tenant) -> Tenant:
    """``tenant`` checked, numbers normalised; ``InvalidField`` naming the first bad field."""
    tenant_id = validate_identifier(tenant.tenant_id, kind="tenant id")
    where = f"tenant {tenant_id!r}"
    rate = tenant.rate_per_s
    if rate is not None:
        if isinstance(rate, bool) or not isinstance(rate, int | float):
            raise InvalidField(f"{where}: rate_per_s must be a number, got {rate!r}")
        if not (math.isfinite(rate) and 0 < rate <= TENANT_RATE_PER_S_MAX):
            raise InvalidField(
                f"{where}: rate_per_s must be above 0 and at most {TENANT_RATE_PER_S_MAX:g} "
                f"starts per second, got {rate}"
            )
        rate = float(rate)
    burst = _count_or_none(tenant.burst, TENANT_BURST_MAX, f"{where}: burst")
    if burst is not None and rate is None:
        raise InvalidField(f"{where}: a burst only applies with a rate; set rate_per_s too")
    return msgspec.structs.replace(
        tenant,
        weight=_count(tenant.weight, TENANT_WEIGHT_MAX, f"{where}: weight"),
        concurrency_quota=_count_or_none(
            tenant.concurrency_quota, CONCURRENCY_MAX, f"{where}: concurrency_quota"
        ),
        rate_per_s=rate,
        burst=burst,
        schedules_max=_count_or_none(
            tenant.schedules_max, TENANT_SCHEDULES_MAX, f"{where}: schedules_max"
        ),
    )


def check_settings_size(settings: dict[str, Any], *, where: str) -> int:
    """The JSON size of handler ``settings``; ``InvalidField`` unless they are a JSON object
    of at most :data:`SETTINGS_BYTES_MAX` bytes."""
    if not isinstance(settings, dict) or not all(isinstance(key, str) for key in settings):
        raise InvalidField(f"{where}: settings must be a JSON object with string keys")
    try:
        size = len(msgspec.json.encode(settings))
    except (TypeError, msgspec.EncodeError) as exc:
        raise InvalidField(f"{where}: settings are not JSON-encodable ({exc})") from None
    if size > SETTINGS_BYTES_MAX:
        raise InvalidField(
            f"{where}: settings are {size} bytes of JSON; the limit is {SETTINGS_BYTES_MAX}"
        )
    return size


_E = TypeVar("_E", bound=enum.StrEnum)


def _enum(kind: type[_E], value: object, field: str) -> _E:
    if isinstance(value, str):
        try:
            return kind(value)
        except ValueError:
            pass
    choices = ", ".join(member.value for member in kind)
    raise InvalidField(f"{field} must be one of {choices}, got {value!r}")


def _seconds(value: object, maximum: float, field: str) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not (math.isfinite(value) and 0 < value <= maximum)
    ):
        raise InvalidField(
            f"{field} must be a positive number of seconds up to {maximum:g}, got {value!r}"
        )
    return float(value)


def _count(value: object, maximum: int, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= maximum:
        raise InvalidField(f"{field} must be a whole number from 1 to {maximum}, got {value!r}")
    return value


def _count_or_none(value: object, maximum: int, field: str) -> int | None:
    return None if value is None else _count(value, maximum, field)
