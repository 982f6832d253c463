"""The per-execution metrics tally in plain Python (``engine/metrics/tallies.py``) and reach
prometheus-client when collected: what any read of the registry shows must equal one
``inc``/``observe`` per call.

The flush of a histogram tally writes into prometheus-client's own bucket and sum values (it
has no public call adding many observations at once); these tests pin that to the result of
observing each value, so an upgrade of prometheus-client that changes those internals fails
here rather than skewing a dashboard.
"""

from __future__ import annotations

import math
import random
from datetime import UTC, datetime

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram

from engine.metrics import DURATION_BUCKETS_MS, START_DELAY_BUCKETS_S, NodeMetrics, render
from engine.metrics.tallies import CounterTally, HistogramTally
from engine.model import Execution

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)


def execution(tenant: str = "acme", attempt: int = 1) -> Execution:
    return Execution(
        execution_id="s:1",
        schedule_id="s",
        tenant_id=tenant,
        task_type="hook",
        planned_at=T0,
        attempt=attempt,
        partition_id=0,
    )


def same(ours: dict[object, float], theirs: dict[object, float]) -> bool:
    """Equal samples; sums to the last bits (a tally adds its observations up first)."""
    return ours.keys() == theirs.keys() and all(
        ours[key] == pytest.approx(value, rel=1e-12) for key, value in theirs.items()
    )


def samples(registry: CollectorRegistry, prefix: str) -> dict[object, float]:
    """Every sample of the families named ``prefix...``, except the creation times."""
    found: dict[object, float] = {}
    for family in registry.collect():
        for sample in family.samples:
            if sample.name.startswith(prefix) and not sample.name.endswith("_created"):
                found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def edges(buckets: tuple[float, ...]) -> list[float]:
    """Values on, just below and just above every bucket bound, and the extremes."""
    values = [0.0, -0.0, math.inf, 1e-9, 1e12]
    for bound in buckets:
        values += [bound, math.nextafter(bound, -math.inf), math.nextafter(bound, math.inf)]
    return values


@pytest.mark.parametrize("buckets", [DURATION_BUCKETS_MS, START_DELAY_BUCKETS_S])
def test_a_flushed_histogram_tally_equals_one_observe_per_value(
    buckets: tuple[float, ...],
) -> None:
    ours, reference = CollectorRegistry(), CollectorRegistry()
    tally = HistogramTally(Histogram("h", "", ["l"], buckets=buckets, registry=ours).labels("x"))
    observed = Histogram("h", "", ["l"], buckets=buckets, registry=reference).labels("x")
    rng = random.Random(3)
    values = edges(buckets) + [-1.0] + [rng.uniform(-1, 2 * buckets[-1]) for _ in range(300)]
    for n, amount in enumerate(values):
        tally.observe(amount)
        observed.observe(amount)
        if n % 41 == 0:
            tally.flush()
            assert same(samples(ours, "h"), samples(reference, "h"))
    tally.flush()
    tally.flush()  # nothing pending: adds nothing
    assert same(samples(ours, "h"), samples(reference, "h"))


def test_a_flushed_counter_tally_adds_its_count_once() -> None:
    registry = CollectorRegistry()
    tally = CounterTally(Counter("c", "", registry=registry))
    tally.n += 3
    tally.flush()
    tally.flush()
    assert registry.get_sample_value("c_total") == 3


def test_duration_tallies_equal_one_observe_per_attempt() -> None:
    metrics = NodeMetrics()
    reference = CollectorRegistry()
    attempts = Counter("execution_attempts_total", "", ["status", "task_type"], registry=reference)
    duration = Histogram(
        "execution_duration_ms", "", ["task_type"], buckets=DURATION_BUCKETS_MS, registry=reference
    )
    dead = Counter("dead_letter_total", "", ["task_type"], registry=reference)
    rng = random.Random(5)
    values_ms = edges(DURATION_BUCKETS_MS) + [rng.uniform(0, 4e6) for _ in range(500)]
    for n, value_ms in enumerate(values_ms):
        task_type = ("hook", "mail")[n % 2]
        outcome = ("succeeded", "failed", "dead-letter")[n % 3]
        metrics.execution_finished(task_type, outcome, value_ms / 1000.0)
        attempts.labels(outcome, task_type).inc()
        duration.labels(task_type).observe(value_ms / 1000.0 * 1000.0)
        if outcome == "dead-letter":
            dead.labels(task_type).inc()
        if n % 97 == 0:  # reads in between see everything so far, and nothing twice
            for prefix in ("execution_attempts", "execution_duration_ms", "dead_letter"):
                assert same(samples(metrics.registry, prefix), samples(reference, prefix))
    for prefix in ("execution_attempts", "execution_duration_ms", "dead_letter"):
        assert same(samples(metrics.registry, prefix), samples(reference, prefix))


