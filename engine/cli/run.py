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
import difflib
import enum
import functools
import logging
import math
import os
import random
import re
import secrets
import signal
import socket
import tomllib
from collections.abc import Callable, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from pathlib import Path
from types import NoneType
from typing import Any, Final, Literal, Protocol, get_args

import msgspec
import trio

from engine.clock import Clock, SystemClock
from engine.config import NodeConfig
from engine.errors import CarillonError, ConfigError
from engine.ledger.base import Ledger
from engine.ledger.database import (
    DATABASE_URL_ENV,
    ResolvedDatabase,
    resolve_database,
    validate_database_url,
)
from engine.logs import configure_logging

__all__ = [
    "ENV_PREFIX",
    "SETTINGS",
    "SHUTDOWN_GUARD_S",
    "TOML_TABLE",
    "Setting",
    "add_parser",
    "default_node_id",
    "load_node_config",
    "run",
    "serve_node",
]

ENV_PREFIX: Final = "CARILLON_"
TOML_TABLE: Final = "node"
SHUTDOWN_GUARD_S: Final = 2.0
"""How long past ``shutdown_timeout_s`` the command waits before cancelling and giving up."""

_log = logging.getLogger("carillon.run")

_HELP: Final = {
    "node_id": "unique id of this node process; by default <hostname>-<pid>-<6 random hex digits>",
    "database_url": (
        "PostgreSQL URL, e.g. postgresql://user:password@host:5432/db; by default the local "
        "server at 127.0.0.1:5432 if it takes passwordless logins, else embedded PostgreSQL "
        "in .carillon/pg"
    ),
    "region": "region label of this node",
    "lease_ttl_s": "how long a partition lease lasts without renewal, 1 to 600 seconds",
    "lease_safety_margin_s": "the node stops trusting a lease this long before it expires",
    "lookahead_s": "fires due within this window are written ahead, 0 to 300 seconds",
    "plan_batch_max": "most executions one planner transaction writes, 1 to 10000",
    "clock_skew_bound_s": "planning pauses while the local clock is further off the database's",
    "clock_probe_interval_s": "time between clock-skew probes",
    "change_poll_interval_s": "longest wait for a schedule-change notification before polling",
    "catchup_grace_s": "a fire less late than this runs normally; older ones follow catch-up",
    "shutdown_timeout_s": "time allowed for a graceful shutdown after SIGTERM or SIGINT",
    "log_level": "least severe log records written",
    "log_format": "log line format: human text or one JSON object per line",
}

Kind = Literal["number", "integer", "text", "choice"]


class _Invalid(ValueError):
    """A value that cannot be converted; ``echo``: the message may repeat the raw value."""

    def __init__(self, problem: str, *, echo: bool = True) -> None:
        super().__init__(problem)
        self.echo = echo


@dataclass(frozen=True)
class Setting:
    """How one NodeConfig field is spelled as a flag, an environment variable and a TOML key."""

    name: str
    kind: Kind
    default: object
    help: str
    enum_type: type[enum.StrEnum] | None = None

    @property
    def choices(self) -> tuple[str, ...]:
        return () if self.enum_type is None else tuple(m.value for m in self.enum_type)

    @property
    def flag(self) -> str:
        return "--" + self.name.removesuffix("_s").replace("_", "-")

    @property
    def env_var(self) -> str:
        return ENV_PREFIX + self.name.upper()

    def parse(self, text: str) -> object:
        """Convert the text of a flag or environment variable; raises :class:`_Invalid`."""
        if self.kind == "number":
            try:
                number = float(text)
            except ValueError:
                raise _Invalid("is not a number") from None
            return _finite(number)
        if self.kind == "integer":
            try:
                return int(text)
            except ValueError:
                raise _Invalid("is not a whole number") from None
        if self.enum_type is not None:
            try:
                return self.enum_type(text.strip().lower())
            except ValueError:
                raise _Invalid(f"is not one of {', '.join(self.choices)}") from None
        if not text:
            raise _Invalid("must not be empty")
        if self.name == "database_url":
            try:
                return validate_database_url(text)
            except ConfigError as exc:
                raise _Invalid(str(exc), echo=False) from None  # the message hides passwords
        return text

    def convert(self, raw: object, origin: str, *, text_numbers: bool) -> object:
        """``raw`` from ``origin`` as this field's value; raises ConfigError naming ``origin``."""
        try:
            if isinstance(raw, str) and (text_numbers or self.kind in ("text", "choice")):
                return self.parse(raw)
            return self._check_typed(raw)
        except _Invalid as exc:
            raise ConfigError(
                f"{origin}={raw!r} {exc}" if exc.echo else f"{origin}: {exc}"
            ) from None

    def _check_typed(self, raw: object) -> object:
        if self.kind == "number" and isinstance(raw, int | float) and not isinstance(raw, bool):
            return _finite(float(raw))
        if self.kind == "integer" and isinstance(raw, int) and not isinstance(raw, bool):
            return raw
        if self.kind == "choice" and isinstance(raw, enum.Enum):
            return self.parse(str(raw.value))
        unquote = " (write it without quotes)" if isinstance(raw, str) else ""
        expected = {"number": "a number", "integer": "a whole number"}.get(self.kind, "a string")
        raise _Invalid(f"is not {expected}{unquote}")


