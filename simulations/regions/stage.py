"""The game day's set-up: a replicated pair, the schema, two regions of nodes, the sink.

:func:`set_up` builds, in this order:

1. a :class:`~simulations.regions.replication.ReplicatedPair` and the database ``carillon`` on
   it; ``carillon migrate`` and the chaos run's audit triggers on the primary (both replicate);
   an admin token; ``carillon region failover --to a`` (the migrated active region is
   ``default``), then a wait until the standby has replayed all of it;
2. the webhook sink (:class:`~simulations.chaos.sink.SinkProcess`);
3. region A: ``carillon run --region a`` processes on the primary's URL, waited for; region
   B: ``carillon run --region b`` processes on the standby's URL. A node on a read-only
   standby keeps retrying its first heartbeat until the database is promoted, so region B's
   nodes are not "ready" (and serve no API) before the failover: the set-up only waits until
   each has logged that it found the database read-only;
4. through region A's API: the chaos run's signed webhook task type aimed at the sink, and
   the schedules (catch-up ``all``: every missed fire must run).

Everything is registered on the caller's :class:`contextlib.ExitStack`, so it is all stopped
(and the pair deleted) whatever happens.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Final

from simulations.chaos import audit
from simulations.chaos.nodes import NodeProcess, NodeSettings, stop_all
from simulations.chaos.sink import REPO_ROOT, SinkProcess
from simulations.chaos.workload import Api, ScheduleSpec, make_schedules
from simulations.regions.config import REGION_A, REGION_B, GameDayConfig
from simulations.regions.replication import ReplicatedPair

DATABASE: Final = "carillon"
COMMAND_TIMEOUT_S: Final = 120.0
STANDING_BY_TIMEOUT_S: Final = 30.0
READ_ONLY_MARK: Final = "read-only"
"""What a node's log says while its first heartbeat meets a hot standby."""


@dataclass(frozen=True)
class RegionNodeSettings(NodeSettings):
    """The chaos run's node flags, plus ``--region``."""

    region: str = "default"

    def argv(self, node_id: str) -> list[str]:
        return [*super().argv(node_id), "--region", self.region]


class Region:
    """The ``carillon run`` processes of one region (ids ``<region>-1``, ``<region>-2``...)."""

    def __init__(self, name: str, settings: RegionNodeSettings, count: int, logs: Path) -> None:
        self.name = name
        self.nodes = [NodeProcess(f"{name}-{i + 1}", settings, logs) for i in range(count)]

    @property
    def node_ids(self) -> set[str]:
        return {node.node_id for node in self.nodes}

    def start(self) -> None:
        for node in self.nodes:
            node.start()

    def wait_ready(self) -> None:
        for node in self.nodes:
            node.wait_ready()

    def wait_standing_by(self, timeout_s: float = STANDING_BY_TIMEOUT_S) -> None:
        """Until every node has found its database read-only (and so waits, not ready)."""
        deadline = time.monotonic() + timeout_s
        waiting = list(self.nodes)
        while waiting:
            for node in list(waiting):
                if not node.alive:
                    raise RuntimeError(f"{node.node_id} exited on the standby: {node.log_path}")
                if any(READ_ONLY_MARK in str(r.get("msg", "")) for r in node.log_records()):
                    waiting.remove(node)
            if time.monotonic() > deadline:
                raise RuntimeError(f"{[n.node_id for n in waiting]} never met the standby")
            time.sleep(0.2)


def ready_at(node: NodeProcess) -> float | None:
    """When the node logged "node ready" (its log's own timestamp), if it has."""
    for record in node.log_records():
        if record.get("msg") == "node ready":
            return datetime.fromisoformat(str(record["ts"]).replace("Z", "+00:00")).timestamp()
    return None


