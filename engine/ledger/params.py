"""The ledger's records and parameter objects: what goes in and out of :class:`~engine.ledger.
base.Ledger` calls (one params object per call), and the bounds every call checks.

They live apart from the protocol so that the contract (``base.py``) reads as the list of
operations. Each parameter object with something to check checks itself, once, for both
backends: ``params.checked()`` returns it with every instant in UTC, or raises
``InvalidField`` (the rules are in :mod:`engine.ledger.checks`). Both backends call it first,
so they refuse the same input with the same message.
"""

from __future__ import annotations

import enum
import math
from collections import Counter
from datetime import UTC, datetime
from typing import Final, Generic, Self, TypeVar

import msgspec

from engine.core.dst import DstGap, DstOverlap
from engine.errors import InvalidField
from engine.ledger.checks import (
    check_batch,
    check_clock_offset,
    check_duration,
    check_id_prefix,
    check_limit,
    check_not_empty,
    check_session_hash,
    check_token_hash,
    utc,
    utc_or_none,
)
from engine.model import (
    ApiToken,
    CatchUpPolicy,
    Execution,
    ExecutionStatus,
    Schedule,
    TaskType,
    Tenant,
    check_payload_size,
    execution_id,
    startable_at,
    validate_actor,
    validate_api_token,
    validate_identifier,
    validate_reason,
    validate_task_type,
    validate_tenant,
)

BATCH_ROWS_MAX: Final = 10_000
"""Most rows one write call may carry."""
PAGE_SIZE_MAX: Final = 1_000
"""Most rows one read call returns."""
PLAN_PAGE_MAX: Final = 10_000
"""Most schedules one :class:`SchedulesPlannable` read returns (small rows, read in bulk)."""
CENSUS_GROUPS_MAX: Final = 100_000
"""Most groups one schedule census returns."""
STATS_BUCKETS_MAX: Final = 1_440
"""Most buckets one execution statistics call returns (a day of minutes)."""
STATS_BUCKET_S_MAX: Final = 3_600

SCHEDULE_DELETED: Final = "schedule_deleted"
"""``error_code`` of executions skipped because their schedule was deleted."""
SCHEDULE_DELETED_MESSAGE: Final = "the schedule was deleted before this execution started"
SCHEDULE_PAUSED: Final = "schedule_paused"
"""``error_code`` of executions skipped because their schedule was disabled (paused)."""
SCHEDULE_PAUSED_MESSAGE: Final = "the schedule was paused before this execution started"
LIFECYCLE_SKIPS: Final = (SCHEDULE_PAUSED, SCHEDULE_DELETED)
"""The ``error_code`` of executions skipped by a pause or a delete: the skips that resuming,
re-creating or backfilling may revive (those of a fire that never started). A skip for
any other reason -- an overlap policy, a catch-up policy -- is never revived."""

T = TypeVar("T")

_PLANNABLE: Final = frozenset({ExecutionStatus.QUEUED, ExecutionStatus.SKIPPED})


class Fence(msgspec.Struct, frozen=True):
    """Proof of ownership carried by every ownership-dependent write."""

    partition_id: int
    owner_id: str
    fencing_token: int


class Page(msgspec.Struct, Generic[T], frozen=True):
    """One page of a listing; pass ``next_cursor`` back to get the next (``None``: no more)."""

    items: list[T]
    next_cursor: str | None


PARTITIONS_DEFAULT: Final = 64
"""The partition count of a new cluster (chosen once, by its first migration)."""
REGION_DEFAULT: Final = "default"
"""The region of a node, and the active region of a cluster, when none is configured."""
REGION_EPOCH_TOKEN_SHIFT: Final = 32
"""Fencing tokens drawn under region epoch ``e`` are at least ``(e - 1) << 32``: every token
of a later epoch is above every token of an earlier one, even on a promoted replica that
never saw the old primary's last acquisitions."""


def token_floor(region_epoch: int) -> int:
    """The least fencing token an acquisition under ``region_epoch`` may draw."""
    return ((region_epoch - 1) << REGION_EPOCH_TOKEN_SHIFT) + 1


def validate_region(region: str) -> str:
    """A region name: an identifier (``A-Z a-z 0-9 . _ ~ -``, 1-128 characters)."""
    return validate_identifier(region, kind="region")


