"""The webhook sink of a chaos run: a separate process that records every delivery.

Run as ``python -m simulations.chaos.sink --out FILE [--port N]``. It prints one JSON line
``{"port": N}`` on stdout once it listens on ``127.0.0.1``, then answers every ``POST`` with
``200`` and appends one tab-separated record per delivery to ``FILE``::

    arrival_unix_s  idempotency_key  attempt  fencing_token  planned_at  signed_at_unix_s

``arrival_unix_s`` is taken when the request head has been read, by this machine's clock
(the nodes run on the same machine, so planned instants and arrivals share one clock). The
``signed_at_unix_s`` is the Standard Webhooks ``webhook-timestamp`` (whole seconds, the
sending node's clock when it built the request), empty when the task type has no secret. The
sink is deliberately naive: it keeps every delivery, duplicates included. The checker then
reads the file twice -- as an *idempotent* receiver (one effect per ``Idempotency-Key``) and
as a *counting* one (raw deliveries) -- so a run reports both the effectively-once result
and the at-least-once delivery count.

``GET /summary`` answers ``{"deliveries": n, "keys": k}`` (progress while the run goes on).
``POST /_latency?ms=N`` makes every later delivery wait ``N`` ms before its answer (the
arrival is still recorded when the head is read): a receiver that turns slow and recovers.
Records are flushed every 0.1 s and on SIGTERM/SIGINT, after which the process exits 0.

:class:`SinkProcess` starts it from a run script (the chaos run, the multi-region game day)
and reads its file back.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Final, TextIO

HEAD_BYTES_MAX: Final = 16 * 1024
BODY_BYTES_MAX: Final = 1024 * 1024
FLUSH_INTERVAL_S: Final = 0.1
REPO_ROOT: Final = Path(__file__).resolve().parents[2]
STOP_TIMEOUT_S: Final = 10.0


class Recorder:
    """Appends delivery records to a file and counts them."""

    def __init__(self, out: TextIO) -> None:
        self._out = out
        self.deliveries = 0
        self.keys: set[str] = set()
        self.latency_s = 0.0
        """How long each delivery waits for its answer (``POST /_latency?ms=N``)."""

    def record(self, arrival_s: float, headers: dict[str, str]) -> None:
        key = headers.get("idempotency-key", "")
        fields = (
            f"{arrival_s:.6f}",
            key,
            headers.get("x-carillon-attempt", ""),
            headers.get("x-carillon-fencing-token", ""),
            headers.get("x-carillon-planned-at", ""),
            headers.get("webhook-timestamp", ""),
        )
        self._out.write("\t".join(fields) + "\n")
        self.deliveries += 1
        self.keys.add(key)

    def summary(self) -> bytes:
        return json.dumps({"deliveries": self.deliveries, "keys": len(self.keys)}).encode()

    def flush(self) -> None:
        self._out.flush()


def _parse_head(head: bytes) -> tuple[str, str, dict[str, str]]:
    lines = head.decode("latin-1").split("\r\n")
    method, target, _version = lines[0].split(" ", 2)
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    return method, target, headers


async def _respond(writer: asyncio.StreamWriter, status: str, body: bytes, close: bool) -> None:
    lines = [f"HTTP/1.1 {status}", "Content-Type: application/json", f"Content-Length: {len(body)}"]
    if close:
        lines.append("Connection: close")
    writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
    await writer.drain()


async def _serve_connection(
    recorder: Recorder, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    try:
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, asyncio.LimitOverrunError):
                return
            arrival_s = time.time()
            method, target, headers = _parse_head(head[:-4])
            length = int(headers.get("content-length", "0") or 0)
            if length > BODY_BYTES_MAX:
                await _respond(writer, "413 Payload Too Large", b"", close=True)
                return
            if length:
                await reader.readexactly(length)
            close = headers.get("connection", "").lower() == "close"
            if method == "POST" and target.startswith("/_latency?ms="):
                recorder.latency_s = max(float(target.partition("=")[2]), 0.0) / 1000
                await _respond(writer, "200 OK", b"{}", close)
            elif method == "POST":
                recorder.record(arrival_s, headers)
                if recorder.latency_s:
                    await asyncio.sleep(recorder.latency_s)
                await _respond(writer, "200 OK", b"{}", close)
            elif method == "GET" and target == "/summary":
                await _respond(writer, "200 OK", recorder.summary(), close)
            else:
                await _respond(writer, "405 Method Not Allowed", b"", close=True)
                return
            if close:
                return
    except (ConnectionError, asyncio.IncompleteReadError):
        return
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


async def serve(out_path: Path, port: int) -> None:
    with out_path.open("a", buffering=1024 * 1024) as out:
        recorder = Recorder(out)
        server = await asyncio.start_server(
            lambda r, w: _serve_connection(recorder, r, w),
            "127.0.0.1",
            port,
            limit=HEAD_BYTES_MAX,
            backlog=4096,
        )
        bound = server.sockets[0].getsockname()[1]
        print(json.dumps({"port": bound}), flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        async with server:
            while not stop.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), FLUSH_INTERVAL_S)
                recorder.flush()
        recorder.flush()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m simulations.chaos.sink")
    parser.add_argument("--out", type=Path, required=True, help="file the deliveries go to")
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (0: any)")
    args = parser.parse_args(argv)
    asyncio.run(serve(args.out, args.port))
    return 0


def read_deliveries(path: Path) -> list[tuple[float, str, int, int, float | None]]:
    """The records of a sink file: ``(arrival_s, key, attempt, fencing_token, signed_at_s)``."""
    rows = []
    for line in path.read_text().splitlines():
        parts = line.split("\t")
        if len(parts) != 6:
            continue
        arrival, key, attempt, token, _planned, signed = parts
        signed_at = float(signed) if signed else None
        rows.append((float(arrival), key, int(attempt or 0), int(token or 0), signed_at))
    return rows


class SinkProcess:
    """The sink as a child process writing to ``workdir/deliveries.tsv``; :attr:`url` is the
    webhook URL to give a task type."""

    def __init__(self, workdir: Path) -> None:
        self.path = workdir / "deliveries.tsv"
        self.process = subprocess.Popen(
            [sys.executable, "-m", "simulations.chaos.sink", "--out", str(self.path)],
            stdout=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            cwd=REPO_ROOT,
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        try:
            self.url = f"http://127.0.0.1:{json.loads(line)['port']}/hook"
        except (ValueError, KeyError):
            self.stop()
            raise RuntimeError(f"the webhook sink did not start: {line!r}") from None

    def keys(self) -> set[str]:
        """The ``Idempotency-Key`` of every delivery recorded so far."""
        with contextlib.suppress(FileNotFoundError), self.path.open() as records:
            return {line.split("\t", 2)[1] for line in records if line.count("\t") >= 5}
        return set()

    def set_latency(self, ms: float) -> None:
        """Every later delivery waits ``ms`` before its answer."""
        base = self.url.rsplit("/", 1)[0]
        with urllib.request.urlopen(
            urllib.request.Request(f"{base}/_latency?ms={ms:g}", data=b"", method="POST"),
            timeout=5,
        ) as answer:
            answer.read()

    def stop(self) -> None:
        """SIGTERM (the sink flushes its file and exits), SIGKILL after a timeout."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


if __name__ == "__main__":
    sys.exit(main())
