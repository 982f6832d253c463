"""The dispatcher's token bucket: rate, burst, and a burst paced over a smoothing window."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.core.dispatch import TOKEN_WAIT_MIN_S, idle_wait_s
from engine.core.token_bucket import ADMIT_TOLERANCE_S, TokenBucket

rates = st.floats(0.5, 5_000, allow_nan=False, allow_infinity=False)
bursts = st.integers(1, 50)
windows = st.sampled_from([0.0, 0.01, 0.5, 2.0])
steps = st.lists(st.tuples(st.floats(0, 0.05), st.integers(1, 3)), min_size=1, max_size=150)


def drive(bucket: TokenBucket, attempts: list[tuple[float, int]]) -> list[tuple[float, int]]:
    """Try ``take(n)`` after each pause; return the admissions as (instant, n)."""
    now, admitted = 100.0, []
    for pause_s, n in attempts:
        now += pause_s
        n = min(n, bucket.burst)
        if bucket.take(now, n):
            admitted.append((now, n))
    return admitted


def drain_backlog(bucket: TokenBucket, items: int, *, start_s: float = 0.0) -> list[float]:
    """Admit ``items`` one at a time, each as soon as the bucket allows: the admission instants."""
    now, instants = start_s, []
    for _ in range(items):
        now += bucket.wait_s(now)
        assert bucket.take(now)
        instants.append(now)
    return instants


def test_a_full_bucket_admits_the_burst_at_once_then_one_per_interval() -> None:
    bucket = TokenBucket(rate_per_s=10, burst=5)
    assert [bucket.take(0.0) for _ in range(6)] == [True] * 5 + [False]
    assert bucket.wait_s(0.0) == pytest.approx(0.1)
    assert not bucket.take(0.09)
    assert bucket.take(0.1)
    assert bucket.available(0.1) == pytest.approx(0.0)
    assert bucket.available(10.0) == 5


def test_a_refused_take_changes_nothing() -> None:
    bucket = TokenBucket(rate_per_s=1, burst=2)
    assert bucket.take(0.0, 2)
    before = bucket.wait_s(0.5)
    assert not bucket.take(0.5)
    assert bucket.wait_s(0.5) == before == pytest.approx(0.5)


@given(rates, bursts, windows, steps)
def test_waking_after_wait_s_always_succeeds(
    rate: float, burst: int, window: float, attempts: list[tuple[float, int]]
) -> None:
    bucket = TokenBucket(rate, burst, smoothing_window_s=window)
    drive(bucket, attempts[:-1])
    now, n = 200.0 + attempts[-1][0], min(attempts[-1][1], burst)
    wait = bucket.wait_s(now, n)
    assert wait >= 0
    assert bucket.take(now + wait, n)


@given(rates, bursts, windows, steps)
def test_admissions_in_any_interval_stay_within_burst_plus_rate_times_length(
    rate: float, burst: int, window: float, attempts: list[tuple[float, int]]
) -> None:
    admitted = drive(TokenBucket(rate, burst, smoothing_window_s=window), attempts)
    for i, (first_s, _) in enumerate(admitted):
        total = 0
        for last_s, n in admitted[i:]:
            total += n
            assert total <= burst + rate * (last_s - first_s + ADMIT_TOLERANCE_S) + 1e-9


@given(rates, bursts, st.sampled_from([0.01, 0.5, 2.0]), steps)
def test_with_smoothing_admissions_never_outpace_rate_plus_burst_per_window(
    rate: float, burst: int, window: float, attempts: list[tuple[float, int]]
) -> None:
    bucket = TokenBucket(rate, burst, smoothing_window_s=window)
    pace = rate + burst / window
    assert bucket.pace_per_s == pytest.approx(pace)
    admitted = drive(bucket, attempts)
    for i, (first_s, _) in enumerate(admitted):
        total = 0
        for last_s, n in admitted[i:]:
            total += n
            # The last batch may start the moment the pacer is free: n_last + pace * length.
            assert total - n <= pace * (last_s - first_s + ADMIT_TOLERANCE_S) + 1e-9


@pytest.mark.parametrize("window_s", [0.0, 1.0])
def test_a_burst_of_10000_at_1000_per_s_is_spread_within_10_percent_of_the_rate(
    window_s: float,
) -> None:
    bucket = TokenBucket(rate_per_s=1_000, burst=100, smoothing_window_s=window_s)
    instants = drain_backlog(bucket, 10_000)
    overall_per_s = len(instants) / instants[-1]
    assert 900 <= overall_per_s <= 1_100
    assert instants[-1] == pytest.approx((10_000 - 100) / 1_000, rel=1e-3)
    # After the burst allowance is spent the backlog flows at the rate itself.
    steady = [s for s in instants if 5.0 <= s < 6.0]
    assert abs(len(steady) - 1_000) <= 1


def test_smoothing_spreads_the_burst_over_the_window_on_top_of_the_rate() -> None:
    rate, burst, window = 100.0, 100, 1.0
    paced = drain_backlog(TokenBucket(rate, burst, smoothing_window_s=window), 1_000)
    plain = drain_backlog(TokenBucket(rate, burst), 1_000)
    assert sum(1 for s in plain if s == 0.0) == burst  # released at once
    assert sum(1 for s in paced if s == 0.0) == 1
    # Paced at rate + burst/window = 200/s while the bucket drains over the window...
    assert abs(sum(1 for s in paced if s < window) - 200) <= 1
    spacings = [b - a for a, b in itertools.pairwise(paced)]
    assert min(spacings) >= 1 / 200 - ADMIT_TOLERANCE_S
    # ...then at the rate; both finish the backlog together.
    assert abs(sum(1 for s in paced if 5.0 <= s < 6.0) - 100) <= 1
    assert paced[-1] == pytest.approx(plain[-1], abs=0.02)


def test_a_clock_stepping_back_admits_nothing_extra() -> None:
    bucket = TokenBucket(rate_per_s=10, burst=3)
    assert bucket.take(10.0, 3)
    assert not bucket.take(5.0)
    assert bucket.wait_s(5.0) == pytest.approx(5.1)
    assert bucket.take(10.1)


def test_the_same_calls_give_the_same_admissions() -> None:
    attempts = [(0.001 * (i % 7), 1 + i % 3) for i in range(500)]
    first = drive(TokenBucket(300, 10, smoothing_window_s=0.2), attempts)
    second = drive(TokenBucket(300, 10, smoothing_window_s=0.2), attempts)
    assert first == second


@pytest.mark.parametrize(
    ("rate", "burst", "window"),
    [(0, 1, 0.0), (-1, 1, 0.0), (float("inf"), 1, 0.0), (1, 0, 0.0), (1, 1, -1.0), (1, 1.5, 0.0)],
)
def test_invalid_settings_are_refused_with_their_name(
    rate: float, burst: int, window: float
) -> None:
    with pytest.raises(ValueError, match="token bucket"):
        TokenBucket(rate, burst, smoothing_window_s=window)


def test_taking_more_than_the_burst_at_once_is_refused_as_a_bug() -> None:
    bucket = TokenBucket(rate_per_s=10, burst=3)
    with pytest.raises(ValueError, match="burst=3"):
        bucket.take(0.0, 4)
    with pytest.raises(ValueError, match="burst=3"):
        bucket.wait_s(0.0, 0)


# -- the dispatch loop's sleep between pops (engine.core.dispatch.idle_wait_s) -----------------


def test_a_token_that_came_since_the_pop_is_taken_at_once_not_after_the_fallback() -> None:
    """The pop found no token; by the time the loop asks how long to sleep, the bucket's
    wait is 0 (real time moved on). Sleeping the fallback interval there stopped a paced
    200,000 burst for 4-5 s several times per run, every worker idle."""
    assert idle_wait_s(fallback_s=5.0, next_due_in_s=None, token_wait_s=0.0) == TOKEN_WAIT_MIN_S
    assert idle_wait_s(fallback_s=5.0, next_due_in_s=-1.0, token_wait_s=0.0) == TOKEN_WAIT_MIN_S


def test_a_pop_held_back_by_the_bucket_sleeps_until_its_token() -> None:
    assert idle_wait_s(fallback_s=5.0, next_due_in_s=None, token_wait_s=0.02) == 0.02
    assert idle_wait_s(fallback_s=5.0, next_due_in_s=0.01, token_wait_s=0.02) == 0.01


def test_an_idle_loop_with_a_rate_sleeps_until_the_next_instant_or_the_fallback() -> None:
    """Not held back by the bucket (``None``): its full bucket is no reason to wake."""
    assert idle_wait_s(fallback_s=5.0, next_due_in_s=None, token_wait_s=None) == 5.0
    assert idle_wait_s(fallback_s=5.0, next_due_in_s=2.5, token_wait_s=None) == 2.5
    # Due but not popped (a cap, the room): a nudge wakes it, not a spin.
    assert idle_wait_s(fallback_s=5.0, next_due_in_s=-0.5, token_wait_s=None) == 5.0
