"""The faults of a chaos run, each carried out at its instant and noted on the timeline.

Each strikes ``fault_offset_s`` from a burst instant (see :class:`~simulations.chaos.config.
ChaosConfig`): in the middle of a big burst, or just before a small one.

* :meth:`Faults.kill_and_restart` -- SIGKILL a node, leave it dead for ``restart_gap_s``,
  start a replacement under a new id.
* :meth:`Faults.pause` -- SIGSTOP a node, keep it stopped until its lease is past and every
  partition it held has been acquired by another node (at least ``pause_s``), then SIGCONT
  it: a zombie whose fences are all stale.
* :meth:`Faults.restart_postgres` -- stop the database in ``fast`` mode (every connection
  cut, open transactions rolled back), keep it down ``pg_down_s``, start it again.
* :meth:`Faults.slow_receiver` -- the webhook receiver answers every delivery
  ``slow_receiver_ms`` late for ``slow_receiver_s``, then fast again: the nodes' handlers
  turn slow under a burst and recover (the condition that once stalled a node for good).
"""

from __future__ import annotations

import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from simulations.chaos.audit import lease_owners
from simulations.chaos.config import ChaosConfig
from simulations.chaos.nodes import NodeProcess, NodeSettings, lease_losses, metrics_until
from simulations.chaos.postgres import PrivatePostgres
from simulations.chaos.sink import SinkProcess
from simulations.chaos.zombie import ZombieRecord

TAKEOVER_WAIT_FACTOR = 4.0
"""The zombie stays stopped at most this many lease TTLs past ``pause_s``, waiting for the
takeover of its partitions (the check reports any that were not taken)."""


@dataclass
class Timeline:
    """Wall-clock notes, printed as they happen (stderr) and kept for the report."""

    t0: float
    quiet: bool = False
    events: list[tuple[float, str]] = field(default_factory=list)

    def note(self, what: str) -> None:
        now = time.time()
        self.events.append((now, what))
        if not self.quiet:
            print(f"chaos: [{now - self.t0:+7.1f} s] {what}", file=sys.stderr, flush=True)


def sleep_until(wall_s: float) -> None:
    while (left := wall_s - time.time()) > 0:
        time.sleep(min(left, 0.5))


class Cluster:
    """The node processes: those running now, and every one ever started (for the logs)."""

    def __init__(self, settings: NodeSettings, log_dir: Path, count: int) -> None:
        self.settings = settings
        self.log_dir = log_dir
        self.running = [NodeProcess(f"node-{i + 1}", settings, log_dir) for i in range(count)]
        self.ever = list(self.running)

    def start(self) -> None:
        for node in self.running:
            node.start()
        for node in self.running:
            node.wait_ready()

    def replace(self, old: NodeProcess) -> NodeProcess:
        base = old.node_id.split(".")[0]
        generation = sum(1 for n in self.ever if n.node_id.split(".")[0] == base)
        new = NodeProcess(f"{base}.r{generation}", self.settings, self.log_dir)
        self.running[self.running.index(old)] = new
        self.ever.append(new)
        new.start()
        return new

    def by_id(self, node_id: str) -> NodeProcess:
        return next(n for n in self.ever if n.node_id == node_id)


class Faults:
    def __init__(
        self,
        config: ChaosConfig,
        cluster: Cluster,
        postgres: PrivatePostgres,
        database_url: str,
        timeline: Timeline,
    ) -> None:
        self.config = config
        self.cluster = cluster
        self.postgres = postgres
        self.url = database_url
        self.timeline = timeline
        self.db_outage_s: float | None = None
        self.zombie: ZombieRecord | None = None

    def kill_and_restart(self, victim: NodeProcess, at_wall: float) -> None:
        sleep_until(at_wall)
        victim.kill()
        self.timeline.note(f"SIGKILL {victim.node_id} (pid {victim.pid})")
        time.sleep(self.config.restart_gap_s)
        new = self.cluster.replace(victim)
        started = time.monotonic()
        new.wait_ready()
        self.timeline.note(
            f"restarted it as {new.node_id} (pid {new.pid}), ready in "
            f"{time.monotonic() - started:.1f} s"
        )

    def pause(self, victim: NodeProcess, at_wall: float) -> ZombieRecord:
        sleep_until(at_wall - 1.5)
        before = lease_losses(metrics_until(victim, 1.0))
        sleep_until(at_wall)
        held = {
            p: token for p, (owner, token) in lease_owners(self.url).items()
            if owner == victim.node_id
        }  # fmt: skip
        victim.signal(signal.SIGSTOP)
        stopped = time.time()
        record = ZombieRecord(victim.node_id, stopped, held_at_stop=held, losses_before=before)
        self.zombie = record
        self.timeline.note(f"SIGSTOP {victim.node_id} (holding {len(held)} partitions)")
        time.sleep(self.config.pause_s)
        deadline = time.monotonic() + TAKEOVER_WAIT_FACTOR * self.config.lease_ttl_s
        while time.monotonic() < deadline:
            owners = lease_owners(self.url)
            still = [p for p, token in held.items() if owners[p][1] == token]
            if not still:
                break
            time.sleep(0.2)
        victim.signal(signal.SIGCONT)
        record.resumed_wall = time.time()
        self.timeline.note(
            f"SIGCONT {victim.node_id} after {record.resumed_wall - stopped:.1f} s; "
            f"its partitions now have new tokens"
        )
        time.sleep(self.config.lease_ttl_s)
        record.losses_after = lease_losses(metrics_until(victim, self.config.lease_ttl_s))
        return record

    def slow_receiver(self, sink: SinkProcess, at_wall: float) -> None:
        sleep_until(at_wall)
        sink.set_latency(self.config.slow_receiver_ms)
        self.timeline.note(
            f"the receiver answers {self.config.slow_receiver_ms:g} ms late "
            f"for {self.config.slow_receiver_s:g} s"
        )
        time.sleep(self.config.slow_receiver_s)
        sink.set_latency(0)
        self.timeline.note("the receiver answers at once again")

    def restart_postgres(self, at_wall: float) -> float:
        sleep_until(at_wall)
        self.timeline.note(f"stopping PostgreSQL (fast), down for {self.config.pg_down_s:g} s")
        outage = self.postgres.restart(self.config.pg_down_s)
        self.db_outage_s = outage
        self.timeline.note(f"PostgreSQL accepts connections again ({outage:.2f} s without)")
        return outage
