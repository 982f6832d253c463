"""Each node's connection to the shared ledger, with the faults of the network in between.

A :class:`LedgerProxy` stands between one node process and the :class:`MemoryLedger`. A call
goes through these stages, as a call through the database bridge would:

1. a caller already cancelled sends nothing; a dead process sends nothing;
2. **sent**: from here the call is in flight and shielded -- like the bridge, which resumes
   trio only after asyncpg has finished -- so cancelling the caller waits for the reply;
3. a **paused** process's request leaves only when it resumes;
4. the request travels (baseline latency, plus the extra of a slow-ledger fault);
5. if the database (or this node's link) is in an **outage**, or the process's database is
   unreachable (the old primary after a region failover), the call fails with
   ``LedgerUnavailable`` and nothing is written;
6. the ledger **commits** (or refuses: ``LeaseLost`` and other errors pass through);
7. with a **commit-unknown** fault's probability, the reply is lost: ``LedgerUnavailable``
   although the write was applied; a **stuck renewals** fault times out
   ``executions_extend`` the same way, before it reaches the ledger;
8. the reply travels back, and waits for a paused process to resume.

What the ledger committed is reported to the :class:`~simulations.leases.LeaseMonitor`
(acquisitions, renewals, releases, claims, accepted and refused fenced writes), naming the
database it was sent to, and to the trace. A proxy talks to one
:class:`~simulations.replica.Database` for the life of its process.

It is not :class:`engine.testing.FaultyLedger`, which injects the faults a test names one at
a time: here the faults are drawn from the seeded scenario (latency from the run's random
generator, outages and slow periods from its timeline, replicas lost on failover) and every
commit feeds the lease monitor and the trace that the simulator's checks read.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any, Final, Protocol

import trio

from engine.errors import LeaseLost, LedgerUnavailable
from engine.ledger.params import Fence
from engine.model import Execution, Lease
from simulations.clocks import DatabaseClock
from simulations.leases import LeaseMonitor
from simulations.replica import Database
from simulations.scenario import CommitUnknown, Fault, Outage, SlowLedger, StuckRenewals
from simulations.trace import Trace

FENCED: Final[dict[str, Callable[[Any], list[Fence]]]] = {
    "executions_plan": lambda p: [p.fence],
    "executions_purge": lambda p: [p.fence],
    "executions_claim": lambda p: list(p.fences),
    "executions_extend": lambda p: list(p.fences),
    "executions_complete": lambda p: list(p.fences),
    "executions_finish": lambda p: list(p.fences),
    "executions_skip": lambda p: list(p.fences),
    "executions_requeue_expired": lambda p: list(p.fences),
}
"""Every fenced write, and how to read its fences from its parameters."""


class Network:
    """Which ledger faults are active, when and for whom (from the fault timeline)."""

    def __init__(self, faults: tuple[Fault, ...], clock: DatabaseClock, latency_s: float) -> None:
        self._clock = clock
        self.latency_s = latency_s
        self._outages = [f for f in faults if isinstance(f, Outage)]
        self._slow = [f for f in faults if isinstance(f, SlowLedger)]
        self._unknown = [f for f in faults if isinstance(f, CommitUnknown)]
        self._stuck = [f for f in faults if isinstance(f, StuckRenewals)]
        self.healed = False

    def _now_s(self) -> float | None:
        """Seconds since the start, or ``None`` once healed (no fault is active then)."""
        return None if self.healed else self._clock.elapsed_s()

    def unavailable(self, node: str) -> bool:
        """``node`` cannot reach the database now (``""``: an API client)."""
        t = self._now_s()
        return t is not None and any(
            f.at_s <= t < f.at_s + f.duration_s and (not f.nodes or node in f.nodes)
            for f in self._outages
        )

    def request_latency(self, node: str, rng: random.Random) -> float:
        """The time a request takes to reach the database: the baseline, and a slow
        ledger's extra."""
        return self.latency_s * (0.5 + rng.random()) + self._slow_extra(node, rng)

    def reply_latency(self, node: str, rng: random.Random) -> float:
        """The extra time a reply takes under a slow-ledger fault (the baseline is folded
        into the request: a healthy call costs one scheduling step, not two)."""
        return self._slow_extra(node, rng)

    def _slow_extra(self, node: str, rng: random.Random) -> float:
        t = self._now_s()
        if t is None or not self._slow:
            return 0.0
        extra = max(
            (
                f.latency_s
                for f in self._slow
                if f.at_s <= t < f.at_s + f.duration_s and (not f.nodes or node in f.nodes)
            ),
            default=0.0,
        )
        return extra * rng.random()

    def reply_lost(self, node: str, rng: random.Random) -> bool:
        t = self._now_s()
        if t is None or not self._unknown:
            return False
        p = max(
            (
                f.probability
                for f in self._unknown
                if f.at_s <= t < f.at_s + f.duration_s and (not f.nodes or node in f.nodes)
            ),
            default=0.0,
        )
        return p > 0 and rng.random() < p

    def renewals_stuck(self, node: str) -> bool:
        t = self._now_s()
        return t is not None and any(
            f.at_s <= t < f.at_s + f.duration_s and f.node == node for f in self._stuck
        )


