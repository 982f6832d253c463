"""Runs actors in a nursery, restarts crashed ones with backoff, escalates crash loops.

A crash is any ``Exception`` escaping an actor's ``run`` (an operating error the actor did not
handle, or a broken invariant). The supervisor logs it and starts a fresh instance after a
backoff delay. More than ``max_restarts`` crashes of one actor within ``window_s`` means
restarting is not helping: it raises :class:`~engine.errors.ActorCrashLoop`, which cancels
every other actor and stops the node with a non-zero exit, rather than letting it limp.
Cancellation is not a crash. An actor that returns normally is finished and not restarted.
"""

from __future__ import annotations

import logging
import random
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Final, Protocol

import msgspec
import trio

from engine.clock import Clock
from engine.core.backoff import Backoff
from engine.errors import ActorCrashLoop

log = logging.getLogger("carillon.supervisor")

MAX_RESTARTS_DEFAULT: Final = 5
RESTART_WINDOW_S_DEFAULT: Final = 60.0


class Actor(Protocol):
    async def run(self, *, task_status: trio.TaskStatus[Any] = ...) -> None: ...


class ChildSpec(msgspec.Struct, frozen=True):
    name: str
    factory: Callable[[], Actor]


class SupervisorConfig(msgspec.Struct, frozen=True):
    max_restarts: int = MAX_RESTARTS_DEFAULT
    window_s: float = RESTART_WINDOW_S_DEFAULT
    backoff: Backoff = Backoff(base_s=0.5, max_s=30.0)


class SupervisorStatistics(msgspec.Struct, frozen=True):
    restarts: dict[str, int]


class _Started:
    """A task status that remembers whether ``started`` was called."""

    def __init__(self, inner: trio.TaskStatus[Any]) -> None:
        self.inner = inner
        self.called = False

    def started(self, value: Any = None) -> None:
        if not self.called:
            self.called = True
            self.inner.started(value)


class Supervisor:
    """Starts each child in order (waiting until it is ready) and keeps it running."""

    def __init__(
        self,
        children: Sequence[ChildSpec],
        *,
        clock: Clock,
        rng: random.Random,
        config: SupervisorConfig | None = None,
    ) -> None:
        self._children = list(children)
        self._clock = clock
        self._rng = rng
        self._config = config or SupervisorConfig()
        self._restarts: dict[str, int] = {child.name: 0 for child in children}

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            for child in self._children:
                await nursery.start(self._supervise, child)
            task_status.started()

    def statistics(self) -> SupervisorStatistics:
        return SupervisorStatistics(restarts=dict(self._restarts))

    async def _supervise(
        self, child: ChildSpec, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        crashes: deque[float] = deque()
        status = _Started(task_status)
        while True:
            try:
                await child.factory().run(task_status=status)
                log.info("actor %s finished", child.name)
                return
            except Exception as exc:
                if not status.called:
                    raise  # it never became ready: the node cannot start
                now = self._clock.monotonic()
                crashes.append(now)
                while crashes and crashes[0] < now - self._config.window_s:
                    crashes.popleft()
                if len(crashes) > self._config.max_restarts:
                    raise ActorCrashLoop(
                        f"actor {child.name} crashed {len(crashes)} times within "
                        f"{self._config.window_s:.0f} s; stopping the node (last error: {exc!r})"
                    ) from exc
                delay = self._config.backoff.delay_s(len(crashes) - 1, self._rng)
                log.error(
                    "actor %s crashed; restarting in %.1f s",
                    child.name,
                    delay,
                    exc_info=exc,
                    extra={"actor": child.name},
                )
                self._restarts[child.name] += 1
                await trio.sleep(delay)
