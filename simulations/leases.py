"""Lease checkers, fed as the run goes: exclusivity, fencing, and trust windows.

The ledger proxies report every lease acquisition, renewal and release the ledger
*committed*, and every fenced write it *accepted*; the nodes' partition tables report what
each node trusts and until when. From that, independently of the ledger's own checks:

* **monotonic fencing tokens** -- each acquisition of a partition carries a higher token
  than every earlier one (commit order), and a renewal keeps its token;
* **fenced writes only from the holder** -- an accepted write's every fence names the
  partition's current holder and token, and that lease had not expired (database time);
* **trust exclusivity** -- the intervals during which two different holders (node process,
  token) *trusted* the same partition never overlap: a node trusts from the moment its
  table holds the lease until the table's ``trusted_until`` or the moment it drops it;
* **planners act inside their window** -- a planner's write leaves only while its table
  holds that fence and its trust window is open (a zombie's writes are refused, and counted).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from engine.ledger.base import Fence
from engine.model import Lease


@dataclass
class _Holder:
    owner: str | None
    token: int
    expires_at: datetime | None


@dataclass
class _Episode:
    """One node process's trust in one partition under one token."""

    token: int
    intervals: list[tuple[float, float]] = field(default_factory=list)
    start: float = 0.0
    end: float = 0.0


class LeaseMonitor:
    def __init__(self, partitions: int) -> None:
        self._holders = {p: _Holder(None, 0, None) for p in range(partitions)}
        self.violations: list[str] = []
        self.acquisitions = 0
        self.refused_writes = 0
        """Fenced writes the ledger refused (``LeaseLost``): zombies fenced off."""
        self.accepted_writes = 0
        self._open: dict[tuple[str, int], _Episode] = {}
        self._closed: dict[int, list[tuple[float, float, str]]] = {}

    # -- what the ledger committed ------------------------------------------------------

    def acquired(self, lease: Lease, now: datetime) -> None:
        holder = self._holders[lease.partition_id]
        self.acquisitions += 1
        if lease.fencing_token <= holder.token:
            self.violations.append(
                f"fencing token not monotonic: partition {lease.partition_id} acquired by "
                f"{lease.owner_id} with token {lease.fencing_token} after {holder.token}"
            )
        if holder.owner is not None and holder.expires_at is not None and holder.expires_at > now:
            self.violations.append(
                f"partition {lease.partition_id} acquired by {lease.owner_id} while "
                f"{holder.owner}'s lease ran until {holder.expires_at.isoformat()}"
            )
        self._holders[lease.partition_id] = _Holder(
            lease.owner_id, lease.fencing_token, lease.expires_at
        )

    def renewed(self, leases: list[Lease]) -> None:
        for lease in leases:
            holder = self._holders[lease.partition_id]
            if (holder.owner, holder.token) != (lease.owner_id, lease.fencing_token):
                self.violations.append(
                    f"renewal of partition {lease.partition_id} returned {lease.owner_id}/"
                    f"{lease.fencing_token}, but the holder is {holder.owner}/{holder.token}"
                )
            holder.expires_at = lease.expires_at

    def released(self, fences: list[Fence], count: int, now: datetime) -> None:
        held = [f for f in fences if self._holds(f, now)]
        for fence in held:
            self._holders[fence.partition_id].owner = None
        if len(held) != count:
            self.violations.append(
                f"release of {fences} released {count} leases; {len(held)} were held"
            )

    def write_accepted(self, node: str, method: str, fences: list[Fence], now: datetime) -> None:
        self.accepted_writes += 1
        for fence in fences:
            if not self._holds(fence, now):
                holder = self._holders[fence.partition_id]
                self.violations.append(
                    f"{method} by {node} accepted with stale fence {fence.partition_id}/"
                    f"{fence.owner_id}/{fence.fencing_token} at {now.isoformat()}; holder "
                    f"{holder.owner}/{holder.token} until {holder.expires_at}"
                )

    def _holds(self, fence: Fence, now: datetime) -> bool:
        holder = self._holders[fence.partition_id]
        return (
            holder.owner == fence.owner_id
            and holder.token == fence.fencing_token
            and holder.expires_at is not None
            and holder.expires_at > now
        )

    # -- what the nodes trusted ------------------------------------------------------------

    def trusted(self, who: str, partition: int, token: int, at: float, until: float) -> None:
        """``who`` (a node process) trusts ``partition`` under ``token`` from ``at`` until
        ``until`` (true seconds); a later call for the same episode extends it."""
        key = (who, partition)
        episode = self._open.get(key)
        if episode is not None and episode.token != token:
            self.untrusted(who, partition, at)
            episode = None
        if episode is None:
            self._open[key] = _Episode(token, start=at, end=max(at, until))
            return
        if at > episode.end:  # the window had lapsed; it opens again from now
            episode.intervals.append((episode.start, episode.end))
            episode.start = at
        episode.end = max(episode.end, until)

    def untrusted(self, who: str, partition: int, at: float) -> None:
        """``who`` stopped trusting ``partition`` at ``at`` (dropped it, or died)."""
        episode = self._open.pop((who, partition), None)
        if episode is None:
            return
        episode.intervals.append((episode.start, min(episode.end, at)))
        label = f"{who}/token {episode.token}"
        intervals = self._closed.setdefault(partition, [])
        intervals += [(s, e, label) for s, e in episode.intervals if e > s]

    def untrust_all(self, who: str, at: float) -> None:
        for key in sorted(k for k in self._open if k[0] == who):
            self.untrusted(who, key[1], at)

    def finish(self, at: float) -> None:
        """Close every open episode at ``at`` and check trust exclusivity."""
        for who, partition in sorted(self._open):
            self.untrusted(who, partition, at)
        for partition in sorted(self._closed):
            intervals = sorted(self._closed[partition])
            reach = -1.0
            reach_label = ""
            for start, end, label in intervals:
                if start < reach and label != reach_label:
                    self.violations.append(
                        f"partition {partition} trusted by {reach_label} until t={reach:.3f} "
                        f"and by {label} from t={start:.3f}"
                    )
                if end > reach:
                    reach, reach_label = end, label

    def trust_intervals(self, partition: int) -> list[tuple[float, float, str]]:
        return sorted(self._closed.get(partition, []))
