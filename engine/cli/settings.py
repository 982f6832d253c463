"""Node settings from flags, ``CARILLON_*`` environment variables and a TOML file.

Every :class:`~engine.config.NodeConfig` field ``name`` can be set as

* the flag ``--name`` in kebab case without a trailing ``_s`` (``lease_ttl_s``: ``--lease-ttl``);
* the environment variable ``CARILLON_`` + ``NAME`` (``lease_ttl_s``: ``CARILLON_LEASE_TTL_S``);
* the key ``name`` in the ``[node]`` table of the TOML file named by ``--config``;

the first of those that is set wins, else the field's default. Every error names where the
bad value came from (``--lease-ttl``, ``CARILLON_LEASE_TTL_S``, ``carillon.toml:node.lease_ttl_s``).
"""

from __future__ import annotations

import difflib
import enum
import math
import os
import re
import secrets
import socket
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import NoneType
from typing import Final, Literal, get_args

import msgspec

from engine.config import NodeConfig
from engine.errors import ConfigError
from engine.ledger.database import validate_database_url

ENV_PREFIX: Final = "CARILLON_"
TOML_TABLE: Final = "node"


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
    "clock_skew_bound_s": "planning pauses while the database time is uncertain by more",
    "clock_probe_interval_s": "time between clock-skew probes",
    "change_poll_interval_s": "longest wait for a schedule-change notification before polling",
    "catchup_grace_s": "a fire less late than this runs normally; older ones follow catch-up",
    "shutdown_timeout_s": "time allowed for a graceful shutdown after SIGTERM or SIGINT",
    "retention_days": "finished executions are deleted this many days after they finish",
    "dead_letter_retention_days": (
        "dead letters are deleted this many days after they fail for good; 0 keeps them "
        "until replayed or purged"
    ),
    "change_retention_days": (
        "schedule changes are pruned from the change feed after this many days; a node "
        "paused for longer reloads its planners"
    ),
    "workers": "attempts this node runs at once (sized for webhooks: a thousand by default)",
    "blocking_workers": "python and shell attempts this node runs at once, at most",
    "webhook_connections_per_host": "most connections open at once to one webhook receiver",
    "webhook_connections_total": "most webhook connections open at once (file descriptors)",
    "dispatch_rate_per_s": "starts per second across this node; 0 for no limit",
    "dispatch_burst": "starts allowed at once above the rate",
    "dispatch_smoothing_window_s": "spread the burst allowance over this many seconds",
    "attempt_lease_s": (
        "a claimed attempt stays this node's for this long, renewed while it runs; after a "
        "crash its executions are re-queued within about this long"
    ),
    "webhook_allow_cidrs": (
        "comma-separated CIDRs webhooks may reach although the SSRF guard refuses them, "
        "e.g. 127.0.0.0/8 for a local test receiver"
    ),
    "broker_allow_cidrs": (
        "comma-separated CIDRs message-broker task types (redis, nats, rabbitmq) may reach "
        "although the SSRF guard refuses them, e.g. 10.0.0.0/8 for the brokers of an internal "
        "network"
    ),
    "enable_shell": "true to let shell task types run on this node (off by default)",
    "enable_python": "true to let python task types run on this node (off by default)",
    "python_modules": (
        "comma-separated modules python task types may call into (and their submodules); "
        "empty for any, once python is enabled"
    ),
    "dispatch_queue_max": "due executions fetched into the dispatcher's queue at most",
    "dispatch_stall_after_s": (
        "due work waiting this long while workers sit idle is a stall: logged, and /readyz fails"
    ),
    "log_level": "least severe log records written",
    "log_format": "log line format: human text or one JSON object per line",
    "burst_plan_rate_per_s": (
        "conservative planning rate; an instant with N fires due is planned N / rate seconds "
        "earlier than the lookahead"
    ),
    "burst_lookahead_extra_s_max": "the most a burst's lead may exceed the lookahead",
    "slo_target_s": (
        "start SLO: a first attempt started within this many seconds of its planned instant "
        "is on time, up to 86400"
    ),
    "http": "HOST:PORT the HTTP API listens on (port 0: any free port); empty for no API",
    "metrics_protected": "true to require an admin token on GET /metrics",
    "api_token_rate_per_s": "API requests per second of one token, past its burst (then 429)",
    "api_token_burst": "API requests one token may make at once above its rate",
    "console_session_idle_s": "a console session unused this many seconds ends (at least 60)",
    "console_session_lifetime_s": (
        "a console session ends this many seconds after sign-in, however busy (at most 30 days)"
    ),
    "console_insecure_cookie": (
        "true to send the console's cookies without Secure when the browser uses plain http: "
        "for local development only (make run); off, they are always Secure"
    ),
    "trusted_proxies": (
        "comma-separated addresses or CIDRs of reverse proxies whose X-Forwarded-Proto is "
        "believed (others' is ignored), e.g. 10.0.0.5,10.1.0.0/16"
    ),
    "metrics_tenant_labels": (
        "true to label the start metrics by tenant (the first 100 tenants; the rest as "
        "'other'); off by default to bound the series count"
    ),
}

_EMPTY_MEANS_NONE: Final = frozenset(
    {"http", "webhook_allow_cidrs", "broker_allow_cidrs", "python_modules", "trusted_proxies"}
)
"""Text settings whose empty value is meaningful: no HTTP API, no allow-listed networks."""

Kind = Literal["number", "integer", "text", "choice", "boolean"]
_TRUE: Final = frozenset({"1", "true", "yes", "on"})
_FALSE: Final = frozenset({"0", "false", "no", "off"})


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
        if self.kind == "boolean":
            lowered = text.strip().lower()
            if lowered in _TRUE or lowered in _FALSE:
                return lowered in _TRUE
            raise _Invalid("is not true or false")
        if self.enum_type is not None:
            try:
                return self.enum_type(text.strip().lower())
            except ValueError:
                raise _Invalid(f"is not one of {', '.join(self.choices)}") from None
        if not text and self.name not in _EMPTY_MEANS_NONE:
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
        if self.kind == "boolean" and isinstance(raw, bool):
            return raw
        unquote = " (write it without quotes)" if isinstance(raw, str) else ""
        expected = {
            "number": "a number",
            "integer": "a whole number",
            "boolean": "true or false",
        }.get(self.kind, "a string")
        raise _Invalid(f"is not {expected}{unquote}")


def _finite(number: float) -> float:
    if not math.isfinite(number):
        raise _Invalid("is not a finite number")
    return number


def _setting(field: msgspec.structs.FieldInfo) -> Setting:
    kind: Kind
    enum_type = None
    if field.type is bool:
        kind = "boolean"
    elif field.type is float:
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
