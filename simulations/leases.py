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

**Several databases.** After a region failover the run has two (``a``, the old primary;
``b``, the promoted replica), and a process talks to one of them. Holders, fencing checks
and trust intervals are kept *per database*: a fenced write is judged against the
acquisition history of the database it was sent to, and two processes trusting the same
partition in two databases is no conflict (one of them cannot write anywhere that counts).
Tokens are also checked **across** databases: each acquisition's token is above every token
any database has drawn for that partition before (the new epoch's floor is above every old
token, even those the replica never saw). A failover revokes every lease of its database
(:meth:`LeaseMonitor.revoked_all`); a fenced database accepts no fenced write at all.
"""

from __future__ import annotations

import copy
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime

from engine.ledger.params import Fence
from engine.model import Execution, Lease

PRIMARY = "a"
"""The run's first database (the only one without a region failover)."""


@dataclass
class _Holder:
    owner: str | None
    token: int
    expires_at: datetime | None


@dataclass
class _Episode:
    """One node process's trust in one partition under one token."""

    token: int
    database: str = PRIMARY
    intervals: list[tuple[float, float]] = field(default_factory=list)
    start: float = 0.0
    end: float = 0.0


class LeaseMonitor:
    def __init__(self, partitions: int) -> None:
        self._holders = {PRIMARY: {p: _Holder(None, 0, None) for p in range(partitions)}}
        self._highest: dict[int, tuple[int, str]] = {}
        """Per partition, the highest token any database has drawn, and which database."""
        self.violations: list[str] = []
        self.acquisitions = 0
        self.refused_writes = 0
        """Fenced writes the ledger refused (``LeaseLost``): zombies fenced off."""
        self.refused_by_database: Counter[str] = Counter()
        self.accepted_writes = 0
        self.fenced: set[str] = set()
        """Databases fenced by a region failover elsewhere: they accept no fenced write."""
        self.unfenced_return: str | None = None
        """A database that came back without its fence (the documented hazard): its
        acquisitions below another database's tokens are counted, not failed."""
        self.stale_epoch_acquisitions = 0
        self.claims: dict[str, dict[tuple[str, int], datetime]] = {}
        """Per database, when each attempt (execution id, attempt) was claimed."""
        self._open: dict[tuple[str, int], _Episode] = {}
        self._closed: dict[tuple[str, int], list[tuple[float, float, str]]] = {}

    # -- databases ------------------------------------------------------------------------

    def copy_database(self, source: str, target: str) -> None:
        """``target`` starts as a copy of ``source`` (a replica taken now)."""
        self._holders[target] = copy.deepcopy(self._holders[source])

    def revoked_all(self, database: str) -> None:
        """A region failover cleared every lease's owner in ``database`` (tokens kept)."""
        for holder in self._holders[database].values():
            holder.owner = None
            holder.expires_at = None

    # -- what the ledger committed ------------------------------------------------------

    def acquired(self, lease: Lease, now: datetime, database: str = PRIMARY) -> None:
        holder = self._holders[database][lease.partition_id]
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
        self._across(lease, database)
        self._holders[database][lease.partition_id] = _Holder(
            lease.owner_id, lease.fencing_token, lease.expires_at
        )

    def _across(self, lease: Lease, database: str) -> None:
        """The token is above every token drawn for the partition in any database."""
        highest, where = self._highest.get(lease.partition_id, (0, database))
        if where != database and lease.fencing_token <= highest:
            if database == self.unfenced_return:
                self.stale_epoch_acquisitions += 1
                return
            self.violations.append(
                f"fencing token below another database's: partition {lease.partition_id} "
                f"acquired in database {database} by {lease.owner_id} with token "
                f"{lease.fencing_token}, database {where} drew {highest}"
            )
        if lease.fencing_token > highest:
            self._highest[lease.partition_id] = (lease.fencing_token, database)

    def claimed(self, executions: list[Execution], now: datetime, database: str = PRIMARY) -> None:
        """Attempts the ledger started (for the failover checker)."""
        claims = self.claims.setdefault(database, {})
        for execution in executions:
            claims[(execution.execution_id, execution.attempt)] = now

    def refused(self, database: str = PRIMARY) -> None:
        self.refused_writes += 1
        self.refused_by_database[database] += 1

    def renewed(self, leases: list[Lease], database: str = PRIMARY) -> None:
        for lease in leases:
            holder = self._holders[database][lease.partition_id]
            if (holder.owner, holder.token) != (lease.owner_id, lease.fencing_token):
                self.violations.append(
                    f"renewal of partition {lease.partition_id} returned {lease.owner_id}/"
                    f"{lease.fencing_token}, but the holder is {holder.owner}/{holder.token}"
                )
            holder.expires_at = lease.expires_at

    def released(
        self, fences: list[Fence], count: int, now: datetime, database: str = PRIMARY
    ) -> None:
        held = [f for f in fences if self._holds(f, now, database)]
        for fence in held:
            self._holders[database][fence.partition_id].owner = None
        if len(held) != count:
            self.violations.append(
                f"release of {fences} released {count} leases; {len(held)} were held"
            )

    def write_accepted(
        self, node: str, method: str, fences: list[Fence], now: datetime, database: str = PRIMARY
    ) -> None:
        self.accepted_writes += 1
        if fences and database in self.fenced:
            self.violations.append(
                f"{method} by {node} accepted by the fenced database {database} at "
                f"{now.isoformat()} (fences {[(f.partition_id, f.fencing_token) for f in fences]})"
            )
            return
        for fence in fences:
            if not self._holds(fence, now, database):
                holder = self._holders[database][fence.partition_id]
                self.violations.append(
                    f"{method} by {node} accepted with stale fence {fence.partition_id}/"
                    f"{fence.owner_id}/{fence.fencing_token} at {now.isoformat()}; holder "
                    f"{holder.owner}/{holder.token} until {holder.expires_at}"
                )

    def _holds(self, fence: Fence, now: datetime, database: str) -> bool:
        holder = self._holders[database][fence.partition_id]
        return (
            holder.owner == fence.owner_id
            and holder.token == fence.fencing_token
            and holder.expires_at is not None
            and holder.expires_at > now
        )

    # -- what the nodes trusted ------------------------------------------------------------

    def trusted(
        self,
        who: str,
        partition: int,
        token: int,
        at: float,
        until: float,
        database: str = PRIMARY,
    ) -> None:
        """``who`` (a node process, of ``database``) trusts ``partition`` under ``token``
        from ``at`` until ``until`` (true seconds); a later call for the same episode
        extends it."""
        key = (who, partition)
        episode = self._open.get(key)
        if episode is not None and episode.token != token:
            self.untrusted(who, partition, at)
            episode = None
        if episode is None:
            self._open[key] = _Episode(token, database, start=at, end=max(at, until))
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
        intervals = self._closed.setdefault((episode.database, partition), [])
        intervals += [(s, e, label) for s, e in episode.intervals if e > s]

    def untrust_all(self, who: str, at: float) -> None:
        for key in sorted(k for k in self._open if k[0] == who):
            self.untrusted(who, key[1], at)

    def finish(self, at: float) -> None:
        """Close every open episode at ``at`` and check trust exclusivity."""
        for who, partition in sorted(self._open):
            self.untrusted(who, partition, at)
        for database, partition in sorted(self._closed):
            intervals = sorted(self._closed[(database, partition)])
            reach = -1.0
            reach_label = ""
            for start, end, label in intervals:
                if start < reach and label != reach_label:
                    where = "" if database == PRIMARY else f" (database {database})"
                    self.violations.append(
                        f"partition {partition}{where} trusted by {reach_label} until "
                        f"t={reach:.3f} and by {label} from t={start:.3f}"
                    )
                if end > reach:
                    reach, reach_label = end, label

    def trust_intervals(
        self, partition: int, database: str = PRIMARY
    ) -> list[tuple[float, float, str]]:
        return sorted(self._closed.get((database, partition), []))

    def trust_in(self, database: str) -> list[tuple[float, float, str]]:
        """Every closed trust interval of ``database``'s processes, all partitions."""
        return sorted(
            interval
            for (db, _), found in self._closed.items()
            if db == database
            for interval in found
        )