class ClusterSettings(msgspec.Struct, frozen=True):
    """Settings fixed or changed only by administrative commands."""

    partition_count: int
    active_region: str
    region_epoch: int


class NodeInfo(msgspec.Struct, frozen=True):
    """A node's membership row."""

    node_id: str
    region: str
    started_at: datetime
    last_seen_at: datetime
    expires_at: datetime
    clock_offset_s: float | None = None
    """The node's clock minus the ledger's, as the node last measured and reported it
    (``None``: not reported)."""
    planner_lag_s: dict[int, float] = msgspec.field(default_factory=dict)
    """Per partition whose planner runs on the node: how far behind now its planning was,
    as last reported (0 while it keeps up)."""


class ChangeKind(enum.StrEnum):
    CREATED = "created"
    UPDATED = "updated"
    DELETED = "deleted"
    EXECUTIONS_ADDED = "executions_added"
    """An operator added executions of the schedule (trigger, backfill); the schedule itself
    is unchanged (the change carries its current version)."""


class ScheduleChange(msgspec.Struct, frozen=True):
    """One entry of the schedule change feed; ``seq`` increases in commit order."""

    seq: int
    schedule_id: str
    partition_id: int
    kind: ChangeKind
    version: int


class Attempt(msgspec.Struct, frozen=True):
    """One finished (or abandoned) attempt of an execution."""

    attempt: int
    outcome: str
    """``succeeded``, ``failed``, ``dead-letter``, ``skipped`` or ``expired`` (lease ran out)."""
    started_at: datetime | None
    finished_at: datetime
    error_code: str | None = None
    error_message: str | None = None


class ExecutionDetail(msgspec.Struct, frozen=True):
    execution: Execution
    attempts: list[Attempt]


# --- parameters, one object per call ----------------------------------------------------


class SchedulesCreate(msgspec.Struct, frozen=True):
    """Create schedules. ``version`` and ``partition_id`` of the inputs are ignored."""

    schedules: list[Schedule]

    def checked(self) -> Self:
        """At most :data:`BATCH_ROWS_MAX` well-formed schedules (:func:`checked_schedule`),
        no id twice."""
        check_batch(len(self.schedules), BATCH_ROWS_MAX, field="schedules")
        schedules = [checked_schedule(schedule) for schedule in self.schedules]
        repeated = sorted(
            key for key, n in Counter(s.schedule_id for s in schedules).items() if n > 1
        )
        if repeated:
            raise InvalidField(f"schedule ids repeated in one call: {', '.join(repeated)}")
        return msgspec.structs.replace(self, schedules=schedules)


class SchedulesUpdate(msgspec.Struct, frozen=True):
    """Replace a schedule's user fields if its current version is ``expected_version``."""

    schedule: Schedule
    expected_version: int

    def checked(self) -> Self:
        return msgspec.structs.replace(self, schedule=checked_schedule(self.schedule))


class SchedulesDelete(msgspec.Struct, frozen=True):
    schedule_id: str
    expected_version: int | None = None


class SchedulesList(msgspec.Struct, frozen=True):
    tenant_id: str | None = None
    task_type: str | None = None
    enabled: bool | None = None
    partition_id: int | None = None
    cursor: str | None = None
    limit: int = 100
    id_prefix: str | None = None
    """Only the ids that start with it (at most ``IDENTIFIER_LENGTH_MAX`` characters)."""

    def checked(self) -> Self:
        check_limit(self.limit, PAGE_SIZE_MAX)
        check_id_prefix(self.id_prefix)
        return self


class SchedulesPlannable(msgspec.Struct, frozen=True):
    """The enabled live schedules of ``partition_id`` with ids above ``after`` (``None``: from
    the first), in id order, at most ``limit`` (<= :data:`PLAN_PAGE_MAX`)."""

    partition_id: int
    after: str | None = None
    limit: int = PLAN_PAGE_MAX

    def checked(self) -> Self:
        check_limit(self.limit, PLAN_PAGE_MAX)
        return self


