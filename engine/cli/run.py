"""``carillon run``: configure a node from flags, environment and file, and run it until signalled.

Configuration (:func:`load_node_config`): every :class:`~engine.config.NodeConfig` field
``name`` can be set as

* the flag ``--name`` in kebab case without a trailing ``_s`` (``lease_ttl_s``: ``--lease-ttl``);
* the environment variable ``CARILLON_`` + ``NAME`` (``lease_ttl_s``: ``CARILLON_LEASE_TTL_S``);
* the key ``name`` in the ``[node]`` table of the TOML file named by ``--config``;

the first of those that is set wins, else the field's default. The whole configuration is
read and validated before anything starts, so a typo never costs a database start-up. Every
error names where the bad value came from (``--lease-ttl``, ``CARILLON_LEASE_TTL_S``,
``carillon.toml:node.lease_ttl_s``).

Lifetime: configure logging; resolve the database (kept until the node has stopped); open
the ledger; start the node; log one readiness line. The first SIGTERM or SIGINT cancels the
node, which shuts down gracefully (releasing its leases) within ``shutdown_timeout_s``; an
outer guard :data:`SHUTDOWN_GUARD_S` later cancels whatever is still unshielded and reports
the overrun. Exit code 0 after a signalled shutdown, 1 when the node failed, stopped on its
own or overran its shutdown. Operating errors are logged as one line, bugs with a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import enum
import functools
import logging
import os
import random
import secrets
import signal
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any, Final, Protocol

import trio

from engine.cli.settings import (
    ENV_PREFIX,
    SETTINGS,
    TOML_TABLE,
    Setting,
    _Invalid,
    load_node_config,
)
from engine.clock import Clock, SystemClock
from engine.config import NodeConfig
from engine.errors import CarillonError, ConfigError
from engine.ledger.base import Ledger
from engine.ledger.database import (
    DATABASE_URL_ENV,
    ResolvedDatabase,
    resolve_database,
)
from engine.logs import configure_logging

__all__ = [
    "ENV_PREFIX",
    "SETTINGS",
    "SHUTDOWN_GUARD_S",
    "TOML_TABLE",
    "Setting",
    "add_parser",
    "load_node_config",
    "run",
    "serve_node",
]

SHUTDOWN_GUARD_S: Final = 2.0
"""How long past ``shutdown_timeout_s`` the command waits before cancelling and giving up."""
_log = logging.getLogger("carillon.run")


# --- the command -----------------------------------------------------------------------------

_EPILOG: Final = f"""\
Each setting is taken from the first of: its flag; the environment variable
{ENV_PREFIX} + the setting's name in upper case (e.g. {ENV_PREFIX}LEASE_TTL_S=20,
{DATABASE_URL_ENV}=postgresql://...); the [{TOML_TABLE}] table of the --config file,
whose keys are the settings' names; the default. Durations are in seconds.
Example file:

  [{TOML_TABLE}]
  region = "eu-west-1"
  lease_ttl_s = 20
  log_format = "json"

