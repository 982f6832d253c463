"""``carillon tenant set|show|list``: tenants' dispatch settings and quotas (through the API).

A tenant's weight is its share in the dispatcher's weighted round-robin; its quota caps how
many of its executions run at once on a node; its rate and burst bound how fast they start;
``schedules_max`` caps how many live schedules it may own. A tenant needs no row to own
schedules: one never set has the defaults (weight 1, no quota, no rate, no schedule cap).
``set`` is declarative like ``carillon task-type set``: settings left out take their
defaults. ``set`` and ``list`` need an admin token; a tenant token may ``show`` its own
tenant (with how many schedules it owns).
"""

from __future__ import annotations

import argparse
from typing import Any, Final

from engine.cli.client import add_client_arguments, emit, open_client, segment
from engine.cli.flags import usage
from engine.cli.output import cell, plural, print_table
from engine.model import TENANT_WEIGHT_MAX

_SETTINGS: Final = (  # flag destination -> API field
    ("weight", "weight"),
    ("quota", "concurrency_quota"),
    ("rate", "rate_per_s"),
    ("burst", "burst"),
    ("schedules_max", "schedules_max"),
)


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "tenant",
        help="set, show and list tenants' dispatch settings (through the API)",
        description="Tenants' shares of the dispatcher. A tenant never set has weight 1 and "
        "no quota, rate or schedule cap of its own.",
    )
    parser.set_defaults(handler=lambda _: usage(parser))
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
    setting.add_argument(
        "--schedules-max", type=int, metavar="N", help="most live schedules it may own [no cap]"
    )
    add_client_arguments(setting)
    setting.set_defaults(handler=run_set)
    show = actions.add_parser("show", help="show a tenant's settings and schedule count")
    show.add_argument("tenant_id", metavar="ID")
    add_client_arguments(show)
    show.set_defaults(handler=run_show)
    listing = actions.add_parser("list", help="list the tenants with settings of their own")
    add_client_arguments(listing)
    listing.set_defaults(handler=run_list)


def run_set(args: argparse.Namespace) -> int:
    body = {
        field: getattr(args, flag) for flag, field in _SETTINGS if getattr(args, flag) is not None
    }
    with open_client(args) as api:
        answer = api.call("PUT", f"/v1/tenants/{segment(args.tenant_id)}", body=body)
    emit(args, answer, lambda tenant: print(f"saved {_describe(tenant)}"))
    return 0


def run_show(args: argparse.Namespace) -> int:
    with open_client(args) as api:
        answer = api.call("GET", f"/v1/tenants/{segment(args.tenant_id)}")
    emit(args, answer, lambda tenant: print(_describe(tenant)))
    return 0


def run_list(args: argparse.Namespace) -> int:
    with open_client(args) as api:
        answer = api.call("GET", "/v1/tenants")
    emit(args, answer, _print_list)
    return 0


def _describe(tenant: dict[str, Any]) -> str:
    def shown(name: str, unit: str = "") -> str:
        value = tenant.get(name)
        return "none" if value is None else f"{cell(value)}{unit}"

    version = tenant["version"]
    state = "defaults, never set" if version == 0 else f"version {version}"
    text = (
        f"tenant {tenant['tenant_id']!r} ({state}): weight {tenant['weight']}, "
        f"quota {shown('concurrency_quota')}, rate {shown('rate_per_s', '/s')}, "
        f"burst {shown('burst')}, schedules max {shown('schedules_max')}"
    )
    if "schedules" in tenant:
        text += f"; owns {plural(tenant['schedules'], 'schedule')}"
    return text


def _print_list(tenants: list[dict[str, Any]]) -> None:
    if not tenants:
        print("no tenant has settings of its own: all have weight 1, no quota and no rate")
        return
    print_table(
        ("TENANT", "WEIGHT", "QUOTA", "RATE_PER_S", "BURST", "SCHEDULES_MAX", "VER"),
        [
            (
                t["tenant_id"],
                str(t["weight"]),
                cell(t.get("concurrency_quota")),
                cell(t.get("rate_per_s")),
                cell(t.get("burst")),
                cell(t.get("schedules_max")),
                str(t["version"]),
            )
            for t in tenants
        ],
    )
