"""The game day's checkers: what region B delivered, what was delivered twice and why, and
whether region A stayed fenced.

Read after the nodes and the sink have stopped, from outside the engine: the sink's file, the
audit triggers' logs on both databases (:mod:`simulations.chaos.audit`, installed before the
base backup, so the standby has them too), the nodes' logs. Each checker returns
:class:`~simulations.chaos.checks.Figure` rows; ``ok=False`` is a violation.

Deliveries are told apart by their fencing token (the webhook's ``X-Carillon-Fencing-Token``):
a token below :func:`~simulations.regions.config.epoch_floor` of the new epoch was issued
under an older epoch -- by region A's database; region B only ever holds newer ones.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Final

from simulations.chaos import audit
from simulations.chaos.audit import AuditData
from simulations.chaos.checks import Delivery, Figure, check_fires, lease_epochs
from simulations.chaos.sink import read_deliveries
from simulations.chaos.workload import execution_id, parse_execution_id
from simulations.chaos.zombie import log_reports
from simulations.regions.config import RecoveryBound, duplicate_window, epoch_floor
from simulations.regions.observe import VariantRecord
from simulations.regions.stage import Stage

OLD_PRIMARY_SINCE_SQL: Final = {
    "lease_changes": "SELECT count(*) FROM chaos.lease_history "
    "WHERE owner_id IS NOT NULL AND at >= to_timestamp($1)",
    "execution_writes": "SELECT count(*) FROM chaos.execution_writes WHERE at >= to_timestamp($1)",
}


@dataclass(frozen=True)
class OldPrimary:
    """What region A's database shows at the end (reopened on TCP)."""

    active_region: str
    region_epoch: int
    lease_changes_after_fence: int
    execution_writes_after_fence: int
    max_token: int


def read_old_primary(url: str, record: VariantRecord) -> OldPrimary:
    def count(name: str) -> int:
        return int(audit.fetch(url, OLD_PRIMARY_SINCE_SQL[name], record.fenced_at)[0][0])

    settings = audit.fetch(url, "SELECT active_region, region_epoch FROM cluster_settings")[0]
    max_token = audit.fetch(url, "SELECT coalesce(max(fencing_token), 0) FROM chaos.lease_history")
    return OldPrimary(
        settings["active_region"], settings["region_epoch"], count("lease_changes"),
        count("execution_writes"), int(max_token[0][0]),
    )  # fmt: skip


@dataclass(frozen=True)
class Evidence:
    deliveries: list[Delivery]
    """Every delivery but those of the staged unsafe restart."""
    unsafe_deliveries: list[Delivery]
    new: AuditData
    old: OldPrimary
    region_a_logs: dict[str, list[dict[str, Any]]]


def collect(stage: Stage, record: VariantRecord) -> Evidence:
    floor = epoch_floor(record.epoch_after)
    unsafe = record.unsafe
    staged: list[Delivery] = []
    others: list[Delivery] = []
    for delivery in read_deliveries(stage.sink.path):
        by_unsafe = (
            unsafe is not None
            and delivery[3] < floor
            and unsafe.started <= delivery[0] <= unsafe.exited
        )
        (staged if by_unsafe else others).append(delivery)
    logs = {node.node_id: list(node.log_records()) for node in stage.region_a.nodes}
    return Evidence(
        others, staged, audit.read_all(record.new_url, *record.window),
        read_old_primary(record.old_url, record), logs,
    )  # fmt: skip


def judge(stage: Stage, record: VariantRecord, evidence: Evidence) -> list[Figure]:
    bound = RecoveryBound.of(stage.config, record.switch_s)
    late_allowance = max(0.0, record.fault_at - record.burst)
    fires, _ = check_fires(
        stage.specs, record.window, stage.created, evidence.new.executions,
        evidence.deliveries, bound.per_fire_s + late_allowance,
    )  # fmt: skip
    return [
        *fires,
        *_after_fault(stage, record, evidence),
        *_duplicates(stage, record, evidence),
        *_recovery(record, bound),
        *_fence(stage, record, evidence),
        *_tokens(record, evidence),
        *_hazard(record, evidence),
    ]


def _after_fault(stage: Stage, record: VariantRecord, evidence: Evidence) -> list[Figure]:
    after = {
        execution_id(s.schedule_id, t)
        for s in stage.specs
        for t in s.fires(record.fault_at, record.window[1])
    }
    keys = {key for _, key, *_ in evidence.deliveries}
    missing = after - keys
    return [
        Figure(
            "fires planned after the fault: delivered of expected",
            f"{len(after & keys):,} of {len(after):,}",
            "all",
            not missing and bool(after),
        )
    ]


