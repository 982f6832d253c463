"""Planning and execution operations (asyncio side; one coroutine per ledger method).

Every ownership-dependent operation either runs entirely under valid leases or changes
nothing: multi-statement ones open their transaction with
:func:`~engine.ledger.postgres.fencing.require_fences`; claim and complete, the hot path,
are single statements that check their fences themselves (see
:mod:`~engine.ledger.postgres.fencing`). Ids are checked against the fenced partitions in Python
first (``partition_of`` of the schedule id, the part of an execution id before its first
colon), so a misrouted id is refused before any round trip.

Results list ids in the order the caller gave them, without repeats. A claim's statements,
with the cluster-wide concurrency caps, are in :mod:`~engine.ledger.postgres.caps`;
dead-letter replay and the audit trail in :mod:`~engine.ledger.postgres.audit`.
"""

from __future__ import annotations

import functools
from datetime import UTC, datetime
from typing import Any, Final

import asyncpg

from engine.core.hashing import partition_of
from engine.core.instants import format_utc, parse_instant
from engine.errors import InvalidField, LeaseLost, NotFound
from engine.ledger.base import (
    BATCH_ROWS_MAX,
    PAGE_SIZE_MAX,
    Attempt,
    CompleteResult,
    ExecutionDetail,
    ExecutionsClaim,
    ExecutionsComplete,
    ExecutionsDue,
    ExecutionsExtend,
    ExecutionsPlan,
    ExecutionsPurge,
    ExecutionsQuery,
    ExecutionsRequeueExpired,
    ExecutionsSkip,
    Fence,
    Outcome,
    Page,
    PlanResult,
    ScheduleAdvance,
    decode_cursor,
    encode_cursor,
)
from engine.ledger.postgres import caps, sql, sql_executions
from engine.ledger.postgres.fencing import check_held, fence_arrays, require_fences
from engine.ledger.postgres.rows import (
    attempt_from_row,
    aware,
    aware_or_none,
    check_batch,
    check_duration,
    check_limit,
    execution_from_columns,
    in_order,
    int_array,
    text_array,
    timestamptz_array,
    unique,
)
from engine.ledger.postgres.store import Store
from engine.model import Execution, ExecutionStatus, execution_id, parse_execution_id

_PLANNABLE = frozenset({ExecutionStatus.QUEUED, ExecutionStatus.SKIPPED})
_OUTCOMES: Final = frozenset(str(outcome) for outcome in Outcome)


async def executions_plan(store: Store, params: ExecutionsPlan) -> PlanResult:
    fence, planned, advances = params.fence, params.executions, params.advances
    check_batch(planned, BATCH_ROWS_MAX, what="executions")
    check_batch(advances, BATCH_ROWS_MAX, what="schedule advances")
    named = [p.schedule_id for p in planned] + [a.schedule_id for a in advances]
    _check_partition(named, {fence.partition_id}, store.partition_count, what="schedule")
    for fire in planned:
        aware(fire.planned_at, field="planned_at")
        if fire.status not in _PLANNABLE:
            raise InvalidField(f"a planned execution is queued or skipped, not {fire.status}")
        if fire.status == ExecutionStatus.SKIPPED and fire.error_code is None:
            raise InvalidField("a skipped execution must carry an error_code saying why")
    for advance in advances:
        aware_or_none(advance.next_run_at, field="next_run_at")
    checkpoint = aware_or_none(params.checkpoint, field="checkpoint")
    ids = [execution_id(fire.schedule_id, fire.planned_at) for fire in planned]

    inserted: list[str] = []
    await store.check_schedules_statistics()
    async with store.transaction() as connection:
        await require_fences(connection, [fence])
        if planned:
            rows = await connection.fetch(
                sql.SCHEDULES_LOCK_LIVE, unique(p.schedule_id for p in planned)
            )
            live = {row["schedule_id"] for row in rows}
            keep = [n for n, fire in enumerate(planned) if fire.schedule_id in live]
            fires = [planned[n] for n in keep]
            kept_ids = [ids[n] for n in keep]
            if fires:
                rows = await connection.fetch(
                    sql.EXECUTIONS_INSERT_PLANNED,
                    kept_ids,
                    [p.schedule_id for p in fires],
                    [p.tenant_id for p in fires],
                    [p.task_type for p in fires],
                    [p.planned_at for p in fires],
                    [str(p.status) for p in fires],
                    [p.error_code for p in fires],
                    [p.error_message for p in fires],
                    fence.partition_id,
                    fence.fencing_token,
                )
                inserted = in_order(kept_ids, (row["execution_id"] for row in rows))
        advanced = await _advance(connection, advances)
        if checkpoint is not None:
            await connection.execute(sql.CHECKPOINT_ADVANCE, fence.partition_id, checkpoint)
    if inserted:
        await store.note_planned(len(inserted))
    moved = set(advanced)
    stale = [a.schedule_id for a in advances if a.schedule_id not in moved]
    return PlanResult(inserted=inserted, advanced=advanced, stale=stale)


