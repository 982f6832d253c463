"""``/v1/executions`` and ``/v1/dead-letters``: what ran, what failed for good, replaying it
and purging it.

A tenant token sees only its own tenant's executions; another tenant's execution is a 404.
Replays and purges are audited with the token as the actor and the optional reason. A purge
of many names at least one filter, or ``"all": true``: deleting every dead letter in sight
is never what an empty body meant. A dead letter whose schedule is deleted is not replayed
(it would run without its payload): 409 for one, left out of a replay by filter.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Final

from engine.api import problems
from engine.api.endpoint import LIMIT, Call, Endpoint, QueryParam, Reply, check_instant
from engine.api.schemas import (
    REPLAY_FILTERS,
    PurgeFilter,
    PurgeResult,
    ReasonIn,
    ReplayFilter,
    ReplayResult,
)
from engine.ledger.params import (
    PAGE_SIZE_MAX,
    DeadLettersPurge,
    DeadLettersReplay,
    ExecutionDetail,
    ExecutionsQuery,
    Page,
)
from engine.model import Execution, ExecutionStatus, Schedule, validate_identifier


def _tenant_filter(call: Call) -> str | None:
    asked = call.query_str("tenant_id")
    own = call.who.tenant_id
    if own is None:
        return asked
    if asked not in (None, own):
        raise problems.not_found(f"tenant {asked!r} not found")
    return own


def _query(call: Call, status: ExecutionStatus | None) -> ExecutionsQuery:
    return ExecutionsQuery(
        schedule_id=call.query_str("schedule_id"),
        tenant_id=_tenant_filter(call),
        status=status,
        planned_from=call.query_instant("planned_from"),
        planned_to=call.query_instant("planned_to"),
        task_type=call.query_str("task_type"),
        cursor=call.query_str("cursor"),
        limit=call.query_int(LIMIT),
    )


async def _visible(call: Call, execution_id: str) -> ExecutionDetail:
    detail: ExecutionDetail = await call.api.ledger.executions_get(execution_id)
    call.who.check_tenant(detail.execution.tenant_id, f"execution {execution_id!r}")
    return detail


async def list_executions(call: Call) -> Reply:
    status = call.query_enum("status", ExecutionStatus)
    page: Page[Execution] = await call.api.ledger.executions_query(_query(call, status))
    return Reply(page)


async def get_execution(call: Call) -> Reply:
    return Reply(await _visible(call, call.path("execution_id")))


async def list_dead_letters(call: Call) -> Reply:
    query = _query(call, ExecutionStatus.DEAD_LETTER)
    page: Page[Execution] = await call.api.ledger.executions_query(query)
    return Reply(page)


async def replay_one(call: Call) -> Reply:
    execution_id = call.path("execution_id")
    detail = await _visible(call, execution_id)
    if detail.execution.status is not ExecutionStatus.DEAD_LETTER:
        raise problems.Problem(
            409,
            "not-a-dead-letter",
            "The execution is not a dead letter",
            f"execution {execution_id!r} is {detail.execution.status}; only dead letters "
            "can be replayed",
        )
    body: ReasonIn = call.body
    execution = detail.execution
    if not await _runnable(call, [execution]):
        raise _schedule_deleted(execution)
    replayed = await call.api.ledger.dead_letters_replay(
        DeadLettersReplay([execution_id], call.who.actor, body.reason)
    )
    if not replayed and not await _runnable(call, [execution]):
        raise _schedule_deleted(execution)  # deleted meanwhile: the ledger refused it
    return Reply(ReplayResult(replayed))


async def _runnable(call: Call, executions: list[Execution]) -> list[Execution]:
    """Those of ``executions`` (at most a page) whose schedule is live and of their tenant:
    the dead letters a replay could run (it runs with its schedule's payload)."""
    ids = list(dict.fromkeys(execution.schedule_id for execution in executions))
    live: dict[str, Schedule] = await call.api.ledger.schedules_get_many(ids)
    return [
        execution
        for execution in executions
        if (schedule := live.get(execution.schedule_id)) is not None
        and schedule.tenant_id == execution.tenant_id
    ]


def _schedule_deleted(execution: Execution) -> problems.Problem:
    return problems.Problem(
        409,
        "schedule-deleted",
        "The execution's schedule is deleted",
        f"execution {execution.execution_id!r} cannot be replayed: its schedule "
        f"{execution.schedule_id!r} was deleted, and with it the payload the execution runs "
        "with; create the schedule again, then replay it",
    )


async def replay_matching(call: Call) -> Reply:
    body: ReplayFilter = call.body
    if not body.all and all(getattr(body, name) is None for name in REPLAY_FILTERS):
        raise problems.invalid(
            "name the dead letters to replay: give schedule_id, tenant_id or task_type, or "
            'send "all": true to replay every one (a tenant token: every one of its tenant)'
        )
    # Dead letters of deleted schedules could not run: left out, not counted.
    ids = await _matching_dead_letters(call, body, _runnable)
    if not ids:
        return Reply(ReplayResult([]))
    replayed = await call.api.ledger.dead_letters_replay(
        DeadLettersReplay(ids, call.who.actor, body.reason)
    )
    return Reply(ReplayResult(replayed))


async def _every(_: Call, executions: list[Execution]) -> list[Execution]:
    return executions


async def _matching_dead_letters(
    call: Call,
    body: ReplayFilter | PurgeFilter,
    keep: Callable[[Call, list[Execution]], Awaitable[list[Execution]]],
) -> list[str]:
    """The ids of the first ``body.limit`` dead letters that match ``body``'s filters and
    that ``keep`` keeps, of the caller's tenant only (another tenant named: 404)."""
    for name in REPLAY_FILTERS:
        if (value := getattr(body, name)) is not None:
            validate_identifier(value, kind=name)
    for name, instant in (("planned_from", body.planned_from), ("planned_to", body.planned_to)):
        if instant is not None:
            check_instant(instant, name)
    own = call.who.tenant_id
    tenant = body.tenant_id
    if own is not None:
        if tenant not in (None, own):
            raise problems.not_found(f"tenant {tenant!r} not found")
        tenant = own
    ids: list[str] = []
    cursor: str | None = None
    while len(ids) < body.limit:
        page: Page[Execution] = await call.api.ledger.executions_query(
            ExecutionsQuery(
                schedule_id=body.schedule_id,
                tenant_id=tenant,
                status=ExecutionStatus.DEAD_LETTER,
                planned_from=body.planned_from,
                planned_to=body.planned_to,
                task_type=body.task_type,
                cursor=cursor,
                limit=min(PAGE_SIZE_MAX, body.limit - len(ids)),
            )
        )
        ids.extend(execution.execution_id for execution in await keep(call, page.items))
        cursor = page.next_cursor
        if cursor is None:
            break
    return ids


def _not_a_dead_letter(execution_id: str, status: ExecutionStatus, action: str) -> problems.Problem:
    return problems.Problem(
        409,
        "not-a-dead-letter",
        "The execution is not a dead letter",
        f"execution {execution_id!r} is {status}; only dead letters can be {action}",
    )


async def purge_one(call: Call) -> Reply:
    execution_id = call.path("execution_id")
    detail = await _visible(call, execution_id)
    if detail.execution.status is not ExecutionStatus.DEAD_LETTER:
        raise _not_a_dead_letter(execution_id, detail.execution.status, "purged")
    body: ReasonIn = call.body
    purged = await call.api.ledger.dead_letters_purge(
        DeadLettersPurge([execution_id], call.who.actor, body.reason)
    )
    return Reply(PurgeResult(purged))


async def purge_matching(call: Call) -> Reply:
    body: PurgeFilter = call.body
    filters = (body.schedule_id, body.tenant_id, body.task_type, body.planned_from, body.planned_to)
    given = any(value is not None for value in filters)
    if body.all and given:
        raise problems.invalid('give filters or "all": true, not both')
    if not body.all and not given:
        raise problems.invalid(
            "name the dead letters to purge: schedule_id, tenant_id, task_type, planned_from "
            'or planned_to, or "all": true for every one'
        )
    ids = await _matching_dead_letters(call, body, _every)
    if not ids:
        return Reply(PurgeResult([]))
    purged = await call.api.ledger.dead_letters_purge(
        DeadLettersPurge(ids, call.who.actor, body.reason)
    )
    return Reply(PurgeResult(purged))


_FILTERS: Final = (
    QueryParam("schedule_id", "string", "only this schedule's"),
    QueryParam("tenant_id", "string", "only this tenant's (a tenant token: its own)"),
    QueryParam("task_type", "string", "only this task type's"),
    QueryParam("planned_from", "date-time", "planned at or after (RFC 3339)"),
    QueryParam("planned_to", "date-time", "planned before (RFC 3339)"),
    QueryParam("cursor", "string", "next_cursor of the previous page"),
    LIMIT,
)
_STATUS: Final = QueryParam(
    "status", "string", "only executions in this status", tuple(s.value for s in ExecutionStatus)
)

ENDPOINTS: Final = (
    Endpoint(
        "GET",
        "/v1/executions",
        list_executions,
        "List executions",
        response=Page[Execution],
        query=(*_FILTERS, _STATUS),
        tag="executions",
    ),
    Endpoint(
        "GET",
        "/v1/executions/{execution_id}",
        get_execution,
        "Read an execution with its attempts",
        response=ExecutionDetail,
        tag="executions",
    ),
    Endpoint(
        "GET",
        "/v1/dead-letters",
        list_dead_letters,
        "List dead letters",
        response=Page[Execution],
        query=_FILTERS,
        tag="dead-letters",
    ),
    Endpoint(
        "POST",
        "/v1/dead-letters:replay",
        replay_matching,
        "Replay the dead letters matching a filter (or all of them, explicitly)",
        body=ReplayFilter,
        response=ReplayResult,
        tag="dead-letters",
    ),
    Endpoint(
        "POST",
        "/v1/dead-letters/{execution_id}:replay",
        replay_one,
        "Replay one dead letter under its own id",
        body=ReasonIn,
        response=ReplayResult,
        tag="dead-letters",
    ),
    Endpoint(
        "POST",
        "/v1/dead-letters:purge",
        purge_matching,
        "Delete the dead letters matching a filter (or all), audited",
        body=PurgeFilter,
        response=PurgeResult,
        tag="dead-letters",
    ),
    Endpoint(
        "POST",
        "/v1/dead-letters/{execution_id}:purge",
        purge_one,
        "Delete one dead letter for good, audited",
        body=ReasonIn,
        response=PurgeResult,
        tag="dead-letters",
    ),
)
