"""A live node-like server for the browser: the real :class:`~engine.api.server.ApiServer`
on ``127.0.0.1:0`` over a memory ledger, run by trio in a background thread.

The ledger runs on a :class:`~engine.testing.ManualClock` (the demo's hour is replayed into
it, then it stands still), while the authenticator's rate limits use the real monotonic
clock, as a node's do. A test reaches into the server's trio loop with :meth:`LiveNode.run`
(to create records the way a client would not, or to check the ledger afterwards).

Browser tests need Chromium: :func:`chromium_or_skip` says why they cannot run where it is
missing, or where the address space is limited (``ulimit -v``), which Chromium cannot start
under.
"""

from __future__ import annotations

import os
import resource
import shutil
import threading
from collections.abc import Awaitable, Callable
from typing import Any, Final, TypeVar

import pytest
import trio

from engine.api.app import ApiConfig, ApiContext
from engine.api.auth import Authenticator
from engine.api.console.web import ConsoleSettings
from engine.api.server import ApiServer
from engine.clock import SystemClock
from engine.ledger.memory import MemoryLedger
from engine.testing import ManualClock
from tests.console.demo import DEMO_START, PARTITIONS, seed

CHROMIUM_PATHS: Final = ("/usr/bin/chromium", "/usr/bin/chromium-browser")
ADDRESS_SPACE_MIN: Final = 128 * 1024**3
"""Chromium reserves tens of GiB of address space at start-up (V8's cage, PartitionAlloc);
under a smaller ``ulimit -v`` it dies with SIGTRAP before showing anything."""
START_TIMEOUT_S: Final = 30.0
T = TypeVar("T")


def chromium_path() -> str | None:
    configured = os.environ.get("CARILLON_CHROMIUM")
    for candidate in (configured, *CHROMIUM_PATHS, shutil.which("chromium")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


def chromium_or_skip() -> str:
    """Chromium's path, or skip the test saying what is missing and how to get it."""
    path = chromium_path()
    if path is None:
        pytest.skip(
            "browser tests need Chromium: `apt-get install chromium` (make test installs it "
            "when it can), or set CARILLON_CHROMIUM to its path"
        )
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY and soft < ADDRESS_SPACE_MIN:
        pytest.skip(
            f"Chromium cannot start with the address space limited to {soft / 1024**3:.1f} GiB "
            "(ulimit -v); run the browser tests without that limit"
        )
    return path


class LiveNode:
    """The API and console of one node, served on a real socket from a background thread."""

    def __init__(self, seed_ledger: bool = True) -> None:
        self.clock = ManualClock(DEMO_START)
        self.ledger = MemoryLedger(clock=self.clock, partition_count=PARTITIONS)
        self.tokens: dict[str, str] = {}
        self.url = ""
        self._seed = seed_ledger
        self._ready = threading.Event()
        self._failure: BaseException | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._stop: trio.Event | None = None
        self._thread = threading.Thread(target=self._main, name="live-node", daemon=True)

    def start(self) -> LiveNode:
        self._thread.start()
        if not self._ready.wait(START_TIMEOUT_S):
            raise RuntimeError("the live node did not start in time")
        if self._failure is not None:
            raise RuntimeError("the live node failed to start") from self._failure
        return self

    def stop(self) -> None:
        if self._token is not None and self._stop is not None:
            trio.from_thread.run_sync(self._stop.set, trio_token=self._token)
        self._thread.join(START_TIMEOUT_S)

    def run(self, function: Callable[..., Awaitable[T]], *args: Any) -> T:
        """Run ``function(*args)`` in the server's trio loop and return its result."""
        assert self._token is not None
        return trio.from_thread.run(function, *args, trio_token=self._token)

    def _main(self) -> None:
        try:
            trio.run(self._serve)
        except BaseException as exc:  # reported to start(), which waits for it
            self._failure = exc
            self._ready.set()

    async def _serve(self) -> None:
        if self._seed:
            self.tokens = await seed(self.ledger, self.clock)
        auth = Authenticator(
            self.ledger,
            SystemClock().monotonic,
            token_rate_per_s=50.0,
            token_burst=200,
            anonymous_rate_per_s=5.0,
            anonymous_burst=20,
        )
        # Plain http on 127.0.0.1, as `make run` serves it: cookies without Secure.
        context = ApiContext(self.ledger, auth, console=ConsoleSettings(insecure_cookie=True))
        server = ApiServer(ApiConfig(bind="127.0.0.1:0", shutdown_grace_s=0.5), context)
        self._stop = trio.Event()
        async with trio.open_nursery() as nursery:
            bound: list[str] = await nursery.start(server.run)
            self.url = bound[0]
            self._token = trio.lowlevel.current_trio_token()
            self._ready.set()
            await self._stop.wait()
            nursery.cancel_scope.cancel()