async def _advance(connection: asyncpg.Connection, advances: list[ScheduleAdvance]) -> list[str]:
    """The schedule ids whose ``next_run_at`` moved, in the order given."""
    if len(unique(a.schedule_id for a in advances)) == len(advances):
        rows = await connection.fetch(
            sql.SCHEDULES_ADVANCE,
            [a.schedule_id for a in advances],
            [a.next_run_at for a in advances],
            [a.expected_version for a in advances],
        )
        return in_order((a.schedule_id for a in advances), (row[0] for row in rows))
    # A schedule named twice: one UPDATE ... FROM would apply an arbitrary one of them, so
    # apply them one by one, in order, as the contract's sequential reading has it.
    advanced = []
    for advance in advances:
        row = await connection.fetchrow(
            sql.SCHEDULE_ADVANCE_ONE,
            advance.schedule_id,
            advance.next_run_at,
            advance.expected_version,
        )
        if row is not None:
            advanced.append(advance.schedule_id)
    return advanced


_NO_CURSOR: Final = (datetime(1, 1, 1, tzinfo=UTC), "")
"""Before every execution in ``executions_due`` order."""


async def executions_due(store: Store, params: ExecutionsDue) -> list[Execution]:
    limit = check_limit(params.limit, PAGE_SIZE_MAX)
    before = aware(params.before, field="before")
    if not params.partition_ids:
        return []
    after_at, after_id = _NO_CURSOR
    if params.after is not None:
        after_at = aware(params.after.startable_at, field="after.startable_at")
        after_id = params.after.execution_id
    arguments: list[object] = [unique(params.partition_ids), before, limit, after_at, after_id]
    statement = sql_executions.EXECUTIONS_DUE
    if params.tenant_id is not None:
        statement = sql_executions.EXECUTIONS_DUE_TENANT
        arguments.append(params.tenant_id)
    async with store.connection() as connection:
        rows = await connection.fetch(statement, *arguments)
    return [execution_from_columns(row) for row in rows]


async def executions_claim(store: Store, params: ExecutionsClaim) -> list[Execution]:
    check_batch(params.execution_ids, BATCH_ROWS_MAX, what="execution ids")
    lease_s = check_duration(params.attempt_lease_s, field="attempt_lease_s")
    ids = unique(params.execution_ids)
    tokens = _tokens(params.fences)
    _check_routed(ids, tokens.keys(), store.partition_count)
    fenced = fence_arrays(params.fences)
    if not ids:
        async with store.transaction() as connection:
            await require_fences(connection, params.fences)
        return []
    # The fast path: one statement, fenced in itself, claims what is not capped.
    async with store.connection() as connection:
        rows = await connection.fetch(
            sql_executions.EXECUTIONS_CLAIM, ids, lease_s, params.node_id, *fenced
        )
    check_held(rows[0], fenced[0])
    # Each row: held's two columns, then the claimed execution's (NULLs when none was).
    executions = [execution_from_columns(row, 2) for row in rows if row[2] is not None]
    if len(executions) < len(ids):
        claimed = {execution.execution_id for execution in executions}
        rest = [value for value in ids if value not in claimed]
        try:
            async with store.transaction() as connection:
                await require_fences(connection, params.fences)
                capped = await caps.claim_capped(connection, rest, lease_s, params.node_id, tokens)
            executions += [execution_from_columns(row) for row in capped]
        except LeaseLost:
            # Lost since the fast path, whose claims stand (every fence held when they were
            # made): the caller learns of the loss on its next fenced call.
            pass
    return sorted(executions, key=lambda e: (e.planned_at, e.execution_id))


async def executions_extend(store: Store, params: ExecutionsExtend) -> list[str]:
    check_batch(params.attempts, BATCH_ROWS_MAX, what="attempts")
    lease_s = check_duration(params.attempt_lease_s, field="attempt_lease_s")
    pairs = unique((ref.execution_id, ref.attempt) for ref in params.attempts)
    tokens = _tokens(params.fences)
    ids = [execution_id_ for execution_id_, _ in pairs]
    _check_routed(ids, tokens.keys(), store.partition_count)
    async with store.transaction() as connection:
        await require_fences(connection, params.fences)
        if not pairs:
            return []
        rows = await connection.fetch(
            sql_executions.EXECUTIONS_EXTEND,
            ids,
            [attempt for _, attempt in pairs],
            lease_s,
            list(tokens),
            list(tokens.values()),
        )
    return in_order(ids, (row["execution_id"] for row in rows))


