"""A worker killed mid-execution: its attempt is redelivered once its attempt lease runs out,
under the same idempotency key, and an idempotent receiver applies the effect once.

Node A takes the first delivery of the first execution; the receiver applies the effect and
then never answers (the reply is lost). A is stopped while the handler hangs: its leases are
released, but the attempt stays ``running`` until its attempt lease (shortened here; A no
longer renews it) expires. Node B takes the partitions over, its redeliverer re-queues the
attempt, its workers deliver it again, and the receiver answers 200 without applying the
effect a second time.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import trio

from engine.ledger.postgres import open_postgres_ledger
from engine.model import ExecutionStatus
from tests.e2e.harness import (
    HANG,
    Delivery,
    Receiver,
    create_hook,
    running_node,
    wait_for_execution,
)
from tests.ledger.backends import postgres_template_database

pytestmark = pytest.mark.postgres

TIMEOUT_S = 3.0
ATTEMPT_LEASE_S = 4.0
"""Short, so the lost attempt runs out soon; node A no longer renews it once stopped."""


@pytest.fixture
async def url(database_url: str, postgres_template: str) -> AsyncIterator[str]:
    async with postgres_template_database(database_url, postgres_template) as fresh:
        yield fresh


async def test_an_attempt_lost_with_its_node_is_redelivered_and_applied_once(url: str) -> None:
    victim: list[str] = []

    def hang_first(delivery: Delivery, before: int) -> int:
        if not victim:
            victim.append(delivery.key)
            return HANG
        return 200

    with Receiver(hang_first).running() as receiver:
        async with open_postgres_ledger(url) as ledger:
            schedule = await create_hook(ledger, receiver.url, timeout_s=TIMEOUT_S)
            async with running_node(url, "e2e-a", seed=1, attempt_lease_s=ATTEMPT_LEASE_S) as (
                _,
                stop_a,
            ):
                with trio.fail_after(10):
                    while not victim:
                        await trio.sleep(0.05)
                stop_a.cancel()  # node A goes away while its handler hangs
            [key] = victim
            lost = (await ledger.executions_get(key)).execution
            assert (lost.status, lost.attempt) == (ExecutionStatus.RUNNING, 1)
            async with running_node(url, "e2e-b", seed=2, attempt_lease_s=ATTEMPT_LEASE_S) as (
                node_b,
                _,
            ):
                done = await wait_for_execution(
                    ledger,
                    schedule.schedule_id,
                    lambda e: e.execution_id == key and e.status is ExecutionStatus.SUCCEEDED,
                    timeout_s=25,
                )
                assert node_b.redeliverer.statistics().requeued >= 1
            detail = await ledger.executions_get(key)
    assert done.attempt == 2
    assert [(a.attempt, a.outcome) for a in detail.attempts] == [(1, "expired"), (2, "succeeded")]
    first, second = receiver.of(key)
    assert first.key == second.key == key
    assert (first.headers["x-carillon-attempt"], second.headers["x-carillon-attempt"]) == ("1", "2")
    assert (receiver.applied[key], receiver.duplicates[key]) == (1, 1)  # 2 deliveries, 1 effect
