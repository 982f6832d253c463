"""Task types as the execution pipeline uses them: each with its built handler, cached.

The dispatcher re-reads every task type every few seconds (:meth:`TaskKinds.refresh`, for
its caps and overlap policies); workers take the handler from here (:meth:`TaskKinds.get`),
reading a task type on a miss. A changed task type gets a new handler; an unchanged one a
new expiry. Entries live ``ttl_s``, so a change reaches the workers within that time.

A task type this node cannot run (a ``shell`` one on a node without ``--enable-shell``,
settings that no longer validate) is logged once per version and left out; its executions
fail with ``setup_error`` when they come up, while every other task type keeps running.
"""

from __future__ import annotations

import logging
from typing import Final

import msgspec
import trio

from engine.clock import Clock
from engine.core.retry_policy import ATTEMPT_OVERRUN_S, RetryPolicy
from engine.errors import CarillonError
from engine.handlers import Handler, HandlerOptions, build_handler
from engine.handlers.base import is_inline
from engine.handlers.brokers import BrokerBridge
from engine.handlers.http_client import WebhookClient
from engine.handlers.noop import NoopHandler
from engine.handlers.registry import retry_horizon_of
from engine.ledger.base import Ledger
from engine.model import HandlerKind, TaskType

log = logging.getLogger("carillon.workers")

BLOCKING_KINDS: Final = frozenset({HandlerKind.PYTHON, HandlerKind.SHELL})
"""Handler kinds that hold a thread or a process while they run: bounded apart, by the
dispatcher (the task-type group :data:`BLOCKING_GROUP`, so a backlog of them waits in its
queue, not in workers) and by the workers (a limiter of as many threads)."""
CALLING_OUT_KINDS: Final = frozenset(
    {HandlerKind.WEBHOOK, HandlerKind.REDIS, HandlerKind.NATS, HandlerKind.RABBITMQ}
)
"""Handler kinds that call another service: their attempt span is a client span, the
parent of the receiver's or consumer's trace (``engine/tracing.py``)."""
FOLDING_KINDS: Final = frozenset(
    {
        HandlerKind.NOOP,
        HandlerKind.WEBHOOK,
        HandlerKind.REDIS,
        HandlerKind.NATS,
        HandlerKind.RABBITMQ,
    }
)
"""Handler kinds whose attempts may be *folded*: started without a recorded claim, the claim
written with the completion (docs/ledger.md, "Folded claims"). Only kinds that run outside
the node's process: a python or shell handler that takes its node down would, folded,
leave no trace of its attempt, and be retried forever uncounted."""
NOOP_BOUND_S: Final = 1.0
"""How long a noop attempt takes at most beyond its ``delay_s`` (it returns at once): the
bound a fold of it must fit in the partition's trust window."""
BLOCKING_GROUP: Final = "blocking"
CACHE_TTL_S_DEFAULT: Final = 10.0


class TaskKind(msgspec.Struct, frozen=True):
    """A task type with its handler and retry policy."""

    expires: float
    task_type: TaskType
    handler: Handler
    policy: RetryPolicy
    inline: bool = False
    """Its handler declared itself inline (:func:`~engine.handlers.base.is_inline`) and is of
    no blocking kind: the workers run its attempts in batches."""
    fold_bound_s: float | None = None
    """How long an attempt may run at most when folded (its deadline then); ``None``: its
    attempts are never folded (see :func:`fold_bound_s`)."""


def fold_bound_s(task_type: TaskType, handler: Handler) -> float | None:
    """How long a folded attempt of ``task_type`` may run: the task type's timeout and the
    workers' grace, or the kind's own bound when shorter (noop: its delay and
    :data:`NOOP_BOUND_S`). ``None`` when its attempts must be claimed: a kind that runs in
    the node's process (not in :data:`FOLDING_KINDS`), or a task type with a cluster cap
    (the cap counts the ``running`` executions a fold never writes)."""
    if task_type.kind not in FOLDING_KINDS or task_type.max_concurrency_cluster is not None:
        return None
    bound_s = task_type.timeout_s + ATTEMPT_OVERRUN_S
    if isinstance(handler, NoopHandler):
        bound_s = min(bound_s, handler.delay_s + NOOP_BOUND_S)
    return bound_s


