"""The fault vocabulary: small frozen records, one per kind of trouble, placed on a timeline.

A scenario is a list of these, each at ``at_s`` seconds after the run starts, all inside the
safety phase; the healed liveness phase that follows has none. Every record says what it
does in one line (:func:`describe`), which the runner prints before the run, and over which
interval it disturbs the cluster (:func:`disruption`), which the start-delay bound uses.

``nodes=()`` on a ledger fault means the database itself (every node, and the API clients
that change schedules); naming nodes means only their connections (a network partition, a
bad connection pool). After a :class:`RegionFailover` it means whichever database each
client uses.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from simulations.workload import SimSchedule


@dataclass(frozen=True)
class Crash:
    """The process dies (no graceful shutdown); a new process with the same id starts after
    ``down_s`` (``None``: when the liveness phase begins)."""

    at_s: float
    node: str
    down_s: float | None


@dataclass(frozen=True)
class Pause:
    """The process freezes (SIGSTOP, a long GC): its ledger calls and effects wait, then go
    out late when it resumes -- a zombie if the pause outlasts the lease TTL."""

    at_s: float
    node: str
    duration_s: float


@dataclass(frozen=True)
class Skew:
    """The host's wall clock runs ``skew_s`` away from true time for ``duration_s`` (NTP
    broken), then NTP puts it right."""

    at_s: float
    node: str
    skew_s: float
    duration_s: float


@dataclass(frozen=True)
class Jump:
    """The host's wall clock steps by ``delta_s`` (forward or back: a VM resumed, an
    operator's mistake), and NTP steps it back ``settle_s`` later."""

    at_s: float
    node: str
    delta_s: float
    settle_s: float


@dataclass(frozen=True)
class Outage:
    """Ledger calls fail with ``LedgerUnavailable`` for ``duration_s``."""

    at_s: float
    duration_s: float
    nodes: tuple[str, ...] = ()


@dataclass(frozen=True)
class SlowLedger:
    """Each ledger call gets up to ``latency_s`` extra each way (request and reply)."""

    at_s: float
    duration_s: float
    latency_s: float
    nodes: tuple[str, ...] = ()


@dataclass(frozen=True)
class CommitUnknown:
    """With ``probability``, a call's write is applied but the caller gets
    ``LedgerUnavailable`` (the reply was lost)."""

    at_s: float
    duration_s: float
    probability: float
    nodes: tuple[str, ...] = ()


@dataclass(frozen=True)
class StuckRenewals:
    """The node's attempt-lease renewals (``executions_extend``) time out: attempts that
    run longer than their lease are re-queued and delivered again (redelivery)."""

    at_s: float
    node: str
    duration_s: float


@dataclass(frozen=True)
class Join:
    """A new node starts (rebalancing: it takes its fair share)."""

    at_s: float
    node: str


@dataclass(frozen=True)
class Leave:
    """A node shuts down gracefully (releases its leases; SIGTERM)."""

    at_s: float
    node: str


ChangeAction = Literal["create", "payload", "retime", "pause", "resume", "delete"]


@dataclass(frozen=True)
class ScheduleChange:
    """An API client changes a schedule: ``schedule`` is the new definition for
    ``create``, ``payload`` and ``retime``; ``None`` for the others."""

    at_s: float
    action: ChangeAction
    schedule_id: str
    schedule: SimSchedule | None = None


@dataclass(frozen=True)
class SlowHandler:
    """A task type's receiver is slow: every attempt of a fire planned in ``[at_s, at_s +
    duration_s)`` takes ``low_s``-``high_s`` (drawn per attempt) on top of its work. A
    *step* lasts minutes at up to a few seconds an attempt; a *spike* lasts seconds at a good
    fraction of the timeout. Keyed by the planned instant, not by when the attempt runs, so
    every draw depends only on the seed, the execution id and the attempt number."""

    at_s: float
    duration_s: float
    task_type: str
    low_s: float
    high_s: float
    kind: Literal["step", "spike"] = "step"
    share: float = 1.0
    """The share of those attempts that are slow (drawn per attempt; a step slows all)."""

    def covers(self, planned_s: float) -> bool:
        return self.at_s <= planned_s < self.at_s + self.duration_s


