"""Tracing (docs/tracing.md): a span per attempt, linked to its claim and planning batch; the
trace context reaches what the handler calls; exemplars on the start-delay histogram; and
with tracing off, no SDK and no headers."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import msgspec
import pytest
import trio
import trio.testing
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanContext, StatusCode, TraceFlags, TraceState

from engine.errors import TransientError
from engine.handlers import ExecutionContext
from engine.ledger.params import TaskTypesPut
from engine.metrics import NodeMetrics, render
from engine.model import Execution, HandlerKind, TaskType
from engine.tracing import Tracing, trace_headers, wanted
from tests.actors.harness import PARTITIONS, START, TEST_TENANTS, cluster, create, make_schedules

TRACEPARENT = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")
"""W3C Trace Context, version 00: version-traceid-parentid-flags."""

SEEN: dict[tuple[str, int], dict[str, str]] = {}
"""The trace headers each attempt's handler saw, by (execution id, attempt)."""


async def fails_once(context: ExecutionContext) -> None:
    SEEN[(context.execution_id, context.attempt)] = trace_headers()
    if context.attempt == 1:
        raise TransientError("the downstream service is busy", retry_after_s=2)


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    yield exporter
    exporter.clear()


def sdk_tracing(exporter: InMemorySpanExporter) -> Tracing:
    """A node's tracing on the SDK, finished spans kept in ``exporter`` (no global state)."""
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return Tracing(provider.get_tracer("carillon"))


def attributes(span: ReadableSpan) -> dict[str, object]:
    return dict(span.attributes or {})


def span_id(span: ReadableSpan) -> int:
    context = span.get_span_context()
    assert context is not None
    return context.span_id


def traceparent_of(span: ReadableSpan) -> str:
    context = span.get_span_context()
    assert context is not None
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"


async def test_each_attempt_is_a_span_linked_to_its_claim_and_planning_batch(
    autojump_clock: trio.testing.MockClock, exporter: InMemorySpanExporter
) -> None:
    SEEN.clear()
    async with cluster() as c:
        await c.ledger.task_types_put(
            TaskTypesPut(
                TaskType(
                    name="flaky",
                    kind=HandlerKind.PYTHON,
                    allowed_tenants=TEST_TENANTS,
                    settings={"callable": f"{__name__}:fails_once"},
                )
            )
        )
        [schedule] = [
            msgspec.structs.replace(s, task_type="flaky")
            for s in make_schedules(1, START, lambda n: ("0 * * * *", "UTC"))
        ]
        await create(c.ledger, [schedule])
        await c.start_node("n1", tracing=sdk_tracing(exporter))
        await trio.sleep(3600 + 60)
    assert trace.get_current_span() is trace.INVALID_SPAN  # nothing leaked to this task

    by_name: dict[str, list[ReadableSpan]] = {}
    for span in exporter.get_finished_spans():
        by_name.setdefault(span.name, []).append(span)
    first, second = sorted(
        by_name["carillon.attempt"], key=lambda s: attributes(s)["carillon.attempt"]
    )
    claims = {span_id(s) for s in by_name["carillon.claim"]}
    plans = {span_id(s): s for s in by_name["carillon.plan"]}

    execution_id = f"{schedule.schedule_id}:2026-03-02T01:00:00Z"
    planned_at = START.replace(hour=1, minute=0, second=0)
    seen = attributes(first)
    assert 0 <= seen.pop("carillon.start_delay_s") < 1  # type: ignore[operator]
    assert seen.pop("carillon.partition") in range(PARTITIONS)
    assert seen == {
        "carillon.execution.id": execution_id,
        "carillon.schedule.id": schedule.schedule_id,
        "carillon.tenant.id": schedule.tenant_id,
        "carillon.task_type": "flaky",
        "carillon.attempt": 1,
        "carillon.planned_at": planned_at.isoformat(),
        "carillon.outcome": "failed",
        "carillon.outcome.kind": "transient",
        "carillon.error_code": "exception:TransientError",
    }
    assert first.status.status_code is StatusCode.ERROR
    assert attributes(second)["carillon.attempt"] == 2
    assert attributes(second)["carillon.outcome"] == "succeeded"
    assert second.status.status_code is StatusCode.OK

    # Linked, never parented: the claim and the planning batch are batch operations.
    for span in (first, second):
        assert span.parent is None
        linked = [link.context.span_id for link in span.links]
        assert linked[0] in claims
    [_, planned] = first.links  # the first attempt links to the batch that planned it too
    assert attributes(plans[planned.context.span_id])["carillon.executions"] == 1
    assert first.links[0].context.span_id != second.links[0].context.span_id  # two claims
    assert len(second.links) == 1  # a retry links to its own claim only

    # While the handler ran, its attempt span was the current one: what it calls sees it.
    assert SEEN[(execution_id, 1)] == {"traceparent": traceparent_of(first)}
    assert SEEN[(execution_id, 2)] == {"traceparent": traceparent_of(second)}


