"""An attempt on its way through the execution pipeline, and the room it takes there.

:class:`Attempt` is the :class:`~engine.core.admission.AttemptTicket` of one popped
execution. It is created by the dispatcher when the fair queue hands it an execution, moves
on trio channels from stage to stage (dispatcher -> workers -> completion writer), and holds
these resources until each is given back exactly once:

===============  ==================================  ========================================
resource         taken                               given back
===============  ==================================  ========================================
``open``         created                             closed (the pipeline's teardown closes
                                                     every attempt still open)
``slot``         popped (counts toward the room)     its handler ended, or it never ran
``limits``       popped (the fair queue reserved     its handler ended, or it never ran
                 the tenant's and task type's slot)
``dispatching``  popped (kept out of fetches while   claimed or not claimed; a folded
                 still startable in the ledger)      attempt: closed (its completion
                                                     written or dropped, or never run)
``overlap``      admitted by the overlap policy      its handler ended, or it never ran
``in_flight``    sent to be claimed (a partition     its completion was written or dropped,
                 hand-back waits for it)             or it was not claimed or abandoned
``folded``       folded (a hand-back waits for it    closed, as ``in_flight``
                 past its drain, to the end of the
                 partition's trust window)
===============  ==================================  ========================================

A *folded* attempt (docs/ledger.md, "Folded claims") is started without a claim: the ledger
keeps its execution startable until the completion writes claim and outcome in one step, so
it holds ``dispatching`` to the end, has no attempt lease to renew, and runs under the
number after its execution's (:attr:`Attempt.number`).

:class:`Room` is the admission state those slots count against: the dispatcher asks it how
many to pop (:func:`~engine.core.admission.claim_size`, against the capacity of the moment),
and each slot given back wakes the dispatcher once a claim's worth is free again.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Final

import trio

from engine.core.admission import AttemptTicket, HandoffSizer, claim_size, claim_threshold
from engine.ledger.params import Completion
from engine.model import Execution

if TYPE_CHECKING:
    from opentelemetry.trace import SpanContext

OPEN: Final = "open"
SLOT: Final = "slot"
LIMITS: Final = "limits"
DISPATCHING: Final = "dispatching"
OVERLAP: Final = "overlap"
IN_FLIGHT: Final = "in_flight"
FOLDED: Final = "folded"
RUN_RESOURCES: Final = (OVERLAP, LIMITS, SLOT)
"""Given back when the handler ends (or would have run and did not)."""


class Attempt(AttemptTicket[Execution]):
    """One popped execution and its resources (see the module docstring)."""

    __slots__ = (
        "abandoned",
        "claim_span",
        "claimed",
        "completion",
        "fold_bound_s",
        "folded",
        "lease_s",
        "partition_id",
        "renewed_at",
        "scope",
        "start_after",
        "started_at",
    )

    def __init__(
        self, execution: Execution, held: Mapping[str, Callable[[Attempt], object]] | None = None
    ) -> None:
        # AttemptTicket.__init__ written out: one call fewer per attempt.
        self.item = execution
        self._held = {} if held is None else dict(held)
        self.partition_id = execution.partition_id
        self.claimed = False
        """The ledger has it running under this node's attempt (set by the claim)."""
        self.folded = False
        """Started without a claim: its completion writes the claim too (set by the
        dispatcher instead of claiming it)."""
        self.fold_bound_s = 0.0
        """A folded attempt's handler runs at most this long (its task type's bound)."""
        self.start_after = 0.0
        """Monotonic time before which a folded attempt's handler must not start: its
        instant may not have come yet by the database's clock (see the dispatcher's
        ``_fold``)."""
        self.started_at: datetime | None = None
        """When its handler started, on the database-corrected clock (a folded attempt's
        completion records it)."""
        self.lease_s = 0.0
        self.renewed_at = 0.0
        """Monotonic time the claim or the last renewal of its attempt lease was sent."""
        self.scope: trio.CancelScope | None = None
        """The cancel scope of its handler while it runs."""
        self.abandoned = False
        """The attempt is no longer this node's (re-queued, partition lost): never start it,
        cancel it if it runs, write no completion."""
        self.completion: Completion | None = None
        self.claim_span: SpanContext | None = None
        """The span context of the claim that produced it, when tracing is on (its attempt
        span links to it; see ``engine/tracing.py``)."""

    @property
    def execution(self) -> Execution:
        return self.item

    def run_ended(self) -> None:
        """Its handler ended (or will never run): give back what only running needed."""
        held = self._held
        for resource in RUN_RESOURCES:  # as release() each, without a call per resource
            release = held.pop(resource, None)
            if release is not None:
                release(self)

    @property
    def number(self) -> int:
        """The number of this attempt: its execution's as claimed, or the next one when
        folded (the ledger still has the execution under its previous attempt)."""
        return self.item.attempt + 1 if self.folded else self.item.attempt

    @property
    def running_here(self) -> bool:
        """Claimed, and its run not over yet: its attempt lease is renewed."""
        return self.claimed and not self.abandoned and self.holds(SLOT)

    @property
    def held_here(self) -> bool:
        """Claimed or folded, and its run not over yet."""
        return (self.claimed or self.folded) and not self.abandoned and self.holds(SLOT)


