"""The tables behind :class:`~engine.ledger.memory.MemoryLedger`, and its row transitions.

The memory twin of the Postgres schema (``engine/ledger/postgres/migrations/``) and of its
statements (``engine/ledger/postgres/sql*.py``).

Each table owns one kind of row and the indexes over it; the transition functions turn one
execution row into its next state (the ledger state machine, one function per edge). The
ledger composes both into transactions. Nothing here reads a clock (the ledger passes ``now``
in) or iterates a set without sorting it first, so the same calls give the same results.

Invariants
----------
* :class:`LeaseTable` has exactly one row per partition; a partition's fencing token only
  grows, by one per acquisition.
* :class:`ExecutionTable` indexes every stored execution by partition and by schedule, and
  keeps a second per-partition index of the non-terminal ones (the dispatch queue), so the
  hot paths (due, claim, re-queue) never scan terminal history, and an index of the
  running ones by task type (what a cluster-wide concurrency cap counts).
* :class:`ChangeFeed` numbers changes 1, 2, 3 ... in the order they are appended, which is
  the order their transactions commit (the memory ledger runs one method at a time).
* :class:`VersionedTable` gives a record version 1 when it is first stored and one more on
  every replacement; a write that expects another version changes nothing.
* :class:`AuditLog` only grows; its events are numbered 1, 2, 3 ... in append order, which
  is commit order, like the change feed.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any, Final, Generic, TypeVar

import msgspec
import trio

from engine.errors import LeaseLost, NotFound
from engine.ledger.common import (
    NO_TOKEN_WITH_HASH,
    not_found,
    token_hash_taken,
    token_id_taken,
    version_conflict,
)
from engine.ledger.params import (
    LIFECYCLE_SKIPS,
    Attempt,
    ChangeKind,
    Completion,
    Fence,
    Outcome,
    PlannedExecution,
    ScheduleChange,
)
from engine.model import (
    ApiToken,
    AuditEvent,
    Execution,
    ExecutionStatus,
    Lease,
    Schedule,
    TaskType,
    Tenant,
    execution_id,
)

# --- orders and keys -----------------------------------------------------------------------


def by_planned_time(execution: Execution) -> tuple[datetime, str]:
    """The order every execution listing uses: planned time, then id."""
    return execution.planned_at, execution.execution_id


# --- execution transitions ------------------------------------------------------------------

OUTCOME_EXPIRED = "expired"
"""Attempt outcome recorded when an attempt lease runs out."""


def attempt_expired(execution: Execution, now: datetime) -> bool:
    """Whether ``execution`` is running on an attempt lease that has run out."""
    expires_at = execution.attempt_expires_at
    return (
        execution.status is ExecutionStatus.RUNNING and expires_at is not None and expires_at <= now
    )


def planned(item: PlannedExecution, key: str, fence: Fence, now: datetime) -> Execution:
    """A new row for a planned fire: queued, or skipped (terminal at once)."""
    return Execution(
        execution_id=key,
        schedule_id=item.schedule_id,
        tenant_id=item.tenant_id,
        task_type=item.task_type,
        planned_at=item.planned_at,
        status=item.status,
        enqueued_at=now,
        finished_at=now if item.status is ExecutionStatus.SKIPPED else None,
        error_code=item.error_code,
        error_message=item.error_message,
        fencing_token=fence.fencing_token,
        partition_id=fence.partition_id,
    )


def claimed(execution: Execution, token: int, now: datetime, lease: timedelta) -> Execution:
    """``queued``/``failed`` -> ``running`` under the next attempt number."""
    return msgspec.structs.replace(
        execution,
        status=ExecutionStatus.RUNNING,
        attempt=execution.attempt + 1,
        started_at=now,
        attempt_expires_at=now + lease,
        not_before=None,
        error_code=None,
        error_message=None,
        fencing_token=token,
    )


def extended(execution: Execution, token: int, now: datetime, lease: timedelta) -> Execution:
    """``running`` stays ``running``, its attempt lease renewed until ``now + lease``."""
    return msgspec.structs.replace(execution, attempt_expires_at=now + lease, fencing_token=token)


def finished(
    execution: Execution, completion: Completion, token: int, now: datetime
) -> tuple[Execution, Attempt]:
    """``running`` -> the completion's outcome, with the attempt's history record."""
    failed = completion.outcome is Outcome.FAILED
    # A failure without a retry time may be retried at once.
    not_before = (completion.not_before or now) if failed else None
    row = msgspec.structs.replace(
        execution,
        status=ExecutionStatus(completion.outcome.value),
        not_before=not_before,
        finished_at=None if failed else now,
        attempt_expires_at=None,
        error_code=completion.error_code,
        error_message=completion.error_message,
        fencing_token=token,
    )
    attempt = Attempt(
        attempt=execution.attempt,
        outcome=completion.outcome.value,
        started_at=execution.started_at,
        finished_at=now,
        error_code=completion.error_code,
        error_message=completion.error_message,
    )
    return row, attempt


def folded(
    execution: Execution, completion: Completion, token: int, started_at: datetime, now: datetime
) -> tuple[Execution, Attempt]:
    """``queued``/``failed`` -> the completion's outcome under the next attempt number, with
    the attempt's history record: :func:`claimed` at ``started_at`` and :func:`finished` at
    ``now`` in one step (a folded claim; docs/ledger.md, "Folded claims")."""
    running = claimed(execution, token, started_at, timedelta(0))
    return finished(running, completion, token, now)


def requeued(execution: Execution, token: int, now: datetime) -> tuple[Execution, Attempt]:
    """``running`` with an expired attempt lease -> ``queued``; the attempt is ``expired``."""
    row = msgspec.structs.replace(
        execution,
        status=ExecutionStatus.QUEUED,
        attempt_expires_at=None,
        fencing_token=token,
    )
    attempt = Attempt(
        attempt=execution.attempt,
        outcome=OUTCOME_EXPIRED,
        started_at=execution.started_at,
        finished_at=now,
    )
    return row, attempt


def replayed(execution: Execution, now: datetime) -> Execution:
    """``dead-letter`` -> ``queued`` under the same id; the history keeps the errors."""
    return msgspec.structs.replace(
        execution,
        status=ExecutionStatus.QUEUED,
        enqueued_at=now,
        not_before=None,
        finished_at=None,
        error_code=None,
        error_message=None,
    )


def skipped_by_schedule(
    execution: Execution, now: datetime, error_code: str, error_message: str
) -> Execution:
    """Not yet started (``queued``/``failed``) -> ``skipped`` because its schedule was
    deleted or paused (``error_code`` says which)."""
    return msgspec.structs.replace(
        execution,
        status=ExecutionStatus.SKIPPED,
        error_code=error_code,
        error_message=error_message,
        not_before=None,
        finished_at=now,
    )


def skipped(
    execution: Execution, token: int, now: datetime, error_code: str, error_message: str | None
) -> Execution:
    """Not yet started (``queued``/``failed``) -> ``skipped`` on purpose (overlap policy)."""
    return msgspec.structs.replace(
        execution,
        status=ExecutionStatus.SKIPPED,
        error_code=error_code,
        error_message=error_message,
        not_before=None,
        finished_at=now,
        fencing_token=token,
    )


def added(schedule: Schedule, planned_at: datetime, now: datetime) -> Execution:
    """A new row an operator adds (trigger, backfill) or a pause or delete's skip revived
    (resume, re-create): ``queued`` like a planned fire, startable once ``planned_at`` has
    passed, written under no lease."""
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
    re-creating or backfilling may queue again (:data:`~engine.ledger.params.
    LIFECYCLE_SKIPS`)."""
    return (
        execution.status is ExecutionStatus.SKIPPED
        and execution.error_code in LIFECYCLE_SKIPS
        and execution.attempt == 0
        and execution.tenant_id == schedule.tenant_id
    )


