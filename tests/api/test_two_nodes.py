"""Two real nodes on one PostgreSQL database, each serving the API on its own port.

What a load balancer relies on: a write through either node is visible through the other,
reaches the planner that owns the schedule (on whichever node) and runs there; a trigger
through one node runs on the owner at once; the cluster view is the same from both.
"""

from __future__ import annotations

import random
from typing import Any

import httpx
import pytest
import trio

from engine.api.auth import new_token
from engine.clock import SystemClock
from engine.config import NodeConfig
from engine.ledger.params import TokensCreate
from engine.ledger.postgres import open_postgres_ledger
from engine.model import ApiToken
from engine.node import Node
from tests.ledger.backends import postgres_template_database, put_noop_task_type

pytestmark = pytest.mark.postgres


def _config(node_id: str) -> NodeConfig:
    return NodeConfig(
        node_id=node_id,
        lease_ttl_s=3,
        lease_safety_margin_s=0.5,
        lookahead_s=1,
        clock_probe_interval_s=1,
        change_poll_interval_s=1,
        shutdown_timeout_s=5,
        http="127.0.0.1:0",
    )


async def _wait_for(predicate: Any, timeout_s: float = 10.0) -> None:
    with trio.fail_after(timeout_s):
        while not await predicate():
            await trio.sleep(0.1)


async def test_two_nodes_on_different_ports_serve_the_same_data_and_either_write_runs(
    database_url: str, postgres_template: str
) -> None:
    async with (
        postgres_template_database(database_url, postgres_template) as url,
        open_postgres_ledger(url) as setup,
        open_postgres_ledger(url) as ledger_a,
        open_postgres_ledger(url) as ledger_b,
    ):
        await put_noop_task_type(setup)
        token_id, token, token_hash = new_token()
        await setup.tokens_create(
            TokensCreate(ApiToken(token_id=token_id, scope="admin"), token_hash, "test")
        )
        headers = {"Authorization": f"Bearer {token}"}
        a = Node(_config("api-a"), ledger_a, SystemClock(), random.Random(1))
        b = Node(_config("api-b"), ledger_b, SystemClock(), random.Random(2))
        async with trio.open_nursery() as nursery:
            await nursery.start(a.run)
            await nursery.start(b.run)
            assert a.api is not None
            assert b.api is not None
            [url_a], [url_b] = a.api.bound, b.api.bound
            assert url_a != url_b
            async with (
                httpx.AsyncClient(base_url=url_a, headers=headers) as via_a,
                httpx.AsyncClient(base_url=url_b, headers=headers) as via_b,
            ):
                await _wait_for(lambda: _balanced(a, b))
                # Schedules written through A, whichever node owns their partitions.
                for n in range(8):
                    created = await via_a.put(
                        f"/v1/schedules/two-{n}",
                        json={"cron_expr": "* * * * * *", "task_type": "noop"},
                    )
                    assert created.status_code == 201, created.text
                read = await via_b.get("/v1/schedules/two-3")
                assert read.status_code == 200
                assert read.json()["cron_expr"] == "* * * * * *"
                owners = {a.config.node_id: a.table, b.config.node_id: b.table}
                partitions = {
                    (await via_b.get(f"/v1/schedules/two-{n}")).json()["partition_id"]
                    for n in range(8)
                }
                assert any(p in owners["api-a"] for p in partitions)
                assert any(p in owners["api-b"] for p in partitions)

                async def every_schedule_ran() -> bool:
                    page = (await via_b.get("/v1/executions?status=succeeded&limit=1000")).json()
                    return {e["schedule_id"] for e in page["items"]} == {
                        f"two-{n}" for n in range(8)
                    }

                await _wait_for(every_schedule_ran)

                # A trigger through B of a schedule A plans runs under its own id.
                paused = await via_b.post("/v1/schedules/two-0:pause", json={})
                assert paused.json()["enabled"] is False
                triggered = await via_b.post("/v1/schedules/two-0:trigger", json={})
                assert triggered.status_code == 201
                execution_id = triggered.json()["execution_id"]

                async def trigger_ran() -> bool:
                    answer = await via_a.get(f"/v1/executions/{execution_id}")
                    return bool(answer.json()["execution"]["status"] == "succeeded")

                await _wait_for(trigger_ran)

                # Both nodes show the same cluster, with each owner's reported planner lag.
                async def lags_reported() -> bool:
                    view = (await via_a.get("/v1/cluster")).json()
                    return all(p["planner_lag_s"] is not None for p in view["partitions"])

                await _wait_for(lags_reported)
                view_a = (await via_a.get("/v1/cluster")).json()
                view_b = (await via_b.get("/v1/cluster")).json()
                assert [n["node_id"] for n in view_a["nodes"]] == ["api-a", "api-b"]
                assert [p["owner_id"] for p in view_a["partitions"]] == [
                    p["owner_id"] for p in view_b["partitions"]
                ]
                assert all(p["planner_lag_s"] < 5 for p in view_a["partitions"])
                metrics = await via_b.get("/metrics")
                assert metrics.status_code == 200
                assert "execution_attempts_total" in metrics.text
            nursery.cancel_scope.cancel()


async def _balanced(a: Node, b: Node) -> bool:
    return len(a.table) + len(b.table) == 8 and abs(len(a.table) - len(b.table)) <= 1
