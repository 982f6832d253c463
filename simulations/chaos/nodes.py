"""``carillon run`` processes of a chaos run: start, signal, scrape, and read their logs.

Each :class:`NodeProcess` is one ``python -m engine run`` with its own ``--node-id``, the API
on a free port of 127.0.0.1 (``--http 127.0.0.1:0``; the bound address is read from the JSON
"node ready" log line), and its log (``--log-format json``, stdout and stderr) in a file of
its own. Processes start in a session of their own, so a Ctrl-C in the terminal reaches only
the chaos script, which then stops them itself.

A process killed with SIGKILL is restarted under a *new* id (``node-1`` becomes ``node-1.r1``):
a node refuses to start while its id still has a live heartbeat, and a supervisor restarting
a crashed process (systemd, Kubernetes) gets a fresh default id (``host-pid-random``) too.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import httpx

READY_TIMEOUT_S: Final = 60.0
STOP_TIMEOUT_S: Final = 20.0


@dataclass(frozen=True)
class NodeSettings:
    """What every node of the run shares (flags of ``carillon run``)."""

    database_url: str
    lease_ttl_s: float
    lease_safety_margin_s: float
    attempt_lease_s: float
    workers: int = 32
    shutdown_timeout_s: float = 5.0

    def argv(self, node_id: str) -> list[str]:
        return [
            sys.executable, "-m", "engine", "run",
            "--database-url", self.database_url,
            "--node-id", node_id,
            "--http", "127.0.0.1:0",
            "--lease-ttl", f"{self.lease_ttl_s:g}",
            "--lease-safety-margin", f"{self.lease_safety_margin_s:g}",
            "--attempt-lease", f"{self.attempt_lease_s:g}",
            "--workers", str(self.workers),
            "--shutdown-timeout", f"{self.shutdown_timeout_s:g}",
            "--webhook-allow-cidrs", "127.0.0.0/8",
            "--log-format", "json",
        ]  # fmt: skip


class NodeProcess:
    """One ``carillon run`` process and its log file."""

    def __init__(self, node_id: str, settings: NodeSettings, log_dir: Path) -> None:
        self.node_id = node_id
        self.settings = settings
        self.log_path = log_dir / f"{node_id}.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.api_url: str | None = None
        self.started_at: float | None = None

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CARILLON_")}
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                self.settings.argv(self.node_id),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env=env,
                start_new_session=True,
            )
        self.started_at = time.time()

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> str:
        """Block until the "node ready" line; returns the API's base URL."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for record in self.log_records():
                if record.get("msg") == "node ready":
                    self.api_url = str(record["api"])
                    return self.api_url
            if not self.alive:
                raise RuntimeError(f"{self.node_id} exited before it was ready: {self.log_path}")
            time.sleep(0.1)
        raise RuntimeError(f"{self.node_id} not ready within {timeout_s:g}s; see {self.log_path}")

    def signal(self, signum: signal.Signals) -> None:
        if self.alive:
            os.kill(self.pid, signum)

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> int | None:
        """SIGCONT (in case it is paused) and SIGTERM; SIGKILL after ``timeout_s``."""
        if self.process is None:
            return None
        if self.alive:
            self.signal(signal.SIGCONT)
            self.signal(signal.SIGTERM)
            try:
                return self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.signal(signal.SIGKILL)
        return self.process.wait()

    def kill(self) -> None:
        """SIGKILL and reap."""
        self.signal(signal.SIGKILL)
        if self.process is not None:
            self.process.wait()

    def log_records(self) -> Iterator[dict[str, Any]]:
        """Every JSON record of the log so far (other lines -- tracebacks -- are skipped)."""
        with contextlib.suppress(FileNotFoundError), self.log_path.open("rb") as log:
            for line in log:
                with contextlib.suppress(ValueError):
                    record = json.loads(line)
                    if isinstance(record, dict):
                        yield record

    def metrics(self, timeout_s: float = 5.0) -> dict[str, float]:
        """The node's ``/metrics`` as ``{"name{labels}": value}`` (empty when unreachable)."""
        if self.api_url is None:
            return {}
        try:
            response = httpx.get(f"{self.api_url}/metrics", timeout=timeout_s)
            response.raise_for_status()
        except httpx.HTTPError:
            return {}
        values: dict[str, float] = {}
        for line in response.text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                with contextlib.suppress(ValueError):
                    values[name] = float(value)
        return values


def lease_losses(metrics: dict[str, float]) -> dict[str, float]:
    """``carillon_lease_losses_total`` by reason."""
    prefix = 'carillon_lease_losses_total{reason="'
    return {
        name[len(prefix) : -2]: value for name, value in metrics.items() if name.startswith(prefix)
    }


def metrics_until(node: NodeProcess, timeout_s: float) -> dict[str, float]:
    """Scrape until an answer comes (a busy node may take a moment), or ``{}``."""
    deadline = time.monotonic() + timeout_s
    while True:
        values = node.metrics()
        if values or time.monotonic() >= deadline:
            return values
        time.sleep(0.2)


def stop_all(nodes: Sequence[NodeProcess]) -> None:
    """Stop every node still running (SIGTERM together, then wait; SIGKILL on overrun)."""
    for node in nodes:
        node.signal(signal.SIGCONT)
        node.signal(signal.SIGTERM)
    for node in nodes:
        node.stop()
