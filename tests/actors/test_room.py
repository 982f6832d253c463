"""The room of the execution pipeline: attempts admitted a popped batch at a time, and the
claim threshold each slot given back compares with, kept to the capacity of the moment."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.actors.attempts import DISPATCHING, LIMITS, OPEN, SLOT, Attempt, Room
from engine.core.admission import HandoffSizer
from engine.model import Execution


def _executions(count: int) -> list[Execution]:
    at = datetime(2026, 3, 2, tzinfo=UTC)
    return [
        Execution(
            execution_id=f"e{n}",
            schedule_id=f"s{n}",
            tenant_id="acme",
            task_type="noop",
            planned_at=at,
            partition_id=n % 4,
        )
        for n in range(count)
    ]


def test_a_popped_batch_is_admitted_as_one_attempt_each_holding_its_resources_in_order() -> None:
    room = Room(HandoffSizer(4, 8, 1.0), 500)
    released: list[tuple[str, str]] = []

    def limits(attempt: Attempt) -> None:
        released.append((LIMITS, attempt.execution.execution_id))

    def dispatching(attempt: Attempt) -> None:
        released.append((DISPATCHING, attempt.execution.execution_id))

    also = {LIMITS: limits, DISPATCHING: dispatching}
    executions = _executions(3)
    attempts = room.admit_each(executions, also)
    assert [attempt.execution for attempt in attempts] == executions
    assert [attempt.partition_id for attempt in attempts] == [0, 1, 2]
    assert all(attempt.held == (OPEN, SLOT, LIMITS, DISPATCHING) for attempt in attempts)
    assert room.in_flight == 3
    assert room.open == set(attempts)
    assert room.admit_each([], also) == []

    attempts[0].release(DISPATCHING)  # claimed
    attempts[0].run_ended()
    assert attempts[0].held == (OPEN,)
    assert attempts[1].held == (OPEN, SLOT, LIMITS, DISPATCHING)  # each holds its own
    for attempt in attempts:
        attempt.close()
        attempt.close()
    assert room.in_flight == 0
    assert not room.open
    assert sorted(released) == sorted(
        [(LIMITS, f"e{n}") for n in range(3)] + [(DISPATCHING, f"e{n}") for n in range(3)]
    )


def test_a_batch_cannot_be_admitted_holding_a_room_resource_twice() -> None:
    room = Room(HandoffSizer(4, 8, 1.0), 500)
    with pytest.raises(ValueError, match="held already"):
        room.admit_each(_executions(2), {SLOT: lambda _: None})
    assert room.in_flight == 0
    assert not room.open


@given(
    workers=st.integers(1, 300),
    handoff_max=st.integers(0, 600),
    batch_max=st.integers(1, 500),
    durations=st.lists(st.floats(0.0, 30.0), max_size=60),
)
def test_a_slot_given_back_wakes_the_dispatcher_exactly_when_a_claim_would_go_out(
    workers: int, handoff_max: int, batch_max: int, durations: list[float]
) -> None:
    """Whatever durations were observed (the capacity changing with them, or not), each slot
    given back nudges exactly when the room would admit a claim at that moment."""
    room = Room(HandoffSizer(workers, handoff_max, 1.0), batch_max)
    nudged: list[int] = []
    room.on_room = lambda: nudged.append(room.in_flight)
    for duration_s in durations:
        room.observe(duration_s, 10.0)
    attempts = room.admit_each(_executions(room.sizer.capacity))
    expected = []
    for attempt in attempts:
        attempt.close()
        if room.claim_size() > 0:
            expected.append(room.in_flight)
    assert nudged == expected
    assert room.in_flight == 0
