"""Handlers: what an execution *does* — a webhook, a Python function, a command, or nothing.

:mod:`engine.handlers.base` holds the contract (its docstrings are the specification);
:func:`build_handler` is the one registry. Each kind lives in its own module.
"""

from engine.handlers.base import (
    ExecutionContext,
    Handler,
    HandlerOptions,
    HandlerResult,
    OutcomeKind,
)
from engine.handlers.registry import HANDLER_KINDS, build_handler

__all__ = [
    "HANDLER_KINDS",
    "ExecutionContext",
    "Handler",
    "HandlerOptions",
    "HandlerResult",
    "OutcomeKind",
    "build_handler",
]
