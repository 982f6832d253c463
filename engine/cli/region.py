"""``carillon region status|failover``: which region plans and runs, and moving it.

Both talk to the database directly, like ``carillon token``: a failover is what you run when
the old region -- its database, its nodes, its API -- may be gone. ``--database-url`` names
the database to act on: for a forced failover, the promoted standby (the new primary).

``failover --to REGION`` makes REGION the active region there: the region epoch moves on,
every partition lease is revoked in the same transaction (so no fence of the old epoch holds
any more: a demoted node's next write is refused), and the event is audited. Running it
again changes nothing. With ``--old-database-url`` it also fences the old primary, if it can
reach it, to the same region and epoch: nodes of the old region that are still (or again)
connected to it can then not plan, claim or complete anything there either. An unreachable
old primary is reported, and the command still succeeds: run it again with the same
arguments before that server takes clients again (see docs/multi-region.md).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Awaitable, Callable
from typing import Any, Final, TypeVar

import msgspec
import trio

from engine.cli.client import CommandFailed, add_output_argument
from engine.cli.database import add_database_argument, cli_actor, run_with_ledger
from engine.cli.flags import usage
from engine.cli.output import cell, print_table
from engine.errors import CarillonError, LedgerUnavailable
from engine.ledger.base import Ledger
from engine.ledger.database import validate_database_url
from engine.ledger.params import ClusterSettings, RegionChange, RegionFailover
from engine.ledger.postgres import open_postgres_ledger
from engine.model import validate_reason

OLD_PRIMARY_TIMEOUT_S: Final = 15.0
"""How long the command tries to reach the old primary before reporting it unreachable."""


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "region",
        help="show the active region, or fail over to another (reads and writes the database)",
        description="Multi-region: the active region plans and runs; others stand by.",
    )
    parser.set_defaults(handler=lambda _: usage(parser))
    actions = parser.add_subparsers(metavar="ACTION", parser_class=type(parser))
    status = actions.add_parser(
        "status",
        help="the active region, its epoch, and every live node's state",
        description="Show the active region and epoch, and each live node with its region, "
        "state (active or standby) and partitions. Works on a read-only standby too.",
    )
    add_output_argument(status, "the status as one object")
    add_database_argument(status)
    status.set_defaults(handler=run_status)
    failover = actions.add_parser(
        "failover",
        help="make another region the active one (safe to run twice)",
        description="Make REGION the active region: bump the region epoch and revoke every "
        "partition lease, so the old region's nodes are fenced and REGION's nodes take over "
        "from the checkpoints. For a forced failover, promote the standby first and pass "
        "its URL as --database-url.",
    )
    failover.add_argument("--to", required=True, metavar="REGION", dest="to_region")
    failover.add_argument("--reason", metavar="TEXT", help="why (kept in the audit trail)")
    failover.add_argument(
        "--old-database-url",
        metavar="URL",
        help="the old primary: fence it too, if it can be reached",
    )
    add_output_argument(failover, "the outcome as one object")
    add_database_argument(failover)
    failover.set_defaults(handler=run_failover)


# --- status ----------------------------------------------------------------------------------


def run_status(args: argparse.Namespace) -> int:
    async def read(ledger: Ledger) -> dict[str, Any]:
        settings = await ledger.cluster_get()
        now = await ledger.database_now()
        owned: dict[str, int] = {}
        for lease in await ledger.leases_list():
            expires = lease.expires_at
            if lease.owner_id is not None and expires is not None and expires > now:
                owned[lease.owner_id] = owned.get(lease.owner_id, 0) + 1
        nodes = [
            {
                "node_id": node.node_id,
                "region": node.region,
                "state": "active" if node.region == settings.active_region else "standby",
                "partitions": owned.get(node.node_id, 0),
                "last_seen_at": node.last_seen_at.isoformat(),
            }
            for node in await ledger.nodes_live()
        ]
        return {
            "active_region": settings.active_region,
            "region_epoch": settings.region_epoch,
            "partition_count": settings.partition_count,
            "partitions_owned": sum(owned.values()),
            "nodes": nodes,
        }

    status = run_with_ledger(args, read)
    if args.output == "json":
        print(json.dumps(status))
        return 0
    print(
        f"active region {status['active_region']} at epoch {status['region_epoch']}: "
        f"{status['partitions_owned']} of {status['partition_count']} partitions owned"
    )
    if not status["nodes"]:
        print("no live nodes")
        return 0
    print_table(
        ["NODE", "REGION", "STATE", "PARTITIONS", "LAST SEEN"],
        [
            [n["node_id"], n["region"], n["state"], str(n["partitions"]), cell(n["last_seen_at"])]
            for n in status["nodes"]
        ],
    )
    return 0


# --- failover --------------------------------------------------------------------------------


class OldPrimary(msgspec.Struct, frozen=True):
    """What became of the old primary: fenced (its change), or why not."""

    url: str
    change: RegionChange | None
    error: str | None


def run_failover(args: argparse.Namespace) -> int:
    reason = validate_reason(args.reason)
    actor = cli_actor()
    old_url = (
        None if args.old_database_url is None else validate_database_url(args.old_database_url)
    )

    async def fail_over(ledger: Ledger) -> tuple[RegionChange, OldPrimary | None]:
        old_settings = None
        if old_url is not None:
            old_settings = await _try_old(old_url, lambda old: old.cluster_get())
        # Above the old primary's epoch too, so the two databases end up agreeing.
        at_least = 0
        if (
            isinstance(old_settings, ClusterSettings)
            and old_settings.active_region != args.to_region
        ):
            at_least = old_settings.region_epoch + 1
        try:
            change = await ledger.region_failover(
                RegionFailover(args.to_region, actor, reason, epoch_at_least=at_least)
            )
        except LedgerUnavailable as exc:
            if "read-only" in str(exc):
                raise CommandFailed(
                    f"{exc}; promote the standby first (pg_ctl promote, or SELECT "
                    "pg_promote()), then run this again"
                ) from None
            raise
        if old_url is None:
            return change, None
        epoch = change.settings.region_epoch
        fenced = await _try_old(
            old_url,
            lambda old: old.region_failover(
                RegionFailover(args.to_region, actor, reason, epoch_at_least=epoch)
            ),
        )
        if isinstance(fenced, RegionChange):
            return change, OldPrimary(old_url, fenced, None)
        return change, OldPrimary(old_url, None, fenced)

    change, old = run_with_ledger(args, fail_over)
    settings = change.settings
    if args.output == "json":
        shown: dict[str, Any] = {
            "active_region": settings.active_region,
            "region_epoch": settings.region_epoch,
            "changed": change.changed,
            "revoked": change.revoked,
        }
        if old is not None:
            shown["old_primary"] = {
                "fenced": old.change is not None,
                "error": old.error,
                "region_epoch": None if old.change is None else old.change.settings.region_epoch,
            }
        print(json.dumps(shown))
    elif change.changed:
        print(
            f"region {settings.active_region} is active at epoch {settings.region_epoch}; "
            f"{change.revoked} leases revoked: the old region's nodes are fenced, "
            f"{settings.active_region}'s take over from the checkpoints"
        )
    else:
        print(
            f"region {settings.active_region} was active already at epoch "
            f"{settings.region_epoch}: nothing changed"
        )
    if old is not None and args.output != "json":
        if old.change is not None:
            print(
                f"old primary fenced: region {old.change.settings.active_region} at epoch "
                f"{old.change.settings.region_epoch} there too"
            )
        else:
            print(
                f"warning: old primary not fenced ({old.error}); keep it from taking clients, "
                "or run this command again once it is reachable"
            )
    return 0


T = TypeVar("T")


async def _try_old(url: str, operation: Callable[[Ledger], Awaitable[T]]) -> T | str:
    """``operation`` on the old primary; the reason as a string if it cannot be done."""
    try:
        with trio.fail_after(OLD_PRIMARY_TIMEOUT_S):
            async with open_postgres_ledger(url, pool_max=1) as old:
                return await operation(old)
    except trio.TooSlowError:
        return f"no answer within {OLD_PRIMARY_TIMEOUT_S:g} s"
    except CarillonError as exc:
        return str(exc)
