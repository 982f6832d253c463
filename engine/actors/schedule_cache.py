"""Schedules by id, read through the ledger in bulk and kept for a while.

The dispatcher reads each due execution's schedule (its overlap policy) and the workers its
payload; both share one cache per node. A deleted schedule is cached as ``None``. Entries
live ``ttl_s`` (a change reaches the node within that time -- the change feed is the fast
path for planning, this only serves execution). The cache holds at most ``max_entries``;
when full, the oldest tenth goes (re-reading one later costs a round trip).
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Mapping
from typing import Final, Literal

import trio

from engine.clock import Clock
from engine.errors import CarillonError, NotFound
from engine.ledger.base import Ledger
from engine.ledger.params import PAGE_SIZE_MAX
from engine.model import Schedule

SCHEDULE_CACHE_MAX: Final = 100_000
"""Schedules cached at most."""


class Uncached(enum.Enum):
    """What :meth:`ScheduleCache.cached` answers for a schedule it holds no fresh entry of."""

    UNCACHED = "uncached"


UNCACHED: Final = Uncached.UNCACHED


class ScheduleCache:
    """Schedules by id, read through the ledger and kept for ``ttl_s``.

    A deleted schedule is cached as ``None``. Read errors (``LedgerUnavailable``) propagate
    and nothing is cached for them.
    """

    def __init__(
        self, ledger: Ledger, clock: Clock, ttl_s: float, *, max_entries: int = SCHEDULE_CACHE_MAX
    ) -> None:
        self._ledger = ledger
        self._clock = clock
        self._ttl_s = ttl_s
        self._max_entries = max_entries
        self._entries: dict[str, tuple[float, Schedule | None]] = {}
        self._reading: dict[str, trio.Event] = {}
        """Schedules being read now: whoever needs one meanwhile waits for that read."""

    def cached(
        self, schedule_id: str, now: float | None = None
    ) -> Schedule | Literal[Uncached.UNCACHED] | None:
        """What :meth:`get` would return at once: the fresh entry (a schedule, or ``None``
        for a deleted one), or :data:`UNCACHED` when it would have to read. Synchronous, for
        the per-execution paths that nearly always hit (everything fetched was prefetched).
        ``now``: the clock's monotonic time, if the caller has just read it."""
        cached = self._entries.get(schedule_id)
        if cached is not None and cached[0] > (self._clock.monotonic() if now is None else now):
            return cached[1]
        return UNCACHED

    async def get(self, schedule_id: str) -> Schedule | None:
        """The schedule, or ``None`` if it is deleted (at most ``ttl_s`` old)."""
        hit = self.cached(schedule_id)
        if hit is not UNCACHED:
            return hit
        reading = self._reading.get(schedule_id)
        if reading is not None:
            await reading.wait()
            cached = self._entries.get(schedule_id)
            if cached is not None:
                return cached[1]
        done = self._reading[schedule_id] = trio.Event()
        try:
            try:
                schedule: Schedule | None = await self._ledger.schedules_get(schedule_id)
            except NotFound:
                schedule = None
            self._store({schedule_id: schedule}, [schedule_id])
        finally:
            del self._reading[schedule_id]
            done.set()
        return schedule

    async def refresh(self, schedule_id: str) -> Schedule | None:
        """The schedule read from the ledger now, whatever is cached (and then cached): for
        a decision that must not rest on an entry up to ``ttl_s`` old -- that a schedule is
        deleted, when it may have been created again since."""
        try:
            schedule: Schedule | None = await self._ledger.schedules_get(schedule_id)
        except NotFound:
            schedule = None
        self._store({schedule_id: schedule}, [schedule_id])
        return schedule

    async def prefetch(self, schedule_ids: list[str]) -> None:
        """Read the listed schedules that are neither cached nor being read,
        :data:`PAGE_SIZE_MAX` per round trip, and wait for those being read; a read error
        is left for :meth:`get` to raise."""
        now = self._clock.monotonic()
        wanted = dict.fromkeys(schedule_ids)
        entries, reading = self._entries, self._reading
        missing = [
            s
            for s in wanted
            if ((entry := entries.get(s)) is None or entry[0] <= now) and s not in reading
        ]
        waits = [reading[s] for s in wanted if s in reading] if reading else []
        for first in range(0, len(missing), PAGE_SIZE_MAX):
            chunk = missing[first : first + PAGE_SIZE_MAX]
            done = trio.Event()
            for schedule_id in chunk:
                self._reading[schedule_id] = done
            try:
                found = await self._ledger.schedules_get_many(chunk)
                self._store(found, chunk)
            except CarillonError:
                return
            finally:
                for schedule_id in chunk:
                    del self._reading[schedule_id]
                done.set()
        for event in waits:
            await event.wait()

    def _store(self, found: Mapping[str, Schedule | None], schedule_ids: list[str]) -> None:
        self._make_room(len(schedule_ids))
        expires = self._clock.monotonic() + self._ttl_s
        for schedule_id in schedule_ids:
            self._entries.pop(schedule_id, None)  # re-read: it goes to the back
            self._entries[schedule_id] = (expires, found.get(schedule_id))

    def _make_room(self, needed: int) -> None:
        """Forget the oldest entries (first read, first forgotten) until ``needed`` more fit:
        in a burst larger than the cache, those are the schedules already run, while the ones
        just read for queued executions stay."""
        excess = len(self._entries) + needed - self._max_entries
        if excess <= 0:
            return
        for schedule_id in list(itertools.islice(self._entries, excess + self._max_entries // 10)):
            del self._entries[schedule_id]
