"""The node's configuration: one frozen record, named defaults, validation with helpful messages.

Values come from command-line flags, then ``CARILLON_*`` environment variables, then an
optional TOML file, then the defaults below (first found wins); see ``engine/cli/run.py``.
"""

from __future__ import annotations

import enum
from ipaddress import IPv4Network, IPv6Network, ip_network
from typing import Final

import msgspec

from engine.errors import ConfigError
from engine.ledger.params import REGION_DEFAULT

LEASE_TTL_S_DEFAULT: Final = 15.0
LEASE_SAFETY_MARGIN_S_DEFAULT: Final = 2.0
LOOKAHEAD_S_DEFAULT: Final = 5.0
PLAN_BATCH_MAX_DEFAULT: Final = 5_000
BURST_PLAN_RATE_PER_S_DEFAULT: Final = 5_000.0
"""What a 2-core node sharing its machine with PostgreSQL was measured to write (5,800-8,300
executions/s across 64 planners, with the tenant-refill index of migration 0005): a 200k
burst is planned 40 s ahead of the lookahead. At 10,000/s it was written up to 10 s late."""
BURST_LOOKAHEAD_EXTRA_S_MAX_DEFAULT: Final = 60.0
CLOCK_SKEW_BOUND_S_DEFAULT: Final = 2.0
CLOCK_PROBE_INTERVAL_S_DEFAULT: Final = 5.0
CHANGE_POLL_INTERVAL_S_DEFAULT: Final = 1.0
SHUTDOWN_TIMEOUT_S_DEFAULT: Final = 10.0
CATCHUP_GRACE_S_DEFAULT: Final = 60.0
DAY_S: Final = 86_400.0
"""The ``*_days`` settings are kept in days; the actors count seconds."""
RETENTION_DAYS_DEFAULT: Final = 7.0
CHANGE_RETENTION_DAYS_DEFAULT: Final = 7.0
"""Schedule changes are pruned after this long: far beyond any pause a node rides out (its
leases expire within seconds); a node that comes back later reloads its planners."""
DEAD_LETTER_RETENTION_DAYS_DEFAULT: Final = 0.0
"""0: dead letters are kept until replayed or purged by an operator."""
ATTEMPT_LEASE_S_DEFAULT: Final = 60.0
WORKERS_DEFAULT: Final = 1_000
"""Attempts a node runs at once. Sized for I/O: a webhook in flight is a coroutine and a
socket (about 14 KiB), so a thousand cost ~14 MiB; python and shell attempts are bounded
apart (:data:`BLOCKING_WORKERS_DEFAULT`)."""
BLOCKING_WORKERS_DEFAULT: Final = 32
"""Python and shell attempts a node runs at once: each holds a thread or a process."""
WEBHOOK_CONNECTIONS_PER_HOST_DEFAULT: Final = 256
WEBHOOK_CONNECTIONS_TOTAL_DEFAULT: Final = 1_024
DISPATCH_QUEUE_MAX_DEFAULT: Final = 50_000
DISPATCH_BURST_DEFAULT: Final = 1_000
DISPATCH_SMOOTHING_WINDOW_S_DEFAULT: Final = 0.0
DISPATCH_STALL_AFTER_S_DEFAULT: Final = 30.0
SLO_TARGET_S_DEFAULT: Final = 60.0
"""A first attempt started within this many seconds of its planned instant is on time."""
SLO_TARGET_S_MAX: Final = 86_400.0


class LogFormat(enum.StrEnum):
    HUMAN = "human"
    JSON = "json"


class LogLevel(enum.StrEnum):
    DEBUG = "debug"
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"


HTTP_BIND_DEFAULT: Final = "127.0.0.1:8080"
API_TOKEN_RATE_PER_S_DEFAULT: Final = 50.0
API_TOKEN_BURST_DEFAULT: Final = 100
CONSOLE_SESSION_IDLE_S_DEFAULT: Final = 1800.0
"""A console session unused for 30 minutes ends."""
CONSOLE_SESSION_LIFETIME_S_DEFAULT: Final = 43_200.0
"""A console session ends 12 hours (an on-call shift) after sign-in, however busy."""
CONSOLE_SESSION_IDLE_S_MIN: Final = 60.0
CONSOLE_SESSION_LIFETIME_S_MAX: Final = 30 * 86_400.0
"""The ledger's own bound (``engine.ledger.params.SESSION_LIFETIME_S_MAX``)."""


