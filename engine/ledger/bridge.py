"""The database bridge: trio code awaiting asyncio coroutines run on a uvloop thread.

asyncpg only speaks asyncio, the engine only speaks trio. The bridge is the single door
between them: a daemon thread runs a uvloop event loop, and ``await bridge.call(fn, *args)``
runs ``fn(*args)`` as a task on that loop while the calling trio task sleeps.

Why this design: it was measured against the alternatives (``docs/ledger.md``, "The bridge
and the driver, measured"). Parking the trio task in
:func:`trio.lowlevel.wait_task_rescheduled` and waking it with one
``TrioToken.run_sync_soon(reschedule, ...)`` costs about 250 µs per ``SELECT 1`` round trip,
roughly three times the price of staying inside asyncio; ``run_coroutine_threadsafe`` plus a
``trio.Event`` is ~10 % slower, a worker thread blocked on ``future.result()`` is ~60 %
slower and cannot be cancelled, and trio-asyncio is twice as slow. The fixed cost per hop is
why the data layer makes **one call per unit of work** (a whole transaction in one
coroutine), never one call per statement.

One call, step by step::

    trio task                      loop thread (uvloop)
    ─────────                      ────────────────────
    call_soon_threadsafe(start) ─▶ start: create_task(fn(*args)), add done-callback
    wait_task_rescheduled(abort)   ... the coroutine runs ...
                                   done-callback ─▶ run_sync_soon(deliver)
    deliver: reschedule(outcome) ◀─┘

Invariants:

* **A call returns only after its coroutine has finished.** On trio cancellation ``abort``
  asks the loop to cancel the asyncio task and returns ``Abort.FAILED``; the trio task sleeps
  on until the coroutine has really unwound (asyncpg has cancelled the query on the server
  and the connection is usable again), and only then raises :class:`trio.Cancelled`. An
  ``asyncio.CancelledError`` never reaches trio code.
* If the coroutine finishes before the cancellation reaches it, its real result or exception
  is delivered: a write that committed is never reported as cancelled. The pending trio
  cancellation is then raised at the caller's next checkpoint.
* Exceptions raised by the coroutine propagate unchanged.
* ``fn(*args)`` is invoked on the loop thread, so ``fn`` may be any callable returning an
  awaitable bound to the running loop.
* Every call is accounted for in :meth:`DatabaseBridge.statistics` and woken exactly once: by
  its own completion, or, if the bridge closes under it, with a :class:`RuntimeError`.
* The bridge lives exactly as long as its :func:`open_bridge` block (or from
  :func:`start_bridge` to :meth:`DatabaseBridge.aclose`); calling it afterwards raises
  :class:`RuntimeError`. Closing cancels leftover tasks, waits at most
  ``shutdown_timeout_s`` for them, and closes the loop.

The same primitive carries the asyncio-only message-broker clients
(:mod:`engine.handlers.brokers`): a second bridge, on its own thread, named apart, so broker
round trips and database hops never queue behind each other on one loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import sys
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Final, TypeVar, TypeVarTuple, cast

import msgspec
import outcome
import trio

__all__ = [
    "BRIDGE_SHUTDOWN_TIMEOUT_S",
    "BridgeStatistics",
    "DatabaseBridge",
    "open_bridge",
    "start_bridge",
]

T = TypeVar("T")
PosArgsT = TypeVarTuple("PosArgsT")

BRIDGE_SHUTDOWN_TIMEOUT_S: Final = 5.0
"""How long closing waits for leftover coroutines to unwind before abandoning the thread."""

THREAD_NAME: Final = "carillon-db-bridge"
"""The database bridge's thread; other bridges (:func:`start_bridge`) name their own."""


class BridgeStatistics(msgspec.Struct, frozen=True, kw_only=True):
    """Counters of a :class:`DatabaseBridge`, read with :meth:`DatabaseBridge.statistics`."""

    calls_started: int
    """Calls handed to the loop thread."""
    calls_completed: int
    """Calls whose coroutine returned or raised (both count: the coroutine ran to its end)."""
    calls_cancelled: int
    """Calls ended by a trio cancellation, or failed because the bridge closed under them."""
    in_flight: int
    """Calls started but not yet delivered back to their trio task."""


