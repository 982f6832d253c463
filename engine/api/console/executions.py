"""The executions and dead-letter pages: filter, inspect attempts, replay with confirmation.

Reads are the ``/v1/executions`` and ``/v1/dead-letters`` routes' handlers, so a tenant
token sees its own tenant's only, and another tenant's execution is a 404. Each listing is
a keyset page in planned order that one index serves: by schedule
(``executions_schedule_idx``), by tenant (``executions_tenant_idx``) or the dead letters
(``executions_dead_letter_idx``). An admin listing every tenant's executions at once would
read the whole ledger, so the executions page asks an admin for a tenant or a schedule
first; by default it starts an hour back.

A replay takes two steps: the dead-letter page posts the selection, the console shows what
will be queued again and asks for a reason, and only the second post replays -- one
``POST /v1/dead-letters/{id}:replay`` each, so every replay is checked and audited as the
API's is.
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Final

from starlette.responses import Response

from engine.api import problems, routes_admin, routes_executions
from engine.api.console.schedules import reason_body, start_delay_s
from engine.api.console.web import Visit, safe_return_path, with_notice
from engine.core.instants import format_utc
from engine.ledger.params import ExecutionDetail, Page
from engine.model import Execution, ExecutionStatus, Tenant

PAGE_ROWS: Final = 100
REPLAY_SELECTED_MAX: Final = PAGE_ROWS
DEFAULT_LOOKBACK: Final = timedelta(hours=1)
_FILTERS: Final = ("schedule_id", "tenant_id", "task_type", "planned_from", "planned_to")
_NO_OFFSET: Final = re.compile(r"^\d{4}-\d\d-\d\d([T ]\d\d:\d\d(:\d\d(\.\d+)?)?)?$")


def instant_text(text: str | None) -> str | None:
    """A form's instant as RFC 3339: a space for the ``T``, and UTC when no offset is given
    (what a person types: ``2026-03-02 14:00``, or a day). Anything else goes to the route as typed,
    which refuses it with a helpful message."""
    if text is None:
        return None
    if _NO_OFFSET.match(text):
        return text.replace(" ", "T") + ("Z" if len(text) > 10 else "T00:00Z")
    return text


def _filters(visit: Visit) -> dict[str, str | None]:
    chosen = {name: visit.query(name) for name in _FILTERS}
    for name in ("planned_from", "planned_to"):
        chosen[name] = instant_text(chosen[name])
    return chosen


async def executions(visit: Visit) -> Response:
    chosen = _filters(visit)
    status = visit.query("status")
    tenants: list[Tenant] = []
    page: Page[Execution] | None = None
    narrowed = visit.principal.tenant_id is not None or chosen["schedule_id"] or chosen["tenant_id"]
    if narrowed or status == ExecutionStatus.DEAD_LETTER:
        if chosen["planned_from"] is None and visit.query("cursor") is None:
            start = await visit.ledger.database_now() - DEFAULT_LOOKBACK
            chosen["planned_from"] = format_utc(start.replace(second=0, microsecond=0))
        query = {**chosen, "status": status, "cursor": visit.query("cursor")}
        page = await visit.call(routes_executions.list_executions, query={**query, "limit": "100"})
    elif visit.principal.is_admin:
        tenants = await visit.call(routes_admin.list_tenants)
    return visit.page(
        "executions.html",
        page=page,
        filters=chosen,
        status_filter=status,
        statuses=[s.value for s in ExecutionStatus],
        tenants=tenants,
        delay=start_delay_s,
        paged=visit.query("cursor") is not None,
    )


async def execution(visit: Visit) -> Response:
    execution_id = visit.request.path_params["execution_id"]
    detail: ExecutionDetail = await visit.call(
        routes_executions.get_execution, path={"execution_id": execution_id}
    )
    return visit.page("execution.html", detail=detail, delay=start_delay_s)


async def dead_letters(visit: Visit) -> Response:
    chosen = _filters(visit)
    query = {**chosen, "cursor": visit.query("cursor"), "limit": str(PAGE_ROWS)}
    page: Page[Execution] = await visit.call(routes_executions.list_dead_letters, query=query)
    return visit.page(
        "dead_letters.html", page=page, filters=chosen, paged=visit.query("cursor") is not None
    )


async def replay(visit: Visit) -> Response:
    """The two steps of a replay: confirm (``confirmed`` absent), then replay."""
    ids = list(dict.fromkeys(visit.fields("execution_id")))
    if not ids:
        raise problems.invalid("select at least one dead letter to replay")
    if len(ids) > REPLAY_SELECTED_MAX:
        raise problems.invalid(f"replay at most {REPLAY_SELECTED_MAX} dead letters at once")
    back = safe_return_path(visit.field("back"), "/dead-letters")
    if visit.field("confirmed") != "yes":
        details: list[ExecutionDetail] = [
            await visit.call(routes_executions.get_execution, path={"execution_id": key})
            for key in ids
        ]
        return visit.page("confirm_replay.html", details=details, return_to=back)
    body = reason_body(visit)
    replayed: list[str] = []
    for key in ids:
        try:
            result = await visit.call(
                routes_executions.replay_one, path={"execution_id": key}, body=body
            )
        except problems.Problem as problem:
            # Replayed meanwhile, or its schedule deleted (it cannot run): nothing to do.
            if problem.slug not in ("not-a-dead-letter", "schedule-deleted"):
                raise
            continue
        replayed.extend(result.replayed)
    return with_notice(back, "replayed" if replayed else "replayed-none")
