"""The ``python`` handler: call a function of the node's Python environment.

Settings: ``callable`` (``"package.module:function"``, or ``"module:Class.method"``) and
optional ``timeout_s`` (default 30 s). The import happens when the handler is built, so a
typo is an :class:`~engine.errors.InvalidField` when the task type is stored, not a failure
at 3 a.m. (importing runs the module's top-level code on the node, once).

The function receives the :class:`~engine.handlers.base.ExecutionContext`:

* returning (any value) → succeeded;
* raising :class:`engine.TransientError` → transient (its ``retry_after_s`` is passed on);
* raising :class:`engine.PermanentError` → permanent;
* raising anything else → unknown, code ``exception:<ClassName>`` -- ``SystemExit``,
  ``KeyboardInterrupt`` and every other ``BaseException`` included: a callable cannot end
  the node (only trio's cancellation propagates).

Python task types run only on a node started with ``--enable-python`` (off by default:
whoever may create a task type could otherwise import and call anything in the node's
environment), and only from the modules ``--python-modules`` names, when it names any.

``async def`` functions run on the node's trio loop and are cancelled at ``timeout_s``.
Plain functions run in a worker thread (``trio.to_thread.run_sync``) with
``abandon_on_cancel=False``: Python cannot interrupt a thread, and abandoning it would leave
an effect running unsupervised, perhaps alongside the next attempt. So a plain function that
overruns ``timeout_s`` keeps its worker slot until it returns, and its real outcome is
reported. Give long-running plain functions their own internal deadlines.
"""

from __future__ import annotations

import importlib
import inspect
import traceback
from collections.abc import Callable, Mapping
from typing import Any

import msgspec
import trio

from engine.errors import InvalidField, PermanentError, TransientError
from engine.handlers.base import (
    ERROR_MESSAGE_CHARS_MAX,
    TIMEOUT_S_DEFAULT,
    ExecutionContext,
    HandlerOptions,
    HandlerResult,
    check_timeout_s,
    is_cancellation,
    parse_settings,
    run_with_timeout,
)

UserFunction = Callable[[ExecutionContext], Any]


class PythonSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    callable: str
    timeout_s: float = TIMEOUT_S_DEFAULT


def check_callable_path(path: str) -> tuple[str, str]:
    """``(module, attribute path)`` of ``"package.module:attribute.path"``, checked for its
    form only (nothing is imported); :class:`InvalidField` naming the expected form."""
    module_name, sep, attribute = path.partition(":")
    if (
        not sep
        or not all(part.isidentifier() for part in module_name.split("."))
        or not all(part.isidentifier() for part in attribute.split("."))
    ):
        raise InvalidField(
            f"python handler: callable {path!r} must look like 'package.module:function'"
        )
    return module_name, attribute


def resolve_callable(path: str) -> UserFunction:
    """Import ``"package.module:attribute.path"``; :class:`InvalidField` when that fails."""
    module_name, attribute = check_callable_path(path)
    try:
        target: Any = importlib.import_module(module_name)
    except Exception as error:
        raise InvalidField(
            f"python handler: cannot import {module_name!r} for callable {path!r}: "
            f"{type(error).__name__}: {error}"
        ) from None
    for part in attribute.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise InvalidField(
                f"python handler: {module_name!r} has no attribute {attribute!r}"
            ) from None
    if not callable(target):
        raise InvalidField(f"python handler: {path!r} is not callable")
    function: UserFunction = target
    return function


class PythonHandler:
    """Calls one function per attempt; build it with :func:`engine.handlers.build_handler`."""

    def __init__(self, settings: Mapping[str, Any], *, options: HandlerOptions) -> None:
        if not options.enable_python:
            raise InvalidField(
                "python handlers are disabled on this node: start it with --enable-python to "
                "allow them (off by default, since a python task type can call any function "
                "of the node's environment)"
            )
        parsed = parse_settings("python", settings, PythonSettings)
        self.timeout_s = check_timeout_s("python", parsed.timeout_s)
        check_module_allowed(parsed.callable, options.python_modules)
        self._path = parsed.callable
        self._function = resolve_callable(parsed.callable)
        self._is_async = inspect.iscoroutinefunction(self._function) or (
            inspect.iscoroutinefunction(type(self._function).__call__)
        )

    def __repr__(self) -> str:
        return f"PythonHandler(callable={self._path!r})"

    async def run(self, context: ExecutionContext) -> HandlerResult:
        return await run_with_timeout(self.timeout_s, lambda: self._call(context))

    async def _call(self, context: ExecutionContext) -> HandlerResult:
        try:
            if self._is_async:
                await self._function(context)
            else:
                # trio refuses (TypeError, so *unknown*) a plain function returning a coroutine.
                await trio.to_thread.run_sync(self._function, context, abandon_on_cancel=False)
        except TransientError as error:
            return HandlerResult.transient(
                _code(error), _message(error), retry_after_s=_retry_after(error)
            )
        except PermanentError as error:
            return HandlerResult.permanent(_code(error), _message(error))
        except BaseException as error:  # SystemExit included: a callable cannot end the node
            if is_cancellation(error):
                raise
            # Keep the origin even when the message is long: it is what finds the bug.
            text = _message(error)[: ERROR_MESSAGE_CHARS_MAX // 2]
            return HandlerResult.unknown(_code(error), text + _origin(error))
        return HandlerResult.succeeded()


def check_module_allowed(path: str, allowed: tuple[str, ...]) -> None:
    """:class:`InvalidField` unless ``path``'s module is one of ``allowed`` or below one
    (an empty ``allowed`` allows every module)."""
    if not allowed:
        return
    module = path.partition(":")[0]
    if not any(module == name or module.startswith(name + ".") for name in allowed):
        raise InvalidField(
            f"python handler: module {module!r} is not allowed on this node "
            f"(--python-modules allows {', '.join(allowed)})"
        )


def _code(error: BaseException) -> str:
    return f"exception:{type(error).__name__}"


def _message(error: BaseException) -> str:
    text = str(error)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _retry_after(error: TransientError) -> float | None:
    value = error.retry_after_s
    return value if value is not None and value >= 0 else None


def _origin(error: BaseException) -> str:
    """Where the exception was raised, so an unexpected one can be found without logs."""
    frames = traceback.extract_tb(error.__traceback__)
    if not frames:
        return ""
    last = frames[-1]
    return f" (raised at {last.filename}:{last.lineno} in {last.name})"