class _Call:
    """The state one call shares between the trio task, ``abort`` and the loop thread."""

    __slots__ = ("delivered", "finished", "raise_cancel", "task", "trio_task")

    def __init__(self, trio_task: trio.lowlevel.Task) -> None:
        self.trio_task = trio_task
        self.task: asyncio.Task[object] | None = None  # set on the loop thread by _start
        self.raise_cancel: trio.lowlevel.RaiseCancelT | None = None  # set by abort (trio)
        self.finished = False  # the asyncio task is done (written on the loop thread)
        self.delivered = False  # the trio task was rescheduled (trio thread only)


async def _invoke(fn: Callable[[*PosArgsT], Awaitable[T]], args: tuple[*PosArgsT]) -> T:
    return await fn(*args)


class DatabaseBridge:
    """A running uvloop thread that trio code hands coroutines to (made by :func:`open_bridge`
    or :func:`start_bridge`)."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        thread: threading.Thread,
        trio_token: trio.lowlevel.TrioToken,
        *,
        shutdown_timeout_s: float = BRIDGE_SHUTDOWN_TIMEOUT_S,
    ) -> None:
        self._loop = loop
        self._thread = thread
        self._trio_token = trio_token
        self._shutdown_timeout_s = shutdown_timeout_s
        self._closed = False
        self._in_flight: set[_Call] = set()
        self._calls_started = 0
        self._calls_completed = 0
        self._calls_cancelled = 0

    async def call(self, fn: Callable[[*PosArgsT], Awaitable[T]], *args: *PosArgsT) -> T:
        """Run ``await fn(*args)`` on the bridge's event loop and return its result.

        A checkpoint. Exceptions raised by ``fn`` propagate unchanged. On cancellation the
        coroutine is cancelled and this returns (raising :class:`trio.Cancelled`) only once
        it has finished unwinding. Raises :class:`RuntimeError` once the bridge is closed.
        Positional arguments only, as in trio; bind keywords with :func:`functools.partial`.
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        if self._closed:
            raise RuntimeError(
                f"the bridge {self._thread.name} is closed; use it inside open_bridge()"
            )
        call = _Call(trio.lowlevel.current_task())
        self._in_flight.add(call)
        self._calls_started += 1
        self._loop.call_soon_threadsafe(self._start, call, fn, args)

        def abort(raise_cancel: trio.lowlevel.RaiseCancelT) -> trio.lowlevel.Abort:
            call.raise_cancel = raise_cancel
            # A closed loop raises RuntimeError; closing the bridge then wakes this call.
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._cancel, call)
            return trio.lowlevel.Abort.FAILED

        return cast(T, await trio.lowlevel.wait_task_rescheduled(abort))

    def statistics(self) -> BridgeStatistics:
        """A snapshot of the call counters."""
        return BridgeStatistics(
            calls_started=self._calls_started,
            calls_completed=self._calls_completed,
            calls_cancelled=self._calls_cancelled,
            in_flight=len(self._in_flight),
        )

    # --- loop thread -------------------------------------------------------------------

    def _start(
        self, call: _Call, fn: Callable[[*PosArgsT], Awaitable[object]], args: tuple[*PosArgsT]
    ) -> None:
        task = self._loop.create_task(_invoke(fn, args))
        call.task = task
        task.add_done_callback(functools.partial(self._on_done, call))

    def _cancel(self, call: _Call) -> None:
        # Always runs after _start: both are queued from the trio thread, in that order.
        if call.task is not None:
            call.task.cancel()

    def _on_done(self, call: _Call, task: asyncio.Task[object]) -> None:
        call.finished = True
        # If trio has already exited, nobody is waiting any more.
        with contextlib.suppress(trio.RunFinishedError):
            self._trio_token.run_sync_soon(self._deliver, call, task)

    # --- trio thread -------------------------------------------------------------------

    def _deliver(self, call: _Call, task: asyncio.Task[object]) -> None:
        if call.delivered:
            return
        result: outcome.Outcome[object]
        if task.cancelled():
            if call.raise_cancel is not None:
                result = outcome.capture(call.raise_cancel)
            else:
                result = outcome.Error(self._closed_under_call())
            self._calls_cancelled += 1
        else:
            self._calls_completed += 1
            error = task.exception()
            result = outcome.Value(task.result()) if error is None else outcome.Error(error)
        self._wake(call, result)

    def _wake(self, call: _Call, result: outcome.Outcome[object]) -> None:
        call.delivered = True
        self._in_flight.discard(call)
        trio.lowlevel.reschedule(call.trio_task, result)

    def _closed_under_call(self) -> RuntimeError:
        return RuntimeError(f"the bridge {self._thread.name} closed before the call finished")

    @property
    def closed(self) -> bool:
        """Whether :meth:`aclose` has begun: calls are refused from then on."""
        return self._closed

    async def aclose(self) -> None:
        """Stop the loop thread and join it (see :func:`open_bridge`); idempotent, shielded."""
        if self._closed:
            return
        with trio.CancelScope(shield=True):
            await self._close(self._shutdown_timeout_s)

    async def _close(self, shutdown_timeout_s: float) -> None:
        self._closed = True
        with contextlib.suppress(RuntimeError):  # the loop thread has already ended
            self._loop.call_soon_threadsafe(self._loop.stop)
        await trio.to_thread.run_sync(self._thread.join, shutdown_timeout_s + 1.0)
        # Calls whose task finished have a _deliver queued; the others never will.
        for call in list(self._in_flight):
            if not call.finished and not call.delivered:
                self._calls_cancelled += 1
                self._wake(call, outcome.Error(self._closed_under_call()))


