"""Retrying ledger calls while the database is unavailable, with bounded backoff."""

from __future__ import annotations

import logging
import random
from collections.abc import Awaitable, Callable
from typing import TypeVar

import trio

from engine.core.backoff import Backoff
from engine.errors import LedgerUnavailable

T = TypeVar("T")

LEDGER_BACKOFF = Backoff(base_s=0.2, max_s=5.0, jitter=0.3)


async def retry_unavailable(
    call: Callable[[], Awaitable[T]],
    *,
    rng: random.Random,
    log: logging.Logger,
    what: str,
    backoff: Backoff = LEDGER_BACKOFF,
) -> T:
    """``await call()`` until it does not raise :class:`LedgerUnavailable`.

    Other errors propagate. Waits grow from 0.2 s to 5 s; cancellation ends the loop.
    """
    attempt = 0
    while True:
        try:
            return await call()
        except LedgerUnavailable as exc:
            delay = backoff.delay_s(attempt, rng)
            log.warning("%s: ledger unavailable (%s); retrying in %.1f s", what, exc, delay)
            attempt += 1
            await trio.sleep(delay)


async def repeat_every(
    interval_s: float,
    step: Callable[[], Awaitable[object]],
    *,
    log: logging.Logger,
    what: str,
    on_failure: Callable[[], None] = lambda: None,
) -> None:
    """Run ``step`` every ``interval_s`` forever; an unavailable ledger skips one round."""
    while True:
        await trio.sleep(interval_s)
        try:
            await step()
        except LedgerUnavailable as exc:
            on_failure()
            log.warning("%s cut short: %s", what, exc)