class Room:
    """How much the pipeline may take on; shared by the dispatcher and the attempts."""

    def __init__(self, sizer: HandoffSizer, batch_max: int) -> None:
        self.sizer = sizer
        self.batch_max = batch_max
        self.in_flight = 0
        """Attempts popped and not done running (being admitted or claimed, waiting for a
        worker, running)."""
        self.open: set[Attempt] = set()
        """Every attempt not closed yet: what a teardown closes, what renewals look at."""
        self.on_room: Callable[[], None] = lambda: None
        """Called when a slot given back leaves a claim's worth free (the dispatcher's nudge)."""
        self._capacity = sizer.capacity
        self._threshold = claim_threshold(self._capacity, batch_max)
        """In flight at most this: a claim's worth is free (renewed with the capacity)."""
        # The attempts' release functions, bound once: holding a resource allocates nothing.
        self._leave_open = self.open.discard
        self._free_slot = self._slot_freed
        self._admitted: dict[str, Callable[[Attempt], object]] = {
            OPEN: self._leave_open,
            SLOT: self._free_slot,
        }
        """What every admitted attempt holds first, in this order."""

    def claim_size(self) -> int:
        return claim_size(
            capacity=self.sizer.capacity, in_flight=self.in_flight, batch_max=self.batch_max
        )

    def observe(self, duration_s: float, timeout_s: float) -> None:
        """A handler ran ``duration_s`` (see :meth:`HandoffSizer.observe`): the capacity
        may change, and with it the threshold each slot given back compares with."""
        capacity = self.sizer.observe(duration_s, timeout_s)
        if capacity != self._capacity:  # nearly always the same: a burst runs at one
            self._capacity = capacity
            self._threshold = claim_threshold(capacity, self.batch_max)

    def admit(self, execution: Execution) -> Attempt:
        """A new attempt for ``execution``, holding a slot and its place among the open."""
        return self.admit_each([execution])[0]

    def admit_each(
        self,
        executions: list[Execution],
        also: Mapping[str, Callable[[Attempt], object]] | None = None,
    ) -> list[Attempt]:
        """:meth:`admit` each of ``executions`` (a popped batch), every attempt also holding
        what ``also`` names, in its order, as if each had called :meth:`Attempt.hold` for
        them. The mapping of what each holds is built once per batch, not per attempt: at
        tens of thousands of attempts a second, each call saved is worth it."""
        held = self._admitted
        if also:
            if also.keys() & held.keys():
                raise ValueError(f"resources {sorted(also.keys() & held.keys())} are held already")
            held = {**held, **also}
        attempts = [Attempt(execution, held) for execution in executions]
        self.open.update(attempts)
        self.in_flight += len(attempts)
        return attempts

    def _slot_freed(self, _: Attempt) -> None:
        in_flight = self.in_flight = self.in_flight - 1
        if in_flight <= self._threshold or in_flight == 0:  # claim_size() > 0, cheaply
            self.on_room()

    def close_all(self) -> None:
        """Close every open attempt (the pipeline is being torn down)."""
        for attempt in list(self.open):
            attempt.close()
