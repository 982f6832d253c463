"""Folded claims in the simulator (docs/ledger.md, "Folded claims"; the ``folded`` scenario):
an attempt started without a recorded claim, cut short by a crash or by a pause past its
node's lease, runs again on the partition's next owner and ends once in the ledger, and the
zombie's late completion is refused by the fence."""

from __future__ import annotations

import io
from collections import defaultdict

from simulations.params import derive
from simulations.runner import run_simulation
from simulations.workload import HOOK_TYPE

SEEDS = (1, 3, 6, 8)


def test_folded_attempts_cut_short_run_again_elsewhere_and_end_once() -> None:
    again_anywhere = 0
    refused_anywhere = 0
    for seed in SEEDS:
        trace = io.StringIO()
        result = run_simulation(derive(seed, "folded"), trace_file=trace)
        # No missed fire, no duplicate effect, never early, every write fenced.
        assert result.violations == [], (seed, result.violations[:5])
        assert result.folded > 0, seed
        nodes: dict[tuple[str, int], set[str]] = defaultdict(set)
        for delivery in result.deliveries:
            nodes[(delivery.execution_id, delivery.attempt)].add(delivery.node)
        # A claim gives every run a new attempt number; a fold cut short left the ledger as
        # it was, so the partition's next owner ran the same attempt again.
        again = {key for key, ran_on in nodes.items() if len(ran_on) > 1}
        executions = {e.execution_id: e for e in result.executions}
        for execution_id, attempt in again:
            execution = executions[execution_id]
            assert execution.task_type == HOOK_TYPE
            assert execution.status.is_terminal
            assert execution.attempt >= attempt
        again_anywhere += len(again)
        # A paused node's completion, written after its lease ran out, is refused.
        refused_anywhere += sum(
            " executions_finish lease-lost" in line for line in trace.getvalue().splitlines()
        )
    assert again_anywhere > 0
    assert refused_anywhere > 0
