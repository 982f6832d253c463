"""How far ahead to plan an instant, given how many fires the whole node has due then.

A fixed lookahead (5 s) is enough for an ordinary minute, but not for a top-of-hour burst:
planning 200,000 executions takes longer than that on a small machine, and a burst must be
durable *before* its instant. So every planner publishes its next instant and how many of its
schedules are due then; the lead for an instant is the base lookahead plus the time the node
needs to write everything due then, at a conservative rate, capped::

    lead(T) = lookahead_s + min(max_extra_s, due(T) / plan_rate_per_s)

Big instants are planned early, small ones at the usual lookahead. The price of planning
early is that a schedule changed after its execution was written still fires that once.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime

import msgspec


class ForecastConfig(msgspec.Struct, frozen=True):
    lookahead_s: float
    plan_rate_per_s: float
    max_extra_s: float


class BurstForecast:
    """Fires due per instant across this node's planners (their next instant only)."""

    def __init__(self, config: ForecastConfig) -> None:
        self.config = config
        self._by_partition: dict[int, tuple[datetime, int]] = {}
        self._totals: defaultdict[datetime, int] = defaultdict(int)

    def update(self, partition_id: int, instant: datetime | None, count: int) -> None:
        """Partition ``partition_id`` has ``count`` fires due at ``instant`` next."""
        self.forget(partition_id)
        if instant is not None and count > 0:
            self._by_partition[partition_id] = (instant, count)
            self._totals[instant] += count

    def forget(self, partition_id: int) -> None:
        previous = self._by_partition.pop(partition_id, None)
        if previous is not None:
            instant, count = previous
            self._totals[instant] -= count
            if self._totals[instant] <= 0:
                del self._totals[instant]

    def due(self, instant: datetime) -> int:
        return self._totals.get(instant, 0)

    def lead_s(self, instant: datetime) -> float:
        """How long before ``instant`` its fires should be planned."""
        extra = self.due(instant) / self.config.plan_rate_per_s
        return self.config.lookahead_s + min(self.config.max_extra_s, extra)
