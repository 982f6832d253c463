"""A real node on PostgreSQL publishes a redis task type's fires to a real Redis stream.

Through the whole execution path -- planner, dispatcher, the worker pool, the handler on the
pipeline's broker bridge, completions -- with a private ``redis-server`` that a test kills and
restarts while the node runs.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta

import pytest
import trio

from engine.core.instants import format_utc
from engine.core.timetable import Timetable
from engine.ledger.base import Ledger
from engine.ledger.params import SchedulesCreate, TaskTypesPut
from engine.ledger.postgres import open_postgres_ledger
from engine.model import Execution, ExecutionStatus, HandlerKind, Schedule, TaskType
from tests.e2e.harness import EVERY_2_S, executions_of, running_node, wait_for_execution
from tests.handlers.redis_server import RedisServer, entries, redis_server
from tests.ledger.backends import postgres_template_database

__all__ = ["redis_server"]  # the fixture, imported for this module's tests

pytestmark = pytest.mark.postgres


@pytest.fixture
async def url(database_url: str, postgres_template: str) -> AsyncIterator[str]:
    async with postgres_template_database(database_url, postgres_template) as fresh:
        yield fresh


async def create_ticks(ledger: Ledger, redis_url: str, *, timeout_s: float = 2) -> Schedule:
    """Task type ``ticks`` (a redis stream ``ticks``) and a schedule firing every 2 s."""
    await ledger.task_types_put(
        TaskTypesPut(
            TaskType(
                name="ticks",
                kind=HandlerKind.REDIS,
                allowed_tenants=("*",),
                settings={"url": redis_url, "stream": "ticks", "timeout_s": timeout_s},
                timeout_s=timeout_s,
                backoff_base_s=0.5,
                backoff_max_s=1,
                max_attempts=20,
            )
        )
    )
    now = await ledger.database_now()
    first = Timetable.compile(EVERY_2_S).next_fire(now + timedelta(seconds=1)).planned_at
    [stored] = await ledger.schedules_create(
        SchedulesCreate(
            [
                Schedule(
                    schedule_id="e2e-ticks",
                    tenant_id="acme",
                    cron_expr=EVERY_2_S,
                    task_type="ticks",
                    next_run_at=first,
                    payload={"report": "daily"},
                )
            ]
        )
    )
    return stored


def succeeded(executions: list[Execution]) -> set[str]:
    return {e.execution_id for e in executions if e.status is ExecutionStatus.SUCCEEDED}


async def test_each_fire_is_appended_once_with_its_context(
    url: str, redis_server: RedisServer
) -> None:
    async with open_postgres_ledger(url) as ledger:
        async with running_node(url):
            schedule = await create_ticks(ledger, redis_server.url)
            done = await wait_for_execution(
                ledger, schedule.schedule_id, lambda e: e.status is ExecutionStatus.SUCCEEDED
            )
            await wait_for_execution(
                ledger,
                schedule.schedule_id,
                lambda e: e.status is ExecutionStatus.SUCCEEDED and e.planned_at > done.planned_at,
            )
        executions = await executions_of(ledger, schedule.schedule_id)

    published = entries(redis_server.url, "ticks")
    ids = [entry["execution_id"] for entry in published]
    assert len(ids) == len(set(ids))  # never twice
    assert succeeded(executions) <= set(ids)  # every success is in the stream
    first = next(entry for entry in published if entry["execution_id"] == done.execution_id)
    assert first == {
        "execution_id": done.execution_id,
        "schedule_id": "e2e-ticks",
        "tenant_id": "acme",
        "task_type": "ticks",
        "planned_at": format_utc(done.planned_at),
        "attempt": "1",
        "fencing_token": str(done.fencing_token),
        "payload": '{"report":"daily"}',
    }


async def test_fires_during_a_broker_outage_are_retried_and_appended_once(
    url: str, redis_server: RedisServer
) -> None:
    async with open_postgres_ledger(url) as ledger:
        async with running_node(url):
            schedule = await create_ticks(ledger, redis_server.url)
            await wait_for_execution(
                ledger, schedule.schedule_id, lambda e: e.status is ExecutionStatus.SUCCEEDED
            )
            await trio.to_thread.run_sync(redis_server.kill)
            failed = await wait_for_execution(
                ledger, schedule.schedule_id, lambda e: e.error_code is not None
            )
            await trio.sleep(2)  # another fire or two meet the outage
            await trio.to_thread.run_sync(redis_server.start)
            await wait_for_execution(
                ledger,
                schedule.schedule_id,
                lambda e: (
                    e.execution_id == failed.execution_id and e.status is ExecutionStatus.SUCCEEDED
                ),
            )
        executions = await executions_of(ledger, schedule.schedule_id)

    assert failed.error_code == "redis_connection_error"
    ids = [entry["execution_id"] for entry in entries(redis_server.url, "ticks")]
    assert len(ids) == len(set(ids))
    assert succeeded(executions) <= set(ids)
    assert failed.execution_id in ids
    assert not [e for e in executions if e.status is ExecutionStatus.DEAD_LETTER]


async def test_a_publish_lost_with_its_node_is_redelivered_and_appended_once(
    url: str, redis_server: RedisServer
) -> None:
    """Node A's first publish hangs (the broker holds every write); A is stopped meanwhile,
    leaving its attempt running; node B redelivers it once the attempt lease runs out. Whether
    A's command was carried out when the broker let writes go again or dropped with its
    connection, the stream holds the execution once."""
    async with open_postgres_ledger(url) as ledger:
        schedule = await create_ticks(ledger, redis_server.url, timeout_s=30)
        redis_server.command("CLIENT", "PAUSE", "9000", "WRITE")
        async with running_node(url, "e2e-a", seed=1, attempt_lease_s=4) as (_, stop_a):
            hanging = await wait_for_execution(
                ledger, schedule.schedule_id, lambda e: e.status is ExecutionStatus.RUNNING
            )
            await trio.sleep(0.5)  # its publish is on the wire
            stop_a.cancel()  # node A goes away while its publish hangs
        lost = (await ledger.executions_get(hanging.execution_id)).execution
        assert (lost.status, lost.attempt) == (ExecutionStatus.RUNNING, 1)
        async with running_node(url, "e2e-b", seed=2, attempt_lease_s=4):
            done = await wait_for_execution(
                ledger,
                schedule.schedule_id,
                lambda e: (
                    e.execution_id == hanging.execution_id and e.status is ExecutionStatus.SUCCEEDED
                ),
                timeout_s=40,
            )
        detail = await ledger.executions_get(hanging.execution_id)

    assert done.attempt == 2
    assert [(a.attempt, a.outcome) for a in detail.attempts] == [(1, "expired"), (2, "succeeded")]
    ids = [entry["execution_id"] for entry in entries(redis_server.url, "ticks")]
    assert ids.count(hanging.execution_id) == 1
    assert len(ids) == len(set(ids))