async def hangs(context: ExecutionContext) -> None:
    SEEN[(context.execution_id, context.attempt)] = trace_headers()
    await trio.sleep_forever()


async def test_an_attempt_cut_short_by_the_node_stopping_still_ends_its_span_once(
    autojump_clock: trio.testing.MockClock,
    exporter: InMemorySpanExporter,
    caplog: pytest.LogCaptureFixture,
) -> None:
    SEEN.clear()
    async with cluster() as c:
        await c.ledger.task_types_put(
            TaskTypesPut(
                TaskType(
                    name="hangs",
                    kind=HandlerKind.PYTHON,
                    timeout_s=600,
                    allowed_tenants=TEST_TENANTS,
                    settings={"callable": f"{__name__}:hangs", "timeout_s": 600},
                )
            )
        )
        schedules = [
            msgspec.structs.replace(s, task_type="hangs")
            for s in make_schedules(1, START, lambda n: ("0 * * * *", "UTC"))
        ]
        await create(c.ledger, schedules)
        await c.start_node("n1", tracing=sdk_tracing(exporter))
        await trio.sleep(3600)  # the fire at 01:00 runs (START is 00:00:30), 30 s of 600
        assert len(SEEN) == 1
        assert not [s for s in exporter.get_finished_spans() if s.name == "carillon.attempt"]
    # The cluster stopped the node: the handler was cancelled, its span ended on the way out.
    [attempt] = [s for s in exporter.get_finished_spans() if s.name == "carillon.attempt"]
    assert attempt.attributes is not None
    assert attempt.attributes["carillon.abandoned"] is True
    assert "carillon.outcome" not in attempt.attributes
    assert attempt.status.status_code is StatusCode.UNSET
    assert "ended span" not in caplog.text  # the SDK warns when a span is ended twice


async def test_the_plan_links_of_fires_run_elsewhere_are_bounded(
    exporter: InMemorySpanExporter,
) -> None:
    tracing = Tracing(sdk_tracing(exporter).tracer, plan_links_max=3)
    with tracing.planning(0, 5) as span:
        tracing.planned(span, [(f"s{n}", START) for n in range(5)])
    assert list(tracing._plan_links) == [("s2", START), ("s3", START), ("s4", START)]


def test_trace_headers_carry_the_current_span_and_its_state() -> None:
    parent = SpanContext(
        trace_id=0x0AF7651916CD43DD8448EB211C80319C,
        span_id=0xB7AD6B7169203331,
        is_remote=False,
        trace_flags=TraceFlags(TraceFlags.SAMPLED),
        trace_state=TraceState([("vendor", "opaque")]),
    )
    assert trace_headers() == {}
    Tracing(TracerProvider().get_tracer("carillon"))  # a node of this process traces
    with trace.use_span(trace.NonRecordingSpan(parent)):
        assert trace_headers() == {
            "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "tracestate": "vendor=opaque",
        }
    assert trace_headers() == {}


@pytest.mark.parametrize(
    ("environ", "on"),
    [
        ({}, False),
        ({"OTEL_SERVICE_NAME": "cron"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, True),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, True),
        ({"OTEL_TRACES_EXPORTER": "console"}, True),
        ({"OTEL_TRACES_EXPORTER": "none"}, False),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, False),
        ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"}, False),
    ],
)
def test_only_the_standard_variables_turn_tracing_on(environ: dict[str, str], on: bool) -> None:
    assert wanted(environ) is on


def test_with_tracing_off_the_sdk_is_never_imported_and_no_header_is_made() -> None:
    script = (
        "import sys\n"
        "from engine.node import Node\n"
        "from engine.handlers.webhook import WebhookHandler\n"
        "from engine.tracing import from_environment, trace_headers\n"
        "assert from_environment({}) is None\n"
        "assert trace_headers() == {}\n"
        "loaded = sorted(m for m in sys.modules if m.startswith('opentelemetry.sdk'))\n"
        "assert not loaded, loaded\n"
    )
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(sys.path)}
    subprocess.run([sys.executable, "-c", script], check=True, env=env, timeout=60)