# --- leases ---------------------------------------------------------------------------------


class LeaseTable:
    """One lease row per partition, and the fence check every ownership write goes through."""

    def __init__(self, partition_count: int) -> None:
        self._rows: dict[int, Lease] = {
            partition: Lease(
                partition_id=partition, owner_id=None, fencing_token=0, expires_at=None
            )
            for partition in range(partition_count)
        }

    def rows(self) -> list[Lease]:
        return [self._rows[partition] for partition in sorted(self._rows)]

    def holds(self, fence: Fence, now: datetime) -> bool:
        """Whether ``fence`` names the current owner and token of a lease live at ``now``."""
        row = self._rows.get(fence.partition_id)
        return (
            row is not None
            and row.owner_id == fence.owner_id
            and row.fencing_token == fence.fencing_token
            and row.expires_at is not None
            and row.expires_at > now
        )

    def require(self, fences: Iterable[Fence], now: datetime) -> dict[int, int]:
        """Each fenced partition's token; ``LeaseLost`` naming every fence that fails."""
        fences = list(fences)
        lost = sorted({fence.partition_id for fence in fences if not self.holds(fence, now)})
        if lost:
            raise LeaseLost(
                f"the lease of partition(s) {lost} is not held by the caller with its "
                "fencing token (taken over, released or expired); stop acting on them",
                partitions=tuple(lost),
            )
        return {fence.partition_id: fence.fencing_token for fence in fences}

    def acquire(
        self,
        owner_id: str,
        partition_ids: list[int],
        ttl: timedelta,
        now: datetime,
        *,
        token_floor: int = 1,
    ) -> list[Lease]:
        acquired = []
        for partition in partition_ids:
            row = self._rows[partition]
            if row.owner_id is not None and row.expires_at is not None and row.expires_at > now:
                continue
            row = Lease(
                partition_id=partition,
                owner_id=owner_id,
                fencing_token=max(row.fencing_token + 1, token_floor),
                expires_at=now + ttl,
            )
            self._rows[partition] = row
            acquired.append(row)
        return acquired

    def renew(self, fences: list[Fence], ttl: timedelta, now: datetime) -> list[Lease]:
        held = {fence.partition_id: fence for fence in fences if self.holds(fence, now)}
        for partition in sorted(held):
            self._rows[partition] = Lease(
                partition_id=partition,
                owner_id=held[partition].owner_id,
                fencing_token=held[partition].fencing_token,
                expires_at=now + ttl,
            )
        return [self._rows[partition] for partition in sorted(held)]

    def release(self, fences: list[Fence], now: datetime) -> int:
        held = {fence.partition_id: fence for fence in fences if self.holds(fence, now)}
        for partition in sorted(held):
            self._rows[partition] = Lease(
                partition_id=partition,
                owner_id=None,
                fencing_token=held[partition].fencing_token,
                expires_at=None,
            )
        return len(held)

    def revoke_all(self) -> int:
        """Clear every lease's owner (tokens kept); returns how many had one."""
        owned = [p for p, row in self._rows.items() if row.owner_id is not None]
        for partition in owned:
            row = self._rows[partition]
            self._rows[partition] = Lease(
                partition_id=partition,
                owner_id=None,
                fencing_token=row.fencing_token,
                expires_at=None,
            )
        return len(owned)


