"""The ``noop`` handler: succeed, optionally after a fixed delay — for benchmarks and smoke tests.

Settings: optional ``delay_s`` (default 0) and ``timeout_s`` (default 30 s; a ``delay_s``
beyond it ends as the transient outcome ``timeout``, which makes it handy for testing retries).
The delay is a ``trio.sleep``, so it follows trio's (mock) clock. Without a delay the
handler is *inline* (``engine/handlers/base.py``): it returns at once, never waiting, so the
workers run its attempts in batches.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import msgspec
import trio

from engine.errors import InvalidField
from engine.handlers.base import (
    TIMEOUT_S_DEFAULT,
    ExecutionContext,
    HandlerResult,
    check_timeout_s,
    parse_settings,
    run_with_timeout,
)

_SUCCEEDED: Final = HandlerResult.succeeded()


class NoopSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    delay_s: float = 0.0
    timeout_s: float = TIMEOUT_S_DEFAULT


class NoopHandler:
    """Succeeds after ``delay_s``; build it with :func:`engine.handlers.build_handler`."""

    def __init__(self, settings: Mapping[str, Any]) -> None:
        parsed = parse_settings("noop", settings, NoopSettings)
        if not 0 <= parsed.delay_s <= 3600:
            raise InvalidField(
                f"noop handler: delay_s must be 0-3600 seconds, got {parsed.delay_s}"
            )
        self.timeout_s = check_timeout_s("noop", parsed.timeout_s)
        self.delay_s = parsed.delay_s
        self.inline = parsed.delay_s == 0
        """Returns at once without a checkpoint: the workers may run it in batches."""

    def __repr__(self) -> str:
        return f"NoopHandler(delay_s={self.delay_s!r})"

    async def run(self, context: ExecutionContext) -> HandlerResult:
        if self.delay_s == 0:
            # Nothing to wait for: no deadline, no schedule point (the worker has its own),
            # so a benchmark's noop measures the engine, not this handler.
            return _SUCCEEDED
        return await run_with_timeout(self.timeout_s, self._wait)

    async def _wait(self) -> HandlerResult:
        await trio.sleep(self.delay_s)
        return _SUCCEEDED
