"""The fast tallies of the per-execution paths, and the start SLO's window.

prometheus-client's counters and histograms take a lock per call (a burst spent several
microseconds an execution there), so the metrics moved once per execution tally in plain
Python instead -- a count per counter child, bucket counts and a sum per histogram child --
and the tallies are added to the children whenever the registry is collected, before any of
them is read (see ``engine/metrics/exposition.py``), so every read is exact.

Adding a histogram tally reaches into the child's bucket and sum values: prometheus-client has
no public way to add many observations at once. ``tests/test_metrics_tallies.py`` pins the
result to what one ``observe`` per value gives, so an upgrade that changes those internals
fails there rather than skewing a dashboard.
"""

from __future__ import annotations

import bisect

from prometheus_client import Counter, Histogram
from prometheus_client.samples import Exemplar


class CounterTally:
    """Increments of one counter child not yet added to it (callers add to ``n``)."""

    __slots__ = ("child", "n")

    def __init__(self, child: Counter) -> None:
        self.child = child
        self.n = 0

    def flush(self) -> None:
        if self.n:
            self.child.inc(self.n)
            self.n = 0


class HistogramTally:
    """Observations of one histogram child not yet added to it: a count per bucket and
    their sum."""

    __slots__ = ("_bounds", "_counts", "_exemplars", "_pending", "_sum", "child")

    def __init__(self, child: Histogram) -> None:
        self.child = child
        self._bounds: list[float] = child._upper_bounds  # ends with +Inf
        self._counts = [0] * len(self._bounds)
        self._sum = 0.0
        self._pending = False
        self._exemplars: dict[int, Exemplar] = {}
        """The latest exemplar of each bucket since the last flush (tracing on only)."""

    def observe(self, amount: float) -> None:
        # The bucket observe() picks: the first bound >= amount (none for NaN).
        index = bisect.bisect_left(self._bounds, amount)
        if index < len(self._counts) and amount <= self._bounds[index]:
            self._counts[index] += 1
        self._sum += amount
        self._pending = True

    def exemplar(self, amount: float, labels: dict[str, str]) -> None:
        """Keep ``labels`` (a trace's ids) as the exemplar of the bucket ``amount`` -- just
        observed -- counts in, as ``observe(amount, exemplar=labels)`` would; off the
        :meth:`observe` path, which stays as fast when no trace is kept."""
        index = bisect.bisect_left(self._bounds, amount)
        if index < len(self._counts) and amount <= self._bounds[index]:
            # No timestamp (optional in OpenMetrics): the engine reads no ambient time.
            self._exemplars[index] = Exemplar(labels, amount)

    def flush(self) -> None:
        if not self._pending:
            return
        if self._exemplars:
            for index, exemplar in self._exemplars.items():
                self.child._buckets[index].set_exemplar(exemplar)
            self._exemplars.clear()
        child, counts = self.child, self._counts
        child._sum.inc(self._sum)
        for index, count in enumerate(counts):
            if count:
                child._buckets[index].inc(count)
                counts[index] = 0
        self._sum = 0.0
        self._pending = False


class StartWindow:
    """Whether each of the last ``size`` first-attempt starts was late, in a ring: O(1) per
    start, no clock."""

    __slots__ = ("_filled", "_late", "_late_count", "_next", "_size")

    def __init__(self, size: int) -> None:
        self._size = size
        self._late = bytearray(size)
        self._next = 0
        self._filled = 0
        self._late_count = 0

    def record(self, late: bool) -> None:
        i = self._next
        self._late_count += late - self._late[i]
        self._late[i] = late
        self._next = 0 if i + 1 == self._size else i + 1
        if self._filled < self._size:
            self._filled += 1

    @property
    def starts(self) -> int:
        return self._filled

    def on_time_ratio(self) -> float | None:
        if not self._filled:
            return None
        return (self._filled - self._late_count) / self._filled
