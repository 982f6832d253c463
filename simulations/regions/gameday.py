"""The multi-region game day: a forced failover and a planned switch-over, end to end.

Each variant gets a stage of its own (:mod:`~simulations.regions.stage`: a primary and its
hot standby, region A's nodes on the primary, region B's on the standby, the webhook sink,
minutely schedules), runs healthy, then:

**forced** (:func:`forced`) -- streaming to the standby is paused ``lag_lead_s`` before a
burst, so that there is a window of commits the standby never gets; the primary crashes
(``immediate``) ``crash_offset_s`` after the burst, which region A has delivered by then; the
standby is promoted; ``carillon region failover --to b`` runs on it with the dead primary as
``--old-database-url`` (it warns and succeeds); region B takes over. Then the old primary
comes back the runbook's way: started *isolated* (no TCP listener), the same failover command
is run again (nothing changes on the new primary; the old one is fenced through its socket),
and only then is it reopened on TCP, where region A's nodes -- running all along, retrying --
reconnect and must stand by. Before the fence, the hazard it prevents is staged on the
isolated server: a fresh region-A node, started on it unfenced, resumes there and delivers
again what region B has already delivered.

**switchover** (:func:`switchover`) -- fence first, on the still-primary (``failover --to b
--database-url PRIMARY``): region A's leases are revoked there at once and every later write
of theirs is refused; the fence is part of the primary's WAL. Then the database switch
(:meth:`~simulations.regions.replication.ReplicatedPair.switchover`: clean stop, the standby
replays everything, promotion): the new primary arrives already saying "region b at the new
epoch, no leases", so region B's nodes start at their next retry, and the old primary,
stopped, is fenced in its own data -- it can be restarted without the isolated start, which
the variant does to show region A's nodes reconnect and stand by.

Everything started is stopped and the pair deleted at the end, on failure and on Ctrl-C.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from simulations.chaos import audit
from simulations.chaos.checks import Figure
from simulations.chaos.faults import sleep_until
from simulations.chaos.nodes import NodeProcess, stop_all
from simulations.chaos.sink import read_deliveries
from simulations.chaos.workload import execution_id, first_fire_after
from simulations.regions.config import (
    REGION_A,
    REGION_B,
    STANDBY_RETRY_S,
    GameDayConfig,
    RecoveryBound,
    epoch_floor,
)
from simulations.regions.observe import (
    GameDayTimeline,
    UnsafeRestart,
    VariantRecord,
    region_metrics,
    wait_standing_by,
    watch_recovery,
)
from simulations.regions.stage import (
    DATABASE,
    RegionNodeSettings,
    Stage,
    region_failover,
    set_up,
)
from simulations.regions.verdicts import collect, judge

FIRST_FIRE_MARGIN_S: Final = 3.0
"""The first checked fire is at least this long after the schedules were created."""
UNSAFE_NODE_START_S: Final = 3.0
"""A fresh node's start and first lease cycle, before the burst it should meet."""
RECOVERY_SLACK_S: Final = 15.0
"""How much longer than the bound the run waits for region B before it reports."""
DRAIN_POLL_S: Final = 1.0


def forced(stage: Stage, timeline: GameDayTimeline) -> VariantRecord:
    config, pair = stage.config, stage.pair
    burst = timeline.t0 + config.healthy_periods * config.period_s
    sleep_until(burst - config.lag_lead_s)
    loss_start = time.time()
    pair.wait_received()  # everything committed before loss_start is on the standby
    pair.pause_streaming()
    timeline.note("streaming to the standby paused: from now on a crash loses commits")
    sleep_until(burst + config.crash_offset_s)
    lag = pair.replication_lag()
    crash_at = time.time()
    pair.stop_primary("immediate")
    crash_done = time.time()
    timeline.note(
        f"primary crashed (immediate stop), {crash_at - burst:.1f} s after the burst; "
        f"lag {lag.lag_bytes:,} bytes, last replayed commit {lag.replay_age_s or 0:.1f} s old"
    )
    promotion_s = pair.promote_standby()
    failover = region_failover(REGION_B, stage.standby_url, stage.primary_url)
    timeline.note(
        f"standby promoted in {promotion_s:.2f} s; failover to b in {failover.seconds:.2f} s: "
        f"epoch {failover.epoch}; old primary not fenced "
        f"({(failover.outcome.get('old_primary') or {}).get('error')})"
    )
    record = VariantRecord(
        "forced", timeline.t0, burst, crash_at, crash_done,
        {"promotion": promotion_s, "failover command": failover.seconds}, failover,
        stage.epoch_a, stage.standby_url, stage.primary_url, loss_start=loss_start, lag=lag,
    )  # fmt: skip
    _recover(stage, record, timeline)
    pair.start_old_primary_isolated()
    socket_url = pair.primary.local_url(DATABASE)
    timeline.note("old primary started isolated (Unix socket only)")
    if config.unsafe_restart:
        record.unsafe = _unsafe_restart(stage, socket_url, record, timeline)
    record.region_a_before = region_metrics(stage.region_a.nodes)
    record.fence = region_failover(REGION_B, stage.standby_url, socket_url)
    timeline.note(
        f"failover run again: new primary changed: {record.fence.outcome['changed']}, "
        f"old primary fenced: {record.fence.old_fenced}"
    )
    pair.start_old_primary()
    record.reopened_at = time.time()
    timeline.note("old primary reopened on TCP: region A's nodes may reconnect")
    watched = _observe_region_a(stage, record, timeline)
    return _finish(
        stage, record, timeline, max(watched, burst + config.after_periods * config.period_s)
    )


