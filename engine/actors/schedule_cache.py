"""Schedules by id, read through the ledger in bulk and kept for a while.

The dispatcher reads each due execution's schedule (its overlap policy) and the workers its
payload; both share one cache per node. A deleted schedule is cached as ``None``. Entries
live ``ttl_s`` (a change reaches the node within that time -- the change feed is the fast
path for planning, this only serves execution). The cache holds at most ``max_entries``;
when full it starts over, which only costs a re-read.
"""

from __future__ import annotations

from typing import Final

from engine.clock import Clock
from engine.errors import CarillonError, NotFound
from engine.ledger.base import PAGE_SIZE_MAX, Ledger
from engine.model import Schedule

SCHEDULE_CACHE_MAX: Final = 100_000
"""Schedules cached at most; when full, the cache starts over (they are read again)."""


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

    async def get(self, schedule_id: str) -> Schedule | None:
        """The schedule, or ``None`` if it is deleted (at most ``ttl_s`` old)."""
        now = self._clock.monotonic()
        cached = self._entries.get(schedule_id)
        if cached is not None and cached[0] > now:
            return cached[1]
        try:
            schedule: Schedule | None = await self._ledger.schedules_get(schedule_id)
        except NotFound:
            schedule = None
        if len(self._entries) >= self._max_entries:
            self._entries.clear()
        self._entries[schedule_id] = (now + self._ttl_s, schedule)
        return schedule

    async def prefetch(self, schedule_ids: list[str]) -> None:
        """Read the listed schedules that are not cached, :data:`PAGE_SIZE_MAX` per round
        trip; a read error is left for :meth:`get` to raise."""
        now = self._clock.monotonic()
        missing = [
            sid
            for sid in dict.fromkeys(schedule_ids)
            if (cached := self._entries.get(sid)) is None or cached[0] <= now
        ]
        for first in range(0, len(missing), PAGE_SIZE_MAX):
            chunk = missing[first : first + PAGE_SIZE_MAX]
            try:
                found = await self._ledger.schedules_get_many(chunk)
            except CarillonError:
                return
            if len(self._entries) + len(chunk) > self._max_entries:
                self._entries.clear()
            expires = now + self._ttl_s
            for schedule_id in chunk:
                self._entries[schedule_id] = (expires, found.get(schedule_id))
