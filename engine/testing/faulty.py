"""A ledger wrapper that injects faults on named methods, deterministically.

:class:`FaultyLedger` stands between the code under test and a real ledger (usually a
:class:`~engine.ledger.memory.MemoryLedger`) and forwards every method of the
:class:`~engine.ledger.base.Ledger` protocol -- and nothing else: an attribute the protocol
does not have is an ``AttributeError``, so a misspelt method cannot pass silently. Faults are
set by method name, and a name that is not a ledger method is refused at once.

A call goes through these stages:

1. the ledger is **down**: fail with ``LedgerUnavailable``, nothing is sent;
2. an **injected error** for the method (:meth:`FaultyLedger.fail_next`): raise it, nothing
   is sent;
3. the ledger is **paused** (:meth:`FaultyLedger.pause`, :meth:`FaultyLedger.pause_at_next`)
   or the call is **held** (:meth:`FaultyLedger.hold`): from here the call is in flight and
   shielded -- like a request already written to the socket -- and waits for the release;
4. the **delay** of the method (:meth:`FaultyLedger.delay`) passes;
5. the inner ledger runs the call (``LeaseLost`` and other errors pass through);
6. a **lost reply** (:meth:`FaultyLedger.lose_reply`): the write committed, yet the caller
   sees ``LedgerUnavailable`` -- the crash-after-commit case;
7. the **reply delay** of the method (:meth:`FaultyLedger.delay_reply`) passes: the answer,
   as of step 5, arrives that much later (a read that is stale when it comes back).

Every call that reached the inner ledger is counted in :attr:`FaultyLedger.calls`, and every
call that came back is written to :attr:`FaultyLedger.history` with its outcome. No randomness
and no wall-clock time: under trio's ``MockClock`` a run is the same every time.
"""

from __future__ import annotations

import inspect
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Final, Literal, cast

import trio

from engine.errors import LeaseLost, LedgerUnavailable
from engine.ledger.base import Ledger

LEDGER_METHODS: Final[frozenset[str]] = frozenset(
    name
    for name, member in vars(Ledger).items()
    if not name.startswith("_") and inspect.iscoroutinefunction(member)
)
"""The methods of the ledger protocol: what a :class:`FaultyLedger` forwards."""

CallOutcome = Literal["ok", "lease-lost", "error", "down", "injected", "reply-lost"]
"""How a call came back: ``ok``; ``lease-lost`` (the ledger refused a fenced write);
``error`` (the ledger raised anything else); ``down`` (the ledger was down, nothing sent);
``injected`` (an error from :meth:`FaultyLedger.fail_next`, nothing sent); ``reply-lost``
(committed, but the caller was told ``LedgerUnavailable``)."""


@dataclass
class Hold:
    """Calls of one method held in flight until :meth:`release` (see :meth:`FaultyLedger.hold`)."""

    method: str
    when: Callable[[tuple[Any, ...]], bool] | None = None
    reached: trio.Event = field(default_factory=trio.Event)
    """Set when the first held call arrives."""
    held: int = 0
    """How many calls were held so far."""
    _released: trio.Event = field(default_factory=trio.Event)

    def release(self) -> None:
        """Let every held call (and every later one) go on to the ledger."""
        self._released.set()

    @property
    def released(self) -> bool:
        return self._released.is_set()

    async def wait_released(self) -> None:
        await self._released.wait()


def _check(method: str) -> str:
    if method not in LEDGER_METHODS:
        raise ValueError(f"{method!r} is not a method of the ledger protocol")
    return method


