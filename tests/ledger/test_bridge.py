"""The database bridge: results, errors, concurrency, cancellation, closing and counters.

Database tests use the real clock: a MockClock with autojump would fire timeouts while a
query is in flight.
"""

from __future__ import annotations

import asyncio
import functools
import threading
import time

import asyncpg
import pytest
import trio
import trio.testing

from engine.ledger.bridge import BridgeStatistics, DatabaseBridge, open_bridge


class Boom(Exception):
    pass


async def add(a: int, b: int) -> int:
    await asyncio.sleep(0)
    return a + b


async def fail(error: BaseException) -> None:
    await asyncio.sleep(0)
    raise error


async def where_am_i() -> tuple[str, str]:
    return threading.current_thread().name, type(asyncio.get_running_loop()).__module__


async def test_call_returns_the_coroutine_result(bridge: DatabaseBridge) -> None:
    assert await bridge.call(add, 2, 3) == 5


async def test_coroutines_run_on_the_bridge_uvloop_thread(bridge: DatabaseBridge) -> None:
    thread_name, loop_module = await bridge.call(where_am_i)

    assert thread_name == "carillon-db-bridge"
    assert loop_module.startswith("uvloop")


@pytest.mark.postgres
async def test_call_returns_a_query_result_from_postgres(
    bridge: DatabaseBridge, connection: asyncpg.Connection
) -> None:
    assert await bridge.call(connection.fetchval, "SELECT 1") == 1


async def test_exceptions_from_the_coroutine_propagate_unchanged(bridge: DatabaseBridge) -> None:
    error = Boom("from asyncio")

    with pytest.raises(Boom) as raised:
        await bridge.call(fail, error)

    assert raised.value is error


@pytest.mark.postgres
async def test_postgres_errors_propagate_unchanged(
    bridge: DatabaseBridge, connection: asyncpg.Connection
) -> None:
    with pytest.raises(asyncpg.DivisionByZeroError):
        await bridge.call(connection.fetchval, "SELECT 1 / 0")

    assert await bridge.call(connection.fetchval, "SELECT 2") == 2


async def test_many_concurrent_calls_from_a_nursery_all_complete(bridge: DatabaseBridge) -> None:
    results: dict[int, int] = {}

    async def one(i: int) -> None:
        results[i] = await bridge.call(add, i, 1000)

    async with trio.open_nursery() as nursery:
        for i in range(500):
            nursery.start_soon(one, i)

    assert results == {i: i + 1000 for i in range(500)}
    assert bridge.statistics().in_flight == 0


@pytest.mark.postgres
async def test_concurrent_queries_through_a_pool_all_complete(
    bridge: DatabaseBridge, database_url: str
) -> None:
    create_pool = functools.partial(asyncpg.create_pool, min_size=4, max_size=4)
    pool = await bridge.call(create_pool, database_url)
    results: list[int] = []

    async def one(i: int) -> None:
        results.append(await bridge.call(pool.fetchval, "SELECT $1::int", i))

    try:
        async with trio.open_nursery() as nursery:
            for i in range(100):
                nursery.start_soon(one, i)
    finally:
        await bridge.call(pool.close)

    assert sorted(results) == list(range(100))


@pytest.mark.postgres
async def test_cancelled_query_returns_promptly_and_the_connection_stays_usable(
    bridge: DatabaseBridge, connection: asyncpg.Connection
) -> None:
    started = time.monotonic()
    with trio.move_on_after(0.2) as scope:
        await bridge.call(connection.execute, "SELECT pg_sleep(5)")
    elapsed = time.monotonic() - started

    assert scope.cancelled_caught
    assert elapsed < 2.0
    assert await bridge.call(connection.fetchval, "SELECT 1") == 1
    assert not connection.is_in_transaction()


async def test_cancellation_raises_trio_cancelled_not_asyncio_cancelled(
    bridge: DatabaseBridge,
) -> None:
    caught: list[BaseException] = []

    with trio.move_on_after(0.05):
        try:
            await bridge.call(asyncio.sleep, 10)
        except BaseException as exc:
            caught.append(exc)
            raise

    assert len(caught) == 1
    assert isinstance(caught[0], trio.Cancelled)


async def test_cancellation_waits_until_the_coroutine_has_unwound(bridge: DatabaseBridge) -> None:
    unwound = threading.Event()

    async def slow_to_unwind() -> None:
        try:
            await asyncio.sleep(10)
        finally:
            await asyncio.sleep(0.05)
            unwound.set()

    with trio.move_on_after(0.05):
        await bridge.call(slow_to_unwind)

    assert unwound.is_set()


async def test_a_coroutine_that_finishes_despite_cancellation_delivers_its_result(
    bridge: DatabaseBridge,
) -> None:
    async def finishes_anyway() -> str:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            return "committed"
        return "unreachable"

    with trio.move_on_after(0.05) as scope:
        result = await bridge.call(finishes_anyway)
        await trio.lowlevel.checkpoint()  # the pending cancellation is raised here instead

    assert result == "committed"
    assert scope.cancelled_caught


async def test_an_already_cancelled_caller_does_not_start_a_call(bridge: DatabaseBridge) -> None:
    with trio.CancelScope() as scope:
        scope.cancel()
        await bridge.call(add, 1, 2)

    assert bridge.statistics().calls_started == 0


async def test_calls_after_close_raise_runtime_error() -> None:
    async with open_bridge() as bridge:
        assert await bridge.call(add, 1, 1) == 2

    with pytest.raises(RuntimeError, match="closed"):
        await bridge.call(add, 1, 1)


async def test_closing_the_bridge_wakes_calls_still_in_flight() -> None:
    caught: list[BaseException] = []

    async def stranded(bridge: DatabaseBridge) -> None:
        try:
            await bridge.call(asyncio.sleep, 10)
        except RuntimeError as exc:
            caught.append(exc)

    async with trio.open_nursery() as nursery, open_bridge(shutdown_timeout_s=1.0) as bridge:
        nursery.start_soon(stranded, bridge)
        await trio.testing.wait_all_tasks_blocked()

    assert len(caught) == 1
    assert "closed before the call finished" in str(caught[0])
    assert bridge.statistics().in_flight == 0


async def test_statistics_count_started_completed_cancelled_and_in_flight(
    bridge: DatabaseBridge,
) -> None:
    assert bridge.statistics() == BridgeStatistics(
        calls_started=0, calls_completed=0, calls_cancelled=0, in_flight=0
    )
    await bridge.call(add, 1, 2)
    with pytest.raises(Boom):
        await bridge.call(fail, Boom())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(bridge.call, asyncio.sleep, 10)
        await trio.testing.wait_all_tasks_blocked()
        assert bridge.statistics().in_flight == 1
        nursery.cancel_scope.cancel()

    assert bridge.statistics() == BridgeStatistics(
        calls_started=3, calls_completed=2, calls_cancelled=1, in_flight=0
    )