def carillon(*args: str) -> subprocess.CompletedProcess[str]:
    """``python -m engine ARGS`` (no ``CARILLON_*`` from this environment); raises on failure."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CARILLON_")}
    done = subprocess.run(
        [sys.executable, "-m", "engine", *args], capture_output=True, text=True, env=env,
        timeout=COMMAND_TIMEOUT_S, cwd=REPO_ROOT,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"carillon {' '.join(args[:2])} failed: {done.stderr.strip()}")
    return done


@dataclass(frozen=True)
class Failover:
    """One ``carillon region failover -o json``: its outcome, its duration, its warnings."""

    outcome: dict[str, Any]
    started: float
    done: float
    stderr: str

    @property
    def seconds(self) -> float:
        return self.done - self.started

    @property
    def epoch(self) -> int:
        return int(self.outcome["region_epoch"])

    @property
    def old_fenced(self) -> bool | None:
        old = self.outcome.get("old_primary")
        return None if old is None else bool(old["fenced"])


def region_failover(to: str, url: str, old_url: str | None = None) -> Failover:
    """``carillon region failover --to TO --database-url URL [--old-database-url OLD]``."""
    extra = () if old_url is None else ("--old-database-url", old_url)
    started = time.time()
    done = carillon(
        "region", "failover", "--to", to, "--database-url", url, *extra,
        "--reason", "game day", "-o", "json",
    )  # fmt: skip
    return Failover(json.loads(done.stdout), started, time.time(), done.stderr)


@dataclass
class Stage:
    """What the set-up built."""

    config: GameDayConfig
    work: Path
    pair: ReplicatedPair
    sink: SinkProcess
    region_a: Region
    region_b: Region
    specs: list[ScheduleSpec]
    created: float
    """When the schedules were created (no fire before this is expected)."""
    epoch_a: int
    """The region epoch under which region A runs (after the set-up's failover to it)."""
    extra_nodes: list[NodeProcess]
    """Nodes started later (stopped with the rest)."""

    @property
    def primary_url(self) -> str:
        return self.pair.primary.database_url(DATABASE)

    @property
    def standby_url(self) -> str:
        return self.pair.standby.database_url(DATABASE)

    def all_nodes(self) -> list[NodeProcess]:
        return [*self.region_a.nodes, *self.region_b.nodes]


def set_up(config: GameDayConfig, work: Path, stack: contextlib.ExitStack) -> Stage:
    pair = stack.enter_context(ReplicatedPair())
    pair.create_database(DATABASE)
    primary = pair.primary.database_url(DATABASE)
    carillon("migrate", "--database-url", primary, "--partitions", str(config.partitions))
    pair.primary.query(audit.INSTALL_SQL, database=DATABASE)
    token_file = work / "admin-token"
    carillon("token", "create", "--admin", "--database-url", primary, "--save", str(token_file))
    epoch_a = region_failover(REGION_A, primary).epoch
    pair.wait_caught_up()
    sink = SinkProcess(work)
    stack.callback(sink.stop)
    regions = []
    for name, url, count in (
        (REGION_A, primary, config.region_a_nodes),
        (REGION_B, pair.standby.database_url(DATABASE), config.region_b_nodes),
    ):
        settings = RegionNodeSettings(
            url, config.lease_ttl_s, config.lease_safety_margin_s, config.attempt_lease_s,
            region=name,
        )  # fmt: skip
        region = Region(name, settings, count, work)
        stack.callback(stop_all, region.nodes)
        region.start()
        regions.append(region)
    region_a, region_b = regions
    region_a.wait_ready()
    region_b.wait_standing_by()
    api = Api(str(region_a.nodes[0].api_url), token_file)
    stack.callback(api.close)
    workload = config.workload()
    api.put_webhook_task_type(sink.url, workload)
    specs = make_schedules(workload)
    created = time.time()
    api.create_schedules(specs, workload)
    extra: list[NodeProcess] = []
    stack.callback(stop_all, extra)
    return Stage(config, work, pair, sink, region_a, region_b, specs, created, epoch_a, extra)
