"""The handler-latency fault: its draws, its checks, and the queue allowance of the bound."""

from __future__ import annotations

import random
from dataclasses import replace
from datetime import timedelta

import pytest

from simulations import bound, scenarios
from simulations.bound import DelayBound, LoadBound, _capacity_s, healthy_bound_s, load_bound
from simulations.check_fires import FireChecker
from simulations.effects import Delivery, Fates, Sinks
from simulations.expect import Expectation
from simulations.params import SimParams, derive
from simulations.scenario import HandlerFaults, HandlerLatency, SlowHandler
from simulations.trace import Trace
from simulations.workload import HOOK_TYPE, draw_hooks

PROFILE = HandlerLatency(HOOK_TYPE, (0.005, 0.02), 0.05, (0.5, 4.0), 0.02)
STEP = SlowHandler(600.0, 300.0, HOOK_TYPE, 1.0, 2.0)


def _fates(seed: int = 1) -> Fates:
    return Fates(
        seed, HandlerFaults(), 30.0, latency=(PROFILE,), slow=(STEP,), timeouts={HOOK_TYPE: 5.0}
    )


def test_an_attempts_latency_depends_only_on_the_seed_the_execution_and_the_attempt() -> None:
    fates, again, other = _fates(), _fates(), _fates(2)
    plans = [fates.plan(f"h{n:03d}:x", 1, HOOK_TYPE, 60.0, 0.0) for n in range(400)]
    assert plans == [again.plan(f"h{n:03d}:x", 1, HOOK_TYPE, 60.0, 0.0) for n in range(400)]
    assert plans != [other.plan(f"h{n:03d}:x", 1, HOOK_TYPE, 60.0, 0.0) for n in range(400)]
    fates_seen = {plan.fate for plan in plans}
    assert fates_seen == {"ok", "timeout"}  # 2 % overrun the 5 s timeout
    for plan in plans:
        if plan.fate == "timeout":
            assert plan.sleep_s >= 5.0 * 1.05
            assert plan.worker_s == 5.0
        else:
            assert 0.005 <= plan.sleep_s < 4.0
            assert plan.worker_s == plan.sleep_s
    assert sum(plan.sleep_s >= 0.5 for plan in plans if plan.fate == "ok") >= 5  # the tail


def test_a_step_slows_every_attempt_of_the_fires_planned_in_it_and_only_those() -> None:
    fates = _fates()
    inside = [fates.plan(f"h{n:03d}:x", 1, HOOK_TYPE, 700.0, 0.0) for n in range(200)]
    after = [fates.plan(f"h{n:03d}:x", 1, HOOK_TYPE, 900.0, 0.0) for n in range(200)]
    assert all(p.sleep_s >= 1.0 for p in inside)
    assert sum(p.sleep_s < 0.5 for p in after) > 150  # fast again, but for the tail
    assert fates.plan("s000:x", 1, "sim", 700.0, 3.0).sleep_s == 3.0  # no profile: its work


def _delivery(fate: str, *, ran_s: float, effect: bool) -> Delivery:
    params = _params()
    started = params.start + timedelta(seconds=100)
    return Delivery(
        execution_id="h000:x",
        schedule_id="h000",
        planned_at=started,
        attempt=1,
        fencing_token=1,
        node="n1",
        started_at=started,
        fate=fate,
        effect_sent=effect,
        finished_at=started + timedelta(seconds=ran_s),
        task_type=HOOK_TYPE,
    )


def test_a_timeout_must_be_cut_off_at_the_timeout_before_its_effect() -> None:
    params = _params()
    for delivery, found in (
        (_delivery("timeout", ran_s=10.0, effect=False), None),
        (_delivery("timeout", ran_s=10.0, effect=True), "timed out after its effect"),
        (_delivery("timeout", ran_s=12.5, effect=False), "past its timeout of 10s"),
    ):
        sinks = Sinks(Trace())
        sinks.deliveries.append(delivery)
        delay = DelayBound(params, [])
        report = FireChecker(params, Expectation(), delay, sinks).check([])
        if found is None:
            assert report.violations == []
        else:
            assert any(found in v for v in report.violations), report.violations


def _params(*, step: bool = True) -> SimParams:
    """Two workers, 100 hooks every minute at 5-20 ms, and (``step``) 2 s for five minutes."""
    base = derive(1, "calm", nodes=2, days=0.05)
    return replace(
        base,
        settings=replace(base.settings, workers=2),
        schedules=tuple(draw_hooks(random.Random(1), 100, "* * * * *")),
        faults=(STEP,) if step else (),
        handler=HandlerFaults(),
        latency=(HandlerLatency(HOOK_TYPE, (0.005, 0.02)),),
        hook_timeout_s=10.0,
    )


def test_the_bound_lets_a_slow_steps_backlog_drain_and_then_is_tight_again() -> None:
    params = _params()
    load = load_bound(params)
    healthy = healthy_bound_s(params)
    minutes = sorted(load.first_start)
    before = [load.first_start_s(at) for at in minutes if at < STEP.at_s]
    during = [load.first_start_s(at) for at in minutes if STEP.covers(at)]
    # Each burst of 100 fast attempts is 2 s of work for 2 workers: a second or two more.
    assert max(before) < healthy + 5
    # 200 worker-seconds a minute for 120 of capacity: the backlog grows by 80 a minute, and
    # the last slow burst waits for all of it.
    assert max(during) > healthy + 150
    drained = STEP.at_s + STEP.duration_s + 5 * 80 / 2 + 120  # its backlog, and slack
    late = [load.first_start_s(at) for at in minutes if drained < at < params.safety_s - 60]
    assert late
    assert max(late) < healthy + 5
    calm = load_bound(_params(step=False))
    safety = [bound for at, bound in calm.first_start.items() if at < params.safety_s - 60]
    assert max(safety) < healthy + 5


@pytest.mark.parametrize(
    ("held", "work", "expected"),
    [
        ((), 10.0, 5.0),  # two free workers
        ((30.0,), 10.0, 10.0),  # one held for 30 s: the other does it all
        ((4.0,), 10.0, 7.0),  # 4 s alone, then both: 4 + 6/2
    ],
)
def test_capacity_time_counts_the_attempts_workers_hold(
    held: tuple[float, ...], work: float, expected: float
) -> None:
    assert _capacity_s(held, 2, work) == pytest.approx(expected)


def test_random_draws_the_latency_fault_apart_from_everything_else(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(bound, "liveness_s", lambda params: 0.0)  # not what is compared
    drawn = {seed: derive(seed, "random") for seed in range(1, 7)}
    with_latency = [seed for seed, p in drawn.items() if p.latency]
    assert with_latency
    monkeypatch.setattr(scenarios, "LATENCY_IN_RANDOM_P", 0.0)
    for seed in with_latency:
        params, plain = drawn[seed], derive(seed, "random")
        assert params.settings.workers < plain.settings.workers
        assert [f for f in params.faults if not isinstance(f, SlowHandler)] == list(plain.faults)
        assert [s for s in params.schedules if s.task_type != HOOK_TYPE] == list(plain.schedules)


def test_a_latency_run_has_a_fleet_few_workers_and_slow_stretches() -> None:
    for seed in range(1, 3):
        params = derive(seed, "latency")
        hooks = [s for s in params.schedules if s.task_type == HOOK_TYPE]
        assert len(hooks) >= 10
        assert len({s.cron_expr for s in hooks}) == 1
        assert params.settings.workers <= 8
        assert any(isinstance(f, SlowHandler) for f in params.faults)
        assert isinstance(load_bound(params), LoadBound)
