"""The handler contract: what a handler receives, what it returns, and how it is configured.

A *handler* performs the effect of one attempt of one execution: it POSTs a webhook, calls a
Python function, runs a command, or does nothing. The worker pool builds one handler per task
type (:func:`engine.handlers.build_handler`) and calls :meth:`Handler.run` once per attempt.

Invariants every handler keeps (the worker pool relies on them):

* **Expected failures are values, not exceptions.** ``run`` returns a :class:`HandlerResult`
  for every outcome of the effect — success, an HTTP 503, a timeout, a user exception. An
  exception escaping ``run`` is a bug in Carillon.
* **Cancellation propagates.** ``trio.Cancelled`` (node shutdown, a lost lease) is never
  turned into a result; whatever the handler started (a child process group, an HTTP
  connection) is cleaned up before it propagates.
* **Every run is bounded** by its ``timeout_s`` setting; running out is the transient
  outcome ``timeout``.
* **Idempotency is the receiver's side of the bargain.** Delivery is at least once; every
  attempt of an execution carries the same ``execution_id`` so the receiver can apply the
  effect once.

**Inline handlers.** A handler whose ``run`` never waits -- it returns without reaching a
trio checkpoint, in microseconds: ``noop`` without a delay, and no other kind today --
declares ``inline = True`` (:func:`is_inline`). The workers then run a handful of its
attempts one after another in one worker turn and one cancel scope, instead of paying a
channel receive and a deadline scope per attempt (``engine/actors/workers.py``). An inline
handler keeps every invariant above; the shared scope's deadline is still there to stop one
that breaks its word. A handler that declares nothing is not inline.
"""

from __future__ import annotations

import enum
import ipaddress
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime
from typing import Any, Final, Protocol, TypeVar

import msgspec
import trio

from engine.errors import ConfigError, InvalidField

TIMEOUT_S_DEFAULT: Final = 30.0
"""The ``timeout_s`` of a handler whose settings name none."""
TIMEOUT_S_MAX: Final = 24 * 3600.0
RESPONSE_BODY_MAX_BYTES_DEFAULT: Final = 64 * 1024
ERROR_MESSAGE_CHARS_MAX: Final = 1000
"""Longest ``error_message`` a result carries; longer text is cut, keeping the start."""
ERROR_CODE_CHARS_MAX: Final = 100


class OutcomeKind(enum.StrEnum):
    """How an attempt ended, as far as retrying is concerned (``docs/execution.md``)."""

    SUCCEEDED = "succeeded"
    TRANSIENT = "transient"
    """Worth retrying with backoff: timeouts, network errors, 408/425/429/5xx, exit 75."""
    PERMANENT = "permanent"
    """Retrying cannot help: dead-letter at once (4xx, refused URLs, a ``PermanentError``)."""
    UNKNOWN = "unknown"
    """Unclassified: retried a bounded number of times, then dead-lettered."""