def switchover(stage: Stage, timeline: GameDayTimeline) -> VariantRecord:
    config, pair = stage.config, stage.pair
    burst = timeline.t0 + config.switchover_healthy_periods * config.period_s
    sleep_until(burst + config.switch_offset_s - 1.0)
    before = region_metrics(stage.region_a.nodes)
    sleep_until(burst + config.switch_offset_s)
    fence = region_failover(REGION_B, stage.primary_url)
    timeline.note(
        f"failover to b on the primary in {fence.seconds:.2f} s: epoch {fence.epoch}, "
        f"{fence.outcome['revoked']} leases revoked; region A fenced"
    )
    switched = time.time()
    pair.switchover()
    switch_s = time.time() - switched
    timeline.note(f"switch-over (clean stop, catch-up, promotion) in {switch_s:.2f} s")
    record = VariantRecord(
        "switchover", timeline.t0, burst, fence.started, fence.done,
        {"failover command (fence)": fence.seconds, "switch-over": switch_s}, fence,
        stage.epoch_a, stage.standby_url, stage.primary_url, region_a_before=before,
    )  # fmt: skip
    _recover(stage, record, timeline)
    pair.start_old_primary()
    record.reopened_at = time.time()
    timeline.note("old primary (fenced before the switch) started again on TCP")
    watched = _observe_region_a(stage, record, timeline)
    return _finish(
        stage, record, timeline, max(watched, burst + config.after_periods * config.period_s)
    )


def _recover(stage: Stage, record: VariantRecord, timeline: GameDayTimeline) -> None:
    bound = RecoveryBound.of(stage.config, record.switch_s)
    record.recovery = recovery = watch_recovery(
        stage, record.new_url, record.fault_at, epoch_floor(record.epoch_after),
        bound.first_delivery_s + RECOVERY_SLACK_S,
    )  # fmt: skip
    shown = [
        f"{what} +{at - record.fault_at:.1f} s"
        for what, at in (
            ("nodes ready", recovery.nodes_ready_at),
            ("all partitions held", recovery.all_held_at),
            ("first delivery", recovery.first_delivery_at),
        )
        if at is not None
    ]
    timeline.note(f"region B: {', '.join(shown) or 'not back'}")


def _unsafe_restart(
    stage: Stage, url: str, record: VariantRecord, timeline: GameDayTimeline
) -> UnsafeRestart:
    """A fresh region-A node on the isolated, still unfenced old primary: it takes every
    partition (region A is active there at the old epoch) and runs the fires since the crash
    again. Stopped (gracefully) once it has delivered a burst's worth, or after a bound."""
    config = stage.config
    lead = config.lease_ttl_s + UNSAFE_NODE_START_S
    next_burst = first_fire_after(time.time() + lead, config.period_s)
    if first_fire_after(record.fault_done, config.period_s) > time.time():
        sleep_until(next_burst - lead)  # no fire since the crash to catch up yet: meet one
    settings = RegionNodeSettings(
        url, config.lease_ttl_s, config.lease_safety_margin_s, config.attempt_lease_s,
        region=REGION_A,
    )  # fmt: skip
    node = NodeProcess(f"{REGION_A}-unfenced", settings, stage.work)
    stage.extra_nodes.append(node)
    started = time.time()
    node.start()
    node.wait_ready()
    timeline.note(f"hazard: {node.node_id} started on the unfenced old primary")
    floor = epoch_floor(record.epoch_after)
    deadline = next_burst + config.pipeline_s + 3 * config.lease_ttl_s
    while time.time() < deadline:
        theirs = [d for d in read_deliveries(stage.sink.path) if d[3] < floor and d[0] >= started]
        if len(theirs) >= config.schedules:
            break
        time.sleep(DRAIN_POLL_S)
    node.stop()
    exited = time.time()
    timeline.note(f"hazard: {node.node_id} stopped")
    return UnsafeRestart(node.node_id, started, exited, record.epoch_before)