class TaskKinds:
    """The pipeline's cache of task types and their handlers (see the module docstring)."""

    def __init__(
        self,
        ledger: Ledger,
        clock: Clock,
        options: HandlerOptions,
        *,
        wall_clock: Clock,
        ttl_s: float = CACHE_TTL_S_DEFAULT,
    ) -> None:
        self._ledger = ledger
        self._clock = clock
        self._wall_clock = wall_clock
        self._options = options
        self._ttl_s = ttl_s
        self._kinds: dict[str, TaskKind] = {}
        self._loading: dict[str, trio.Lock] = {}
        self._unusable: set[tuple[str, int]] = set()
        self.webhook_client: WebhookClient | None = None
        """The pipeline's shared webhook client, set while it runs; handlers built meanwhile
        deliver through it."""
        self.brokers: BrokerBridge | None = None
        """The pipeline's broker bridge, set while it runs; broker handlers built meanwhile
        publish through it."""

    def cached(self, name: str, now: float) -> TaskKind | None:
        """The fresh entry for ``name``, or ``None`` (then :meth:`get` reads it)."""
        kind = self._kinds.get(name)
        return kind if kind is not None and kind.expires > now else None

    def fold_bound_s(self, name: str) -> float | None:
        """:attr:`TaskKind.fold_bound_s` of the task type last read, however old (``None``
        for one not read yet: claim it). A cluster cap set meanwhile binds folds from the
        next refresh (:data:`~engine.actors.dispatcher.SETTINGS_REFRESH_S`)."""
        kind = self._kinds.get(name)
        return None if kind is None else kind.fold_bound_s

    def task_type(self, name: str) -> TaskType | None:
        """The task type last read, however old (the overlap policy's default)."""
        kind = self._kinds.get(name)
        return None if kind is None else kind.task_type

    async def get(self, name: str) -> TaskKind:
        """The task type ``name`` and its handler; reads the ledger on a miss (one read per
        task type, however many workers miss at once)."""
        cached = self.cached(name, self._clock.monotonic())
        if cached is not None:
            return cached
        async with self._loading.setdefault(name, trio.Lock()):
            cached = self.cached(name, self._clock.monotonic())
            if cached is not None:
                return cached
            return self._remember(await self._ledger.task_types_get(name))

    def refresh(self, task_types: list[TaskType]) -> None:
        """Take the task types just read from the ledger (see the module docstring)."""
        for task_type in task_types:
            try:
                self._remember(task_type)
            except CarillonError as exc:
                key = (task_type.name, task_type.version)
                if key not in self._unusable:
                    self._unusable.add(key)
                    log.warning("task type %r cannot run on this node: %s", task_type.name, exc)

    def _remember(self, task_type: TaskType) -> TaskKind:
        expires = self._clock.monotonic() + self._ttl_s
        cached = self._kinds.get(task_type.name)
        if cached is not None and cached.task_type == task_type:
            kind = msgspec.structs.replace(cached, expires=expires)
        else:
            handler = build_handler(
                task_type.kind,
                task_type.settings,
                options=self._options,
                clock=self._wall_clock,
                webhook_client=self.webhook_client,
                brokers=self.brokers,
                retry_horizon_s=retry_horizon_of(task_type),
                task_type_name=task_type.name,
            )
            policy = RetryPolicy(
                max_attempts=task_type.max_attempts,
                backoff_base_s=task_type.backoff_base_s,
                backoff_max_s=task_type.backoff_max_s,
            )
            inline = is_inline(handler) and task_type.kind not in BLOCKING_KINDS
            kind = TaskKind(
                expires, task_type, handler, policy, inline, fold_bound_s(task_type, handler)
            )
        self._kinds[task_type.name] = kind
        return kind
