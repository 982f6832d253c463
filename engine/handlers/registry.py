"""The one registry of handler kinds: a task type's ``kind`` and ``settings`` → a handler.

Building validates everything that can be checked without running the effect (setting
names and types, URLs, secrets, importability of Python callables, node policy such as
``--enable-shell`` and ``--enable-python``), so ``carillon task-type set`` can refuse bad
settings before storing them, and the worker pool can build handlers once per task type.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import Any, Final

import trio

from engine.clock import Clock, SystemClock
from engine.core.retry_policy import RetryPolicy, retry_horizon_s
from engine.errors import InvalidField
from engine.handlers.base import (
    Handler,
    HandlerOptions,
    SettingsWarning,
    check_timeout_s,
    parse_settings,
)
from engine.handlers.brokers import BrokerBridge
from engine.handlers.http_client import WebhookClient
from engine.handlers.noop import NoopHandler
from engine.handlers.python import PythonHandler, PythonSettings, check_callable_path
from engine.handlers.shell import ShellHandler
from engine.handlers.webhook import WebhookHandler
from engine.model import HandlerKind, TaskType

HANDLER_KINDS: Final = ("nats", "noop", "python", "rabbitmq", "redis", "shell", "webhook")
_EVERY_KIND: Final = HandlerOptions(enable_shell=True, enable_python=True)
LOOKUPS_AT_ONCE: Final = 8
"""Most brokers one write looks at together (:func:`settings_warnings`; a manifest set may
name many)."""


def retry_horizon_of(task_type: TaskType) -> float:
    """The worst retry horizon of ``task_type`` (:func:`~engine.core.retry_policy.
    retry_horizon_s`): how long a once-only publisher must remember its executions."""
    policy = RetryPolicy(
        max_attempts=task_type.max_attempts,
        backoff_base_s=task_type.backoff_base_s,
        backoff_max_s=task_type.backoff_max_s,
    )
    return retry_horizon_s(policy, task_type.timeout_s)


def check_settings(kind: str, settings: Mapping[str, Any], *, retry_horizon_s: float = 0.0) -> None:
    """Refuse ``settings`` a handler of ``kind`` would refuse (:class:`~engine.errors.
    InvalidField`), without running or importing anything.

    The one check of a task type's settings, made by the API when one is stored and by
    ``carillon task-type set`` before it sends one. Whether a node may run shell and python
    handlers is that node's policy (``--enable-shell``, ``--enable-python``), and whether a
    python callable imports is a property of the node's environment: each node finds that
    out when it builds the handler, not here. ``retry_horizon_s`` is the task type's worst
    retry horizon (:func:`retry_horizon_of`), which the once-only publishers' settings must
    cover.
    """
    if kind == "python":
        parsed = parse_settings("python", settings, PythonSettings)
        check_timeout_s("python", parsed.timeout_s)
        check_callable_path(parsed.callable)
        return
    build_handler(kind, settings, options=_EVERY_KIND, retry_horizon_s=retry_horizon_s)


async def settings_warnings(
    task_types: Sequence[TaskType],
    *,
    brokers: BrokerBridge | None,
    options: HandlerOptions,
    timeout_s: float,
) -> dict[str, list[SettingsWarning]]:
    """What the writers of ``task_types`` (their settings already checked) should know that
    the settings alone cannot say, found by looking outside Carillon now, by task type name:
    for a ``nats`` task type, whether its stream's duplicate window covers its worst retry
    horizon (:meth:`~engine.handlers.nats_jetstream.NatsHandler.read_window`), through
    ``brokers`` and to an address ``options`` allows.

    Task types that name the same stream share one lookup; :data:`LOOKUPS_AT_ONCE` run at
    a time, each within ``timeout_s``. Every other kind looks at nothing and is left out.
    Never raises for what a broker does (each failure to look is a warning of its own): a
    write's outcome never depends on it.
    """
    nats_types = [t for t in task_types if t.kind is HandlerKind.NATS]
    if not nats_types:
        return {}
    from engine.handlers.nats_jetstream import NatsHandler

    handlers = {
        t.name: NatsHandler(
            t.settings,
            options=options,
            retry_horizon_s=retry_horizon_of(t),
            brokers=brokers,
            task_type=t.name,
        )
        for t in nats_types
    }
    found: dict[Hashable, tuple[str, float] | str] = {}
    limiter = trio.CapacityLimiter(LOOKUPS_AT_ONCE)

    async def look(key: Hashable, handler: NatsHandler) -> None:
        async with limiter:
            found[key] = await handler.read_window(timeout_s)

    async with trio.open_nursery() as nursery:
        for key, handler in {h.lookup_key: h for h in handlers.values()}.items():
            nursery.start_soon(look, key, handler)
    return {name: h.window_warnings(found[h.lookup_key]) for name, h in handlers.items()}


def build_handler(
    kind: str,
    settings: Mapping[str, Any],
    *,
    options: HandlerOptions,
    clock: Clock | None = None,
    webhook_client: WebhookClient | None = None,
    brokers: BrokerBridge | None = None,
    retry_horizon_s: float = 0.0,
    task_type_name: str = "",
) -> Handler:
    """A ready handler of ``kind`` configured by ``settings``.

    ``clock`` supplies wall time where a handler needs it (webhook signature timestamps,
    HTTP-date ``Retry-After``); the system clock by default. ``webhook_client`` is the
    node's shared HTTP client for webhooks (a per-run default without one); ``brokers`` the
    node's broker bridge, which the message-broker kinds publish through, and
    ``retry_horizon_s`` the task type's worst retry horizon (:func:`retry_horizon_of`),
    which their deduplication must outlast (``task_type_name`` names the task type in the
    warnings of those that can only check that when they publish). Raises
    :class:`~engine.errors.InvalidField` for an unknown kind or bad settings, with a message
    that says how to fix them.
    """
    if kind == "webhook":
        return WebhookHandler(
            settings, options=options, clock=clock or SystemClock(), client=webhook_client
        )
    if kind == "python":
        return PythonHandler(settings, options=options)
    if kind == "shell":
        return ShellHandler(settings, options=options)
    if kind == "noop":
        return NoopHandler(settings)
    # The broker kinds import their client libraries only when a node builds one: a node
    # without broker task types never loads them (redis-py alone pulls in parts of the
    # OpenTelemetry SDK when it is installed).
    if kind == "redis":
        from engine.handlers.redis_stream import RedisHandler

        return RedisHandler(
            settings, options=options, retry_horizon_s=retry_horizon_s, brokers=brokers
        )
    if kind == "nats":
        from engine.handlers.nats_jetstream import NatsHandler

        return NatsHandler(
            settings,
            options=options,
            retry_horizon_s=retry_horizon_s,
            brokers=brokers,
            task_type=task_type_name,
        )
    if kind == "rabbitmq":
        from engine.handlers.rabbitmq import RabbitmqHandler

        return RabbitmqHandler(settings, options=options, brokers=brokers)
    raise InvalidField(f"unknown handler kind {kind!r}; choose one of {', '.join(HANDLER_KINDS)}")