@dataclass(frozen=True)
class RegionFailover:
    """Region A's database is lost at ``at_s``; its streaming replica in region B, which had
    replayed everything up to ``at_s - lag_s``, is promoted and made the active region
    (``Ledger.region_failover``: epoch + 1, every lease revoked), and region B's nodes
    (``standby``, idle until then) start on it. Region A's processes cannot reach the old
    primary until it comes back ``fence_old_after_s`` later (``None``: never) -- fenced
    first, as the runbook says, unless ``fenced`` is false (the hazard the fence exists
    for)."""

    at_s: float
    lag_s: float
    fence_old_after_s: float | None
    standby: tuple[str, ...]
    """The nodes of region B; the others are region A's."""
    fenced: bool = True

    @property
    def snapshot_s(self) -> float:
        """The instant the new primary's copy is of (the end of the replication lag)."""
        return self.at_s - self.lag_s

    @property
    def old_back_s(self) -> float | None:
        """When the old primary takes clients again, if ever."""
        return None if self.fence_old_after_s is None else self.at_s + self.fence_old_after_s


Fault = (
    Crash
    | Pause
    | Skew
    | Jump
    | Outage
    | SlowLedger
    | CommitUnknown
    | StuckRenewals
    | Join
    | Leave
    | ScheduleChange
    | SlowHandler
    | RegionFailover
)


@dataclass(frozen=True)
class HandlerFaults:
    """Per-attempt probabilities of what the handler does (drawn from the seed, the
    execution id and the attempt number, so independent of scheduling order)."""

    transient_p: float = 0.0
    """Fails before its effect (retried)."""
    lost_reply_p: float = 0.0
    """Applies its effect, then fails (the receiver's reply was lost; retried)."""
    permanent_p: float = 0.0
    """Fails before its effect, permanently (dead letter)."""
    hang_p: float = 0.0
    """Runs 1.5-3x the attempt lease (kept by renewals, unless renewals are stuck)."""


@dataclass(frozen=True)
class HandlerLatency:
    """One task type's latency profile apart from its :class:`SlowHandler` stretches: what
    every attempt takes on top of its work (``fast_s``, uniform), and, per attempt, a slow
    tail (``tail_p``: log-uniform in ``tail_s``, below the timeout) or an overrun of the
    task type's timeout (``timeout_p``: 1.05-2x the timeout; the worker cuts it off, a
    ``timeout`` outcome). Drawn from the seed, the execution id and the attempt number."""

    task_type: str
    fast_s: tuple[float, float] = (0.0, 0.0)
    tail_p: float = 0.0
    tail_s: tuple[float, float] = (0.0, 0.0)
    timeout_p: float = 0.0

    def describe(self) -> str:
        lo, hi = self.fast_s
        tlo, thi = self.tail_s
        return (
            f"latency {self.task_type}: {lo * 1000:.0f}-{hi * 1000:.0f}ms, tail "
            f"{self.tail_p:.1%} at {tlo:.1f}-{thi:.1f}s, past the timeout {self.timeout_p:.1%}"
        )


def _where(nodes: tuple[str, ...]) -> str:
    return "database" if not nodes else "link " + ",".join(nodes)


