"""Python handlers used by the execution tests (imported by path, as users' handlers are)."""

from __future__ import annotations

from collections import Counter

from engine.errors import PermanentError, TransientError
from engine.handlers import ExecutionContext

CALLS: Counter[str] = Counter()
"""Attempts seen per execution id (the idempotency key)."""


async def flaky_once(context: ExecutionContext) -> None:
    CALLS[context.execution_id] += 1
    if context.attempt == 1:
        raise TransientError("the downstream service is busy", retry_after_s=2)


def always_bad(context: ExecutionContext) -> None:
    CALLS[context.execution_id] += 1
    raise PermanentError("the payload is invalid")
