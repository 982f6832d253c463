"""What both ledger backends make the same way: cursors, audit details, the checks of the
operator-facing calls' input, and the errors whose messages they share.

Part of the contract of :mod:`engine.ledger.base`: a backend that builds an audit event's
details or a refusal's message calls these, so that the two backends agree to the
character (the contract suite compares them). The checks of a call's input are the
parameter objects' own (:mod:`engine.ledger.params`, :mod:`engine.ledger.checks`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, Final

import msgspec

from engine.core.instants import format_utc
from engine.core.timetable import Timetable
from engine.errors import (
    AlreadyExists,
    ChangesPruned,
    InUse,
    InvalidField,
    NotFound,
    QuotaExceeded,
    ValidationError,
    VersionConflict,
)
from engine.ledger.params import (
    ClusterSettings,
)
from engine.model import (
    ALL_TENANTS,
    ApiToken,
    ConsoleSession,
    Schedule,
    TaskType,
)

# --- cursors ------------------------------------------------------------------------------


def encode_cursor(*parts: Any) -> str:
    """An opaque pagination cursor."""
    return msgspec.json.encode(list(parts)).hex()


def decode_cursor(cursor: str) -> list[Any]:
    """The parts of a cursor made by :func:`encode_cursor`; ``InvalidField`` if forged."""
    try:
        parts = msgspec.json.decode(bytes.fromhex(cursor))
    except (ValueError, msgspec.DecodeError):
        raise InvalidField("the pagination cursor is malformed") from None
    if not isinstance(parts, list):
        raise InvalidField("the pagination cursor is malformed")
    return parts


def decode_id_cursor(cursor: str) -> str:
    """The id a listing cursor (of :func:`encode_cursor`) resumes after."""
    parts = decode_cursor(cursor)
    if len(parts) != 1 or not isinstance(parts[0], str) or "\x00" in parts[0]:
        raise InvalidField("the pagination cursor is malformed")
    return parts[0]


def decode_planned_cursor(cursor: str) -> tuple[datetime, str]:
    """The ``(planned_at, execution_id)`` an execution query's cursor resumes after. A
    forged cursor must not reach SQL with a NUL (text cannot hold one) or an instant outside
    the datetime range once in UTC."""
    parts = decode_cursor(cursor)
    if len(parts) != 2 or not all(isinstance(part, str) and "\x00" not in part for part in parts):
        raise InvalidField("the pagination cursor is malformed")
    try:
        planned_at = datetime.fromisoformat(parts[0])
        at = None if planned_at.tzinfo is None else planned_at.astimezone(UTC)
    except (ValueError, OverflowError):  # not a timestamp, or out of range once in UTC
        at = None
    if at is None:
        raise InvalidField("the pagination cursor is malformed")
    return at, parts[1]


def encode_planned_cursor(planned_at: datetime, execution_id_: str) -> str:
    """The cursor of an execution query that resumes after ``(planned_at, execution_id_)``."""
    return encode_cursor(format_utc(planned_at), execution_id_)


# --- audit details --------------------------------------------------------------------------


def replay_audit_details(
    reason: str | None, attempt: int, error_code: str | None
) -> dict[str, Any]:
    """The ``details`` of a ``dead_letter.replay`` audit event."""
    return {"reason": reason, "attempt": attempt, "error_code": error_code}


def region_failover_details(
    before: ClusterSettings, after: ClusterSettings, revoked: int, reason: str | None
) -> dict[str, Any]:
    """The ``details`` of a ``region.failover`` audit event."""
    return {
        "from_region": before.active_region,
        "from_epoch": before.region_epoch,
        "to_epoch": after.region_epoch,
        "revoked": revoked,
        "reason": reason,
    }


def trigger_audit_details(schedule_id: str, reason: str | None) -> dict[str, Any]:
    """The ``details`` of a ``schedule.trigger`` audit event."""
    return {"schedule_id": schedule_id, "reason": reason}


def backfill_audit_details(
    inserted: int, instants: list[datetime], reason: str | None, skipped_purged: int
) -> dict[str, Any]:
    """The ``details`` of a ``schedule.backfill`` audit event: how many executions were
    inserted of the ``instants`` asked for, the earliest and latest of those, and how many
    were left out as purged history."""
    return {
        "inserted": inserted,
        "requested": len(instants),
        "first": format_utc(min(instants)),
        "last": format_utc(max(instants)),
        "reason": reason,
        "skipped_purged": skipped_purged,
    }


def dead_letter_purge_details(
    reason: str | None, attempt: int, error_code: str | None, schedule_id: str
) -> dict[str, Any]:
    """The ``details`` of a ``dead_letter.purge`` audit event."""
    return {
        "reason": reason,
        "attempt": attempt,
        "error_code": error_code,
        "schedule_id": schedule_id,
    }


def not_purged(instants: list[datetime], purged_through: datetime | None) -> list[datetime]:
    """The backfill ``instants`` after a schedule's purge horizon (all of them without one)."""
    if purged_through is None:
        return instants
    return [at for at in instants if at > purged_through]