class FaultyLedger:
    """Every method of the :class:`~engine.ledger.base.Ledger` protocol, forwarded to
    ``inner`` with the faults this object is told to inject (see the module docstring).

    Hand :meth:`as_ledger` to code that takes a ``Ledger``.
    """

    def __init__(self, inner: Ledger) -> None:
        self.inner = inner
        self.down = False
        """While set, every call fails with ``LedgerUnavailable`` and nothing reaches the
        ledger (the database is unreachable, or the process making the calls is gone)."""
        self.delays: dict[str, float] = {}
        """Extra seconds every call of the named method takes before it reaches the ledger
        (a slow round trip); see :meth:`delay`."""
        self.reply_delays: dict[str, float] = {}
        """Extra seconds the reply of every call of the named method takes to come back
        after the ledger answered; see :meth:`delay_reply`."""
        self.calls: Counter[str] = Counter()
        """Calls that reached the inner ledger, by method."""
        self.in_flight: Counter[str] = Counter()
        """Calls sent and not yet returned, by method."""
        self.most_in_flight: Counter[str] = Counter()
        """The most calls of each method that were in flight at once."""
        self.history: list[tuple[str, CallOutcome]] = []
        """Every call that came back, in the order they did, with its outcome."""
        self.paused_in_flight = trio.Event()
        """Set when :meth:`pause_at_next` caught its call."""
        self._failures: dict[str, list[BaseException]] = {}
        self._failing: dict[str, BaseException] = {}
        self._lost_replies: Counter[str] = Counter()
        self._holds: list[Hold] = []
        self._delay_when: dict[str, Callable[[tuple[Any, ...]], bool]] = {}
        self._resumed: trio.Event | None = None
        self._pause_on: str | None = None

    def as_ledger(self) -> Ledger:
        """This wrapper, typed as the ledger it stands for."""
        return cast(Ledger, self)

    # --- faults ------------------------------------------------------------------------------

    def fail_next(self, method: str, error: BaseException, *, times: int | None = 1) -> None:
        """The next ``times`` calls of ``method`` (``None``: every call from now on) raise
        ``error`` without reaching the ledger (a driver error, a bug: anything a call can
        raise)."""
        _check(method)
        if times is None:
            self._failing[method] = error
        else:
            self._failures.setdefault(method, []).extend([error] * times)

    def lose_reply(self, method: str, *, times: int = 1) -> None:
        """The next ``times`` calls of ``method`` commit, then fail with ``LedgerUnavailable``
        as if the connection broke before the reply (commit unknown)."""
        self._lost_replies[_check(method)] += times

    def delay(
        self,
        method: str,
        seconds: float,
        *,
        when: Callable[[tuple[Any, ...]], bool] | None = None,
    ) -> None:
        """Every call of ``method`` (whose arguments satisfy ``when``, if given) takes
        ``seconds`` more before it reaches the ledger; 0 removes the delay."""
        _check(method)
        if seconds < 0:
            raise ValueError("a delay cannot be negative")
        if seconds == 0:
            self.delays.pop(method, None)
            self._delay_when.pop(method, None)
            return
        self.delays[method] = seconds
        if when is None:
            self._delay_when.pop(method, None)
        else:
            self._delay_when[method] = when

    def delay_reply(self, method: str, seconds: float) -> None:
        """Every reply of ``method`` comes back ``seconds`` after the ledger answered (the
        answer is as of then: what it read may have changed meanwhile); 0 removes it."""
        _check(method)
        if seconds < 0:
            raise ValueError("a delay cannot be negative")
        if seconds == 0:
            self.reply_delays.pop(method, None)
        else:
            self.reply_delays[method] = seconds

    def hold(self, method: str, *, when: Callable[[tuple[Any, ...]], bool] | None = None) -> Hold:
        """Hold every call of ``method`` (whose arguments satisfy ``when``, if given) in
        flight, shielded from the caller's cancellation, until the returned hold is released."""
        hold = Hold(_check(method), when)
        self._holds.append(hold)
        return hold

    def pause(self) -> None:
        """Freeze, as a stopped process would: calls block (shielded) until :meth:`resume`,
        then go out as sent."""
        if self._resumed is None:
            self._resumed = trio.Event()

    def pause_at_next(self, method: str) -> None:
        """Freeze when ``method`` is next called (a write caught in flight); that call sets
        :attr:`paused_in_flight`."""
        self._pause_on = _check(method)

    def resume(self) -> None:
        """End a pause: every blocked call goes on."""
        if self._resumed is None:
            raise RuntimeError("resume() without a pause")
        self._resumed.set()
        self._resumed = None

    @property
    def paused(self) -> bool:
        return self._resumed is not None

    # --- the call path -----------------------------------------------------------------------

    async def _call(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if self.down:
            await trio.lowlevel.checkpoint()
            self.history.append((method, "down"))
            raise LedgerUnavailable("the ledger is down (a fault injected by the test)")
        failures = self._failures.get(method)
        error = failures.pop(0) if failures else self._failing.get(method)
        if error is not None:
            await trio.lowlevel.checkpoint()
            self.history.append((method, "injected"))
            raise error
        if self._pause_on == method:
            self._pause_on = None
            self.pause()
            self.paused_in_flight.set()
        holds = [
            h
            for h in self._holds
            if h.method == method and not h.released and (h.when is None or h.when(args))
        ]
        delay = self.delays.get(method, 0.0)
        when = self._delay_when.get(method)
        if when is not None and not when(args):
            delay = 0.0
        target: Callable[..., Awaitable[Any]] = getattr(self.inner, method)
        self.in_flight[method] += 1
        self.most_in_flight[method] = max(self.most_in_flight[method], self.in_flight[method])
        try:
            # Sent: shielded while paused or held, since a request already written reaches
            # the ledger whatever the caller's deadlines say by then.
            with trio.CancelScope(shield=self._resumed is not None or bool(holds)):
                if self._resumed is not None:
                    await self._resumed.wait()
                for hold in holds:
                    hold.held += 1
                    hold.reached.set()
                    await hold.wait_released()
                await trio.sleep(delay)  # a call is a scheduling point, delayed or not
                self.calls[method] += 1
                try:
                    result = await target(*args, **kwargs)
                except LeaseLost:
                    self.history.append((method, "lease-lost"))
                    raise
                except BaseException:
                    self.history.append((method, "error"))
                    raise
        finally:
            self.in_flight[method] -= 1
        if self._lost_replies[method]:
            self._lost_replies[method] -= 1
            self.history.append((method, "reply-lost"))
            raise LedgerUnavailable("connection lost before the reply (commit unknown)")
        reply_delay = self.reply_delays.get(method)
        if reply_delay is not None:
            await trio.sleep(reply_delay)
        self.history.append((method, "ok"))
        return result


def _forward(method: str) -> Callable[..., Awaitable[Any]]:
    async def call(self: FaultyLedger, *args: Any, **kwargs: Any) -> Any:
        return await self._call(method, args, kwargs)

    call.__name__ = call.__qualname__ = method
    call.__doc__ = getattr(Ledger, method).__doc__
    return call


for _method in sorted(LEDGER_METHODS):
    setattr(FaultyLedger, _method, _forward(_method))
