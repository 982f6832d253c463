"""The region failover checker: duplicate deliveries bounded by the replication lag, fencing.

A failover at ``F`` promotes a replica whose copy is of ``S = F - lag`` (the *snapshot*).
Region B then knows every attempt as the snapshot had it, and nothing region A did after
``S``. So region B delivers again an execution that region A had started exactly when
region A's last attempt of it was **unfinished in the snapshot**:

* **lag window** -- region A claimed that attempt in ``(S, F]``: the snapshot has the
  execution queued (or a retry pending, or not even planned), and region B runs it;
* **in flight** -- region A claimed it at or before ``S`` and it was still running in the
  snapshot, under an attempt lease last claimed or renewed in ``[S - attempt_lease, S]``
  (it expires after ``S``): region B re-queues it once that lease has run out by the
  database clock, and runs it again;
* **expired** -- the same, but the attempt lease had already run out before ``S`` (the
  holder's renewals were failing): an ordinary redelivery, which region A's own
  redeliverer would have made too; counted apart, not a failover duplicate.

Put together, the **duplicate-delivery window**: every execution delivered by both regions
whose repeat is the failover's was claimed, or last had its attempt lease renewed, by
region A within ``[F - lag - attempt_lease, F]``. Checked here (each failure a violation):

* region A delivers nothing it claimed after ``F`` (it cannot reach the old primary; once
  that is fenced, every claim is refused) -- except, when the old primary came back
  *unfenced*, what it claimed from then on: the documented hazard, counted as such;
* an in-flight attempt is run again by region B only after its attempt lease (as the
  snapshot had it) has run out;
* region B never delivers an execution the snapshot had finished;
* region A's processes stop trusting their leases by ``F + lease_ttl - safety_margin``
  (the last renewal that reached the old primary was sent before ``F``).

Every repeat carries the same idempotency key, the execution id: both regions write the
same ``scheduleId:plannedAt``, and the fire checker's "no duplicate effect" holds across the
failover. Executions that region B ran only *after* region A's attempts had finished in the
snapshot (a failed attempt's retry) are retries, not repeats.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from engine.model import Execution, ExecutionStatus
from simulations.effects import Delivery
from simulations.params import SimParams
from simulations.scenario import RegionFailover

EPSILON_S = 1e-6


@dataclass
class FailoverLog:
    """What the world recorded of the failover as it happened."""

    snapshot: dict[str, Execution] = field(default_factory=dict)
    """The replica's executions at the snapshot, by id."""
    epoch: int = 0
    """The region epoch the failover moved the new primary to."""
    revoked: int = 0
    """Leases the failover revoked in the new primary."""
    happened: bool = False
    back: bool = False
    """The old primary took clients again."""
    refused: int = 0
    """Fenced writes the old primary refused before it took clients again."""
    refused_after_back: int = 0
    """Fenced writes the old primary refused once back (set at the end of the run)."""


@dataclass
class FailoverReport:
    fault: RegionFailover
    window_s: tuple[float, float]
    """The duplicate-delivery window, seconds from the start: ``[F - lag - lease, F]``."""
    epoch: int = 0
    revoked: int = 0
    both_regions: int = 0
    """Executions region A and region B both delivered (any attempts)."""
    lag_window: int = 0
    in_flight: int = 0
    expired: int = 0
    retries: int = 0
    after_return: int = 0
    """Executions region A claimed on the old primary after its unfenced return."""
    region_a_deliveries_after_return: int = 0
    refused_after_back: int = 0
    stale_epoch_acquisitions: int = 0
    trust_end_after_s: float | None = None
    """How long after the failover the last of region A's trust (from before it) ended."""
    violations: list[str] = field(default_factory=list)

    @property
    def duplicates(self) -> int:
        """Executions the failover itself made region B deliver again."""
        return self.lag_window + self.in_flight

    def lines(self) -> list[str]:
        f = self.fault
        back = f.old_back_s
        lines = [
            f"region failover at +{f.at_s:.1f}s to b at epoch {self.epoch} ({self.revoked} "
            f"leases revoked); replica copy of +{f.snapshot_s:.1f}s (lag {f.lag_s:.3f}s)",
            f"duplicate-delivery window [+{self.window_s[0]:.1f}s, +{self.window_s[1]:.1f}s] "
            f"(failover - lag - attempt lease, failover): executions delivered by both "
            f"regions {self.both_regions}: claimed in the lag window {self.lag_window}, in "
            f"flight at the copy {self.in_flight}, lease already expired {self.expired}, "
            f"retries {self.retries} (the rest: after an unfenced return)",
        ]
        if back is None:
            lines.append("old primary never back")
        elif f.fenced:
            lines.append(
                f"old primary back at +{back:.1f}s, fenced first: fenced writes from region A "
                f"refused there {self.refused_after_back}"
            )
        else:
            lines.append(
                f"old primary back at +{back:.1f}s NOT fenced (the hazard): region A ran "
                f"{self.after_return} executions there again "
                f"({self.region_a_deliveries_after_return} deliveries, same idempotency keys); "
                f"{self.stale_epoch_acquisitions} leases drawn below the new epoch's tokens"
            )
        if self.trust_end_after_s is not None:
            lines.append(
                f"region A's last trust in a lease ended {self.trust_end_after_s:.3f}s after "
                "the failover"
            )
        return lines


