"""The schedules a run starts with, and new definitions drawn during it.

Every schedule uses the ``sim`` task type, whose handler is :func:`simulations.effects.
deliver`; its payload says how long the handler runs. A run with a handler-latency fault
adds a *hook* fleet (:func:`draw_hooks`): many schedules of a second task type, ``hook``
(the same handler, a receiver that answers in milliseconds when healthy), that fire at the
same instants, so that a slow receiver builds a backlog. The expressions are a subset of cron
the oracle (:mod:`simulations.oracle`) models exactly, in zones with and without daylight
saving (New York, London, Lord Howe with its 30-minute shift, Kolkata, UTC), with every DST
policy, catch-up policy and the ``allow`` or ``skip`` overlap policy.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from typing import Final

from engine.api.schemas import ScheduleSpec
from engine.core.dst import DstGap, DstOverlap
from engine.model import CatchUpPolicy, OverlapPolicy

TASK_TYPE: Final = "sim"
HOOK_TYPE: Final = "hook"
HOOK_EXPRESSIONS: Final = ("* * * * *", "*/2 * * * *", "*/5 * * * *")
"""A hook fleet fires together, at one of these."""
TENANTS: Final = ("acme", "globex", "initech")
ZONES: Final = ("UTC", "America/New_York", "Europe/London", "Australia/Lord_Howe", "Asia/Kolkata")
DST_ZONES: Final = ("America/New_York", "Europe/London", "Australia/Lord_Howe")

EXPRESSIONS: Final = (
    "* * * * *",
    "*/5 * * * *",
    "*/15 * * * *",
    "0,30 * * * *",
    "0 * * * *",
    "7 * * * *",
    "*/20 * * * *",
    "0 */2 * * *",
    "*/10 9-17 * * MON-FRI",
    "30 1 * * *",
    "15 2 * * *",
    "45 1,2,3 * * *",
    "0 0-6 * * *",
    "5,35 * * * SAT,SUN",
)
"""Everyday expressions; the first (every minute) is drawn sparingly."""
DST_EXPRESSIONS: Final = (
    "30 1 * * *",
    "15,45 1 * * *",
    "*/15 1-2 * * *",
    "0,30 * * * *",
    "*/5 * * * *",
    "30 2 * * *",
    "0 2 * * *",
    "15 2 * * *",
    "45 1 * * *",
    "0 1-3 * * *",
    "* 1 * * *",
    "*/10 0-3 * * *",
    "20,40 2 * * *",
    "0 3 * * *",
)
"""Expressions whose wall times fall in or near the 01:00-03:00 local transitions."""


@dataclass(frozen=True)
class SimSchedule:
    """One schedule's definition, as the simulated API client writes it."""

    schedule_id: str
    tenant_id: str
    cron_expr: str
    timezone: str
    dst_gap: str = "auto"
    dst_overlap: str = "auto"
    catch_up: str = "latest"
    catch_up_window_s: float = 3600.0
    overlap: str | None = None
    run_s: float = 0.0
    """How long its handler works (the ``run_s`` payload field)."""
    task_type: str = TASK_TYPE

    def describe(self) -> str:
        extra = [
            f"type={self.task_type}" if self.task_type != TASK_TYPE else "",
            f"gap={self.dst_gap}" if self.dst_gap != "auto" else "",
            f"overlap-dst={self.dst_overlap}" if self.dst_overlap != "auto" else "",
            f"catch-up={self.catch_up}/{self.catch_up_window_s:g}s",
            f"overlap={self.overlap}" if self.overlap else "",
            f"run={self.run_s:g}s",
        ]
        return f"{self.cron_expr!r} {self.timezone} " + " ".join(e for e in extra if e)

    def spec(self) -> ScheduleSpec:
        return ScheduleSpec(
            cron_expr=self.cron_expr,
            task_type=self.task_type,
            schedule_id=self.schedule_id,
            tenant_id=self.tenant_id,
            timezone=self.timezone,
            payload={"run_s": self.run_s},
            catch_up=CatchUpPolicy(self.catch_up),
            catch_up_window_s=self.catch_up_window_s,
            dst_gap=DstGap(self.dst_gap),
            dst_overlap=DstOverlap(self.dst_overlap),
            overlap=None if self.overlap is None else OverlapPolicy(self.overlap),
        )

    def timing(self) -> tuple[str, str, str, str]:
        """What decides its instants: expression, zone and the two DST policies."""
        return (self.cron_expr, self.timezone, self.dst_gap, self.dst_overlap)


