"""Folded claims in the simulator (docs/ledger.md, "Folded claims"; the ``folded`` scenario):
an attempt started without a recorded claim, cut short by a crash or by a pause past its
node's lease, runs again on the partition's next owner and ends once in the ledger, and the
zombie's late completion is refused by the fence."""

from __future__ import annotations

import io
from collections import defaultdict

from simulations.params import derive
from simulations.runner import run_simulation
from simulations.sweep import Job, sweep
from simulations.workload import HOOK_TYPE

MID_FOLD_SEED = 5
"""A seed whose crash and pause land while folded attempts run or their completions
travel (found by sweeping the scenario's first seeds)."""


def test_a_folded_attempt_cut_short_runs_again_elsewhere_and_ends_once() -> None:
    trace = io.StringIO()
    result = run_simulation(derive(MID_FOLD_SEED, "folded"), trace_file=trace)
    assert result.violations == []  # no missed fire, no duplicate effect, fencing held
    assert result.folded > 0
    nodes: dict[tuple[str, int], set[str]] = defaultdict(set)
    for delivery in result.deliveries:
        nodes[(delivery.execution_id, delivery.attempt)].add(delivery.node)
    # A claim gives every run a new attempt number; a fold cut short left the ledger as it
    # was, so the next owner ran the same attempt again.
    again = {key for key, ran_on in nodes.items() if len(ran_on) > 1}
    assert again
    executions = {e.execution_id: e for e in result.executions}
    for execution_id, attempt in again:
        execution = executions[execution_id]
        assert execution.task_type == HOOK_TYPE
        assert execution.status.is_terminal
        assert execution.attempt >= attempt
    # The paused node's completion, written after its lease ran out, was refused.
    refused = [
        line for line in trace.getvalue().splitlines() if " executions_finish lease-lost" in line
    ]
    assert refused


def test_a_small_sweep_of_the_folded_scenario_passes() -> None:
    result = sweep([Job(seed, "folded") for seed in range(1, 5)], processes=2)
    assert result.failures == [], "\n".join(result.lines())
