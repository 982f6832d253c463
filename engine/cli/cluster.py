"""``carillon cluster`` and ``carillon forecast``: the cluster's state and its coming load.

``cluster`` shows the live nodes (how many partitions each owns, its clock offset) and
every partition (owner, fencing token, lease expiry, how far ahead its planner has
planned). ``forecast`` counts the executions due per time bucket from the schedules as they
are now, and draws the busiest buckets as a small text histogram; ``--by`` splits the count
by tenant and/or task type. Both need an admin token, except that a tenant token may ask
for the forecast of its own schedules.
"""

from __future__ import annotations

import argparse
from typing import Any, Final

from engine.cli.client import add_client_arguments, emit, open_client
from engine.cli.flags import positive, rfc3339
from engine.cli.output import NONE, cell, plural, print_table

BUSIEST_DEFAULT: Final = 10
BAR_WIDTH: Final = 40
SERIES_SHOWN_MAX: Final = 20
_BY_CHOICES: Final = ("tenant", "task_type", "tenant,task_type")


def add_parser(commands: Any) -> None:
    cluster = commands.add_parser(
        "cluster",
        help="nodes, partition owners, fencing tokens and planner lag (through the API; admin)",
    )
    add_client_arguments(cluster)
    cluster.set_defaults(handler=run_cluster)
    forecast = commands.add_parser(
        "forecast",
        help="executions due per time bucket, from the schedules as they are now",
        description="How many executions are due in each bucket of [--from, --to), counted "
        "from the schedules as they are now. The table draws the busiest buckets.",
    )
    forecast.add_argument("--from", dest="start", type=rfc3339, metavar="RFC3339", help="[now]")
    forecast.add_argument(
        "--to", dest="end", type=rfc3339, metavar="RFC3339", help="at most 7 days on [+24h]"
    )
    forecast.add_argument("--bucket", metavar="SIZE", help="bucket size: 1m [default], 15m, 1h …")
    forecast.add_argument("--by", choices=_BY_CHOICES, help="also count per tenant / task type")
    forecast.add_argument(
        "--busiest",
        type=positive,
        default=BUSIEST_DEFAULT,
        metavar="N",
        help=f"buckets drawn in the table [{BUSIEST_DEFAULT}]",
    )
    add_client_arguments(forecast)
    forecast.set_defaults(handler=run_forecast)


# --- cluster ---------------------------------------------------------------------------------


def run_cluster(args: argparse.Namespace) -> int:
    with open_client(args) as api:
        answer = api.call("GET", "/v1/cluster")
    emit(args, answer, _print_cluster)
    return 0


def _print_cluster(view: dict[str, Any]) -> None:
    partitions = view["partitions"]
    orphans = sum(1 for p in partitions if p["owner_id"] is None)
    print(
        f"cluster at {view['database_now']}: {plural(view['partition_count'], 'partition')}, "
        f"active region {view['active_region']} (epoch {view['region_epoch']}), "
        f"{plural(len(view['nodes']), 'live node')}"
        + (f"; {orphans} without a live owner" if orphans else "")
    )
    if view["nodes"]:
        print()
        print_table(
            ("NODE_ID", "REGION", "PARTITIONS", "STARTED_AT", "LAST_SEEN_AT", "CLOCK_OFFSET_S"),
            [
                (
                    n["node_id"],
                    n["region"],
                    str(n["partitions"]),
                    n["started_at"],
                    n["last_seen_at"],
                    cell(n.get("clock_offset_s")),
                )
                for n in view["nodes"]
            ],
        )
    print()
    print_table(
        ("PARTITION", "OWNER", "FENCE", "LEASE_EXPIRES_AT", "CHECKPOINT_AGE_S", "PLANNER_LAG_S"),
        [
            (
                str(p["partition_id"]),
                p["owner_id"] or NONE,
                str(p["fencing_token"]),
                cell(p.get("lease_expires_at")),
                _seconds(p.get("checkpoint_age_s")),
                _seconds(p.get("planner_lag_s")),
            )
            for p in partitions
        ],
    )


def _seconds(value: float | None) -> str:
    return NONE if value is None else f"{value:.1f}"


# --- forecast --------------------------------------------------------------------------------


def run_forecast(args: argparse.Namespace) -> int:
    query = {"from": args.start, "to": args.end, "bucket": args.bucket, "by": args.by}
    with open_client(args) as api:
        answer = api.call("GET", "/v1/forecast", query=query)
    emit(args, answer, lambda forecast: print_forecast(forecast, args.busiest))
    return 0


def bucket_label(seconds: int) -> str:
    """``90`` -> ``90s``, ``900`` -> ``15m``, ``3600`` -> ``1h``, ``86400`` -> ``1d``."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def print_forecast(forecast: dict[str, Any], busiest: int) -> None:
    """A summary line, the ``busiest`` buckets as a histogram in time order, then the
    heaviest series (with ``--by``)."""
    totals: list[int] = forecast["total"]
    starts: list[str] = forecast["bucket_starts"]
    size = bucket_label(forecast["bucket_s"])
    due = sum(totals)
    print(f"executions due from {forecast['from']} to {forecast['to']}: {due:,}, per {size}:")
    approximated = forecast.get("approximated_schedules", 0)
    if approximated:
        print(f"({plural(approximated, 'schedule')} with H counted from a sample of their group)")
    if due == 0:
        print("nothing is due")
        return
    peak = max(totals)
    chosen = sorted(sorted(range(len(totals)), key=lambda i: -totals[i])[:busiest])
    chosen = [i for i in chosen if totals[i] > 0]
    print(f"the {plural(len(chosen), 'busiest bucket')}, in time order:")
    print_table(
        ("BUCKET_START", "DUE", ""),
        [
            (starts[i], f"{totals[i]:,}", "#" * max(1, round(BAR_WIDTH * totals[i] / peak)))
            for i in chosen
        ],
    )
    series = forecast.get("series") or []
    if series:
        print()
        print_table(
            ("TENANT", "TASK_TYPE", "DUE", f"PEAK_PER_{size.upper()}"),
            [
                (
                    s["tenant_id"] or "*",
                    s["task_type"] or "*",
                    f"{s['total']:,}",
                    f"{max(s['counts'], default=0):,}",
                )
                for s in series[:SERIES_SHOWN_MAX]
            ],
        )
        if len(series) > SERIES_SHOWN_MAX:
            print(f"... and {len(series) - SERIES_SHOWN_MAX} more (--output json lists all)")
