"""Admission into the execution pipeline: how much to claim, and who releases what.

Responsibility: the two decisions of the execution pipeline that must never go wrong, kept
free of trio, clocks and the ledger so they can be tested exhaustively.

* :class:`HandoffSizer` -- how many claimed attempts the pipeline holds at most (one per
  worker plus a hand-off of claimed ones waiting for a worker, about ``handoff_wait_s`` of
  work judged by a moving average of handler durations).
* :func:`claim_size` -- how many executions to pop for the next claim *now*, against the
  capacity of that moment; :func:`claim_threshold` says at every release whether a claim's
  worth is free, and is worked out again whenever the capacity changes, so no threshold
  computed earlier can keep the pipeline waiting (the stall this replaced: a threshold
  computed once, above what a later, smaller capacity could ever free).
* :class:`AttemptTicket` -- owns every per-attempt resource (concurrency slots, the overlap
  slot, the in-flight count, the pipeline slot) and releases each exactly once, whatever
  happens: stages release what they are done with, and whoever holds the ticket last
  closes it in a ``finally``, releasing whatever is left.

Invariants (property-tested in ``tests/core/test_admission.py``):

* **Liveness.** With nothing in flight, :func:`claim_size` admits at least one execution
  whenever the capacity is at least one; the capacity is never below ``workers``.
* **Bounded.** What is in flight never exceeds the capacity of the moment it was admitted.
* **Conservation.** Every resource a ticket holds is released exactly once, in any order
  of stage releases and ``close`` calls, and also when a release function raises.
* **Durations are clamped** to the handler's timeout: a frozen process or a suspended
  thread adds at most one timeout's worth to the average, never an unbounded one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final, Generic, Self, TypeVar

T = TypeVar("T")

DURATION_SMOOTHING: Final = 0.05
"""Weight of the newest handler duration in the moving average."""
DURATION_S_INITIAL: Final = 1.0
"""The assumed handler duration before any has finished: a cautious start (a hand-off of one
execution per worker) that grows as fast handlers finish."""
CLAIM_ROUND_TRIP_SHARE: Final = 4
"""A claim waits until a quarter of the capacity is free (or a whole batch): a batch worth a
database round trip, not one claim per finished execution."""


class HandoffSizer:
    """The pipeline's capacity from how fast handlers finish (see the module docstring).

    ``workers``, ``handoff_max`` and ``handoff_wait_s`` are fixed when it is made: the capacity
    is worked out again only when a duration is observed."""

    __slots__ = ("_capacity", "_duration_s", "handoff_max", "handoff_wait_s", "workers")

    def __init__(self, workers: int, handoff_max: int, handoff_wait_s: float) -> None:
        if workers < 1 or handoff_max < 0 or handoff_wait_s < 0:
            raise ValueError("workers >= 1, handoff_max >= 0 and handoff_wait_s >= 0")
        self.workers = workers
        self.handoff_max = max(handoff_max, workers)
        self.handoff_wait_s = handoff_wait_s
        self._duration_s = DURATION_S_INITIAL
        self._capacity = capacity_for(workers, self.handoff_max, handoff_wait_s, DURATION_S_INITIAL)

    @property
    def duration_s(self) -> float:
        """The moving average of handler durations."""
        return self._duration_s

    @property
    def capacity(self) -> int:
        """Claimed attempts held at most now: one running per worker, and as many waiting as
        the workers are expected to start within ``handoff_wait_s`` (at least one each, at
        most ``handoff_max``); :func:`capacity_for` the moving average."""
        return self._capacity

    @property
    def capacity_max(self) -> int:
        """The most :attr:`capacity` can ever be (a channel sized so never blocks)."""
        return self.workers + self.handoff_max

    def observe(self, duration_s: float, timeout_s: float) -> int:
        """A handler ran ``duration_s`` (from its start, not from its hand-off); clamped to
        ``[0, timeout_s]``, so a frozen process cannot poison the average. Returns the
        capacity now.

        Called once per execution, so it is written out without a call beyond itself (no
        ``min``/``max``, no property): :func:`capacity_for` in line, which a property test
        holds it to."""
        if timeout_s < 0.0:
            timeout_s = 0.0
        clamped = duration_s if duration_s < timeout_s else timeout_s
        if clamped < 0.0:
            clamped = 0.0
        average = self._duration_s = self._duration_s + DURATION_SMOOTHING * (
            clamped - self._duration_s
        )
        workers = self.workers
        expected = workers * self.handoff_wait_s / (average if average > 1e-6 else 1e-6)
        if expected < workers:
            expected = workers
        handoff_max = self.handoff_max
        capacity = self._capacity = workers + int(
            expected if expected < handoff_max else handoff_max
        )
        return capacity


def capacity_for(workers: int, handoff_max: int, handoff_wait_s: float, duration_s: float) -> int:
    """The capacity of a pipeline whose handlers take ``duration_s`` on average: ``workers``
    running, and a hand-off of what they are expected to start within ``handoff_wait_s``
    (at least one each, at most ``handoff_max``)."""
    expected = workers * handoff_wait_s / max(duration_s, 1e-6)
    return workers + int(min(max(expected, workers), handoff_max))


def claim_size(*, capacity: int, in_flight: int, batch_max: int) -> int:
    """How many executions to pop for a claim now (0: wait for a release).

    ``in_flight`` counts every admitted attempt not yet done running: being claimed, waiting
    for a worker, or running. A claim goes out once a round trip's worth is free (a quarter
    of the capacity, or ``batch_max``), and at once whenever nothing is in flight at all.
    """
    free = capacity - in_flight
    if free <= 0 or batch_max <= 0:
        return 0
    if in_flight <= claim_threshold(capacity, batch_max) or in_flight == 0:
        return min(free, batch_max)
    return 0


def claim_threshold(capacity: int, batch_max: int) -> int:
    """The most attempts in flight at which a claim goes out (a round trip's worth free):
    ``claim_size(...) > 0`` exactly when ``in_flight`` is at most this, or nothing is in
    flight at all (and ``capacity`` and ``batch_max`` are positive). A slot given back
    compares with it instead of sizing a claim: the capacity only changes when a duration is
    observed, and the threshold is worked out again then."""
    return capacity - min(batch_max, max(1, capacity // CLAIM_ROUND_TRIP_SHARE))


class TicketReleaseError(RuntimeError):
    """A release function raised; every other resource was still released."""


class AttemptTicket(Generic[T]):
    """The per-attempt resources of one ``item``; each released exactly once.

    A stage that takes a resource names it (:meth:`hold`) with the function that gives it
    back, called with the ticket; :meth:`release` gives one back early, :meth:`close` gives
    back all that are left. Both are idempotent per resource. A release function that raises
    does not stop the others: :meth:`close` releases everything, then raises
    :class:`TicketReleaseError`.

    The release functions are meant to be long-lived (made once per stage, not per ticket):
    holding a resource then allocates nothing, which matters at tens of thousands of tickets
    a second (every allocation there is work for the garbage collector).
    """

    __slots__ = ("_held", "item")

    def __init__(self, item: T, held: Mapping[str, Callable[[Self], object]] | None = None) -> None:
        """A ticket for ``item``, holding at once what ``held`` names (as :meth:`hold` would,
        in its order): a stage that takes several resources for every ticket it makes
        builds that mapping once."""
        self.item = item
        self._held: dict[str, Callable[[Any], object]] = {} if held is None else dict(held)

    def hold(self, resource: str, release: Callable[[Self], object]) -> None:
        """Record that ``resource`` is held; ``release(ticket)`` gives it back."""
        if resource in self._held:
            raise ValueError(f"resource {resource!r} is held already")
        self._held[resource] = release

    @staticmethod
    def hold_each(
        tickets: Iterable[AttemptTicket[Any]], resource: str, release: Callable[[Any], object]
    ) -> None:
        """:meth:`hold` ``resource`` on every ticket of a batch, in one call."""
        for ticket in tickets:
            held = ticket._held
            if resource in held:
                raise ValueError(f"resource {resource!r} is held already")
            held[resource] = release

    def holds(self, resource: str) -> bool:
        return resource in self._held

    @property
    def held(self) -> tuple[str, ...]:
        """The resources still held, in the order taken."""
        return tuple(self._held)

    @property
    def closed(self) -> bool:
        return not self._held

    def release(self, resource: str) -> bool:
        """Give ``resource`` back now; ``False`` if it was not held (released already)."""
        release = self._held.pop(resource, None)
        if release is None:
            return False
        release(self)
        return True

    def close(self) -> None:
        """Give back every resource still held, the last taken first."""
        failed: list[BaseException] | None = None  # a list only when one fails
        held = self._held
        while held:
            _, release = held.popitem()  # the last taken (dicts keep their order)
            try:
                release(self)
            except Exception as error:  # the others must still be released
                if failed is None:
                    failed = []
                failed.append(error)
        if failed:
            raise TicketReleaseError(
                f"{len(failed)} release(s) of an attempt's resources failed: {failed[0]!r}"
            ) from failed[0]
