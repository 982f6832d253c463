"""The checkers of a chaos run: effects, misses, start delay, fencing, and the zombie.

Each returns :class:`Figure` rows for the report; a figure whose ``ok`` is ``False`` is a
violation and makes the run exit non-zero. Everything is judged against an expectation
computed outside the engine (:mod:`simulations.chaos.workload`), the sink's own records and
the database triggers' write log (:mod:`simulations.chaos.audit`) -- never against what the
engine says about itself.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from simulations.chaos.audit import ExecutionWrite, LeaseChange, LedgerExecution
from simulations.chaos.config import EARLY_TOLERANCE_S
from simulations.chaos.workload import ScheduleSpec, execution_id, parse_execution_id

Delivery = tuple[float, str, int, int, float | None]
"""``(arrival_s, key, attempt, fencing_token, signed_at_s)`` as the sink recorded it."""


@dataclass(frozen=True)
class Figure:
    name: str
    value: str
    bound: str = ""
    ok: bool | None = None
    """``None``: informative only."""


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def check_fires(
    specs: list[ScheduleSpec],
    window: tuple[float, float],
    created_s: float,
    executions: list[LedgerExecution],
    deliveries: list[Delivery],
    bound_s: float,
) -> tuple[list[Figure], dict[str, object]]:
    """Misses, duplicate and unexpected effects, early and late starts."""
    by_id = {spec.schedule_id: spec for spec in specs}
    expected = {
        execution_id(spec.schedule_id, t): float(t) for spec in specs for t in spec.fires(*window)
    }
    succeeded = {e.execution_id for e in executions if e.status == "succeeded"}
    first: dict[str, float] = {}
    per_key: Counter[str] = Counter()
    for arrival, key, *_ in deliveries:
        per_key[key] += 1
        if key not in first or arrival < first[key]:
            first[key] = arrival
    not_succeeded = sorted(k for k in expected if k not in succeeded)
    by_id_in_ledger = {e.execution_id: e for e in executions}
    # Where the missing ones are stuck: status, error and attempt in the ledger.
    stuck = Counter(
        (e.status, e.error_code or "-", e.attempt) if e is not None else ("absent", "-", 0)
        for e in (by_id_in_ledger.get(k) for k in not_succeeded)
    )
    not_delivered = sorted(k for k in expected if k not in first)
    # An effect is one key. Two keys naming the same fire, or a key naming no fire of its
    # schedule (another instant, before the schedule existed), would be a duplicate effect.
    fires_of_keys: Counter[tuple[str, float]] = Counter()
    unexpected = []
    for key in first:
        parsed = parse_execution_id(key)
        spec = by_id.get(parsed[0]) if parsed else None
        if parsed is None or spec is None or not spec.is_fire(parsed[1]):
            unexpected.append(key)
            continue
        if parsed[1] < created_s:  # next_run_at starts at the first fire after creation
            unexpected.append(key)
        fires_of_keys[parsed] += 1
    duplicate_effects = sum(n - 1 for n in fires_of_keys.values() if n > 1)
    delays = [first[k] - t for k, t in expected.items() if k in first]
    early = [k for k, t in expected.items() if k in first and first[k] < t - EARLY_TOLERANCE_S]
    late = [k for k, t in expected.items() if k in first and first[k] - t > bound_s]
    in_window = sum(per_key[k] for k in expected)
    effects = sum(1 for k in expected if k in first)
    figures = [
        Figure("expected fires in the window", f"{len(expected):,}"),
        Figure(
            "missing: no succeeded execution", f"{len(not_succeeded):,}", "0",
            not not_succeeded,
        ),
        Figure("missing: no delivery at the sink", f"{len(not_delivered):,}", "0",
               not not_delivered),
        Figure("effects (distinct Idempotency-Keys)", f"{effects:,}"),
        Figure("raw deliveries", f"{in_window:,}"),
        Figure("duplicate deliveries (same key again)", f"{in_window - effects:,}",
               "at-least-once"),
        Figure("duplicate effects (of every key received)",
               f"{duplicate_effects:,} of {len(first):,}", "0", duplicate_effects == 0),
        Figure("unexpected effects (no such fire)", f"{len(unexpected):,}", "0", not unexpected),
        Figure("early starts (first delivery before planned)", f"{len(early):,}",
               f"0 (tolerance {EARLY_TOLERANCE_S:g} s)", not early),
        Figure("start delay p50 / p99", f"{_pct(delays, 0.5):.2f} / {_pct(delays, 0.99):.2f} s"),
        Figure("start delay max (first delivery - planned)",
               f"{max(delays, default=0.0):.2f} s", f"<= {bound_s:.1f} s", not late),
    ]  # fmt: skip
    details: dict[str, object] = {
        "not_succeeded": not_succeeded[:50],
        "not_succeeded_by_state": {
            f"{st} {err} attempt {n}": c for (st, err, n), c in stuck.items()
        },
        "not_delivered": not_delivered[:50],
        "unexpected": sorted(unexpected)[:50],
        "late": sorted(late)[:50],
        "early": sorted(early)[:50],
        "start_delay_max_s": max(delays, default=0.0),
        "deliveries": in_window,
        "effects": effects,
        "keys_received": len(first),
        "expected": len(expected),
    }
    return figures, details


@dataclass(frozen=True)
class LeaseEpoch:
    """One holding of a partition: from the acquisition that gave it ``token``."""

    partition_id: int
    token: int
    owner: str
    acquired_at: float
    acquired_wall: float
    valid_until: float
    """The last expiry a renewal set, or the next acquisition if that came first."""


def lease_epochs(changes: Iterable[LeaseChange]) -> dict[tuple[int, int], LeaseEpoch]:
    """The holdings of every partition, from the trigger's lease history.

    A release (owner cleared) does not end the epoch here: a write whose snapshot predates the
    release's commit is still a valid write, so the epoch ends at its last expiry or when the
    next owner acquired the partition, whichever is first.
    """
    grouped: dict[tuple[int, int], list[LeaseChange]] = defaultdict(list)
    for change in changes:
        grouped[(change.partition_id, change.fencing_token)].append(change)
    epochs: dict[tuple[int, int], LeaseEpoch] = {}
    for (partition, token), rows in grouped.items():
        owned = [row for row in rows if row.owner_id is not None]
        if not owned:
            continue
        expiries = [row.expires_at for row in owned if row.expires_at is not None]
        epochs[(partition, token)] = LeaseEpoch(
            partition, token, str(owned[0].owner_id), owned[0].at, owned[0].wall,
            max(expiries, default=owned[0].at),
        )  # fmt: skip
    for (partition, token), epoch in list(epochs.items()):
        later = [e for (p, t), e in epochs.items() if p == partition and t > token]
        if later:
            successor = min(later, key=lambda e: e.token)
            if successor.acquired_at < epoch.valid_until:
                epochs[(partition, token)] = LeaseEpoch(
                    partition, token, epoch.owner, epoch.acquired_at, epoch.acquired_wall,
                    successor.acquired_at,
                )  # fmt: skip
    return epochs


def fence_violations(
    writes: list[ExecutionWrite], epochs: dict[tuple[int, int], LeaseEpoch]
) -> tuple[list[ExecutionWrite], list[ExecutionWrite]]:
    """``(outside, unattributed)``: writes made when the lease they carry was not valid by the
    database's clock (or a claim credited to another node than the lease's owner), and writes
    naming a lease that never existed."""
    outside, unattributed = [], []
    for write in writes:
        if write.fencing_token is None:
            unattributed.append(write)
            continue
        epoch = epochs.get((write.partition_id, write.fencing_token))
        if epoch is None:
            unattributed.append(write)
        elif not epoch.acquired_at <= write.at < epoch.valid_until or (
            write.new_status == "running" and write.claimed_by != epoch.owner
        ):
            outside.append(write)
    return outside, unattributed


def check_fencing(
    writes: list[ExecutionWrite], epochs: dict[tuple[int, int], LeaseEpoch]
) -> tuple[list[Figure], dict[str, object]]:
    outside, unattributed = fence_violations(writes, epochs)
    owners = Counter(epoch.owner for epoch in epochs.values())
    figures = [
        Figure("lease acquisitions (fencing tokens issued)", f"{len(epochs):,}"),
        Figure("fenced execution writes audited", f"{len(writes):,}"),
        Figure("writes outside their lease", f"{len(outside):,}", "0", not outside),
        Figure("writes naming no lease", f"{len(unattributed):,}", "0", not unattributed),
    ]
    details: dict[str, object] = {
        "acquisitions_by_node": dict(owners),
        "outside": [w.__dict__ for w in outside[:20]],
        "unattributed": [w.__dict__ for w in unattributed[:20]],
    }
    return figures, details


@dataclass(frozen=True)
class AttemptLease:
    claimed_by: str | None
    ends_at: float
    """The latest expiry its claim or a renewal set (database clock)."""


def attempt_leases(writes: Iterable[ExecutionWrite]) -> dict[tuple[str, int], AttemptLease]:
    """Each attempt's claimer and the end of its attempt lease."""
    leases: dict[tuple[str, int], AttemptLease] = {}
    for write in writes:
        if write.new_status == "running" and write.attempt_expires_at is not None:
            key = (write.execution_id, write.attempt)
            known = leases.get(key)
            if known is None or write.attempt_expires_at > known.ends_at:
                claimer = write.claimed_by if known is None else known.claimed_by
                leases[key] = AttemptLease(claimer, write.attempt_expires_at)
    return leases


