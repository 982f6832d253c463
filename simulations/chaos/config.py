"""What a chaos run does, and the start-delay bound it is held to.

:class:`ChaosConfig` holds every parameter (``--quick`` and the full run are two presets of
it); :class:`StartDelayBound` derives the documented bound from the engine's own timing
constants and the run's settings. ``docs/chaos.md`` explains the derivation; the terms here
carry the same names.

One execution meets at most one fault: the next fault strikes only once every fire planned
so far has succeeded and reached the sink (the run *settles* between faults), so the bound is
that of a single fault -- including the rebalance that follows it when the lost node comes
back.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Final

from engine.actors.dispatcher import FETCH_INTERVAL_S_DEFAULT
from engine.actors.redeliverer import REDELIVER_INTERVAL_S_DEFAULT
from engine.actors.retry import LEDGER_BACKOFF
from engine.config import WEBHOOK_CONNECTIONS_PER_HOST_DEFAULT

DRAIN_RATE_FLOOR_PER_S: Final = 250.0
"""Webhook deliveries per second the whole cluster is assumed to reach at least, on a loaded
2-core machine that also runs PostgreSQL, the sink and this script (measured: a burst of
2,000 drains in about 2 s, some 1,000 a second, with a node down). A burst of N fires is
therefore delivered within N / this."""
PIPELINE_BASE_S: Final = 2.0
"""Planner announcement, fetch, claim, handler set-up and one scheduling hiccup of a busy
machine, for the first fire of a burst."""
HANDLER_RETRY_JITTER: Final = 0.2
"""The jitter of a task type's retry backoff (``engine/core/retry_policy.py``)."""
EARLY_TOLERANCE_S: Final = 0.5
"""How much earlier than its planned instant a delivery may arrive: nodes plan by the
database-corrected clock, whose offset is measured over a round trip (same machine here)."""


@dataclass(frozen=True)
class ChaosConfig:
    schedules: int = 2000
    period_s: int = 60
    """Every schedule fires every ``period_s`` (60: ``* * * * *``; 10: ``*/10 * * * * *``)."""
    window_s: float = 300.0
    """Fires planned in ``[t0, t0 + window_s)`` are checked."""
    nodes: int = 3
    partitions: int = 64
    lease_ttl_s: float = 5.0
    lease_safety_margin_s: float = 1.0
    attempt_lease_s: float = 5.0
    webhook_timeout_s: float = 10.0
    backoff_base_s: float = 1.0
    backoff_max_s: float = 5.0
    restart_gap_s: float = 15.0
    """How long a SIGKILLed node stays dead before it is started again (new id)."""
    pg_down_s: float = 2.0
    """How long PostgreSQL stays stopped in the restart fault."""
    slow_receiver_ms: float = 1500.0
    """How late the receiver answers in the slow-receiver fault (0: no such fault)."""
    slow_receiver_s: float = 40.0
    """How long the receiver stays slow."""
    fault_offset_s: float = 0.05
    """Faults strike this long after a burst instant: a burst of 2,000 takes a second or two
    to deliver, so its work is in flight. Negative: before the instant, when the burst is
    planned (durable in the ledger, fetched) but not yet started -- what a small burst needs
    to meet the fault at all."""
    tenants: tuple[str, ...] = ("acme", "globex", "initech", "umbrella")
    zones: tuple[str, ...] = (
        "UTC", "America/New_York", "Europe/London", "Asia/Kolkata", "Australia/Lord_Howe",
    )  # fmt: skip
    quick: bool = False
    extra_node_flags: tuple[str, ...] = field(default=())

    @property
    def cron_expr(self) -> str:
        if self.period_s == 60:
            return "* * * * *"
        if 60 % self.period_s == 0:
            return f"*/{self.period_s} * * * * *"
        raise ValueError("period_s must divide 60")

    @property
    def renew_interval_s(self) -> float:
        return self.lease_ttl_s / 3

    @property
    def takeover_s(self) -> float:
        """A lost owner's partitions are held by another node within this long."""
        return self.lease_ttl_s + 2 * self.renew_interval_s

    @property
    def pause_s(self) -> float:
        """The least time the zombie stays stopped: past its lease and the takeover."""
        return self.takeover_s + 1.0


def quick_config() -> ChaosConfig:
    return ChaosConfig(
        schedules=100,
        period_s=10,
        window_s=0.0,
        partitions=16,
        lease_ttl_s=4.0,
        lease_safety_margin_s=0.8,
        attempt_lease_s=4.0,
        restart_gap_s=5.0,
        fault_offset_s=-0.5,
        slow_receiver_s=5.0,  # a burst of 100 is over within it; make test stays short
        quick=True,
    )