class PlannableSchedule(msgspec.Struct, frozen=True, gc=False):
    """What a planner needs of a schedule to plan it, and nothing else (no payload): the row
    a partition load reads, a million at a time. Same values as the :class:`Schedule`."""

    schedule_id: str
    tenant_id: str
    task_type: str
    version: int
    next_run_at: datetime | None
    cron_expr: str
    timezone: str
    dst_gap: DstGap
    dst_overlap: DstOverlap
    catch_up: CatchUpPolicy
    catch_up_window_s: float

    @property
    def enabled(self) -> bool:
        """Always: only enabled schedules are read this way."""
        return True


def plannable(schedule: Schedule) -> PlannableSchedule:
    """The planning view of ``schedule``."""
    return PlannableSchedule(
        schedule_id=schedule.schedule_id,
        tenant_id=schedule.tenant_id,
        task_type=schedule.task_type,
        version=schedule.version,
        next_run_at=schedule.next_run_at,
        cron_expr=schedule.cron_expr,
        timezone=schedule.timezone,
        dst_gap=schedule.dst_gap,
        dst_overlap=schedule.dst_overlap,
        catch_up=schedule.catch_up,
        catch_up_window_s=schedule.catch_up_window_s,
    )


def checked_schedule(schedule: Schedule) -> Schedule:
    """``schedule`` if its id, payload and ``next_run_at`` are well formed, with
    ``next_run_at`` in UTC: the check of every schedule a create or update stores."""
    validate_identifier(schedule.schedule_id, kind="schedule id")
    check_payload_size(schedule.payload)
    next_run_at = schedule.next_run_at
    if next_run_at is None or next_run_at.tzinfo is UTC:
        return schedule
    return msgspec.structs.replace(schedule, next_run_at=utc(next_run_at, field="next_run_at"))


class ScheduleChangesSince(msgspec.Struct, frozen=True):
    after_seq: int
    limit: int = PAGE_SIZE_MAX

    def checked(self) -> Self:
        check_limit(self.limit, PAGE_SIZE_MAX)
        return self


class ScheduleChangesPrune(msgspec.Struct, frozen=True):
    """Remove the oldest changes of the feed appended before ``before``, at most ``limit``."""

    before: datetime
    limit: int = BATCH_ROWS_MAX

    def checked(self) -> Self:
        check_limit(self.limit, BATCH_ROWS_MAX)
        return msgspec.structs.replace(self, before=utc(self.before, field="before"))


class LeasesAcquire(msgspec.Struct, frozen=True):
    owner_id: str
    partition_ids: list[int]
    ttl_s: float
    region: str = REGION_DEFAULT
    """The caller's region: nothing is acquired unless it is the cluster's active region."""

    def checked(self) -> Self:
        """A named owner and a valid TTL (the partitions are checked against the cluster's
        count by :func:`~engine.ledger.checks.check_partitions`)."""
        check_not_empty(self.owner_id, field="owner_id")
        check_duration(self.ttl_s, field="ttl_s")
        return self


class RegionFailover(msgspec.Struct, frozen=True):
    """Make ``to_region`` the active region (see :meth:`Ledger.region_failover`)."""

    to_region: str
    actor: str
    reason: str | None = None
    epoch_at_least: int = 0
    """The epoch to move to at least: fencing an old primary to the new primary's epoch."""

    def checked(self) -> Self:
        return msgspec.structs.replace(
            self,
            to_region=validate_region(self.to_region),
            actor=validate_actor(self.actor),
            reason=validate_reason(self.reason),
        )


class RegionChange(msgspec.Struct, frozen=True):
    settings: ClusterSettings
    """The cluster settings after the call."""
    changed: bool
    """False when ``to_region`` was already active at an epoch at least ``epoch_at_least``."""
    revoked: int
    """Leases whose owner was cleared."""


class LeasesRenew(msgspec.Struct, frozen=True):
    fences: list[Fence]
    ttl_s: float

    def checked(self) -> Self:
        check_duration(self.ttl_s, field="ttl_s")
        return self


class LeasesRelease(msgspec.Struct, frozen=True):
    fences: list[Fence]


class NodesHeartbeat(msgspec.Struct, frozen=True):
    node_id: str
    region: str
    ttl_s: float
    clock_offset_s: float | None = None
    """The node's measured clock offset to the ledger's clock, stored on its row."""
    planner_lag_s: dict[int, float] = msgspec.field(default_factory=dict)
    """The node's planner lag per partition it plans (at most the partition count of
    entries), stored on its row for ``GET /v1/cluster``."""

    def checked(self) -> Self:
        """A named node, a valid TTL and offset (the lags are checked against the cluster's
        partition count by :func:`~engine.ledger.checks.check_planner_lags`)."""
        check_not_empty(self.node_id, field="node_id")
        check_duration(self.ttl_s, field="ttl_s")
        return msgspec.structs.replace(self, clock_offset_s=check_clock_offset(self.clock_offset_s))


