"""Folded claims in the simulator: which simulated task types fold.

The engine folds the claims of short attempts of handler kinds that run outside the node
(``engine/actors/task_kinds.py``, ``FOLDING_KINDS``; docs/ledger.md, "Folded claims"), never
those of a ``python`` handler. The simulator's handler is a python callable, yet it stands
for a receiver outside the node: its effects go to the sinks, a paused process's handler
sends nothing until it resumes and a crashed one's never delivers. So a run may name task
types (``SimParams.folding``) whose attempts fold as a webhook's would, under the same
bound (timeout and grace) and every other rule; for the length of the run, and restored
after it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from engine.actors import task_kinds
from engine.core.retry_policy import ATTEMPT_OVERRUN_S
from engine.handlers import Handler
from engine.model import TaskType


@contextmanager
def folding(task_types: tuple[str, ...]) -> Iterator[None]:
    """Within the block, attempts of ``task_types`` fold as an out-of-process kind's do."""
    if not task_types:
        yield
        return
    engine_rule = task_kinds.fold_bound_s
    names = frozenset(task_types)

    def fold_bound_s(task_type: TaskType, handler: Handler) -> float | None:
        if task_type.name in names and task_type.max_concurrency_cluster is None:
            return task_type.timeout_s + ATTEMPT_OVERRUN_S
        return engine_rule(task_type, handler)

    setattr(task_kinds, "fold_bound_s", fold_bound_s)  # noqa: B010 -- a module's rule, swapped
    try:
        yield
    finally:
        setattr(task_kinds, "fold_bound_s", engine_rule)  # noqa: B010
