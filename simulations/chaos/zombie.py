"""The zombie check: a node paused past its lease must have every fenced write refused.

While the node is stopped (SIGSTOP) the others take its partitions, each with a new fencing
token. When it resumes (SIGCONT) its actors still hold the old fences and act on them at once
-- renewals, planner writes, claims, extensions, completions whose handlers were in flight.
Three independent views must agree that none of those writes took effect:

* the database triggers' write log: no write under one of the zombie's pre-pause tokens
  after the partition's next acquisition (the general fencing check covers every node; this
  one names the zombie's writes and its completions);
* the zombie's ``carillon_lease_losses_total``: it went up by at least the number of
  partitions the zombie held when it was stopped (each dropped once, as ``refused`` when the
  database turned a write down, as ``expired`` when the trust window had run out first);
* the zombie's log after SIGCONT: the refusals and step-downs it reported.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final

from simulations.chaos.audit import ExecutionWrite
from simulations.chaos.checks import Figure, LeaseEpoch

REFUSED_MESSAGES: Final = (
    "lost the lease of partition",  # a renewal the database refused
    "is no longer held with this owner",  # LeaseLost raised by a fenced write
    "completions of lost partitions",  # a completion batch refused
    "lease was lost",  # an attempt-lease extension refused
)
STEPPED_DOWN_MESSAGES: Final = ("trust window ended", "lease no longer trusted")
ABANDONED_MESSAGE: Final = "abandoned"
COMPLETIONS: Final = frozenset({"succeeded", "failed", "dead-letter"})


@dataclass
class ZombieRecord:
    """What the run observed around the pause."""

    node_id: str
    stopped_wall: float
    resumed_wall: float = 0.0
    held_at_stop: dict[int, int] = field(default_factory=dict)
    """Partition -> fencing token the zombie held (by the database) just before SIGSTOP."""
    losses_before: dict[str, float] = field(default_factory=dict)
    losses_after: dict[str, float] = field(default_factory=dict)


def _log_time(record: dict[str, Any]) -> float:
    try:
        return datetime.fromisoformat(str(record["ts"]).replace("Z", "+00:00")).timestamp()
    except (KeyError, ValueError):
        return 0.0


def log_reports(records: list[dict[str, Any]], since_wall: float) -> dict[str, int]:
    """The zombie's refusals, step-downs and abandoned attempts logged after ``since_wall``."""
    counts = {"refused": 0, "stepped_down": 0, "abandoned": 0}
    for record in records:
        if _log_time(record) < since_wall:
            continue
        message = str(record.get("msg", ""))
        if any(text in message for text in REFUSED_MESSAGES):
            counts["refused"] += 1
        elif any(text in message for text in STEPPED_DOWN_MESSAGES):
            counts["stepped_down"] += 1
        if ABANDONED_MESSAGE in message:  # an extension refused, or the partition dropped
            counts["abandoned"] += 1
    return counts


def check_zombie(
    zombie: ZombieRecord,
    epochs: dict[tuple[int, int], LeaseEpoch],
    writes: list[ExecutionWrite],
    log_records: list[dict[str, Any]],
) -> tuple[list[Figure], dict[str, object]]:
    held = zombie.held_at_stop
    successors: dict[int, LeaseEpoch] = {}
    for (partition, token), epoch in epochs.items():
        if partition in held and token > held[partition]:
            current = successors.get(partition)
            if current is None or token < current.token:
                successors[partition] = epoch
    taken = [p for p, e in successors.items() if e.acquired_wall < zombie.resumed_wall]
    old_fences = set(held.items())
    after_resume = [
        w
        for w in writes
        if (w.partition_id, w.fencing_token) in old_fences and w.wall >= zombie.resumed_wall
    ]
    stale = [
        w
        for w in after_resume
        if w.partition_id in successors and w.at >= successors[w.partition_id].acquired_at
    ]
    completions = [w for w in stale if w.new_status in COMPLETIONS]
    losses = sum(zombie.losses_after.values()) - sum(zombie.losses_before.values())
    by_reason = {
        reason: zombie.losses_after.get(reason, 0.0) - zombie.losses_before.get(reason, 0.0)
        for reason in sorted(set(zombie.losses_after) | set(zombie.losses_before))
    }
    logged = log_reports(log_records, zombie.resumed_wall)
    pause_s = zombie.resumed_wall - zombie.stopped_wall
    figures = [
        Figure(f"zombie {zombie.node_id}: paused", f"{pause_s:.1f} s"),
        Figure("zombie: partitions taken over during the pause", f"{len(taken)} of {len(held)}",
               f"{len(held)}", len(taken) == len(held) and bool(held)),
        Figure("zombie: writes under its old tokens after SIGCONT",
               f"{len(after_resume)} ({len(after_resume) - len(stale)} begun before the pause)"),
        Figure("zombie: stale writes accepted", f"{len(stale)}", "0", not stale),
        Figure("zombie: completions accepted after takeover", f"{len(completions)}", "0",
               not completions),
        Figure("zombie: lease losses counted after SIGCONT",
               f"{losses:g} ({', '.join(f'{r} {v:g}' for r, v in by_reason.items())})",
               f">= {len(held)} held", losses >= len(held) and bool(zombie.losses_after)),
        Figure("zombie: writes refused by the database (log)", f"{logged['refused']}"),
        Figure("zombie: partitions stepped down locally (log)", f"{logged['stepped_down']}"),
        Figure("zombie: attempts abandoned (log)", f"{logged['abandoned']}"),
    ]  # fmt: skip
    details: dict[str, object] = {
        "node_id": zombie.node_id,
        "held_at_stop": held,
        "taken_over": sorted(taken),
        "stale_writes": [w.__dict__ for w in stale[:20]],
        "lease_losses": by_reason,
        "log": logged,
    }
    return figures, details