class HandlerResult(msgspec.Struct, frozen=True, kw_only=True):
    """The outcome of one attempt. Build it with the class methods, which bound the text.

    ``error_code`` is a short machine code (``http_503``, ``timeout``, ``connect_error``,
    ``ssrf_refused``, ``exit_75``, ``exception:ValueError``); ``error_message`` is for people,
    at most :data:`ERROR_MESSAGE_CHARS_MAX` characters. ``retry_after_s`` is the receiver's
    wish (HTTP ``Retry-After``) for the earliest retry, in seconds from now.
    """

    kind: OutcomeKind
    error_code: str | None = None
    error_message: str | None = None
    retry_after_s: float | None = None

    def __post_init__(self) -> None:
        if (self.kind is OutcomeKind.SUCCEEDED) != (self.error_code is None):
            raise ValueError("a success has no error_code and every failure has one")
        if self.error_code is not None and len(self.error_code) > ERROR_CODE_CHARS_MAX:
            raise ValueError(f"error_code longer than {ERROR_CODE_CHARS_MAX} characters")
        if self.error_message is not None and len(self.error_message) > ERROR_MESSAGE_CHARS_MAX:
            raise ValueError(f"error_message longer than {ERROR_MESSAGE_CHARS_MAX} characters")
        if self.retry_after_s is not None and not self.retry_after_s >= 0:
            raise ValueError("retry_after_s must be a non-negative number of seconds")

    @classmethod
    def succeeded(cls) -> HandlerResult:
        return _SUCCEEDED

    @classmethod
    def transient(
        cls, code: str, message: str, *, retry_after_s: float | None = None
    ) -> HandlerResult:
        return cls._failure(OutcomeKind.TRANSIENT, code, message, retry_after_s)

    @classmethod
    def permanent(cls, code: str, message: str) -> HandlerResult:
        return cls._failure(OutcomeKind.PERMANENT, code, message, None)

    @classmethod
    def unknown(cls, code: str, message: str) -> HandlerResult:
        return cls._failure(OutcomeKind.UNKNOWN, code, message, None)

    @classmethod
    def _failure(
        cls, kind: OutcomeKind, code: str, message: str, retry_after_s: float | None
    ) -> HandlerResult:
        return cls(
            kind=kind,
            error_code=code[:ERROR_CODE_CHARS_MAX],
            error_message=bound_message(message),
            retry_after_s=retry_after_s,
        )


_SUCCEEDED: Final = HandlerResult(kind=OutcomeKind.SUCCEEDED)


def bound_message(message: str) -> str:
    """``message`` cut to :data:`ERROR_MESSAGE_CHARS_MAX` characters, marked when cut."""
    if len(message) <= ERROR_MESSAGE_CHARS_MAX:
        return message
    return message[: ERROR_MESSAGE_CHARS_MAX - 1] + "…"


class SettingsWarning(msgspec.Struct, frozen=True):
    """Something about a task type's settings that does not stop it from being stored but
    that its writer should know: a condition outside Carillon (a broker's configuration)
    that weakens what the kind promises. The answer to a task-type write carries them."""

    code: str
    """A short machine code, such as ``nats_duplicate_window_short``."""
    message: str
    """For people: what was found, what it costs, and how to fix it."""


class ExecutionContext(msgspec.Struct, frozen=True, kw_only=True):
    """What a handler knows about the attempt it runs.

    ``execution_id`` is the idempotency key: the same for every attempt of an execution
    (retries, redeliveries after a crash, dead-letter replays), different for every planned
    fire. ``attempt`` counts from 1. ``fencing_token`` is the token of the partition lease
    under which the attempt was claimed; a receiver may refuse tokens lower than the highest
    it has seen for the schedule, to shut out a zombie node.
    """

    execution_id: str
    schedule_id: str
    tenant_id: str
    task_type: str
    planned_at: datetime
    """Aware UTC: the instant the schedule fired (not when the attempt started)."""
    attempt: int
    fencing_token: int
    payload: dict[str, Any] = msgspec.field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.planned_at.tzinfo is None:
            raise ValueError("planned_at must be an aware UTC datetime")
        if self.attempt < 1:
            raise ValueError("attempt counts from 1")


class Handler(Protocol):
    """Performs one attempt of an execution; see the module docstring for the invariants."""

    async def run(self, context: ExecutionContext) -> HandlerResult:
        """Perform the effect for ``context`` and classify how it went.

        Returns within about the handler's ``timeout_s`` (a synchronous Python callable is
        the exception: it cannot be interrupted, see :mod:`engine.handlers.python`). Raises
        nothing but ``trio.Cancelled`` (and bugs).
        """
        ...


def is_inline(handler: Handler) -> bool:
    """Whether ``handler`` declared itself inline (see the module docstring): only a
    literal ``inline = True`` attribute counts."""
    return getattr(handler, "inline", False) is True