Exit status: 0 after a shutdown on SIGTERM or SIGINT; 1 when the configuration is wrong or
the node fails; 2 for a malformed command line."""


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "run",
        help="run a node until SIGTERM or SIGINT",
        description="Run a Carillon node: take partition leases, plan and dispatch executions.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--config", type=Path, metavar="PATH", help=f"TOML file with a [{TOML_TABLE}] table"
    )
    for setting in SETTINGS:
        shown = "" if setting.default is None else f"default {_shown(setting.default)}; "
        parser.add_argument(
            setting.flag,
            dest=setting.name,
            type=functools.partial(_parse_flag, setting),
            metavar=_metavar(setting),
            help=f"{setting.help} ({shown}env {setting.env_var})",
        )
    parser.add_argument(
        "--demo",
        action="store_true",
        help=f"first store a noop task type {DEMO_TASK_TYPE!r} and a schedule {DEMO_SCHEDULE!r} "
        "firing every 10 seconds (what `make run` does), unless they exist",
    )
    parser.set_defaults(handler=run)


def _shown(default: object) -> str:
    if isinstance(default, enum.Enum):
        return str(default.value)
    return repr(default) if isinstance(default, str) else str(default)


def _parse_flag(setting: Setting, text: str) -> object:
    try:
        return setting.parse(text)
    except _Invalid as exc:
        raise argparse.ArgumentTypeError(f"{text!r} {exc}" if exc.echo else str(exc)) from None


def _metavar(setting: Setting) -> str:
    if setting.kind == "choice":
        return "{" + ",".join(setting.choices) + "}"
    if setting.kind == "number":
        return "SECONDS" if setting.name.endswith("_s") else "NUMBER"
    if setting.kind == "integer":
        return "N"
    return {"node_id": "ID", "database_url": "URL"}.get(setting.name, setting.name.upper())


def run(args: argparse.Namespace) -> int:
    flags = {setting.name: getattr(args, setting.name) for setting in SETTINGS}
    config = load_node_config(flags, os.environ, args.config)
    configure_logging(config.log_level, config.log_format)
    open_ledger, make_node = _load_runtime()
    url = config.database_url
    with resolve_database({} if url is None else {DATABASE_URL_ENV: url}) as database:
        serve = functools.partial(
            serve_node, open_ledger=open_ledger, make_node=make_node, demo=args.demo
        )
        return trio.run(serve, config, database)


def _load_runtime() -> tuple[LedgerOpener, NodeFactory]:
    """The production ledger and node, imported only when a node really runs."""
    try:
        from engine.ledger.postgres import open_postgres_ledger
        from engine.node import Node
    except ImportError as exc:  # a broken installation (asyncpg missing, say)
        raise ConfigError(f"this installation cannot run a node: {exc}") from None
    open_ledger: LedgerOpener = open_postgres_ledger
    make_node: NodeFactory = Node
    return open_ledger, make_node


# --- the node's lifetime ---------------------------------------------------------------------


class RunnableNode(Protocol):
    async def run(self, *, task_status: trio.TaskStatus[None] = ...) -> None: ...


NodeFactory = Callable[[NodeConfig, Ledger, Clock, random.Random], RunnableNode]
LedgerOpener = Callable[[str], AbstractAsyncContextManager[Ledger]]


async def serve_node(
    config: NodeConfig,
    database: ResolvedDatabase,
    *,
    open_ledger: LedgerOpener,
    make_node: NodeFactory,
    clock: Clock | None = None,
    rng: random.Random | None = None,
    demo: bool = False,
) -> int:
    """Run a node on ``database`` until SIGTERM or SIGINT; returns the exit code.

    Must run in the main thread (it receives signals). Never raises an operating error: it
    logs it and returns 1.
    """
    session = _Session(
        config,
        database,
        open_ledger,
        make_node,
        SystemClock() if clock is None else clock,
        random.Random(secrets.randbits(64)) if rng is None else rng,
        demo,
    )
    return await session.serve()


class _Session:
    def __init__(
        self,
        config: NodeConfig,
        database: ResolvedDatabase,
        open_ledger: LedgerOpener,
        make_node: NodeFactory,
        clock: Clock,
        rng: random.Random,
        demo: bool = False,
    ) -> None:
        self.demo = demo
        self.config = config
        self.database = database
        self.open_ledger = open_ledger
        self.make_node = make_node
        self.clock = clock
        self.rng = rng
        self.node_scope = trio.CancelScope()
        self.guard = trio.CancelScope()
        self.signalled: str | None = None

    async def serve(self) -> int:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._watch_signals, signals)
                try:
                    failed = await self._run_node()
                finally:
                    nursery.cancel_scope.cancel()
        if self.guard.cancel_called:
            timeout = self.config.shutdown_timeout_s + SHUTDOWN_GUARD_S
            _log.error("the node did not finish shutting down within %gs", timeout)
            return 1
        if failed:
            return 1
        if self.signalled is None:
            _log.error("the node stopped without being asked to")
            return 1
        _log.info("shutdown complete")
        return 0

    async def _run_node(self) -> bool:
        """Run the node until it is cancelled or fails; True if it failed."""
        try:
            with self.guard, self.node_scope:
                async with self.open_ledger(self.database.app_url) as ledger:
                    if self.demo:
                        await seed_demo(ledger)
                    node = self.make_node(self.config, ledger, self.clock, self.rng)
                    async with trio.open_nursery() as nursery:
                        await nursery.start(node.run)
                        self._log_ready(node)
        except Exception as exc:
            operating = _operating_errors(exc)
            if operating:
                _log.error("node failed: %s", "; ".join(str(error) for error in operating))
            else:
                _log.error("node crashed", exc_info=exc)
            return True
        return False

    async def _watch_signals(self, signals: Any) -> None:
        async for signum in signals:
            name = signal.Signals(signum).name
            if self.signalled is None:
                self.signalled = name
                _log.info("shutting down", extra={"signal": name})
                limit = self.config.shutdown_timeout_s + SHUTDOWN_GUARD_S
                self.guard.deadline = trio.current_time() + limit
                self.node_scope.cancel()
            else:
                _log.warning("already shutting down; SIGKILL stops at once", extra={"signal": name})

    def _log_ready(self, node: RunnableNode) -> None:
        config, source = self.config, self.database.source
        api = getattr(node, "api", None)
        bound = ", ".join(getattr(api, "bound", []))
        _log.info(
            "node ready",
            extra={
                "node_id": config.node_id,
                "region": config.region,
                # "env" means the URL came from the configuration (flag, env var or file).
                "database": "configured" if source == "env" else source,
                "database_url": ResolvedDatabase(self.database.app_url, "env").redacted_url,
                "lease_ttl_s": config.lease_ttl_s,
                "lookahead_s": config.lookahead_s,
                "api": bound or "off",
            },
        )


def _operating_errors(exc: BaseException) -> list[CarillonError]:
    """The CarillonErrors ``exc`` consists of, or ``[]`` if any part of it is something else."""
    if isinstance(exc, CarillonError):
        return [exc]
    if isinstance(exc, BaseExceptionGroup):
        errors = [_operating_errors(inner) for inner in exc.exceptions]
        if all(errors):
            return [error for group in errors for error in group]
    return []


# --- the demo of `make run` ------------------------------------------------------------------

DEMO_TASK_TYPE: Final = "demo"
DEMO_SCHEDULE: Final = "demo-every-10s"


async def seed_demo(ledger: Ledger) -> None:
    """Store the demo task type and schedule unless they exist (idempotent)."""
    from engine.core.timetable import Timetable
    from engine.errors import AlreadyExists, NotFound, VersionConflict
    from engine.ledger.params import SchedulesCreate, TaskTypesPut
    from engine.model import HandlerKind, Schedule, TaskType

    try:
        await ledger.task_types_get(DEMO_TASK_TYPE)
    except NotFound:
        with contextlib.suppress(VersionConflict):  # another process stored it meanwhile
            await ledger.task_types_put(
                TaskTypesPut(
                    TaskType(name=DEMO_TASK_TYPE, kind=HandlerKind.NOOP), expected_version=0
                )
            )
    expression = "*/10 * * * * *"
    first = Timetable.compile(expression).next_fire(await ledger.database_now()).planned_at
    schedule = Schedule(
        schedule_id=DEMO_SCHEDULE,
        tenant_id="default",
        cron_expr=expression,
        task_type=DEMO_TASK_TYPE,
        next_run_at=first,
    )
    try:
        await ledger.schedules_create(SchedulesCreate([schedule]))
        _log.info("demo: schedule %s fires every 10 seconds", DEMO_SCHEDULE)
    except AlreadyExists:
        pass