def _run_s(rng: random.Random) -> float:
    roll = rng.random()
    if roll < 0.4:
        return 0.0
    if roll < 0.8:
        return round(rng.uniform(0.1, 5.0), 2)
    return round(rng.uniform(5.0, 30.0), 1)


def draw_schedule(
    rng: random.Random, schedule_id: str, *, dst_zone: str | None = None, minutely_ok: bool = True
) -> SimSchedule:
    """A random definition; around a DST transition in ``dst_zone`` when given (mostly)."""
    if dst_zone is not None and rng.random() < 0.75:
        zone, expression = dst_zone, rng.choice(DST_EXPRESSIONS)
    else:
        zone = rng.choice(ZONES)
        choices = EXPRESSIONS if minutely_ok else EXPRESSIONS[1:]
        expression = rng.choice(choices)
    gap = rng.choices(["auto", "shift", "skip"], [6, 2, 2])[0]
    overlap_dst = rng.choices(["auto", "first", "last", "both"], [5, 2, 1, 2])[0]
    catch_up = rng.choices(["latest", "all", "none"], [5, 3, 2])[0]
    window = 3600.0 if rng.random() < 0.7 else float(rng.choice([300, 900, 1800]))
    return SimSchedule(
        schedule_id=schedule_id,
        tenant_id=rng.choice(TENANTS),
        cron_expr=expression,
        timezone=zone,
        dst_gap=gap,
        dst_overlap=overlap_dst,
        catch_up=catch_up,
        catch_up_window_s=window,
        overlap="skip" if rng.random() < 0.15 else None,
        run_s=_run_s(rng),
    )


def draw_workload(rng: random.Random, count: int, *, dst_zone: str | None) -> list[SimSchedule]:
    """``count`` schedules ``s000``...; at most four fire every minute."""
    schedules = []
    minutely = 0
    for n in range(count):
        schedule = draw_schedule(rng, f"s{n:03d}", dst_zone=dst_zone, minutely_ok=minutely < 4)
        minutely += schedule.cron_expr.startswith("* ")
        schedules.append(schedule)
    return schedules


def draw_hooks(rng: random.Random, count: int, expression: str) -> list[SimSchedule]:
    """``count`` ``hook`` schedules ``h000``... firing together at ``expression`` (UTC), of
    every tenant, no work of their own: all their time is the receiver's latency."""
    return [
        SimSchedule(
            schedule_id=f"h{n:03d}",
            tenant_id=rng.choice(TENANTS),
            cron_expr=expression,
            timezone="UTC",
            task_type=HOOK_TYPE,
        )
        for n in range(count)
    ]


def retimed(rng: random.Random, schedule: SimSchedule, *, dst_zone: str | None) -> SimSchedule:
    """``schedule`` with a new expression (and maybe zone and DST policy)."""
    drawn = draw_schedule(rng, schedule.schedule_id, dst_zone=dst_zone, minutely_ok=False)
    return replace(
        schedule,
        cron_expr=drawn.cron_expr,
        timezone=drawn.timezone,
        dst_gap=drawn.dst_gap,
        dst_overlap=drawn.dst_overlap,
    )


def with_payload(rng: random.Random, schedule: SimSchedule) -> SimSchedule:
    """``schedule`` with a new handler duration: a change that keeps its timing."""
    return replace(schedule, run_s=_run_s(rng))