class Process(Protocol):
    """The node process a proxy serves."""

    node_id: str
    label: str
    down: bool

    async def wait_running(self) -> None: ...


class LedgerProxy:
    """The ledger as one node process sees it (every method of the contract)."""

    def __init__(
        self,
        process: Process,
        database: Database,
        *,
        network: Network,
        monitor: LeaseMonitor,
        clock: DatabaseClock,
        trace: Trace,
        rng: random.Random,
        on_plan_sent: Callable[[Fence], None],
    ) -> None:
        self._process = process
        self._database = database
        self._network = network
        self._monitor = monitor
        self._clock = clock
        self._trace = trace
        self._rng = rng
        self._on_plan_sent = on_plan_sent

    def __getattr__(self, name: str) -> Callable[..., Awaitable[Any]]:
        target = getattr(self._database.ledger, name)

        async def call(*args: Any) -> Any:
            return await self._call(name, target, args)

        self.__dict__[name] = call  # built once per method
        return call

    async def _call(
        self, name: str, target: Callable[..., Awaitable[Any]], args: tuple[Any, ...]
    ) -> Any:
        process = self._process
        await trio.lowlevel.checkpoint_if_cancelled()
        if process.down:
            await trio.lowlevel.checkpoint()
            raise LedgerUnavailable("the process is gone")
        if name == "executions_plan":
            self._on_plan_sent(args[0].fence)
        node = process.node_id
        with trio.CancelScope(shield=True):
            await process.wait_running()
            await trio.sleep(self._network.request_latency(node, self._rng))
            if process.down:
                raise LedgerUnavailable("the process is gone")
            if self._network.unavailable(node) or not self._database.reachable:
                self._trace.emit("call", process.label, name, "unavailable")
                raise LedgerUnavailable("the database is unreachable")
            if name == "executions_extend" and self._network.renewals_stuck(node):
                self._trace.emit("call", process.label, name, "timeout")
                raise LedgerUnavailable("statement timeout (renewals stuck)")
            try:
                result = await target(*args)
            except LeaseLost:
                self._monitor.refused(self._database.name)
                self._trace.emit("call", process.label, name, "lease-lost")
                raise
            self._committed(name, args, result)
            if self._network.reply_lost(node, self._rng):
                self._trace.emit("call", process.label, name, "reply-lost")
                raise LedgerUnavailable("connection lost before the reply (commit unknown)")
            reply_s = self._network.reply_latency(node, self._rng)
            if reply_s > 0:
                await trio.sleep(reply_s)
            await process.wait_running()
        if process.down:
            raise LedgerUnavailable("the process is gone")
        return result

    def _committed(self, name: str, args: tuple[Any, ...], result: Any) -> None:
        now: datetime = self._clock.now()
        label = self._process.label
        monitor = self._monitor
        db = self._database.name
        if name == "leases_acquire":
            leases: list[Lease] = result
            for lease in leases:
                monitor.acquired(lease, now, db)
            self._trace.emit(
                "call", label, name, [(x.partition_id, x.fencing_token) for x in leases]
            )
        elif name == "leases_renew":
            monitor.renewed(result, db)
            monitor.write_accepted(label, name, [_fence(x) for x in result], now, db)
            self._trace.emit("call", label, name, len(result))
        elif name == "leases_release":
            monitor.released(list(args[0].fences), result, now, db)
            self._trace.emit("call", label, name, result)
        elif name in FENCED:
            monitor.write_accepted(label, name, FENCED[name](args[0]), now, db)
            if name == "executions_claim":
                claimed: list[Execution] = result
                monitor.claimed(claimed, now, db)
            self._trace.emit("call", label, name, _size(result))
        else:
            self._trace.emit("call", label, name, _size(result))


def _fence(lease: Lease) -> Fence:
    return Fence(lease.partition_id, lease.owner_id or "", lease.fencing_token)


def _size(result: Any) -> object:
    if isinstance(result, list | dict):
        return len(result)
    applied = getattr(result, "applied", None)
    if isinstance(applied, list):
        return len(applied)
    inserted = getattr(result, "inserted", None)
    if isinstance(inserted, list):
        return len(inserted)
    return type(result).__name__