# --- executions -----------------------------------------------------------------------------


_UNFINISHED: Final = frozenset(
    {
        ExecutionStatus.QUEUED,
        ExecutionStatus.FAILED,
        ExecutionStatus.RUNNING,
        ExecutionStatus.DEAD_LETTER,
    }
)


class ExecutionTable:
    """Executions by id, their attempt histories, and the indexes the ledger scans."""

    def __init__(self) -> None:
        self._rows: dict[str, Execution] = {}
        self._attempts: dict[str, list[Attempt]] = {}
        self._by_partition: dict[int, set[str]] = {}
        self._open_by_partition: dict[int, set[str]] = {}
        self._by_schedule: dict[str, set[str]] = {}
        self._running_by_task_type: dict[str, set[str]] = {}
        self._order: list[str] | None = None
        """Every id by (planned_at, id), kept until an id is added or removed (a row's
        planned time never changes, so replacing a row keeps the order)."""
        self.purged_through: dict[str, datetime] = {}
        """By schedule id: the latest planned instant of its executions ever purged."""

    def __len__(self) -> int:
        return len(self._rows)

    def get(self, execution_id: str) -> Execution | None:
        return self._rows.get(execution_id)

    def attempts(self, execution_id: str) -> list[Attempt]:
        return list(self._attempts.get(execution_id, ()))

    def unfinished_of_task_type(self, task_type: str) -> dict[str, int]:
        """How many executions of ``task_type`` are not finished, by status: queued, failed
        (waiting for a retry), running, and dead letters (a replay runs them again)."""
        counts: dict[str, int] = {}
        for execution in self._rows.values():
            if execution.task_type == task_type and execution.status in _UNFINISHED:
                counts[str(execution.status)] = counts.get(str(execution.status), 0) + 1
        return counts

    def running_count(self, task_type: str) -> int:
        """How many executions of ``task_type`` are ``running``, in every partition."""
        return len(self._running_by_task_type.get(task_type, ()))

    def put(self, execution: Execution, attempt: Attempt | None = None) -> None:
        """Insert or replace ``execution``; append ``attempt`` to its history if given."""
        key = execution.execution_id
        partition = execution.partition_id
        previous = self._rows.get(key)
        if previous is not None and previous.partition_id != partition:
            raise AssertionError(f"execution {key} cannot move between partitions")
        if previous is None:
            self._order = None
        else:
            self._running_by_task_type.get(previous.task_type, set()).discard(key)
        if execution.status is ExecutionStatus.RUNNING:
            self._running_by_task_type.setdefault(execution.task_type, set()).add(key)
        self._rows[key] = execution
        self._by_partition.setdefault(partition, set()).add(key)
        self._by_schedule.setdefault(execution.schedule_id, set()).add(key)
        open_ids = self._open_by_partition.setdefault(partition, set())
        if execution.status.is_terminal:
            open_ids.discard(key)
        else:
            open_ids.add(key)
        if attempt is not None:
            self._attempts.setdefault(key, []).append(attempt)

    def purge(self, execution_id: str) -> Execution:
        """Remove an execution and its attempt history, moving its schedule's purge horizon
        on to its planned instant; returns it as it was."""
        execution = self._rows.pop(execution_id)
        horizon = self.purged_through.get(execution.schedule_id)
        if horizon is None or horizon < execution.planned_at:
            self.purged_through[execution.schedule_id] = execution.planned_at
        self._order = None
        partition = execution.partition_id
        self._attempts.pop(execution_id, None)
        self._by_partition[partition].discard(execution_id)
        self._open_by_partition[partition].discard(execution_id)
        self._by_schedule[execution.schedule_id].discard(execution_id)
        self._running_by_task_type.get(execution.task_type, set()).discard(execution_id)
        return execution

    def open_in(self, partition_ids: Iterable[int]) -> list[Execution]:
        """Non-terminal executions of the partitions, by planned time then id."""
        return self._sorted(
            key
            for partition in set(partition_ids)
            for key in self._open_by_partition.get(partition, ())
        )

    def in_partition(self, partition_id: int) -> list[Execution]:
        return self._sorted(self._by_partition.get(partition_id, ()))

    def in_partition_unordered(self, partition_id: int) -> list[Execution]:
        """:meth:`in_partition` without the sort, for callers that order what they pick."""
        return [self._rows[key] for key in self._by_partition.get(partition_id, ())]

    def of_schedule(self, schedule_id: str) -> list[Execution]:
        return self._sorted(self._by_schedule.get(schedule_id, ()))

    def everything(self) -> list[Execution]:
        if self._order is None:
            self._order = [row.execution_id for row in self._sorted(self._rows)]
        return [self._rows[key] for key in self._order]

    def _sorted(self, keys: Iterable[str]) -> list[Execution]:
        return sorted((self._rows[key] for key in keys), key=by_planned_time)


