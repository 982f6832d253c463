"""The simulated handler and the two receivers it delivers to.

Every schedule's task type runs :func:`deliver` (a ``python`` handler). Its fate on each
attempt -- succeed, fail before the effect (transient or permanent), apply the effect and
then fail (the reply was lost), or hang past the attempt lease -- is drawn from the seed,
the execution id and the attempt number, so it does not depend on scheduling order.

The effect goes to two receivers at once, as in a Jepsen test:

* the **naive sink** counts every request (at-least-once *deliveries*);
* the **idempotent sink** applies the effect once per ``Idempotency-Key`` (the execution
  id) and ignores repeats, so it holds the effectively-once result (*effects*).

A handler runs on the node's behalf: while its process is paused it does nothing, and its
effect leaves only after the process resumes; a crashed process's handler never delivers.
The node a handler runs on is found through :data:`CURRENT` (a context variable each
simulated node's task tree inherits).
"""

from __future__ import annotations

import contextvars
import random
from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

import trio

from engine.errors import PermanentError, TransientError
from engine.handlers import ExecutionContext
from simulations.clocks import DatabaseClock
from simulations.scenario import HandlerFaults
from simulations.trace import Trace


class Process(Protocol):
    """The simulated process a handler runs in."""

    node_id: str
    label: str

    async def wait_running(self) -> None:
        """Return once the process runs (not paused); cancelled if it died."""
        ...


@dataclass
class Delivery:
    """One handler invocation (one attempt that actually started)."""

    execution_id: str
    schedule_id: str
    planned_at: datetime
    attempt: int
    fencing_token: int
    node: str
    started_at: datetime
    """By the database clock (true time)."""
    fate: str
    effect_sent: bool = False
    finished_at: datetime | None = None


class Sinks:
    """Both receivers, and every delivery for the checkers."""

    def __init__(self, trace: Trace) -> None:
        self._trace = trace
        self.deliveries: list[Delivery] = []
        self.naive: Counter[str] = Counter()
        """Effect requests per idempotency key, repeats included."""
        self.applied: dict[str, Delivery] = {}
        """The delivery whose effect the idempotent sink applied, per idempotency key."""
        self.keys_of_fire: dict[tuple[str, datetime], set[str]] = {}
        """Idempotency keys applied per logical fire (schedule, planned instant)."""
        self.stale_tokens = 0
        """Requests a fencing-aware receiver would refuse: a lower token than it has seen
        for that schedule."""
        self._max_token: dict[str, int] = {}

    def started(self, delivery: Delivery) -> None:
        self.deliveries.append(delivery)
        self._trace.emit(
            "deliver", delivery.node, delivery.execution_id, delivery.attempt, delivery.fate
        )

    def effect(self, delivery: Delivery, key: str) -> None:
        delivery.effect_sent = True
        self.naive[key] += 1
        seen = self._max_token.get(delivery.schedule_id, 0)
        if delivery.fencing_token < seen:
            self.stale_tokens += 1
        self._max_token[delivery.schedule_id] = max(seen, delivery.fencing_token)
        first = key not in self.applied
        if first:
            self.applied[key] = delivery
            fire = (delivery.schedule_id, delivery.planned_at)
            self.keys_of_fire.setdefault(fire, set()).add(key)
        self._trace.emit("effect", delivery.node, key, "applied" if first else "repeat")


class Fates:
    """What each attempt's handler does, from the seed."""

    def __init__(self, seed: int, faults: HandlerFaults, attempt_lease_s: float) -> None:
        self._seed = seed
        self._faults = faults
        self._lease_s = attempt_lease_s

    def of(self, execution_id: str, attempt: int) -> tuple[str, float]:
        """``(fate, seconds of work)``; the work is the schedule's own unless it hangs."""
        rng = random.Random(f"carillon-sim:{self._seed}:fate:{execution_id}:{attempt}")
        f = self._faults
        roll = rng.random()
        for fate, p in (
            ("transient", f.transient_p),
            ("lost-reply", f.lost_reply_p),
            ("permanent", f.permanent_p),
            ("hang", f.hang_p),
        ):
            if roll < p:
                hang_s = self._lease_s * rng.uniform(1.5, 3.0) if fate == "hang" else 0.0
                return fate, hang_s
            roll -= p
        return "ok", 0.0


@dataclass
class HandlerEnv:
    """What a node's handlers reach: their process, the receivers, the fates."""

    process: Process
    sinks: Sinks
    fates: Fates
    clock: DatabaseClock

    def database_now(self) -> datetime:
        return self.clock.now()


CURRENT: contextvars.ContextVar[HandlerEnv] = contextvars.ContextVar("carillon_sim_node")


async def deliver(context: ExecutionContext) -> None:
    """The ``sim`` task type's handler."""
    env = CURRENT.get()
    await env.process.wait_running()
    fate, hang_s = env.fates.of(context.execution_id, context.attempt)
    delivery = Delivery(
        execution_id=context.execution_id,
        schedule_id=context.schedule_id,
        planned_at=context.planned_at,
        attempt=context.attempt,
        fencing_token=context.fencing_token,
        node=env.process.node_id,
        started_at=env.database_now(),
        fate=fate,
    )
    env.sinks.started(delivery)
    try:
        run_s = float(context.payload.get("run_s", 0.0))
        work_s = hang_s if fate == "hang" else run_s
        if work_s > 0:
            await trio.sleep(work_s)
        if fate == "transient":
            raise TransientError("injected transient failure")
        if fate == "permanent":
            raise PermanentError("injected permanent failure")
        await env.process.wait_running()  # a paused process sends its request on resume
        env.sinks.effect(delivery, context.execution_id)
        if fate == "lost-reply":
            raise TransientError("injected: the effect was applied but the reply was lost")
    finally:
        delivery.finished_at = env.database_now()
