"""What only the PostgreSQL ledger must show: real concurrency, LISTEN/NOTIFY, lost connections.

The shared behaviour is in ``test_contract.py``. Here, races are made deterministic by an
outside transaction that holds a row lock while the ledger's transaction queues behind it
(``pg_stat_activity`` tells when it does), and a database restart is simulated by
terminating this test's own backends (the shared server is never restarted). Real clock
only: a MockClock would fire timeouts while a query is in flight.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import secrets
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

import asyncpg
import msgspec
import pytest
import trio

from engine.errors import LedgerUnavailable, NotFound, QuotaExceeded, VersionConflict
from engine.ledger.bridge import DatabaseBridge
from engine.ledger.database import url_with_database
from engine.ledger.params import (
    Completion,
    DeadLettersReplay,
    ExecutionsClaim,
    ExecutionsComplete,
    ExecutionsPlan,
    ExecutionsQuery,
    ExecutionsTrigger,
    Fence,
    LeasesAcquire,
    LeasesRelease,
    LeasesRenew,
    Outcome,
    PlannedExecution,
    PlanResult,
    ScheduleAdvance,
    ScheduleChangesSince,
    SchedulesCreate,
    SchedulesDelete,
    SchedulesUpdate,
    SessionsCreate,
    TaskTypesPut,
    TenantsPut,
    TokensCreate,
    TokensRevoke,
)
from engine.ledger.postgres import (
    PostgresLedger,
    migrate_database,
    open_postgres_ledger,
    sql_executions,
)
from engine.ledger.postgres import sql as pg_sql
from engine.ledger.postgres.caps import cap_lock_key
from engine.ledger.postgres.rows import int_array, text_array, timestamptz_array
from engine.ledger.postgres.sql import AUDIT_LOCK_KEY, CAP_LOCK_SPACE
from engine.ledger.postgres.store import statistics_stale
from engine.model import (
    ApiToken,
    ExecutionStatus,
    HandlerKind,
    Schedule,
    TaskType,
    Tenant,
    execution_id,
)
from tests.ledger.backends import ids_in_partition, put_noop_task_type, schedule, sql

pytestmark = pytest.mark.postgres

PARTITIONS = 8
LONG_TTL_S = 60.0


# --- helpers ----------------------------------------------------------------------------------


@pytest.fixture
async def url(database_url: str) -> AsyncIterator[str]:
    """A migrated database of this test's own (8 partitions), dropped afterwards."""
    name = f"{urlsplit(database_url).path.lstrip('/')}_p{secrets.token_hex(4)}"
    await sql(database_url, f'CREATE DATABASE "{name}"')
    try:
        migrated = url_with_database(database_url, name)
        await migrate_database(migrated, partitions=PARTITIONS)
        async with open_postgres_ledger(migrated) as ledger:
            await put_noop_task_type(ledger)
        yield migrated
    finally:
        with trio.CancelScope(shield=True):
            await sql(database_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@asynccontextmanager
async def holding_lock(
    bridge: DatabaseBridge, url: str, statement: str, *args: Any
) -> AsyncIterator[None]:
    """An outside transaction that ran ``statement`` (a row lock) and holds it in the block."""
    connection = await bridge.call(asyncpg.connect, url)
    try:
        await bridge.call(connection.execute, "BEGIN")
        await bridge.call(connection.execute, statement, *args)
        yield
    finally:
        with trio.CancelScope(shield=True):
            await bridge.call(connection.close)  # rolls back, releasing the lock


async def wait_for_lock_waiters(url: str, count: int) -> list[int]:
    """Poll until ``count`` backends of this database wait on a lock; their pids."""
    with trio.fail_after(10):
        while True:
            rows = await sql(
                url,
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock' ORDER BY backend_start",
            )
            if len(rows) >= count:
                return [row[0] for row in rows]
            await trio.sleep(0.02)


async def terminate_backends(url: str, *, query_like: str = "%") -> int:
    """Kill this database's other backends (as a server restart would); how many."""
    rows = await sql(
        url,
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
        "WHERE datname = current_database() AND pid <> pg_backend_pid() AND query LIKE $1",
        query_like,
    )
    return len(rows)


async def own(
    ledger: PostgresLedger, partition: int, owner: str = "node-a", ttl_s: float = LONG_TTL_S
) -> Fence:
    [lease] = await ledger.leases_acquire(LeasesAcquire(owner, [partition], ttl_s))
    return Fence(partition, owner, lease.fencing_token)


def plan_one(fence: Fence, schedule_id: str, at: Any, checkpoint: Any = None) -> ExecutionsPlan:
    return ExecutionsPlan(
        fence,
        [PlannedExecution(schedule_id, "acme", "noop", at)],
        [ScheduleAdvance(schedule_id, at + timedelta(minutes=1), expected_version=1)],
        checkpoint=checkpoint,
    )


async def statuses_of(ledger: PostgresLedger, schedule_id: str) -> list[ExecutionStatus]:
    page = await ledger.executions_query(ExecutionsQuery(schedule_id=schedule_id, limit=1000))
    return [execution.status for execution in page.items]


# --- change feed ------------------------------------------------------------------------------


async def test_a_commit_in_one_ledger_wakes_a_waiter_in_another(url: str) -> None:
    async with open_postgres_ledger(url) as waiting, open_postgres_ledger(url) as writing:
        head = await waiting.schedule_changes_head()
        woke: list[tuple[bool, float]] = []

        async def waiter() -> None:
            started = trio.current_time()
            result = await waiting.schedule_changes_wait(head, timeout_s=30)
            woke.append((result, trio.current_time() - started))

        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(waiter)
                await trio.sleep(0.5)  # the waiter is parked on LISTEN by now
                await writing.schedules_create(SchedulesCreate([schedule("notified")]))

    [(result, waited_s)] = woke
    assert result is True
    assert 0.4 < waited_s < 5  # it really waited, and NOTIFY (not the 30 s timeout) woke it


async def test_a_lost_listen_connection_wakes_waiters_and_is_reopened(url: str) -> None:
    async with open_postgres_ledger(url) as waiting, open_postgres_ledger(url) as writing:
        head = await waiting.schedule_changes_head()
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                woke: list[bool] = []

                async def waiter() -> None:
                    woke.append(await waiting.schedule_changes_wait(head, timeout_s=30))

                nursery.start_soon(waiter)
                await trio.sleep(0.5)
                assert await terminate_backends(url, query_like="LISTEN%") == 1
        assert woke == [True]  # a spurious wake-up, which the contract allows

        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(waiter)
                await trio.sleep(0.5)
                await writing.schedules_create(SchedulesCreate([schedule("after-loss")]))
        assert woke == [True, True]
        assert await waiting.schedule_changes_wait(head + 1, timeout_s=0.1) is False


class SwallowingProxy:
    """A TCP proxy to the database that swallows the first client message containing
    ``pattern``, and everything its connection sends after it (a half-open connection, as
    far as the client can tell)."""

    def __init__(self, target_port: int, pattern: bytes) -> None:
        self._target_port = target_port
        self._pattern = pattern
        self.swallowed = 0
        self.port = 0

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        [listener] = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listener.socket.getsockname()[1]
        task_status.started()
        await trio.serve_listeners(self._handle, [listener])

    async def _handle(self, client: trio.SocketStream) -> None:
        server = await trio.open_tcp_stream("127.0.0.1", self._target_port)
        async with client, server, trio.open_nursery() as nursery:
            nursery.start_soon(self._pipe, client, server, True)
            nursery.start_soon(self._pipe, server, client, False)

    async def _pipe(self, source: trio.SocketStream, sink: trio.SocketStream, up: bool) -> None:
        swallowing = False
        while data := await source.receive_some(65536):
            if up and not swallowing and self.swallowed == 0 and self._pattern in data:
                swallowing = True
                self.swallowed += 1
            if not swallowing:
                await sink.send_all(data)
        await trio.sleep_forever()  # keep the other direction open


async def test_a_listen_that_hangs_is_unavailable_and_the_next_wait_opens_a_new_one(
    url: str,
) -> None:
    parts = urlsplit(url)
    proxy = SwallowingProxy(parts.port or 5432, b"LISTEN")
    async with trio.open_nursery() as nursery:
        await nursery.start(proxy.serve)
        proxied = parts._replace(netloc=f"{parts.username}@127.0.0.1:{proxy.port}").geturl()
        async with open_postgres_ledger(proxied, statement_timeout_s=0.3) as waiting:
            head = await waiting.schedule_changes_head()
            started = trio.current_time()
            with trio.fail_after(20), pytest.raises(LedgerUnavailable):
                await waiting.schedule_changes_wait(head, timeout_s=60)
            assert proxy.swallowed == 1
            assert trio.current_time() - started < 10  # the command timeout, not 60 s
            async with open_postgres_ledger(url) as writing:
                await writing.schedules_create(SchedulesCreate([schedule("after-hang")]))
            with trio.fail_after(10):
                assert await waiting.schedule_changes_wait(head, timeout_s=60) is True
        nursery.cancel_scope.cancel()


async def test_a_watermark_reader_misses_no_change_while_writers_race(url: str) -> None:
    seen: list[int] = []
    writers_done = trio.Event()

    async with open_postgres_ledger(url) as one, open_postgres_ledger(url) as two:

        async def writer(ledger: PostgresLedger, prefix: str) -> None:
            for n in range(12):
                [created] = await ledger.schedules_create(
                    SchedulesCreate([schedule(f"{prefix}-{n}")])
                )
                if n % 3 == 0:
                    await ledger.schedules_update(SchedulesUpdate(created, expected_version=1))

        async def reader() -> None:
            watermark = 0
            while True:
                done = writers_done.is_set()
                changes = await one.schedule_changes(ScheduleChangesSince(watermark))
                seen.extend(change.seq for change in changes)
                if changes:
                    watermark = changes[-1].seq
                if done and not changes:
                    return
                await trio.sleep(0.001)

        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(reader)
                async with trio.open_nursery() as writers:
                    for w in range(6):
                        writers.start_soon(writer, one if w % 2 else two, f"w{w}")
                writers_done.set()

    every = [row[0] for row in await sql(url, "SELECT seq FROM schedule_changes ORDER BY seq")]
    assert len(every) == 6 * (12 + 4)
    assert seen == every  # each change once, in seq order, none skipped by the watermark


# --- concurrent writers -----------------------------------------------------------------------


async def update_outcome(
    ledger: PostgresLedger, schedule_id: str, cron: str, outcomes: list[object]
) -> None:
    try:
        outcomes.append(
            await ledger.schedules_update(
                SchedulesUpdate(schedule(schedule_id, cron_expr=cron), expected_version=1)
            )
        )
    except VersionConflict as exc:
        outcomes.append(exc)


async def test_of_two_updates_from_the_same_version_exactly_one_wins(url: str) -> None:
    async with open_postgres_ledger(url) as one, open_postgres_ledger(url) as two:
        await one.schedules_create(SchedulesCreate([schedule(f"race-{n}") for n in range(10)]))
        for n in range(10):
            sid = f"race-{n}"
            outcomes: list[object] = []
            async with trio.open_nursery() as nursery:
                nursery.start_soon(update_outcome, one, sid, "1 * * * *", outcomes)
                nursery.start_soon(update_outcome, two, sid, "2 * * * *", outcomes)

            winners = [o for o in outcomes if isinstance(o, Schedule)]
            assert len(winners) == 1
            assert sum(isinstance(o, VersionConflict) for o in outcomes) == 1
            stored = await one.schedules_get(sid)
            assert (stored.version, stored.cron_expr) == (2, winners[0].cron_expr)
        changes = await one.schedule_changes(ScheduleChangesSince(0))
        assert sum(change.kind == "updated" for change in changes) == 10


async def test_a_delete_committed_first_stops_a_plan_waiting_on_the_lease(
    url: str, bridge: DatabaseBridge
) -> None:
    [sid] = ids_in_partition(3, 1)
    async with open_postgres_ledger(url) as ledger:
        await ledger.schedules_create(SchedulesCreate([schedule(sid)]))
        fence = await own(ledger, 3)
        at = (await ledger.database_now()).replace(microsecond=0)
        results = []

        async def plan() -> None:
            results.append(await ledger.executions_plan(plan_one(fence, sid, at)))

        lock = "SELECT 1 FROM partition_leases WHERE partition_id = 3 FOR UPDATE"
        async with trio.open_nursery() as nursery, holding_lock(bridge, url, lock):
            nursery.start_soon(plan)
            await wait_for_lock_waiters(url, 1)  # the plan is queued at its fence check
            await ledger.schedules_delete(SchedulesDelete(sid))

        [result] = results
        assert (result.inserted, result.advanced, result.stale) == ([], [], [sid])
        assert await statuses_of(ledger, sid) == []


async def test_fires_of_a_plan_committed_first_are_skipped_by_the_waiting_delete(
    url: str, bridge: DatabaseBridge
) -> None:
    [sid] = ids_in_partition(5, 1)
    async with open_postgres_ledger(url) as ledger:
        await ledger.schedules_create(SchedulesCreate([schedule(sid)]))
        fence = await own(ledger, 5)
        at = (await ledger.database_now()).replace(microsecond=0)
        first = await ledger.executions_plan(plan_one(fence, sid, at, checkpoint=at))
        assert first.inserted == [execution_id(sid, at)]
        later = at + timedelta(minutes=1)
        plan = ExecutionsPlan(
            fence, [PlannedExecution(sid, "acme", "noop", later)], [], checkpoint=later
        )
        results = []

        async def planner() -> None:
            results.append(await ledger.executions_plan(plan))

        async def deleter() -> None:
            await ledger.schedules_delete(SchedulesDelete(sid))

        # The plan stops at its last statement (the checkpoint row is locked outside) while
        # holding the schedule row; the delete then queues behind the plan.
        lock = "SELECT 1 FROM planner_checkpoints WHERE partition_id = 5 FOR UPDATE"
        async with trio.open_nursery() as nursery, holding_lock(bridge, url, lock):
            nursery.start_soon(planner)
            await wait_for_lock_waiters(url, 1)
            nursery.start_soon(deleter)
            await wait_for_lock_waiters(url, 2)

        [result] = results
        assert result.inserted == [execution_id(sid, later)]
        assert await statuses_of(ledger, sid) == [ExecutionStatus.SKIPPED] * 2
        detail = await ledger.executions_get(execution_id(sid, later))
        assert detail.execution.error_code == "schedule_deleted"


async def test_plans_racing_deletes_never_leave_a_queued_orphan(url: str) -> None:
    sids = ids_in_partition(1, 40, prefix="orphan")
    async with open_postgres_ledger(url, pool_max=12) as ledger:
        await ledger.schedules_create(SchedulesCreate([schedule(s) for s in sids]))
        fence = await own(ledger, 1)
        at = (await ledger.database_now()).replace(microsecond=0)
        async with trio.open_nursery() as nursery:
            for n, sid in enumerate(sids):
                if n % 2:
                    nursery.start_soon(ledger.schedules_delete, SchedulesDelete(sid))
                    nursery.start_soon(ledger.executions_plan, plan_one(fence, sid, at))
                else:
                    nursery.start_soon(ledger.executions_plan, plan_one(fence, sid, at))
                    nursery.start_soon(ledger.schedules_delete, SchedulesDelete(sid))
        for sid in sids:
            assert set(await statuses_of(ledger, sid)) <= {ExecutionStatus.SKIPPED}


@asynccontextmanager
async def plan_in_flight(
    ledger: PostgresLedger, bridge: DatabaseBridge, url: str, fence: Fence, sid: str, at: Any
) -> AsyncIterator[list[PlanResult]]:
    """Inside: a fenced plan of ``sid``'s fire at ``at`` that holds its fence (the lease row
    locked) and is stuck further on, on the partition's checkpoint row; on exit it commits,
    its result in the yielded list."""
    results: list[PlanResult] = []

    async def plan() -> None:
        fire = PlannedExecution(sid, "acme", "noop", at)
        results.append(await ledger.executions_plan(ExecutionsPlan(fence, [fire], [], at)))

    lock = f"SELECT 1 FROM planner_checkpoints WHERE partition_id = {fence.partition_id} FOR UPDATE"
    async with trio.open_nursery() as nursery, holding_lock(bridge, url, lock):
        nursery.start_soon(plan)
        await wait_for_lock_waiters(url, 1)
        yield results


async def test_a_takeover_waits_for_the_fenced_transaction_in_flight(
    url: str, bridge: DatabaseBridge
) -> None:
    [sid] = ids_in_partition(6, 1)
    async with open_postgres_ledger(url) as ledger:
        await ledger.schedules_create(SchedulesCreate([schedule(sid)]))
        fence = await own(ledger, 6, "old", ttl_s=0.5)
        at = (await ledger.database_now()).replace(microsecond=0)
        await ledger.executions_plan(plan_one(fence, sid, at, checkpoint=at))
        fence = Fence(
            6, "old", (await ledger.leases_renew(LeasesRenew([fence], 0.5)))[0].fencing_token
        )
        later = at + timedelta(minutes=1)
        async with plan_in_flight(ledger, bridge, url, fence, sid, later) as results:
            await trio.sleep(0.7)  # the lease expires while the fenced write is in flight
            # The lease row is key-share-locked by that transaction: nobody takes it yet.
            assert await ledger.leases_acquire(LeasesAcquire("new", [6], LONG_TTL_S)) == []
        assert results[0].inserted == [execution_id(sid, later)]
        [taken] = await ledger.leases_acquire(LeasesAcquire("new", [6], LONG_TTL_S))
        assert taken.fencing_token == fence.fencing_token + 1


async def test_the_owner_renews_and_releases_without_waiting_for_its_fenced_write_in_flight(
    url: str, bridge: DatabaseBridge
) -> None:
    [sid] = ids_in_partition(6, 1)
    async with open_postgres_ledger(url) as ledger:
        await ledger.schedules_create(SchedulesCreate([schedule(sid)]))
        fence = await own(ledger, 6, "old")
        at = (await ledger.database_now()).replace(microsecond=0)
        await ledger.executions_plan(plan_one(fence, sid, at, checkpoint=at))
        later = at + timedelta(minutes=1)
        async with plan_in_flight(ledger, bridge, url, fence, sid, later) as results:
            with trio.fail_after(5):
                [renewed] = await ledger.leases_renew(LeasesRenew([fence], LONG_TTL_S))
                assert renewed.fencing_token == fence.fencing_token
                assert await ledger.leases_release(LeasesRelease([fence])) == 1
            # Released, but the fenced write is still in flight: nobody takes the row yet.
            assert await ledger.leases_acquire(LeasesAcquire("new", [6], LONG_TTL_S)) == []
        assert results[0].inserted == [execution_id(sid, later)]
        [taken] = await ledger.leases_acquire(LeasesAcquire("new", [6], LONG_TTL_S))
        assert taken.fencing_token == fence.fencing_token + 1


# --- cluster-wide concurrency caps ------------------------------------------------------------

CAP = 3
CAP_LOCK = "SELECT pg_advisory_xact_lock($1::integer, $2::integer)"


@asynccontextmanager
async def two_nodes(
    url: str, per_partition: int
) -> AsyncIterator[list[tuple[PostgresLedger, Fence, list[str]]]]:
    """Two ledgers -- each with its own bridge thread and pool, as two nodes have -- owning
    partitions 0 and 1, each with ``per_partition`` startable executions of the task type
    ``capped`` (cluster cap :data:`CAP`): (ledger, fence, execution ids) per node."""
    async with open_postgres_ledger(url) as first, open_postgres_ledger(url) as second:
        capped = TaskType(
            name="capped",
            kind=HandlerKind.NOOP,
            allowed_tenants=("*",),
            max_concurrency_cluster=CAP,
        )
        await first.task_types_put(TaskTypesPut(capped))
        at = (await first.database_now()).replace(microsecond=0) - timedelta(seconds=1)
        nodes = []
        for partition, ledger in enumerate((first, second)):
            sids = ids_in_partition(partition, per_partition, prefix="cap")
            await ledger.schedules_create(
                SchedulesCreate([schedule(s, task_type="capped") for s in sids])
            )
            fence = await own(ledger, partition, f"node-{partition}")
            fires = [PlannedExecution(s, "acme", "capped", at) for s in sids]
            await ledger.executions_plan(ExecutionsPlan(fence, fires, []))
            nodes.append((ledger, fence, [execution_id(s, at) for s in sids]))
        yield nodes


async def running_capped(url: str) -> int:
    rows = await sql(
        url, "SELECT count(*) FROM executions WHERE task_type = 'capped' AND status = 'running'"
    )
    count: int = rows[0][0]
    return count


async def test_claims_queued_on_a_cap_lock_start_no_more_than_the_cap_together(
    url: str, bridge: DatabaseBridge
) -> None:
    async with two_nodes(url, per_partition=5) as nodes:
        started: list[int] = []

        async def claim(ledger: PostgresLedger, fence: Fence, ids: list[str]) -> None:
            claimed = await ledger.executions_claim(ExecutionsClaim([fence], ids, 60, "n"))
            started.append(len(claimed))

        held = holding_lock(bridge, url, CAP_LOCK, CAP_LOCK_SPACE, cap_lock_key("capped"))
        async with trio.open_nursery() as nursery, held:
            for node in nodes:
                nursery.start_soon(claim, *node)
            await wait_for_lock_waiters(url, 2)  # both wait; neither has counted yet
        assert sum(started) == CAP
        assert await running_capped(url) == CAP


async def test_two_nodes_racing_claims_never_exceed_a_cluster_cap(url: str) -> None:
    async def claim(
        into: dict[int, list[str]], n: int, ledger: PostgresLedger, fence: Fence, ids: list[str]
    ) -> None:
        started = await ledger.executions_claim(ExecutionsClaim([fence], ids, 60, "n"))
        into[n] = [e.execution_id for e in started]

    async with two_nodes(url, per_partition=12) as nodes:
        for _ in range(4):  # each round: both nodes claim at once, then finish what started
            claimed: dict[int, list[str]] = {}
            async with trio.open_nursery() as nursery:
                for n, node in enumerate(nodes):
                    nursery.start_soon(claim, claimed, n, *node)
            assert sum(len(ids) for ids in claimed.values()) == CAP
            assert await running_capped(url) == CAP
            for n, (ledger, fence, _) in enumerate(nodes):
                done = [Completion(eid, 1, Outcome.SUCCEEDED) for eid in claimed[n]]
                await ledger.executions_complete(ExecutionsComplete([fence], done))


async def test_claims_of_uncapped_task_types_never_wait_for_a_cap_lock(
    url: str, bridge: DatabaseBridge
) -> None:
    async with two_nodes(url, per_partition=1) as nodes:
        ledger, fence, _ = nodes[0]
        [sid] = ids_in_partition(0, 1, prefix="free")
        await ledger.schedules_create(SchedulesCreate([schedule(sid)]))
        at = (await ledger.database_now()).replace(microsecond=0)
        await ledger.executions_plan(plan_one(fence, sid, at))
        held = holding_lock(bridge, url, CAP_LOCK, CAP_LOCK_SPACE, cap_lock_key("capped"))
        async with held:
            with trio.fail_after(5):
                claimed = await ledger.executions_claim(
                    ExecutionsClaim([fence], [execution_id(sid, at)], 60, "n")
                )
        assert [e.execution_id for e in claimed] == [execution_id(sid, at)]


# --- audit trail ------------------------------------------------------------------------------


async def test_the_audit_trail_refuses_updates_and_deletes(url: str) -> None:
    async with open_postgres_ledger(url) as ledger:
        assert await ledger.dead_letters_replay(DeadLettersReplay(["nope:x"], "ops")) == []
    await sql(url, "INSERT INTO audit_events (actor, action, target) VALUES ('ops', 'test', 'x')")
    for statement in (
        "UPDATE audit_events SET actor = 'someone else'",
        "DELETE FROM audit_events",
        "TRUNCATE audit_events",
    ):
        with pytest.raises(asyncpg.InsufficientPrivilegeError, match="append-only"):
            await sql(url, statement)
    rows = await sql(url, "SELECT actor, target FROM audit_events")
    assert [(row[0], row[1]) for row in rows] == [("ops", "x")]


# --- schedule quota ---------------------------------------------------------------------------


async def test_creates_queued_on_a_tenant_row_cannot_pass_its_quota_together(
    url: str, bridge: DatabaseBridge
) -> None:
    async with open_postgres_ledger(url, pool_max=4) as ledger:
        await ledger.tenants_put(TenantsPut(Tenant(tenant_id="acme", schedules_max=3)))
        outcomes: list[str] = []

        async def create(prefix: str) -> None:
            batch = [schedule(f"{prefix}-{n}") for n in range(2)]
            try:
                await ledger.schedules_create(SchedulesCreate(batch))
                outcomes.append("created")
            except QuotaExceeded:
                outcomes.append("refused")

        # Each create alone fits (0 + 2 <= 3); both together would not.
        lock = "SELECT 1 FROM tenants WHERE tenant_id = 'acme' FOR UPDATE"
        async with trio.open_nursery() as nursery, holding_lock(bridge, url, lock):
            nursery.start_soon(create, "x")
            nursery.start_soon(create, "y")
            await wait_for_lock_waiters(url, 2)  # both wait; neither has counted yet
        assert sorted(outcomes) == ["created", "refused"]
        assert await ledger.schedules_count("acme") == 2


async def test_racing_creates_fill_a_quota_exactly(url: str) -> None:
    async with open_postgres_ledger(url, pool_max=8) as ledger:
        await ledger.tenants_put(TenantsPut(Tenant(tenant_id="acme", schedules_max=7)))
        refused: list[str] = []

        async def create(sid: str) -> None:
            try:
                await ledger.schedules_create(SchedulesCreate([schedule(sid)]))
            except QuotaExceeded:
                refused.append(sid)

        async with trio.open_nursery() as nursery:
            for n in range(20):
                nursery.start_soon(create, f"race-{n}")
        assert len(refused) == 13
        assert await ledger.schedules_count("acme") == 7


# --- pausing and operator-added executions ------------------------------------------------------


async def test_fires_of_a_plan_committed_first_are_skipped_by_the_waiting_pause(
    url: str, bridge: DatabaseBridge
) -> None:
    [sid] = ids_in_partition(5, 1)
    async with open_postgres_ledger(url) as ledger:
        [created] = await ledger.schedules_create(SchedulesCreate([schedule(sid)]))
        fence = await own(ledger, 5)
        at = (await ledger.database_now()).replace(microsecond=0) + timedelta(minutes=1)
        plan = ExecutionsPlan(fence, [PlannedExecution(sid, "acme", "noop", at)], [], at)
        results = []

        async def planner() -> None:
            results.append(await ledger.executions_plan(plan))

        async def pauser() -> None:
            paused = msgspec.structs.replace(created, enabled=False)
            await ledger.schedules_update(SchedulesUpdate(paused, created.version))

        # The plan stops at its checkpoint (locked outside) holding the schedule row; the
        # pause then queues behind it, and skips what it inserted.
        lock = "SELECT 1 FROM planner_checkpoints WHERE partition_id = 5 FOR UPDATE"
        await ledger.executions_plan(ExecutionsPlan(fence, [], [], at - timedelta(hours=1)))
        async with trio.open_nursery() as nursery, holding_lock(bridge, url, lock):
            nursery.start_soon(planner)
            await wait_for_lock_waiters(url, 1)
            nursery.start_soon(pauser)
            await wait_for_lock_waiters(url, 2)

        [result] = results
        assert result.inserted == [execution_id(sid, at)]
        detail = await ledger.executions_get(execution_id(sid, at))
        assert (detail.execution.status, detail.execution.error_code) == (
            ExecutionStatus.SKIPPED,
            "schedule_paused",
        )


async def test_a_delete_waiting_on_a_trigger_skips_what_it_added(
    url: str, bridge: DatabaseBridge
) -> None:
    [sid] = ids_in_partition(2, 1)
    async with open_postgres_ledger(url) as ledger:
        await ledger.schedules_create(SchedulesCreate([schedule(sid)]))
        triggered = []

        async def trigger() -> None:
            triggered.append(await ledger.executions_trigger(ExecutionsTrigger(sid, "ops")))

        # The trigger stops at the audit lock (held outside), holding the schedule row
        # share-locked with its execution inserted; the delete queues behind it.
        audit_lock = "SELECT pg_advisory_xact_lock($1)"
        async with (
            trio.open_nursery() as nursery,
            holding_lock(bridge, url, audit_lock, AUDIT_LOCK_KEY),
        ):
            nursery.start_soon(trigger)
            await wait_for_lock_waiters(url, 1)
            nursery.start_soon(ledger.schedules_delete, SchedulesDelete(sid))
            await wait_for_lock_waiters(url, 2)

        [execution] = triggered
        detail = await ledger.executions_get(execution.execution_id)
        assert (detail.execution.status, detail.execution.error_code) == (
            ExecutionStatus.SKIPPED,
            "schedule_deleted",
        )


# --- query planner statistics -------------------------------------------------------------------


async def test_a_plan_refreshes_the_statistics_of_a_schedules_table_never_analyzed(
    url: str,
) -> None:
    """Autovacuum is off on some servers (and slow on others): schedules created in bulk into a
    never-analyzed table must not leave every plan's advance hash-joining the whole table."""
    stats = (
        "SELECT c.reltuples, s.last_analyze FROM pg_class AS c "
        "JOIN pg_stat_user_tables AS s ON s.relid = c.oid WHERE c.oid = 'schedules'::regclass"
    )
    sids = ids_in_partition(3, 200)
    async with open_postgres_ledger(url) as ledger:
        await ledger.schedules_create(SchedulesCreate([schedule(sid) for sid in sids]))
        [(reltuples, last_analyze)] = await sql(url, stats)
        assert (reltuples, last_analyze) == (-1, None)  # as the migration left it
        fence = await own(ledger, 3)
        at = (await ledger.database_now()).replace(microsecond=0)
        await ledger.executions_plan(plan_one(fence, sids[0], at))
        [(reltuples, last_analyze)] = await sql(url, stats)
        assert reltuples == len(sids)
        assert last_analyze is not None
        # Fresh now (one schedule advanced since): the next plan analyzes nothing.
        await ledger.executions_plan(plan_one(fence, sids[1], at))
        assert (await sql(url, stats))[0][1] == last_analyze


def test_schedules_statistics_are_stale_by_autovacuums_default_analyze_rule() -> None:
    assert statistics_stale(-1, 0)
    assert not statistics_stale(1_000_000, 100_050)
    assert statistics_stale(1_000_000, 100_051)


# --- availability -----------------------------------------------------------------------------


async def test_after_its_connections_are_killed_the_ledger_fails_at_most_once(url: str) -> None:
    async with open_postgres_ledger(url, pool_max=4) as ledger:
        async with trio.open_nursery() as nursery:  # open several pooled connections
            for _ in range(4):
                nursery.start_soon(ledger.leases_list)
        assert await terminate_backends(url) >= 1

        failures: list[LedgerUnavailable] = []
        try:
            await ledger.leases_list()  # may meet a dead connection (a restart looks the same)
        except LedgerUnavailable as exc:
            failures.append(exc)
        assert all(failure.__cause__ is not None for failure in failures)
        assert len(await ledger.leases_list()) == PARTITIONS
        assert len(await ledger.leases_list()) == PARTITIONS


async def test_a_call_whose_connection_dies_mid_query_is_unavailable_then_recovers(
    url: str, bridge: DatabaseBridge
) -> None:
    async with open_postgres_ledger(url) as ledger:
        fence = await own(ledger, 2)
        failures: list[LedgerUnavailable] = []

        async def renew() -> None:
            try:
                await ledger.leases_renew(LeasesRenew([fence], LONG_TTL_S))
            except LedgerUnavailable as exc:
                failures.append(exc)

        lock = "SELECT 1 FROM partition_leases WHERE partition_id = 2 FOR UPDATE"
        async with trio.open_nursery() as nursery, holding_lock(bridge, url, lock):
            nursery.start_soon(renew)
            [pid] = await wait_for_lock_waiters(url, 1)
            await sql(url, "SELECT pg_terminate_backend($1)", pid)
            with trio.fail_after(10):
                while not failures:
                    await trio.sleep(0.01)

        [failure] = failures
        assert isinstance(failure.__cause__, asyncpg.PostgresError | asyncpg.InterfaceError)
        [renewed] = await ledger.leases_renew(LeasesRenew([fence], LONG_TTL_S))
        assert renewed.fencing_token == fence.fencing_token


async def test_a_statement_over_the_timeout_is_unavailable(
    url: str, bridge: DatabaseBridge
) -> None:
    async with open_postgres_ledger(url, statement_timeout_s=0.3) as ledger:
        fence = await own(ledger, 4)
        lock = "SELECT 1 FROM partition_leases WHERE partition_id = 4 FOR UPDATE"
        async with holding_lock(bridge, url, lock):
            started = trio.current_time()
            with pytest.raises(LedgerUnavailable, match="timed out") as raised:
                await ledger.leases_renew(LeasesRenew([fence], LONG_TTL_S))
            assert trio.current_time() - started < 5
        assert isinstance(raised.value.__cause__, asyncpg.QueryCanceledError)
        assert len(await ledger.leases_renew(LeasesRenew([fence], LONG_TTL_S))) == 1


async def test_a_cancelled_call_leaves_its_connection_reusable(
    url: str, bridge: DatabaseBridge
) -> None:
    async with open_postgres_ledger(url, pool_max=1) as ledger:
        fence = await own(ledger, 0)
        lock = "SELECT 1 FROM partition_leases WHERE partition_id = 0 FOR UPDATE"
        async with holding_lock(bridge, url, lock):
            with trio.move_on_after(0.3) as scope:
                await ledger.leases_renew(LeasesRenew([fence], LONG_TTL_S))
            assert scope.cancelled_caught
        # The only pooled connection was cancelled mid-statement and is usable at once.
        with trio.fail_after(5):
            assert len(await ledger.leases_renew(LeasesRenew([fence], LONG_TTL_S))) == 1


async def test_a_ledger_shares_a_given_bridge_and_leaves_it_open(
    url: str, bridge: DatabaseBridge
) -> None:
    async with open_postgres_ledger(url, bridge=bridge) as ledger:
        assert ledger.partition_count == PARTITIONS
        assert (await ledger.cluster_get()).partition_count == PARTITIONS
    assert await bridge.call(asyncio.sleep, 0, "still open") == "still open"


async def test_an_unreachable_server_is_unavailable_at_open() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(LedgerUnavailable):
        async with open_postgres_ledger(f"postgresql://postgres@127.0.0.1:{port}/x"):
            pass


async def explain_plans(url: str, statement: str, *args: Any) -> dict[str, Any]:
    """The plan of ``statement`` with ``args`` as a custom and as a generic plan, without
    running it (a prepared statement switches to the generic plan after five runs)."""

    async def explain() -> dict[str, Any]:
        connection = await asyncpg.connect(url, timeout=10)
        try:
            plans = {}
            for mode in ("force_custom_plan", "force_generic_plan"):
                await connection.execute(f"SET plan_cache_mode = {mode}")
                text = await connection.fetchval(f"EXPLAIN (FORMAT JSON) {statement}", *args)
                plans[mode] = json.loads(text)[0]["Plan"]
            return plans
        finally:
            await connection.close()

    return await trio.to_thread.run_sync(asyncio.run, explain())


def indexes_reading(plan: dict[str, Any], relation: str) -> list[str]:
    """How each scan of ``relation`` in the plan reads it: its indexes, or its node type."""
    found = []
    if plan.get("Relation Name") == relation and plan["Node Type"] != "ModifyTable":
        if plan["Node Type"] == "Bitmap Heap Scan":
            found += bitmap_indexes(plan)
        else:
            found.append(plan.get("Index Name", plan["Node Type"]))
    for child in plan.get("Plans", []):
        if plan["Node Type"] != "Bitmap Heap Scan":
            found += indexes_reading(child, relation)
    return found


def bitmap_indexes(plan: dict[str, Any]) -> list[str]:
    found = [plan["Index Name"]] if "Index Name" in plan else []
    for child in plan.get("Plans", []):
        found += bitmap_indexes(child)
    return found


async def test_claims_and_completions_find_their_batch_by_key_whatever_the_statistics(
    url: str,
) -> None:
    """Statistics taken while few executions ran or waited must not send a claim or a
    completion through a partial index on the status: a batch then read every running or
    waiting execution (and each dead entry a burst leaves behind), and starts crawled in
    the minute after a burst. (The history makes a scan of the table the costlier plan.)"""
    rows = 20_000
    await sql(
        url,
        "UPDATE partition_leases SET owner_id = 'node-a', fencing_token = 1, "
        "expires_at = now() + interval '1 hour'",
    )
    insert = (
        "INSERT INTO executions (execution_id, schedule_id, tenant_id, task_type, "
        "partition_id, planned_at, status, attempt, enqueued_at, finished_at) "
        "SELECT $1 || g, $1 || g, 'acme', 'noop', g % 8, now() - interval '1 minute', "
        "$2, 1, now(), CASE WHEN $2 = 'succeeded' THEN now() END "
        "FROM generate_series(1, $3::integer) AS g"
    )
    await sql(url, insert, "history-", "succeeded", 5 * rows)
    await sql(url, insert, "running-", "succeeded", rows)
    await sql(url, "ANALYZE executions")  # nothing running, nothing waiting
    await sql(url, insert, "waiting-", "queued", rows)
    await sql(
        url,
        "UPDATE executions SET status = 'running', attempt_expires_at = now() + interval '1 hour'"
        " WHERE execution_id LIKE 'running-%'",
    )
    partitions, owners, tokens = list(range(PARTITIONS)), ["node-a"] * PARTITIONS, [1] * PARTITIONS
    batch = 1_000
    completed = [f"running-{n}" for n in range(1, batch + 1)]
    completion = await explain_plans(
        url,
        sql_executions.EXECUTIONS_COMPLETE,
        text_array(completed),
        int_array([1] * batch),
        text_array(["succeeded"] * batch),
        timestamptz_array([None] * batch),
        text_array([None] * batch),
        text_array([None] * batch),
        partitions,
        owners,
        tokens,
    )
    waiting = [f"waiting-{n}" for n in range(1, batch + 1)]
    claim = await explain_plans(
        url,
        sql_executions.EXECUTIONS_CLAIM,
        waiting,
        60.0,
        "node-a",
        partitions,
        owners,
        tokens,
    )
    capped_types = await explain_plans(url, sql_executions.TASK_TYPES_CAPPED_AMONG, waiting)
    finish = await explain_plans(
        url,
        sql_executions.EXECUTIONS_FINISH,
        text_array(waiting),
        int_array([2] * batch),
        text_array(["succeeded"] * batch),
        timestamptz_array([None] * batch),
        text_array([None] * batch),
        text_array([None] * batch),
        timestamptz_array([datetime.now(UTC)] * batch),
        partitions,
        owners,
        tokens,
        "node-a",
    )
    # Before, the completion read executions_running_task_type_idx, the claim
    # executions_startable_idx (and so did the look for capped task types among the ids):
    # each batch then cost as much as everything running or waiting. A folded claim's
    # finish reads its batch as the claim does.
    for plans in (completion, claim, capped_types, finish):
        for plan in plans.values():
            assert indexes_reading(plan, "executions") == ["executions_pkey"]


async def test_a_tenants_listing_by_status_reads_a_status_index_even_as_a_generic_plan(
    url: str,
) -> None:
    """A connection's sixth run of a statement may take its generic plan, made without the
    values. With the status passed as a parameter, that plan could use no partial index on
    the status and walked the tenant's whole history for its few queued executions (a
    5M-execution ledger: p95 136 ms against 2.8 ms). The status is in the statement's text."""
    insert = (
        "INSERT INTO executions (execution_id, schedule_id, tenant_id, task_type, "
        "partition_id, planned_at, status, attempt, enqueued_at, finished_at) "
        "SELECT $1 || g, $1 || g, 'acme', 'noop', g % 8, now() - make_interval(mins => g), "
        "$2, 1, now(), CASE WHEN $2 = 'succeeded' THEN now() END "
        "FROM generate_series(1, $3::integer) AS g"
    )
    await sql(url, insert, "history-", "succeeded", 50_000)
    await sql(url, insert, "waiting-", "queued", 50)
    await sql(url, "ANALYZE executions")
    statement = pg_sql.executions_query(
        schedule=False,
        tenant=True,
        status=ExecutionStatus.QUEUED,
        planned_from=False,
        planned_to=False,
        after=False,
    )
    for plan in (await explain_plans(url, statement, "acme", 101)).values():
        assert indexes_reading(plan, "executions") == ["executions_tenant_startable_idx"]


# --- console sessions against a concurrent token revocation ----------------------------------


async def token_for_sessions(ledger: PostgresLedger) -> None:
    token = ApiToken(token_id="ops", scope="admin")
    await ledger.tokens_create(TokensCreate(token, hashlib.sha256(b"ops").digest(), "test"))


def session_of_ops(name: str) -> SessionsCreate:
    return SessionsCreate(hashlib.sha256(name.encode()).digest(), "ops", 600.0, 3600.0)


async def test_a_sign_in_waiting_on_a_token_revocation_opens_no_session(
    url: str, bridge: DatabaseBridge
) -> None:
    async with open_postgres_ledger(url) as ledger:
        await token_for_sessions(ledger)
        outcome: list[BaseException | None] = []

        async def sign_in() -> None:
            try:
                await ledger.sessions_create(session_of_ops("s1"))
                outcome.append(None)
            except NotFound as exc:
                outcome.append(exc)

        connection = await bridge.call(asyncpg.connect, url)
        try:
            await bridge.call(connection.execute, "BEGIN")
            await bridge.call(
                connection.execute,
                "UPDATE api_tokens SET revoked_at = now() WHERE token_id = 'ops'",
            )
            async with trio.open_nursery() as nursery:
                nursery.start_soon(sign_in)
                await wait_for_lock_waiters(url, 1)  # the sign-in waits for the token row
                await bridge.call(connection.execute, "COMMIT")
        finally:
            with trio.CancelScope(shield=True):
                await bridge.call(connection.close)
        [refusal] = outcome
        assert isinstance(refusal, NotFound)
        assert await sql(url, "SELECT count(*) FROM console_sessions") == [(0,)]


async def test_a_token_revocation_waiting_on_a_sign_in_ends_the_new_session(
    url: str, bridge: DatabaseBridge
) -> None:
    async with open_postgres_ledger(url) as ledger:
        await token_for_sessions(ledger)
        session_hash = hashlib.sha256(b"s1").digest()
        connection = await bridge.call(asyncpg.connect, url)
        try:  # a sign-in as sessions_create makes it, not yet committed
            await bridge.call(connection.execute, "BEGIN")
            await bridge.call(
                connection.execute,
                "SELECT 1 FROM api_tokens WHERE token_id = 'ops' AND revoked_at IS NULL FOR SHARE",
            )
            await bridge.call(
                connection.execute,
                "INSERT INTO console_sessions (session_hash, token_id, created_at, last_seen_at, "
                "idle_timeout, expires_at) VALUES ($1, 'ops', now(), now(), interval '10 min', "
                "now() + interval '1 hour')",
                session_hash,
            )
            async with trio.open_nursery() as nursery:
                nursery.start_soon(ledger.tokens_revoke, TokensRevoke("ops", "test"))
                await wait_for_lock_waiters(url, 1)  # the revocation waits for the sign-in
                await bridge.call(connection.execute, "COMMIT")
        finally:
            with trio.CancelScope(shield=True):
                await bridge.call(connection.close)
        with pytest.raises(NotFound):
            await ledger.sessions_touch(session_hash)
        rows = await sql(url, "SELECT revoked_at IS NOT NULL FROM console_sessions")
        assert rows == [(True,)]
