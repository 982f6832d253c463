"""The replicated pair of the multi-region game day (``docs/multi-region.md``): streaming, a
controlled lag window, forced and planned failover, the old primary back as a second primary.

Each test builds its own primary and standby (about 4 s) and removes them; no shared server is
used. They need PostgreSQL server binaries with ``pg_basebackup`` and, as root, ``runuser`` and
the OS user ``postgres``; without them they are skipped with the reason.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest

from simulations.chaos.postgres import accepts_connections
from simulations.regions.replication import (
    PairServer,
    QueryFailed,
    ReplicatedPair,
    ReplicationError,
    missing_prerequisites,
)

pytestmark = pytest.mark.postgres

APP = "app"
READ_ONLY_SQL_TRANSACTION = "25006"


def _require_replication() -> None:
    missing = missing_prerequisites()
    if missing:
        pytest.skip(missing)


@pytest.fixture
def pair() -> Iterator[ReplicatedPair]:
    """A streaming pair with a database ``app`` and a table ``fires (id, node)`` on both."""
    _require_replication()
    with ReplicatedPair() as built:
        built.create_database(APP)
        built.primary.query("CREATE TABLE fires (id int PRIMARY KEY, node text)", database=APP)
        yield built


def insert(server: PairServer, *ids: int, node: str = "a") -> None:
    values = ", ".join(f"({i}, '{node}')" for i in ids)
    server.query(f"INSERT INTO fires VALUES {values}", database=APP)


def ids(server: PairServer) -> list[int]:
    return [int(row[0]) for row in server.query("SELECT id FROM fires ORDER BY id", database=APP)]


def writer_of(server: PairServer, fire_id: int) -> str:
    return server.value(f"SELECT node FROM fires WHERE id = {fire_id}", database=APP)


async def _asyncpg_fetch(url: str, sql: str) -> object:
    connection = await asyncpg.connect(url, timeout=10)
    try:
        return await connection.fetchval(sql)
    finally:
        await connection.close()


def test_rows_written_on_the_primary_are_read_on_the_standby_which_refuses_writes(
    pair: ReplicatedPair,
) -> None:
    insert(pair.primary, 1, 2, 3)
    pair.wait_caught_up()
    assert ids(pair.standby) == [1, 2, 3]
    with pytest.raises(QueryFailed) as refused:
        insert(pair.standby, 4)
    assert refused.value.sqlstate == READ_ONLY_SQL_TRANSACTION
    # What the engine's driver sees when a node writes through the standby's URL.
    with pytest.raises(asyncpg.ReadOnlySQLTransactionError):
        asyncio.run(_asyncpg_fetch(pair.standby.database_url(APP), "INSERT INTO fires VALUES (4)"))


def test_paused_replay_hides_a_write_and_shows_lag_until_resumed(pair: ReplicatedPair) -> None:
    insert(pair.primary, 1)
    pair.wait_caught_up()
    pair.pause_replay()
    insert(pair.primary, 2)
    assert pair.replication_lag().lag_bytes > 0
    assert ids(pair.standby) == [1]
    with pytest.raises(ReplicationError, match="paused"):
        pair.wait_caught_up()
    pair.resume_replay()
    pair.wait_caught_up()
    assert ids(pair.standby) == [1, 2]
    assert pair.replication_lag().replay_age_s is not None


def test_forced_failover_keeps_replicated_rows_and_the_old_primary_still_accepts_writes(
    pair: ReplicatedPair,
) -> None:
    for batch in range(10):
        insert(pair.primary, *range(batch * 10, batch * 10 + 10))
    pair.wait_caught_up()
    pair.stop_primary("immediate")
    pair.promote_standby()
    assert not pair.standby.in_recovery()
    assert ids(pair.standby) == list(range(100))
    insert(pair.standby, 100, node="b")
    assert pair.standby.timeline() == 2
    # Split brain: the crashed primary comes back on its own timeline and takes the same
    # key with another value. Only the engine's fencing can refuse this write.
    pair.start_old_primary()
    insert(pair.primary, 100, node="a")
    assert pair.primary.timeline() == 1
    assert (writer_of(pair.primary, 100), writer_of(pair.standby, 100)) == ("a", "b")


def test_planned_switchover_loses_no_row_written_right_before_the_clean_stop(
    pair: ReplicatedPair,
) -> None:
    insert(pair.primary, *range(10))
    # The last commit before the stop is large, so that WAL is still in flight at the stop.
    pair.primary.query(
        "INSERT INTO fires SELECT i, 'a' FROM generate_series(10, 20009) AS i", database=APP
    )
    new_primary = pair.switchover()
    assert new_primary is pair.standby
    assert ids(new_primary) == list(range(20010))
    insert(new_primary, 20010, node="b")
    assert new_primary.timeline() == 2
    assert pair.primary.controldata()["Database cluster state"] == "shut down"
    assert "switchover_s" in pair.statistics()


def test_old_primary_started_isolated_takes_a_local_write_before_it_listens_on_tcp(
    pair: ReplicatedPair,
) -> None:
    pair.stop_primary("immediate")
    pair.promote_standby()
    local_url = pair.start_old_primary_isolated()
    assert not accepts_connections(pair.primary.port)
    pair.primary.query("CREATE TABLE fenced AS SELECT now() AS at", database=APP)
    app_url = local_url.replace("/postgres?", f"/{APP}?")
    assert asyncio.run(_asyncpg_fetch(app_url, "SELECT count(*) FROM fenced")) == 1
    pair.start_old_primary()
    assert accepts_connections(pair.primary.port)
    assert pair.primary.value("SELECT count(*) FROM fenced", database=APP) == "1"


def test_promotion_first_replays_what_was_received_while_replay_was_paused(
    pair: ReplicatedPair,
) -> None:
    insert(pair.primary, 1)
    pair.wait_caught_up()
    pair.pause_replay()
    insert(pair.primary, 2)
    pair.wait_received()
    assert ids(pair.standby) == [1]
    pair.stop_primary("immediate")
    pair.promote_standby()
    assert ids(pair.standby) == [1, 2]


def test_forced_failover_while_streaming_is_paused_loses_the_commits_made_since(
    pair: ReplicatedPair,
) -> None:
    insert(pair.primary, 1)
    pair.wait_caught_up()
    pair.pause_streaming()
    insert(pair.primary, 2)
    pair.stop_primary("immediate")
    pair.promote_standby()
    assert ids(pair.standby) == [1]


def test_a_failed_build_stops_the_primary_and_removes_its_directories() -> None:
    _require_replication()
    pair = ReplicatedPair(slot_name="Not A Slot")
    with pytest.raises(ReplicationError, match="invalid character") as failed, pair:
        pass
    assert "--- server a" in str(failed.value)  # the primary's log tail
    assert not accepts_connections(pair.primary.port)
    assert not pair.root.exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="only root hands directories to another user")
def test_a_base_dir_the_server_user_cannot_enter_is_refused_up_front(tmp_path: Path) -> None:
    _require_replication()
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    with pytest.raises(ReplicationError, match="cannot enter"):
        ReplicatedPair(base_dir=private)
    assert list(private.iterdir()) == []
