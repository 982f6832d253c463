"""A real node on PostgreSQL delivers webhooks to a real HTTP receiver on 127.0.0.1.

Each test runs one node with short leases on a fresh database; the task type ``hook`` is a
signed webhook and its schedule fires every 2 seconds.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator

import pytest
import trio

from engine.cli import main
from engine.core.instants import format_utc
from engine.ledger.postgres import open_postgres_ledger
from engine.model import ExecutionStatus
from tests.cli.harness import create_token, serving
from tests.e2e.harness import (
    Delivery,
    Receiver,
    create_hook,
    executions_of,
    expected_signature,
    running_node,
    wait_for_execution,
)
from tests.ledger.backends import postgres_template_database

pytestmark = pytest.mark.postgres


@pytest.fixture
async def url(database_url: str, postgres_template: str) -> AsyncIterator[str]:
    async with postgres_template_database(database_url, postgres_template) as fresh:
        yield fresh


def answer(status: int) -> Receiver:
    return Receiver(lambda delivery, before: status)


async def test_a_delivery_carries_the_context_the_idempotency_headers_and_a_valid_signature(
    url: str,
) -> None:
    with answer(200).running() as receiver:
        async with open_postgres_ledger(url) as ledger, running_node(url):
            schedule = await create_hook(ledger, receiver.url)
            done = await wait_for_execution(
                ledger, schedule.schedule_id, lambda e: e.status is ExecutionStatus.SUCCEEDED
            )
    assert done.attempt == 1
    [delivery] = receiver.of(done.execution_id)
    headers = delivery.headers
    assert headers["idempotency-key"] == done.execution_id
    assert headers["x-carillon-execution-id"] == done.execution_id
    assert headers["x-carillon-schedule-id"] == schedule.schedule_id
    assert headers["x-carillon-planned-at"] == format_utc(done.planned_at)
    assert headers["x-carillon-attempt"] == "1"
    assert headers["x-carillon-fencing-token"] == str(done.fencing_token)
    assert int(headers["x-carillon-fencing-token"]) >= 1
    assert headers["content-type"] == "application/json"
    assert json.loads(delivery.body) == {
        "execution_id": done.execution_id,
        "schedule_id": schedule.schedule_id,
        "tenant_id": "acme",
        "task_type": "hook",
        "planned_at": format_utc(done.planned_at),
        "attempt": 1,
        "fencing_token": done.fencing_token,
        "payload": {"report": "daily", "n": 3},
    }
    assert "." not in headers["webhook-id"]  # the spec forbids full stops in message ids
    assert abs(int(headers["webhook-timestamp"]) - time.time()) < 60
    assert headers["webhook-signature"] == expected_signature(
        headers["webhook-id"], headers["webhook-timestamp"], delivery.body
    )


async def test_a_server_error_is_retried_under_the_same_idempotency_key_until_it_succeeds(
    url: str,
) -> None:
    def first_fails(delivery: Delivery, before: int) -> int:
        return 500 if before == 0 else 200

    with Receiver(first_fails).running() as receiver:
        async with open_postgres_ledger(url) as ledger, running_node(url):
            schedule = await create_hook(
                ledger, receiver.url, backoff_base_s=0.1, backoff_max_s=0.5
            )
            done = await wait_for_execution(
                ledger, schedule.schedule_id, lambda e: e.status is ExecutionStatus.SUCCEEDED
            )
            detail = await ledger.executions_get(done.execution_id)
    assert done.attempt == 2
    assert [(a.attempt, a.outcome, a.error_code) for a in detail.attempts] == [
        (1, "failed", "http_500"),
        (2, "succeeded", None),
    ]
    first, second = receiver.of(done.execution_id)
    assert first.key == second.key == done.execution_id
    assert first.headers["webhook-id"] == second.headers["webhook-id"]
    assert (first.headers["x-carillon-attempt"], second.headers["x-carillon-attempt"]) == ("1", "2")
    assert receiver.applied[done.execution_id] == 1
    assert done.execution_id not in receiver.duplicates  # the 500 applied nothing


async def test_a_client_error_dead_letters_at_once_and_a_replay_succeeds_with_history_kept(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    receiver = answer(400)
    with receiver.running():
        async with open_postgres_ledger(url) as ledger, running_node(url):
            schedule = await create_hook(ledger, receiver.url)
            dead = await wait_for_execution(
                ledger, schedule.schedule_id, lambda e: e.status is ExecutionStatus.DEAD_LETTER
            )
            assert (dead.attempt, dead.error_code) == (1, "http_400")
            assert len(receiver.of(dead.execution_id)) == 1
            receiver.policy = lambda delivery, before: 200  # the receiver is fixed
            token = await create_token(ledger)
            async with serving(ledger, time.monotonic) as (api_url, _):
                argv = ["dlq", "replay", dead.execution_id, "--url", api_url, "--token", token]
                assert await trio.to_thread.run_sync(main, argv) == 0
            assert "replayed 1 of 1 dead letters" in capsys.readouterr().out
            done = await wait_for_execution(
                ledger,
                schedule.schedule_id,
                lambda e: (
                    e.execution_id == dead.execution_id and e.status is ExecutionStatus.SUCCEEDED
                ),
            )
            detail = await ledger.executions_get(dead.execution_id)
    assert done.attempt == 2
    assert [(a.attempt, a.outcome, a.error_code) for a in detail.attempts] == [
        (1, "dead-letter", "http_400"),
        (2, "succeeded", None),
    ]
    first, second = receiver.of(dead.execution_id)
    assert first.key == second.key == dead.execution_id
    assert second.headers["x-carillon-attempt"] == "2"


async def test_without_the_allow_list_loopback_is_refused_and_the_receiver_sees_nothing(
    url: str,
) -> None:
    with answer(200).running() as receiver:
        async with open_postgres_ledger(url) as ledger, running_node(url, allow_loopback=False):
            schedule = await create_hook(ledger, receiver.url)
            dead = await wait_for_execution(
                ledger, schedule.schedule_id, lambda e: e.status is ExecutionStatus.DEAD_LETTER
            )
            everything = await executions_of(ledger, schedule.schedule_id)
    assert (dead.attempt, dead.error_code) == (1, "ssrf_refused")
    assert dead.error_message is not None
    assert "127.0.0.1" in dead.error_message
    assert not any(e.status is ExecutionStatus.SUCCEEDED for e in everything)
    assert receiver.deliveries == []