# --- schedule change feed -------------------------------------------------------------------


class ChangeFeed:
    """The schedule change log, pruned from its old end, and the event its waiters park on."""

    def __init__(self) -> None:
        self._changes: list[ScheduleChange] = []
        self._appended_at: list[datetime] = []
        self._appended = trio.Event()
        self._last_seq = 0
        self.pruned_through = 0
        """The newest ``seq`` pruned (0: none): every change up to it is gone."""

    @property
    def last_seq(self) -> int:
        return self._last_seq

    def copy(self) -> ChangeFeed:
        """The same log and pruned mark with waiters of its own (a simulated replica's)."""
        fresh = ChangeFeed()
        fresh._changes = list(self._changes)  # frozen rows: the list is the copy
        fresh._appended_at = list(self._appended_at)
        fresh._last_seq = self._last_seq
        fresh.pruned_through = self.pruned_through
        return fresh

    def append(
        self, schedule_id: str, partition_id: int, kind: ChangeKind, version: int, at: datetime
    ) -> ScheduleChange:
        self._last_seq += 1
        change = ScheduleChange(
            seq=self._last_seq,
            schedule_id=schedule_id,
            partition_id=partition_id,
            kind=kind,
            version=version,
        )
        self._changes.append(change)
        self._appended_at.append(at)
        # Wake everyone parked on the current event; later waiters park on a fresh one.
        self._appended.set()
        self._appended = trio.Event()
        return change

    def since(self, after_seq: int, limit: int) -> list[ScheduleChange]:
        # The kept changes are seq pruned_through + 1, + 2, ... from index 0.
        start = max(after_seq - self.pruned_through, 0)
        return self._changes[start : start + limit]

    def prune(self, before: datetime, limit: int) -> int:
        """Drop the oldest changes appended before ``before`` (a prefix), at most ``limit``."""
        count = 0
        while count < min(limit, len(self._appended_at)) and self._appended_at[count] < before:
            count += 1
        if count:
            self.pruned_through = self._changes[count - 1].seq
            del self._changes[:count]
            del self._appended_at[:count]
        return count

    async def wait_after(self, after_seq: int, timeout_s: float) -> bool:
        """``True`` once a change newer than ``after_seq`` exists, ``False`` on timeout."""
        if self.last_seq > after_seq:
            return True
        appended = self._appended
        with trio.move_on_after(timeout_s):
            await appended.wait()
            return True
        return False