@pytest.mark.parametrize("tenant_labels", [False, True])
def test_start_tallies_equal_one_observe_per_start(tenant_labels: bool) -> None:
    metrics = NodeMetrics(tenant_labels=tenant_labels, label_values_max=2)
    reference = CollectorRegistry()
    labels = ["tenant"] if tenant_labels else []
    delay = Histogram(
        "carillon_start_delay_seconds",
        "",
        labels,
        buckets=sorted({*START_DELAY_BUCKETS_S, metrics.slo_target_s}),
        registry=reference,
    )
    starts = Counter("carillon_starts_total", "", labels, registry=reference)
    late = Counter("carillon_starts_late_total", "", labels, registry=reference)
    retries = Counter("carillon_retries_total", "", registry=reference)
    rng = random.Random(9)
    values = edges(START_DELAY_BUCKETS_S) + [rng.uniform(-5, 5000) for _ in range(500)]
    kept: list[str] = []  # the first two tenants started keep their label
    for n, value in enumerate(values):
        tenant = ("a", "b", "c")[n % 3]
        attempt = 2 if n % 11 == 0 else 1
        if attempt == 1 and tenant not in kept and len(kept) < 2:
            kept.append(tenant)
        label = tenant if tenant in kept else "other"
        metrics.execution_started(execution(tenant, attempt), value)
        if attempt > 1:
            retries.inc()
            continue
        clamped = max(value, 0.0)
        children = (delay, starts, late)
        if tenant_labels:
            children = (delay.labels(label), starts.labels(label), late.labels(label))
        children[0].observe(clamped)
        children[1].inc()
        if clamped > metrics.slo_target_s:
            children[2].inc()
    for prefix in ("carillon_start_delay", "carillon_starts", "carillon_retries"):
        assert same(samples(metrics.registry, prefix), samples(reference, prefix))


def test_a_scrape_shows_tallies_made_since_the_last_one() -> None:
    metrics = NodeMetrics()
    metrics.execution_finished("hook", "succeeded", 0.002)
    assert (
        b'execution_attempts_total{status="succeeded",task_type="hook"} 1.0'
        in render(metrics.registry)[0]
    )
    metrics.execution_finished("hook", "succeeded", 0.002)
    metrics.execution_started(execution(), 0.3)
    body = render(metrics.registry)[0]
    assert b'execution_attempts_total{status="succeeded",task_type="hook"} 2.0' in body
    assert b'execution_duration_ms_bucket{le="2.5",task_type="hook"} 2.0' in body
    assert b"carillon_starts_total 1.0" in body
    assert metrics.registry.get_sample_value("carillon_start_delay_seconds_sum") == 0.3


@pytest.mark.parametrize("tenant_labels", [False, True])
def test_a_batch_of_starts_and_successes_counts_as_each_one_alone(tenant_labels: bool) -> None:
    """A worker's batch of inline attempts reports its starts and successes at once
    (``executions_started_each``, ``executions_finished_each``): the same samples, and the
    same start window, as one call per attempt."""
    alone = NodeMetrics(tenant_labels=tenant_labels, label_values_max=2)
    batched = NodeMetrics(tenant_labels=tenant_labels, label_values_max=2)
    rng = random.Random(3)
    delays = edges(START_DELAY_BUCKETS_S) + [rng.uniform(-5, 5000) for _ in range(300)]
    started = [
        execution(("a", "b", "c")[n % 3], 2 if n % 7 == 0 else 1) for n in range(len(delays))
    ]
    durations = edges(DURATION_BUCKETS_MS) + [rng.uniform(0, 4e3) for _ in range(300)]
    for first in range(0, len(delays), 64):  # in batches as a worker reports them
        batched.executions_started_each(
            started[first : first + 64],
            delays[first : first + 64],
            [one.attempt for one in started[first : first + 64]],
        )
    batched.executions_finished_each("hook", "succeeded", durations)
    batched.executions_finished_each("hook", "dead-letter", durations[:5])
    for one, delay_s in zip(started, delays, strict=True):
        alone.execution_started(one, delay_s)
    for duration_s in durations:
        alone.execution_finished("hook", "succeeded", duration_s)
    for duration_s in durations[:5]:
        alone.execution_finished("hook", "dead-letter", duration_s)
    for prefix in ("carillon_", "execution_", "dead_letter"):
        assert same(samples(batched.registry, prefix), samples(alone.registry, prefix))
    assert batched.slo_ratio() == alone.slo_ratio()
    assert batched.window_starts() == alone.window_starts()
