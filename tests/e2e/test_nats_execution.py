"""A real node on PostgreSQL publishes a nats task type's fires to a real JetStream stream,
through the whole execution path, with a private ``nats-server -js``."""

from __future__ import annotations

import json
import random
from collections.abc import AsyncIterator
from datetime import timedelta

import httpx
import msgspec
import pytest
import trio

from engine.clock import SystemClock
from engine.core.instants import format_utc
from engine.core.timetable import Timetable
from engine.ledger.params import SchedulesCreate, TaskTypesPut
from engine.ledger.postgres import open_postgres_ledger
from engine.model import ExecutionStatus, HandlerKind, Schedule, TaskType
from engine.node import Node
from tests.cli.harness import create_token
from tests.e2e.harness import (
    EVERY_2_S,
    executions_of,
    node_config,
    running_node,
    wait_for_execution,
)
from tests.handlers.nats_server import NatsServer, add_stream, messages, nats_server
from tests.ledger.backends import postgres_template_database

__all__ = ["nats_server"]  # the fixture, imported for this module's tests

pytestmark = pytest.mark.postgres


@pytest.fixture
async def url(database_url: str, postgres_template: str) -> AsyncIterator[str]:
    async with postgres_template_database(database_url, postgres_template) as fresh:
        yield fresh


async def test_each_fire_is_published_once_with_its_context(
    url: str, nats_server: NatsServer
) -> None:
    await trio.to_thread.run_sync(add_stream, nats_server.url, "TICKS", ["ticks.>"])
    async with open_postgres_ledger(url) as ledger:
        async with running_node(url):
            await ledger.task_types_put(
                TaskTypesPut(
                    TaskType(
                        name="ticks",
                        kind=HandlerKind.NATS,
                        allowed_tenants=("*",),
                        settings={
                            "url": nats_server.url,
                            "subject": "ticks.report",
                            "stream": "TICKS",
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
                            schedule_id="e2e-nats",
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
                ledger, "e2e-nats", lambda e: e.status is ExecutionStatus.SUCCEEDED
            )
            await wait_for_execution(
                ledger,
                "e2e-nats",
                lambda e: e.status is ExecutionStatus.SUCCEEDED and e.planned_at > done.planned_at,
            )
        executions = await executions_of(ledger, "e2e-nats")

    published = await trio.to_thread.run_sync(messages, nats_server.url, "TICKS", "ticks.report")
    ids = [headers["Nats-Msg-Id"] for headers, _ in published]
    assert len(ids) == len(set(ids))
    succeeded = {e.execution_id for e in executions if e.status is ExecutionStatus.SUCCEEDED}
    assert succeeded <= set(ids)
    headers, data = next(m for m in published if m[0]["Nats-Msg-Id"] == done.execution_id)
    assert headers["X-Carillon-Planned-At"] == format_utc(done.planned_at)
    assert json.loads(data)["payload"] == {"report": "daily"}


async def test_a_nodes_api_warns_of_a_short_duplicate_window_through_its_own_policy(
    url: str, nats_server: NatsServer
) -> None:
    """The node wires its ``--broker-allow-cidrs`` and a broker bridge into its API: a write
    of a nats task type answers the stream's short window."""
    await trio.to_thread.run_sync(
        lambda: add_stream(nats_server.url, "TICKS", ["ticks.>"], duplicate_window=10)
    )
    config = msgspec.structs.replace(node_config("e2e-api"), http="127.0.0.1:0")
    body = {"kind": "nats", "settings": {"url": nats_server.url, "subject": "ticks.report"}}
    async with open_postgres_ledger(url) as ledger, trio.open_nursery() as nursery:
        token = await create_token(ledger)
        node = Node(config, ledger, SystemClock(), random.Random(1))
        nursery.start_soon(node.run)
        api = node.api
        assert api is not None
        with trio.fail_after(15):
            while not api.bound:
                await trio.sleep(0.05)
        async with httpx.AsyncClient(base_url=api.bound[0]) as client:
            answer = await client.put(
                "/v1/task-types/ticks", json=body, headers={"Authorization": f"Bearer {token}"}
            )
        nursery.cancel_scope.cancel()

    assert answer.status_code == 200, answer.text
    [warning] = answer.json()["warnings"]
    assert warning["code"] == "nats_duplicate_window_short"
    assert "duplicate window (10 s) is shorter" in warning["message"]
