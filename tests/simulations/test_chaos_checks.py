"""The chaos checkers on hand-made records: they catch what they claim to catch."""

from __future__ import annotations

from datetime import UTC, datetime

from engine.model import execution_id as engine_execution_id
from simulations.chaos.audit import ExecutionWrite, LeaseChange, LedgerExecution
from simulations.chaos.checks import (
    AttemptLease,
    Figure,
    Freeze,
    attempt_leases,
    check_fires,
    check_handler_starts,
    fence_violations,
    lease_epochs,
)
from simulations.chaos.postgres import free_port
from simulations.chaos.workload import ScheduleSpec, execution_id, parse_execution_id
from simulations.chaos.zombie import ZombieRecord, check_zombie

T0 = 1_800_000_000  # a multiple of 60
SPEC = ScheduleSpec("chaos-00001", "acme", "Asia/Kolkata", 10)


def _verdicts(figures: list[Figure]) -> dict[str, bool | None]:
    return {figure.name: figure.ok for figure in figures}


def test_execution_ids_are_built_like_the_engines_and_parse_back() -> None:
    instant = datetime.fromtimestamp(T0, UTC)
    assert execution_id(SPEC.schedule_id, T0) == engine_execution_id(SPEC.schedule_id, instant)
    assert parse_execution_id(execution_id(SPEC.schedule_id, T0)) == (SPEC.schedule_id, T0)
    assert parse_execution_id("no-instant") is None


def test_fires_are_every_period_on_utc_multiples() -> None:
    assert list(SPEC.fires(T0 - 5, T0 + 25)) == [T0, T0 + 10, T0 + 20]
    assert SPEC.is_fire(T0 + 30)
    assert not SPEC.is_fire(T0 + 31)


def _succeeded(instant: int) -> LedgerExecution:
    key = execution_id(SPEC.schedule_id, instant)
    return LedgerExecution(key, SPEC.schedule_id, instant, "succeeded", 1, "node-1", instant)


def test_check_fires_reports_misses_duplicate_effects_and_late_starts() -> None:
    window = (float(T0), float(T0 + 40))
    # T0 + 20 never succeeded; T0 + 30 succeeded but never reached the sink.
    executions = [_succeeded(T0), _succeeded(T0 + 10), _succeeded(T0 + 30)]
    odd_key = f"{SPEC.schedule_id}:{datetime.fromtimestamp(T0 + 20, UTC).isoformat()}"
    deliveries: list[tuple[float, str, int, int, float | None]] = [
        (T0 + 0.1, execution_id(SPEC.schedule_id, T0), 1, 1, None),
        (T0 + 0.5, execution_id(SPEC.schedule_id, T0), 2, 2, None),  # a duplicate delivery
        (T0 + 45.0, execution_id(SPEC.schedule_id, T0 + 10), 1, 1, None),  # late
        (T0 + 20.1, execution_id(SPEC.schedule_id, T0 + 20), 1, 1, None),
        (T0 + 20.2, odd_key, 1, 1, None),  # the same fire under a second key: a second effect
        (T0 + 3.0, execution_id(SPEC.schedule_id, T0 + 3), 1, 1, None),  # no such fire
    ]
    figures, details = check_fires([SPEC], window, T0 - 60, executions, deliveries, 30.0)
    verdicts = _verdicts(figures)
    assert verdicts["missing: no succeeded execution"] is False
    assert details["not_succeeded"] == [execution_id(SPEC.schedule_id, T0 + 20)]
    assert details["not_delivered"] == [execution_id(SPEC.schedule_id, T0 + 30)]
    assert verdicts["duplicate effects (of every key received)"] is False
    assert verdicts["unexpected effects (no such fire)"] is False
    assert details["late"] == [execution_id(SPEC.schedule_id, T0 + 10)]
    assert verdicts["early starts (first delivery before planned)"] is True
    assert details["deliveries"] == 4  # in the window, under the expected keys
    assert details["effects"] == 3
    assert details["keys_received"] == 5


def _lease(
    partition: int, owner: str | None, token: int, at: float, ttl: float = 5.0
) -> LeaseChange:
    expires = None if owner is None else at + ttl
    return LeaseChange(partition, owner, token, expires, at, at)


def _write(token: int, at: float, status: str = "succeeded", by: str = "a") -> ExecutionWrite:
    return ExecutionWrite("x:1", 0, "running", status, 1, token, by, at, at)