class PlannedExecution(msgspec.Struct, frozen=True):
    """A fire to record. ``status`` is ``queued``, or ``skipped`` with an ``error_code``."""

    schedule_id: str
    tenant_id: str
    task_type: str
    planned_at: datetime
    status: ExecutionStatus = ExecutionStatus.QUEUED
    error_code: str | None = None
    error_message: str | None = None


class ScheduleAdvance(msgspec.Struct, frozen=True):
    """Move ``next_run_at`` of a schedule, if it is still at ``expected_version``."""

    schedule_id: str
    next_run_at: datetime | None
    expected_version: int


class ExecutionsPlan(msgspec.Struct, frozen=True):
    fence: Fence
    executions: list[PlannedExecution]
    advances: list[ScheduleAdvance]
    checkpoint: datetime | None = None

    def checked(self) -> Self:
        """At most :data:`BATCH_ROWS_MAX` fires and advances; each fire ``queued``, or
        ``skipped`` with an ``error_code``; every instant aware (returned in UTC). Whether
        each schedule belongs to the fenced partition is checked against the cluster's
        count (:func:`~engine.ledger.checks.check_schedules_routed`). Rows that need no
        normalising are kept as they are: a planner's batch of thousands is not copied."""
        check_batch(len(self.executions), BATCH_ROWS_MAX, field="executions")
        check_batch(len(self.advances), BATCH_ROWS_MAX, field="advances")
        executions = []
        for fire in self.executions:
            status, planned_at = fire.status, fire.planned_at
            if status not in _PLANNABLE:
                raise InvalidField(f"a planned execution is queued or skipped, not {status}")
            if status == ExecutionStatus.SKIPPED and fire.error_code is None:
                raise InvalidField("a skipped execution must carry an error_code saying why")
            if type(status) is not ExecutionStatus or planned_at.tzinfo is not UTC:
                fire = msgspec.structs.replace(
                    fire,
                    status=ExecutionStatus(status),
                    planned_at=utc(planned_at, field="planned_at"),
                )
            executions.append(fire)
        advances = [
            advance
            if advance.next_run_at is None or advance.next_run_at.tzinfo is UTC
            else msgspec.structs.replace(
                advance, next_run_at=utc(advance.next_run_at, field="next_run_at")
            )
            for advance in self.advances
        ]
        return msgspec.structs.replace(
            self,
            executions=executions,
            advances=advances,
            checkpoint=utc_or_none(self.checkpoint, field="checkpoint"),
        )


class PlanResult(msgspec.Struct, frozen=True):
    inserted: list[str]
    """Ids of executions newly inserted (already present ones are not repeated here)."""
    advanced: list[str]
    """Schedule ids whose ``next_run_at`` moved."""
    stale: list[str]
    """Schedule ids not advanced: updated, deleted or moved since the planner read them."""


class DueCursor(msgspec.Struct, frozen=True):
    """A position in :meth:`Ledger.executions_due` order: the instant an execution may
    start (its planned time; a failed one's retry time) and its id."""

    startable_at: datetime
    execution_id: str


def due_cursor(execution: Execution) -> DueCursor:
    """The position of ``execution`` in :meth:`Ledger.executions_due` order: its
    :func:`~engine.model.startable_at`, then its id. ``ValueError`` for an execution that
    may not start (running or terminal): no due read returns one."""
    at = startable_at(execution)
    if at is None:
        raise ValueError(f"execution {execution.execution_id} is {execution.status}: not startable")
    return DueCursor(at, execution.execution_id)


class ExecutionsDue(msgspec.Struct, frozen=True):
    partition_ids: list[int]
    before: datetime
    limit: int = PAGE_SIZE_MAX
    after: DueCursor | None = None
    """Only executions after this position (keyset paging through a backlog)."""
    tenant_id: str | None = None
    """Only this tenant's executions (a dispatcher reading one tenant's backlog on its own,
    to hold the tenants by weight)."""

    def checked(self) -> Self:
        check_limit(self.limit, PAGE_SIZE_MAX)
        after = self.after
        if after is not None:
            after = DueCursor(
                utc(after.startable_at, field="after.startable_at"), after.execution_id
            )
        return msgspec.structs.replace(self, before=utc(self.before, field="before"), after=after)


