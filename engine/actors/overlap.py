"""Overlap policies at dispatch: which popped executions may start, wait, or are skipped.

Each schedule's policy (:func:`~engine.model.overlap_policy`) decides what happens to an
execution popped while an earlier one of the same schedule still runs: ``allow`` starts it,
``skip`` records it as skipped with the reason ``overlap`` (one fenced ``executions_skip``
per batch), ``buffer_one`` holds it -- at most one per schedule, counted against the queue's
bound -- and puts it back into the queue as soon as the schedule's run finishes (where it is
the schedule's earliest); further ones are skipped.

The node that owns a partition starts every execution of its schedules, so it counts in
memory what it started and has not seen finish, per schedule. What it cannot know --
executions left ``running`` by a previous owner after a takeover -- it asks the ledger once
per schedule and lease: the answer "none running" holds for as long as the node keeps that
lease, since nobody else claims in its partitions. Held executions blocked by a previous
owner's run are re-checked in the ledger (:meth:`OverlapGuard.recheck_held`).
"""

from __future__ import annotations

import enum
import logging
import operator
from collections.abc import Callable
from typing import Final

from engine.actors.attempts import OVERLAP, Attempt
from engine.actors.context import NodeContext
from engine.actors.retry import call_fenced
from engine.actors.schedule_cache import UNCACHED, ScheduleCache
from engine.core.fair_queue import FairQueue
from engine.errors import CarillonError
from engine.ledger.params import ExecutionsQuery, ExecutionsSkip, Fence
from engine.model import Execution, ExecutionStatus, OverlapPolicy, TaskType, overlap_policy

log = logging.getLogger("carillon.dispatcher")

OVERLAP_ERROR_CODE: Final = "overlap"
IDLE_VERIFIED_MAX: Final = 100_000
"""Schedules remembered as having no running execution in the ledger; when full, the memory
starts over (each is asked again when next seen)."""
HELD_RECHECK_MAX: Final = 100
"""Held executions blocked by a previous owner's run re-checked in the ledger per pass."""


_planned_at: Final = operator.attrgetter("item.planned_at")
"""An attempt's planned instant (its execution's), read in C: a sort key per attempt."""


def _partition_of(execution: Execution) -> int:
    return execution.partition_id


class OverlapVerdict(enum.StrEnum):
    START = "start"
    HOLD = "hold"
    """``buffer_one``: wait until the schedule's run finishes."""
    SKIP = "skip"


