"""Each backlogged tenant's share of a bounded fair queue, and where its reads resume.

Responsibility: decide which startable executions a dispatcher reads into its bounded
:class:`~engine.core.fair_queue.FairQueue`, so that the queue holds every backlogged tenant's
work in proportion to its weight. The fair queue can only weigh what it holds: filled in the
ledger's order (by instant, then id, across tenants), a queue far smaller than the backlog
holds the tenants in proportion to their *backlogs* -- the heavy tenants' items run out
between reads while the light tenants' pile up to the bound -- and the starts follow the
backlogs, not the weights. Pure and synchronous; positions are ``(startable_at,
execution_id)`` tuples, the ledger's ``executions_due`` order.

Design
------
*Shares.* A tenant with work queued or left in the ledger gets ``max_items * w / W`` of the
queue's bound (``W``: the weights of all such tenants; at least :data:`SHARE_MIN`).

*Spilling.* The dispatcher's pass through the startable work of all tenants
(:meth:`QueueShares.sort`) queues a tenant's items up to its share; at the first item beyond
it, the tenant *spills*: the rest of its work stays in the ledger, and its reads of its own
resume just before that item. The pass leaves a spilled tenant's later items to those reads.
A pass page whose every tenant has spilled tells the dispatcher that more pages would most
likely be read for nothing (:attr:`Sorted.open`).

*Refills.* A spilled tenant whose queued items fell a refill's worth below its share -- half
of it, at most half a page -- is read on its own, the emptiest first (:meth:`QueueShares.
refills`): it always has items queued while it waits for the next read, and the queue holds
the weights. A short read means all its startable work is queued: it stops being spilled.

Invariants: never more admitted than the room given; a spilled tenant's resume position only
moves forward on its own reads, backward only when a pass meets its items before it; same
calls, same results (tenants in id order wherever order matters).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import Any, Final, Generic, TypeVar

import msgspec

from engine.core.dispatch import Dispatchable
from engine.core.fair_queue import FairQueue

Position = tuple[datetime, str]
"""``(startable_at, execution_id)``: a place in the ledger's order of startable work."""
SHARE_MIN: Final = 10
"""The least share of a tenant, however many tenants there are (the queue's bound still
holds: the room given to :meth:`QueueShares.sort` caps what is admitted)."""

T = TypeVar("T", bound=Dispatchable)


class Sorted(msgspec.Struct, Generic[T], frozen=True):
    queue: list[T]
    """The page's items to queue, in page order."""
    open: bool
    """Some tenant of the page has not spilled: the next page may hold work to queue."""


class Refill(msgspec.Struct, frozen=True):
    tenant_id: str
    after: Position | None
    """Read the tenant's startable work after this position (``None``: from the start)."""
    limit: int


class QueueShares:
    """The spilled tenants of one queue and their resume positions (see the module doc)."""

    def __init__(self, queue: FairQueue[Any]) -> None:
        self._queue = queue
        self._resume: dict[str, Position | None] = {}

    def __contains__(self, tenant_id: object) -> bool:
        return tenant_id in self._resume

    def __len__(self) -> int:
        return len(self._resume)

    def clear(self) -> None:
        """Forget every spill: the next pass starts over and finds them again (when the work
        owned changed, a tenant's work may sort before where its reads would resume)."""
        self._resume.clear()

    def shares(self, also: Iterable[str] = ()) -> dict[str, int]:
        """The share of every tenant with work queued, spilled, or in ``also``."""
        tenants = {*self._queue.tenant_ids(), *self._resume, *also}
        total = self._weight_total(tenants)
        return {tenant_id: self._share(tenant_id, total) for tenant_id in sorted(tenants)}

    def _weight_total(self, tenants: Iterable[str]) -> int:
        return sum(self._queue.weight(tenant_id) for tenant_id in tenants)

    def _share(self, tenant_id: str, weight_total: int) -> int:
        queue = self._queue
        return max(SHARE_MIN, queue.max_items * queue.weight(tenant_id) // weight_total)

    def sort(
        self,
        page: Sequence[T],
        positions: Sequence[Position],
        after: Position | None,
        *,
        room: int,
        is_new: Callable[[T], bool],
    ) -> Sorted[T]:
        """Of a page of the pass -- read after ``after``, ``positions[i]`` the position of
        ``page[i]`` -- the items to queue, at most ``room``: of each tenant, those within its
        share; a tenant past it (or past the room) spills just before its first item left
        out. Items ``is_new`` refuses (queued already, being started) are skipped."""
        shares = self.shares(item.tenant_id for item in page)
        queued = {tenant_id: self._queue.count(tenant_id) for tenant_id in shares}
        resume = self._resume
        admitted: list[T] = []
        previous = after
        for item, position in zip(page, positions, strict=True):
            tenant_id = item.tenant_id
            if is_new(item) and (
                tenant_id not in resume or _before_or_at(position, resume[tenant_id])
            ):
                if queued[tenant_id] < shares[tenant_id] and len(admitted) < room:
                    admitted.append(item)
                    queued[tenant_id] += 1
                else:
                    resume[tenant_id] = previous
            previous = position
        return Sorted(admitted, any(item.tenant_id not in resume for item in page))

    def refills(self, count_max: int, page_max: int) -> list[Refill]:
        """Up to ``count_max`` reads to make now, the emptiest tenant first: the spilled
        tenants a refill's worth below their share (each read at most ``page_max``)."""
        if not self._resume:
            return []
        # Only the spilled tenants' shares: this runs after every dispatched batch.
        total = self._weight_total({*self._queue.tenant_ids(), *self._resume})
        wanted = []
        for tenant_id, after in self._resume.items():
            share, queued = self._share(tenant_id, total), self._queue.count(tenant_id)
            if share - queued >= max(1, min(share, page_max) // 2):
                wanted.append((queued / share, tenant_id, after, min(page_max, share - queued)))
        wanted.sort(key=lambda entry: (entry[0], entry[1]))
        return [Refill(tenant_id, after, limit) for _, tenant_id, after, limit in wanted][
            :count_max
        ]

    def refilled(self, tenant_id: str, last: Position | None, *, complete: bool) -> None:
        """A refill of ``tenant_id`` read up to ``last`` (``None``: nothing); ``complete``
        when it came back short -- all its startable work is queued now."""
        if tenant_id not in self._resume:
            return  # forgotten meanwhile (clear): the pass finds it again
        if complete:
            del self._resume[tenant_id]
        elif last is not None:
            self._resume[tenant_id] = last


def _before_or_at(position: Position, resume: Position | None) -> bool:
    return resume is not None and position <= resume
