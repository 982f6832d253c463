"""Editing a schedule's payload through a manifest set while a node runs it: the apply is
one change, and no fire is skipped or run twice across it."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import trio
import trio.testing

from engine.api.routes_manifests import ApplyIn, planner
from engine.ledger.manifests import ManifestAction, ManifestsApply
from engine.ledger.params import TaskTypesPut
from engine.model import HandlerKind, TaskType
from tests.actors.harness import START, TEST_TENANTS, cluster

runs: list[tuple[str, int, dict[str, Any]]] = []
"""What :func:`record` was run with: execution id, attempt, payload."""


async def record(context: Any) -> None:
    runs.append((context.execution_id, context.attempt, dict(context.payload)))


def body(n: int) -> ApplyIn:
    item = {
        "schedule_id": "s",
        "tenant_id": "acme",
        "cron_expr": "* * * * *",
        "task_type": "record",
        "payload": {"n": n},
    }
    return ApplyIn(manifest_set="ops", schedules=[item])


async def apply(ledger: Any, n: int) -> list[ManifestAction]:
    manifests = body(n)
    done = await ledger.manifests_apply(
        ManifestsApply("ops", "test", planner(manifests, None), schedule_ids=["s"])
    )
    return [change.action for change in done]


async def test_a_payload_edit_inside_the_lookahead_skips_and_repeats_no_fire(
    autojump_clock: trio.testing.MockClock,
) -> None:
    runs.clear()
    async with cluster(lookahead_s=60) as c:
        await c.ledger.task_types_put(
            TaskTypesPut(
                TaskType(
                    name="record",
                    kind=HandlerKind.PYTHON,
                    allowed_tenants=TEST_TENANTS,
                    settings={"callable": f"{__name__}:record"},
                    max_attempts=1,
                )
            )
        )
        assert await apply(c.ledger, 1) == [ManifestAction.CREATE]
        await c.start_node("n1")
        edit_at = START.replace(second=0) + timedelta(minutes=3, seconds=57)
        await trio.sleep((edit_at - c.db_clock.now()).total_seconds())
        assert await apply(c.ledger, 2) == [ManifestAction.UPDATE]
        assert await apply(c.ledger, 2) == []
        end = START.replace(second=0) + timedelta(minutes=7, seconds=30)
        await trio.sleep((end - c.db_clock.now()).total_seconds())
    first = START.replace(second=0) + timedelta(minutes=1)
    expected = [
        f"s:{(first + timedelta(minutes=m)).strftime('%Y-%m-%dT%H:%M:%SZ')}" for m in range(7)
    ]
    ran = sorted(execution_id for execution_id, _, _ in runs)
    assert ran == expected  # each minute once: none skipped, none repeated
    payloads = {execution_id: payload for execution_id, _, payload in runs}
    assert payloads[expected[2]] == {"n": 1}
    assert payloads[expected[-1]] == {"n": 2}