def _finite(number: float) -> float:
    if not math.isfinite(number):
        raise _Invalid("is not a finite number")
    return number


def _setting(field: msgspec.structs.FieldInfo) -> Setting:
    kind: Kind
    enum_type = None
    if field.type is float:
        kind = "number"
    elif field.type is int:
        kind = "integer"
    elif field.type is str or set(get_args(field.type)) == {str, NoneType}:
        kind = "text"
    elif isinstance(field.type, type) and issubclass(field.type, enum.StrEnum):
        kind, enum_type = "choice", field.type
    else:
        raise TypeError(f"NodeConfig.{field.name}: no command-line form for {field.type!r}")
    default = None if field.default is msgspec.NODEFAULT else field.default
    return Setting(field.name, kind, default, _HELP.get(field.name, ""), enum_type)


SETTINGS: Final = tuple(_setting(field) for field in msgspec.structs.fields(NodeConfig))
"""One entry per NodeConfig field, in declaration order."""
_BY_NAME: Final = {setting.name: setting for setting in SETTINGS}


def default_node_id() -> str:
    """``<hostname>-<pid>-<6 hex digits>``: distinct for every process, even on one host."""
    host = "".join(socket.gethostname().split())[:100] or "node"
    return f"{host}-{os.getpid()}-{secrets.token_hex(3)}"


def load_node_config(
    flags: Mapping[str, object], env: Mapping[str, str], toml_path: Path | None
) -> NodeConfig:
    """Build the node's configuration: flags, then environment, then TOML file, then defaults.

    ``flags`` maps field names to values (``None``: not given); strings are converted like
    environment values. ``env`` is read for ``CARILLON_<FIELD NAME>`` only. ``toml_path``
    names a file whose ``[node]`` table holds field names as keys. Raises ConfigError naming
    the source of the offending value (and for a missing, unreadable or malformed file).
    """
    unknown = sorted(set(flags) - _BY_NAME.keys())
    if unknown:
        raise ConfigError(f"unknown setting {unknown[0]!r}; known: {', '.join(_BY_NAME)}")
    table = {} if toml_path is None else _read_toml(toml_path)
    values: dict[str, object] = {}
    origins: dict[str, str] = {}
    for setting in SETTINGS:
        name = setting.name
        if flags.get(name) is not None:
            origin, raw, text_numbers = setting.flag, flags[name], True
        elif setting.env_var in env:
            origin, raw, text_numbers = setting.env_var, env[setting.env_var], True
        elif name in table:
            origin, raw, text_numbers = f"{toml_path}:{TOML_TABLE}.{name}", table[name], False
        else:
            continue
        values[name] = setting.convert(raw, origin, text_numbers=text_numbers)
        origins[name] = origin
    values.setdefault("node_id", default_node_id())
    try:
        return NodeConfig(**values)  # type: ignore[arg-type]
    except ConfigError as exc:
        raise ConfigError(_with_origins(str(exc), origins)) from None


def _read_toml(path: Path) -> dict[str, object]:
    try:
        with path.open("rb") as file:
            document = tomllib.load(file)
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except OSError as exc:
        raise ConfigError(f"config file {path} cannot be read: {exc.strerror or exc}") from None
    except ValueError as exc:  # TOMLDecodeError, or bytes that are not UTF-8
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    for key in document:
        if key in _BY_NAME:
            raise ConfigError(f"{path}: {key} must be inside the [{TOML_TABLE}] table")
        if key != TOML_TABLE:
            raise ConfigError(f"{path}: unknown key {key!r}; settings go in a [{TOML_TABLE}] table")
    table = document.get(TOML_TABLE, {})
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: {TOML_TABLE} must be a table ([{TOML_TABLE}])")
    for key in table:
        if key not in _BY_NAME:
            close = difflib.get_close_matches(key, _BY_NAME, n=1)
            hint = f"did you mean {close[0]}? " if close else ""
            raise ConfigError(
                f"{path}: unknown key {TOML_TABLE}.{key}; {hint}known keys: {', '.join(_BY_NAME)}"
            )
    return table


def _with_origins(message: str, origins: Mapping[str, str]) -> str:
    named = [f"{n} from {o}" for n, o in origins.items() if re.search(rf"\b{n}\b", message)]
    return f"{message} ({'; '.join(named)})" if named else message


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
        serve = functools.partial(serve_node, open_ledger=open_ledger, make_node=make_node)
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
    ) -> None:
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
                async with self.open_ledger(self.database.url) as ledger:
                    node = self.make_node(self.config, ledger, self.clock, self.rng)
                    async with trio.open_nursery() as nursery:
                        await nursery.start(node.run)
                        self._log_ready()
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

    def _log_ready(self) -> None:
        config, source = self.config, self.database.source
        _log.info(
            "node ready",
            extra={
                "node_id": config.node_id,
                "region": config.region,
                # "env" means the URL came from the configuration (flag, env var or file).
                "database": "configured" if source == "env" else source,
                "database_url": self.database.redacted_url,
                "lease_ttl_s": config.lease_ttl_s,
                "lookahead_s": config.lookahead_s,
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
