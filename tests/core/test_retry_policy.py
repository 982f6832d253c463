"""Retry decisions by outcome class."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from engine.core.retry_policy import RetryPolicy, decide

NOW = datetime(2026, 1, 1, tzinfo=UTC)


class NoJitter:
    def random(self) -> float:
        return 0.0


POLICY = RetryPolicy(max_attempts=5, backoff_base_s=1, backoff_max_s=60)


def test_success_and_permanent_failures_end_at_once() -> None:
    assert decide("succeeded", 1, POLICY, NOW, NoJitter()).outcome == "succeeded"
    assert decide("permanent", 1, POLICY, NOW, NoJitter()).outcome == "dead-letter"


def test_transient_failures_back_off_exponentially_then_dead_letter() -> None:
    delays = [
        (decide("transient", n, POLICY, NOW, NoJitter()).not_before or NOW) - NOW
        for n in range(1, 5)
    ]
    assert delays == [timedelta(seconds=s) for s in (1, 2, 4, 8)]
    assert decide("transient", 5, POLICY, NOW, NoJitter()).outcome == "dead-letter"


def test_retry_after_is_honoured_when_longer_than_the_backoff() -> None:
    decision = decide("transient", 1, POLICY, NOW, NoJitter(), retry_after_s=30)
    assert decision.not_before == NOW + timedelta(seconds=30)
    capped = decide("transient", 1, POLICY, NOW, NoJitter(), retry_after_s=10**9)
    assert capped.not_before == NOW + timedelta(hours=1)


def test_unknown_failures_get_fewer_attempts() -> None:
    assert decide("unknown", 2, POLICY, NOW, NoJitter()).outcome == "failed"
    assert decide("unknown", 3, POLICY, NOW, NoJitter()).outcome == "dead-letter"