class ExecutionsClaim(msgspec.Struct, frozen=True):
    fences: list[Fence]
    execution_ids: list[str]
    attempt_lease_s: float
    node_id: str

    def checked(self) -> Self:
        check_batch(len(self.execution_ids), BATCH_ROWS_MAX, field="execution_ids")
        check_duration(self.attempt_lease_s, field="attempt_lease_s")
        return self


class AttemptRef(msgspec.Struct, frozen=True):
    """One attempt of an execution: the execution's id and the attempt's number."""

    execution_id: str
    attempt: int


class ExecutionsExtend(msgspec.Struct, frozen=True):
    """Renew the attempt leases of attempts still running (a worker's heartbeat)."""

    fences: list[Fence]
    attempts: list[AttemptRef]
    attempt_lease_s: float

    def checked(self) -> Self:
        check_batch(len(self.attempts), BATCH_ROWS_MAX, field="attempts")
        check_duration(self.attempt_lease_s, field="attempt_lease_s")
        return self


class Outcome(enum.StrEnum):
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    DEAD_LETTER = "dead-letter"
    SKIPPED = "skipped"


_OUTCOMES: Final = frozenset(str(outcome) for outcome in Outcome)


class Completion(msgspec.Struct, frozen=True):
    execution_id: str
    attempt: int
    outcome: Outcome
    not_before: datetime | None = None
    """For ``failed``: when the retry may start."""
    error_code: str | None = None
    error_message: str | None = None
    started_at: datetime | None = None
    """For :class:`ExecutionsFinish` (required there): when the node started the handler.
    :class:`ExecutionsComplete` ignores it (the claim recorded the start)."""


class ExecutionsComplete(msgspec.Struct, frozen=True):
    fences: list[Fence]
    completions: list[Completion]

    def checked(self) -> Self:
        """At most :data:`BATCH_ROWS_MAX` completions, each of a known outcome, its retry
        instant aware (both returned normalised: an :class:`Outcome`, UTC). A batch that
        needs no normalising is returned as it is (the hot path)."""
        completions = _checked_completions(self.completions, started=False)
        if completions is self.completions:
            return self
        return msgspec.structs.replace(self, completions=completions)


class ExecutionsFinish(msgspec.Struct, frozen=True):
    """Finish *folded* attempts: attempts the node started without claiming them, so the
    ledger still has their executions startable (``queued``, or ``failed`` awaiting a retry).
    Each completion's ``attempt`` is the new attempt's number (the execution's + 1) and its
    ``started_at`` when the handler started (docs/ledger.md, "Folded claims")."""

    fences: list[Fence]
    completions: list[Completion]
    node_id: str

    def checked(self) -> Self:
        """As :meth:`ExecutionsComplete.checked`, and every completion has an aware
        ``started_at`` (returned in UTC)."""
        completions = _checked_completions(self.completions, started=True)
        if completions is self.completions:
            return self
        return msgspec.structs.replace(self, completions=completions)


def _checked_completions(completions: list[Completion], *, started: bool) -> list[Completion]:
    """``completions`` checked (see :meth:`ExecutionsComplete.checked`), the same list when
    nothing needed normalising; with ``started``, each must carry its ``started_at``."""
    check_batch(len(completions), BATCH_ROWS_MAX, field="completions")
    normal = True
    for completion in completions:
        outcome, not_before = completion.outcome, completion.not_before
        if outcome not in _OUTCOMES:
            raise InvalidField(f"unknown outcome {outcome!r}")
        if not_before is not None:
            utc(not_before, field="not_before")
            normal = normal and not_before.tzinfo is UTC
        if started:
            started_at = completion.started_at
            if started_at is None:
                raise InvalidField("a folded completion needs started_at")
            utc(started_at, field="started_at")
            normal = normal and started_at.tzinfo is UTC
        normal = normal and type(outcome) is Outcome
    if normal:
        return completions
    return [
        msgspec.structs.replace(
            completion,
            outcome=Outcome(completion.outcome),
            not_before=utc_or_none(completion.not_before, field="not_before"),
            started_at=utc_or_none(completion.started_at, field="started_at"),
        )
        for completion in completions
    ]


