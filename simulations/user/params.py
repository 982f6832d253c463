"""``carillon simulate``: the simulator run over a user's own schedule set.

The run is the simulator's (:mod:`simulations.runner`): real nodes on trio's mock clock
against the in-memory ledger, checked against the independent oracle. What changes is where
its parameters come from (:func:`user_params`):

* the **workload** is the user's schedules (:mod:`simulations.user.schedule_set`), not a drawn one,
  and each runs the simulated handler instead of its task type;
* the **node settings**, task retry policy, partitions and ledger latency are what the seed
  draws for any run (:func:`simulations.params.derive`), so ``--seed`` picks one plausible
  cluster and reproduces it;
* the **faults** are the named scenarios' timelines, each drawn from its own stream exactly as
  ``python -m simulations run --scenario NAME`` draws it, merged; the handler's failure rates
  are the highest any chosen scenario uses. No faults (the default) is the ``calm`` baseline:
  no handler failures either, so every fire should succeed on time.

Runs cost time (:func:`estimate`): a cap on the fires and on the node-hours refuses a set
that would take too long, before anything runs.
"""

from __future__ import annotations

import functools
import io
import math
import shlex
import sys
import time
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Final, TextIO, cast
from zoneinfo import ZoneInfo

from engine.errors import InvalidField
from simulations import oracle, scenarios
from simulations.bound import liveness_s
from simulations.params import SimParams, derive, stream
from simulations.runner import Result, run_simulation
from simulations.scenario import HandlerFaults
from simulations.user.schedule_set import UserSet
from simulations.workload import SimSchedule

FAULT_KINDS: Final = (
    "crash",
    "zombie",
    "skew",
    "outage",
    "commit-unknown",
    "redelivery",
    "rebalance",
    "dst",
)
"""The scenarios a user may combine; ``calm`` is ``none``, and ``churn`` (and ``random``,
which includes it) would retime and delete the user's schedules, which says nothing about
them."""
NONE: Final = "none"
NODES_MAX: Final = 16

FIRES_MAX: Final = 250_000
"""Most fires a run may be expected to hold (the window and the liveness tail after it)."""
NODE_HOURS_MAX: Final = 1_000.0
"""Most node-hours a run may simulate (7 days of 3 nodes is 504)."""
NODE_HOURS_PER_S: Final = 0.6
FIRES_PER_S: Final = 3_000.0
"""The cost model of :class:`Estimate`, measured on a 2-core machine (docs/simulation.md, "For
users") and rounded towards slow: the estimate shown before a long run, not a promise."""
ZONE_YEARS_CACHED: Final = 2048
"""More than the IANA database has zones (about 600), for a window across a new year."""
PROGRESS_EVERY_S: Final = 10.0
"""Wall seconds between progress lines on stderr (none for a shorter run)."""


@dataclass(frozen=True)
class Request:
    """A ``carillon simulate`` command line, every default resolved."""

    path: str
    days: float
    faults: tuple[str, ...]
    nodes: int
    seed: int
    start: datetime
    input_format: str
    tz: str
    output: str

    @property
    def end(self) -> datetime:
        """The end of the reported window."""
        return self.start + timedelta(days=self.days)

    def command(self, fmt: str) -> str:
        """The command that repeats this run exactly (``fmt``: the format ``auto`` chose)."""
        parts = [
            "carillon simulate",
            f"--schedules {shlex.quote(self.path)}",
            f"--days {_exact(self.days)}",
            f"--faults {','.join(self.faults) or NONE}",
            f"--nodes {self.nodes}",
            f"--seed {self.seed}",
            f"--start {self.start.isoformat()}",
            f"--format {fmt}",
        ]
        if fmt == "crontab":
            parts.append(f"--tz {shlex.quote(self.tz)}")
        return " ".join(parts)


def _exact(value: float) -> str:
    """``7``, ``0.25``: ``%g`` when it reads back as the same number, else every digit."""
    text = f"{value:g}"
    return text if float(text) == value else repr(value)


def parse_faults(text: str) -> tuple[str, ...]:
    """``crash,skew`` -> ``("crash", "skew")`` (in the order given, once each); ``none``."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names or names == [NONE]:
        return ()
    for name in names:
        if name == NONE:
            raise InvalidField("--faults: 'none' cannot be combined with fault names")
        if name not in FAULT_KINDS:
            raise InvalidField(
                f"--faults: unknown fault {name!r}; choose from {', '.join(FAULT_KINDS)} "
                f"(comma-separated), or {NONE}"
            )
    return tuple(dict.fromkeys(names))


def check_request(request: Request) -> None:
    """Refuse options no run can have."""
    if not (math.isfinite(request.days) and request.days > 0):
        raise InvalidField(f"--days must be a number more than 0, got {request.days:g}")
    if not 1 <= request.nodes <= NODES_MAX:
        raise InvalidField(f"--nodes must be between 1 and {NODES_MAX}, got {request.nodes}")


def user_params(request: Request, user_set: UserSet) -> SimParams:
    """The run: the seed's cluster, the user's schedules, the named scenarios' faults."""
    base = derive(request.seed, "calm", nodes=request.nodes, days=request.days)
    schedules = tuple(s.sim for s in user_set.schedules)
    transition = first_transition(schedules, request.start, request.end)
    faults = []
    handler = HandlerFaults()
    for name in request.faults:
        built = scenarios.SCENARIOS[name](
            scenarios.Context(
                rng=stream(request.seed, f"faults:{name}"),
                nodes=base.nodes,
                safety_s=base.safety_s,
                settings=base.settings,
                schedules=schedules,
                start=request.start,
                transition=transition,
            )
        )
        faults += built.faults
        handler = _worst(handler, built.handler)
    params = replace(
        base,
        scenario=",".join(request.faults) or NONE,
        start=request.start,
        schedules=schedules,
        faults=tuple(sorted(faults, key=lambda f: f.at_s)),
        handler=handler,
        dst_transition=transition,
    )
    return replace(params, liveness_s=liveness_s(params))