def test_fencing_flags_writes_after_expiry_or_takeover_and_unknown_tokens() -> None:
    history = [
        _lease(0, "a", 1, 100.0),
        _lease(0, "a", 1, 102.0),  # renewed: valid until 107
        _lease(0, "b", 2, 108.0),  # taken over after expiry
        _lease(0, None, 2, 110.0),  # released by b: its epoch still ends at expiry (113)
    ]
    epochs = lease_epochs(history)
    assert epochs[(0, 1)].valid_until == 107.0
    writes = [
        _write(1, 106.9),
        _write(1, 107.5),  # after expiry
        _write(2, 111.0, by="b"),  # after the release, before the expiry: a valid snapshot
        _write(7, 101.0),  # a token never issued
        _write(2, 109.0, status="running", by="a"),  # claimed for a under b's lease
    ]
    outside, unattributed = fence_violations(writes, epochs)
    assert [w.at for w in outside] == [107.5, 109.0]
    assert [w.fencing_token for w in unattributed] == [7]


def test_the_zombie_check_catches_a_completion_accepted_under_a_stale_token() -> None:
    epochs = lease_epochs([_lease(0, "z", 1, 100.0, ttl=30.0), _lease(0, "b", 2, 110.0)])
    zombie = ZombieRecord("z", 105.0, 115.0, {0: 1}, {"expired": 0.0}, {"expired": 1.0})
    stale = ExecutionWrite("x:1", 0, "running", "succeeded", 1, 1, "z", 116.0, 116.0)
    figures, _ = check_zombie(zombie, epochs, [stale], [])
    verdicts = _verdicts(figures)
    assert verdicts["zombie: partitions taken over during the pause"] is True
    assert verdicts["zombie: stale writes accepted"] is False
    assert verdicts["zombie: completions accepted after takeover"] is False
    assert verdicts["zombie: lease losses counted after SIGCONT"] is True


def test_requests_sent_after_their_attempt_lease_are_violations_unless_in_flight_at_a_freeze() -> (
    None
):
    key = execution_id(SPEC.schedule_id, T0)
    other = execution_id(SPEC.schedule_id, T0 + 10)
    writes = [
        ExecutionWrite(key, 0, "queued", "running", 1, 1, "z", 100.0, 100.0, 105.0),  # claim
        ExecutionWrite(key, 0, "running", "running", 1, 1, "z", 101.0, 101.0, 106.0),  # renew
        ExecutionWrite(key, 0, "running", "queued", 1, 2, "b", 107.0, 107.0, None),  # requeue
        ExecutionWrite(key, 0, "queued", "running", 2, 2, "b", 107.5, 107.5, 112.5),
        ExecutionWrite(other, 0, "queued", "running", 1, 2, "b", 110.0, 110.0, 115.0),
    ]
    attempts = attempt_leases(writes)
    assert attempts[(key, 1)] == AttemptLease("z", 106.0)
    assert attempts[(key, 2)] == AttemptLease("b", 112.5)
    epochs = lease_epochs([_lease(0, "z", 1, 100.0), _lease(0, "b", 2, 106.0)])  # z's: to 105
    deliveries: list[tuple[float, str, int, int, float | None]] = [
        (109.5, key, 1, 1, 104.0),  # signed inside its lease, frozen on its way: fine
        (109.6, key, 1, 1, 109.0),  # begun before z froze, signed once it woke up
        (108.0, key, 2, 2, 108.0),  # the new owner's attempt
        (116.0, other, 1, 2, 116.0),  # b started it after its attempt lease ran out
    ]
    freeze = Freeze("z", 109.2, in_flight_max=1)
    figures, details = check_handler_starts(
        deliveries, attempts, {key: 0, other: 0}, epochs, freeze
    )
    verdicts = _verdicts(figures)
    assert verdicts["handlers started after their attempt lease ran out"] is False
    assert [row[1] for row in details["sent_after_attempt_lease"]] == [other]  # type: ignore[attr-defined]
    assert verdicts["late requests of the frozen node (begun before)"] is True
    frozen = Freeze("z", 109.2, in_flight_max=0)
    figures, _ = check_handler_starts(deliveries, attempts, {key: 0, other: 0}, epochs, frozen)
    assert _verdicts(figures)["late requests of the frozen node (begun before)"] is False


def test_free_ports_are_never_handed_out_twice_in_one_process() -> None:
    # A replicated pair picks both servers' ports before either listens; the kernel once
    # offered the same closed port twice and the standby could not bind.
    ports = [free_port() for _ in range(200)]
    assert len(set(ports)) == len(ports)