# --- versioned configuration records ------------------------------------------------------

R = TypeVar("R", TaskType, Tenant)


class VersionedTable(Generic[R]):
    """Records by key with optimistic versions: the task types and tenants tables."""

    def __init__(self, what: str, *, absent: str = "does not exist") -> None:
        self._what = what
        self._absent = absent
        self._rows: dict[str, R] = {}

    def __contains__(self, key: str) -> bool:
        return key in self._rows

    def get(self, key: str) -> R:
        row = self._rows.get(key)
        if row is None:
            raise not_found(self._what, key, self._absent)
        return row

    def find(self, key: str) -> R | None:
        """The record, or ``None`` if absent."""
        return self._rows.get(key)

    def rows(self) -> list[R]:
        return [self._rows[key] for key in sorted(self._rows)]

    def check_version(self, key: str, expected_version: int | None) -> None:
        """``VersionConflict`` if ``expected_version`` is given and is not the current
        version of ``key`` (0 when absent)."""
        current = self._rows.get(key)
        version = 0 if current is None else current.version
        if expected_version is not None and expected_version != version:
            raise version_conflict(
                self._what, key, None if current is None else version, expected_version
            )

    def put(self, key: str, record: R, expected_version: int | None, now: datetime) -> R:
        """Store ``record`` under the next version; ``VersionConflict`` if
        ``expected_version`` is given and is not the current one (0 when absent)."""
        self.check_version(key, expected_version)
        current = self._rows.get(key)
        version = 0 if current is None else current.version
        stored = msgspec.structs.replace(record, version=version + 1, updated_at=now)
        self._rows[key] = stored
        return stored

    def delete(self, key: str) -> R:
        row = self.get(key)
        del self._rows[key]
        return row


# --- audit trail ----------------------------------------------------------------------------


class AuditLog:
    """The append-only audit trail: event ``n`` lives at index ``n - 1``."""

    def __init__(self) -> None:
        self._events: list[AuditEvent] = []

    def append(
        self, at: datetime, actor: str, action: str, target: str, details: dict[str, Any]
    ) -> AuditEvent:
        event = AuditEvent(
            event_id=len(self._events) + 1,
            at=at,
            actor=actor,
            action=action,
            target=target,
            # A JSON round trip, as Postgres stores it: the caller's dict cannot reach it.
            details=msgspec.json.decode(msgspec.json.encode(details)),
        )
        self._events.append(event)
        return event

    def matching(
        self, target: str | None, action: str | None, after_event_id: int | None, limit: int
    ) -> list[AuditEvent]:
        """Up to ``limit`` events after ``after_event_id`` with that target and action."""
        found: list[AuditEvent] = []
        for event in self._events[max(after_event_id or 0, 0) :]:
            if target not in (None, event.target) or action not in (None, event.action):
                continue
            found.append(event)
            if len(found) == limit:
                break
        return found


# --- API tokens -------------------------------------------------------------------------------


class TokenTable:
    """API tokens by id, and the index by hash that authentication reads. Every stored hash
    maps to exactly one token and back; tokens are never deleted, so neither an id nor a
    hash is ever reused."""

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
            raise not_found("token", token_id)
        return token

    def by_hash(self, token_hash: bytes) -> ApiToken:
        token_id = self._ids_by_hash.get(token_hash)
        if token_id is None:
            raise NotFound(NO_TOKEN_WITH_HASH)
        return self._rows[token_id]

    def replace(self, token: ApiToken) -> None:
        """Store a changed version of a stored token (its hash stays)."""
        self.get(token.token_id)
        self._rows[token.token_id] = token

    def rows(self) -> list[ApiToken]:
        return [self._rows[key] for key in sorted(self._rows)]
