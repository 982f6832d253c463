"""Planning, dispatch and the execution history (asyncio side; one coroutine per ledger
method): checkpoints, plan, due, claim, extend, complete, skip, re-queue, get, query,
statistics and retention; finish, the claim folded into a completion.

Every ownership-dependent operation either runs entirely under valid leases or changes
nothing: multi-statement ones open their transaction with
:func:`~engine.ledger.postgres.fencing.require_fences`; claim and complete, the hot path,
are single statements that check their fences themselves (see
:mod:`~engine.ledger.postgres.fencing`). Ids are checked against the fenced partitions in Python
first (``partition_of`` of the schedule id, the part of an execution id before its first
colon), so a misrouted id is refused before any round trip.

Results list ids in the order the caller gave them, without repeats. A claim's statements,
with the cluster-wide concurrency caps, are in :mod:`~engine.ledger.postgres.caps`;
dead-letter replay and the audit trail in :mod:`~engine.ledger.postgres.audit`. Every input is
checked by its parameter object first (``params.checked()``, shared with the memory
ledger); which executions may start is the SQL column ``startable_at``, the mirror of
:func:`~engine.model.startable_at`.
"""

from __future__ import annotations

import functools
from datetime import UTC, datetime, timedelta
from typing import Any, Final

import asyncpg

from engine.errors import LeaseLost
from engine.ledger.checks import (
    check_executions_routed,
    check_schedules_routed,
    execution_partition,
    unique,
)
from engine.ledger.common import (
    decode_planned_cursor,
    encode_planned_cursor,
    not_found,
)
from engine.ledger.params import (
    Attempt,
    CompleteResult,
    Completion,
    ExecutionDetail,
    ExecutionsBucket,
    ExecutionsClaim,
    ExecutionsComplete,
    ExecutionsDue,
    ExecutionsExtend,
    ExecutionsFinish,
    ExecutionsPlan,
    ExecutionsPurge,
    ExecutionsQuery,
    ExecutionsRequeueExpired,
    ExecutionsSkip,
    ExecutionsStats,
    Fence,
    Page,
    PlanResult,
    ScheduleAdvance,
)
from engine.ledger.postgres import caps, sql, sql_api, sql_executions
from engine.ledger.postgres.fencing import check_held, fence_arrays, require_fences
from engine.ledger.postgres.rows import (
    attempt_from_row,
    checkpoint_from_row,
    execution_from_columns,
    in_order,
    int_array,
    text_array,
    timestamptz_array,
)
from engine.ledger.postgres.store import Store
from engine.model import Execution, ExecutionStatus, PlannerCheckpoint, execution_id


async def checkpoints_get(store: Store, partition_ids: list[int]) -> list[PlannerCheckpoint]:
    if not partition_ids:
        return []
    async with store.connection(control=True) as connection:
        rows = await connection.fetch(sql.CHECKPOINTS_GET, unique(partition_ids))
    return [checkpoint_from_row(row) for row in rows]


async def executions_plan(store: Store, params: ExecutionsPlan) -> PlanResult:
    params = params.checked()
    fence, planned, advances = params.fence, params.executions, params.advances
    named = [p.schedule_id for p in planned] + [a.schedule_id for a in advances]
    check_schedules_routed(named, [fence.partition_id], store.partition_count)
    checkpoint = params.checkpoint
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
    params = params.checked()
    limit, before = params.limit, params.before
    if not params.partition_ids:
        return []
    after_at, after_id = _NO_CURSOR
    if params.after is not None:
        after_at, after_id = params.after.startable_at, params.after.execution_id
    arguments: list[object] = [unique(params.partition_ids), before, limit, after_at, after_id]
    statement = sql_executions.EXECUTIONS_DUE
    if params.tenant_id is not None:
        statement = sql_executions.EXECUTIONS_DUE_TENANT
        arguments.append(params.tenant_id)
    async with store.connection() as connection:
        rows = await connection.fetch(statement, *arguments)
    return [execution_from_columns(row) for row in rows]


async def executions_claim(store: Store, params: ExecutionsClaim) -> list[Execution]:
    params = params.checked()
    lease_s = params.attempt_lease_s
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
    params = params.checked()
    lease_s = params.attempt_lease_s
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
    params = params.checked()
    return await _write_outcomes(
        store, params.fences, params.completions, sql_executions.EXECUTIONS_COMPLETE
    )


async def executions_finish(store: Store, params: ExecutionsFinish) -> CompleteResult:
    params = params.checked()
    return await _write_outcomes(
        store,
        params.fences,
        params.completions,
        sql_executions.EXECUTIONS_FINISH,
        folded_by=params.node_id,
    )