class CompleteResult(msgspec.Struct, frozen=True):
    applied: list[str]
    stale: list[str]
    """Not applied: not running, or running under another attempt number."""


class ExecutionsRequeueExpired(msgspec.Struct, frozen=True):
    fences: list[Fence]
    limit: int = BATCH_ROWS_MAX

    def checked(self) -> Self:
        check_limit(self.limit, BATCH_ROWS_MAX)
        return self


class ExecutionsQuery(msgspec.Struct, frozen=True):
    schedule_id: str | None = None
    tenant_id: str | None = None
    status: ExecutionStatus | None = None
    planned_from: datetime | None = None
    planned_to: datetime | None = None
    """Exclusive."""
    cursor: str | None = None
    limit: int = 100
    task_type: str | None = None
    finished_from: datetime | None = None
    """Inclusive; executions not finished (``finished_at`` unset) never match it."""

    def checked(self) -> Self:
        """A limit in range and aware instants (in UTC); the cursor is decoded by the
        backends (:func:`~engine.ledger.common.decode_planned_cursor`)."""
        check_limit(self.limit, PAGE_SIZE_MAX)
        return msgspec.structs.replace(
            self,
            planned_from=utc_or_none(self.planned_from, field="planned_from"),
            planned_to=utc_or_none(self.planned_to, field="planned_to"),
            finished_from=utc_or_none(self.finished_from, field="finished_from"),
        )


class ExecutionsSkip(msgspec.Struct, frozen=True):
    """Record not-yet-started executions as deliberately not run (e.g. the overlap policy)."""

    fences: list[Fence]
    execution_ids: list[str]
    error_code: str
    error_message: str | None = None

    def checked(self) -> Self:
        check_batch(len(self.execution_ids), BATCH_ROWS_MAX, field="execution_ids")
        if not self.error_code:
            raise InvalidField("a skipped execution must carry an error_code saying why")
        return self


class DeadLettersReplay(msgspec.Struct, frozen=True):
    """Replay dead letters, on behalf of ``actor`` (recorded in the audit trail with
    ``reason``; see :func:`~engine.model.validate_actor` and :func:`~engine.model.
    validate_reason`)."""

    execution_ids: list[str]
    actor: str
    reason: str | None = None

    def checked(self) -> Self:
        check_batch(len(self.execution_ids), BATCH_ROWS_MAX, field="execution_ids")
        return msgspec.structs.replace(
            self, actor=validate_actor(self.actor), reason=validate_reason(self.reason)
        )


class AuditQuery(msgspec.Struct, frozen=True):
    """Audit events matching every given filter, after ``after_event_id`` (a watermark)."""

    target: str | None = None
    action: str | None = None
    after_event_id: int | None = None
    limit: int = 100

    def checked(self) -> Self:
        check_limit(self.limit, PAGE_SIZE_MAX)
        return self


class ExecutionsPurge(msgspec.Struct, frozen=True):
    fence: Fence
    finished_before: datetime
    limit: int = BATCH_ROWS_MAX
    dead_letters: bool = False
    """``False``: succeeded and skipped executions; ``True``: dead letters only."""

    def checked(self) -> Self:
        check_limit(self.limit, BATCH_ROWS_MAX)
        return msgspec.structs.replace(
            self, finished_before=utc(self.finished_before, field="finished_before")
        )


class DeadLettersPurge(msgspec.Struct, frozen=True):
    """Delete dead letters for good, on behalf of ``actor`` (audited with ``reason``)."""

    execution_ids: list[str]
    actor: str
    reason: str | None = None

    def checked(self) -> Self:
        check_batch(len(self.execution_ids), BATCH_ROWS_MAX, field="execution_ids")
        return msgspec.structs.replace(
            self, actor=validate_actor(self.actor), reason=validate_reason(self.reason)
        )