async def executions_complete(store: Store, params: ExecutionsComplete) -> CompleteResult:
    completions = params.completions
    check_batch(completions, BATCH_ROWS_MAX, what="completions")
    tokens = _tokens(params.fences)
    ids = [c.execution_id for c in completions]
    _check_routed(ids, tokens.keys(), store.partition_count)
    for completion in completions:
        if completion.outcome not in _OUTCOMES:
            raise InvalidField(f"unknown outcome {completion.outcome!r}")
        if completion.not_before is not None:
            aware(completion.not_before, field="not_before")
    # Of repeated (id, attempt) pairs the first is tried; at most one attempt per id matches.
    if len(set(ids)) == len(ids):
        distinct = completions  # no id twice, so no pair twice (the rule)
    else:
        distinct = list({(c.execution_id, c.attempt): c for c in reversed(completions)}.values())
        distinct.reverse()
    fenced = fence_arrays(params.fences)
    winners: dict[str, int] = {}
    if not distinct:
        async with store.transaction() as connection:
            await require_fences(connection, params.fences)
    else:
        async with store.connection() as connection:
            rows = await connection.fetch(
                sql_executions.EXECUTIONS_COMPLETE,
                text_array([c.execution_id for c in distinct]),
                int_array([c.attempt for c in distinct]),
                text_array([c.outcome for c in distinct]),
                timestamptz_array([c.not_before for c in distinct]),
                text_array([c.error_code for c in distinct]),
                text_array([c.error_message for c in distinct]),
                *fenced,
            )
        check_held(rows[0], fenced[0])
        # Columns: fences_held, holding, execution_id, attempt (NULLs when none finished).
        winners = {row[2]: row[3] for row in rows if row[2] is not None}
    applied: list[str] = []
    stale: list[str] = []
    for completion in completions:
        if winners.get(completion.execution_id) == completion.attempt:
            del winners[completion.execution_id]
            applied.append(completion.execution_id)
        else:
            stale.append(completion.execution_id)
    return CompleteResult(applied=applied, stale=stale)


async def executions_skip(store: Store, params: ExecutionsSkip) -> list[str]:
    check_batch(params.execution_ids, BATCH_ROWS_MAX, what="execution ids")
    if not params.error_code:
        raise InvalidField("a skipped execution must carry an error_code saying why")
    ids = unique(params.execution_ids)
    tokens = _tokens(params.fences)
    _check_routed(ids, tokens.keys(), store.partition_count)
    async with store.transaction() as connection:
        await require_fences(connection, params.fences)
        if not ids:
            return []
        rows = await connection.fetch(
            sql_executions.EXECUTIONS_SKIP,
            ids,
            params.error_code,
            params.error_message,
            list(tokens),
            list(tokens.values()),
        )
    return in_order(ids, (row["execution_id"] for row in rows))


async def executions_requeue_expired(store: Store, params: ExecutionsRequeueExpired) -> list[str]:
    limit = check_limit(params.limit, BATCH_ROWS_MAX)
    tokens = _tokens(params.fences)
    async with store.transaction() as connection:
        await require_fences(connection, params.fences)
        if not tokens:
            return []
        rows = await connection.fetch(
            sql_executions.EXECUTIONS_REQUEUE_EXPIRED, list(tokens), limit, list(tokens.values())
        )
    return sorted(row["execution_id"] for row in rows)


async def executions_get(store: Store, execution_id_: str) -> ExecutionDetail:
    async with store.transaction(readonly=True) as connection:
        row = await connection.fetchrow(sql_executions.EXECUTION_GET, execution_id_)
        if row is None:
            raise NotFound(f"execution {execution_id_!r} does not exist")
        attempts = await connection.fetch(sql_executions.ATTEMPTS_GET, execution_id_)
    execution = execution_from_columns(row)
    history = [attempt_from_row(a) for a in attempts]
    if (
        execution.status is ExecutionStatus.SUCCEEDED
        and execution.finished_at is not None
        and all(a.attempt != execution.attempt for a in history)
    ):
        # The succeeded attempt lives on the execution row only (see EXECUTIONS_COMPLETE).
        history.append(
            Attempt(
                attempt=execution.attempt,
                outcome=str(ExecutionStatus.SUCCEEDED),
                started_at=execution.started_at,
                finished_at=execution.finished_at,
            )
        )
    return ExecutionDetail(execution=execution, attempts=history)


