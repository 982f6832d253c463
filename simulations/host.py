"""A simulated machine and the node processes it runs, one after another.

A :class:`Host` keeps what survives a process restart: its node id and its wall clock. Each
start creates a :class:`Process` (``n2#3``: the third process of ``n2``) running a brand-new
:class:`engine.node.Node` with its own ledger proxy and random stream, as a restarted
process would. A process can be *paused* (its ledger calls and effects wait, shielded, until
it resumes: a frozen process cannot be cancelled), *killed* (no graceful shutdown: its
calls fail from then on, then its tasks are cancelled) or *stopped* (SIGTERM: cancelled,
so the node shuts down gracefully and releases its leases).

Like a service manager, a host whose node refuses to start (its id is still held by the
previous process's membership row, ``ConfigError``) or whose node dies of an exception
starts a new one after :data:`RESTART_DELAY_S`; a death is also reported to the run.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

import trio

from engine.actors.partitions import OwnedPartition, PartitionTable
from engine.errors import ConfigError
from engine.ledger.base import Ledger
from engine.ledger.params import Fence
from engine.node import Node
from simulations.clocks import HostClock
from simulations.leases import PRIMARY, LeaseMonitor
from simulations.trace import Trace

RESTART_DELAY_S: Final = 5.0


class Process:
    """One process of a host: the unit that pauses, dies or stops."""

    def __init__(self, node_id: str, incarnation: int, database: str = PRIMARY) -> None:
        self.node_id = node_id
        self.label = f"{node_id}#{incarnation}"
        self.database = database
        """The database this process talks to (its region's)."""
        self.down = False
        self.node: Node | None = None
        self.scope = trio.CancelScope()
        self._resumed: trio.Event | None = None

    @property
    def paused(self) -> bool:
        return self._resumed is not None

    async def wait_running(self) -> None:
        """Wait while paused (shielded: a frozen process cannot be cancelled); then, if it
        died meanwhile, let the cancellation of its tasks through."""
        with trio.CancelScope(shield=True):
            while self._resumed is not None and not self.down:
                await self._resumed.wait()
        if self.down:
            await trio.lowlevel.checkpoint()

    def pause(self) -> None:
        if self._resumed is None:
            self._resumed = trio.Event()

    def resume(self) -> None:
        resumed, self._resumed = self._resumed, None
        if resumed is not None:
            resumed.set()

    def kill(self) -> None:
        self.down = True
        self.resume()
        self.scope.cancel()


NodeFactory = Callable[[Process], tuple[Node, Ledger]]


class Host:
    """A machine: a node id, a clock, and the current process."""

    def __init__(self, node_id: str, clock: HostClock, trace: Trace, monitor: LeaseMonitor) -> None:
        self.node_id = node_id
        self.clock = clock
        self._trace = trace
        self._monitor = monitor
        self.incarnations = 0
        self.process: Process | None = None
        self.deaths: list[str] = []
        self.up_s = 0.0
        """True seconds its processes have run, all together."""

    @property
    def up(self) -> bool:
        return self.process is not None and not self.process.down

    def new_process(self, database: str = PRIMARY) -> Process:
        self.incarnations += 1
        self.process = Process(self.node_id, self.incarnations, database)
        return self.process

    async def run(
        self,
        process: Process,
        build: NodeFactory,
        context: Callable[[Process], None],
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Run ``process`` until it is killed or stopped, starting its node again after a
        refusal or a death. ``context`` sets the task-tree context (handlers find their
        process through it)."""
        context(process)
        task_status.started()
        started = trio.current_time()
        try:
            await self._run(process, build)
        finally:
            self.up_s += trio.current_time() - started
            process.down = True
            self._monitor.untrust_all(process.label, trio.current_time())

    async def _run(self, process: Process, build: NodeFactory) -> None:
        with process.scope:
            while True:
                node, _ = build(process)
                process.node = node
                self.watch(process, node.table)
                self._trace.emit("start", process.label)
                try:
                    await node.run()
                except ConfigError as exc:
                    self._trace.emit("refused", process.label, str(exc)[:60])
                except Exception as exc:  # a node died: report it, and start another
                    self.deaths.append(f"{process.label} died: {exc!r}")
                    self._trace.emit("died", process.label, type(exc).__name__)
                await trio.sleep(RESTART_DELAY_S)

    def watch(self, process: Process, table: PartitionTable) -> None:
        """Report the table's trust windows to the monitor, as they change."""
        monitor = self._monitor
        label = process.label
        database = process.database
        add, drop = table.add, table.drop

        def on_add(fence: Fence, trusted_until: float) -> None:
            add(fence, trusted_until)
            owned = table.get(fence.partition_id)
            assert owned is not None
            partition, token = fence.partition_id, fence.fencing_token
            monitor.trusted(label, partition, token, trio.current_time(), trusted_until, database)
            extend = owned.extend

            def on_extend(until: float) -> None:
                extend(until)
                monitor.trusted(label, partition, token, trio.current_time(), until, database)

            setattr(owned, "extend", on_extend)  # noqa: B010 - an instance-level hook

        def on_drop(partition_id: int) -> OwnedPartition | None:
            monitor.untrusted(label, partition_id, trio.current_time())
            return drop(partition_id)

        setattr(table, "add", on_add)  # noqa: B010
        setattr(table, "drop", on_drop)  # noqa: B010

    def kill(self) -> None:
        process = self.process
        if process is not None and not process.down:
            process.kill()
            self._monitor.untrust_all(process.label, trio.current_time())
            self._trace.emit("kill", process.label)

    def stop(self) -> None:
        """Graceful shutdown: the node releases its leases on the way out."""
        process = self.process
        if process is not None and not process.down:
            process.scope.cancel()
            self._trace.emit("stop", process.label)