class HandlerOptions(msgspec.Struct, frozen=True, kw_only=True):
    """Node-wide handler policy, from the node's flags; the same for every task type."""

    webhook_allow_cidrs: tuple[str, ...] = ()
    """Networks webhooks may reach although the SSRF guard refuses them (``127.0.0.0/8``
    for a local test sink, ``10.1.0.0/16`` for an internal receiver)."""
    broker_allow_cidrs: tuple[str, ...] = ()
    """Networks the message-broker kinds (``redis``, ``nats``, ``rabbitmq``) may reach although
    the SSRF guard refuses them (``10.0.0.0/8`` for the brokers of an internal network,
    ``127.0.0.0/8`` for one on the node's host)."""
    enable_shell: bool = False
    """Whether ``shell`` task types may run. Off by default: whoever may create a task type
    could otherwise run any command as the node's user, next to its database credentials."""
    enable_python: bool = False
    """Whether ``python`` task types may run. Off by default: whoever may create a task type
    could otherwise import any module of the node's environment and call into it."""
    python_modules: tuple[str, ...] = ()
    """Modules (with their submodules) a ``python`` callable may come from; empty: any."""
    webhook_timeout_s: float = TIMEOUT_S_DEFAULT
    """The ``timeout_s`` of a webhook whose settings name none."""
    response_body_max_bytes: int = RESPONSE_BODY_MAX_BYTES_DEFAULT
    """Most bytes of a webhook response read (the rest is dropped; only error text uses it)."""

    def __post_init__(self) -> None:
        problems = []
        for which, cidrs in (
            ("webhook", self.webhook_allow_cidrs),
            ("broker", self.broker_allow_cidrs),
        ):
            for cidr in cidrs:
                try:
                    ipaddress.ip_network(cidr, strict=False)
                except ValueError:
                    problems.append(
                        f"{which} allow-list entry {cidr!r} is not a CIDR like 10.0.0.0/8"
                    )
        if not 0 < self.webhook_timeout_s <= TIMEOUT_S_MAX:
            problems.append(f"webhook_timeout_s must be in (0, {TIMEOUT_S_MAX:g}]")
        if not 0 <= self.response_body_max_bytes <= 16 * 1024 * 1024:
            problems.append("response_body_max_bytes must be between 0 and 16 MiB")
        if problems:
            raise ConfigError("; ".join(problems))


def is_cancellation(error: BaseException) -> bool:
    """Whether ``error`` is, or carries, trio's cancellation: the one thing a handler (and the
    wall around it) lets through."""
    if isinstance(error, trio.Cancelled):
        return True
    return isinstance(error, BaseExceptionGroup) and error.subgroup(trio.Cancelled) is not None


def check_timeout_s(kind: str, timeout_s: float) -> float:
    """``timeout_s`` if it is a sensible handler timeout, else :class:`InvalidField`."""
    if not 0 < timeout_s <= TIMEOUT_S_MAX:
        raise InvalidField(
            f"{kind} handler: timeout_s must be above 0 and at most {TIMEOUT_S_MAX:g} seconds, "
            f"got {timeout_s!r}"
        )
    return timeout_s


async def run_with_timeout(
    timeout_s: float, attempt: Callable[[], Awaitable[HandlerResult]]
) -> HandlerResult:
    """``await attempt()``, or the transient outcome ``timeout`` after ``timeout_s`` seconds.

    Only this deadline is turned into a result; a cancellation from outside propagates.
    """
    with trio.move_on_after(timeout_s):
        return await attempt()
    return HandlerResult.transient("timeout", f"the handler did not finish within {timeout_s:g} s")


SettingsT = TypeVar("SettingsT", bound=msgspec.Struct)


def parse_settings(kind: str, settings: Mapping[str, Any], into: type[SettingsT]) -> SettingsT:
    """Convert a task type's ``settings`` into the handler's settings record.

    Unknown keys and wrongly typed values are :class:`InvalidField` errors naming the kind,
    so a typo (``timout_s``) is caught when the task type is stored, not when it first runs.
    """
    if not isinstance(settings, Mapping):
        raise InvalidField(f"{kind} handler: settings must be a mapping, got {type(settings)}")
    try:
        return msgspec.convert(dict(settings), into, strict=False)
    except msgspec.ValidationError as error:
        raise InvalidField(f"{kind} handler settings are invalid: {error}") from None