def with_window(config: ChaosConfig, minutes: float | None) -> ChaosConfig:
    """The config with its checked window: ``minutes`` if given, else (``0``) a window that
    ends :data:`HEALED_PERIODS` periods after the database restart, wherever that falls."""
    return replace(config, window_s=0.0 if minutes is None else minutes * 60.0)


HEALED_PERIODS: Final = 3
"""Fires checked after the database restart's instant, when the window follows the faults:
the one it strikes, then at least two with everything healed."""


def drain_rate_per_s(config: ChaosConfig) -> float:
    """The deliveries per second a burst drains at, at least: the floor, or while the
    receiver is slow, one node's connections to it, each held for the latency."""
    if config.slow_receiver_ms <= 0:
        return DRAIN_RATE_FLOOR_PER_S
    slow = WEBHOOK_CONNECTIONS_PER_HOST_DEFAULT / (config.slow_receiver_ms / 1000)
    return min(DRAIN_RATE_FLOOR_PER_S, slow)


@dataclass(frozen=True)
class StartDelayBound:
    """Planned instant -> first delivery at the sink, for a fire that meets one fault.

    ``total_s = max(lease_ttl, attempt_lease, db_outage + ledger_retry) + membership_refresh
    + lease_cycle + redeliver_interval + fetch_interval + rebalance + pipeline +
    handler_retry``, where ``rebalance = attempt_lease + redeliver_interval +
    fetch_interval``: when the lost node comes back, the others hand partitions back, and an
    execution they had claimed but not started is abandoned and waits for its attempt lease
    to run out before the new owner re-queues it.

    ``pipeline`` is the larger of the burst's drain at the floor rate and its drain while
    the receiver is slow: then one node's deliveries are bounded by its connections to the
    receiver (``--webhook-connections-per-host``) each held ``slow_receiver_ms``, so a burst
    of N drains within ``N / (connections / latency)`` even with one node left.
    """

    lease_ttl_s: float
    attempt_lease_s: float
    db_outage_s: float
    ledger_retry_s: float
    membership_refresh_s: float
    lease_cycle_s: float
    redeliver_interval_s: float
    fetch_interval_s: float
    pipeline_s: float
    handler_retry_s: float

    @classmethod
    def of(cls, config: ChaosConfig, db_outage_s: float | None = None) -> StartDelayBound:
        outage = config.pg_down_s + 1.0 if db_outage_s is None else db_outage_s
        backoff = LEDGER_BACKOFF
        ledger_retry = (1 + backoff.jitter) * min(backoff.max_s, outage + backoff.base_s)
        return cls(
            lease_ttl_s=config.lease_ttl_s,
            attempt_lease_s=config.attempt_lease_s,
            db_outage_s=outage,
            ledger_retry_s=ledger_retry,
            membership_refresh_s=config.renew_interval_s,
            lease_cycle_s=config.renew_interval_s,
            redeliver_interval_s=REDELIVER_INTERVAL_S_DEFAULT,
            fetch_interval_s=FETCH_INTERVAL_S_DEFAULT,
            pipeline_s=PIPELINE_BASE_S + config.schedules / drain_rate_per_s(config),
            handler_retry_s=config.backoff_base_s * (1 + HANDLER_RETRY_JITTER),
        )

    @property
    def owner_back_s(self) -> float:
        """Until the fire's partition has a working owner and its attempt may be re-queued."""
        return max(
            self.lease_ttl_s, self.attempt_lease_s, self.db_outage_s + self.ledger_retry_s
        ) + (self.membership_refresh_s + self.lease_cycle_s)

    @property
    def rebalance_s(self) -> float:
        """An execution claimed by a node that then hands its partition back."""
        return self.attempt_lease_s + self.redeliver_interval_s + self.fetch_interval_s

    @property
    def total_s(self) -> float:
        return (
            self.owner_back_s
            + self.redeliver_interval_s
            + self.fetch_interval_s
            + self.rebalance_s
            + self.pipeline_s
            + self.handler_retry_s
        )

    def terms(self) -> list[tuple[str, float]]:
        return [
            ("max(lease TTL, attempt lease, DB outage + ledger retry)",
             self.owner_back_s - self.membership_refresh_s - self.lease_cycle_s),
            ("  lease TTL", self.lease_ttl_s),
            ("  attempt lease", self.attempt_lease_s),
            ("  DB outage (measured) + ledger retry", self.db_outage_s + self.ledger_retry_s),
            ("membership refresh (TTL/3)", self.membership_refresh_s),
            ("lease cycle (TTL/3)", self.lease_cycle_s),
            ("redeliverer interval", self.redeliver_interval_s),
            ("dispatcher fallback fetch", self.fetch_interval_s),
            ("rebalance: attempt lease + redeliverer + fetch", self.rebalance_s),
            ("pipeline (burst / drain rate, slow receiver included, + base)", self.pipeline_s),
            ("one handler retry (backoff base + jitter)", self.handler_retry_s),
        ]  # fmt: skip