def _duplicates(stage: Stage, record: VariantRecord, evidence: Evidence) -> list[Figure]:
    floor = epoch_floor(record.epoch_after)
    by_key: dict[str, list[str]] = {}
    for _, key, _, token, _ in sorted(evidence.deliveries):
        by_key.setdefault(key, []).append("A" if token < floor else "B")
    repeated = {key: sources for key, sources in by_key.items() if len(sources) > 1}
    extra = sum(len(sources) - 1 for sources in repeated.values())
    kinds = Counter(f"{sources[0]} then {'+'.join(sources[1:])}" for sources in repeated.values())
    named = [parse_execution_id(key) for key in repeated]
    not_fires = sum(1 for parsed in named if parsed is None)
    # Forced: the loss window opens when streaming stopped. Switch-over: nothing is lost, but
    # attempts region A claimed before the fence committed may still be delivered by it and
    # then, their completions refused, run again by region B.
    opened = record.fault_at if record.loss_start is None else record.loss_start
    low, high = duplicate_window(stage.config, opened, record.fault_done)
    outside = sum(
        len(repeated[key]) - 1
        for key, parsed in zip(repeated, named, strict=True)
        if parsed is None or not low <= parsed[1] <= high
    )
    figures = [
        Figure(
            "duplicate-delivery window (planned, from the fault)",
            f"{low - record.fault_at:+.1f} .. {high - record.fault_at:+.1f} s",
        ),
        Figure("duplicate deliveries by source (token epoch)", _counts(kinds) or "-"),
        Figure("duplicate deliveries planned outside the window", f"{outside:,}", "0",
               outside == 0),
        Figure("duplicates whose key is no execution id", f"{not_fires:,}", "0", not_fires == 0),
    ]  # fmt: skip
    if record.loss_start is None:
        committed = record.fault_done - record.burst
        before = committed < 0
        figures.append(
            Figure(
                f"duplicate deliveries (fence committed {committed:+.1f} s from the burst)",
                f"{extra:,}",
                "0" if before else "window (it met the burst)",
                extra == 0 if before else None,
            )
        )
    return figures


def _recovery(record: VariantRecord, bound: RecoveryBound) -> list[Figure]:
    recovery = record.recovery
    figures = [Figure(f"  {name}", f"{value:.2f} s") for name, value in record.switch_terms.items()]

    def since(at: float | None) -> str:
        return "never" if at is None else f"{at - record.fault_at:.2f} s"

    first = None if recovery is None else recovery.first_delivery_at
    held = None if recovery is None else recovery.all_held_at
    rto = None if first is None else first - record.fault_at
    figures += [
        Figure(
            "region B nodes ready (the last one)",
            since(None if recovery is None else recovery.nodes_ready_at),
        ),
        Figure(
            "RTO, planning: every partition held by region B",
            since(held),
            f"<= {bound.takeover_s:.1f} s",
            held is not None and held - record.fault_at <= bound.takeover_s,
        ),
        Figure(
            "RTO, delivering: first delivery by region B",
            since(first),
            f"<= {bound.first_delivery_s:.1f} s",
            rto is not None and rto <= bound.first_delivery_s,
        ),
    ]
    if record.lag is not None and record.loss_start is not None:
        figures += [
            Figure(
                "replication lag at the crash",
                f"{record.lag.lag_bytes:,} bytes, last replayed commit "
                f"{record.lag.replay_age_s or 0:.1f} s old",
            ),
            Figure(
                "loss window (streaming paused -> crash)",
                f"{record.fault_at - record.loss_start:.2f} s",
            ),
        ]
    return figures


