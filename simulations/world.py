"""One simulated cluster in one ``trio.run``: the shared ledger, the hosts, the timeline.

:class:`World.main` creates the workload, starts the nodes, plays the fault timeline through
the safety phase, heals everything (outages end, paused processes resume, crashed ones
restart, clocks are corrected), runs the liveness phase, and finally reads the ledger's
executions for the checkers. Each node is a real :class:`engine.node.Node` with its own
clock, ledger proxy and random stream; everything shares trio's ``MockClock``.

A run with a :class:`~simulations.scenario.RegionFailover` has two regions and, from the
replica's copy on, two databases (:mod:`simulations.replica`); see :meth:`World._fail_over`.
The heal does not bring back an old primary that never comes back: its region's processes
stay cut off to the end.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import cast

import trio

from engine.ledger.base import Ledger
from engine.ledger.memory import MemoryLedger
from engine.ledger.params import REGION_DEFAULT, ExecutionsQuery, Fence
from engine.ledger.params import RegionFailover as FailoverParams
from engine.model import Execution
from engine.node import Node
from simulations.bound import failover_startup_s
from simulations.check_failover import FailoverLog
from simulations.clocks import DatabaseClock, HostClock
from simulations.driver import ApiClient
from simulations.effects import CURRENT, Fates, HandlerEnv, Sinks
from simulations.host import Host, Process
from simulations.leases import PRIMARY, LeaseMonitor
from simulations.params import SimParams, host_clock, stream
from simulations.proxy import LedgerProxy, Network
from simulations.replica import Database, replica_of
from simulations.scenario import (
    Crash,
    Fault,
    Join,
    Jump,
    Leave,
    Pause,
    RegionFailover,
    ScheduleChange,
    Skew,
    describe,
    disruption,
    failover_of,
)
from simulations.trace import Trace


class World:
    def __init__(self, params: SimParams, trace: Trace) -> None:
        self.params = params
        self.trace = trace
        self.monitor = LeaseMonitor(params.partitions)
        self.sinks = Sinks(trace)
        self.fates = Fates(
            params.seed,
            params.handler,
            params.settings.attempt_lease_s,
            latency=params.latency,
            slow=params.slow_handlers,
            timeouts=params.timeouts,
            start=params.start,
        )
        self.hosts: dict[str, Host] = {}
        self.violations: list[str] = []
        self.nodes_built: list[Node] = []
        """Every node process's :class:`Node`, restarts included."""
        self.faults_injected: Counter[str] = Counter()
        self.executions: list[Execution] = []
        self.healed = False
        self.disruptions: list[tuple[float, float]] = []
        """When (true seconds from the start) the applied faults disturbed the cluster, and
        when a node's clock was further off than the skew bound (its planning paused)."""
        self.clock_beyond_s = 0.0
        """Node-seconds during which a clock was further off than the skew bound."""
        self._clock_error: dict[str, float] = {}
        self._beyond_since: dict[str, float] = {}
        self._crashed: set[str] = set()
        changes = [f for f in params.faults if isinstance(f, ScheduleChange)]
        self._changes, self._pending_changes = trio.open_memory_channel[ScheduleChange](
            len(changes) + 1
        )
        self._builds: Counter[str] = Counter()
        self.ended_at = params.start
        """True time when the run ended (set at the end of :meth:`main`)."""
        self.failover = failover_of(params.faults)
        self.failover_log = FailoverLog()
        self.region_of: dict[str, str] = {}
        """Each node's region, fixed at its first start."""
        self.databases: dict[str, Database] = {}
        """The old primary ``a`` and, once failed over, the new one ``b``."""

    async def main(self) -> None:
        p = self.params
        self.clock = DatabaseClock(p.start)
        active = REGION_DEFAULT if self.failover is None else "a"
        self.ledger = MemoryLedger(
            clock=self.clock, partition_count=p.partitions, active_region=active
        )
        self.databases[PRIMARY] = Database(PRIMARY, self.ledger)
        self.network = Network(p.faults, self.clock, p.ledger_latency_s)
        self.api = ApiClient(self.ledger, self.clock, self.network, self.trace)
        await self.api.setup(p.task, list(p.schedules), hook_timeout_s=p.hook_timeout_s)
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            for node_id in p.nodes:
                if self._startable(node_id):
                    await self._start(node_id)
            nursery.start_soon(self._timeline)
            nursery.start_soon(self._apply_changes)
            if self.failover is not None:
                nursery.start_soon(self._fail_over, self.failover)
            await self._sleep_until(p.safety_s)
            self._heal()
            await self._sleep_until(p.end_s)
            self.ended_at = self.clock.now()
            self.executions = await self._all_executions()
            log = self.failover_log
            if log.back:
                log.refused_after_back = self.monitor.refused_by_database[PRIMARY] - log.refused
            self.monitor.finish(trio.current_time())
            for host in self.hosts.values():
                host.kill()
            nursery.cancel_scope.cancel()

    async def _apply_changes(self) -> None:
        """The API client's changes, in timeline order (one may wait out an outage)."""
        async for change in self._pending_changes:
            await self.api.apply(change)

    async def _sleep_until(self, at_s: float) -> None:
        await trio.sleep(max(at_s - self.clock.elapsed_s(), 0.0))

    async def _all_executions(self, ledger: MemoryLedger | None = None) -> list[Execution]:
        """Every execution of ``ledger`` (by default the current primary's)."""
        ledger = self.ledger if ledger is None else ledger
        found: list[Execution] = []
        cursor = None
        while True:
            page = await ledger.executions_query(ExecutionsQuery(cursor=cursor, limit=1000))
            found += page.items
            if page.next_cursor is None:
                return found
            cursor = page.next_cursor

    # -- nodes -----------------------------------------------------------------------------

    def _host(self, node_id: str) -> Host:
        host = self.hosts.get(node_id)
        if host is None:
            drawn = host_clock(self.params.seed, node_id)
            clock = HostClock(self.clock, skew_s=drawn.skew_s, drift_ppm=drawn.drift_ppm)
            host = self.hosts[node_id] = Host(node_id, clock, self.trace, self.monitor)
            self._nursery.start_soon(self._ntp, host, drawn.ntp_interval_s)
        return host

    async def _ntp(self, host: Host, interval_s: float) -> None:
        while True:
            await trio.sleep(interval_s)
            host.clock.ntp_sync()

    def _region(self, node_id: str) -> str:
        """A node's region: region B's are named by the failover, a node that first joins
        after the failover is region B's too, every other one region A's."""
        if self.failover is None:
            return REGION_DEFAULT
        if node_id not in self.region_of:
            later = self.failover_log.happened
            standby = node_id in self.failover.standby
            self.region_of[node_id] = "b" if standby or later else "a"
        return self.region_of[node_id]

    def _startable(self, node_id: str) -> bool:
        """Region B's nodes start at the failover: before it they would stand by against a
        read-only replica, and do nothing the simulator could observe."""
        standby = self.failover is not None and node_id in self.failover.standby
        return not standby or self.failover_log.happened

    async def _start(self, node_id: str) -> None:
        host = self._host(node_id)
        if host.up:
            return
        self._crashed.discard(node_id)
        region = self._region(node_id)
        process = host.new_process(PRIMARY if region in ("a", REGION_DEFAULT) else "b")
        await self._nursery.start(host.run, process, self._build, self._context)

    def _build(self, process: Process) -> tuple[Node, Ledger]:
        self._builds[process.label] += 1
        name = f"{process.label}.{self._builds[process.label]}"
        proxy = LedgerProxy(
            process,
            self.databases[process.database],
            network=self.network,
            monitor=self.monitor,
            clock=self.clock,
            trace=self.trace,
            rng=stream(self.params.seed, f"proxy:{name}"),
            on_plan_sent=lambda fence: self._plan_sent(process, fence),
        )
        ledger = cast(Ledger, proxy)
        config = self.params.settings.config(process.node_id, self._region(process.node_id))
        host = self.hosts[process.node_id]
        node = Node(
            config, ledger, host.clock, stream(self.params.seed, f"node:{name}"), tracing=None
        )
        self.nodes_built.append(node)
        return node, ledger

    def _context(self, process: Process) -> None:
        CURRENT.set(HandlerEnv(process, self.sinks, self.fates, self.clock))

    def _plan_sent(self, process: Process, fence: Fence) -> None:
        """A planner is writing: it must hold the fence inside its trust window."""
        node = process.node
        owned = None if node is None else node.table.get(fence.partition_id)
        now = trio.current_time()
        if owned is None or owned.fence != fence or now > owned.trusted_until:
            until = "-" if owned is None else f"{owned.trusted_until:.3f}"
            self.violations.append(
                f"planner of {process.label} wrote partition {fence.partition_id} (token "
                f"{fence.fencing_token}) at t={now:.3f} outside its trust window (until {until})"
            )

    # -- the timeline ------------------------------------------------------------------------

    async def _timeline(self) -> None:
        for fault in self.params.faults:
            if isinstance(fault, RegionFailover):
                continue  # played by _fail_over, from the replica's copy on
            await self._sleep_until(fault.at_s)
            if self.healed:
                return
            self._apply(fault)

    def _apply(self, fault: Fault) -> None:
        node = getattr(fault, "node", "")
        host = self.hosts.get(node)
        process = None if host is None or not host.up else host.process
        node_fault = isinstance(fault, Crash | Pause | Skew | Jump | Leave)
        standby = isinstance(fault, Join) and not self._startable(node)
        if (node_fault and process is None) or standby:
            self.trace.emit("fault-ignored", describe(fault))  # its node is not running
            return
        self.faults_injected[type(fault).__name__] += 1
        self.trace.emit("fault", describe(fault))
        window = disruption(fault, self.params.safety_s)
        if window is not None and isinstance(fault, RegionFailover):
            window = (window[0], window[1] + failover_startup_s(self.params))
        if window is not None and not isinstance(fault, Skew | Jump):
            # A wrong wall clock disturbs nothing: the engine plans and dispatches on the
            # database-corrected clock, so the start-delay bound does not excuse it.
            self.disruptions.append(window)
        match fault:
            case Crash(node=node, down_s=down_s):
                assert host is not None
                host.kill()
                self._crashed.add(node)
                if down_s is not None:
                    self._nursery.start_soon(self._restart_later, node, down_s)
            case Pause(duration_s=duration_s):
                assert process is not None
                process.pause()
                self._nursery.start_soon(self._resume_later, process, duration_s)
            case (
                Skew(node=node, skew_s=step_s, duration_s=undo_s)
                | Jump(node=node, delta_s=step_s, settle_s=undo_s)
            ):
                self._step_clock(node, step_s)
                self._nursery.start_soon(self._step_clock_later, node, -step_s, undo_s)
            case Join(node=node):
                self._nursery.start_soon(self._start, node)
            case Leave():
                assert host is not None
                host.stop()
            case ScheduleChange():
                self._changes.send_nowait(fault)  # applied in order, one at a time
            case _:
                pass  # ledger faults act through the network, by their time windows

    async def _fail_over(self, fault: RegionFailover) -> None:
        """The forced failover, as the runbook has it. At the snapshot instant the replica's
        copy is taken (the API client makes no change from then until the failover). At the
        failover region A's database becomes unreachable for every process of region A, the
        copy becomes the new primary and is failed over to region B (epoch + 1, every lease
        revoked), the API client moves to it, and region B's nodes start. If the old primary
        comes back, it is first fenced (the same failover, at the new epoch), unless the
        scenario is the unfenced hazard; then region A's processes reach it again."""
        await self._sleep_until(fault.snapshot_s)
        if self.healed:
            return
        log, old = self.failover_log, self.databases[PRIMARY]
        async with self.api.writes_held():
            replica = replica_of(old.ledger)
            self.monitor.copy_database(PRIMARY, "b")
            self.trace.emit("replica", f"copy of database a at +{fault.snapshot_s:.3f}s")
            log.snapshot = {e.execution_id: e for e in await self._all_executions(replica)}
            await self._sleep_until(fault.at_s)
            old.reachable = False
            change = await replica.region_failover(
                FailoverParams("b", actor="sim", reason=f"region a lost, lag {fault.lag_s}s")
            )
            self.monitor.revoked_all("b")
            log.epoch, log.revoked = change.settings.region_epoch, change.revoked
            log.happened = True
            self.databases["b"] = Database("b", replica)
            self.ledger = replica
            self.api.use(replica)
            self._apply(fault)
            self.trace.emit("failover", f"epoch {log.epoch}", f"revoked {log.revoked}")
        for node_id in fault.standby:
            await self._start(node_id)
        if fault.old_back_s is None:
            return
        await self._sleep_until(fault.old_back_s)
        if fault.fenced:
            fence = await old.ledger.region_failover(
                FailoverParams("b", actor="sim", reason="fence", epoch_at_least=log.epoch)
            )
            self.monitor.revoked_all(PRIMARY)
            self.monitor.fenced.add(PRIMARY)
            self.trace.emit("fence", f"epoch {fence.settings.region_epoch}", fence.revoked)
        else:
            self.monitor.unfenced_return = PRIMARY
            self.trace.emit("unfenced-return")
        log.refused = self.monitor.refused_by_database[PRIMARY]
        log.back = True
        old.reachable = True

    async def _restart_later(self, node_id: str, delay_s: float) -> None:
        await trio.sleep(delay_s)
        if not self.healed and node_id in self._crashed:
            await self._start(node_id)

    def _step_clock(self, node_id: str, step_s: float) -> None:
        """Step a host's clock; count the node-seconds its error is beyond the skew bound
        (reported, not excused: see :class:`~simulations.bound.DelayBound`)."""
        self.hosts[node_id].clock.jump(step_s)
        now = self.clock.elapsed_s()
        error = self._clock_error.get(node_id, 0.0) + step_s
        self._clock_error[node_id] = error
        beyond = abs(error) > self.params.settings.clock_skew_bound_s
        since = self._beyond_since.pop(node_id, None)
        if since is not None:
            self.clock_beyond_s += now - since
        if beyond:
            self._beyond_since[node_id] = now
        self.trace.emit("clock", node_id, f"{error:+.3f}")

    async def _step_clock_later(self, node_id: str, step_s: float, delay_s: float) -> None:
        await trio.sleep(delay_s)
        if not self.healed:
            self._step_clock(node_id, step_s)

    async def _resume_later(self, process: Process, delay_s: float) -> None:
        await trio.sleep(delay_s)
        if process.paused:
            process.resume()
            self.trace.emit("resume", process.label)

    def _heal(self) -> None:
        """The liveness phase begins: every fault ends and every crashed node is back."""
        self.healed = True
        self.network.healed = True
        self.trace.emit("heal")
        now = self.clock.elapsed_s()
        self.disruptions.append((now, now))  # clocks stepped, processes restarted
        for since in self._beyond_since.values():
            self.clock_beyond_s += now - since
        self._beyond_since.clear()
        for node_id, host in sorted(self.hosts.items()):
            host.clock.set_skew(0.0)
            host.clock.ntp_sync()
            if host.process is not None and host.process.paused:
                host.process.resume()
            if node_id in self._crashed:
                self._nursery.start_soon(self._start, node_id)


class ErrorLog(logging.Handler):
    """Collects the engine's error records (an actor crash is a finding), by process."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        env = CURRENT.get(None)
        where = "?" if env is None else env.process.label
        self.records.append(f"{where}: {record.name}: {record.getMessage()}"[:300])
