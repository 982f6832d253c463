"""What a node's planners share so that bulk work does not starve the rest of the node.

A node's planners and its dispatcher share one ledger pool (10 connections by default) and a
few cores. Left to themselves, 64 planners would take every connection:

* **Loads.** A cold start, or a takeover of many partitions, reads every owned schedule.
  Partitions load ``loads_in_parallel`` at a time, and a planner whose partition has loaded
  waits for the node's other loads before it plans. Planning the first partitions' (catch-up)
  fires, and running them, while the rest still loaded shared the pool and the cores with
  the loads: the cold load of 1,000,000 schedules went from 21.7 s to 6.3 s with the wait
  (medians of 3, docs/benchmarks.md), and at 5,000,000 loads had timed out waiting for a
  connection. The wait ends early when no load
  has made progress for ``hold_max_s``: a load that keeps failing must not hold the node's
  planning back.
* **Writes.** At most ``writes_in_parallel`` planners write a batch at a time, so the
  dispatcher's fetches, claims and completions always find a connection. Two cores' worth of
  PostgreSQL gains nothing from more concurrent batches; it only queues them in the pool.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Final

import trio

LOADS_IN_PARALLEL: Final = 2
WRITES_IN_PARALLEL: Final = 3
LOAD_HOLD_MAX_S: Final = 15.0
"""How long loaded planners wait on loads that make no progress before they plan anyway."""


class PlanningGate:
    def __init__(
        self,
        loads_in_parallel: int = LOADS_IN_PARALLEL,
        writes_in_parallel: int = WRITES_IN_PARALLEL,
        hold_max_s: float = LOAD_HOLD_MAX_S,
    ) -> None:
        self._load_slots = trio.Semaphore(loads_in_parallel)
        self._write_slots = trio.Semaphore(writes_in_parallel)
        self._hold_max_s = hold_max_s
        self._pending = 0
        self._progress_at = 0.0
        self._idle = trio.Event()
        self._idle.set()

    @asynccontextmanager
    async def loading(self) -> AsyncIterator[None]:
        """Hold a load slot; the load counts as pending from the moment it asks for one."""
        if self._pending == 0:
            self._idle = trio.Event()
            self._progress_at = trio.current_time()
        self._pending += 1
        try:
            async with self._load_slots:
                yield
        finally:
            self._pending -= 1
            if self._pending == 0:
                self._idle.set()

    def progress(self) -> None:
        """A load has read another page."""
        self._progress_at = trio.current_time()

    async def wait_loaded(self) -> None:
        """Until the loads pending now are done, or none of them has progressed for
        ``hold_max_s``."""
        idle = self._idle
        while not idle.is_set():
            deadline = self._progress_at + self._hold_max_s
            if trio.current_time() >= deadline:
                return
            with trio.move_on_at(deadline):
                await idle.wait()

    @asynccontextmanager
    async def writing(self) -> AsyncIterator[None]:
        """Hold a write slot for one batch."""
        async with self._write_slots:
            yield