def _fence(stage: Stage, record: VariantRecord, evidence: Evidence) -> list[Figure]:
    old, floor = evidence.old, epoch_floor(record.epoch_after)
    config = stage.config
    a_after_fence = [d for d in evidence.deliveries if d[3] < floor and d[0] >= record.fenced_at]
    # Claimed before the fence committed, a handler may still start within its attempt lease.
    a_late = [d for d in a_after_fence if d[0] > record.fenced_at + config.attempt_lease_s]
    a_ids = stage.region_a.node_ids
    standing = [
        node
        for node, metrics in record.region_a_after.items()
        if metrics.get("standby") == 1.0 and metrics.get("epoch") == record.epoch_after
    ]
    acquired = sum(
        record.region_a_after.get(node, {}).get("acquisitions", 0.0) - metrics["acquisitions"]
        for node, metrics in record.region_a_before.items()
        if "acquisitions" in metrics
    )
    reports = Counter[str]()
    for records in evidence.region_a_logs.values():
        reports.update(log_reports(records, record.fenced_at))
    losses = {
        reason: sum(
            m.get(f"losses_{reason}", 0.0)
            - record.region_a_before.get(node, {}).get(f"losses_{reason}", 0.0)
            for node, m in record.region_a_after.items()
        )
        for reason in ("refused", "expired")
    }
    figures = []
    if record.fence is not None:
        down = record.first_command.outcome.get("old_primary") or {}
        fence = record.fence.outcome
        old_fenced = (fence.get("old_primary") or {}).get("region_epoch")
        figures += [
            Figure("failover with the old primary down: exit 0, old primary",
                   "fenced" if down.get("fenced") else "not fenced (warned)", "not fenced",
                   down.get("fenced") is False and "unavailable" in str(down.get("error"))),
            Figure("failover again (old isolated): new unchanged, old fenced",
                   f"changed {fence['changed']}, old at epoch {old_fenced}",
                   f"False, {record.epoch_after}",
                   fence["changed"] is False and old_fenced == record.epoch_after),
        ]  # fmt: skip
    return [
        *figures,
        Figure("old primary: active region, epoch", f"{old.active_region}, {old.region_epoch}",
               f"b, {record.epoch_after}",
               (old.active_region, old.region_epoch) == ("b", record.epoch_after)),
        Figure("region A nodes reconnected to it (heartbeats after reopening)",
               f"{len(record.reconnected & a_ids)} of {len(a_ids)}", str(len(a_ids)),
               a_ids <= record.reconnected),
        Figure("region A nodes standing by at the new epoch (/metrics)",
               f"{len(standing)} of {len(a_ids)}", str(len(a_ids)), len(standing) == len(a_ids)),
        Figure("  all of them, after the reopening", "never" if record.standing_by_at is None
               else f"{record.standing_by_at - (record.reopened_at or 0):.1f} s"),
        Figure("old primary: lease acquisitions/renewals after the fence",
               f"{old.lease_changes_after_fence:,}", "0", old.lease_changes_after_fence == 0),
        Figure("old primary: execution writes after the fence",
               f"{old.execution_writes_after_fence:,}", "0",
               old.execution_writes_after_fence == 0),
        Figure("region A leases acquired after the fence (/metrics)", f"{acquired:g}", "0",
               acquired == 0),
        Figure("region A requests after the fence (claimed before it)",
               f"{len(a_after_fence):,}"),
        Figure("region A requests later than the fence + attempt lease", f"{len(a_late):,}",
               "0", not a_late),
        Figure("region A after the fence: leases lost refused / expired (/metrics)",
               f"{losses['refused']:g} / {losses['expired']:g}"),
        Figure("region A after the fence: refusals / step-downs / abandoned (logs)",
               f"{reports['refused']} / {reports['stepped_down']} / {reports['abandoned']}"),
    ]  # fmt: skip


def _tokens(record: VariantRecord, evidence: Evidence) -> list[Figure]:
    floor = epoch_floor(record.epoch_after)
    since = record.first_command.done  # a transaction begun after the failover committed
    # An acquisition is the first row of its (partition, token); renewals of region A's
    # leases may still commit while the failover waits for their row locks.
    acquired = {
        key
        for key, epoch in lease_epochs(evidence.new.leases).items()
        if epoch.acquired_at >= since
    }
    below = sorted(token for _, token in acquired if token < floor)
    lowest = min((token for _, token in acquired), default=0)
    b_tokens = [d[3] for d in evidence.deliveries if d[0] >= since and d[3] >= floor]
    return [
        Figure(
            f"leases acquired after the failover (epoch {record.epoch_after})",
            f"{len(acquired):,}",
        ),
        Figure(
            "  with a token below the epoch's floor",
            f"{len(below):,}",
            f"0 (floor {floor:,})",
            not below and bool(acquired),
        ),
        Figure(
            "  lowest new token above every token region A held",
            f"{lowest:,} > {evidence.old.max_token:,}",
            "yes",
            lowest > evidence.old.max_token,
        ),
        Figure("deliveries by region B (new-epoch tokens)", f"{len(b_tokens):,}"),
    ]


def _hazard(record: VariantRecord, evidence: Evidence) -> list[Figure]:
    unsafe = record.unsafe
    if unsafe is None:
        return []
    staged = evidence.unsafe_deliveries
    floor = epoch_floor(record.epoch_after)
    keys_b = {key for _, key, _, token, _ in evidence.deliveries if token >= floor}
    again = sum(1 for _, key, *_ in staged if key in keys_b)
    not_fires = sum(1 for _, key, *_ in staged if parse_execution_id(key) is None)
    return [
        Figure(
            f"hazard: {unsafe.node_id} on the unfenced old primary: deliveries",
            f"{len(staged):,} in {unsafe.exited - unsafe.started:.0f} s",
            "documented",
        ),
        Figure("hazard:   of which region B had delivered too", f"{again:,}", "same keys"),
        Figure("hazard:   under another key (a second effect)", f"{not_fires:,}", "0",
               not_fires == 0),
    ]  # fmt: skip


def _counts(kinds: Counter[str]) -> str:
    return ", ".join(f"{kind}: {n:,}" for kind, n in sorted(kinds.items()))