class TaskTypesPut(msgspec.Struct, frozen=True):
    """Create or replace a task type. ``version`` and ``updated_at`` of the input are ignored.

    With ``expected_version``, applied only if the stored version equals it, an absent task
    type counting as version 0 (so ``expected_version=0`` means "create, never replace").
    """

    task_type: TaskType
    expected_version: int | None = None

    def checked(self) -> Self:
        """A well-formed task type (:func:`~engine.model.validate_task_type`), its settings
        a JSON round trip of the caller's (what is stored is what JSON can carry)."""
        task_type = validate_task_type(self.task_type)
        settings = msgspec.json.decode(msgspec.json.encode(task_type.settings))
        return msgspec.structs.replace(
            self, task_type=msgspec.structs.replace(task_type, settings=settings)
        )


class TenantsPut(msgspec.Struct, frozen=True):
    """Create or replace a tenant's dispatch settings; ``expected_version`` as in
    :class:`TaskTypesPut`."""

    tenant: Tenant
    expected_version: int | None = None

    def checked(self) -> Self:
        return msgspec.structs.replace(self, tenant=validate_tenant(self.tenant))


# --- the HTTP API's operations: tokens, operator-added executions, census ---------------


class TokensCreate(msgspec.Struct, frozen=True):
    """Store an API token, on behalf of ``actor``: its record and the SHA-256 of its secret
    (:data:`TOKEN_HASH_BYTES` bytes, computed by the caller; the secret never reaches the
    ledger)."""

    token: ApiToken
    token_hash: bytes
    actor: str

    def checked(self) -> Self:
        return msgspec.structs.replace(
            self,
            token=validate_api_token(self.token),
            token_hash=check_token_hash(self.token_hash),
            actor=validate_actor(self.actor),
        )


class TokensRevoke(msgspec.Struct, frozen=True):
    token_id: str
    actor: str

    def checked(self) -> Self:
        return msgspec.structs.replace(self, actor=validate_actor(self.actor))


SESSION_LIFETIME_S_MAX: Final = 30 * 86_400.0
"""The longest a console session may last (and so its idle timeout)."""
SESSIONS_PURGED_MAX: Final = 100
"""Sessions past their expiry that one ``sessions_create`` deletes at most."""


class SessionsCreate(msgspec.Struct, frozen=True):
    """Open a console session for ``token_id``: the SHA-256 of its id
    (:data:`TOKEN_HASH_BYTES` bytes, computed by the caller; the id never reaches the
    ledger), how long it may sit unused and how long it lasts at most."""

    session_hash: bytes
    token_id: str
    idle_timeout_s: float
    lifetime_s: float

    def checked(self) -> Self:
        """A well-formed hash, and ``0 < idle_timeout_s <= lifetime_s <=``
        :data:`SESSION_LIFETIME_S_MAX`."""
        check_session_hash(self.session_hash)
        idle, lifetime = self.idle_timeout_s, self.lifetime_s
        if not (
            isinstance(idle, int | float)
            and isinstance(lifetime, int | float)
            and math.isfinite(idle)
            and math.isfinite(lifetime)
            and 0 < idle <= lifetime <= SESSION_LIFETIME_S_MAX
        ):
            raise InvalidField(
                "a session needs 0 < idle_timeout_s <= lifetime_s <= "
                f"{SESSION_LIFETIME_S_MAX:g} seconds, got {idle!r} and {lifetime!r}"
            )
        return self


class ExecutionsTrigger(msgspec.Struct, frozen=True):
    """Run a schedule now, on behalf of ``actor`` (audited with ``reason``)."""

    schedule_id: str
    actor: str
    reason: str | None = None

    def checked(self) -> Self:
        return msgspec.structs.replace(
            self, actor=validate_actor(self.actor), reason=validate_reason(self.reason)
        )


class ExecutionsBackfill(msgspec.Struct, frozen=True):
    """Add the fires of a schedule at past instants ``planned_at``, on behalf of ``actor``."""

    schedule_id: str
    planned_at: list[datetime]
    actor: str
    reason: str | None = None

    def checked(self) -> Self:
        """At most :data:`BATCH_ROWS_MAX` aware instants, returned in UTC, in the order
        given, each once (by execution id); a valid actor and reason. (Whether they are past
        is judged by each backend against the ledger's clock: :func:`~engine.ledger.common.
        backfill_in_future`.)"""
        if len(self.planned_at) > BATCH_ROWS_MAX:
            raise InvalidField(
                f"a backfill carries {len(self.planned_at)} instants; at most {BATCH_ROWS_MAX} "
                "per call"
            )
        instants: dict[str, datetime] = {}
        for instant in self.planned_at:
            if instant.tzinfo is None or instant.utcoffset() is None:
                raise InvalidField(f"backfill instant {instant.isoformat()} has no UTC offset")
            at = instant.astimezone(UTC)
            instants.setdefault(execution_id(self.schedule_id, at), at)
        return msgspec.structs.replace(
            self,
            planned_at=list(instants.values()),
            actor=validate_actor(self.actor),
            reason=validate_reason(self.reason),
        )