def _worst(a: HandlerFaults, b: HandlerFaults) -> HandlerFaults:
    return HandlerFaults(
        transient_p=max(a.transient_p, b.transient_p),
        lost_reply_p=max(a.lost_reply_p, b.lost_reply_p),
        permanent_p=max(a.permanent_p, b.permanent_p),
        hang_p=max(a.hang_p, b.hang_p),
    )


def first_transition(
    schedules: tuple[SimSchedule, ...], start: datetime, end: datetime
) -> tuple[str, datetime] | None:
    """The first DST transition of the schedules' zones in ``(start, end]`` (the ``dst``
    scenario times its crashes around it)."""
    found = [
        (at, zone)
        for zone in sorted({s.timezone for s in schedules})
        for at in transitions_between(zone, start, end)
    ]
    if not found:
        return None
    at, zone = min(found)
    return zone, at


def transitions_between(zone: str, start: datetime, end: datetime) -> list[datetime]:
    """The instants in ``(start, end]`` at which ``zone``'s offset changes (the oracle's)."""
    return [
        at
        for year in range(start.year, end.year + 1)
        for at in _transitions(zone, year)
        if start < at <= end
    ]


@functools.lru_cache(maxsize=ZONE_YEARS_CACHED)
def _transitions(zone: str, year: int) -> tuple[datetime, ...]:
    # The oracle keeps 64 zone-years; a set may span more zones than that, and each costs a
    # scan of the year.
    return tuple(at for at, _ in oracle.transitions(zone, year))


# --- cost ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Estimate:
    fires: int
    node_hours: float

    @property
    def wall_s(self) -> float:
        return self.node_hours / NODE_HOURS_PER_S + self.fires / FIRES_PER_S


def estimate(params: SimParams) -> Estimate:
    """The fires due in the whole run (wall times matched, DST aside) and its node-hours."""
    end = params.start + timedelta(seconds=params.end_s)
    counts: dict[tuple[str, str], float] = {}
    fires = 0.0
    for s in params.schedules:
        key = (s.cron_expr, s.timezone)
        if key not in counts:
            counts[key] = _walls(s.cron_expr, s.timezone, params.start, end)
        fires += counts[key]
    return Estimate(round(fires), len(params.nodes) * params.end_s / 3600)


def _walls(expression: str, zone_name: str, start: datetime, end: datetime) -> float:
    """How many wall times ``expression`` matches in ``(start, end]``, in ``zone_name``:
    whole local days counted, the two partial ones pro rata."""
    cron = oracle.CronOracle(expression)
    zone = ZoneInfo(zone_name)
    per_day = len(cron.hours) * len(cron.minutes)
    first = start.astimezone(zone).replace(tzinfo=None)
    last = end.astimezone(zone).replace(tzinfo=None)
    day = first.date()
    count = 0.0
    while day <= last.date():
        if cron.matches_day(day):
            begin = datetime.combine(day, datetime.min.time())
            covered = min(begin + timedelta(days=1), last) - max(begin, first)
            count += per_day * covered.total_seconds() / 86400
        day += timedelta(days=1)
    return count


def check_cost(cost: Estimate, request: Request) -> None:
    """Refuse a run over the caps, suggesting how much smaller it should be."""
    if cost.fires > FIRES_MAX:
        days = request.days * FIRES_MAX / cost.fires
        raise InvalidField(
            f"this run would hold about {cost.fires:,} fires, over the limit of {FIRES_MAX:,} "
            f"(about {duration(cost.wall_s)}); simulate fewer days (--days "
            f"{_round_down(days)}) or fewer schedules"
        )
    if cost.node_hours > NODE_HOURS_MAX:
        days = request.days * NODE_HOURS_MAX / cost.node_hours
        raise InvalidField(
            f"this run would simulate {cost.node_hours:,.0f} node-hours, over the limit of "
            f"{NODE_HOURS_MAX:,.0f} (about {duration(cost.wall_s)}); simulate fewer "
            f"days (--days {_round_down(days)}) or fewer nodes"
        )


def duration(seconds: float) -> str:
    """``40 s``, ``12 min``: how long a run is expected to take."""
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min"


def _round_down(days: float) -> str:
    return f"{max(int(days * 10) / 10, 0.1):g}"


# --- running ---------------------------------------------------------------------------------


class Progress(io.TextIOBase):
    """A trace sink that reads nothing but the time stamps: every :data:`PROGRESS_EVERY_S`
    wall seconds it says on stderr how far the run is. It does not touch the run (the trace
    is written whether anyone reads it or not), so the run stays the same run."""

    def __init__(self, total_s: float, out: TextIO) -> None:
        self._total_s = total_s
        self._out = out
        self._started = self._shown = time.perf_counter()
        self._lines = 0

    def write(self, text: str) -> int:
        self._lines += 1
        if self._lines % 1024 == 0:
            now = time.perf_counter()
            if now - self._shown >= PROGRESS_EVERY_S:
                self._shown = now
                done_s = float(text.split(" ", 1)[0])
                print(
                    f"carillon: simulated {done_s / 86400:.2f} of {self._total_s / 86400:.2f} "
                    f"days ({100 * done_s / self._total_s:.0f}%) in {now - self._started:.0f} s",
                    file=self._out,
                    flush=True,
                )
        return len(text)


def run(params: SimParams, *, err: TextIO = sys.stderr) -> Result:
    return run_simulation(params, trace_file=cast(TextIO, Progress(params.end_s, err)))
