"""The HTTP API's half of :class:`~engine.ledger.memory.MemoryLedger`.

API tokens, executions an operator adds (trigger, backfill), the per-tenant schedule quota
and the schedule census. Like :mod:`engine.ledger._memory_admin` it is a mixin of that one
class: it owns no state but the token table, which the ledger creates, declares the ledger's
tables it reads and writes, and follows the ledger's rules (one trio checkpoint, then the
whole call without awaiting; the whole input is checked before anything changes).

Invariants
----------
* :class:`TokenTable` maps every stored hash to exactly one token and back; tokens are never
  deleted, so neither an id nor a hash is ever reused.
* An added execution is written under no lease (``fencing_token`` unset): these calls are
  not fenced, any node may serve them.
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime, timedelta

import msgspec
import trio

from engine.core.dst import DstGap, DstOverlap
from engine.errors import AlreadyExists, NotFound
from engine.ledger._memory_tables import AuditLog, ExecutionTable, VersionedTable, check_limit
from engine.ledger.base import (
    CENSUS_GROUPS_MAX,
    LIFECYCLE_SKIPS,
    SESSIONS_PURGED_MAX,
    Backfilled,
    ChangeKind,
    ExecutionsBackfill,
    ExecutionsBucket,
    ExecutionsStats,
    ExecutionsTrigger,
    ScheduleGroup,
    SchedulesCensus,
    SessionsCreate,
    TokensCreate,
    TokensRevoke,
)
from engine.ledger.common import (
    backfill_audit_details,
    backfill_in_future,
    backfill_instants,
    check_session_hash,
    check_sessions_create,
    check_stats,
    check_token_hash,
    no_session,
    not_purged,
    quota_exceeded,
    session_token_unusable,
    session_valid,
    token_audit_details,
    token_hash_taken,
    token_id_taken,
    trigger_audit_details,
    trigger_ids_taken,
    trigger_instants,
)
from engine.model import (
    ApiToken,
    AuditAction,
    ConsoleSession,
    Execution,
    ExecutionStatus,
    Schedule,
    Tenant,
    execution_id,
    validate_actor,
    validate_api_token,
    validate_reason,
)

_GroupKey = tuple[str, str, str, str, str, str]
"""cron_expr, timezone, dst_gap, dst_overlap, tenant_id, task_type."""


class TokenTable:
    """API tokens by id, and the index by hash that authentication reads."""

    def __init__(self) -> None:
        self._rows: dict[str, ApiToken] = {}
        self._ids_by_hash: dict[bytes, str] = {}

    def create(self, token: ApiToken, token_hash: bytes) -> ApiToken:
        if token.token_id in self._rows:
            raise token_id_taken(token.token_id)
        if token_hash in self._ids_by_hash:
            raise token_hash_taken()
        self._rows[token.token_id] = token
        self._ids_by_hash[token_hash] = token.token_id
        return token

    def get(self, token_id: str) -> ApiToken:
        token = self._rows.get(token_id)
        if token is None:
            raise NotFound(f"token {token_id!r} does not exist")
        return token

    def by_hash(self, token_hash: bytes) -> ApiToken:
        token_id = self._ids_by_hash.get(token_hash)
        if token_id is None:
            raise NotFound("no token has this secret")
        return self._rows[token_id]

    def replace(self, token: ApiToken) -> None:
        """Store a changed version of a stored token (its hash stays)."""
        self.get(token.token_id)
        self._rows[token.token_id] = token

    def rows(self) -> list[ApiToken]:
        return [self._rows[key] for key in sorted(self._rows)]


def added(schedule: Schedule, planned_at: datetime, now: datetime) -> Execution:
    """A new row an operator adds (trigger, backfill): ``queued`` like a planned fire,
    startable once ``planned_at`` has passed, written under no lease."""
    if schedule.partition_id is None:
        raise AssertionError(f"schedule {schedule.schedule_id} was stored without a partition")
    return Execution(
        execution_id=execution_id(schedule.schedule_id, planned_at),
        schedule_id=schedule.schedule_id,
        tenant_id=schedule.tenant_id,
        task_type=schedule.task_type,
        planned_at=planned_at,
        status=ExecutionStatus.QUEUED,
        enqueued_at=now,
        partition_id=schedule.partition_id,
    )


def revivable(execution: Execution, schedule: Schedule) -> bool:
    """Whether ``execution`` was skipped by a pause or a delete of ``schedule`` before it
    ever started (attempt 0), as a fire of ``schedule``'s tenant: one that resuming,
    re-creating or backfilling may queue again (:data:`LIFECYCLE_SKIPS`)."""
    return (
        execution.status is ExecutionStatus.SKIPPED
        and execution.error_code in LIFECYCLE_SKIPS
        and execution.attempt == 0
        and execution.tenant_id == schedule.tenant_id
    )


class ApiMethods:
    """API tokens, trigger and backfill, schedule quotas and the schedule census."""

    # The ledger's tables this half uses (set by MemoryLedger.__init__).
    _schedules: dict[str, Schedule]
    _executions: ExecutionTable
    _tenants: VersionedTable[Tenant]
    _audit: AuditLog
    _tokens: TokenTable
    _sessions: dict[bytes, ConsoleSession]

    # Provided by MemoryLedger.
    def _now(self) -> datetime:
        raise NotImplementedError

    def _live_schedule(self, schedule_id: str) -> Schedule:
        raise NotImplementedError

    def _record_change(self, schedule: Schedule, kind: ChangeKind) -> None:
        raise NotImplementedError

    # API tokens ----------------------------------------------------------------------------

    async def tokens_create(self, params: TokensCreate) -> ApiToken:
        await trio.lowlevel.checkpoint()
        token = validate_api_token(params.token)
        token_hash = check_token_hash(params.token_hash)
        actor = validate_actor(params.actor)
        now = self._now()
        stored = self._tokens.create(
            msgspec.structs.replace(token, created_at=now, revoked_at=None), token_hash
        )
        details = token_audit_details(stored, created=True)
        self._audit.append(now, actor, AuditAction.TOKEN_CREATE.value, token.token_id, details)
        return stored

    async def tokens_get_by_hash(self, token_hash: bytes) -> ApiToken:
        await trio.lowlevel.checkpoint()
        return self._tokens.by_hash(check_token_hash(token_hash))

    async def tokens_list(self) -> list[ApiToken]:
        await trio.lowlevel.checkpoint()
        return self._tokens.rows()

    async def tokens_revoke(self, params: TokensRevoke) -> ApiToken:
        await trio.lowlevel.checkpoint()
        actor = validate_actor(params.actor)
        token = self._tokens.get(params.token_id)
        if token.revoked_at is not None:
            return token
        now = self._now()
        revoked = msgspec.structs.replace(token, revoked_at=now)
        self._tokens.replace(revoked)
        for key, session in self._sessions.items():
            if session.token_id == token.token_id and session.revoked_at is None:
                self._sessions[key] = msgspec.structs.replace(session, revoked_at=now)
        details = token_audit_details(revoked, created=False)
        self._audit.append(now, actor, AuditAction.TOKEN_REVOKE.value, token.token_id, details)
        return revoked

    # console sessions ------------------------------------------------------------------------

    async def sessions_create(self, params: SessionsCreate) -> ConsoleSession:
        await trio.lowlevel.checkpoint()
        check_sessions_create(params)
        now = self._now()
        ended = sorted(
            (s.expires_at, key) for key, s in self._sessions.items() if s.expires_at <= now
        )
        for _, key in ended[:SESSIONS_PURGED_MAX]:
            del self._sessions[key]
        try:
            token = self._tokens.get(params.token_id)
        except NotFound:
            raise session_token_unusable(params.token_id) from None
        if token.revoked_at is not None:
            raise session_token_unusable(params.token_id)
        if params.session_hash in self._sessions:
            raise AlreadyExists("a session with this id exists already")
        session = ConsoleSession(
            token_id=token.token_id,
            scope=token.scope,
            created_at=now,
            last_seen_at=now,
            idle_timeout_s=float(params.idle_timeout_s),
            expires_at=now + timedelta(seconds=params.lifetime_s),
        )
        self._sessions[params.session_hash] = session
        return session

    async def sessions_touch(self, session_hash: bytes) -> ConsoleSession:
        await trio.lowlevel.checkpoint()
        check_session_hash(session_hash)
        now = self._now()
        session = self._sessions.get(session_hash)
        if session is None or not session_valid(session, now):
            raise no_session()
        if self._tokens.get(session.token_id).revoked_at is not None:
            raise no_session()
        touched = msgspec.structs.replace(session, last_seen_at=now)
        self._sessions[session_hash] = touched
        return touched

    async def sessions_revoke(self, session_hash: bytes) -> None:
        await trio.lowlevel.checkpoint()
        check_session_hash(session_hash)
        now = self._now()
        session = self._sessions.get(session_hash)
        if session is not None and session_valid(session, now):
            self._sessions[session_hash] = msgspec.structs.replace(session, revoked_at=now)

    # operator-added executions ---------------------------------------------------------------

    async def executions_trigger(self, params: ExecutionsTrigger) -> Execution:
        await trio.lowlevel.checkpoint()
        actor = validate_actor(params.actor)
        reason = validate_reason(params.reason)
        schedule = self._live_schedule(params.schedule_id)
        now = self._now()
        for at in trigger_instants(now):
            if self._executions.get(execution_id(schedule.schedule_id, at)) is None:
                break
        else:
            raise trigger_ids_taken(schedule.schedule_id)
        execution = added(schedule, at, now)
        self._executions.put(execution)
        details = trigger_audit_details(schedule.schedule_id, reason)
        action = AuditAction.SCHEDULE_TRIGGER.value
        self._audit.append(now, actor, action, execution.execution_id, details)
        self._record_change(schedule, ChangeKind.EXECUTIONS_ADDED)
        return execution

    async def executions_backfill(self, params: ExecutionsBackfill) -> Backfilled:
        await trio.lowlevel.checkpoint()
        instants = backfill_instants(params)
        actor = validate_actor(params.actor)
        reason = validate_reason(params.reason)
        schedule = self._live_schedule(params.schedule_id)
        horizon = self._executions.purged_through.get(schedule.schedule_id)
        if not instants:
            return Backfilled([], horizon)
        now = self._now()
        future = backfill_in_future(instants, now)
        if future is not None:
            raise future
        kept = not_purged(instants, horizon)
        inserted = []
        for at in kept:
            execution = added(schedule, at, now)
            existing = self._executions.get(execution.execution_id)
            if existing is None or revivable(existing, schedule):
                self._executions.put(execution)
                inserted.append(execution.execution_id)
        skipped = len(instants) - len(kept)
        details = backfill_audit_details(len(inserted), instants, reason, skipped)
        action = AuditAction.SCHEDULE_BACKFILL.value
        self._audit.append(now, actor, action, schedule.schedule_id, details)
        if inserted:
            self._record_change(schedule, ChangeKind.EXECUTIONS_ADDED)
        return Backfilled(inserted, horizon, skipped)

    # quotas and census -----------------------------------------------------------------------

    def _require_quotas(self, schedules: list[Schedule]) -> None:
        """``QuotaExceeded`` for the first tenant (by id) that ``schedules``, all new, would
        take past its ``schedules_max``."""
        asked = Counter(schedule.tenant_id for schedule in schedules)
        for tenant_id in sorted(asked):
            tenant = self._tenants.find(tenant_id)
            if tenant is None or tenant.schedules_max is None:
                continue
            count = self._live_count(tenant_id)
            if count + asked[tenant_id] > tenant.schedules_max:
                raise quota_exceeded(tenant_id, tenant.schedules_max, count, asked[tenant_id])

    def _live_count(self, tenant_id: str) -> int:
        return sum(1 for schedule in self._schedules.values() if schedule.tenant_id == tenant_id)

    async def schedules_count(self, tenant_id: str) -> int:
        await trio.lowlevel.checkpoint()
        return self._live_count(tenant_id)

    async def schedules_census(self, params: SchedulesCensus) -> list[ScheduleGroup]:
        await trio.lowlevel.checkpoint()
        check_limit(params.limit, CENSUS_GROUPS_MAX)
        groups: dict[_GroupKey, tuple[int, str]] = {}
        for schedule in self._schedules.values():
            if not schedule.enabled or params.tenant_id not in (None, schedule.tenant_id):
                continue
            key = (
                schedule.cron_expr,
                schedule.timezone,
                str(schedule.dst_gap),
                str(schedule.dst_overlap),
                schedule.tenant_id,
                schedule.task_type,
            )
            count, sample = groups.get(key, (0, schedule.schedule_id))
            groups[key] = (count + 1, min(sample, schedule.schedule_id))
        ordered = sorted(groups.items(), key=lambda item: (-item[1][0], item[0]))
        return [
            ScheduleGroup(
                cron_expr=cron_expr,
                timezone=timezone,
                dst_gap=DstGap(dst_gap),
                dst_overlap=DstOverlap(dst_overlap),
                tenant_id=tenant_id,
                task_type=task_type,
                count=count,
                sample_schedule_id=sample,
            )
            for (cron_expr, timezone, dst_gap, dst_overlap, tenant_id, task_type), (
                count,
                sample,
            ) in ordered[: params.limit]
        ]

    # execution statistics --------------------------------------------------------------------

    async def executions_stats(self, params: ExecutionsStats) -> list[ExecutionsBucket]:
        await trio.lowlevel.checkpoint()
        start = check_stats(params)
        bucket_s = params.bucket_s
        end = start + timedelta(seconds=bucket_s * params.buckets)
        on_time = timedelta(seconds=params.on_time_s)
        rows = [_Bucket() for _ in range(params.buckets)]

        def at(instant: datetime) -> _Bucket | None:
            index = int((instant - start).total_seconds() // bucket_s)
            return rows[index] if 0 <= index < len(rows) else None

        for execution in self._executions.everything():
            planned_at = execution.planned_at
            if not start <= planned_at < end or params.tenant_id not in (
                None,
                execution.tenant_id,
            ):
                continue
            first = self._first_start(execution)
            row = rows[int((planned_at - start).total_seconds() // bucket_s)]
            row.planned += 1
            row.dead_letters += execution.status is ExecutionStatus.DEAD_LETTER
            written = min(filter(None, (execution.enqueued_at, first)), default=planned_at)
            row.plan_lag_s_max = max(row.plan_lag_s_max, (written - planned_at).total_seconds())
            if first is not None:
                row.started += 1
                row.on_time += first - planned_at <= on_time
                if (when := at(first)) is not None:
                    when.starts += 1
            elif (
                execution.status is ExecutionStatus.SKIPPED
                and execution.finished_at is not None
                and (when := at(execution.finished_at)) is not None
            ):
                when.skips += 1
        return [row.frozen() for row in rows]

    def _first_start(self, execution: Execution) -> datetime | None:
        """When the execution's first attempt started (``None``: it has not)."""
        if execution.attempt == 1:
            return execution.started_at
        if execution.attempt > 1:
            history = self._executions.attempts(execution.execution_id)
            return next((a.started_at for a in history if a.attempt == 1), None)
        return None


class _Bucket:
    """A bucket of :meth:`ApiMethods.executions_stats` while it is counted."""

    def __init__(self) -> None:
        self.planned = self.started = self.on_time = self.dead_letters = 0
        self.starts = self.skips = 0
        self.plan_lag_s_max = 0.0

    def frozen(self) -> ExecutionsBucket:
        return ExecutionsBucket(
            self.planned,
            self.started,
            self.on_time,
            self.dead_letters,
            self.plan_lag_s_max,
            self.starts,
            self.skips,
        )
