"""Retrying ledger calls while the database is unavailable, with bounded backoff."""

from __future__ import annotations

import functools
import logging
import random
from collections.abc import Awaitable, Callable, Mapping
from typing import TypeVar

import trio

from engine.core.backoff import Backoff
from engine.errors import LeaseLost, LedgerUnavailable
from engine.ledger.params import Fence

T = TypeVar("T")
ItemT = TypeVar("ItemT")

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


async def call_fenced(
    fences: Mapping[int, Fence],
    items: list[ItemT],
    partition_of: Callable[[ItemT], int],
    call: Callable[[list[Fence], list[ItemT]], Awaitable[T]],
    *,
    rng: random.Random,
    log: logging.Logger,
    what: str,
) -> tuple[T | None, list[ItemT], set[int]]:
    """One fenced write of ``items`` under ``fences``: the one shape of every batch write of
    the execution pipeline (claim, skip, renew, complete).

    ``call(fences, items)`` is retried while the ledger is unavailable; when the ledger
    refuses some fences (:class:`LeaseLost`), the items of those partitions are left out and
    the rest written again. Returns the call's result (``None`` when every partition was
    lost), the items it wrote, and the partitions found lost. Items of partitions missing
    from ``fences`` must be left out by the caller.
    """
    fences = dict(fences)
    lost: set[int] = set()
    while items:
        try:
            result = await retry_unavailable(
                functools.partial(call, list(fences.values()), items), rng=rng, log=log, what=what
            )
        except LeaseLost as exc:
            refused = set(exc.partitions)
            lost |= refused
            fences = {p: f for p, f in fences.items() if p not in refused}
            items = [item for item in items if partition_of(item) not in refused]
            continue
        return result, items, lost
    return None, [], lost
