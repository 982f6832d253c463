"""What the CLI tests share: a real API served in-process, tokens, dead letters, the CLI.

:func:`serving` runs :class:`~engine.api.server.ApiServer` on a free port of 127.0.0.1 inside
the test's trio loop. The CLI runs in-process through ``engine.cli.main`` in a worker thread
(it is synchronous and blocks on HTTP while the API answers from the trio thread).
:func:`dead_letters` makes dead letters through the ledger, as a node would: plan, claim and
complete with a fence.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Protocol

import pytest
import trio

from engine.api.app import ApiConfig, ApiContext
from engine.api.auth import Authenticator, new_token, scope_of
from engine.api.server import ApiServer
from engine.cli import main
from engine.ledger.base import Ledger
from engine.ledger.params import (
    Completion,
    ExecutionsClaim,
    ExecutionsComplete,
    ExecutionsPlan,
    Fence,
    LeasesAcquire,
    Outcome,
    PlannedExecution,
    SchedulesCreate,
    TaskTypesPut,
    TokensCreate,
)
from engine.model import ApiToken, HandlerKind, Schedule, TaskType
from tests.ledger.backends import PARTITIONS

RATE_UNLIMITED = 1000.0


LETTERS = [  # schedule id, tenant, task type
    ("bill-1", "acme", "billing"),
    ("bill-2", "acme", "billing"),
    ("bill-3", "globex", "billing"),
    ("mail-1", "acme", "mailer"),
]


async def dead_letters(ledger: Ledger, letters: list[tuple[str, str, str]]) -> dict[str, str]:
    """Dead-letter one execution of each (schedule, tenant, task type); returns the execution
    id by schedule id. Each is planned a second apart, in list order, a minute ago."""
    for name in sorted({task_type for _, _, task_type in letters}):
        await ledger.task_types_put(
            TaskTypesPut(TaskType(name=name, kind=HandlerKind.NOOP, allowed_tenants=("*",)))
        )
    created = await ledger.schedules_create(
        SchedulesCreate(
            [Schedule(schedule_id=s, tenant_id=t, cron_expr="* * * * *", task_type=k)
             for s, t, k in letters]
        )
    )  # fmt: skip
    leases = await ledger.leases_acquire(LeasesAcquire("cli-test", list(range(PARTITIONS)), 60))
    fences = {lease.partition_id: Fence(lease.partition_id, "cli-test", lease.fencing_token)
              for lease in leases}  # fmt: skip
    start = (await ledger.database_now()).replace(microsecond=0) - timedelta(minutes=1)
    ids: dict[str, str] = {}
    for n, schedule in enumerate(created):
        assert schedule.partition_id is not None  # assigned by the ledger
        fence = fences[schedule.partition_id]
        at = start + timedelta(seconds=n)
        planned = PlannedExecution(schedule.schedule_id, schedule.tenant_id, schedule.task_type, at)
        [eid] = (await ledger.executions_plan(ExecutionsPlan(fence, [planned], []))).inserted
        [claimed] = await ledger.executions_claim(ExecutionsClaim([fence], [eid], 30, "cli-test"))
        completion = Completion(eid, claimed.attempt, Outcome.DEAD_LETTER, None, "http_404", "gone")
        await ledger.executions_complete(ExecutionsComplete([fence], [completion]))
        ids[schedule.schedule_id] = eid
    return ids


@dataclass(frozen=True)
class Result:
    code: int
    out: str
    err: str


class Cli(Protocol):
    async def __call__(self, *args: str) -> Result: ...


def cli_runner(capsys: pytest.CaptureFixture[str]) -> Cli:
    """``await run(*args)``: ``carillon ARGS`` in a worker thread, its exit code and output."""

    async def run(*args: str) -> Result:
        capsys.readouterr()
        code = await trio.to_thread.run_sync(main, list(args))
        out, err = capsys.readouterr()
        return Result(code, out, err)

    return run


async def create_token(ledger: Ledger, *, tenant: str | None = None) -> str:
    """A new token in ``ledger``: admin, or confined to ``tenant``."""
    token_id, token, token_hash = new_token()
    scope = scope_of(admin=tenant is None, tenant_id=tenant)
    record = ApiToken(token_id=token_id, scope=scope)
    await ledger.tokens_create(TokensCreate(record, token_hash, "test"))
    return token


@asynccontextmanager
async def serving(
    ledger: Ledger,
    monotonic: Callable[[], float],
    *,
    token_rate_per_s: float = RATE_UNLIMITED,
    token_burst: int = int(RATE_UNLIMITED),
) -> AsyncIterator[tuple[str, ApiContext]]:
    """Serve the API on ``ledger`` until the block ends; yields its URL and context.
    ``monotonic`` drives its rate limits and its token cache."""
    auth = Authenticator(
        ledger,
        monotonic,
        token_rate_per_s=token_rate_per_s,
        token_burst=token_burst,
        anonymous_rate_per_s=RATE_UNLIMITED,
        anonymous_burst=int(RATE_UNLIMITED),
    )
    context = ApiContext(ledger=ledger, auth=auth)
    server = ApiServer(ApiConfig(bind="127.0.0.1:0", shutdown_grace_s=0.5), context)
    async with trio.open_nursery() as nursery:
        bound = await nursery.start(server.run)
        yield str(bound[0]), context
        nursery.cancel_scope.cancel()
