"""Functions the ``python`` handler tests call by import path."""

from __future__ import annotations

import threading
from typing import Any

import trio

from engine import PermanentError, TransientError
from engine.handlers import ExecutionContext

calls: list[tuple[str, str, int]] = []
not_callable = 42


def sync_ok(context: ExecutionContext) -> str:
    calls.append(("sync", context.execution_id, threading.get_ident()))
    return "ignored"


async def async_ok(context: ExecutionContext) -> None:
    await trio.lowlevel.checkpoint()
    calls.append(("async", context.execution_id, threading.get_ident()))


def raises_transient(context: ExecutionContext) -> None:
    raise TransientError("upstream busy", retry_after_s=12.5)


async def raises_permanent(context: ExecutionContext) -> None:
    raise PermanentError("customer account closed")


class QuotaExceeded(TransientError):
    pass


def raises_transient_subclass(context: ExecutionContext) -> None:
    raise QuotaExceeded("quota")


def raises_value_error(context: ExecutionContext) -> None:
    raise ValueError("bad payload: " + "x" * 5000)


async def sleeps_forever(context: ExecutionContext) -> None:
    await trio.sleep_forever()


class AsyncCallable:
    async def __call__(self, context: ExecutionContext) -> None:
        await trio.lowlevel.checkpoint()
        calls.append(("object", context.execution_id, threading.get_ident()))


async_object = AsyncCallable()


def _wrapped(context: ExecutionContext) -> Any:
    return async_ok(context)


plain_wrapper_of_coroutine = _wrapped
"""A plain function returning a coroutine, as a careless decorator produces."""


def sync_exits(context: ExecutionContext) -> None:
    raise SystemExit(2)


async def async_exits(context: ExecutionContext) -> None:
    raise SystemExit("bye")


async def async_interrupts(context: ExecutionContext) -> None:
    raise KeyboardInterrupt
