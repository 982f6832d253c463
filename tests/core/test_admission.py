"""Admission into the execution pipeline: liveness, bounds and exact release, by property."""

from __future__ import annotations

import contextlib
import functools
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.core.admission import (
    AttemptTicket,
    HandoffSizer,
    TicketReleaseError,
    capacity_for,
    claim_size,
    claim_threshold,
)

capacities = st.integers(min_value=0, max_value=5_000)
batches = st.integers(min_value=1, max_value=1_000)


@given(capacity=capacities.filter(lambda c: c >= 1), batch_max=batches)
def test_with_nothing_in_flight_something_is_always_admitted(capacity: int, batch_max: int) -> None:
    assert claim_size(capacity=capacity, in_flight=0, batch_max=batch_max) >= 1


@given(capacity=capacities, in_flight=st.integers(0, 6_000), batch_max=batches)
def test_admission_never_exceeds_the_room_nor_a_batch(
    capacity: int, in_flight: int, batch_max: int
) -> None:
    size = claim_size(capacity=capacity, in_flight=in_flight, batch_max=batch_max)
    assert 0 <= size <= max(capacity - in_flight, 0)
    assert size <= batch_max


@given(
    capacity=capacities.filter(lambda c: c >= 1), in_flight=st.integers(0, 6_000), batch_max=batches
)
def test_the_threshold_says_exactly_when_a_claim_would_go_out(
    capacity: int, in_flight: int, batch_max: int
) -> None:
    """What a slot given back compares with instead of sizing a claim."""
    threshold = claim_threshold(capacity, batch_max)
    would_claim = claim_size(capacity=capacity, in_flight=in_flight, batch_max=batch_max) > 0
    assert would_claim == (in_flight <= threshold or in_flight == 0)


