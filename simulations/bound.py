"""The start-delay bound, and the lengths derived from it (see ``docs/simulation.md``).

A fire planned at ``P`` must have its first attempt start (its handler invoked) by

* ``P + B`` when the cluster was healthy around ``P``, where the **healthy pipeline bound**
  ``B = clock_skew_bound + FETCH_INTERVAL + change_poll + 1 s``: the dispatcher's corrected
  clock may be off by up to the skew bound (its probes' precision); a fire nobody announced
  is found by the fallback fetch; a schedule created just before its first fire reaches the
  planner within a change poll; one second covers ledger round trips and the claim;
* otherwise by ``y + B``, where ``[x, y]`` is the *disrupted stretch* that meets
  ``[P, P + B]``: the union of every applied fault's interval and the heal, each extended
  by the **recovery time** ``R``. Clock faults (skews and steps of a node's wall clock) are
  not in it: the engine plans and dispatches on the database-corrected clock, so a wrong
  wall clock must not delay anything.

  ``R = TTL + TTL/3`` (a dead or frozen owner's lease runs out; a survivor takes it at once,
  or at its next lease cycle if that wake-up fails) ``+ HAND_BACK_DRAIN (5 s) +
  PLANNER_STOP_WAIT (2 s)`` (a graceful hand-back: its attempts in flight settle, then its
  planner stops) ``+ 6.5 s`` (the longest ledger retry backoff, with jitter) ``+ lookahead``
  ``+ attempt_lease + 10 s`` (an attempt claimed by a process that then died, or whose claim
  reply was lost, is re-queued once its attempt lease runs out, by a redeliverer round, and
  fetched) ``+ RESTART_DELAY (5 s)`` (a restarted node whose id is still registered is
  refused, and tried again).

The liveness phase lasts ``R + W + 60 s``, where the **completion allowance** ``W = B +
max_attempts x (longest handler run + backoff_max x 1.2 + FETCH_INTERVAL) + attempt_lease +
10 s`` is the time a fire needs, once startable, to run through all its attempts. Fires
planned within ``W`` of the end are not required to have finished.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from engine.actors.dispatcher import FETCH_INTERVAL_S_DEFAULT
from engine.actors.lease_keeper import HAND_BACK_DRAIN_S, PLANNER_STOP_WAIT_S
from engine.actors.redeliverer import REDELIVER_INTERVAL_S_DEFAULT
from engine.actors.retry import LEDGER_BACKOFF
from simulations.host import RESTART_DELAY_S
from simulations.scenario import Outage

if TYPE_CHECKING:
    from simulations.params import SimParams

RUN_S_MAX: Final = 30.0
"""The longest a schedule's handler works (``simulations.workload``)."""
HANG_FACTOR_MAX: Final = 3.0
"""A hanging handler works up to this many attempt leases (``simulations.effects``)."""
LIVENESS_MARGIN_S: Final = 60.0


def healthy_bound_s(params: SimParams) -> float:
    """``B``: the start delay of a fire planned while the cluster is healthy."""
    s = params.settings
    return s.clock_skew_bound_s + FETCH_INTERVAL_S_DEFAULT + s.change_poll_interval_s + 1.0


def recovery_s(params: SimParams) -> float:
    """``R``: how long after a fault ends the cluster may still be recovering."""
    s = params.settings
    backoff_max = LEDGER_BACKOFF.max_s * (1 + LEDGER_BACKOFF.jitter)
    return (
        s.lease_ttl_s
        + s.lease_ttl_s / 3
        + HAND_BACK_DRAIN_S
        + PLANNER_STOP_WAIT_S
        + backoff_max
        + s.lookahead_s
        + s.attempt_lease_s
        + REDELIVER_INTERVAL_S_DEFAULT
        + FETCH_INTERVAL_S_DEFAULT
        + RESTART_DELAY_S
    )


def failover_startup_s(params: SimParams) -> float:
    """How long after a region failover region B's nodes may take to hold the partitions:
    they start at the failover and acquire at their first lease cycle; a node that starts
    after another of its region takes its share at the next cycle (``TTL / 3``). The
    recovery time ``R`` is added on top, as after any disruption."""
    return params.settings.lease_ttl_s / 3


def completion_s(params: SimParams) -> float:
    """``W``: how long a startable fire may take to run through all its attempts."""
    s, task = params.settings, params.task
    longest_run = max(RUN_S_MAX, HANG_FACTOR_MAX * s.attempt_lease_s)
    per_attempt = longest_run + task.backoff_max_s * 1.2 + FETCH_INTERVAL_S_DEFAULT
    return (
        healthy_bound_s(params)
        + task.max_attempts * per_attempt
        + s.attempt_lease_s
        + REDELIVER_INTERVAL_S_DEFAULT
        + FETCH_INTERVAL_S_DEFAULT
    )


def liveness_s(params: SimParams) -> float:
    return round(recovery_s(params) + completion_s(params) + LIVENESS_MARGIN_S, 1)


def stale_s(params: SimParams) -> float:
    """How long after a retime a planner that has not heard of it yet may still write the
    old definition's fires: a recovery, plus the longest database outage."""
    outages = [f.duration_s for f in params.faults if isinstance(f, Outage)]
    return recovery_s(params) + max(outages, default=0.0)


def ahead_s(params: SimParams) -> float:
    """How far ahead of now a planner may have written fires: the lookahead, and the most a
    burst's lead may add to it (``NodeConfig.burst_lookahead_extra_s_max``)."""
    return params.settings.lookahead_s + params.settings.config("n").burst_lookahead_extra_s_max


class DelayBound:
    """The start-delay bound of each planned instant (seconds from the start of the run),
    given the ``windows`` during which the run was disturbed: each applied fault's interval
    (:func:`~simulations.scenario.disruption`) except clock faults, and the heal."""

    def __init__(self, params: SimParams, windows: list[tuple[float, float]]) -> None:
        self.healthy_s = healthy_bound_s(params)
        self.recovery_s = recovery_s(params)
        stretches: list[list[float]] = []
        for start, end in sorted(windows):
            end += self.recovery_s
            if stretches and start <= stretches[-1][1]:
                stretches[-1][1] = max(stretches[-1][1], end)
            else:
                stretches.append([start, end])
        self.stretches = [(a, b) for a, b in stretches]

    def bound_s(self, planned_s: float) -> float:
        """The most the first start of a fire planned at ``planned_s`` may lag it."""
        for start, end in self.stretches:
            # disturbed if the stretch meets [planned, planned + B]
            if start - self.healthy_s <= planned_s <= end:
                return max(end - planned_s, 0.0) + self.healthy_s
        return self.healthy_s