class Backfilled(msgspec.Struct, frozen=True):
    """What :meth:`~engine.ledger.base.Ledger.executions_backfill` did."""

    inserted: list[str]
    """The ids inserted, in the order asked for, without repeats."""
    purged_through: datetime | None = None
    """The schedule's purge horizon: the latest planned instant of its executions that
    retention or a dead-letter purge removed (``None``: none was ever removed)."""
    skipped_purged: int = 0
    """Distinct instants asked for that were not backfilled because they are at or before
    ``purged_through``: their history is gone, and they may have run."""


class SchedulesCensus(msgspec.Struct, frozen=True):
    """Group the enabled live schedules (of one tenant, when given)."""

    tenant_id: str | None = None
    limit: int = CENSUS_GROUPS_MAX

    def checked(self) -> Self:
        check_limit(self.limit, CENSUS_GROUPS_MAX)
        return self


class ScheduleGroup(msgspec.Struct, frozen=True):
    """Enabled schedules that fire at the same instants: what a load forecast expands once
    and weighs by ``count`` instead of expanding every schedule.

    Expressions with ``H`` fields hash on the schedule id, so the members of such a group
    may fire at different instants: a forecast approximates them all by the group's sample.
    """

    cron_expr: str
    timezone: str
    dst_gap: DstGap
    dst_overlap: DstOverlap
    tenant_id: str
    task_type: str
    count: int
    sample_schedule_id: str
    """The smallest schedule id of the group (by code point)."""


class ExecutionsStats(msgspec.Struct, frozen=True):
    """Count the executions planned in ``[planned_from, planned_from + buckets * bucket_s)``
    (of one tenant, when given), per ``bucket_s`` bucket: what a dashboard charts."""

    planned_from: datetime
    bucket_s: int
    buckets: int
    on_time_s: float
    """A first attempt started at most this long after its planned instant is on time."""
    tenant_id: str | None = None

    def checked(self) -> Self:
        """Every bound checked; ``planned_from`` returned in UTC."""
        start = self.planned_from
        if start.tzinfo is None or start.utcoffset() is None:
            raise InvalidField(f"planned_from {start.isoformat()} has no UTC offset")
        for name, value, maximum in (
            ("buckets", self.buckets, STATS_BUCKETS_MAX),
            ("bucket_s", self.bucket_s, STATS_BUCKET_S_MAX),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= maximum:
                raise InvalidField(f"{name} must be an integer from 1 to {maximum}, got {value!r}")
        on_time_s = self.on_time_s
        if (
            isinstance(on_time_s, bool)
            or not isinstance(on_time_s, int | float)
            or not (math.isfinite(on_time_s) and on_time_s >= 0)
        ):
            raise InvalidField(
                f"on_time_s must be a finite number of seconds >= 0, got {on_time_s!r}"
            )
        return msgspec.structs.replace(self, planned_from=start.astimezone(UTC))


class ExecutionsBucket(msgspec.Struct, frozen=True):
    """One bucket of :class:`ExecutionsStats`. The first five count the executions *planned*
    in the bucket; ``starts`` and ``skips`` count what *happened* in it to the executions
    planned anywhere in the range."""

    planned: int = 0
    started: int = 0
    """Of those planned in the bucket: how many have started their first attempt."""
    on_time: int = 0
    """Of those started: how many started it at most ``on_time_s`` after their instant."""
    dead_letters: int = 0
    """Of those planned in the bucket: how many are dead letters now."""
    plan_lag_s_max: float = 0.0
    """The longest any of them waited to be written after its instant (0: none was late)."""
    starts: int = 0
    """First attempts that started within the bucket."""
    skips: int = 0
    """Executions skipped without an attempt (finished) within the bucket."""