def _new_event_loop() -> asyncio.AbstractEventLoop:
    if sys.platform == "win32":
        return asyncio.new_event_loop()
    import uvloop

    return uvloop.new_event_loop()


def _run_loop(loop: asyncio.AbstractEventLoop, shutdown_timeout_s: float) -> None:
    """The bridge thread: run until stopped, then cancel and drain what is left, and close."""
    asyncio.set_event_loop(loop)
    try:
        loop.run_forever()
        leftovers = asyncio.all_tasks(loop)
        for task in leftovers:
            task.cancel()
        if leftovers:
            loop.run_until_complete(asyncio.wait(leftovers, timeout=shutdown_timeout_s))
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.run_until_complete(loop.shutdown_default_executor())
    finally:
        asyncio.set_event_loop(None)
        loop.close()


def start_bridge(
    *, thread_name: str = THREAD_NAME, shutdown_timeout_s: float = BRIDGE_SHUTDOWN_TIMEOUT_S
) -> DatabaseBridge:
    """Start a bridge thread named ``thread_name`` for the current trio run, now.

    The caller owns it and must :meth:`~DatabaseBridge.aclose` it; :func:`open_bridge` is
    the block form. Starting it is synchronous, so an owner may start it lazily, on first
    use (the broker bridge does), without a task of its own.
    """
    loop = _new_event_loop()
    thread = threading.Thread(
        target=_run_loop, args=(loop, shutdown_timeout_s), name=thread_name, daemon=True
    )
    bridge = DatabaseBridge(
        loop,
        thread,
        trio.lowlevel.current_trio_token(),
        shutdown_timeout_s=shutdown_timeout_s,
    )
    thread.start()
    return bridge


@asynccontextmanager
async def open_bridge(
    *, shutdown_timeout_s: float = BRIDGE_SHUTDOWN_TIMEOUT_S, thread_name: str = THREAD_NAME
) -> AsyncIterator[DatabaseBridge]:
    """Start the bridge thread for the current trio run; stop it and join it on exit.

    Closing is shielded from cancellation and bounded: leftover coroutines get
    ``shutdown_timeout_s`` to unwind; after that the daemon thread is abandoned.
    """
    bridge = start_bridge(thread_name=thread_name, shutdown_timeout_s=shutdown_timeout_s)
    try:
        yield bridge
    finally:
        await bridge.aclose()
