"""What a handler's outcome means for its execution: done, retry later, or dead letter.

* ``succeeded`` -> succeeded.
* ``permanent`` (a 4xx, a validation error) -> dead letter at once: retrying cannot help.
* ``transient`` (timeouts, 429, 5xx, connection errors) -> retry after
  ``min(backoff_max_s, backoff_base_s * 2**(attempt - 1))`` plus jitter -- or after the
  server's ``Retry-After`` when it asked for longer -- until ``max_attempts`` attempts were
  made; then dead letter.
* ``unknown`` (an unexpected exception, a non-zero exit) -> retried like transient but at most
  ``UNKNOWN_ATTEMPTS_MAX`` attempts in all, since an unknown failure is likely to repeat.

Pure: the caller passes the attempt number, the current time and a random source.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Final

import msgspec

from engine.core.backoff import Backoff, RandomSource

UNKNOWN_ATTEMPTS_MAX: Final = 3
RETRY_AFTER_S_MAX: Final = 3600.0
"""A server's Retry-After is honoured up to an hour; beyond that the backoff cap applies."""
ATTEMPT_OVERRUN_S: Final = 5.0
"""How long past its timeout an attempt may still run before its worker gives it up (the
workers' ``TIMEOUT_GRACE_S``)."""
REDELIVERY_S: Final = 65.0
"""How late the next attempt of a crashed one may start: the default attempt lease (60 s)
plus the redeliverer's interval (5 s)."""


class RetryPolicy(msgspec.Struct, frozen=True):
    max_attempts: int = 5
    backoff_base_s: float = 1.0
    backoff_max_s: float = 60.0
    jitter: float = 0.2


class Decision(msgspec.Struct, frozen=True):
    outcome: str
    """``succeeded``, ``failed`` (retry at ``not_before``) or ``dead-letter``."""
    not_before: datetime | None = None


def retry_horizon_s(policy: RetryPolicy, timeout_s: float) -> float:
    """The longest an execution's attempts may keep coming, from its first start to the end
    of its last: ``max_attempts`` attempts of up to ``timeout_s`` plus the overrun allowed and
    a redelivery's delay each, and every backoff at its longest (jitter included).

    A once-only publisher keeps an execution's deduplication record at least this long, so
    every retry and redelivery of the execution finds it. Not covered: a queue backlog that
    delays a retry's start beyond its instant, a node run with an attempt lease longer than
    the default, and a dead letter replayed later (``docs/targets.md``).
    """
    backoff = Backoff(
        base_s=policy.backoff_base_s, max_s=policy.backoff_max_s, jitter=policy.jitter
    )
    waits = sum(
        min(backoff.max_s, backoff.base_s * backoff.multiplier ** min(k, 64))
        for k in range(policy.max_attempts - 1)
    )
    per_attempt = timeout_s + ATTEMPT_OVERRUN_S + REDELIVERY_S
    return policy.max_attempts * per_attempt + waits * (1 + policy.jitter)


def decide(
    kind: str,
    attempt: int,
    policy: RetryPolicy,
    now: datetime,
    rng: RandomSource,
    *,
    retry_after_s: float | None = None,
) -> Decision:
    """The fate of attempt number ``attempt`` (1-based) that ended with outcome ``kind``."""
    if kind == "succeeded":
        return Decision("succeeded")
    if kind == "permanent":
        return Decision("dead-letter")
    limit = (
        policy.max_attempts
        if kind == "transient"
        else min(policy.max_attempts, UNKNOWN_ATTEMPTS_MAX)
    )
    if attempt >= limit:
        return Decision("dead-letter")
    backoff = Backoff(
        base_s=policy.backoff_base_s, max_s=policy.backoff_max_s, jitter=policy.jitter
    )
    delay_s = backoff.delay_s(attempt - 1, rng)
    if retry_after_s is not None:
        delay_s = max(delay_s, min(retry_after_s, RETRY_AFTER_S_MAX))
    return Decision("failed", now + timedelta(seconds=delay_s))