async def _write_outcomes(
    store: Store,
    fences: list[Fence],
    completions: list[Completion],
    statement: str,
    *,
    folded_by: str | None = None,
) -> CompleteResult:
    """Write the outcomes of ``completions`` with ``statement``: a completion's
    (:data:`~engine.ledger.postgres.sql_executions.EXECUTIONS_COMPLETE`), or, given the node
    that started them, a folded attempt's finish (``EXECUTIONS_FINISH``, which also takes each
    attempt's start and the node). Both are fenced in the statement and return the same
    columns."""
    tokens = _tokens(fences)
    ids = [c.execution_id for c in completions]
    _check_routed(ids, tokens.keys(), store.partition_count)
    distinct = _first_of_each_attempt(completions, ids)
    fenced = fence_arrays(fences)
    winners: dict[str, int] = {}
    if not distinct:
        async with store.transaction() as connection:
            await require_fences(connection, fences)
    else:
        arrays = [
            text_array([c.execution_id for c in distinct]),
            int_array([c.attempt for c in distinct]),
            text_array([c.outcome for c in distinct]),
            timestamptz_array([c.not_before for c in distinct]),
            text_array([c.error_code for c in distinct]),
            text_array([c.error_message for c in distinct]),
        ]
        if folded_by is not None:
            arrays.append(timestamptz_array([c.started_at for c in distinct]))
        async with store.connection() as connection:
            rows = await connection.fetch(
                statement, *arrays, *fenced, *(() if folded_by is None else (folded_by,))
            )
        check_held(rows[0], fenced[0])
        # Columns: fences_held, holding, execution_id, attempt (NULLs when none finished).
        winners = {row[2]: row[3] for row in rows if row[2] is not None}
    return _applied_and_stale(completions, winners)


async def executions_skip(store: Store, params: ExecutionsSkip) -> list[str]:
    params = params.checked()
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
    limit = params.checked().limit
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
            raise not_found("execution", execution_id_)
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
    params = params.checked()
    limit = params.limit
    after = None if params.cursor is None else decode_planned_cursor(params.cursor)
    arguments: list[Any] = [
        value
        for value in (
            params.schedule_id,
            params.tenant_id,
            params.planned_from,
            params.planned_to,
            params.task_type,
            params.finished_from,
        )
        if value is not None
    ]
    if after is not None:
        arguments.extend(after)
    query = sql.executions_query(
        schedule=params.schedule_id is not None,
        tenant=params.tenant_id is not None,
        status=params.status,
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
        cursor = encode_planned_cursor(last.planned_at, last.execution_id)
    return Page(items=items, next_cursor=cursor)


# --- execution statistics ---------------------------------------------------------------------


async def executions_stats(store: Store, params: ExecutionsStats) -> list[ExecutionsBucket]:
    params = params.checked()
    start = params.planned_from
    end = start + timedelta(seconds=params.bucket_s * params.buckets)
    arguments: list[Any] = [start, end, params.bucket_s, float(params.on_time_s)]
    query = sql_api.EXECUTIONS_STATS
    if params.tenant_id is not None:
        query = sql_api.EXECUTIONS_STATS_OF_TENANT
        arguments.append(params.tenant_id)
    async with store.connection() as connection:
        rows = await connection.fetch(query, *arguments)
    planned: dict[int, asyncpg.Record] = {}
    happened: dict[int, asyncpg.Record] = {}
    for row in rows:
        if 0 <= row["bucket"] < params.buckets:
            (happened if row["happened"] else planned)[row["bucket"]] = row
    buckets = []
    for index in range(params.buckets):
        p, h = planned.get(index), happened.get(index)
        buckets.append(
            ExecutionsBucket(
                planned=p["planned"] if p else 0,
                started=p["started"] if p else 0,
                on_time=p["on_time"] if p else 0,
                dead_letters=p["dead_letters"] if p else 0,
                plan_lag_s_max=p["plan_lag_s_max"] if p else 0.0,
                starts=h["planned"] if h else 0,
                skips=h["started"] if h else 0,
            )
        )
    return buckets


async def executions_purge(store: Store, params: ExecutionsPurge) -> int:
    params = params.checked()
    limit, before = params.limit, params.finished_before
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


def _first_of_each_attempt(completions: list[Completion], ids: list[str]) -> list[Completion]:
    """Of repeated (id, attempt) pairs the first, which is the one tried; at most one
    attempt per id can match."""
    if len(set(ids)) == len(ids):
        return completions  # no id twice, so no pair twice (the rule)
    distinct = list({(c.execution_id, c.attempt): c for c in reversed(completions)}.values())
    distinct.reverse()
    return distinct


def _applied_and_stale(completions: list[Completion], winners: dict[str, int]) -> CompleteResult:
    """``completions`` split by whether the statement finished them (``winners``: id to the
    attempt it finished), each id applied at most once, in the order given."""
    applied: list[str] = []
    stale: list[str] = []
    for completion in completions:
        if winners.get(completion.execution_id) == completion.attempt:
            del winners[completion.execution_id]
            applied.append(completion.execution_id)
        else:
            stale.append(completion.execution_id)
    return CompleteResult(applied=applied, stale=stale)


def _tokens(fences: list[Fence]) -> dict[int, int]:
    """Fencing token by partition (a partition fenced twice is caught by require_fences)."""
    return {fence.partition_id: fence.fencing_token for fence in fences}


ROUTED_IDS_CACHED: Final = 1 << 15
"""Execution ids whose partition is remembered: more than a node holds between claiming an
execution and completing it (its workers, their hand-off, the completion queue)."""


@functools.lru_cache(maxsize=ROUTED_IDS_CACHED)
def _partition_of_execution(execution_id_: str, partition_count: int) -> int:
    """:func:`~engine.ledger.checks.execution_partition`, cached: the same id is checked
    when it is claimed and again when it is completed, and parsing and hashing it cost more
    than anything else done with it in Python here."""
    return execution_partition(execution_id_, partition_count)


def _check_routed(execution_ids: list[str], fenced: Any, partition_count: int) -> None:
    """:func:`~engine.ledger.checks.check_executions_routed` on the cached rule."""
    check_executions_routed(execution_ids, fenced, partition_count, _partition_of_execution)
