"""`carillon region status|failover` on real Postgres databases."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest

from engine.ledger.params import AuditQuery, LeasesAcquire, NodesHeartbeat, RegionFailover
from engine.ledger.postgres import open_postgres_ledger
from engine.model import AuditAction
from tests.cli.harness import Cli
from tests.ledger.backends import PARTITIONS, postgres_template_database

pytestmark = pytest.mark.postgres

UNREACHABLE = "postgresql://postgres@127.0.0.1:1/carillon"


@pytest.fixture(autouse=True)
def operator(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("getpass.getuser", lambda: "alice")
    monkeypatch.setattr("socket.gethostname", lambda: "ops-1")


@pytest.fixture
async def old_primary(database_url: str, postgres_template: str) -> AsyncIterator[str]:
    """A second database standing in for the old primary (another server, in production)."""
    async with postgres_template_database(database_url, postgres_template) as url:
        yield url


async def test_status_shows_the_active_region_and_each_nodes_state(database: str, cli: Cli) -> None:
    async with open_postgres_ledger(database) as ledger:
        await ledger.nodes_heartbeat(NodesHeartbeat("a1", "default", 60.0))
        await ledger.nodes_heartbeat(NodesHeartbeat("b1", "east", 60.0))
        await ledger.leases_acquire(LeasesAcquire("a1", [0, 1, 2], 60.0))
    result = await cli("region", "status", "--database-url", database)
    assert result.code == 0, result.err
    lines = result.out.splitlines()
    assert lines[0] == f"active region default at epoch 1: 3 of {PARTITIONS} partitions owned"
    rows = [line.split()[:4] for line in lines[2:]]
    assert rows == [["a1", "default", "active", "3"], ["b1", "east", "standby", "0"]]
    as_json = json.loads(
        (await cli("region", "status", "-o", "json", "--database-url", database)).out
    )
    assert (as_json["active_region"], as_json["region_epoch"]) == ("default", 1)


async def test_a_failover_fences_the_old_region_and_running_it_again_changes_nothing(
    database: str, old_primary: str, cli: Cli
) -> None:
    for url in (database, old_primary):  # the old region holds leases on both
        async with open_postgres_ledger(url) as ledger:
            await ledger.leases_acquire(LeasesAcquire("a1", [0, 1], 60.0))
    args = ("region", "failover", "--to", "east", "--reason", "game day")
    dbs = ("--database-url", database, "--old-database-url", old_primary)
    result = await cli(*args, *dbs)
    assert result.code == 0, result.err
    assert result.out.splitlines() == [
        "region east is active at epoch 2; 2 leases revoked: the old region's nodes are "
        "fenced, east's take over from the checkpoints",
        "old primary fenced: region east at epoch 2 there too",
    ]
    again = await cli(*args, *dbs)
    assert again.out.splitlines()[0] == (
        "region east was active already at epoch 2: nothing changed"
    )
    for url in (database, old_primary):
        async with open_postgres_ledger(url) as ledger:
            settings = await ledger.cluster_get()
            assert (settings.active_region, settings.region_epoch) == ("east", 2)
            assert all(lease.owner_id is None for lease in await ledger.leases_list())
            assert await ledger.leases_acquire(LeasesAcquire("a1", [0], 60.0)) == []
            events = await ledger.audit_list(AuditQuery(action=AuditAction.REGION_FAILOVER))
            assert [(e.actor, e.details["reason"]) for e in events] == [
                ("cli:alice@ops-1", "game day")
            ]


async def test_an_unreachable_old_primary_is_reported_and_the_failover_still_happens(
    database: str, cli: Cli
) -> None:
    result = await cli(
        "region", "failover", "--to", "east", "-o", "json",
        "--database-url", database, "--old-database-url", UNREACHABLE,
    )  # fmt: skip
    assert result.code == 0, result.err
    shown = json.loads(result.out)
    assert (shown["active_region"], shown["region_epoch"], shown["changed"]) == ("east", 2, True)
    assert shown["old_primary"]["fenced"] is False
    assert "unavailable" in shown["old_primary"]["error"]


async def test_a_failover_after_the_old_primary_moved_on_lands_above_its_epoch(
    database: str, old_primary: str, cli: Cli
) -> None:
    """The old primary went on to epoch 3 (say, two switch-overs the replica never saw):
    the new primary jumps above it, so tokens and epochs stay ahead of everything issued."""
    async with open_postgres_ledger(old_primary) as ledger:
        await ledger.region_failover(RegionFailover("west", actor="test"))
        await ledger.region_failover(RegionFailover("default", actor="test"))
    result = await cli(
        "region", "failover", "--to", "east", "-o", "json",
        "--database-url", database, "--old-database-url", old_primary,
    )  # fmt: skip
    shown = json.loads(result.out)
    assert shown["region_epoch"] == 4
    assert shown["old_primary"] == {"fenced": True, "error": None, "region_epoch": 4}


@pytest.mark.parametrize(
    ("argv", "code", "message"),
    [
        (["--to", "east west"], 2, "region 'east west' is invalid"),
        (["--to", "east", "--reason", "x" * 1001], 2, "reason"),
        # a malformed URL is a configuration error, as for every --database-url
        (["--to", "east", "--old-database-url", "mysql://x"], 1, "postgresql://"),
    ],
)
async def test_bad_failover_input_is_one_line_and_changes_nothing(
    database: str, cli: Cli, argv: list[str], code: int, message: str
) -> None:
    result = await cli("region", "failover", *argv, "--database-url", database)
    assert result.code == code
    assert result.err.startswith("carillon: error: ")
    assert message in result.err
    assert result.err.count("\n") == 1
    async with open_postgres_ledger(database) as ledger:
        assert (await ledger.cluster_get()).region_epoch == 1