@dataclass(frozen=True)
class Freeze:
    """A node stopped and resumed: what it had in flight may go out late."""

    node_id: str
    resumed_wall: float
    in_flight_max: int
    """Its workers: the most handlers it can have had under way when it froze."""


def check_handler_starts(
    deliveries: list[Delivery],
    attempts: dict[tuple[str, int], AttemptLease],
    partition_of: dict[str, int],
    epochs: dict[tuple[int, int], LeaseEpoch],
    freeze: Freeze | None,
) -> tuple[list[Figure], dict[str, object]]:
    """Requests sent after their attempt lease had run out, and after the partition lease
    they were claimed under had ended.

    When a request left is bounded below by its signing time (``webhook-timestamp``, whole
    seconds, taken just before it is sent; same machine and clock as the database). Signed
    at or after the end of its attempt lease, a request went out when the partition's owner
    may already have re-queued and re-run the execution: two attempts at once. A node that
    froze may send late what its handlers had begun before (at most one per worker, right
    after it resumes); a node must never *start* a handler past its attempt lease, so every
    other late request is a violation, and so is a frozen node sending more than it had
    workers. Signed after the *partition* lease ended, a request is a hand-back or a node
    that lost its partition while its attempts were still leased to it: allowed (the attempt
    lease keeps others off the execution; the completion is refused and the execution runs
    again -- a duplicate delivery), counted for information.
    """
    frozen, late, after_partition = [], [], []
    for arrival, key, attempt, token, signed_at in deliveries:
        if signed_at is None:
            continue
        lease = attempts.get((key, attempt))
        if lease is not None and signed_at >= lease.ends_at:
            row = (arrival, key, attempt, token, signed_at, lease.ends_at, lease.claimed_by)
            woke = freeze is not None and lease.claimed_by == freeze.node_id
            if woke and freeze is not None and signed_at >= int(freeze.resumed_wall):
                frozen.append(row)
            else:
                late.append(row)
        epoch = epochs.get((partition_of.get(key, -1), token))
        if epoch is not None and signed_at >= epoch.valid_until:
            after_partition.append(epoch.owner)
    by_owner = Counter(after_partition)
    in_flight_max = 0 if freeze is None else freeze.in_flight_max
    figures = [
        Figure(
            "handlers started after their attempt lease ran out",
            f"{len(late):,}",
            "0",
            not late,
        ),
        Figure(
            "late requests of the frozen node (begun before)",
            f"{len(frozen):,}",
            f"<= {in_flight_max} workers",
            len(frozen) <= in_flight_max,
        ),
        Figure(
            "deliveries started after their partition lease ended",
            f"{len(after_partition):,}" + (f" ({dict(by_owner)})" if by_owner else ""),
            "hand-backs",
        ),
    ]
    return figures, {"sent_after_attempt_lease": late[:20], "frozen_late": frozen[:20]}