def _observe_region_a(stage: Stage, record: VariantRecord, timeline: GameDayTimeline) -> int:
    """Until region A's nodes stand by at the new epoch, then across one more burst (whose
    instant it returns)."""
    config = stage.config
    timeout_s = STANDBY_RETRY_S + 2 * config.renew_interval_s + RECOVERY_SLACK_S
    record.standing_by_at, _ = wait_standing_by(stage.region_a.nodes, record.epoch_after, timeout_s)
    if record.standing_by_at is None:
        timeline.note("region A's nodes did not all report standing by")
    else:
        timeline.note(f"region A's nodes reconnected and stand by at epoch {record.epoch_after}")
    watched = first_fire_after(time.time() + 1.0, config.period_s)
    sleep_until(watched + config.pipeline_s + 2 * config.renew_interval_s)
    record.region_a_after = region_metrics(stage.region_a.nodes)
    beats = audit.fetch(
        record.old_url, "SELECT node_id FROM nodes WHERE last_seen_at >= to_timestamp($1)",
        record.reopened_at,
    )  # fmt: skip
    record.reconnected = {row["node_id"] for row in beats}
    return watched


def _finish(
    stage: Stage, record: VariantRecord, timeline: GameDayTimeline, last_fire: float
) -> VariantRecord:
    """Close the window after ``last_fire`` and wait until every checked fire succeeded on
    the new primary and reached the sink, or until the last is past its bound."""
    config = stage.config
    record.window = (record.t0, float(last_fire) + 1.0)
    expected = {
        execution_id(s.schedule_id, t) for s in stage.specs for t in s.fires(*record.window)
    }
    sleep_until(record.window[1])
    bound = RecoveryBound.of(config, record.switch_s)
    deadline = max(time.time(), last_fire + bound.per_fire_s)
    while time.time() < deadline:
        succeeded = audit.count_succeeded(record.new_url, *record.window)
        if succeeded >= len(expected) and expected <= stage.sink.keys():
            timeline.note(f"all {len(expected):,} checked fires succeeded and were delivered")
            break
        time.sleep(DRAIN_POLL_S)
    else:
        timeline.note("the bound has passed for every checked fire; checking what arrived")
    return record


VARIANTS: Final = {"forced": forced, "switchover": switchover}


@dataclass
class VariantResult:
    config: GameDayConfig
    record: VariantRecord
    figures: list[Figure]
    bound: RecoveryBound
    timings: dict[str, float] = field(default_factory=dict)
    workdir: Path | None = None

    @property
    def violations(self) -> list[Figure]:
        return [figure for figure in self.figures if figure.ok is False]


def run_variant(name: str, config: GameDayConfig, work: Path, quiet: bool) -> VariantResult:
    """Set up a stage, run one variant on it, stop the nodes and the sink, check; everything
    is stopped and the pair deleted before this returns (or raises)."""
    began = time.monotonic()
    with contextlib.ExitStack() as stack:
        stage = set_up(config, work, stack)
        setup_s = time.monotonic() - began
        t0 = first_fire_after(time.time() + FIRST_FIRE_MARGIN_S, config.period_s)
        timeline = GameDayTimeline(t0, quiet)
        timeline.note(
            f"[{name}] {config.schedules} schedules every {config.period_s} s; region A: "
            f"{config.region_a_nodes} nodes on the primary, region B: {config.region_b_nodes} "
            f"on the standby (set up in {setup_s:.1f} s); fires from t0 on are checked"
        )
        record = VARIANTS[name](stage, timeline)
        stop_all([*stage.all_nodes(), *stage.extra_nodes])
        stage.sink.stop()
        timeline.note("nodes and sink stopped; checking")
        record.timeline = timeline.events
        figures = judge(stage, record, collect(stage, record))
    bound = RecoveryBound.of(config, record.switch_s)
    timings = {"setup_s": setup_s, "total_s": time.monotonic() - began}
    return VariantResult(config, record, figures, bound, timings)
