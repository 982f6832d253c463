"""Database resolution: configured URL, then the local server, then embedded PostgreSQL.

The embedded tests start the real wheel under a fresh directory in the system temp dir
(not pytest's ``tmp_path``: run as root, the wheel opens every parent directory of its data
directory to other users, and pytest keeps its base temp dir private). As root they also
create the ``embedded_postgres`` system user if it does not exist yet.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest
import trio

from engine.errors import ConfigError
from engine.ledger.database import (
    DATABASE_URL_ENV,
    LOCAL_URL,
    resolve_database,
    url_with_database,
    validate_database_url,
)
from engine.ledger.postgres.migrate import quote_identifier


def closed_port_url() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"postgresql://postgres@127.0.0.1:{port}/postgres"


def local_server_listens() -> bool:
    try:
        with socket.create_connection(("127.0.0.1", 5432), timeout=0.5):
            return True
    except OSError:
        return False


async def fetchval(url: str, query: str) -> object:
    connection = await asyncpg.connect(url, timeout=10)
    try:
        return await connection.fetchval(query)
    finally:
        await connection.close()


@pytest.fixture
def state_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="carillon-embedded-"))
    try:
        yield path
    finally:
        postmaster = path / "pg" / "postmaster.pid"
        if postmaster.exists():  # a failed test left its server running: fast shutdown
            os.kill(int(postmaster.read_text().split()[0]), signal.SIGINT)
        shutil.rmtree(path, ignore_errors=True)


def server_running(state_dir: Path) -> bool:
    return (state_dir / "pg" / "postmaster.pid").exists()


def test_configured_url_wins_without_probing() -> None:
    url = "postgresql://carillon:secret@db.example.invalid:6543/carillon"

    with resolve_database({DATABASE_URL_ENV: f"  {url}\n"}) as resolved:
        assert (resolved.source, resolved.url) == ("env", url)
        assert "secret" not in repr(resolved)


@pytest.mark.parametrize(
    "url",
    [
        "",
        "   ",
        "not a url",
        "mysql://root@localhost/db",
        "postgresql://host:port/db",
        "postgresql://host:70000/db",
        "postgresql://[::1/db",
        "postgresql://a:1,b:x/db",
        "postgresql://host/db?sslmode",
    ],
)
def test_malformed_configured_url_is_a_config_error(url: str) -> None:
    with pytest.raises(ConfigError, match=r"database URL|empty"):
        resolve_database({DATABASE_URL_ENV: url})


def test_config_error_messages_do_not_show_the_password() -> None:
    with pytest.raises(ConfigError) as raised:
        validate_database_url("postgresql://carillon:hunter2@host:bad/db")

    assert "hunter2" not in str(raised.value)


@pytest.mark.parametrize(
    "url",
    [
        "postgres://u@h/db",
        "postgresql://u:p@h1:5432,h2:5433/db?target_session_attrs=read-write",
        "postgresql://[::1]:5432/db",
        "postgresql://postgres:@/postgres?host=/tmp/pg",
        "postgresql:///db",
    ],
)
def test_valid_urls_are_accepted(url: str) -> None:
    assert validate_database_url(url) == url


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        (
            "postgresql://u:p@h:5432/postgres?sslmode=disable",
            "postgresql://u:p@h:5432/carillon_x?sslmode=disable",
        ),
        (
            "postgresql://postgres:@/postgres?host=/tmp/pg",
            "postgresql://postgres:@/carillon_x?host=/tmp/pg",
        ),
        (
            "postgresql://h?dbname=postgres&application_name=a",
            "postgresql://h/carillon_x?application_name=a",
        ),
    ],
)
def test_url_with_database_changes_only_the_database_name(url: str, expected: str) -> None:
    assert url_with_database(url, "carillon_x") == expected


@pytest.mark.parametrize("dbname", ["", "x" * 64])
def test_url_with_database_rejects_impossible_names(dbname: str) -> None:
    with pytest.raises(ConfigError, match="database name"):
        url_with_database(LOCAL_URL, dbname)


@pytest.mark.postgres
def test_local_server_is_used_when_it_accepts_logins() -> None:
    if not local_server_listens():
        pytest.skip("no PostgreSQL server on 127.0.0.1:5432")

    with resolve_database({}) as resolved:
        assert (resolved.source, resolved.url) == ("local", LOCAL_URL)
        assert asyncio.run(fetchval(resolved.url, "SELECT 1")) == 1


def test_embedded_server_starts_when_no_server_is_reachable_and_stops_on_close(
    state_dir: Path,
) -> None:
    with resolve_database({}, state_dir=state_dir, local_url=closed_port_url()) as resolved:
        assert resolved.source == "embedded"
        assert asyncio.run(fetchval(resolved.url, "SELECT 1")) == 1
        assert server_running(state_dir)

    assert not server_running(state_dir)


def test_embedded_server_is_used_when_the_local_server_refuses_the_login(
    state_dir: Path,
) -> None:
    if not local_server_listens():
        pytest.skip("no PostgreSQL server on 127.0.0.1:5432")
    refused = "postgresql://carillon_no_such_role@127.0.0.1:5432/postgres"

    with resolve_database({}, state_dir=state_dir, local_url=refused) as resolved:
        assert resolved.source == "embedded"


@pytest.fixture
def password_server_url() -> Iterator[str]:
    """A fake server that answers every startup message with an MD5 password challenge."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(5)

    def serve() -> None:
        with contextlib.suppress(OSError), listener.accept()[0] as client:
            client.recv(1024)
            client.sendall(b"R" + struct.pack("!ii", 12, 5) + b"salt")
            client.recv(1024)

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    try:
        yield f"postgresql://postgres@127.0.0.1:{listener.getsockname()[1]}/postgres"
    finally:
        listener.close()
        server.join(5)


