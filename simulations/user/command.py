"""The body of ``carillon simulate`` (the command's parser lives in ``engine/cli/simulate.py``,
which imports this module only when the command runs).

Bad input -- an unreadable or malformed file, an invalid entry, ``--days`` not above zero, an
unknown fault, a run over the caps -- raises :class:`~engine.errors.InvalidField` before
anything is simulated; the command line turns it into one ``carillon: error:`` line and exit
code 2. Otherwise the report goes to stdout and the exit code is 1 when a checker found a
violation, 0 when none did. Progress and timing go to stderr, so stdout is the same for the
same command.
"""

from __future__ import annotations

import sys
from datetime import datetime
from typing import TextIO

from simulations.user import render, report, schedule_set
from simulations.user.params import (
    PROGRESS_EVERY_S,
    Request,
    check_cost,
    check_request,
    duration,
    estimate,
    parse_faults,
    run,
    user_params,
)


def simulate(
    *,
    path: str,
    days: float,
    faults: str,
    nodes: int,
    seed: int,
    start: datetime,
    input_format: str,
    tz: str,
    output: str,
    err: TextIO | None = None,
) -> int:
    """Simulate the schedule set in ``path``; print the report; return the exit code."""
    err = err or sys.stderr
    request = Request(
        path, days, parse_faults(faults), nodes, seed, start, input_format, tz, output
    )
    check_request(request)
    user_set = schedule_set.load(path, input_format=input_format, tz=tz, now=start)
    params = user_params(request, user_set)
    cost = estimate(params)
    check_cost(cost, request)
    if cost.wall_s >= PROGRESS_EVERY_S:
        print(
            f"carillon: simulating {len(params.nodes)} nodes for {params.end_s / 86400:.2f} days "
            f"with about {cost.fires:,} fires; this takes about {duration(cost.wall_s)}",
            file=err,
            flush=True,
        )
    result = run(params, err=err)
    built = report.build(request, user_set, result)
    if output == "json":
        render.print_json(built)
    else:
        render.print_text(built)
    print(
        f"carillon: simulated {result.node_hours:.1f} node-hours in {result.wall_s:.1f} s",
        file=err,
    )
    return 1 if built.violations else 0