def token_audit_details(token: ApiToken, *, created: bool) -> dict[str, Any]:
    """The ``details`` of a ``token.create`` (``created``) or ``token.revoke`` event."""
    if created:
        return {"scope": token.scope, "description": token.description}
    return {"scope": token.scope}


def changes_pruned(after_seq: int, pruned_through: int) -> ChangesPruned:
    """The error for a change-feed read below the pruned part of the feed."""
    return ChangesPruned(
        f"the schedule change feed is pruned through seq {pruned_through}; a reader at "
        f"{after_seq} may have missed changes and must reload",
        pruned_through=pruned_through,
    )


# --- triggers, backfills and sessions --------------------------------------------------------

TRIGGER_ID_TRIES_MAX: Final = 1_000
"""Instants a trigger tries, a microsecond apart, looking for a free execution id before it
gives up (each taken one is a run already triggered or planned at that very microsecond)."""


def trigger_instants(now: datetime) -> Iterator[datetime]:
    """The instants a trigger at ledger time ``now`` may take, in order of preference: ``now``
    and the microseconds after it, :data:`TRIGGER_ID_TRIES_MAX` of them, leaving out whole
    seconds. Every cron fire is at a whole second, so a manual run never takes the id of a
    fire the planner has yet to plan (which would then be lost to ``ON CONFLICT``)."""
    at = now
    tried = 0
    while tried < TRIGGER_ID_TRIES_MAX:
        if at.microsecond:
            yield at
            tried += 1
        at += timedelta(microseconds=1)


def session_token_unusable(token_id: str) -> NotFound:
    """The error for opening a session with a token that does not exist or is revoked."""
    return NotFound(f"token {token_id!r} does not exist or is revoked")


def no_session() -> NotFound:
    """The error for a session that is unknown, revoked, expired or idle too long."""
    return NotFound("no such session, or it ended")


def session_valid(session: ConsoleSession, now: datetime) -> bool:
    """Whether ``session`` is usable at ``now`` (its token's revocation aside)."""
    idle_until = session.last_seen_at + timedelta(seconds=session.idle_timeout_s)
    return session.revoked_at is None and now < session.expires_at and now < idle_until


def backfill_in_future(instants: list[datetime], now: datetime) -> InvalidField | None:
    """The error for backfill instants later than the ledger's ``now``, or ``None``."""
    later = [instant for instant in instants if instant > now]
    if not later:
        return None
    return InvalidField(
        f"backfill instant {format_utc(min(later))} is later than the ledger's clock "
        f"({format_utc(now)}): only past fires can be backfilled, the planner makes the "
        "future ones (nothing was added)"
    )


