"""What a game day does, and the bounds it is held to (``docs/multi-region.md``).

:class:`GameDayConfig` holds every parameter (``--quick`` and the full run are two presets).
:class:`RecoveryBound` derives, from the engine's own timing constants, the run's settings
and the measured failover steps, how long region B may take to deliver again;
:func:`duplicate_window` derives which planned instants may legitimately be delivered twice.
The terms carry the names the docs use.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from engine.actors.dispatcher import FETCH_AHEAD_S_DEFAULT, FETCH_INTERVAL_S_DEFAULT
from engine.actors.redeliverer import REDELIVER_INTERVAL_S_DEFAULT
from engine.actors.retry import LEDGER_BACKOFF
from simulations.chaos.config import (
    DRAIN_RATE_FLOOR_PER_S,
    HANDLER_RETRY_JITTER,
    PIPELINE_BASE_S,
    ChaosConfig,
)

REGION_A: Final = "a"
REGION_B: Final = "b"
EPOCH_TOKEN_SHIFT: Final = 32
"""Fencing tokens drawn under region epoch ``e`` are at least ``((e - 1) << 32) + 1``
(``engine/ledger/postgres/sql.py``): the epoch of a token is readable from the token."""


def epoch_floor(epoch: int) -> int:
    """The smallest fencing token a lease acquired under region epoch ``epoch`` can carry."""
    return ((epoch - 1) << EPOCH_TOKEN_SHIFT) + 1


@dataclass(frozen=True)
class GameDayConfig:
    schedules: int = 500
    period_s: int = 60
    """Every schedule fires every ``period_s`` (60: ``* * * * *``; 10: ``*/10 * * * * *``)."""
    partitions: int = 32
    region_a_nodes: int = 2
    region_b_nodes: int = 2
    lease_ttl_s: float = 5.0
    lease_safety_margin_s: float = 1.0
    attempt_lease_s: float = 5.0
    healthy_periods: int = 2
    """Bursts checked before the one the forced failover strikes (two minutes at 60 s)."""
    after_periods: int = 2
    """Bursts at least, checked after the failover (more if the old primary's steps last)."""
    switchover_healthy_periods: int = 1
    lag_lead_s: float = 3.0
    """Streaming to the standby is paused this long before the burst the crash strikes."""
    crash_offset_s: float = 1.0
    """The primary crashes this long after a burst instant: the burst is delivered by
    region A, and its completions are in the WAL the standby never received."""
    switch_offset_s: float = -3.0
    """The planned switch-over fences region A this long after a burst instant (negative:
    before it, when the burst is planned but nothing of it is claimed yet). The fence must
    *commit* before the burst: the command takes 0.4-1.7 s here (a Python start, a
    connection), and revoking the leases waits for claims in flight."""
    unsafe_restart: bool = True
    """Also show the documented hazard: a region-A node on the old primary before it is
    fenced."""
    quick: bool = False

    def workload(self) -> ChaosConfig:
        """The chaos run's workload settings (schedules, task type, zones) for the same load."""
        return ChaosConfig(
            schedules=self.schedules,
            period_s=self.period_s,
            partitions=self.partitions,
            lease_ttl_s=self.lease_ttl_s,
            lease_safety_margin_s=self.lease_safety_margin_s,
            attempt_lease_s=self.attempt_lease_s,
            quick=self.quick,
        )

    @property
    def renew_interval_s(self) -> float:
        return self.lease_ttl_s / 3

    @property
    def pipeline_s(self) -> float:
        """A burst, from its instant to its last delivery, on a healthy cluster."""
        return PIPELINE_BASE_S + self.schedules / DRAIN_RATE_FLOOR_PER_S

    @property
    def handler_retry_s(self) -> float:
        return self.workload().backoff_base_s * (1 + HANDLER_RETRY_JITTER)


def quick_config() -> GameDayConfig:
    return GameDayConfig(
        schedules=100,
        period_s=10,
        partitions=16,
        region_b_nodes=1,
        lease_ttl_s=4.0,
        lease_safety_margin_s=0.8,
        attempt_lease_s=4.0,
        healthy_periods=3,
        after_periods=3,
        switchover_healthy_periods=2,
        lag_lead_s=2.0,
        crash_offset_s=0.5,
        quick=True,
    )


STANDBY_RETRY_S: Final = (1 + LEDGER_BACKOFF.jitter) * LEDGER_BACKOFF.max_s
"""A node on a read-only standby retries its first heartbeat with the ledger backoff, long
since at its cap when the standby is promoted: it notices the promotion within this long."""


@dataclass(frozen=True)
class RecoveryBound:
    """From the fault (the crash, or the fence of a switch-over) to region B delivering.

    ``takeover_s = switch_s + standby_retry_s + membership_refresh_s + lease_cycle_s``: the
    database switch (promotion and failover command, or fence and switch-over; measured), a
    region-B node's next retry of its first heartbeat, one membership refresh (its first
    beat may read the settings before the failover committed), one lease cycle (region B
    acquires every revoked partition). ``first_delivery_s = takeover_s + fetch_interval_s +
    pipeline_s``: the dispatcher's fallback fetch (executions region A had planned, in
    partitions just taken over, are announced to nobody), the burst's delivery.
    ``per_fire_s`` adds what an execution region A had *claimed* waits for: its attempt lease
    to run out, the redeliverer, a fetch -- and one handler retry.
    """

    switch_s: float
    standby_retry_s: float
    membership_refresh_s: float
    lease_cycle_s: float
    fetch_interval_s: float
    pipeline_s: float
    attempt_lease_s: float
    redeliver_interval_s: float
    handler_retry_s: float

    @classmethod
    def of(cls, config: GameDayConfig, switch_s: float) -> RecoveryBound:
        return cls(
            switch_s=switch_s,
            standby_retry_s=STANDBY_RETRY_S,
            membership_refresh_s=config.renew_interval_s,
            lease_cycle_s=config.renew_interval_s,
            fetch_interval_s=FETCH_INTERVAL_S_DEFAULT,
            pipeline_s=config.pipeline_s,
            attempt_lease_s=config.attempt_lease_s,
            redeliver_interval_s=REDELIVER_INTERVAL_S_DEFAULT,
            handler_retry_s=config.handler_retry_s,
        )

    @property
    def takeover_s(self) -> float:
        """Until region B holds every partition (and plans)."""
        return self.switch_s + self.standby_retry_s + self.membership_refresh_s + self.lease_cycle_s

    @property
    def first_delivery_s(self) -> float:
        return self.takeover_s + self.fetch_interval_s + self.pipeline_s

    @property
    def per_fire_s(self) -> float:
        claimed = self.attempt_lease_s + self.redeliver_interval_s + self.fetch_interval_s
        return self.first_delivery_s + claimed + self.handler_retry_s

    def terms(self) -> list[tuple[str, float]]:
        return [
            ("database switch (measured)", self.switch_s),
            ("standby node's next first-heartbeat retry", self.standby_retry_s),
            ("membership refresh (TTL/3)", self.membership_refresh_s),
            ("lease cycle (TTL/3)", self.lease_cycle_s),
            ("= region B holds every partition", self.takeover_s),
            ("+ dispatcher fallback fetch", self.fetch_interval_s),
            ("+ pipeline (burst / drain floor + base)", self.pipeline_s),
            ("= first delivery of region B", self.first_delivery_s),
            ("+ claimed by A: attempt lease + redeliverer + fetch",
             self.attempt_lease_s + self.redeliver_interval_s + self.fetch_interval_s),
            ("+ one handler retry", self.handler_retry_s),
            ("= any fire (from max(planned, fault))", self.per_fire_s),
        ]  # fmt: skip


def duplicate_window(
    config: GameDayConfig, loss_start: float, fault_done: float
) -> tuple[float, float]:
    """The planned instants whose fires may reach the sink twice: ``docs/multi-region.md``'s
    bound on double delivery, for planned instants.

    A fire is delivered by both regions only if region A claimed it and the database region
    B uses does not show the attempt finished: the attempt was in flight at the fault, or its
    completion was committed after ``loss_start`` (a forced failover's lag window; for a
    switch-over, the fence). Such a claim was made within ``[loss_start - attempt lease,
    fault_done]``: an attempt starts within two thirds of its attempt lease of the claim, and
    the sink answers at once, so its completion follows the claim by less. A dispatcher never claims
    before the planned instant, and on a healthy cluster a claim comes within a pipeline and
    one handler retry of it. So the planned instant lies in ``[loss_start - attempt lease -
    (pipeline + retry), fault_done + fetch_ahead]``, where the dispatcher's fetch-ahead (2 s)
    is the docs' margin for planning by the database-corrected clock.
    """
    lower = loss_start - config.attempt_lease_s - (config.pipeline_s + config.handler_retry_s)
    return lower, fault_done + FETCH_AHEAD_S_DEFAULT