def _valid_bind(bind: str) -> bool:
    host, sep, port = bind.rpartition(":")
    return bool(sep and host) and port.isdigit() and 0 <= int(port) <= 65535


class NodeConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Everything a node needs to run. Durations are seconds (``_s``)."""

    node_id: str
    """Unique per process; two live processes never share one (the default adds randomness)."""
    database_url: str | None = None
    """``None``: resolve as documented in the README (env, local server, embedded)."""
    region: str = REGION_DEFAULT
    lease_ttl_s: float = LEASE_TTL_S_DEFAULT
    """How long a partition lease lasts in the database without renewal."""
    lease_safety_margin_s: float = LEASE_SAFETY_MARGIN_S_DEFAULT
    """A lease is trusted locally only until ``attempt start + ttl - margin``."""
    lookahead_s: float = LOOKAHEAD_S_DEFAULT
    """Fires due within this window are written to the ledger before they are due."""
    plan_batch_max: int = PLAN_BATCH_MAX_DEFAULT
    """Most executions one planner transaction writes."""
    burst_plan_rate_per_s: float = BURST_PLAN_RATE_PER_S_DEFAULT
    """A conservative planning rate: an instant with N fires due is planned N / rate seconds
    earlier than ``lookahead_s``, so a burst is durable before it is due."""
    burst_lookahead_extra_s_max: float = BURST_LOOKAHEAD_EXTRA_S_MAX_DEFAULT
    """The most a burst's lead may exceed ``lookahead_s``."""
    clock_skew_bound_s: float = CLOCK_SKEW_BOUND_S_DEFAULT
    """Planning pauses while the node cannot tell the database time to within this (a probe
    round trip, or disagreeing probes); the wall clock's own offset does not matter."""
    clock_probe_interval_s: float = CLOCK_PROBE_INTERVAL_S_DEFAULT
    change_poll_interval_s: float = CHANGE_POLL_INTERVAL_S_DEFAULT
    """Longest wait for a schedule change notification before polling the feed anyway."""
    catchup_grace_s: float = CATCHUP_GRACE_S_DEFAULT
    """A fire less than this late is run normally; older ones follow the catch-up policy."""
    retention_days: float = RETENTION_DAYS_DEFAULT
    """Succeeded and skipped executions are deleted this long after they finished."""
    dead_letter_retention_days: float = DEAD_LETTER_RETENTION_DAYS_DEFAULT
    """Dead letters are deleted this long after they became dead letters; 0 (the default):
    kept until replayed or purged (``POST /v1/dead-letters:purge``)."""
    change_retention_days: float = CHANGE_RETENTION_DAYS_DEFAULT
    """Schedule changes are pruned from the change feed this long after they were made."""
    workers: int = WORKERS_DEFAULT
    """Attempts this node runs at once (its worker pool), sized for I/O-bound handlers."""
    blocking_workers: int = BLOCKING_WORKERS_DEFAULT
    """Of those, python and shell attempts at most (each holds a thread or a process)."""
    webhook_connections_per_host: int = WEBHOOK_CONNECTIONS_PER_HOST_DEFAULT
    """Most connections open at once to one receiver (host and port), busy or idle."""
    webhook_connections_total: int = WEBHOOK_CONNECTIONS_TOTAL_DEFAULT
    """Most webhook connections open at once (each is a file descriptor)."""
    dispatch_rate_per_s: float = 0.0
    """Starts per second across this node (0: as fast as the workers go)."""
    dispatch_burst: int = DISPATCH_BURST_DEFAULT
    """Starts allowed at once above the rate."""
    dispatch_smoothing_window_s: float = DISPATCH_SMOOTHING_WINDOW_S_DEFAULT
    """Spread the burst allowance over this many seconds instead of releasing it at once."""
    attempt_lease_s: float = ATTEMPT_LEASE_S_DEFAULT
    """A claimed attempt is this node's for this long, renewed every third of it while it
    runs; after a crash its executions are re-queued within about this long."""
    webhook_allow_cidrs: str = ""
    """Comma-separated networks webhooks may reach although the SSRF guard refuses them."""
    broker_allow_cidrs: str = ""
    """Comma-separated networks message-broker task types (redis, nats, rabbitmq) may reach
    although the SSRF guard refuses them; apart from webhooks' list, because brokers usually
    live inside the network and webhook receivers outside it."""
    enable_shell: bool = False
    """Whether shell task types may run on this node (off: whoever can create a task type
    could otherwise run any command as the node's user)."""
    enable_python: bool = False
    """Whether python task types may run on this node (off: whoever can create a task type
    could otherwise import and call any function of the node's environment)."""
    python_modules: str = ""
    """Comma-separated modules (and their submodules) python task types may call into;
    empty: any module, once ``enable_python`` is on."""
    dispatch_queue_max: int = DISPATCH_QUEUE_MAX_DEFAULT
    """Due executions fetched into the dispatcher's queue at most (the rest waits in the
    ledger)."""
    dispatch_stall_after_s: float = DISPATCH_STALL_AFTER_S_DEFAULT
    """Due work waiting this long while workers sit idle and nothing is dispatched is a
    stall: logged as an error, and ``/readyz`` fails its ``dispatch`` check."""
    shutdown_timeout_s: float = SHUTDOWN_TIMEOUT_S_DEFAULT
    slo_target_s: float = SLO_TARGET_S_DEFAULT
    """The start SLO: a first attempt started within this long of its planned instant is on
    time (``carillon_start_slo_ratio``, ``carillon_starts_late_total``)."""
    metrics_tenant_labels: bool = False
    """Label the start metrics by tenant (off: one series per node; on: one per tenant, the
    first 100 tenants, the rest as ``other``)."""
    http: str = HTTP_BIND_DEFAULT
    """``HOST:PORT`` the HTTP API listens on (port 0: any free port); empty: serve no API."""
    metrics_protected: bool = False
    """Require an admin token on ``GET /metrics``."""
    api_token_rate_per_s: float = API_TOKEN_RATE_PER_S_DEFAULT
    """Sustained API requests per second of one token, past its burst (then 429)."""
    api_token_burst: int = API_TOKEN_BURST_DEFAULT
    console_session_idle_s: float = CONSOLE_SESSION_IDLE_S_DEFAULT
    """A console session unused this long ends."""
    console_session_lifetime_s: float = CONSOLE_SESSION_LIFETIME_S_DEFAULT
    """A console session ends this long after sign-in, however busy."""
    console_insecure_cookie: bool = False
    """Send the console's cookies without ``Secure`` when the browser did not use https:
    for plain-http development only (``make run``). Off: they are always ``Secure``."""
    trusted_proxies: str = ""
    """Comma-separated addresses or networks of reverse proxies whose ``X-Forwarded-Proto``
    is believed; everyone else's is ignored."""
    log_level: LogLevel = LogLevel.INFO
    log_format: LogFormat = LogFormat.HUMAN

    def __post_init__(self) -> None:
        problems = []
        if not 1.0 <= self.lease_ttl_s <= 600.0:
            problems.append(
                f"lease_ttl_s must be between 1 and 600 seconds, got {self.lease_ttl_s}"
            )
        if not 0.0 < self.lease_safety_margin_s < self.lease_ttl_s / 3:
            problems.append(
                "lease_safety_margin_s must be positive and under a third of lease_ttl_s "
                f"(ttl {self.lease_ttl_s}, margin {self.lease_safety_margin_s})"
            )
        if not 0.0 <= self.lookahead_s <= 300.0:
            problems.append(f"lookahead_s must be between 0 and 300, got {self.lookahead_s}")
        if not 1 <= self.plan_batch_max <= 10_000:
            problems.append(
                f"plan_batch_max must be between 1 and 10000, got {self.plan_batch_max}"
            )
        if not 1 <= self.workers <= 10_000:
            problems.append(f"workers must be between 1 and 10000, got {self.workers}")
        if not 1 <= self.blocking_workers <= 10_000:
            problems.append(
                f"blocking_workers must be between 1 and 10000, got {self.blocking_workers}"
            )
        if not 1 <= self.webhook_connections_per_host <= self.webhook_connections_total:
            problems.append(
                "webhook_connections_per_host must be at least 1 and at most "
                f"webhook_connections_total ({self.webhook_connections_total}), "
                f"got {self.webhook_connections_per_host}"
            )
        if not 1 <= self.webhook_connections_total <= 1_000_000:
            problems.append(
                "webhook_connections_total must be between 1 and 1000000, "
                f"got {self.webhook_connections_total}"
            )
        if self.dispatch_rate_per_s < 0 or self.dispatch_burst < 1:
            problems.append("dispatch_rate_per_s must be >= 0 and dispatch_burst >= 1")
        if not 3.0 <= self.attempt_lease_s <= 3600.0:
            problems.append(
                f"attempt_lease_s must be between 3 and 3600 seconds, got {self.attempt_lease_s}"
            )
        if not 0.0 < self.slo_target_s <= SLO_TARGET_S_MAX:
            problems.append(
                f"slo_target_s must be more than 0 and at most {SLO_TARGET_S_MAX:g} seconds "
                f"(a day), got {self.slo_target_s}"
            )
        if self.http and not _valid_bind(self.http):
            problems.append(
                f"http must be HOST:PORT with a port from 0 to 65535 (or empty for no API), "
                f"got {self.http!r}"
            )
        if not 0 < self.api_token_rate_per_s <= 1e6 or not 1 <= self.api_token_burst <= 1e6:
            problems.append("api_token_rate_per_s and api_token_burst must be positive")
        if not (
            CONSOLE_SESSION_IDLE_S_MIN
            <= self.console_session_idle_s
            <= self.console_session_lifetime_s
            <= CONSOLE_SESSION_LIFETIME_S_MAX
        ):
            problems.append(
                f"console_session_idle_s must be at least {CONSOLE_SESSION_IDLE_S_MIN:g} seconds "
                "and at most console_session_lifetime_s, which is at most "
                f"{CONSOLE_SESSION_LIFETIME_S_MAX:.0f} (30 days); got "
                f"{self.console_session_idle_s:g} and {self.console_session_lifetime_s:g}"
            )
        for proxy in self._trusted_proxy_entries:
            try:
                ip_network(proxy, strict=False)
            except ValueError:
                problems.append(
                    f"trusted_proxies: {proxy!r} is not an IP address or network (CIDR)"
                )
        if self.dispatch_smoothing_window_s < 0:
            problems.append("dispatch_smoothing_window_s must be >= 0")
        if not 1 <= self.dispatch_queue_max <= 1_000_000:
            problems.append(
                f"dispatch_queue_max must be between 1 and 1000000, got {self.dispatch_queue_max}"
            )
        if not 1.0 <= self.dispatch_stall_after_s <= 86_400.0:
            problems.append(
                "dispatch_stall_after_s must be between 1 and 86400 seconds, "
                f"got {self.dispatch_stall_after_s}"
            )
        for module in self.python_module_list:
            if not all(part.isidentifier() for part in module.split(".")):
                problems.append(f"python_modules: {module!r} is not a module name")
        if self.burst_plan_rate_per_s <= 0 or not 0 <= self.burst_lookahead_extra_s_max <= 600:
            problems.append(
                "burst_plan_rate_per_s must be positive and burst_lookahead_extra_s_max "
                "between 0 and 600"
            )
        for name in (
            "clock_skew_bound_s",
            "clock_probe_interval_s",
            "change_poll_interval_s",
            "catchup_grace_s",
            "retention_days",
            "change_retention_days",
            "shutdown_timeout_s",
        ):
            if getattr(self, name) <= 0:
                problems.append(f"{name} must be positive, got {getattr(self, name)}")
        if not self.dead_letter_retention_days >= 0:
            problems.append(
                "dead_letter_retention_days must be 0 (keep) or positive, "
                f"got {self.dead_letter_retention_days}"
            )
        if not self.node_id or len(self.node_id) > 128 or any(c.isspace() for c in self.node_id):
            problems.append(
                f"node_id must be 1-128 characters without spaces, got {self.node_id!r}"
            )
        if problems:
            raise ConfigError("; ".join(problems))

    @property
    def webhook_allow_list(self) -> tuple[str, ...]:
        return tuple(c.strip() for c in self.webhook_allow_cidrs.split(",") if c.strip())

    @property
    def broker_allow_list(self) -> tuple[str, ...]:
        return tuple(c.strip() for c in self.broker_allow_cidrs.split(",") if c.strip())

    @property
    def _trusted_proxy_entries(self) -> tuple[str, ...]:
        return tuple(p.strip() for p in self.trusted_proxies.split(",") if p.strip())

    @property
    def trusted_proxy_networks(self) -> tuple[IPv4Network | IPv6Network, ...]:
        """The ``trusted_proxies`` as networks (an address is a network of one)."""
        return tuple(ip_network(p, strict=False) for p in self._trusted_proxy_entries)

    @property
    def python_module_list(self) -> tuple[str, ...]:
        return tuple(m.strip() for m in self.python_modules.split(",") if m.strip())

    @property
    def lease_renew_interval_s(self) -> float:
        """Renew at about a third of the TTL, so two renewals can fail before expiry."""
        return self.lease_ttl_s / 3