def fires_among(schedule: Schedule, instants: Iterable[datetime]) -> set[datetime]:
    """The instants of ``instants`` (aware) at which ``schedule``'s timetable -- its
    expression, zone and DST policy as they are now -- fires: what resuming or re-creating
    it may revive (a fire of an older timetable that the schedule no longer has stays
    skipped). None if its timing does not compile (it is never planned either)."""
    wanted = sorted({instant.astimezone(UTC) for instant in instants})
    if not wanted:
        return set()
    try:
        timetable = Timetable.compile(
            schedule.cron_expr,
            schedule.timezone,
            dst_gap=schedule.dst_gap,
            dst_overlap=schedule.dst_overlap,
            schedule_id=schedule.schedule_id,
        )
        tick = timedelta(microseconds=1)
        return {at for at in wanted if timetable.next_fire(at - tick).planned_at == at}
    except ValidationError:
        return set()


# --- errors ---------------------------------------------------------------------------------

IN_USE_SHOWN_MAX: Final = 5
"""How many schedule ids a refused task-type delete names."""


NO_TOKEN_WITH_HASH: Final = "no token has this secret"
TENANT_DEFAULTS: Final = "has no stored settings (it has the defaults)"
"""What a tenant without a stored row is said to be (``tenants_get``'s ``NotFound``)."""


def not_found(what: str, key: str, state: str = "does not exist") -> NotFound:
    """The error for a record that is not there (``what``: "schedule", "task type", ...)."""
    return NotFound(f"{what} {key!r} {state}")


def version_conflict(
    what: str, key: str, current: int | None, expected: int | None
) -> VersionConflict:
    """The error for a versioned write whose ``expected`` version is not the stored one
    (``current``; ``None`` when the record does not exist)."""
    state = f"does not exist, not version {expected}"
    if current is not None:
        state = f"is at version {current}, not {expected}"
    return VersionConflict(f"{what} {key!r} {state}; re-read it and apply the change again")


def unknown_task_types(unknown: list[tuple[str, str]]) -> InvalidField:
    """The error for schedules naming task types that do not exist or that their tenant may
    not use (``unknown``: sorted ``(task type, tenant)`` pairs). The two read the same, so a
    tenant cannot tell another tenant's task type from one that does not exist."""
    why = "it does not exist, or is not granted to that tenant"
    if len(unknown) == 1:
        ((name, tenant),) = unknown
        return InvalidField(
            f"unknown task type {name!r} for tenant {tenant!r} ({why}); an admin creates or "
            f"grants it with `carillon task-type set {name} --kind ... --allow {tenant}`"
        )
    tenants: dict[str, list[str]] = {}
    for name, tenant in unknown:
        tenants.setdefault(name, []).append(repr(tenant))
    shown = ", ".join(
        f"{name!r} for tenant {listed[0]}"
        if len(listed) == 1
        else f"{name!r} for tenants {', '.join(listed[:5])}"
        + (f" and {len(listed) - 5} more" if len(listed) > 5 else "")
        for name, listed in tenants.items()
    )
    return InvalidField(
        f"unknown task types {shown} (each does not exist, or is not granted to that tenant); "
        "an admin creates or grants each with `carillon task-type set NAME --kind ... --allow "
        "TENANT`"
    )


def unusable_task_types(
    schedules: Iterable[Schedule], found: Mapping[str, TaskType]
) -> list[tuple[str, str]]:
    """The sorted ``(task type, tenant)`` pairs of ``schedules`` whose task type is not in
    ``found`` or not usable by the schedule's tenant."""
    pairs = {(schedule.task_type, schedule.tenant_id) for schedule in schedules}
    return sorted(
        (name, tenant)
        for name, tenant in pairs
        if name not in found or not found[name].usable_by(tenant)
    )


def task_type_runs_in_use(name: str, counts: Mapping[str, int]) -> InUse:
    """The error for deleting a task type that unfinished runs still name (``counts``: by
    status, ``queued``, ``failed`` (waiting for a retry), ``running`` and ``dead-letter``)."""
    parts = [
        f"{counts[status]} {one if counts[status] == 1 else many}"
        for status, one, many in (
            ("queued", "queued", "queued"),
            ("failed", "waiting for a retry", "waiting for a retry"),
            ("running", "running", "running"),
            ("dead-letter", "dead letter", "dead letters"),
        )
        if counts.get(status)
    ]
    total = sum(counts.values())
    noun = "run" if total == 1 else "runs"
    return InUse(
        f"task type {name!r} is still named by {total} unfinished {noun} ({', '.join(parts)}); "
        "they would fail without it: let them finish, skip or delete their schedules' runs, "
        "and replay or purge its dead letters first"
    )


