"""The simulated handler and the two receivers it delivers to.

Every schedule's task type runs :func:`deliver` (a ``python`` handler). Its fate on each
attempt -- succeed, fail before the effect (transient or permanent), apply the effect and
then fail (the reply was lost), or hang past the attempt lease -- is drawn from the seed,
the execution id and the attempt number, so it does not depend on scheduling order. So is
its latency under a handler-latency fault (:class:`~simulations.scenario.HandlerLatency`,
:class:`~simulations.scenario.SlowHandler`): the handler sleeps its work plus that latency
before it acts, and an attempt whose time reaches its task type's timeout is a ``timeout``
(the worker cuts it off before its effect). :meth:`Fates.plan` is the one place that
decides, for the handler and for the start-delay bound alike.

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
import math
import random
from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

import trio

from engine.errors import PermanentError, TransientError
from engine.handlers import ExecutionContext
from simulations.clocks import DatabaseClock
from simulations.scenario import HandlerFaults, HandlerLatency, SlowHandler
from simulations.trace import Trace
from simulations.workload import TASK_TYPE


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
    task_type: str = TASK_TYPE


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


@dataclass(frozen=True)
class Planned:
    """What one attempt's handler does: its fate, how long it sleeps before acting, and how
    long it holds its worker (cut at the task type's timeout)."""

    fate: str
    sleep_s: float
    worker_s: float


class Fates:
    """What each attempt's handler does, from the seed."""

    def __init__(
        self,
        seed: int,
        faults: HandlerFaults,
        attempt_lease_s: float,
        *,
        latency: tuple[HandlerLatency, ...] = (),
        slow: tuple[SlowHandler, ...] = (),
        timeouts: dict[str, float] | None = None,
        start: datetime | None = None,
    ) -> None:
        self._seed = seed
        self._faults = faults
        self._lease_s = attempt_lease_s
        self._latency = {profile.task_type: profile for profile in latency}
        self._slow: dict[str, list[SlowHandler]] = {}
        for stretch in slow:
            self._slow.setdefault(stretch.task_type, []).append(stretch)
        self._timeouts = timeouts or {}
        self._start = start

    def latency_s(self, execution_id: str, attempt: int, task_type: str, planned_s: float) -> float:
        """The receiver's latency for this attempt (0 without a latency fault). Six draws
        always, in the same order, whichever apply: fast, tail or timeout (which, and how
        long), and a slow stretch's value and whether it hits this attempt."""
        profile = self._latency.get(task_type)
        if profile is None:
            return 0.0
        rng = random.Random(f"carillon-sim:{self._seed}:latency:{execution_id}:{attempt}")
        fast, roll, tail, overrun, slow, hit = (rng.random() for _ in range(6))
        latency = profile.fast_s[0] + fast * (profile.fast_s[1] - profile.fast_s[0])
        if roll < profile.timeout_p:
            latency = self._timeouts[task_type] * (1.05 + 0.95 * overrun)
        elif roll < profile.timeout_p + profile.tail_p:
            low, high = profile.tail_s
            latency = max(latency, low * (high / low) ** tail)
        for stretch in self._slow.get(task_type, ()):
            if stretch.covers(planned_s) and hit < stretch.share:
                latency = max(latency, stretch.low_s + slow * (stretch.high_s - stretch.low_s))
        return latency

    def plan(
        self,
        execution_id: str,
        attempt: int,
        task_type: str,
        planned_s: float,
        run_s: float,
    ) -> Planned:
        """The attempt's fate and times; ``planned_s`` is its fire's instant in seconds from
        the start of the run, ``run_s`` its schedule's own work. Its time reaching the task
        type's timeout makes it a ``timeout``, whatever else it was drawn to do."""
        fate, hang_s = self.of(execution_id, attempt)
        work_s = hang_s if fate == "hang" else run_s
        sleep_s = work_s + self.latency_s(execution_id, attempt, task_type, planned_s)
        timeout_s = self._timeouts.get(task_type, math.inf)
        if sleep_s >= timeout_s:
            return Planned("timeout", sleep_s, timeout_s)
        return Planned(fate, sleep_s, sleep_s)

    def planned_s(self, planned_at: datetime) -> float:
        """``planned_at`` in seconds from the start of the run."""
        return 0.0 if self._start is None else (planned_at - self._start).total_seconds()

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
    run_s = float(context.payload.get("run_s", 0.0))
    planned_s = env.fates.planned_s(context.planned_at)
    plan = env.fates.plan(
        context.execution_id, context.attempt, context.task_type, planned_s, run_s
    )
    fate = plan.fate
    delivery = Delivery(
        execution_id=context.execution_id,
        schedule_id=context.schedule_id,
        planned_at=context.planned_at,
        attempt=context.attempt,
        fencing_token=context.fencing_token,
        node=env.process.node_id,
        started_at=env.database_now(),
        fate=fate,
        task_type=context.task_type,
    )
    env.sinks.started(delivery)
    try:
        if plan.sleep_s > 0:
            await trio.sleep(plan.sleep_s)  # a timeout is cut off here by the worker
        if fate == "timeout":  # not cut off: the checker reports it (finished_at)
            raise TransientError("injected: ran past the timeout and was not cut off")
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
