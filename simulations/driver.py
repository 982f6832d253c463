"""The simulated API client: creates the workload and changes schedules during the run.

It writes through the ledger exactly as the HTTP API does (the same ``engine.api.
schedule_input`` rules decide ``next_run_at``: the next fire after now on create, retime and
resume; kept on a payload change), with a correct clock, and retries while the whole
database is down (the API answers 503; the client tries again).

Every change is recorded as a :class:`Revision` -- when it committed (database time), the
definition in force from then on, and the ``next_run_at`` the ledger held just before -- the
history the expectation is computed from.

At a region failover the client moves to the new primary (:meth:`ApiClient.use`), and its
history continues there. It makes no change while the world holds its writes
(:meth:`ApiClient.writes_held`): from the replica's copy to the failover, so that no
acknowledged change is lost with the replication lag (which the simulator does not model:
``docs/simulation.md``); a change due meanwhile is made on the new primary.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Final

import trio

from engine.api import schedule_input
from engine.ledger.memory import MemoryLedger
from engine.ledger.params import SchedulesCreate, SchedulesDelete, SchedulesUpdate, TaskTypesPut
from engine.model import HandlerKind, Schedule, TaskType
from simulations.clocks import DatabaseClock
from simulations.params import TaskSettings
from simulations.proxy import Network
from simulations.scenario import ScheduleChange
from simulations.trace import Trace
from simulations.workload import HOOK_TYPE, TASK_TYPE, TENANTS, SimSchedule

RETRY_S: Final = 1.0
HANDLER: Final = "simulations.effects:deliver"


@dataclass(frozen=True)
class Revision:
    at: datetime
    """Database time the change committed."""
    action: str
    schedule: SimSchedule | None
    """The definition in force from ``at`` on; ``None`` while paused or once deleted."""
    next_run_before: datetime | None
    """The schedule's stored ``next_run_at`` read just before the change."""


class ApiClient:
    def __init__(
        self, ledger: MemoryLedger, clock: DatabaseClock, network: Network, trace: Trace
    ) -> None:
        self._ledger = ledger
        self._clock = clock
        self._network = network
        self._trace = trace
        self.history: dict[str, list[Revision]] = {}
        self._definitions: dict[str, SimSchedule] = {}
        self._held: trio.Event | None = None
        """Set when the hold ends; ``None`` while no hold."""
        self._writing: trio.Event | None = None
        """Set when the change under way is done; ``None`` while none is."""

    def use(self, ledger: MemoryLedger) -> None:
        """Talk to ``ledger`` from now on (the new primary after a region failover)."""
        self._ledger = ledger

    @asynccontextmanager
    async def writes_held(self) -> AsyncIterator[None]:
        """No change is made inside this block (one under way finishes first)."""
        held = self._held = trio.Event()
        if self._writing is not None:
            await self._writing.wait()
        try:
            yield
        finally:
            self._held = None
            held.set()

    async def setup(
        self,
        task: TaskSettings,
        schedules: list[SimSchedule],
        *,
        hook_timeout_s: float | None = None,
    ) -> None:
        """The ``sim`` task type (and the ``hook`` type, with ``hook_timeout_s``: the same
        handler and retry policy, its own timeout) and the initial schedules."""
        types = [(TASK_TYPE, task.timeout_s)]
        # A python task type is granted to tenants by name: the workload's, and those of
        # the schedules a user gave (`carillon simulate`).
        tenants = tuple(sorted({*TENANTS, *(schedule.tenant_id for schedule in schedules)}))
        if hook_timeout_s is not None:
            types.append((HOOK_TYPE, hook_timeout_s))
        for name, timeout_s in types:
            await self._ledger.task_types_put(
                TaskTypesPut(
                    TaskType(
                        name=name,
                        kind=HandlerKind.PYTHON,
                        allowed_tenants=tenants,
                        settings={"callable": HANDLER, "timeout_s": timeout_s},
                        timeout_s=timeout_s,
                        max_attempts=task.max_attempts,
                        backoff_base_s=task.backoff_base_s,
                        backoff_max_s=task.backoff_max_s,
                    )
                )
            )
        for schedule in schedules:
            await self._create(schedule)

    async def apply(self, change: ScheduleChange) -> None:
        """Carry out ``change``, waiting out a database outage first."""
        while self._network.unavailable("") or self._held is not None:
            if self._held is not None:
                await self._held.wait()
            else:
                await trio.sleep(RETRY_S)
        writing = self._writing = trio.Event()
        try:
            await self._change(change)
        finally:
            self._writing = None
            writing.set()

    async def _change(self, change: ScheduleChange) -> None:
        if change.action == "create":
            assert change.schedule is not None
            await self._create(change.schedule)
            return
        current = await self._ledger.schedules_get(change.schedule_id)
        now = self._clock.now()
        in_force: SimSchedule | None
        if change.action in ("payload", "retime"):
            assert change.schedule is not None
            in_force = change.schedule
            wanted = schedule_input.replace_with_spec(current, in_force.spec(), now=now)
        elif change.action == "pause":
            in_force = None
            wanted = schedule_input.paused(current)
        elif change.action == "resume":
            in_force = self._definitions[change.schedule_id]
            wanted = schedule_input.resumed(current, now=now)
        else:
            await self._ledger.schedules_delete(SchedulesDelete(change.schedule_id))
            self._record(change.schedule_id, "delete", None, current.next_run_at)
            return
        await self._ledger.schedules_update(SchedulesUpdate(wanted, current.version))
        if in_force is not None:
            self._definitions[change.schedule_id] = in_force
        self._record(change.schedule_id, change.action, in_force, current.next_run_at)

    async def _create(self, schedule: SimSchedule) -> None:
        now = self._clock.now()
        stored: Schedule = schedule_input.schedule_from_spec(
            schedule.spec(), schedule_id=schedule.schedule_id, tenant_id=schedule.tenant_id, now=now
        )
        await self._ledger.schedules_create(SchedulesCreate([stored]))
        self._definitions[schedule.schedule_id] = schedule
        self._record(schedule.schedule_id, "create", schedule, None)

    def _record(
        self, schedule_id: str, action: str, schedule: SimSchedule | None, before: datetime | None
    ) -> None:
        revision = Revision(self._clock.now(), action, schedule, before)
        self.history.setdefault(schedule_id, []).append(revision)
        self._trace.emit(
            "api", action, schedule_id, "-" if schedule is None else schedule.describe()
        )
