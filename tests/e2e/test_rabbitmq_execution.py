"""A real node on PostgreSQL publishes a rabbitmq task type's fires to the machine's
RabbitMQ (an exchange and a queue of the test's own), through the whole execution path."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import pytest
import trio

from engine.core.instants import format_utc
from engine.core.timetable import Timetable
from engine.ledger.params import SchedulesCreate, TaskTypesPut
from engine.ledger.postgres import open_postgres_ledger
from engine.model import ExecutionStatus, HandlerKind, Schedule, TaskType
from tests.e2e.harness import EVERY_2_S, executions_of, running_node, wait_for_execution
from tests.handlers.rabbitmq_broker import (
    RabbitServer,
    Topology,
    consume_once_per_message_id,
    effects,
    rabbit_server,
    topology,
)
from tests.ledger.backends import postgres_template_database

__all__ = ["rabbit_server", "topology"]  # the fixtures, imported for this module's tests

pytestmark = pytest.mark.postgres


@pytest.fixture
async def url(database_url: str, postgres_template: str) -> AsyncIterator[str]:
    async with postgres_template_database(database_url, postgres_template) as fresh:
        yield fresh


async def test_each_fire_is_published_with_its_execution_id_as_message_id(
    url: str, topology: Topology
) -> None:
    async with open_postgres_ledger(url) as ledger:
        async with running_node(url):
            await ledger.task_types_put(
                TaskTypesPut(
                    TaskType(
                        name="ticks",
                        kind=HandlerKind.RABBITMQ,
                        allowed_tenants=("*",),
                        settings={
                            "url": topology.url,
                            "exchange": topology.exchange,
                            "routing_key": topology.routing_key,
                            "timeout_s": 2,
                        },
                    )
                )
            )
            now = await ledger.database_now()
            first = Timetable.compile(EVERY_2_S).next_fire(now + timedelta(seconds=1)).planned_at
            await ledger.schedules_create(
                SchedulesCreate(
                    [
                        Schedule(
                            schedule_id="e2e-rabbitmq",
                            tenant_id="acme",
                            cron_expr=EVERY_2_S,
                            task_type="ticks",
                            next_run_at=first,
                            payload={"report": "daily"},
                        )
                    ]
                )
            )
            done = await wait_for_execution(
                ledger, "e2e-rabbitmq", lambda e: e.status is ExecutionStatus.SUCCEEDED
            )
            await wait_for_execution(
                ledger,
                "e2e-rabbitmq",
                lambda e: e.status is ExecutionStatus.SUCCEEDED and e.planned_at > done.planned_at,
            )
        executions = await executions_of(ledger, "e2e-rabbitmq")

    published = await trio.to_thread.run_sync(topology.drain)
    ids = [message.message_id for message in published]
    assert len(ids) == len(set(ids))
    succeeded = {e.execution_id for e in executions if e.status is ExecutionStatus.SUCCEEDED}
    assert succeeded <= set(ids)
    message = next(m for m in published if m.message_id == done.execution_id)
    assert message.headers["X-Carillon-Planned-At"] == format_utc(done.planned_at)
    assert message.delivery_mode == 2
    assert json.loads(message.body)["payload"] == {"report": "daily"}


async def test_a_publish_lost_with_its_node_is_redelivered_and_the_consumer_applies_it_once(
    url: str, rabbit_server: RabbitServer, tmp_path: Path
) -> None:
    """Node A's first publish hangs unconfirmed (a private node's memory alarm blocks
    publishers); A is stopped meanwhile, leaving its attempt running; node B redelivers it
    once the attempt lease runs out. Whether A's message reached the queue or not, the
    queue holds the execution once or twice (same message_id), and the consumer recipe
    applies it once."""
    target = Topology.unique(rabbit_server.url, durable=True)
    await trio.to_thread.run_sync(target.declare)
    async with open_postgres_ledger(url) as ledger:
        await ledger.task_types_put(
            TaskTypesPut(
                TaskType(
                    name="ticks",
                    kind=HandlerKind.RABBITMQ,
                    allowed_tenants=("*",),
                    settings={
                        "url": target.url,
                        "exchange": target.exchange,
                        "routing_key": target.routing_key,
                        "timeout_s": 30,
                    },
                    timeout_s=30,
                )
            )
        )
        now = await ledger.database_now()
        first = Timetable.compile(EVERY_2_S).next_fire(now + timedelta(seconds=1)).planned_at
        [schedule] = await ledger.schedules_create(
            SchedulesCreate(
                [
                    Schedule(
                        schedule_id="e2e-lost",
                        tenant_id="acme",
                        cron_expr=EVERY_2_S,
                        task_type="ticks",
                        next_run_at=first,
                    )
                ]
            )
        )
        await trio.to_thread.run_sync(rabbit_server.block_publishers)
        async with running_node(url, "e2e-a", seed=1, attempt_lease_s=4) as (_, stop_a):
            hanging = await wait_for_execution(
                ledger, schedule.schedule_id, lambda e: e.status is ExecutionStatus.RUNNING
            )
            await trio.sleep(0.5)  # its publish is on the wire
            stop_a.cancel()  # node A goes away while its publish hangs
        lost = (await ledger.executions_get(hanging.execution_id)).execution
        assert (lost.status, lost.attempt) == (ExecutionStatus.RUNNING, 1)
        await trio.to_thread.run_sync(rabbit_server.unblock_publishers)
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
    database = tmp_path / "consumer.sqlite"
    seen = await trio.to_thread.run_sync(
        consume_once_per_message_id, target.url, target.queue, database
    )
    applied = await trio.to_thread.run_sync(effects, database)
    assert applied.count(hanging.execution_id) == 1
    assert len(applied) == len(set(applied))  # every execution's effect once
    assert seen >= len(applied)
