"""What tracing costs: the noop burst with tracing off and on, and the attempt's hooks alone.

The burst (``benchmarks/_burst.py``: N ``noop`` schedules over 20 tenants due at one instant
T, a fresh database per run, one node in-process with default settings, PostgreSQL on the
same machine) runs with tracing **off** (``tracing=None``: what a node without ``OTEL_*``
variables runs) and **on**, alternating, ``--runs`` times each. On: the SDK's tracer
provider with a ``BatchSpanProcessor`` (queue 100,000, batches of 2,048, every second)
exporting with the OTLP/HTTP exporter to a **collector stand-in**: a tiny OTLP/HTTP receiver
in a subprocess (``python benchmarks/bench_tracing.py --collector``) that decodes each
``ExportTraceServiceRequest`` and counts its spans, as a collector's receiver would, and
answers 200. Its CPU is the collector's, not the node's: the node's CPU per execution is
this process's (the exporter's thread included), sampled from T until all had succeeded.

Reported: executions/s end to end, the node's and PostgreSQL's CPU per execution, each
variant's median, the overhead per execution on / off as a ratio (CPU and wall time), and
the spans the stand-in received against the attempts run (a short count means the batching
processor's queue dropped spans). Then the attempt's hooks alone, timed in a loop
(``timeit``): start the attempt span with its two links, its exemplar, attach and detach it
as the current span, end it with its status -- what a worker adds per attempt with tracing
on; with it off the worker checks ``None`` three times and the claim stores ``None`` once.

A full run writes its section of docs/benchmarks.md; ``--quick`` (2,000 schedules, one run
each) writes nothing.

Usage: python benchmarks/bench_tracing.py [--quick] [--no-docs] [--schedules N] [--runs K]
       [--timeout S]
"""

from __future__ import annotations

import argparse
import os
import random
import socket
import subprocess
import sys
import threading
import time
import timeit
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Final

import trio
import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._burst import (
    admin,
    create_schedules,
    fresh_database,
    ledger_figures,
    poll_until_succeeded,
)
from benchmarks._cpu import CpuSample, cpu_figures
from benchmarks._report import machine, revision, summary, write_section
from engine.clock import SystemClock
from engine.config import WORKERS_DEFAULT, LogLevel, NodeConfig
from engine.ledger.database import resolve_database
from engine.ledger.postgres import open_postgres_ledger
from engine.node import Node
from engine.tracing import Tracing

QUEUE_MAX: Final = 100_000
BATCH_MAX: Final = 2_048
DELAY_MS: Final = 1_000
HOOK_LOOPS: Final = 20_000


# --- the collector stand-in --------------------------------------------------------------------


def collector(port_file: Path) -> None:
    """Serve OTLP/HTTP on 127.0.0.1 (an ephemeral port, written to ``port_file``): POST
    /v1/traces counts the spans of each request; GET /count answers the total."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
        ExportTraceServiceResponse,
    )

    lock = threading.Lock()
    received = [0]
    answer = ExportTraceServiceResponse().SerializeToString()

    class Receiver(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length", "0")))
            request = ExportTraceServiceRequest.FromString(body)
            spans = sum(
                len(scope.spans)
                for resource in request.resource_spans
                for scope in resource.scope_spans
            )
            with lock:
                received[0] += spans
            self._send(answer, "application/x-protobuf")

        def do_GET(self) -> None:
            with lock:
                total = received[0]
            self._send(str(total).encode(), "text/plain")

        def _send(self, body: bytes, content_type: str) -> None:
            self.send_response(200)
            self.send_header("content-type", content_type)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    port_file.write_text(str(server.server_address[1]))
    server.serve_forever()


class Collector:
    """The stand-in, in a subprocess."""

    def __init__(self, directory: Path) -> None:
        port_file = directory / f"collector-{os.getpid()}.port"
        port_file.unlink(missing_ok=True)
        self.process = subprocess.Popen([sys.executable, __file__, "--collector", str(port_file)])
        deadline = time.monotonic() + 30
        while not port_file.exists() or not port_file.read_text():
            if time.monotonic() > deadline or self.process.poll() is not None:
                raise RuntimeError("the collector stand-in did not start")
            time.sleep(0.05)
        self.port = int(port_file.read_text())

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1/traces"

    def count(self) -> int:
        with socket.create_connection(("127.0.0.1", self.port), timeout=10) as connection:
            connection.sendall(b"GET /count HTTP/1.0\r\n\r\n")
            data = b""
            while chunk := connection.recv(4096):
                data += chunk
        return int(data.split(b"\r\n\r\n", 1)[1])

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()


def sdk_tracing(endpoint: str) -> tuple[Tracing, Any]:
    """A node's tracing exporting to ``endpoint`` in batches, and its provider."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(
        resource=Resource.create({"service.name": "carillon-bench"}), shutdown_on_exit=False
    )
    provider.add_span_processor(
        BatchSpanProcessor(
            OTLPSpanExporter(endpoint=endpoint),
            max_queue_size=QUEUE_MAX,
            max_export_batch_size=BATCH_MAX,
            schedule_delay_millis=DELAY_MS,
        )
    )
    return Tracing(provider.get_tracer("carillon")), provider


