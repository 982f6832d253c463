"""Fire checkers: what ran against what should have (see ``docs/simulation.md``).

* **no missed fire** -- every ``REQUIRED`` instant has an execution that succeeded (with its
  effect applied), or was skipped for a reason its policies allow, or is a dead letter its
  last attempt's injected failure justifies; nothing is left unfinished;
* **no spurious fire** -- no execution exists at an instant that is not expected, and none
  of a paused or deleted schedule's instants ever ran;
* **no duplicate effect** -- at most one idempotency key's effect applied per fire, and that
  key is the fire's execution id; repeated *deliveries* are counted, not failed;
* **timeouts are timeouts** -- an attempt drawn to outlast its task type's timeout is cut off
  there, before its effect, and a dead letter it ends is recorded as ``timeout``;
* **never early** -- no handler started before its planned instant (database clock);
* **start delay within the bound** -- the first start of each fire lags its instant by at
  most :class:`~simulations.bound.DelayBound` allows.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime

from engine.ledger.params import SCHEDULE_DELETED, SCHEDULE_PAUSED
from engine.model import Execution, ExecutionStatus, execution_id
from simulations.bound import DelayBound
from simulations.effects import Delivery, Sinks
from simulations.expect import Expectation, Kind
from simulations.params import SimParams

CATCH_UP_REASONS = {
    "latest": {"catchup_latest_only", "catchup_window"},
    "all": {"catchup_limit", "catchup_window"},
    "none": {"catchup_none", "catchup_window"},
}
FAILING_FATES = {"transient", "lost-reply", "permanent", "timeout"}
CUT_SLACK_S = 0.001
"""A timed-out attempt ends at its timeout (the worker's deadline and the handler's sleep
share trio's clock)."""
UNFINISHED = {ExecutionStatus.QUEUED, ExecutionStatus.RUNNING, ExecutionStatus.FAILED}


@dataclass
class FireReport:
    violations: list[str] = field(default_factory=list)
    expected: int = 0
    executions: int = 0
    statuses: Counter[str] = field(default_factory=Counter)
    skip_reasons: Counter[str] = field(default_factory=Counter)
    deliveries: int = 0
    effects: int = 0
    repeat_deliveries: int = 0
    stale_token_deliveries: int = 0
    misses: int = 0
    timeouts: int = 0
    """Attempts cut off at their task type's timeout."""
    max_start_delay_s: float = 0.0
    max_healthy_delay_s: float = 0.0


class FireChecker:
    def __init__(
        self, params: SimParams, expectation: Expectation, bound: DelayBound, sinks: Sinks
    ) -> None:
        self.params = params
        self.expectation = expectation
        self.bound = bound
        self.sinks = sinks
        self.report = FireReport()
        self._by_id: dict[str, list[Delivery]] = defaultdict(list)
        for delivery in sinks.deliveries:
            self._by_id[delivery.execution_id].append(delivery)

    def check(self, executions: list[Execution]) -> FireReport:
        r = self.report
        r.expected = len(self.expectation.required)
        r.executions = len(executions)
        r.deliveries = len(self.sinks.deliveries)
        r.effects = len(self.sinks.applied)
        r.repeat_deliveries = sum(self.sinks.naive.values()) - len(self.sinks.applied)
        r.stale_token_deliveries = self.sinks.stale_tokens
        by_key = {(e.schedule_id, e.planned_at): e for e in executions}
        batches = self._catch_up_batches(executions)
        for execution in executions:
            r.statuses[str(execution.status)] += 1
            if execution.status is ExecutionStatus.SKIPPED:
                r.skip_reasons[execution.error_code or "?"] += 1
            self._check_row(execution, batches)
        for key in self.expectation.required:
            if key not in by_key:
                r.misses += 1
                self._fail(f"missed fire {key[0]} at {key[1].isoformat()}: no execution")
        self._check_effects(by_key)
        self._check_timeouts()
        self._check_starts()
        return r

    def _fail(self, message: str) -> None:
        self.report.violations.append(message)

    def _check_row(
        self, e: Execution, batches: dict[tuple[str, datetime], list[Execution]]
    ) -> None:
        key = (e.schedule_id, e.planned_at)
        kind = self.expectation.kinds.get(key)
        ran = bool(self._by_id.get(e.execution_id))
        where = f"{e.execution_id} ({e.status}{'/' + e.error_code if e.error_code else ''})"
        if kind is None:
            self._fail(f"spurious fire {where}: not an instant of the schedule")
            return
        if kind is Kind.NO_RUN:
            if ran or e.status is not ExecutionStatus.SKIPPED:
                self._fail(f"paused/deleted schedule's fire {where} ran or is still pending")
            return
        if kind is Kind.OPTIONAL:
            return
        if e.status in UNFINISHED:
            self.report.misses += 1
            self._fail(f"unfinished fire {where} after the liveness phase")
        elif e.status is ExecutionStatus.SUCCEEDED:
            if e.execution_id not in self.sinks.applied:
                self._fail(f"{where} succeeded without its effect")
        elif e.status is ExecutionStatus.DEAD_LETTER:
            # The attempt the ledger dead-lettered: after an unfenced region failover the
            # old region may have delivered a later-numbered attempt of its own elsewhere.
            delivered = self._by_id.get(e.execution_id, [])
            last = next(
                (d for d in delivered if d.attempt == e.attempt),
                max(delivered, key=lambda d: d.attempt, default=None),
            )
            if last is None or last.fate not in FAILING_FATES:
                self.report.misses += 1
                self._fail(f"{where} dead-lettered without an injected failure")
            elif last.fate == "timeout" and e.error_code != "timeout":
                self._fail(f"{where} dead-lettered by a timeout but recorded otherwise")
        elif not self._skip_allowed(e, batches):
            self.report.misses += 1
            self._fail(f"{where} skipped for a reason its policies do not allow")

    def _skip_allowed(
        self, e: Execution, batches: dict[tuple[str, datetime], list[Execution]]
    ) -> bool:
        schedule, since = self.expectation.definition[(e.schedule_id, e.planned_at)]
        reason = e.error_code or ""
        if reason == "overlap":
            return schedule.overlap == "skip"
        if reason in (SCHEDULE_PAUSED, SCHEDULE_DELETED):
            stops = self.expectation.stopped_at.get(e.schedule_id, set())
            return e.finished_at in stops and since <= (e.finished_at or since)
        if reason not in CATCH_UP_REASONS[schedule.catch_up] or e.enqueued_at is None:
            return False
        s = self.params.settings
        late_s = (e.enqueued_at - e.planned_at).total_seconds()
        tolerance = s.clock_skew_bound_s + 1.0
        if late_s < s.catchup_grace_s - tolerance:
            return False  # it was not missed: the planner found it in time
        if reason == "catchup_window":
            return late_s > schedule.catch_up_window_s - tolerance
        if reason == "catchup_latest_only":
            batch = batches.get((e.schedule_id, e.enqueued_at), [])
            return any(
                o.planned_at > e.planned_at and o.error_code not in CATCH_UP_REASONS["latest"]
                for o in batch
            )
        return True

    @staticmethod
    def _catch_up_batches(
        executions: list[Execution],
    ) -> dict[tuple[str, datetime], list[Execution]]:
        """Executions written together (same schedule, same write instant)."""
        batches: dict[tuple[str, datetime], list[Execution]] = defaultdict(list)
        for e in executions:
            if e.enqueued_at is not None:
                batches[(e.schedule_id, e.enqueued_at)].append(e)
        return batches

    def _check_effects(self, by_key: dict[tuple[str, datetime], Execution]) -> None:
        for (schedule_id, planned_at), keys in sorted(self.sinks.keys_of_fire.items()):
            if len(keys) > 1:
                self._fail(f"duplicate effect for {schedule_id} at {planned_at}: keys {keys}")
            expected_key = execution_id(schedule_id, planned_at)
            if keys != {expected_key}:
                self._fail(f"effect of {schedule_id} at {planned_at} under keys {sorted(keys)}")
            if (schedule_id, planned_at) not in by_key:
                self._fail(f"effect of {expected_key} without an execution in the ledger")

    def _check_timeouts(self) -> None:
        """A timed-out attempt was cut off at its timeout, before its effect."""
        timeouts = self.params.timeouts
        for d in self.sinks.deliveries:
            if d.fate != "timeout":
                continue
            r = self.report
            r.timeouts += 1
            limit = timeouts.get(d.task_type)
            ran = None if d.finished_at is None else (d.finished_at - d.started_at).total_seconds()
            if d.effect_sent:
                self._fail(f"{d.execution_id} attempt {d.attempt} timed out after its effect")
            elif limit is not None and ran is not None and ran > limit + CUT_SLACK_S:
                self._fail(
                    f"{d.execution_id} attempt {d.attempt} ran {ran:.3f}s, past its "
                    f"timeout of {limit:g}s"
                )

    def _check_starts(self) -> None:
        start = self.params.start
        r = self.report
        for execution_key, deliveries in sorted(self._by_id.items()):
            first = min(d.started_at for d in deliveries)
            planned = deliveries[0].planned_at
            for d in deliveries:
                if d.started_at < d.planned_at:
                    early = (d.planned_at - d.started_at).total_seconds()
                    self._fail(f"{execution_key} attempt {d.attempt} started {early:.3f}s early")
            delay_s = (first - planned).total_seconds()
            r.max_start_delay_s = max(r.max_start_delay_s, delay_s)
            bound_s = self.bound.bound_s((planned - start).total_seconds())
            if bound_s == self.bound.healthy_s:
                r.max_healthy_delay_s = max(r.max_healthy_delay_s, delay_s)
            if delay_s > bound_s:
                self._fail(
                    f"{execution_key} first started {delay_s:.3f}s after its instant "
                    f"(bound {bound_s:.3f}s)"
                )