@given(capacity=capacities.filter(lambda c: c >= 4), batch_max=batches)
def test_a_claim_waits_only_for_a_round_trips_worth(capacity: int, batch_max: int) -> None:
    worth = min(batch_max, capacity // 4)
    # One short of a round trip's worth free: wait; that much free: go.
    assert claim_size(capacity=capacity, in_flight=capacity - worth + 1, batch_max=batch_max) == 0
    assert claim_size(capacity=capacity, in_flight=capacity - worth, batch_max=batch_max) >= worth


@given(
    workers=st.integers(1, 2_000),
    handoff_max=st.integers(0, 5_000),
    durations=st.lists(
        st.tuples(st.floats(-10, 1e9, allow_nan=False), st.floats(0.001, 86_400)), max_size=200
    ),
)
def test_capacity_stays_between_twice_the_workers_and_its_maximum(
    workers: int, handoff_max: int, durations: list[tuple[float, float]]
) -> None:
    sizer = HandoffSizer(workers, handoff_max, 1.0)
    for duration_s, timeout_s in durations:
        sizer.observe(duration_s, timeout_s)
        assert 0.0 <= sizer.duration_s <= max(1.0, max(t for _, t in durations))
        assert 2 * workers <= sizer.capacity <= sizer.capacity_max


@given(
    workers=st.integers(1, 2_000),
    handoff_max=st.integers(0, 5_000),
    handoff_wait_s=st.floats(0.0, 60.0),
    durations=st.lists(
        st.tuples(st.floats(-10, 1e9, allow_nan=False), st.floats(-1.0, 86_400)), max_size=200
    ),
)
def test_the_capacity_is_always_that_of_the_moving_average(
    workers: int,
    handoff_max: int,
    handoff_wait_s: float,
    durations: list[tuple[float, float]],
) -> None:
    """observe() works the capacity out in line, once per execution; it is exactly what the
    formula says of the average it leaves, and what it returns."""
    sizer = HandoffSizer(workers, handoff_max, handoff_wait_s)
    assert sizer.capacity == capacity_for(
        workers, sizer.handoff_max, handoff_wait_s, sizer.duration_s
    )
    average = sizer.duration_s
    for duration_s, timeout_s in durations:
        returned = sizer.observe(duration_s, timeout_s)
        clamped = min(max(duration_s, 0.0), max(timeout_s, 0.0))
        average += 0.05 * (clamped - average)
        assert sizer.duration_s == average
        assert returned == sizer.capacity
        assert sizer.capacity == capacity_for(workers, sizer.handoff_max, handoff_wait_s, average)


def test_a_freeze_adds_at_most_one_timeout_to_the_average() -> None:
    sizer = HandoffSizer(8, 1_000, 1.0)
    for _ in range(200):
        sizer.observe(0.01, 30.0)
    fast = sizer.capacity
    sizer.observe(3_600.0, 30.0)  # an attempt in flight across an hour-long SIGSTOP
    assert sizer.duration_s < 0.01 + 0.05 * 30.0 + 1e-9
    for _ in range(200):
        sizer.observe(0.01, 30.0)
    assert abs(sizer.capacity - fast) <= fast // 100  # recovered


@settings(max_examples=200)
@given(
    capacity_steps=st.lists(st.integers(1, 2_000), min_size=1, max_size=50),
    batch_max=batches,
)
def test_a_pipeline_that_asks_at_every_release_never_waits_with_nothing_in_flight(
    capacity_steps: list[int], batch_max: int
) -> None:
    """The stall this replaced, as a model: slots are given back one by one while the
    capacity changes between any two releases (handlers turning slow or fast); after every
    release, admission is asked anew. Whatever the capacities, it never ends with work
    waiting, nothing in flight and nothing admitted."""
    in_flight = 0
    backlog = 10_000
    for capacity in capacity_steps:
        size = min(claim_size(capacity=capacity, in_flight=in_flight, batch_max=batch_max), backlog)
        in_flight += size
        backlog -= size
        while in_flight:  # every attempt in flight finishes, one at a time
            in_flight -= 1
            size = claim_size(capacity=capacity, in_flight=in_flight, batch_max=batch_max)
            if size and backlog:
                break
        assert not (backlog and in_flight == 0 and claim_size(
            capacity=capacity, in_flight=0, batch_max=batch_max) == 0)  # fmt: skip


resources = st.sampled_from(["open", "slot", "limits", "dispatching", "overlap", "in_flight"])


@given(
    taken=st.lists(resources, unique=True, min_size=1),
    early=st.lists(resources),
    failing=st.sets(resources),
    closes=st.integers(1, 3),
)
def test_every_resource_a_ticket_holds_is_released_exactly_once(
    taken: list[str], early: list[str], failing: set[str], closes: int
) -> None:
    """Conservation: stages release some resources early (some more than once), the holder
    closes the ticket (perhaps again), and some release functions raise; every resource is
    still given back exactly once."""
    released: Counter[str] = Counter()
    ticket = AttemptTicket("execution")

    def give_back(name: str, given: AttemptTicket[str]) -> None:
        assert given is ticket  # a release function is told whose resource it gets back
        released[name] += 1
        if name in failing:
            raise RuntimeError(f"{name} release failed")

    for name in taken:
        ticket.hold(name, functools.partial(give_back, name))
    for name in early:
        with contextlib.suppress(RuntimeError):
            ticket.release(name)
    for _ in range(closes):
        with contextlib.suppress(TicketReleaseError):
            ticket.close()
    assert ticket.closed
    assert released == Counter(taken)


def test_a_resource_cannot_be_held_twice() -> None:
    ticket = AttemptTicket("execution")
    ticket.hold("slot", lambda _: None)
    with pytest.raises(ValueError, match="held already"):
        ticket.hold("slot", lambda _: None)


def test_close_gives_back_the_last_taken_first() -> None:
    order: list[str] = []
    ticket = AttemptTicket("execution")
    for name in ("open", "slot", "limits"):
        ticket.hold(name, lambda _, name=name: order.append(name))
    ticket.close()
    assert order == ["limits", "slot", "open"]


def test_a_ticket_made_holding_resources_holds_them_as_if_taken_in_that_order() -> None:
    order: list[str] = []
    taken = {name: (lambda _, name=name: order.append(name)) for name in ("open", "slot")}
    ticket = AttemptTicket("execution", taken)
    ticket.hold("limits", lambda _: order.append("limits"))
    assert ticket.held == ("open", "slot", "limits")
    with pytest.raises(ValueError, match="held already"):
        ticket.hold("slot", lambda _: None)
    assert ticket.release("slot")
    ticket.close()
    assert order == ["slot", "limits", "open"]
    assert taken.keys() == {"open", "slot"}  # the mapping it was made from is its own


def test_hold_each_holds_a_resource_on_every_ticket_of_a_batch_once() -> None:
    released: list[str] = []
    tickets = [AttemptTicket(f"execution-{n}") for n in range(3)]
    AttemptTicket.hold_each(tickets, "in_flight", lambda ticket: released.append(ticket.item))
    assert [ticket.held for ticket in tickets] == [("in_flight",)] * 3
    with pytest.raises(ValueError, match="held already"):
        AttemptTicket.hold_each(tickets[2:], "in_flight", lambda _: None)
    for ticket in tickets:
        ticket.close()
        ticket.close()
    assert released == ["execution-0", "execution-1", "execution-2"]
