"""Waiting for schedule changes: LISTEN on a dedicated connection (asyncio side).

A pooled connection cannot LISTEN (the pool does not reset session state, and a listener
must stay subscribed between calls), so the listener owns one connection of its own, opened
on first use and re-opened after it is lost.

No change is missed: :meth:`ChangeListener.wait` subscribes *before* it reads the newest
``seq``. A change committed before that read is seen by it; one committed after is
notified. Losing the connection wakes every waiter (a spurious wake-up, allowed by the
contract: the caller re-reads the feed, and learns then whether the database is back).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import asyncpg

from engine.ledger.postgres import sql
from engine.ledger.postgres.connection import translate_errors


class ChangeListener:
    """Wakes waiters when a schedule change newer than theirs is notified."""

    def __init__(
        self,
        connect: Callable[[], Awaitable[asyncpg.Connection]],
        newest_seq: Callable[[], Awaitable[int]],
    ) -> None:
        self._connect = connect
        self._newest_seq = newest_seq
        self._connection: asyncpg.Connection | None = None
        self._opening = asyncio.Lock()
        self._notified_seq = 0
        self._generation = 0  # bumped when the connection is lost
        self._changed = asyncio.Event()

    async def wait(self, after_seq: int, timeout_s: float) -> bool:
        """True once a change newer than ``after_seq`` may exist; False after ``timeout_s``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(0.0, timeout_s)
        generation = await self._subscribe()
        if self._notified_seq > after_seq or await self._newest_seq() > after_seq:
            return True
        while self._notified_seq <= after_seq and self._generation == generation:
            changed = self._changed
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            try:
                async with asyncio.timeout(remaining):
                    await changed.wait()
            except TimeoutError:
                return False
        return True

    async def close(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None and not connection.is_closed():
            connection.remove_termination_listener(self._on_lost)
            try:
                await asyncio.wait_for(connection.close(), timeout=5.0)
            except (TimeoutError, OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
                connection.terminate()

    async def _subscribe(self) -> int:
        async with self._opening:
            if self._connection is None or self._connection.is_closed():
                with translate_errors():
                    connection = await self._connect()
                    try:
                        await connection.add_listener(sql.CHANGES_CHANNEL, self._on_notify)
                    except BaseException:
                        connection.terminate()
                        raise
                connection.add_termination_listener(self._on_lost)
                self._connection = connection
            return self._generation

    def _on_notify(self, connection: object, pid: int, channel: str, payload: object) -> None:
        try:
            seq = int(str(payload))
        except ValueError:
            seq = self._notified_seq + 1  # not ours to parse: wake anyway
        self._notified_seq = max(self._notified_seq, seq)
        self._wake()

    def _on_lost(self, connection: object) -> None:
        self._generation += 1
        self._wake()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()