class OverlapGuard:
    """The dispatcher's overlap bookkeeping for one node (see the module doc)."""

    def __init__(
        self,
        *,
        ctx: NodeContext,
        schedules: ScheduleCache,
        queue: FairQueue[Execution],
        task_type: Callable[[str], TaskType | None],
    ) -> None:
        self._ledger = ctx.ledger
        self._table = ctx.table
        self._schedules = schedules
        self.queue = queue
        self._rng = ctx.rng
        self._task_type = task_type
        self._running: dict[str, int] = {}
        """Executions started by this node and not finished yet, per schedule id."""
        self._idle_verified: dict[str, int] = {}
        """Schedule id -> the fencing token under which the ledger had none of it running."""
        self._held: dict[str, Execution] = {}
        """``buffer_one``: the one execution per schedule waiting for its run to finish."""
        self.skipped = 0
        self.deferred = 0
        """Left in the ledger because their schedule could not be read (retried later)."""
        self._release_overlap = self._run_ended
        """The attempts' release function, bound once: holding it allocates nothing."""

    @property
    def held(self) -> int:
        """Executions held now (``buffer_one``), waiting for their schedule's run to end."""
        return len(self._held)

    async def admit(self, attempts: list[Attempt]) -> list[Attempt]:
        """The popped attempts that may start, each holding its schedule's overlap slot
        (``overlap``, given back by :meth:`started_done` when its run ends). The others are
        held or recorded as skipped; their tickets are the caller's to close."""
        admitted: list[Attempt] = []
        skipped: list[Execution] = []
        await self._schedules.prefetch([attempt.item.schedule_id for attempt in attempts])
        # Judged in planned order (stable: a burst's shared instant keeps the pop order), so
        # of two fires of one schedule popped together -- a redelivery and a newer fire --
        # the earlier is the one that starts under ``skip`` and ``buffer_one``.
        for attempt in sorted(attempts, key=_planned_at):
            execution = attempt.item
            try:
                verdict = self._verdict_at_once(execution)
                if verdict is None:
                    verdict = await self._verdict(execution)
            except CarillonError as exc:
                # Cannot tell whether it may start: leave it queued in the ledger for a
                # later fetch rather than risk an overlap the policy forbids.
                log.warning("overlap check of %s failed: %s", execution.execution_id, exc)
                self.deferred += 1
                continue
            if verdict is OverlapVerdict.START:
                schedule_id = execution.schedule_id
                self._running[schedule_id] = self._running.get(schedule_id, 0) + 1
                attempt.hold(OVERLAP, self._release_overlap)
                admitted.append(attempt)
            elif verdict is OverlapVerdict.HOLD:
                self._held[execution.schedule_id] = execution
            else:
                skipped.append(execution)
        if skipped:
            await self._skip(skipped)
        return admitted

    def _verdict_at_once(self, execution: Execution) -> OverlapVerdict | None:
        """The verdict of :meth:`_verdict` when it needs no read -- the schedule is cached and
        allows overlaps (or is deleted), as for nearly every execution -- else ``None``."""
        schedule = self._schedules.cached(execution.schedule_id)
        if schedule is UNCACHED:
            return None
        if schedule is None:
            return OverlapVerdict.START
        if overlap_policy(schedule, self._task_type(execution.task_type)) is OverlapPolicy.ALLOW:
            return OverlapVerdict.START
        return None

    async def _verdict(self, execution: Execution) -> OverlapVerdict:
        schedule = await self._schedules.get(execution.schedule_id)
        if schedule is None:
            return OverlapVerdict.START  # deleted: its pending executions are skipped already
        policy = overlap_policy(schedule, self._task_type(execution.task_type))
        if policy is OverlapPolicy.ALLOW or not await self._busy(execution):
            return OverlapVerdict.START
        if policy is OverlapPolicy.BUFFER_ONE and execution.schedule_id not in self._held:
            return OverlapVerdict.HOLD
        return OverlapVerdict.SKIP

    async def _busy(self, execution: Execution) -> bool:
        """Whether an execution of ``execution``'s schedule is running: started here and not
        finished, or left running in the ledger by a previous owner of the partition."""
        schedule_id = execution.schedule_id
        if self._running.get(schedule_id, 0) > 0:
            return True
        owned = self._table.get(execution.partition_id)
        token = None if owned is None else owned.fence.fencing_token
        if token is not None and self._idle_verified.get(schedule_id) == token:
            return False
        if await self._running_in_ledger(schedule_id):
            return True
        if token is not None:
            if len(self._idle_verified) >= IDLE_VERIFIED_MAX:
                self._idle_verified.clear()
            self._idle_verified[schedule_id] = token
        return False

    async def _running_in_ledger(self, schedule_id: str) -> bool:
        page = await self._ledger.executions_query(
            ExecutionsQuery(schedule_id=schedule_id, status=ExecutionStatus.RUNNING, limit=1)
        )
        return bool(page.items)

    async def _skip(self, executions: list[Execution]) -> None:
        fences: dict[int, Fence] = {}
        for execution in executions:
            owned = self._table.get(execution.partition_id)
            if owned is not None:
                fences[owned.fence.partition_id] = owned.fence
        wanted = [e for e in executions if e.partition_id in fences]

        async def skip(fences: list[Fence], executions: list[Execution]) -> list[str]:
            params = ExecutionsSkip(
                fences,
                [e.execution_id for e in executions],
                OVERLAP_ERROR_CODE,
                "the previous execution of its schedule was still running",
            )
            return await self._ledger.executions_skip(params)

        done, _, _ = await call_fenced(
            fences, wanted, _partition_of, skip, rng=self._rng, log=log,
            what="skip overlapping executions",
        )  # fmt: skip
        self.skipped += len(done or ())

    def is_held(self, execution: Execution) -> bool:
        held = self._held.get(execution.schedule_id)
        return held is not None and held.execution_id == execution.execution_id

    def _run_ended(self, attempt: Attempt) -> None:
        self.started_done(attempt.item.schedule_id)  # once per attempt: no property call

    def started_done(self, schedule_id: str) -> None:
        """One execution of ``schedule_id`` started here is over (or was not claimed)."""
        left = self._running.get(schedule_id, 0) - 1
        if left > 0:
            self._running[schedule_id] = left
            return
        self._running.pop(schedule_id, None)
        self._release_held(schedule_id)

    def _release_held(self, schedule_id: str) -> None:
        held = self._held.pop(schedule_id, None)
        # Not owned any more, or no room: it stays queued in the ledger for whoever fetches.
        if held is not None and held.partition_id in self._table:
            self.queue.push(held)

    async def recheck_held(self) -> bool:
        """Release held executions whose blocker -- a run left by a previous owner -- is no
        longer running in the ledger; forget those of partitions no longer owned."""
        checked = 0
        for schedule_id in list(self._held):
            if checked == HELD_RECHECK_MAX:
                break
            if self._running.get(schedule_id, 0) > 0:
                continue  # started here: started_done() releases it
            held = self._held.pop(schedule_id)
            if held.partition_id not in self._table:
                continue
            checked += 1
            self._held[schedule_id] = held  # re-inserted last: the next pass starts elsewhere
            if not await self._running_in_ledger(schedule_id):
                self._release_held(schedule_id)
        return checked > 0
