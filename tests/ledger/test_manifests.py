"""``manifests_apply`` on real Postgres: two applies of one set, from two nodes, serialize on
the set's advisory lock -- the second plans against the first one's result -- while an
apply of another set does not wait; and the labels table keeps one owner per object."""

from __future__ import annotations

import threading

import pytest
import trio

from engine.ledger.base import Ledger
from engine.ledger.manifests import (
    ManifestAction,
    ManifestChange,
    ManifestKind,
    ManifestsApply,
    ManifestState,
)
from engine.ledger.postgres import open_postgres_ledger
from tests.ledger.backends import postgres_template_database, put_noop_task_type, schedule, sql

pytestmark = pytest.mark.postgres

WAIT_S = 10.0
"""How long a test waits for the database to reach a state before it fails."""


class Recorder:
    """A planner that creates the schedules it is given unless they exist, remembers what
    it saw, and (``gate``) blocks its thread until the test opens the gate."""

    def __init__(self, ids: list[str], gate: threading.Event | None = None) -> None:
        self.ids = ids
        self.gate = gate
        self.saw: list[list[str]] = []
        self.entered = threading.Event()

    def __call__(self, state: ManifestState) -> list[ManifestChange]:
        self.saw.append(sorted(state.schedules))
        self.entered.set()
        if self.gate is not None and not self.gate.wait(WAIT_S):
            raise AssertionError("the test never opened the gate")
        return [
            ManifestChange(
                ManifestKind.SCHEDULE,
                key,
                ManifestAction.CREATE,
                schedule(key, next_run_at=state.now),
                0,
            )
            for key in self.ids
            if key not in state.schedules
        ]


async def waiting_on_advisory_locks(url: str) -> int:
    rows = await sql(
        url, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
    )
    return int(rows[0][0])


async def until_waiting(url: str, expected: int) -> None:
    """Until ``expected`` transactions wait on an advisory lock (a real database's state:
    polled, within :data:`WAIT_S`)."""
    with trio.fail_after(WAIT_S):
        while await waiting_on_advisory_locks(url) != expected:
            await trio.sleep(0.02)


async def test_two_applies_of_one_set_serialize(database_url: str, postgres_template: str) -> None:
    ids = ["a", "b", "c"]
    gate = threading.Event()
    first, second = Recorder(ids, gate), Recorder(ids)
    async with (
        postgres_template_database(database_url, postgres_template) as url,
        open_postgres_ledger(url) as one,
        open_postgres_ledger(url) as two,
    ):
        await put_noop_task_type(one)
        results: dict[str, int] = {}

        async def run(name: str, ledger: Ledger, plan: Recorder) -> None:
            done = await ledger.manifests_apply(ManifestsApply("ops", name, plan, ids))
            results[name] = len(done)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(run, "first", one, first)
            with trio.fail_after(WAIT_S):
                while not first.entered.is_set():
                    await trio.sleep(0.01)
            nursery.start_soon(run, "second", two, second)
            await until_waiting(url, 1)  # the second waits on the set's lock...
            assert second.saw == []  # ...before it read anything
            gate.set()
        assert results == {"first": 3, "second": 0}
        assert second.saw == [ids]  # it planned against the first one's schedules
        labels = await sql(url, "SELECT kind, name, manifest_set FROM manifest_labels ORDER BY 2")
        assert [tuple(row) for row in labels] == [("schedule", key, "ops") for key in ids]


async def test_another_set_does_not_wait(database_url: str, postgres_template: str) -> None:
    gate = threading.Event()
    slow = Recorder(["a"], gate)
    async with (
        postgres_template_database(database_url, postgres_template) as url,
        open_postgres_ledger(url) as one,
        open_postgres_ledger(url) as two,
    ):
        await put_noop_task_type(one)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(one.manifests_apply, ManifestsApply("ops", "first", slow, ["a"]))
            with trio.fail_after(WAIT_S):
                while not slow.entered.is_set():
                    await trio.sleep(0.01)
            with trio.fail_after(WAIT_S):
                done = await two.manifests_apply(
                    ManifestsApply("other", "second", Recorder(["z"]), ["z"])
                )
            assert [change.name for change in done] == ["z"]
            gate.set()
