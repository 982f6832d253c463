"""The broker bridge: where clients run, pooling per key, connects, cancellation, closing.

A small asyncio client stands in for a broker library here; the real clients are exercised
against real servers in the tests of each broker kind (``test_redis.py``).
"""

from __future__ import annotations

import asyncio
import threading

import pytest
import trio

from engine.handlers.brokers import THREAD_NAME, BrokerBridge, open_broker_bridge


class Client:
    """An asyncio client: records where it runs and whether it was closed."""

    made = 0

    def __init__(self, name: str) -> None:
        Client.made += 1
        self.name = name
        self.loop = asyncio.get_running_loop()
        self.closed = False
        self.cancelled = 0

    def usable(self) -> bool:
        return not self.closed

    async def aclose(self) -> None:
        self.closed = True

    async def where(self) -> tuple[str, str, str]:
        assert asyncio.get_running_loop() is self.loop
        return self.name, threading.current_thread().name, type(self.loop).__module__

    async def hang(self, entered: threading.Event) -> None:
        entered.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            await asyncio.sleep(0.01)  # unwinding takes a moment; the caller waits for it
            self.cancelled += 1
            raise


def connector(name: str, log: list[str] | None = None):  # type: ignore[no-untyped-def]
    async def connect() -> Client:
        if log is not None:
            log.append(name)
        await asyncio.sleep(0.01)
        return Client(name)

    return connect


async def where(client: Client) -> tuple[str, str, str]:
    return await client.where()


async def itself(client: Client) -> Client:
    return client


async def test_publishes_run_on_the_broker_bridges_own_uvloop_thread() -> None:
    async with open_broker_bridge() as brokers:
        assert not brokers.statistics().started  # no thread until the first publish
        name, thread, loop_module = await brokers.run("a", connector("a"), where)

    assert (name, thread) == ("a", THREAD_NAME)
    assert loop_module.startswith("uvloop")


async def test_one_client_per_key_shared_by_every_publish_even_when_they_come_at_once() -> None:
    connects: list[str] = []
    clients: list[Client] = []
    async with open_broker_bridge() as brokers:

        async def publish(key: str) -> None:
            clients.append(await brokers.run(key, connector(key, connects), itself))

        async with trio.open_nursery() as nursery:
            for key in ["a"] * 20 + ["b"] * 5:
                nursery.start_soon(publish, key)
        stats = brokers.statistics()

    assert sorted(connects) == ["a", "b"]
    assert len({id(client) for client in clients}) == 2
    assert (stats.clients, stats.connects, stats.in_use) == (2, 2, 0)
    assert all(client.closed for client in clients)  # closed with the bridge


async def test_a_failed_connect_is_forgotten_and_the_next_publish_connects_anew() -> None:
    attempts = 0

    async def flaky() -> Client:
        nonlocal attempts
        attempts += 1
        if attempts == 1:
            raise ConnectionRefusedError("the broker is down")
        return Client("b")

    async with open_broker_bridge() as brokers:
        with pytest.raises(ConnectionRefusedError, match="the broker is down"):
            await brokers.run("k", flaky, where)
        assert brokers.statistics().clients == 0
        name, _, _ = await brokers.run("k", flaky, where)

    assert (name, attempts) == ("b", 2)


async def test_a_client_closed_for_good_is_replaced_at_the_next_publish() -> None:
    async with open_broker_bridge() as brokers:
        first = await brokers.run("k", connector("k"), itself)
        first.closed = True  # its library gave up on it
        second = await brokers.run("k", connector("k"), itself)
        stats = brokers.statistics()

    assert second is not first
    assert (stats.clients, stats.connects) == (1, 2)


async def test_exceptions_of_the_operation_propagate_unchanged() -> None:
    error = LookupError("from asyncio")

    async def fails(client: Client) -> None:
        raise error

    async with open_broker_bridge() as brokers:
        with pytest.raises(LookupError) as raised:
            await brokers.run("k", connector("k"), fails)

    assert raised.value is error


async def test_a_trio_cancellation_cancels_the_asyncio_side_and_waits_for_it_to_unwind() -> None:
    entered = threading.Event()
    async with open_broker_bridge() as brokers:
        client = await brokers.run("k", connector("k"), itself)

        async def hang(client: Client) -> None:
            await client.hang(entered)

        with trio.move_on_after(5) as scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(brokers.run, "k", connector("k"), hang)
                await trio.to_thread.run_sync(entered.wait)
                nursery.cancel_scope.cancel()
        # Returned only after the asyncio task unwound: its except-block has run.
        assert client.cancelled == 1
        assert not scope.cancelled_caught
        assert brokers.statistics().in_use == 0
        # The client survives a cancelled publish and serves the next one.
        assert (await brokers.run("k", connector("k"), where))[0] == "k"


async def test_a_cancelled_first_publish_leaves_the_shared_connect_to_the_others() -> None:
    release = threading.Event()

    async def slow_connect() -> Client:
        await asyncio.get_running_loop().run_in_executor(None, release.wait)
        return Client("slow")

    async with open_broker_bridge() as brokers:
        with trio.move_on_after(0.05):
            await brokers.run("k", slow_connect, where)
        release.set()
        name, _, _ = await brokers.run("k", slow_connect, where)
        assert brokers.statistics().connects == 1

    assert name == "slow"


async def test_idle_clients_are_closed_at_the_next_publish() -> None:
    brokers = BrokerBridge(idle_close_s=0.0)  # every unused client is idle at once
    try:
        first = await brokers.run("old", connector("old"), itself)
        await brokers.run("new", connector("new"), where)
        await brokers.run("new", connector("new"), where)  # let the close task finish
        stats = brokers.statistics()
    finally:
        await brokers.aclose()

    assert first.closed
    assert stats.clients == 1
    assert stats.closed >= 1


async def test_after_closing_every_client_is_closed_and_publishing_is_refused() -> None:
    brokers = BrokerBridge()
    client = await brokers.run("k", connector("k"), itself)
    await brokers.aclose()
    await brokers.aclose()  # idempotent

    assert client.closed
    assert not any(thread.name == THREAD_NAME for thread in threading.enumerate())
    with pytest.raises(RuntimeError, match="closed"):
        await brokers.run("k", connector("k"), where)


async def test_closing_a_bridge_that_never_published_starts_no_thread() -> None:
    async with open_broker_bridge() as brokers:
        pass

    assert not brokers.statistics().started


async def test_a_one_off_exchange_runs_on_the_loop_and_pools_nothing() -> None:
    async def exchange() -> tuple[str, str, str]:
        client = await connector("once")()
        try:
            return await client.where()
        finally:
            await client.aclose()

    brokers = BrokerBridge()
    name, thread, _ = await brokers.run_unpooled(exchange)
    stats = brokers.statistics()
    await brokers.aclose()

    assert (name, thread) == ("once", THREAD_NAME)
    assert (stats.started, stats.clients, stats.connects) == (True, 0, 0)
    with pytest.raises(RuntimeError, match="closed"):
        await brokers.run_unpooled(exchange)
