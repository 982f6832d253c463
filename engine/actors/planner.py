"""Plans one partition: materialises fires into the ledger ahead of time.

Design
------
The planner holds the partition's enabled schedules in a :class:`PlanHeap` keyed by
``next_run_at``. Each step pops the fires due by ``now + lookahead`` (``now`` is the clock
monitor's *corrected* time) and writes them in one fenced ledger transaction that also
advances each schedule's ``next_run_at`` and the partition checkpoint. So a top-of-minute
burst is durable before :00, and a crash at any point loses nothing: the ledger's
``next_run_at`` says where to resume, and re-planning a fire inserts nothing new (its id is
deterministic).

A fire found more than the catch-up grace in the past -- after downtime or a takeover -- goes
through :func:`~engine.core.catchup.catch_up` and is run or recorded as skipped by the
schedule's policy. A rejected fence (:class:`LeaseLost`) ends the planner immediately; an
unavailable ledger is retried with backoff, keeping the popped fires. Schedule changes arrive
through :meth:`notify` (routed from the change feed) and are applied between steps;
:meth:`reload` (the feed fell behind its pruning) reloads the whole partition instead.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, Final

import msgspec
import trio

from engine.actors.context import NodeContext
from engine.actors.forecast import BurstForecast, ForecastConfig
from engine.actors.planning_gate import PlanningGate
from engine.actors.retry import retry_unavailable
from engine.core.catchup import catch_up
from engine.core.plan_heap import PlanHeap
from engine.core.timetable import Timetable, TimetableCache
from engine.errors import LeaseLost, NotFound, ValidationError
from engine.ledger.params import (
    ExecutionsPlan,
    Fence,
    PlannableSchedule,
    PlannedExecution,
    PlanResult,
    ScheduleAdvance,
    SchedulesPlannable,
)
from engine.metrics import SKIP_CATCHUP_BULK
from engine.model import CatchUpPolicy, Schedule

log = logging.getLogger("carillon.planner")

LOAD_PAGE_SIZE: Final = 2_000
"""Schedules per read of a partition load: few round trips, little memory held per page."""
INBOX_MAX: Final = 100_000
"""Pending change notifications per planner; beyond it the planner reloads everything."""


class PartitionLost(Exception):
    """The partition's fence was rejected: this node no longer owns it."""


class PlannerConfig(msgspec.Struct, frozen=True):
    lookahead_s: float
    batch_max: int
    catchup_grace_s: float
    idle_wait_max_s: float = 30.0
    """Longest idle sleep; changes and due fires wake the planner earlier."""


class PlannerStatistics(msgspec.Struct, frozen=True):
    partition_id: int
    schedules: int
    """Schedules held (not the heap's size: the fires of a batch being written are out of it)."""
    planned: int
    skipped: int
    batches: int
    checkpoint: datetime | None
    next_instant: datetime | None


class _Entry(msgspec.Struct, gc=False):
    """What planning needs of a schedule; kept small, as a node may hold millions.

    ``gc=False``: entries hold no reference cycles, and a million tracked objects would make
    every full garbage collection walk them.
    """

    schedule_id: str
    tenant_id: str
    task_type: str
    version: int
    next_run_at: datetime
    catch_up: CatchUpPolicy
    catch_up_window_s: float
    timetable: Timetable