async def executions_query(store: Store, params: ExecutionsQuery) -> Page[Execution]:
    limit = check_limit(params.limit, PAGE_SIZE_MAX)
    after = _execution_cursor(params.cursor)
    arguments: list[Any] = [
        value
        for value in (
            params.schedule_id,
            params.tenant_id,
            None if params.status is None else str(params.status),
            aware_or_none(params.planned_from, field="planned_from"),
            aware_or_none(params.planned_to, field="planned_to"),
            params.task_type,
            aware_or_none(params.finished_from, field="finished_from"),
        )
        if value is not None
    ]
    if after is not None:
        arguments.extend(after)
    query = sql.executions_query(
        schedule=params.schedule_id is not None,
        tenant=params.tenant_id is not None,
        status=params.status is not None,
        planned_from=params.planned_from is not None,
        planned_to=params.planned_to is not None,
        task_type=params.task_type is not None,
        finished_from=params.finished_from is not None,
        after=after is not None,
    )
    async with store.connection() as connection:
        rows = await connection.fetch(query, *arguments, limit + 1)
    items = [execution_from_columns(row) for row in rows[:limit]]
    cursor = None
    if len(rows) > limit:
        last = items[-1]
        cursor = encode_cursor(format_utc(last.planned_at), last.execution_id)
    return Page(items=items, next_cursor=cursor)


async def executions_purge(store: Store, params: ExecutionsPurge) -> int:
    limit = check_limit(params.limit, BATCH_ROWS_MAX)
    before = aware(params.finished_before, field="finished_before")
    select = sql.DEAD_LETTERS_EXPIRED_SELECT if params.dead_letters else sql.EXECUTIONS_PURGE_SELECT
    async with store.transaction() as connection:
        await require_fences(connection, [params.fence])
        rows = await connection.fetch(select, params.fence.partition_id, before, limit)
        if not rows:
            return 0
        purged: int = await connection.fetchval(
            sql.EXECUTIONS_DELETE, [row["execution_id"] for row in rows]
        )
    return purged


# --- helpers ---------------------------------------------------------------------------------


def _tokens(fences: list[Fence]) -> dict[int, int]:
    """Fencing token by partition (a partition fenced twice is caught by require_fences)."""
    return {fence.partition_id: fence.fencing_token for fence in fences}


ROUTED_IDS_CACHED: Final = 1 << 15
"""Execution ids whose partition is remembered: more than a node holds between claiming an
execution and completing it (its workers, their hand-off, the completion queue)."""


@functools.lru_cache(maxsize=ROUTED_IDS_CACHED)
def _partition_of_execution(execution_id_: str, partition_count: int) -> int:
    """The partition of the execution ``execution_id_`` (by its schedule id);
    ``InvalidField`` for an id no plan could have made. Cached: the same id is checked when
    it is claimed and again when it is completed, and parsing and hashing it cost more than
    anything else done with it in Python here."""
    return partition_of(parse_execution_id(execution_id_)[0], partition_count)


def _check_routed(execution_ids: list[str], fenced: Any, partition_count: int) -> None:
    """``InvalidField`` unless every id is well formed (checked first, for all of them) and
    belongs to a fenced partition: a misrouted id is refused before any round trip."""
    partitions = [_partition_of_execution(value, partition_count) for value in execution_ids]
    allowed = set(fenced)
    for value, partition in zip(execution_ids, partitions, strict=True):
        if partition not in allowed:
            schedule_id = parse_execution_id(value)[0]
            raise InvalidField(
                f"execution of schedule {schedule_id!r} belongs to partition {partition}, "
                f"which is not fenced by this call ({sorted(allowed)})"
            )


def _check_partition(
    schedule_ids: list[str], fenced: Any, partition_count: int, *, what: str
) -> None:
    allowed = set(fenced)
    for schedule_id in unique(schedule_ids):
        partition = partition_of(schedule_id, partition_count)
        if partition not in allowed:
            raise InvalidField(
                f"{what} of schedule {schedule_id!r} belongs to partition {partition}, "
                f"which is not fenced by this call ({sorted(allowed)})"
            )


def _execution_cursor(cursor: str | None) -> tuple[Any, str] | None:
    if cursor is None:
        return None
    parts = decode_cursor(cursor)
    # A forged cursor must not reach SQL with a NUL (text cannot hold one) or an instant
    # outside the datetime range once in UTC.
    if len(parts) != 2 or not all(isinstance(part, str) and "\x00" not in part for part in parts):
        raise InvalidField("the pagination cursor is malformed")
    try:
        return parse_instant(parts[0], field="cursor"), parts[1]
    except OverflowError:
        raise InvalidField("the pagination cursor is malformed") from None