# --- the burst ---------------------------------------------------------------------------------


async def engine_phase(
    url: str, n: int, burst_at: datetime, tracing: Tracing | None, timeout_s: float
) -> dict[str, Any]:
    config = NodeConfig(
        node_id=f"bench-tracing-{os.getpid()}",
        log_level=LogLevel.WARNING,
        workers=WORKERS_DEFAULT,
        http="",
    )
    async with open_postgres_ledger(url) as ledger:
        node = Node(config, ledger, SystemClock(), random.Random(7), tracing=tracing)
        async with trio.open_nursery() as nursery:
            await nursery.start(node.run)
            await trio.sleep(max((burst_at - datetime.now(UTC)).total_seconds(), 0.0))
            before = CpuSample.now()
            polled = await trio.to_thread.run_sync(
                poll_until_succeeded, url, n, burst_at, timeout_s
            )
            after = CpuSample.now()
            nursery.cancel_scope.cancel()
    return polled | cpu_figures(before, after, n)


def one_run(
    server_url: str, n: int, collector: Collector | None, timeout_s: float
) -> dict[str, Any]:
    name, url = fresh_database(server_url, "carillon_tracing_")
    provider = None
    try:
        tracing = None
        if collector is not None:
            tracing, provider = sdk_tracing(collector.endpoint)
            already = collector.count()
        burst_at = trio.run(create_schedules, url, n)
        result = trio.run(engine_phase, url, n, burst_at, tracing, timeout_s)
        result |= uvloop.run(ledger_figures(url, n, burst_at, timeout_s))
        if collector is not None and provider is not None:
            provider.force_flush(30_000)
            result["spans"] = collector.count() - already
    finally:
        if provider is not None:
            provider.shutdown()
        admin(server_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    label = "on " if collector is not None else "off"
    print(
        f"  tracing {label}: {result['executions_per_s']:,.0f} executions/s, "
        f"node {result.get('node_cpu_us', float('nan')):.1f} us/execution"
        + (f", {result['spans']:,} spans received" if "spans" in result else ""),
        file=sys.stderr,
    )
    return result


# --- the hooks alone ----------------------------------------------------------------------------


def hook_cost_us() -> float:
    """Microseconds per attempt of the worker's tracing hooks on the SDK (batching processor,
    an exporter that drops everything: the export is not the hook's cost)."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
    from opentelemetry.trace import SpanContext, TraceFlags

    from engine.actors.attempts import Attempt
    from engine.ledger.params import Completion, Outcome
    from engine.model import Execution

    class Dropping(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(BatchSpanProcessor(Dropping(), max_queue_size=QUEUE_MAX))
    tracing = Tracing(provider.get_tracer("carillon"))
    execution = Execution(
        execution_id="s:1",
        schedule_id="s",
        tenant_id="t",
        task_type="noop",
        planned_at=datetime(2026, 1, 1, tzinfo=UTC),
        attempt=1,
        partition_id=0,
    )
    attempt = Attempt(execution)
    sampled = TraceFlags(TraceFlags.SAMPLED)
    attempt.claim_span = SpanContext(1, 2, is_remote=False, trace_flags=sampled)
    completion = Completion("s:1", 1, Outcome.SUCCEEDED, None, None, None)
    plan = SpanContext(3, 4, is_remote=False, trace_flags=sampled)

    def hooks() -> None:
        tracing._plan_links[("s", execution.planned_at)] = plan  # what the planner left
        span = tracing.start_attempt(attempt, 0.01, client=False)
        Tracing.exemplar(span)
        token = Tracing.attach(span)
        Tracing.detach(token)
        Tracing.end_attempt(span, completion, "succeeded")

    hooks()
    seconds = min(timeit.repeat(hooks, number=HOOK_LOOPS, repeat=3))
    provider.shutdown()
    return seconds / HOOK_LOOPS * 1e6


# --- the report -------------------------------------------------------------------------------


def _median(runs: list[dict[str, Any]], key: str) -> float:
    values = [r[key] for r in runs if key in r]
    return summary(values)[0] if values else float("nan")


def _cell(runs: list[dict[str, Any]], key: str, digits: int) -> str:
    values = [r[key] for r in runs if key in r]
    if not values:
        return "-"
    median, low, high = summary(values)
    if len(values) == 1:
        return f"{median:,.{digits}f}"
    return f"{median:,.{digits}f} ({low:,.{digits}f}-{high:,.{digits}f})"


def report(
    args: argparse.Namespace, off: list[dict[str, Any]], on: list[dict[str, Any]], hook_us: float
) -> str:
    def ratio(key: str) -> float:
        return _median(on, key) / _median(off, key)

    rows = [
        ("executions/s end to end", "executions_per_s", 0),
        ("T until all succeeded, s", "all_succeeded_s", 2),
        ("node CPU per execution, us", "node_cpu_us", 1),
        ("PostgreSQL CPU per execution, us", "postgres_cpu_us", 1),
        ("start delay p99, s", "delay_p99_s", 2),
    ]
    lines = [
        "## Tracing overhead (`benchmarks/bench_tracing.py`)",
        "",
        f"Machine: {machine()}; revision {revision()}; {args.runs} runs of each, alternating; "
        f"{args.schedules:,} `noop` schedules over 20 tenants due at one instant T, a fresh "
        "database per run, one node in-process with default settings, PostgreSQL on the same "
        "machine. Tracing on: the SDK's batching span processor (queue "
        f"{QUEUE_MAX:,}, batches of {BATCH_MAX:,}, every {DELAY_MS / 1000:g} s) and the "
        "OTLP/HTTP exporter, sending to a collector stand-in on 127.0.0.1 (a subprocess "
        "that decodes each export request and counts its spans). Median (min-max) over the runs.",
        "",
        "| | tracing off | tracing on |",
        "| --- | --- | --- |",
        *(f"| {label} | {_cell(off, key, d)} | {_cell(on, key, d)} |" for label, key, d in rows),
        f"| spans received by the stand-in | - | {_cell(on, 'spans', 0)} |",
        "",
        f"**Overhead per execution, on / off:** node CPU x{ratio('node_cpu_us'):.2f}, "
        f"wall time to all succeeded x{ratio('all_succeeded_s'):.2f}, end-to-end rate "
        f"x{ratio('executions_per_s'):.2f}. Each attempt makes one span; each claim and "
        "each planning batch one more, so a burst of N exports a little over N spans "
        "(fewer received means the processor's queue dropped some: raise "
        "`OTEL_BSP_MAX_QUEUE_SIZE`).",
        "",
        f"The worker's hooks alone, on the SDK (timeit, {HOOK_LOOPS:,} loops, best of 3, an "
        f"exporter that drops everything): **{hook_us:.1f} us per attempt** to start the "
        "attempt span with its two links, take its exemplar, attach and detach it as the "
        "current span and end it with its status. With tracing off the worker checks `None` "
        "three times per attempt and the attempt stores one `None`: no allocation, no call.",
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run; docs are not written")
    parser.add_argument("--no-docs", action="store_true", help="print only: no docs")
    parser.add_argument("--schedules", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds after T")
    parser.add_argument("--collector", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.collector is not None:
        collector(args.collector)
        return 0
    if args.quick:
        args.schedules, args.runs, args.timeout = 2_000, 1, 30.0
    off: list[dict[str, Any]] = []
    on: list[dict[str, Any]] = []
    stand_in = Collector(Path(os.environ.get("CARILLON_BENCH_LOGS", "/tmp")))
    try:
        with resolve_database() as database:
            for _ in range(args.runs):
                off.append(one_run(database.url, args.schedules, None, args.timeout))
                on.append(one_run(database.url, args.schedules, stand_in, args.timeout))
    finally:
        stand_in.stop()
    text = report(args, off, on, hook_cost_us())
    print(text)
    clean = all(r["duplicates"] == 0 and r["rows"] == args.schedules for r in off + on)
    if not (args.quick or args.no_docs):
        write_section("bench_tracing", text)
    return 0 if clean else 1


if __name__ == "__main__":
    raise SystemExit(main())