class FailoverChecker:
    def __init__(
        self,
        params: SimParams,
        fault: RegionFailover,
        log: FailoverLog,
        region_of: dict[str, str],
    ) -> None:
        self.params = params
        self.fault = fault
        self.log = log
        self.region_of = region_of
        lease_s = params.settings.attempt_lease_s
        self.report = FailoverReport(
            fault,
            (fault.snapshot_s - lease_s, fault.at_s),
            epoch=log.epoch,
            revoked=log.revoked,
            refused_after_back=log.refused_after_back,
        )

    def _s(self, at: datetime) -> float:
        return (at - self.params.start).total_seconds()

    def _fail(self, message: str) -> None:
        self.report.violations.append(message)

    def check(
        self,
        deliveries: list[Delivery],
        claims: dict[tuple[str, int], datetime],
        trust: list[tuple[float, float, str]],
        stale_epoch_acquisitions: int,
    ) -> FailoverReport:
        """``claims``: when the old primary committed each claim; ``trust``: region A's
        trust intervals in it."""
        r = self.report
        r.stale_epoch_acquisitions = stale_epoch_acquisitions
        if not self.log.happened:
            return r
        by_region: dict[str, dict[str, list[Delivery]]] = defaultdict(lambda: defaultdict(list))
        for d in deliveries:
            by_region[self.region_of.get(d.node, "a")][d.execution_id].append(d)
        ours, theirs = by_region["a"], by_region["b"]
        for execution_id in sorted(ours):
            self._region_a(execution_id, ours[execution_id], claims)
        for execution_id in sorted(theirs):
            snap = self.log.snapshot.get(execution_id)
            if snap is not None and snap.status.is_terminal:
                self._fail(
                    f"region B delivered {execution_id}, which the new primary's copy had "
                    f"finished ({snap.status})"
                )
            if execution_id in ours:
                r.both_regions += 1
                self._repeat(execution_id, ours[execution_id], theirs[execution_id], claims)
        self._trust(trust)
        return r

    def _claimed_s(self, d: Delivery, claims: dict[tuple[str, int], datetime]) -> float | None:
        at = claims.get((d.execution_id, d.attempt))
        return None if at is None else self._s(at)

    def _region_a(
        self, execution_id: str, ours: list[Delivery], claims: dict[tuple[str, int], datetime]
    ) -> None:
        """Region A acts on nothing it claimed after the failover (bar the hazard)."""
        f, r = self.fault, self.report
        back = f.old_back_s
        late = []
        for d in ours:
            claimed_s = self._claimed_s(d, claims)
            if claimed_s is None:
                self._fail(f"region A delivered {execution_id} attempt {d.attempt} unclaimed")
            elif claimed_s > f.at_s + EPSILON_S:
                late.append((d, claimed_s))
        if not late:
            return
        if not f.fenced and back is not None and all(s >= back - EPSILON_S for _, s in late):
            r.after_return += 1
            r.region_a_deliveries_after_return += len(late)
            return
        d, claimed_s = late[0]
        self._fail(
            f"region A delivered {execution_id} attempt {d.attempt}, claimed on the old "
            f"primary at +{claimed_s:.3f}s, after the failover at +{f.at_s:.3f}s"
        )

    def _repeat(
        self,
        execution_id: str,
        ours: list[Delivery],
        theirs: list[Delivery],
        claims: dict[tuple[str, int], datetime],
    ) -> None:
        """Classify a cross-region delivery by region A's last attempt."""
        f, r = self.fault, self.report
        last = max(ours, key=lambda d: d.attempt)
        claimed_s = self._claimed_s(last, claims)
        if claimed_s is None or claimed_s > f.at_s + EPSILON_S:
            return  # judged by _region_a
        snap = self.log.snapshot.get(execution_id)
        in_copy = 0 if snap is None else snap.attempt
        if last.attempt > in_copy:
            if claimed_s < f.snapshot_s - EPSILON_S:
                self._fail(
                    f"{execution_id} attempt {last.attempt} was claimed at +{claimed_s:.3f}s, "
                    f"before the copy at +{f.snapshot_s:.3f}s, but the copy has attempt "
                    f"{in_copy}"
                )
            r.lag_window += 1
            return
        if snap is None or last.attempt < in_copy or snap.status is not ExecutionStatus.RUNNING:
            r.retries += 1  # region A's attempts had finished in the copy
            return
        expires = snap.attempt_expires_at
        assert expires is not None  # set exactly while running
        if self._s(expires) < f.snapshot_s:
            r.expired += 1
            return
        r.in_flight += 1
        first = min(d.started_at for d in theirs)
        if first < expires - timedelta(seconds=EPSILON_S):
            self._fail(
                f"region B ran {execution_id} at {first.isoformat()}, before the attempt "
                f"lease region A held in the copy ran out ({expires.isoformat()})"
            )

    def _trust(self, trust: list[tuple[float, float, str]]) -> None:
        f, s = self.fault, self.params.settings
        bound_s = s.lease_ttl_s - s.lease_safety_margin_s
        back = f.old_back_s
        if not f.fenced and back is not None:  # renewed on the unfenced return: the hazard
            trust = [(start, min(end, back), label) for start, end, label in trust]
        ends = [end for start, end, _ in trust if start <= f.at_s + EPSILON_S]
        if not ends:
            return
        after = max(ends) - f.at_s
        self.report.trust_end_after_s = max(after, 0.0)
        if after > bound_s + EPSILON_S:
            self._fail(
                f"region A trusted a lease {after:.3f}s after the failover; its trust "
                f"window is {bound_s:.3f}s (lease TTL - safety margin)"
            )