def test_a_local_server_that_asks_for_a_password_is_not_used(
    state_dir: Path, password_server_url: str
) -> None:
    with resolve_database({}, state_dir=state_dir, local_url=password_server_url) as resolved:
        assert resolved.source == "embedded"


def test_embedded_server_keeps_its_data_between_starts(state_dir: Path) -> None:
    unreachable = closed_port_url()
    with resolve_database({}, state_dir=state_dir, local_url=unreachable) as first:
        asyncio.run(fetchval(first.url, "CREATE TABLE kept AS SELECT 42 AS answer"))

    with resolve_database({}, state_dir=state_dir, local_url=unreachable) as second:
        assert asyncio.run(fetchval(second.url, "SELECT answer FROM kept")) == 42


def test_embedded_server_stops_only_when_its_last_user_here_closes(state_dir: Path) -> None:
    unreachable = closed_port_url()
    first = resolve_database({}, state_dir=state_dir, local_url=unreachable)
    with resolve_database({}, state_dir=state_dir, local_url=unreachable) as second:
        first.close()
        first.close()  # idempotent
        assert asyncio.run(fetchval(second.url, "SELECT 1")) == 1

    assert not server_running(state_dir)


def test_embedded_server_ignores_users_that_died_without_closing(state_dir: Path) -> None:
    unreachable = closed_port_url()
    with resolve_database({}, state_dir=state_dir, local_url=unreachable):
        pass
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    )
    (state_dir / "pg" / ".handle_pids.json").write_text(json.dumps([int(dead.stdout)]))

    with resolve_database({}, state_dir=state_dir, local_url=unreachable):
        assert server_running(state_dir)

    assert not server_running(state_dir)


def test_carillon_keeps_its_tables_in_its_own_database_on_a_shared_server() -> None:
    from engine.ledger.database import APP_DATABASE, ResolvedDatabase

    local = ResolvedDatabase("postgresql://postgres@127.0.0.1:5432/postgres", "local")
    assert local.app_url == f"postgresql://postgres@127.0.0.1:5432/{APP_DATABASE}"
    configured = ResolvedDatabase("postgresql://u@db.example:5432/mine", "env")
    assert configured.app_url == "postgresql://u@db.example:5432/mine"


@pytest.mark.postgres
async def test_create_database_is_idempotent(database_url: str) -> None:
    import secrets

    from engine.ledger.postgres import create_database

    name = f"carillon_test_create_{secrets.token_hex(4)}"
    try:
        assert await create_database(database_url, name) is True
        assert await create_database(database_url, name) is False
    finally:
        await trio.to_thread.run_sync(asyncio.run, _drop(database_url, name))


@pytest.mark.postgres
@pytest.mark.parametrize("odd", ['it"s; DROP DATABASE postgres; --', "Ünïcode name", "a\\b"])
async def test_create_database_takes_any_name_postgres_can_hold(
    database_url: str, odd: str
) -> None:
    import secrets

    from engine.ledger.postgres import create_database

    name = f"carillon_{secrets.token_hex(2)} {odd}"
    try:
        assert await create_database(database_url, name) is True
        assert await create_database(database_url, name) is False
        assert name in await trio.to_thread.run_sync(asyncio.run, _names(database_url))
    finally:
        await trio.to_thread.run_sync(asyncio.run, _drop(database_url, name))


@pytest.mark.parametrize("bad", ["", "x\x00y", "d" * 64, "é" * 32])
def test_a_name_postgres_would_cut_or_refuse_is_a_config_error(bad: str) -> None:
    with pytest.raises(ConfigError, match="cannot name a database"):
        quote_identifier(bad)


def test_identifiers_are_quoted_with_their_quotes_doubled() -> None:
    assert quote_identifier('a"b') == '"a""b"'
    assert quote_identifier("d" * 63) == '"' + "d" * 63 + '"'


async def _names(url: str) -> list[str]:
    connection = await asyncpg.connect(url)
    try:
        return [row[0] for row in await connection.fetch("SELECT datname FROM pg_database")]
    finally:
        await connection.close()


async def _drop(url: str, name: str) -> None:
    connection = await asyncpg.connect(url)
    try:
        await connection.execute(f"DROP DATABASE IF EXISTS {quote_identifier(name)} WITH (FORCE)")
    finally:
        await connection.close()
