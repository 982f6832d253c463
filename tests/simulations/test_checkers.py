"""The checkers have teeth: each one, fed a violation by hand, reports it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import trio
import trio.testing

from engine.ledger.params import Fence
from engine.model import Execution, ExecutionStatus, Lease, execution_id
from simulations.bound import DelayBound
from simulations.check_fires import FireChecker
from simulations.effects import Delivery, Sinks
from simulations.expect import Expectation, Kind
from simulations.leases import LeaseMonitor
from simulations.params import SimParams, derive
from simulations.trace import Trace
from simulations.workload import SimSchedule

T0 = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
SCHEDULE = SimSchedule("s000", "acme", "* * * * *", "UTC")


def _params() -> SimParams:
    params = derive(1, "calm", nodes=2, days=0.01)
    from dataclasses import replace

    return replace(params, start=T0 - timedelta(minutes=5))


def _execution(minute: int, status: ExecutionStatus, **fields: object) -> Execution:
    planned = T0 + timedelta(minutes=minute)
    return Execution(
        execution_id=execution_id(SCHEDULE.schedule_id, planned),
        schedule_id=SCHEDULE.schedule_id,
        tenant_id="acme",
        task_type="sim",
        planned_at=planned,
        status=status,
        enqueued_at=planned - timedelta(seconds=5),
        partition_id=0,
        **fields,  # type: ignore[arg-type]
    )


def _delivery(minute: int, *, late_s: float, node: str = "n1") -> Delivery:
    planned = T0 + timedelta(minutes=minute)
    return Delivery(
        execution_id=execution_id(SCHEDULE.schedule_id, planned),
        schedule_id=SCHEDULE.schedule_id,
        planned_at=planned,
        attempt=1,
        fencing_token=1,
        node=node,
        started_at=planned + timedelta(seconds=late_s),
        fate="ok",
    )


def _expect(*minutes: int) -> Expectation:
    expectation = Expectation()
    for minute in minutes:
        key = (SCHEDULE.schedule_id, T0 + timedelta(minutes=minute))
        expectation.mark(key, Kind.REQUIRED, SCHEDULE, T0 - timedelta(hours=1))
    return expectation


async def test_the_fire_checker_reports_misses_spurious_fires_early_starts_and_late_ones() -> None:
    params = _params()
    sinks = Sinks(Trace())
    on_time = _delivery(0, late_s=0.5)
    early = _delivery(1, late_s=-0.25)
    late = _delivery(3, late_s=600.0)
    for delivery in (on_time, early, late):
        sinks.started(delivery)
        sinks.effect(delivery, delivery.execution_id)
    executions = [
        _execution(0, ExecutionStatus.SUCCEEDED),
        _execution(1, ExecutionStatus.SUCCEEDED),
        _execution(3, ExecutionStatus.SUCCEEDED),
        _execution(4, ExecutionStatus.QUEUED),  # never finished
        _execution(9, ExecutionStatus.SUCCEEDED),  # not an expected instant
    ]
    checker = FireChecker(params, _expect(0, 1, 2, 3, 4), DelayBound(params, []), sinks)
    report = checker.check(executions)
    found = "\n".join(report.violations)
    assert "missed fire s000 at 2026-05-01T12:02:00+00:00" in found
    assert "unfinished fire s000:2026-05-01T12:04:00Z" in found
    assert "spurious fire s000:2026-05-01T12:09:00Z" in found
    assert "attempt 1 started 0.250s early" in found
    assert "s000:2026-05-01T12:03:00Z first started 600.000s after its instant" in found
    assert "s000:2026-05-01T12:09:00Z (succeeded) succeeded without its effect" not in found
    assert report.misses == 2
    assert len(report.violations) == 5


async def test_a_second_key_for_one_fire_is_a_duplicate_effect() -> None:
    params = _params()
    sinks = Sinks(Trace())
    delivery = _delivery(0, late_s=0.1)
    sinks.started(delivery)
    sinks.effect(delivery, delivery.execution_id)
    sinks.effect(delivery, delivery.execution_id)  # a repeat delivery: deduplicated
    assert sinks.naive[delivery.execution_id] == 2
    checker = FireChecker(params, _expect(0), DelayBound(params, []), sinks)
    assert checker.check([_execution(0, ExecutionStatus.SUCCEEDED)]).violations == []
    sinks.effect(delivery, "s000:another-key")  # the same fire under another key
    checker = FireChecker(params, _expect(0), DelayBound(params, []), sinks)
    violations = checker.check([_execution(0, ExecutionStatus.SUCCEEDED)]).violations
    assert any("duplicate effect for s000" in v for v in violations)


async def test_skips_must_have_a_reason_the_policies_allow() -> None:
    params = _params()
    sinks = Sinks(Trace())
    early_skip = _execution(0, ExecutionStatus.SKIPPED, error_code="catchup_latest_only")
    overlap = _execution(1, ExecutionStatus.SKIPPED, error_code="overlap")
    checker = FireChecker(params, _expect(0, 1), DelayBound(params, []), sinks)
    violations = checker.check([early_skip, overlap]).violations
    # Written 5 s before its instant: not missed, so not a catch-up skip; and the schedule's
    # overlap policy is allow, so no overlap skip either.
    assert len(violations) == 2
    assert all("skipped for a reason its policies do not allow" in v for v in violations)


def test_fencing_tokens_must_grow_and_leases_must_not_be_taken_while_held() -> None:
    monitor = LeaseMonitor(partitions=2)
    monitor.acquired(Lease(partition_id=0, owner_id="a", fencing_token=1, expires_at=T0), T0)
    later = T0 + timedelta(seconds=1)
    monitor.acquired(Lease(partition_id=0, owner_id="b", fencing_token=1, expires_at=later), later)
    assert any("not monotonic" in v for v in monitor.violations)
    monitor = LeaseMonitor(partitions=2)
    until = T0 + timedelta(seconds=15)
    monitor.acquired(Lease(partition_id=1, owner_id="a", fencing_token=1, expires_at=until), T0)
    monitor.acquired(Lease(partition_id=1, owner_id="b", fencing_token=2, expires_at=until), later)
    assert monitor.violations == [
        f"partition 1 acquired by b while a's lease ran until {until.isoformat()}"
    ]


def test_a_write_accepted_with_a_stale_fence_is_reported() -> None:
    monitor = LeaseMonitor(partitions=1)
    until = T0 + timedelta(seconds=15)
    monitor.acquired(Lease(partition_id=0, owner_id="a", fencing_token=1, expires_at=until), T0)
    monitor.write_accepted("a#1", "executions_plan", [Fence(0, "a", 1)], T0)
    assert monitor.violations == []
    monitor.write_accepted("a#1", "executions_claim", [Fence(0, "a", 1)], until)  # expired
    monitor.write_accepted("z#1", "executions_claim", [Fence(0, "z", 1)], T0)  # not the holder
    assert len(monitor.violations) == 2


def test_overlapping_trust_windows_of_two_holders_are_reported() -> None:
    monitor = LeaseMonitor(partitions=1)
    monitor.trusted("a#1", 0, 1, at=0.0, until=13.0)
    monitor.trusted("a#1", 0, 1, at=5.0, until=18.0)  # renewed
    monitor.untrusted("a#1", 0, at=16.0)  # dropped
    monitor.trusted("b#1", 0, 2, at=16.0, until=29.0)  # taken over right after: fine
    monitor.finish(at=40.0)
    assert monitor.violations == []
    monitor = LeaseMonitor(partitions=1)
    monitor.trusted("a#1", 0, 1, at=0.0, until=13.0)
    monitor.trusted("b#1", 0, 2, at=12.0, until=25.0)
    monitor.finish(at=40.0)
    assert monitor.violations == [
        "partition 0 trusted by a#1/token 1 until t=13.000 and by b#1/token 2 from t=12.000"
    ]


def test_the_delay_bound_widens_over_disturbed_stretches_only() -> None:
    params = _params()
    bound = DelayBound(params, [(100.0, 160.0), (170.0, 170.0)])
    healthy, recovery = bound.healthy_s, bound.recovery_s
    assert bound.bound_s(10.0) == healthy
    assert bound.stretches == [(100.0, 170.0 + recovery)]
    assert bound.bound_s(120.0) == 170.0 + recovery - 120.0 + healthy
    assert bound.bound_s(100.0 - healthy) == 170.0 + recovery - (100.0 - healthy) + healthy
    assert bound.bound_s(170.0 + recovery + 1) == healthy


async def test_the_trace_hash_follows_every_event(
    autojump_clock: trio.testing.MockClock,
) -> None:
    first, second = Trace(), Trace()
    for trace in (first, second):
        trace.emit("call", "n1#1", "leases_renew", 3)
    assert first.digest == second.digest
    second.emit("fault", "pause n1")
    assert first.digest != second.digest
    await trio.lowlevel.checkpoint()


async def test_a_dead_letter_is_judged_by_the_attempt_the_ledger_dead_lettered() -> None:
    params = _params()
    sinks = Sinks(Trace())
    permanent = _delivery(0, late_s=0.1, node="n2")
    permanent.fate = "permanent"
    # After an unfenced region failover, the old region ran a second attempt of its own on
    # the old primary; the new primary dead-lettered attempt 1.
    elsewhere = _delivery(0, late_s=500.0)
    elsewhere.attempt = 2
    for delivery in (permanent, elsewhere):
        sinks.started(delivery)
    dead = _execution(0, ExecutionStatus.DEAD_LETTER, attempt=1)
    checker = FireChecker(params, _expect(0), DelayBound(params, [(0.0, 1000.0)]), sinks)
    assert not any("dead-lettered" in v for v in checker.check([dead]).violations)
