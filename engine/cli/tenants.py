"""``carillon tenant``: set and list tenants' dispatch settings.

A tenant's weight is its share in the dispatcher's weighted round-robin; its quota caps how
many of its executions run at once on a node; its rate and burst bound how fast they start.
A tenant needs no row to own schedules: one never set has the defaults (weight 1, no quota,
no rate of its own). ``set`` is declarative like ``carillon task-type set``: settings left
out take their defaults.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import msgspec

from engine.cli.task_types import add_database_argument, run_with_ledger
from engine.ledger.base import TenantsPut
from engine.model import TENANT_WEIGHT_MAX, Tenant


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "tenant",
        help="set and list tenants' dispatch settings (weight, quota, rate)",
        description="Tenants' shares of the dispatcher. A tenant never set has weight 1 and "
        "no quota or rate of its own.",
    )
    parser.set_defaults(handler=lambda _: _usage(parser))
    actions = parser.add_subparsers(metavar="ACTION", parser_class=type(parser))
    setting = actions.add_parser(
        "set",
        help="set a tenant's dispatch settings",
        description="Set a tenant's dispatch settings; those left out take their defaults.",
    )
    setting.add_argument("tenant_id", metavar="ID")
    setting.add_argument(
        "--weight", type=int, help=f"share in the round-robin, 1-{TENANT_WEIGHT_MAX} [1]"
    )
    setting.add_argument(
        "--quota", type=int, metavar="N", help="most running at once per node [no quota]"
    )
    setting.add_argument(
        "--rate", type=float, metavar="R", help="starts per second [the node's rate only]"
    )
    setting.add_argument("--burst", type=int, metavar="N", help="starts at once above --rate")
    add_database_argument(setting)
    setting.set_defaults(handler=run_set)
    listing = actions.add_parser("list", help="list the tenants with settings of their own")
    listing.add_argument("--json", action="store_true", help="print JSON")
    add_database_argument(listing)
    listing.set_defaults(handler=run_list)


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2


def run_set(args: argparse.Namespace) -> int:
    weight = {} if args.weight is None else {"weight": args.weight}
    tenant = Tenant(
        tenant_id=args.tenant_id,
        concurrency_quota=args.quota,
        rate_per_s=args.rate,
        burst=args.burst,
        **weight,
    )
    stored = run_with_ledger(args, lambda ledger: ledger.tenants_put(TenantsPut(tenant)))
    print(
        f"saved tenant {stored.tenant_id!r} (version {stored.version}): weight {stored.weight}, "
        f"quota {_or_none(stored.concurrency_quota)}, rate {_rate(stored.rate_per_s)}, "
        f"burst {_or_none(stored.burst)}"
    )
    return 0


def run_list(args: argparse.Namespace) -> int:
    tenants = run_with_ledger(args, lambda ledger: ledger.tenants_list())
    if args.json:
        print(json.dumps(msgspec.to_builtins(tenants), indent=2))
        return 0
    if not tenants:
        print("no tenant has settings of its own: all have weight 1, no quota and no rate")
        return 0
    header = ("TENANT", "WEIGHT", "QUOTA", "RATE_PER_S", "BURST", "VER")
    rows = [header] + [
        (
            t.tenant_id,
            str(t.weight),
            _or_none(t.concurrency_quota, "-"),
            _or_none(t.rate_per_s, "-"),
            _or_none(t.burst, "-"),
            str(t.version),
        )
        for t in tenants
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    for row in rows:
        print(
            "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        )
    return 0


def _rate(value: float | None) -> str:
    return "none" if value is None else f"{value:g}/s"


def _or_none(value: float | None, none: str = "none") -> str:
    return none if value is None else f"{value:g}"
