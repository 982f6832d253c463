"""A PostgreSQL primary and its streaming hot standby on this machine, for multi-region game days.

:class:`ReplicatedPair` builds two private servers (:class:`PairServer`, a
:class:`~simulations.chaos.postgres.PrivatePostgres`), each in its own directory under one
temporary root and on its own free port of 127.0.0.1:

1. ``a``, the primary: ``initdb``, ``pg_hba.conf`` trusting replication connections from
   127.0.0.1, started with :data:`PAIR_SETTINGS` (``wal_level=replica``, WAL senders and
   slots, and ``synchronous_commit=on``, so that an acknowledged commit is in the WAL the
   standby is sent and survives an ``immediate`` stop);
2. ``b``, the standby: ``pg_basebackup -R -X stream -C -S <slot>`` of ``a`` (``-R`` writes
   ``standby.signal``, ``primary_conninfo`` and ``primary_slot_name``), started as a hot
   standby, then verified to stream: ``pg_stat_replication`` on ``a`` lists it as
   ``streaming``, ``pg_is_in_recovery()`` and ``pg_stat_wal_receiver`` on ``b`` agree.

``pair.primary`` and ``pair.standby`` keep the roles they had at set-up: after
:meth:`~ReplicatedPair.promote_standby` the writable server is ``pair.standby``, and
:meth:`~ReplicatedPair.start_old_primary` restarts ``pair.primary`` as a second primary --
nothing in PostgreSQL prevents it, which is the split brain the engine must fence.
Replication is asynchronous: a forced failover loses what the standby had not received.

Invariants: every step has a timeout and fails with :class:`ReplicationError`, whose message
ends with the log tails of the servers involved; :meth:`ReplicatedPair.close` stops both
servers and deletes the root whatever state a failure left them in. SQL goes through
``psql`` (synchronous, no event loop), so plain tests and game-day scripts can drive it.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal, Self

from simulations.chaos.postgres import PG_USER, SERVER_SETTINGS, PrivatePostgres, find_binaries

REQUIRED_TOOLS: Final = ("initdb", "pg_ctl", "pg_basebackup", "pg_controldata", "psql")
PAIR_OVERRIDES: Final = (
    "synchronous_commit=on",
    "shared_buffers=32MB",
    "max_connections=100",
    "wal_level=replica",
    "max_wal_senders=4",
    "max_replication_slots=4",
    "hot_standby=on",
    "wal_receiver_status_interval=1s",
    "wal_retrieve_retry_interval=1s",
)
PAIR_SETTINGS: Final = (
    *(
        s
        for s in SERVER_SETTINGS
        if s.split("=")[0] not in {o.split("=")[0] for o in PAIR_OVERRIDES}
    ),
    *PAIR_OVERRIDES,
)
"""The chaos server's settings (no fsync: a stop is never an OS crash) with small buffers and
the replication settings; both servers start with them (a hot standby needs at least the
primary's ``max_connections``, ``max_wal_senders`` and the like)."""
DEFAULT_SLOT: Final = "carillon_standby"
QUERY_TIMEOUT_S: Final = 15.0
BASE_BACKUP_TIMEOUT_S: Final = 120.0
STREAMING_TIMEOUT_S: Final = 30.0
CATCH_UP_TIMEOUT_S: Final = 30.0
PROMOTE_TIMEOUT_S: Final = 30.0
POLL_INTERVAL_S: Final = 0.05
LOG_TAIL_LINES: Final = 15
_FIELD_SEPARATOR: Final = "\x1f"
_SQLSTATE: Final = re.compile(r"ERROR:\s+([0-9A-Z]{5}):\s*(.*)")
_DATABASE_NAME: Final = re.compile(r"[a-z_][a-z0-9_]{0,62}")

StopPrimaryMode = Literal["immediate", "fast"]


class ReplicationError(RuntimeError):
    """A step of the pair failed or did not finish in time; the message says which and ends
    with the log tails of the servers involved."""


class QueryFailed(RuntimeError):
    """``psql`` reported an error. ``sqlstate`` is the server's code when a server answered
    (``25006``: a write in a read-only transaction, as on a standby), else ``None``."""

    def __init__(self, message: str, sqlstate: str | None) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate


@dataclass(frozen=True)
class ReplicationLag:
    """How far the standby's replay trails the primary.

    ``primary_lsn`` is the primary's ``pg_current_wal_lsn()``, ``replay_lsn`` the standby's
    ``pg_last_wal_replay_lsn()`` (read just after). ``replay_age_s`` is ``now() -
    pg_last_xact_replay_timestamp()`` on the standby: the age of the last replayed commit as
    stamped by the primary. It is a time lag only while the primary commits; on an idle
    primary it grows although nothing is missing, and it is ``None`` before the standby has
    replayed any commit since it started.
    """

    primary_lsn: int
    replay_lsn: int
    replay_age_s: float | None

    @property
    def lag_bytes(self) -> int:
        return max(0, self.primary_lsn - self.replay_lsn)


def parse_lsn(text: str) -> int:
    """``'0/3000148'`` -> the WAL position as a byte offset."""
    high, low = text.split("/")
    return (int(high, 16) << 32) | int(low, 16)


def format_lsn(lsn: int) -> str:
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def missing_prerequisites(bin_dir: Path | None = None) -> str | None:
    """Why a pair cannot be built on this machine, or ``None`` when it can."""
    try:
        found = bin_dir or find_binaries()
    except RuntimeError as exc:
        return str(exc)
    missing = [tool for tool in REQUIRED_TOOLS if not (found / tool).exists()]
    if missing:
        return f"PostgreSQL tools missing from {found}: {', '.join(missing)}"
    if os.geteuid() == 0:
        if shutil.which("runuser") is None:
            return "running as root needs runuser to start PostgreSQL as another user"
        try:
            pwd.getpwnam(PG_USER)
        except KeyError:
            return f"running as root needs an OS user {PG_USER!r} to run PostgreSQL"
    return None


def unreachable_directory(path: Path, user: str = PG_USER) -> Path | None:
    """The first directory on the way to ``path`` that ``user`` may not enter, if any (as root,
    the servers run as ``user`` and must reach their directories; none is chmod-ed here)."""
    account = pwd.getpwnam(user)
    groups = set(os.getgrouplist(user, account.pw_gid))
    for directory in (*reversed(path.resolve().parents), path.resolve()):
        status = directory.stat()
        if status.st_uid == account.pw_uid:
            allowed = status.st_mode & 0o100
        elif status.st_gid in groups:
            allowed = status.st_mode & 0o010
        else:
            allowed = status.st_mode & 0o001
        if not allowed:
            return directory
    return None


class PairServer(PrivatePostgres):
    """One server of a pair: answers SQL through ``psql`` (over TCP, or over its private Unix
    socket while isolated) and reports its recovery state, WAL positions and control file."""

    def __init__(
        self, name: str, *, bin_dir: Path, base_dir: Path, settings: Sequence[str]
    ) -> None:
        super().__init__(
            bin_dir=bin_dir,
            base_dir=base_dir,
            settings=(*settings, f"cluster_name=carillon-{name}"),
        )
        self.name = name
        self.cluster_name = f"carillon-{name}"  # a standby's application_name on its primary
        self.socket_dir: Path | None = None  # while isolated: no TCP, only a socket in here

    def local_url(self, database: str = "postgres") -> str:
        """The Unix-socket URL of an isolated server (libpq and asyncpg accept it)."""
        if self.socket_dir is None:
            raise ReplicationError(f"server {self.name} is not running isolated")
        return f"postgresql://{PG_USER}@/{database}?host={self.socket_dir}&port={self.port}"

    def log_tail(self) -> str:
        return f"--- server {self.name} ({self.log_file}) ---\n{self._log_tail(LOG_TAIL_LINES)}"

    def query(
        self, sql: str, *, database: str = "postgres", timeout_s: float = QUERY_TIMEOUT_S
    ) -> list[tuple[str, ...]]:
        """Run ``sql`` (one statement, or several in one implicit transaction); returns the
        rows of the last result as text (``NULL`` as ``''``). Raises :class:`QueryFailed`."""
        host = str(self.socket_dir) if self.socket_dir else "127.0.0.1"
        argv = self._command(
            "psql", "-h", host, "-p", str(self.port), "-U", PG_USER, "-d", database,
            "-v", "ON_ERROR_STOP=1", "-v", "VERBOSITY=verbose",
            "-q", "-X", "-A", "-t", "-F", _FIELD_SEPARATOR, "-c", sql,
        )  # fmt: skip
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise QueryFailed(f"server {self.name}: no answer in {timeout_s:g} s", None) from None
        if done.returncode != 0:
            coded = _SQLSTATE.search(done.stderr)
            message = coded.group(2) if coded else done.stderr.strip()
            raise QueryFailed(f"server {self.name}: {message}", coded.group(1) if coded else None)
        return [tuple(line.split(_FIELD_SEPARATOR)) for line in done.stdout.splitlines()]

    def value(
        self, sql: str, *, database: str = "postgres", timeout_s: float = QUERY_TIMEOUT_S
    ) -> str:
        """The first column of the first row of ``sql``'s result."""
        rows = self.query(sql, database=database, timeout_s=timeout_s)
        if not rows:
            raise QueryFailed(f"server {self.name}: no row from {sql!r}", None)
        return rows[0][0]

    def in_recovery(self) -> bool:
        return self.value("SELECT pg_is_in_recovery()") == "t"

    def timeline(self) -> int:
        """The timeline this server writes on (in recovery: that of its last restartpoint)."""
        if self.in_recovery():
            return int(self.value("SELECT timeline_id FROM pg_control_checkpoint()"))
        return int(self.value("SELECT pg_walfile_name(pg_current_wal_lsn())")[:8], 16)

    def controldata(self) -> dict[str, str]:
        """``pg_controldata`` of the data directory (readable while the server is stopped)."""
        done = subprocess.run(
            self._command("pg_controldata", "-D", str(self.data_dir)),
            capture_output=True, text=True, timeout=QUERY_TIMEOUT_S,
        )  # fmt: skip
        if done.returncode != 0:
            raise ReplicationError(f"pg_controldata of server {self.name}: {done.stderr}")
        pairs = (line.split(":", 1) for line in done.stdout.splitlines() if ":" in line)
        return {key.strip(): value.strip() for key, value in pairs}

    def hand_over(self, directory: Path) -> None:
        """Give ``directory`` to the user the server runs as, mode 0700 (as ``initdb`` does)."""
        if self._as_other_user:
            shutil.chown(directory, user=PG_USER, group=None)
        directory.chmod(0o700)

    def clone_from(self, primary: PairServer, slot_name: str) -> None:
        """``pg_basebackup`` of ``primary`` as its standby (``-R``), the WAL written meanwhile
        streamed alongside (``-X stream``) through a new physical slot (``-C -S``)."""
        self.hand_over(self.root)
        self._run(
            "pg_basebackup",
            "-h", "127.0.0.1", "-p", str(primary.port), "-U", PG_USER, "-D", str(self.data_dir),
            "-R", "-X", "stream", "-C", "-S", slot_name, "--checkpoint=fast", "--no-sync",
            timeout_s=BASE_BACKUP_TIMEOUT_S,
        )  # fmt: skip


class ReplicatedPair:
    """A primary (``primary``, server ``a``) and its streaming hot standby (``standby``,
    server ``b``); use as a context manager (both are stopped and deleted on exit).

    URLs: ``pair.primary.url`` / ``pair.standby.url`` (database ``postgres``) and
    ``server.database_url(name)``. :meth:`statistics` holds the measured step durations.
    """

    def __init__(
        self,
        *,
        bin_dir: Path | None = None,
        base_dir: Path | None = None,
        settings: Sequence[str] = PAIR_SETTINGS,
        slot_name: str = DEFAULT_SLOT,
    ) -> None:
        found = bin_dir or find_binaries()
        missing = missing_prerequisites(found)
        if missing:
            raise ReplicationError(missing)
        as_root = os.geteuid() == 0
        blocked = as_root and unreachable_directory(Path(base_dir or tempfile.gettempdir()))
        if blocked:
            raise ReplicationError(
                f"the server user {PG_USER!r} cannot enter {blocked} "
                f"(mode {blocked.stat().st_mode & 0o777:o}): choose another base_dir"
            )
        self.slot_name = slot_name
        self.root = Path(tempfile.mkdtemp(prefix="carillon-regions-", dir=base_dir))
        self.root.chmod(0o711)  # the servers' own directories below are 0700, theirs
        try:
            self.primary = PairServer("a", bin_dir=found, base_dir=self.root, settings=settings)
            self.standby = PairServer("b", bin_dir=found, base_dir=self.root, settings=settings)
        except BaseException:
            shutil.rmtree(self.root, ignore_errors=True)
            raise
        self._timings: dict[str, float] = {}
        self._socket_dir: Path | None = None  # the isolated old primary's, made when needed
        self._primary_conninfo: str | None = None  # the standby's, while streaming is paused

    def open(self) -> None:
        """Build the pair: the primary, the base backup, the standby, verified streaming."""
        primary, standby = self.primary, self.standby
        started = time.monotonic()
        self._step("initdb", primary, lambda: primary.initialize(sync=False))
        self._trust_replication_from_localhost()
        self._step("starting the primary", primary, primary.start)
        self._timings["primary_ready_s"] = time.monotonic() - started
        cloning = time.monotonic()
        self._step("pg_basebackup", standby, lambda: standby.clone_from(primary, self.slot_name))
        self._timings["base_backup_s"] = time.monotonic() - cloning
        starting = time.monotonic()
        self._step("starting the standby", standby, standby.start)
        self._wait("the standby streaming", self._is_streaming, STREAMING_TIMEOUT_S)
        self._timings["standby_streaming_s"] = time.monotonic() - starting
        self._timings["pair_ready_s"] = time.monotonic() - started

    def statistics(self) -> dict[str, float]:
        """Measured durations in seconds: ``primary_ready_s`` (initdb and start),
        ``base_backup_s``, ``standby_streaming_s`` (start until streaming), ``pair_ready_s``,
        and after the corresponding calls ``promotion_s``, ``switchover_s``."""
        return dict(self._timings)

    def create_database(self, name: str, *, timeout_s: float = CATCH_UP_TIMEOUT_S) -> None:
        """Create ``name`` on the primary and, unless replay is paused, wait until the
        standby has it too (``CREATE DATABASE`` is WAL-logged like any write)."""
        if not _DATABASE_NAME.fullmatch(name):
            raise ValueError(f"database name {name!r}: use [a-z_][a-z0-9_]*")
        self.primary.query(f"CREATE DATABASE {name}")
        if self._paused() is None:
            present = f"SELECT count(*) FROM pg_database WHERE datname = '{name}'"
            self._wait(f"database {name} on the standby",
                       lambda: self.standby.value(present) == "1", timeout_s)  # fmt: skip

    def replication_lag(self) -> ReplicationLag:
        """The standby's byte and time lag (see :class:`ReplicationLag`); both servers must
        be up and the standby still in recovery."""
        primary_lsn = parse_lsn(self.primary.value("SELECT pg_current_wal_lsn()"))
        replay, age = self.standby.query(
            "SELECT pg_last_wal_replay_lsn(),"
            " extract(epoch FROM now() - pg_last_xact_replay_timestamp())"
        )[0]
        if not replay:
            raise ReplicationError(f"server {self.standby.name} replays no WAL (promoted?)")
        return ReplicationLag(primary_lsn, parse_lsn(replay), float(age) if age else None)

    def wait_caught_up(self, timeout_s: float = CATCH_UP_TIMEOUT_S) -> float:
        """Wait until the standby has replayed all the WAL the primary had written when
        called (so every commit acknowledged before); returns the seconds waited."""
        if paused := self._paused():
            raise ReplicationError(f"{paused}: the standby cannot catch up")
        target = parse_lsn(self.primary.value("SELECT pg_current_wal_lsn()"))
        return self._wait(f"the standby replaying up to {format_lsn(target)}",
                          lambda: self._replay_lsn() >= target, timeout_s)  # fmt: skip

    def wait_received(self, timeout_s: float = CATCH_UP_TIMEOUT_S) -> float:
        """Wait until the standby has received (and flushed to its ``pg_wal``) all the WAL
        the primary had written when called, replayed or not -- also while replay is
        paused; returns the seconds waited."""
        if self._primary_conninfo is not None:
            raise ReplicationError("streaming is paused (resume_streaming()): nothing arrives")
        target = parse_lsn(self.primary.value("SELECT pg_current_wal_lsn()"))
        received = "SELECT flushed_lsn FROM pg_stat_wal_receiver"
        return self._wait(f"the standby receiving up to {format_lsn(target)}",
                          lambda: parse_lsn(self.standby.value(received)) >= target,
                          timeout_s)  # fmt: skip

    def pause_replay(self) -> None:
        """Stop applying WAL on the standby (it keeps receiving it): from now on writes on
        the primary are invisible there and :meth:`replication_lag` grows."""
        self.standby.query("SELECT pg_wal_replay_pause()")
        self._wait("replay paused", lambda: self._replay_pause_state() == "paused",
                   STREAMING_TIMEOUT_S)  # fmt: skip

    def resume_replay(self) -> None:
        self.standby.query("SELECT pg_wal_replay_resume()")
        self._wait("replay resumed", lambda: self._replay_pause_state() == "not paused",
                   STREAMING_TIMEOUT_S)  # fmt: skip

    def pause_streaming(self) -> None:
        """Cut the standby off the primary (``primary_conninfo = ''``, reloaded) until
        :meth:`resume_streaming`: unlike with a paused replay -- a promotion first replays all
        the WAL received -- a forced failover now loses every commit made since, the loss
        window of asynchronous replication. The primary's slot keeps the WAL meanwhile."""
        self._primary_conninfo = self.standby.value("SHOW primary_conninfo")
        self.standby.query("ALTER SYSTEM SET primary_conninfo = ''")
        self.standby.query("SELECT pg_reload_conf()")
        self._wait("the standby no longer streaming", self._is_detached, STREAMING_TIMEOUT_S)

    def resume_streaming(self) -> None:
        if self._primary_conninfo is None:
            raise ReplicationError("streaming is not paused")
        quoted = self._primary_conninfo.replace("'", "''")
        self.standby.query(f"ALTER SYSTEM SET primary_conninfo = '{quoted}'")
        self.standby.query("SELECT pg_reload_conf()")
        self._wait("the standby streaming again", self._is_streaming, STREAMING_TIMEOUT_S)
        self._primary_conninfo = None

    def stop_primary(self, mode: StopPrimaryMode = "immediate") -> None:
        """Stop the primary: ``immediate`` is a crash (no shutdown checkpoint, crash recovery
        at the next start, WAL not yet sent is not sent); ``fast`` is clean (a shutdown
        checkpoint, and the WAL senders send everything to the standby before exiting)."""
        self._step(f"stopping the primary ({mode})", self.primary, lambda: self.primary.stop(mode))

    def promote_standby(self, timeout_s: float = PROMOTE_TIMEOUT_S) -> float:
        """Promote the standby (``pg_promote(wait => true)``) and wait until it is out of
        recovery and assigns transaction ids; returns the seconds from the request to then,
        as a client sees it (``psql`` round trips included)."""
        started = time.monotonic()
        promote = f"SELECT pg_promote(wait => true, wait_seconds => {max(1, int(timeout_s))})"
        try:
            promoted = self.standby.value(promote, timeout_s=timeout_s + QUERY_TIMEOUT_S) == "t"
        except QueryFailed as exc:
            raise self._error(f"promoting the standby: {exc}") from None
        if not promoted:
            raise self._error(f"the standby not promoted within {timeout_s:g} s")
        self._wait("the promoted standby accepting writes", self._standby_writable, timeout_s)
        self._timings["promotion_s"] = elapsed = time.monotonic() - started
        return elapsed

    def start_old_primary(self) -> PairServer:
        """Start the old primary again, reachable over TCP as before, as the standalone primary
        it still believes it is (after a crash: crash recovery first). PostgreSQL accepts
        writes there although the standby was promoted: two diverging timelines. An old
        primary running isolated is restarted on TCP. Returns it."""
        primary = self.primary
        if primary.socket_dir is not None:
            self._step("stopping the isolated old primary", primary, primary.stop)
            primary.socket_dir = None
        elif primary.running:
            raise ReplicationError("the old primary is running: stop_primary() first")
        self._step("starting the old primary", primary, primary.start)
        self._wait("the old primary accepting writes", lambda: not primary.in_recovery(),
                   STREAMING_TIMEOUT_S)  # fmt: skip
        return primary

    def start_old_primary_isolated(self) -> str:
        """Start the old primary listening on no TCP address, only on a Unix socket in a
        private directory (mode 0700), so that no node can reach it while an operator fences
        it; returns its local URL. :meth:`start_old_primary` then reopens it on TCP."""
        primary = self.primary
        if primary.running:
            raise ReplicationError("the old primary is running: stop_primary() first")
        if self._socket_dir is None:  # short, in the system's temporary directory: a socket
            # path must fit in 107 bytes, which one below a test's tmp_path may not
            self._socket_dir = Path(tempfile.mkdtemp(prefix="carillon-socket-"))
            primary.hand_over(self._socket_dir)
        socket_dir = primary.socket_dir = self._socket_dir
        isolated = ("listen_addresses=", f"unix_socket_directories={socket_dir}")
        self._step("starting the old primary isolated", primary,
                   lambda: primary.start(extra_settings=isolated))  # fmt: skip
        return primary.local_url()

    def switchover(self, timeout_s: float = PROMOTE_TIMEOUT_S) -> PairServer:
        """A planned switch-over that loses nothing: stop the primary cleanly, wait until the
        standby has replayed its shutdown checkpoint (the last record it wrote, located by
        ``pg_controldata``), promote the standby; returns it, the new primary."""
        if paused := self._paused():
            raise ReplicationError(f"{paused}: a switch-over would wait for nothing")
        started = time.monotonic()
        self.stop_primary("fast")
        control = self.primary.controldata()
        if control.get("Database cluster state") != "shut down":
            raise self._error(f"the primary did not shut down cleanly: {control}")
        checkpoint = parse_lsn(control["Latest checkpoint location"])
        self._wait(f"the standby replaying the shutdown checkpoint at {format_lsn(checkpoint)}",
                   lambda: self._replay_lsn() > checkpoint, timeout_s)  # fmt: skip
        self.promote_standby(timeout_s)
        self._timings["switchover_s"] = time.monotonic() - started
        return self.standby

    def close(self) -> None:
        """Stop both servers (whatever their state) and delete the root directory."""
        for server in (self.standby, self.primary):
            with contextlib.suppress(Exception):
                server.close()
        shutil.rmtree(self.root, ignore_errors=True)
        if self._socket_dir is not None:
            shutil.rmtree(self._socket_dir, ignore_errors=True)

    def __enter__(self) -> Self:
        try:
            self.open()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _trust_replication_from_localhost(self) -> None:
        """``initdb --auth=trust`` already writes this rule; other builds may not."""
        hba = self.primary.data_dir / "pg_hba.conf"
        rule = ["host", "replication", "all", "127.0.0.1/32", "trust"]
        if not any(line.split() == rule for line in hba.read_text().splitlines()):
            with hba.open("a") as out:
                out.write("\n" + "\t".join(rule) + "\n")

    def _is_streaming(self) -> bool:
        sending = "SELECT state FROM pg_stat_replication WHERE application_name = '{}'"
        return (
            self.primary.query(sending.format(self.standby.cluster_name)) == [("streaming",)]
            and self.standby.in_recovery()
            and self.standby.query("SELECT status FROM pg_stat_wal_receiver") == [("streaming",)]
        )

    def _is_detached(self) -> bool:
        sending = "SELECT 1 FROM pg_stat_replication WHERE application_name = '{}'"
        return (
            self.standby.query("SELECT 1 FROM pg_stat_wal_receiver") == []
            and self.primary.query(sending.format(self.standby.cluster_name)) == []
        )

    def _replay_lsn(self) -> int:
        return parse_lsn(self.standby.value("SELECT pg_last_wal_replay_lsn()"))

    def _replay_pause_state(self) -> str:
        return self.standby.value("SELECT pg_get_wal_replay_pause_state()")

    def _paused(self) -> str | None:
        """What keeps the standby from following the primary, if anything."""
        if self._primary_conninfo is not None:
            return "streaming is paused (resume_streaming())"
        if self._replay_pause_state() != "not paused":
            return "replay is paused (resume_replay())"
        return None

    def _standby_writable(self) -> bool:
        # Assigning a transaction id is refused during recovery: the cheapest write probe.
        return not self.standby.in_recovery() and bool(
            self.standby.query("SELECT pg_current_xact_id()")
        )

    def _error(self, message: str, *servers: PairServer) -> ReplicationError:
        tails = "\n".join(s.log_tail() for s in servers or (self.primary, self.standby))
        return ReplicationError(f"{message}\n{tails}")

    def _step(self, what: str, server: PairServer, action: Callable[[], None]) -> None:
        """Run a server command; its failure names the step and shows the logs (``_run``'s
        own message already ends with ``server``'s tail)."""
        other = self.standby if server is self.primary else self.primary
        try:
            action()
        except subprocess.TimeoutExpired as exc:
            raise self._error(f"{what}: no result within {exc.timeout:g} s") from None
        except ReplicationError:
            raise
        except RuntimeError as exc:
            raise self._error(f"{what} failed: {exc}", other) from None

    def _wait(self, what: str, condition: Callable[[], bool], timeout_s: float) -> float:
        """Poll ``condition`` until true (a failed query counts as not yet); returns the
        seconds waited, or raises :class:`ReplicationError` after ``timeout_s``."""
        started = time.monotonic()
        last_error: QueryFailed | None = None
        while True:
            try:
                if condition():
                    return time.monotonic() - started
            except QueryFailed as exc:
                last_error = exc
            if time.monotonic() - started >= timeout_s:
                cause = f" (last error: {last_error})" if last_error else ""
                raise self._error(f"{what}: not within {timeout_s:g} s{cause}")
            time.sleep(POLL_INTERVAL_S)
