"""What the contract suite runs against: a :class:`Backend` (a fresh ledger and a way to let
time pass on its clock), and the helpers its tests share. Needs no pytest.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

import trio

from engine.core.hashing import partition_of
from engine.ledger.base import Ledger
from engine.ledger.params import TaskTypesPut
from engine.model import HandlerKind, Schedule, TaskType
from engine.testing.clock import ManualClock

PARTITIONS: Final = 8
"""The partition count a ledger under test must have: the suite picks schedule ids by the
partition they hash to."""

START: Final = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
"""Where the memory backend's clock starts (on a whole second)."""

NOOP: Final = TaskType(name="noop", kind=HandlerKind.NOOP, allowed_tenants=("*",))
"""The task type the suite's schedules name: store it (:func:`put_noop_task_type`) in a
ledger before handing it to the suite."""


async def put_noop_task_type(ledger: Ledger) -> None:
    """Store :data:`NOOP` (again): needed before creating schedules of task type ``noop``."""
    await ledger.task_types_put(TaskTypesPut(NOOP))


@dataclass
class Backend:
    """A ledger under test: fresh (nothing in it but :data:`NOOP`), of :data:`PARTITIONS`
    partitions, and how to move the clock it judges expiry by."""

    name: str
    ledger: Ledger
    advance_clock: Callable[[float], Awaitable[None]]
    """Let ``seconds`` pass on the ledger's clock -- an injected clock, never a real sleep."""
    clock_stands_still: bool = False
    """The ledger's clock moves only when advanced (a :class:`ManualClock`); if not, it also
    runs on its own (a database server's clock with an injected offset)."""

    async def advance(self, seconds: float) -> None:
        """Let ``seconds`` pass on the ledger's clock."""
        if seconds < 0:
            raise ValueError("time does not run backwards")
        await self.advance_clock(seconds)
        await trio.lowlevel.checkpoint()


@asynccontextmanager
async def memory_backend(partitions: int = PARTITIONS) -> AsyncIterator[Backend]:
    """The reference backend: a :class:`~engine.ledger.memory.MemoryLedger` on a
    :class:`ManualClock` starting at :data:`START`."""
    from engine.ledger.memory import MemoryLedger

    clock = ManualClock(START)
    ledger = MemoryLedger(clock=clock, partition_count=partitions)
    await put_noop_task_type(ledger)

    async def advance(seconds: float) -> None:
        clock.advance(seconds)

    yield Backend("memory", ledger, advance, clock_stands_still=True)


def ids_in_partition(partition: int, count: int, prefix: str = "s") -> list[str]:
    """``count`` schedule ids that hash to ``partition`` (of :data:`PARTITIONS`)."""
    found: list[str] = []
    n = 0
    while len(found) < count:
        candidate = f"{prefix}-{n}"
        if partition_of(candidate, PARTITIONS) == partition:
            found.append(candidate)
        n += 1
    return found


def schedule(schedule_id: str, **overrides: Any) -> Schedule:
    """A minutely ``noop`` schedule of tenant ``acme``, with ``overrides``."""
    fields: dict[str, Any] = {
        "schedule_id": schedule_id,
        "tenant_id": "acme",
        "cron_expr": "* * * * *",
        "task_type": "noop",
    }
    fields.update(overrides)
    return Schedule(**fields)
