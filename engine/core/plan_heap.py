"""The planner's queue of upcoming fires: a min-heap of instants, one entry per instant.

At the top of an hour most schedules of a partition share one ``next_run_at``. With one heap
entry per schedule, popping 200,000 of them costs about 0.6 s of CPU; with one entry per
*distinct instant* holding the ids due then, the same burst pops in a few milliseconds
(``docs/architecture.md``, "The flow of one fire"). Moving or removing a schedule is
O(1): its id leaves its bucket, and a bucket left empty is discarded lazily when it
reaches the top.

Invariants: each schedule id is in at most one bucket; ``len()`` counts schedules, not
buckets; ids come out of a bucket in the order they were pushed (deterministic).

Memory: a node may hold millions of schedules, most of them sharing a few thousand instants.
:meth:`PlanHeap.push` returns the one ``datetime`` object the heap keeps for an instant, so
a caller that stores it instead of its own equal copy holds 48 bytes less per schedule.
"""

from __future__ import annotations

import heapq
from datetime import datetime


class PlanHeap:
    """Schedule ids keyed by their next fire instant."""

    def __init__(self) -> None:
        self._instants: list[datetime] = []
        self._buckets: dict[datetime, dict[str, None]] = {}
        self._shared: dict[datetime, datetime] = {}
        """Each instant with a bucket, to itself: the object every schedule due then shares."""
        self._due_at: dict[str, datetime] = {}

    def __len__(self) -> int:
        return len(self._due_at)

    def __contains__(self, schedule_id: object) -> bool:
        return schedule_id in self._due_at

    def due_at(self, schedule_id: str) -> datetime | None:
        """When ``schedule_id`` is next due, or ``None`` if it is not in the heap."""
        return self._due_at.get(schedule_id)

    def push(self, schedule_id: str, at: datetime) -> datetime:
        """Set ``schedule_id`` to be due at ``at`` (moving it if it was due elsewhen); returns
        the heap's own object for that instant, equal to ``at``, for the caller to keep."""
        # remove(), inlined: a load pushes a million ids, nearly all of them new.
        was_at = self._due_at.get(schedule_id)
        if was_at is not None:
            del self._buckets[was_at][schedule_id]
        bucket = self._buckets.get(at)
        if bucket is None:
            bucket = self._buckets[at] = {}
            self._shared[at] = at
            heapq.heappush(self._instants, at)
        else:
            at = self._shared[at]
        bucket[schedule_id] = None
        self._due_at[schedule_id] = at
        return at

    def remove(self, schedule_id: str) -> bool:
        """Forget ``schedule_id``; returns whether it was there."""
        at = self._due_at.pop(schedule_id, None)
        if at is None:
            return False
        del self._buckets[at][schedule_id]
        return True

    def bucket_size(self, at: datetime) -> int:
        """How many schedules are due at exactly ``at``."""
        return len(self._buckets.get(at, ()))

    def next_instant(self) -> datetime | None:
        """The earliest instant any schedule is due, or ``None`` when empty."""
        self._discard_empty_top()
        return self._instants[0] if self._instants else None

    def pop_until(self, until: datetime, *, limit: int) -> list[tuple[datetime, list[str]]]:
        """Remove and return the buckets due at or before ``until``, earliest first.

        At most ``limit`` schedule ids are returned in all; a bucket larger than what is left
        of the limit is split, its remainder staying at the top for the next call.
        """
        taken: list[tuple[datetime, list[str]]] = []
        room = limit
        while room > 0:
            self._discard_empty_top()
            if not self._instants or self._instants[0] > until:
                break
            at = self._instants[0]
            bucket = self._buckets[at]
            if len(bucket) <= room:
                heapq.heappop(self._instants)
                del self._buckets[at]
                del self._shared[at]
                ids = list(bucket)
            else:
                ids = [schedule_id for schedule_id, _ in zip(bucket, range(room), strict=False)]
                for schedule_id in ids:
                    del bucket[schedule_id]
            for schedule_id in ids:
                del self._due_at[schedule_id]
            taken.append((at, ids))
            room -= len(ids)
        return taken

    def _discard_empty_top(self) -> None:
        while self._instants and not self._buckets.get(self._instants[0]):
            at = heapq.heappop(self._instants)
            self._buckets.pop(at, None)
            self._shared.pop(at, None)