def describe(fault: Fault) -> str:
    """One line: when, what."""
    at = f"+{fault.at_s:9.1f}s"
    match fault:
        case Crash(node=node, down_s=down):
            after = "at heal" if down is None else f"{down:.1f}s later"
            return f"{at} crash {node}, restart {after}"
        case Pause(node=node, duration_s=d):
            return f"{at} pause {node} for {d:.1f}s"
        case Skew(node=node, skew_s=s, duration_s=d):
            return f"{at} skew {node} clock by {s:+.1f}s for {d:.1f}s"
        case Jump(node=node, delta_s=d, settle_s=settle):
            return f"{at} jump {node} clock by {d:+.1f}s, stepped back {settle:.1f}s later"
        case Outage(duration_s=d, nodes=nodes):
            return f"{at} outage of {_where(nodes)} for {d:.1f}s"
        case SlowLedger(duration_s=d, latency_s=lat, nodes=nodes):
            return f"{at} slow {_where(nodes)} (+{lat:.2f}s each way) for {d:.1f}s"
        case CommitUnknown(duration_s=d, probability=p, nodes=nodes):
            return f"{at} commit-unknown on {_where(nodes)} p={p:.2f} for {d:.1f}s"
        case StuckRenewals(node=node, duration_s=d):
            return f"{at} attempt renewals of {node} stuck for {d:.1f}s"
        case Join(node=node):
            return f"{at} join {node}"
        case Leave(node=node):
            return f"{at} leave {node}"
        case ScheduleChange(action=action, schedule_id=sid, schedule=s):
            what = "" if s is None else f" -> {s.describe()}"
            return f"{at} {action} {sid}{what}"
        case SlowHandler(duration_s=d, task_type=t, low_s=lo, high_s=hi, kind=kind, share=sh):
            which = "every attempt" if sh >= 1 else f"{sh:.0%} of attempts"
            return (
                f"{at} slow handler {t} ({kind}): {lo:.2f}-{hi:.2f}s on {which} of fires "
                f"planned in the next {d:.1f}s"
            )
        case RegionFailover(lag_s=lag, fence_old_after_s=back, standby=standby, fenced=fenced):
            old = (
                "never back"
                if back is None
                else f"back {back:.1f}s later, {'fenced first' if fenced else 'NOT fenced'}"
            )
            return (
                f"{at} region failover to b ({','.join(standby)}), replica {lag:.3f}s behind; "
                f"old primary {old}"
            )
    raise AssertionError(f"unknown fault {fault!r}")


def disruption(fault: Fault, heal_s: float) -> tuple[float, float] | None:
    """The interval (seconds from the start) during which ``fault`` disturbs the cluster,
    before recovery; ``None`` for a change that disturbs nothing but its own schedule, and
    for a slow handler (the bound gives its backlog an allowance of its own)."""
    match fault:
        case Crash(at_s=at, down_s=down):
            return (at, heal_s if down is None else min(at + down, heal_s))
        case Pause(at_s=at, duration_s=d) | StuckRenewals(at_s=at, duration_s=d):
            return (at, at + d)
        case Outage(at_s=at, duration_s=d) | SlowLedger(at_s=at, duration_s=d):
            return (at, at + d)
        case CommitUnknown(at_s=at, duration_s=d) | Skew(at_s=at, duration_s=d):
            return (at, at + d)
        case Jump(at_s=at, settle_s=d):
            return (at, at + d)
        case Join(at_s=at) | Leave(at_s=at):
            return (at, at)
        case ScheduleChange() | SlowHandler():
            # A slow handler disturbs no node: the backlog it builds has its own allowance
            # (simulations.bound.LoadBound).
            return None
        case RegionFailover(at_s=at, lag_s=lag):
            # Fires planned since the replica's copy may be lost and planned again; the
            # world extends the end by region B's startup (its first lease cycle).
            return (at - lag, at)
    raise AssertionError(f"unknown fault {fault!r}")


def fault_end_s(fault: Fault) -> float:
    """When the fault's own action ends (a crash: when its restart happens)."""
    window = disruption(fault, float("inf"))
    return fault.at_s if window is None else window[1]


def failover_of(faults: tuple[Fault, ...]) -> RegionFailover | None:
    """The run's region failover, if it has one (at most one)."""
    found = [f for f in faults if isinstance(f, RegionFailover)]
    if len(found) > 1:
        raise ValueError("a run has at most one region failover")
    return found[0] if found else None
