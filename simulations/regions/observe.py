"""What a game day watches while it runs, and the record it keeps of each variant.

* :func:`watch_recovery` -- after the fault, polls until region B is back: each region-B node
  ready (its "node ready" log line), every partition held by a region-B node on the new
  primary, and the first delivery at the sink under a token of the new region epoch.
* :func:`wait_standing_by` -- until every region-A node reports, on its ``/metrics``, that its
  region stands by at the new epoch (it reconnected and read the fenced settings).
* :class:`VariantRecord` -- the instants, durations and command outcomes the checkers judge.

Everything here reads from outside the engine: log files, the sink's file, the lease table,
``/metrics``.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Final

from simulations.chaos import audit
from simulations.chaos.faults import Timeline
from simulations.chaos.nodes import NodeProcess, lease_losses
from simulations.chaos.sink import read_deliveries
from simulations.regions.replication import ReplicationLag
from simulations.regions.stage import Failover, Stage, ready_at

POLL_S: Final = 0.2
STANDBY_METRIC: Final = "carillon_region_standby"
EPOCH_METRIC: Final = "carillon_region_epoch"
ACQUISITIONS_METRIC: Final = "carillon_lease_acquisitions_total"


class GameDayTimeline(Timeline):
    """The chaos run's timeline, printed under the game day's name."""

    def note(self, what: str) -> None:
        now = time.time()
        self.events.append((now, what))
        if not self.quiet:
            print(f"gameday: [{now - self.t0:+7.1f} s] {what}", file=sys.stderr, flush=True)


@dataclass
class Recovery:
    """When region B was back, as wall-clock instants (``None``: not within the watch)."""

    ready_at: dict[str, float | None]
    all_held_at: float | None
    first_delivery_at: float | None

    @property
    def nodes_ready_at(self) -> float | None:
        instants = list(self.ready_at.values())
        return None if None in instants else max(i for i in instants if i is not None)


def watch_recovery(
    stage: Stage, url: str, since: float, token_floor: int, timeout_s: float
) -> Recovery:
    """Poll until every region-B node is ready, holds-all and delivers, or ``timeout_s``."""
    nodes = stage.region_b.nodes
    b_ids = stage.region_b.node_ids
    ready: dict[str, float | None] = {node.node_id: None for node in nodes}
    held: float | None = None
    first: float | None = None
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for node in nodes:
            if ready[node.node_id] is None and (at := ready_at(node)) is not None:
                ready[node.node_id] = at
                node.wait_ready(1.0)  # reads its API address
        if held is None and None not in ready.values():
            owners = audit.lease_owners(url)
            if owners and all(owner in b_ids for owner, _ in owners.values()):
                held = time.time()
        if first is None:
            arrivals = [
                arrival
                for arrival, _, _, token, _ in read_deliveries(stage.sink.path)
                if token >= token_floor and arrival >= since
            ]
            first = min(arrivals, default=None)
        if held is not None and first is not None:
            break
        time.sleep(POLL_S)
    return Recovery(ready, held, first)


def region_metrics(nodes: list[NodeProcess]) -> dict[str, dict[str, float]]:
    """Each node's standby flag, region epoch, lease acquisitions and losses (``{}`` when
    its API does not answer)."""
    shown: dict[str, dict[str, float]] = {}
    for node in nodes:
        values = node.metrics()
        if not values:
            shown[node.node_id] = {}
            continue
        losses = lease_losses(values)
        shown[node.node_id] = {
            "standby": values.get(STANDBY_METRIC, -1.0),
            "epoch": values.get(EPOCH_METRIC, -1.0),
            "acquisitions": values.get(ACQUISITIONS_METRIC, 0.0),
            "losses_refused": losses.get("refused", 0.0),
            "losses_expired": losses.get("expired", 0.0),
        }
    return shown


def wait_standing_by(
    nodes: list[NodeProcess], epoch: int, timeout_s: float
) -> tuple[float | None, dict[str, dict[str, float]]]:
    """Until every node reports standing by at ``epoch``: when (``None`` if not within
    ``timeout_s``), and the metrics last read."""
    deadline = time.monotonic() + timeout_s
    while True:
        shown = region_metrics(nodes)
        if all(m.get("standby") == 1.0 and m.get("epoch") == epoch for m in shown.values()):
            return time.time(), shown
        if time.monotonic() > deadline:
            return None, shown
        time.sleep(POLL_S * 2.5)


@dataclass(frozen=True)
class UnsafeRestart:
    """The documented hazard, staged: a region-A node on the old primary before the fence."""

    node_id: str
    started: float
    exited: float
    lease_epoch: int
    """The region epoch the unfenced old primary still had (its tokens are of it)."""


@dataclass
class VariantRecord:
    """What one variant did and measured; the checkers (:mod:`~simulations.regions.verdicts`)
    read the ledgers and the sink against it."""

    name: str
    t0: float
    burst: float
    """The burst instant the fault is placed against."""
    fault_at: float
    """The crash (forced) or the fence (switch-over) began."""
    fault_done: float
    switch_terms: dict[str, float]
    """The measured steps of the database switch (promotion, failover command...)."""
    first_command: Failover
    """The failover that made region B active (on the new primary, or on the primary)."""
    epoch_before: int
    new_url: str
    old_url: str
    recovery: Recovery | None = None
    loss_start: float | None = None
    """Forced: the last instant of which the standby holds every commit (streaming paused)."""
    lag: ReplicationLag | None = None
    fence: Failover | None = None
    """Forced: the failover run again once the old primary is up, isolated; it fences it."""
    unsafe: UnsafeRestart | None = None
    reopened_at: float | None = None
    """The old primary listening on TCP again, for region A's nodes."""
    standing_by_at: float | None = None
    reconnected: set[str] = field(default_factory=set)
    """Region-A nodes that heartbeat on the old primary after it was reopened."""
    region_a_before: dict[str, dict[str, float]] = field(default_factory=dict)
    region_a_after: dict[str, dict[str, float]] = field(default_factory=dict)
    window: tuple[float, float] = (0.0, 0.0)
    timeline: list[tuple[float, str]] = field(default_factory=list)

    @property
    def epoch_after(self) -> int:
        return self.first_command.epoch

    @property
    def switch_s(self) -> float:
        return sum(self.switch_terms.values())

    @property
    def fenced_at(self) -> float:
        """From when no region-A node may act any more on the database they use."""
        return (self.fence or self.first_command).done