class Planner:
    def __init__(
        self,
        config: PlannerConfig,
        *,
        ctx: NodeContext,
        fence: Fence,
        cache: TimetableCache,
        forecast: BurstForecast | None = None,
        gate: PlanningGate | None = None,
        on_planned: Callable[[datetime], None] = lambda at: None,
    ) -> None:
        self.fence = fence
        self._metrics = ctx.metrics
        self._tracing = ctx.tracing
        self._bulk_skips = 0
        """Ranges skipped in bulk by the batch being built; counted once it is written."""
        self._on_planned = on_planned
        self._gate = gate or PlanningGate(1, 1)
        self._forecast = forecast or BurstForecast(
            ForecastConfig(config.lookahead_s, plan_rate_per_s=1e12, max_extra_s=0.0)
        )
        self.config = config
        self._ledger = ctx.ledger
        self._monitor = ctx.monitor
        self._cache = cache
        self._rng = ctx.rng
        self._heap = PlanHeap()
        self._entries: dict[str, _Entry] = {}
        self._windows: dict[float, float] = {}
        """Each catch-up window length seen, to itself (few distinct values, shared)."""
        self._inbox: dict[str, None] = {}
        self._inbox_overflow = False
        self._wake = trio.Event()
        self._planned = 0
        self._skipped = 0
        self._batches = 0
        self._checkpoint: datetime | None = None

    @property
    def partition_id(self) -> int:
        return self.fence.partition_id

    def notify(self, schedule_id: str) -> None:
        """A schedule of this partition changed; reload it before the next step."""
        if len(self._inbox) >= INBOX_MAX:
            self._inbox_overflow = True
        else:
            self._inbox[schedule_id] = None
        self._wake.set()

    def reload(self) -> None:
        """Reload every schedule of the partition before the next step (changes may have
        been missed)."""
        self._inbox_overflow = True
        self._wake.set()

    async def run(self, *, task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
        """Load, then plan until cancelled; raises :class:`PartitionLost` on a rejected fence."""
        async with self._gate.loading():  # a few partitions load at a time, not all at once
            await self._retry(self.load, "load")
        task_status.started()
        await self._gate.wait_loaded()  # the node's other partitions first (PlanningGate)
        log.log(
            logging.INFO if len(self._heap) else logging.DEBUG,
            "partition %d: planning %d schedules",
            self.partition_id,
            len(self._heap),
        )
        while True:
            await self._monitor.wait_planning_allowed()
            await self._retry(self.apply_changes, "apply changes")
            planned = await self._retry(self.step, "plan")
            if planned == 0:
                await self._wait_for_work()

    async def load(self) -> None:
        """Read every schedule of the partition into the heap."""
        self._heap = PlanHeap()
        self._entries = {}
        self._windows = {}
        self._inbox.clear()
        self._inbox_overflow = False
        after: str | None = None
        now = self._monitor.now()
        while True:
            page = await self._ledger.schedules_plannable(
                SchedulesPlannable(self.partition_id, after, LOAD_PAGE_SIZE)
            )
            for schedule in page:
                self._track(schedule, now)
            self._gate.progress()
            if len(page) < LOAD_PAGE_SIZE:
                break
            after = page[-1].schedule_id

    async def apply_changes(self) -> None:
        """Reload the schedules named by change notifications."""
        if self._inbox_overflow:
            await self.load()
            return
        while self._inbox:
            schedule_id = next(iter(self._inbox))
            try:
                schedule = await self._ledger.schedules_get(schedule_id)
            except NotFound:
                self._forget(schedule_id)
            else:
                self._track(schedule, self._monitor.now())
            del self._inbox[schedule_id]

    async def step(self) -> int:
        """Plan the fires due within the lookahead; returns how many schedules it handled.

        The next instant is planned earlier when the whole node has many fires due then
        (:class:`~engine.actors.forecast.BurstForecast`). A batch is built and written
        holding one of the node's write slots (:class:`PlanningGate`).
        """
        if self._plan_until() is None:
            return 0
        async with self._gate.writing():
            return await self._write_due()

    def _plan_until(self) -> datetime | None:
        """Up to when to plan now, or None when nothing is due yet."""
        now = self._monitor.now()
        until = now + timedelta(seconds=self.config.lookahead_s)
        upcoming = self._heap.next_instant()
        if upcoming is None:
            return None
        if upcoming > until and upcoming - now <= timedelta(
            seconds=self._forecast.lead_s(upcoming)
        ):
            until = upcoming
        return until if upcoming <= until else None

    async def _write_due(self) -> int:
        until = self._plan_until()  # again: waiting for the slot took time
        if until is None:
            return 0
        now = self._monitor.now()
        due = self._heap.pop_until(until, limit=self.config.batch_max)
        if not due:
            return 0
        self._bulk_skips = 0
        executions: list[PlannedExecution] = []
        advances: list[ScheduleAdvance] = []
        pushes: list[tuple[str, datetime]] = []
        handled = 0
        on_time_from = now - timedelta(seconds=self.config.catchup_grace_s)
        for at, ids in due:
            for index, schedule_id in enumerate(ids):
                if len(executions) >= self.config.batch_max:
                    for rest in ids[index:]:
                        self._heap.push(rest, at)
                    break
                entry = self._entries[schedule_id]
                next_at = self._resolve(entry, at, now, on_time_from, executions)
                advances.append(ScheduleAdvance(schedule_id, next_at, entry.version))
                pushes.append((schedule_id, next_at))
                handled += 1
        next_instant = self._heap.next_instant()
        checkpoint = until if next_instant is None or next_instant > until else due[-1][0]
        try:
            result = await self._plan(ExecutionsPlan(self.fence, executions, advances, checkpoint))
        except BaseException:
            # Nothing was written (or it will be re-planned idempotently): put them back.
            for schedule_id, _ in pushes:
                self._heap.push(schedule_id, self._entries[schedule_id].next_run_at)
            raise
        stale = set(result.stale)
        for schedule_id, next_at in pushes:
            entry = self._entries[schedule_id]
            entry.next_run_at = self._heap.push(schedule_id, next_at)
            if schedule_id in stale:
                self.notify(schedule_id)
        queued = [e.planned_at for e in executions if e.error_code is None]
        self._planned += len(queued)
        self._skipped += len(executions) - len(queued)
        self._batches += 1
        self._checkpoint = checkpoint
        self._publish()
        self._count(executions, queued, now)
        # The dispatcher fetches them when they are due: every instant of the batch, which
        # may span the whole lookahead (its first alone left the rest to the fallback fetch).
        for planned_at in sorted(set(queued)):
            self._on_planned(planned_at)
        return handled

    async def _plan(self, plan: ExecutionsPlan) -> PlanResult:
        """Write ``plan``; with tracing on, as a ``carillon.plan`` span that the first
        attempts of its queued executions link to (``engine/tracing.py``)."""
        tracing = self._tracing
        if tracing is None:
            return await self._ledger.executions_plan(plan)
        with tracing.planning(self.partition_id, len(plan.executions)) as span:
            result = await self._ledger.executions_plan(plan)
            tracing.planned(
                span,
                [(e.schedule_id, e.planned_at) for e in plan.executions if e.error_code is None],
            )
            return result

    def statistics(self) -> PlannerStatistics:
        return PlannerStatistics(
            self.partition_id,
            len(self._entries),
            self._planned,
            self._skipped,
            self._batches,
            self._checkpoint,
            self._heap.next_instant(),
        )

    # -- internals ------------------------------------------------------------------------

    def _count(
        self, executions: list[PlannedExecution], queued: list[datetime], now: datetime
    ) -> None:
        """Count the batch just written: queued executions as enqueued, catch-up records as
        skipped. Only a batch whose write returned counts, so one planned again after its
        answer was lost counts once."""
        metrics = self._metrics
        metrics.executions_planned(queued, now)
        if len(queued) != len(executions):
            for e in executions:
                if e.error_code is not None:
                    metrics.skipped(e.error_code)
        if self._bulk_skips:
            metrics.skipped(SKIP_CATCHUP_BULK, self._bulk_skips)
            self._bulk_skips = 0

    def _resolve(
        self,
        entry: _Entry,
        at: datetime,
        now: datetime,
        on_time_from: datetime,
        executions: list[PlannedExecution],
    ) -> datetime:
        """Add the executions for ``entry``'s fire at ``at``; return its next fire. A fire at
        or after ``on_time_from`` (``now`` less the catch-up grace) is planned as it is."""
        schedule = entry
        if at >= on_time_from:
            executions.append(
                PlannedExecution(schedule.schedule_id, schedule.tenant_id, schedule.task_type, at)
            )
            return entry.timetable.next_fire(at).planned_at
        result = catch_up(
            entry.timetable,
            at,
            now,
            policy=schedule.catch_up,
            window_s=schedule.catch_up_window_s,
            grace_s=self.config.catchup_grace_s,
        )
        if result.bulk_skipped is not None:
            self._bulk_skips += 1  # counted by _count once the batch is written
            start, end = result.bulk_skipped
            log.warning(
                "partition %d: schedule %s missed too many fires; skipped %s..%s in bulk",
                self.partition_id,
                schedule.schedule_id,
                start.isoformat(),
                end.isoformat(),
            )
        for fire in result.fires:
            executions.append(
                PlannedExecution(
                    schedule.schedule_id,
                    schedule.tenant_id,
                    schedule.task_type,
                    fire.planned_at,
                    fire.status,
                    fire.reason,
                    None if fire.reason is None else "missed while no node planned it",
                )
            )
        return result.next_run_at

    def _track(self, schedule: Schedule | PlannableSchedule, now: datetime) -> None:
        """Put ``schedule`` (as stored) into the heap, or take it out if disabled."""
        if not schedule.enabled:
            self._forget(schedule.schedule_id)
            return
        try:
            timetable = self._cache.get(
                schedule.cron_expr,
                schedule.timezone,
                dst_gap=schedule.dst_gap,
                dst_overlap=schedule.dst_overlap,
                schedule_id=schedule.schedule_id,
            )
        except ValidationError as exc:
            log.error("schedule %s cannot be planned: %s", schedule.schedule_id, exc)
            self._forget(schedule.schedule_id)
            return
        next_at = schedule.next_run_at
        if next_at is None:
            next_at = timetable.next_fire(now).planned_at
        window_s = schedule.catch_up_window_s
        self._entries[schedule.schedule_id] = _Entry(
            schedule_id=schedule.schedule_id,
            tenant_id=schedule.tenant_id,
            task_type=schedule.task_type,
            version=schedule.version,
            # The heap's shared object for the instant, and one float per window length:
            # equal values, 72 bytes less per schedule (a million of them: 69 MiB).
            next_run_at=self._heap.push(schedule.schedule_id, next_at),
            catch_up=schedule.catch_up,
            catch_up_window_s=self._windows.setdefault(window_s, window_s),
            timetable=timetable,
        )

    def _forget(self, schedule_id: str) -> None:
        self._heap.remove(schedule_id)
        self._entries.pop(schedule_id, None)

    def _publish(self) -> None:
        """Tell the node's forecast what this partition has due next."""
        upcoming = self._heap.next_instant()
        count = 0 if upcoming is None else self._heap.bucket_size(upcoming)
        self._forecast.update(self.partition_id, upcoming, count)

    async def _wait_for_work(self) -> None:
        self._publish()
        next_instant = self._heap.next_instant()
        wait_s = self.config.idle_wait_max_s
        if next_instant is not None:
            lead_s = self._forecast.lead_s(next_instant)
            due_in = (next_instant - self._monitor.now()).total_seconds() - lead_s
            wait_s = min(wait_s, max(due_in, 0.0))
        with trio.move_on_after(wait_s):
            await self._wake.wait()
        self._wake = trio.Event()

    async def _retry(self, call: Any, what: str) -> Any:
        try:
            return await retry_unavailable(
                call, rng=self._rng, log=log, what=f"partition {self.partition_id} {what}"
            )
        except LeaseLost as exc:
            raise PartitionLost(f"partition {self.partition_id}: {exc}") from exc