def test_start_delay_exemplars_point_at_the_attempts_trace_in_openmetrics() -> None:
    metrics = NodeMetrics()
    execution = Execution(
        execution_id="s:1",
        schedule_id="s",
        tenant_id="t",
        task_type="noop",
        planned_at=START,
        attempt=1,
        partition_id=0,
    )
    ids = {"trace_id": "0af7651916cd43dd8448eb211c80319c", "span_id": "b7ad6b7169203331"}
    metrics.execution_started(execution, 0.3, exemplar=ids)
    metrics.execution_started(execution, 0.3)  # a start without a trace keeps the exemplar
    body, content_type = render(metrics.registry, "application/openmetrics-text")
    assert content_type.startswith("application/openmetrics-text")
    lines = [
        line
        for line in body.decode().splitlines()
        if line.startswith("carillon_start_delay_seconds_bucket") and " # " in line
    ]
    assert len(lines) == 1
    assert (
        '# {span_id="b7ad6b7169203331",trace_id="0af7651916cd43dd8448eb211c80319c"} 0.3' in lines[0]
    )
    # The Prometheus text format has no exemplars; and without a trace there is none.
    assert b"trace_id" not in render(metrics.registry)[0]
    plain = NodeMetrics()
    plain.execution_started(execution, 0.3)
    assert b"trace_id" not in render(plain.registry, "application/openmetrics-text")[0]


def test_an_unsampled_attempt_gives_no_exemplar() -> None:
    unsampled = trace.NonRecordingSpan(
        SpanContext(trace_id=1, span_id=2, is_remote=False, trace_flags=TraceFlags(0))
    )
    assert Tracing.exemplar(unsampled) is None


class _OtlpReceiver(BaseHTTPRequestHandler):
    """A collector's OTLP/HTTP trace receiver: decodes each export, keeps its span names."""

    names: ClassVar[list[str]] = []

    def do_POST(self) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
            ExportTraceServiceResponse,
        )

        body = self.rfile.read(int(self.headers["content-length"]))
        request = ExportTraceServiceRequest.FromString(body)
        for resource in request.resource_spans:
            for scope in resource.scope_spans:
                self.names.extend(span.name for span in scope.spans)
        answer = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, format: str, *args: object) -> None:
        pass


def run_with(environ: dict[str, str], script: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(sys.path), **environ}
    return subprocess.run(
        [sys.executable, "-c", script], env=env, timeout=60, capture_output=True, text=True
    )


def test_the_otlp_endpoint_variable_turns_tracing_on_and_spans_reach_the_collector() -> None:
    _OtlpReceiver.names = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _OtlpReceiver)
    serving = threading.Thread(target=server.serve_forever, daemon=True)
    serving.start()
    try:
        script = (
            "from opentelemetry import trace\n"
            "from engine.tracing import from_environment\n"
            "tracing = from_environment()\n"
            "with tracing.claiming(1, 1):\n"
            "    pass\n"
            "trace.get_tracer_provider().shutdown()\n"  # flushes the batching processor
        )
        endpoint = f"http://127.0.0.1:{server.server_address[1]}"
        done = run_with({"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint}, script)
        assert done.returncode == 0, done.stderr
    finally:
        server.shutdown()
        serving.join()
        server.server_close()
    assert _OtlpReceiver.names == ["carillon.claim"]


@pytest.mark.parametrize(
    ("environ", "reason"),
    [
        (
            {"OTEL_TRACES_EXPORTER": "zipkin"},
            "OTEL_TRACES_EXPORTER: zipkin not supported",
        ),
        (
            {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
            "exports OTLP over HTTP (http/protobuf) only",
        ),
    ],
)
def test_settings_it_cannot_honour_stop_the_node_with_one_reason(
    environ: dict[str, str], reason: str
) -> None:
    script = (
        "from engine.errors import ConfigError\n"
        "from engine.tracing import from_environment\n"
        "try:\n"
        "    from_environment()\n"
        "except ConfigError as error:\n"
        "    print(error)\n"
    )
    done = run_with(environ, script)
    assert done.returncode == 0, done.stderr
    assert reason in done.stdout
