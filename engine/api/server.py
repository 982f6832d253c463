"""The API server actor: hypercorn's trio worker serving the app inside the node's trio loop.

It runs under the node's supervisor like any actor: ``run`` binds the socket, reports the
bound addresses through ``task_status.started()`` and serves until cancelled. It owns the
broker bridge through which task-type writes look at the broker they name (a ``nats``
stream's duplicate window), apart from the pipeline's. On shutdown it
first marks the node not ready (``/readyz`` answers 503, so the load balancer stops sending
new requests), then lets hypercorn finish in-flight requests for at most
``shutdown_grace_s``.
"""

from __future__ import annotations

import logging
from typing import Any

import msgspec
import trio
from hypercorn.config import Config
from hypercorn.trio import serve

from engine.api.app import ApiConfig, ApiContext, create_app
from engine.errors import ConfigError
from engine.handlers.brokers import open_broker_bridge

log = logging.getLogger("carillon.api")


class ApiStatistics(msgspec.Struct, frozen=True):
    bound: list[str]
    rate_limited: int


class ApiServer:
    def __init__(self, config: ApiConfig, context: ApiContext) -> None:
        self.config = config
        self.context = context
        self.app = create_app(context)
        self.bound: list[str] = []

    async def run(self, *, task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
        if self.context.brokers is not None:
            await self._serve(task_status)
            return
        # The bridge task-type writes look at brokers through (its thread starts with the
        # first look: a node whose writes name no nats stream runs none), closed with this
        # actor, so a restarted API server starts with a fresh one.
        async with open_broker_bridge() as brokers:
            self.context.brokers = brokers
            try:
                await self._serve(task_status)
            finally:
                self.context.brokers = None

    async def _serve(self, task_status: trio.TaskStatus[Any]) -> None:
        stop = trio.Event()
        config = Config()
        config.bind = [self.config.bind]
        config.graceful_timeout = self.config.shutdown_grace_s
        config.accesslog = None
        config.errorlog = log
        self.context.stopping = False
        drain = trio.CancelScope(shield=True)
        async with trio.open_nursery() as nursery:
            # The server runs shielded, so that cancelling this actor (the node shutting
            # down) does not drop in-flight requests; the watcher below, unshielded, turns
            # that cancellation into hypercorn's graceful shutdown, bounded by the grace.
            nursery.start_soon(self._stop_when_cancelled, stop, drain)
            with drain:
                async with trio.open_nursery() as server:
                    try:
                        self.bound = await server.start(
                            lambda task_status: serve(
                                self.app,  # type: ignore[arg-type]
                                config,
                                shutdown_trigger=stop.wait,
                                task_status=task_status,
                            )
                        )
                    except OSError as exc:
                        raise ConfigError(
                            f"the API cannot listen on {self.config.bind}: {exc}"
                        ) from exc
                    log.info("API listening on %s", ", ".join(self.bound))
                    task_status.started(self.bound)
            nursery.cancel_scope.cancel()

    def mark_stopping(self) -> None:
        """Answer ``/readyz`` with 503 from now on, still serving every request: the node is
        about to stop (it drains first; this actor's own stop follows)."""
        self.context.stopping = True

    async def _stop_when_cancelled(self, stop: trio.Event, drain: trio.CancelScope) -> None:
        try:
            await trio.sleep_forever()
        finally:
            self.mark_stopping()
            drain.deadline = trio.current_time() + self.config.shutdown_grace_s + 1.0
            stop.set()

    def statistics(self) -> ApiStatistics:
        auth = self.context.auth
        return ApiStatistics(
            list(self.bound), auth.token_rates.refused + auth.anonymous_rates.refused
        )