def task_type_grant_in_use(name: str, tenants: list[tuple[str, int]]) -> InUse:
    """The error for a task-type change that would take it away from tenants whose live
    schedules name it (``tenants``: sorted ``(tenant, live schedules)`` pairs)."""
    shown = ", ".join(f"{tenant!r} ({count})" for tenant, count in tenants[:IN_USE_SHOWN_MAX])
    more = f" and {len(tenants) - IN_USE_SHOWN_MAX} more" if len(tenants) > IN_USE_SHOWN_MAX else ""
    return InUse(
        f"task type {name!r} is still named by live schedules of tenants it would no longer be "
        f"available to: {shown}{more}; keep those tenants in allowed_tenants, or move their "
        "schedules to another task type first"
    )


def lost_users(before: TaskType, after: TaskType) -> bool:
    """Whether some tenant that may use ``before`` may not use ``after`` (then the change
    must check the live schedules of the tenants it takes the task type away from)."""
    if after.tenant_id is None and ALL_TENANTS in (after.allowed_tenants or ()):
        return False
    if before.tenant_id is not None:
        return not after.usable_by(before.tenant_id)
    granted = before.allowed_tenants or ()
    return ALL_TENANTS in granted or any(not after.usable_by(tenant) for tenant in granted)


def task_type_in_use(name: str, count: int, schedule_ids: list[str]) -> InUse:
    """The error for deleting a task type that ``count`` live schedules still name
    (``schedule_ids``: the first few, by id)."""
    shown = ", ".join(schedule_ids[:IN_USE_SHOWN_MAX])
    more = f" and {count - IN_USE_SHOWN_MAX} more" if count > IN_USE_SHOWN_MAX else ""
    noun = "schedule" if count == 1 else "schedules"
    return InUse(
        f"task type {name!r} is still used by {count} {noun} ({shown}{more}); delete them or "
        "move them to another task type first"
    )


def quota_exceeded(tenant_id: str, quota: int, count: int, requested: int) -> QuotaExceeded:
    """The error for a create that would give ``tenant_id`` more than ``quota`` schedules:
    it owns ``count`` live ones and the call asked for ``requested`` more."""
    noun = "schedule" if count == 1 else "schedules"
    return QuotaExceeded(
        f"tenant {tenant_id!r} may own at most {quota} schedules: it owns {count} {noun} and "
        f"{requested} more were asked for; delete schedules or raise its schedules_max first "
        "(nothing was created)",
        tenant_id=tenant_id,
        quota=quota,
        count=count,
        requested=requested,
    )


def schedules_exist(ids: list[str]) -> AlreadyExists:
    """The error for creating schedules whose ids are live (``ids``: sorted)."""
    shown = ", ".join(ids[:10]) + (f" and {len(ids) - 10} more" if len(ids) > 10 else "")
    return AlreadyExists(f"schedules already exist: {shown}", ids=tuple(ids))


def token_id_taken(token_id: str) -> AlreadyExists:
    """The error for creating a token under an id that exists (revoked ones included)."""
    return AlreadyExists(
        f"token {token_id!r} exists already (ids of revoked tokens are not reused either)",
        ids=(token_id,),
    )


def token_hash_taken() -> AlreadyExists:
    """The error for creating a token whose secret another token has."""
    return AlreadyExists(
        "a token with this secret exists already; give every token a secret of its own"
    )


def trigger_ids_taken(schedule_id: str) -> AlreadyExists:
    """The error for a trigger that found no free execution id near the ledger's now."""
    return AlreadyExists(
        f"schedule {schedule_id!r} has executions at each of the next {TRIGGER_ID_TRIES_MAX} "
        "microseconds; try again"
    )
