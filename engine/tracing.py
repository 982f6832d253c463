"""OpenTelemetry tracing of the execution path (docs/tracing.md).

Only ``opentelemetry-api`` is imported here: it is a dependency of the engine, and with it
alone every call is a no-op. The SDK and the OTLP exporter (``carillon[tracing]``) are
imported by :func:`from_environment`, and only when the standard ``OTEL_*`` variables ask
for traces (:func:`wanted`).

A node with tracing on holds one :class:`Tracing` (``NodeContext.tracing``; ``None`` when
off, and every actor looks at that ``None`` once per batch or attempt, nothing more):

* the planner's batch write is a ``carillon.plan`` span, the dispatcher's claim a
  ``carillon.claim`` span (both batch operations, never anyone's parent);
* each attempt is a ``carillon.attempt`` span, *linked* to the claim that produced it
  (the claim's span context rides on the :class:`~engine.actors.attempts.Attempt`) and to
  the planning batch that wrote its execution, when this node planned it
  (:meth:`Tracing.planned` keeps those span contexts, bounded, until the attempt takes its
  own);
* while a handler runs, its attempt span is the current span of the worker's trio task
  (contextvars: each trio task has its own context, so it reaches nobody else) and of the
  thread a python handler runs in; :func:`trace_headers` gives the W3C ``traceparent`` and
  ``tracestate`` of it, which the webhook handler sends and a broker handler puts on its
  messages.
"""

from __future__ import annotations

import logging
import os
from collections import OrderedDict
from collections.abc import Collection, Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime
from typing import TYPE_CHECKING, Final

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Link, Span, SpanContext, SpanKind, Status, StatusCode, Tracer

from engine.errors import ConfigError

if TYPE_CHECKING:
    from engine.actors.attempts import Attempt
    from engine.ledger.params import Completion

log = logging.getLogger("carillon.tracing")

INSTRUMENTATION_NAME: Final = "carillon"
PLAN_LINKS_MAX: Final = 200_000
"""Planning span contexts kept for attempts to come (one per planned execution, until its
first attempt takes it); beyond, the oldest go first (executions another node runs)."""
SERVICE_NAME_DEFAULT: Final = "carillon"

# Attribute names (docs/tracing.md, "What is traced").
EXECUTION_ID: Final = "carillon.execution.id"
SCHEDULE_ID: Final = "carillon.schedule.id"
TENANT_ID: Final = "carillon.tenant.id"
TASK_TYPE: Final = "carillon.task_type"
ATTEMPT: Final = "carillon.attempt"
PLANNED_AT: Final = "carillon.planned_at"
START_DELAY_S: Final = "carillon.start_delay_s"
PARTITION: Final = "carillon.partition"
OUTCOME: Final = "carillon.outcome"
OUTCOME_KIND: Final = "carillon.outcome.kind"
ERROR_CODE: Final = "carillon.error_code"
ABANDONED: Final = "carillon.abandoned"
EXECUTIONS: Final = "carillon.executions"
CLAIMED: Final = "carillon.claimed"
PARTITIONS: Final = "carillon.partitions"


class Tracing:
    """The tracing of one node: its tracer and the planning spans its attempts link to."""

    def __init__(self, tracer: Tracer, *, plan_links_max: int = PLAN_LINKS_MAX) -> None:
        global _traced
        _traced = True
        self.tracer = tracer
        self._plan_links: OrderedDict[tuple[str, datetime], SpanContext] = OrderedDict()
        """Oldest first: evicting one is O(1) (a dict's front, deleted from, is not)."""
        self._plan_links_max = plan_links_max

    @contextmanager
    def _batch(self, name: str, attributes: dict[str, int]) -> Iterator[Span]:
        """An internal span over one batch operation, ended exactly once on the way out, with
        an error status when the batch raised."""
        span = self.tracer.start_span(name, kind=SpanKind.INTERNAL, attributes=attributes)
        try:
            yield span
        except BaseException as error:
            span.set_status(Status(StatusCode.ERROR, type(error).__name__))
            raise
        finally:
            span.end()

    # -- the planner ---------------------------------------------------------------------

    @contextmanager
    def planning(self, partition_id: int, executions: int) -> Iterator[Span]:
        """The span of one planning batch write (ended on the way out, exactly once)."""
        with self._batch(
            "carillon.plan", {PARTITION: partition_id, EXECUTIONS: executions}
        ) as span:
            yield span

    def planned(self, span: Span, fires: Collection[tuple[str, datetime]]) -> None:
        """``span``'s batch wrote these (schedule id, planned-at) fires as queued: their
        first attempts on this node link to it."""
        span_context = span.get_span_context()
        if not span_context.is_valid:
            return
        links = self._plan_links
        for fire in fires:
            links[fire] = span_context
        for _ in range(len(links) - self._plan_links_max):
            links.popitem(last=False)  # the oldest: fires that ran elsewhere, or never

    # -- the dispatcher's claim ------------------------------------------------------------

    @contextmanager
    def claiming(self, partitions: int, executions: int) -> Iterator[Span]:
        """The span of one claim batch (ended on the way out, exactly once)."""
        with self._batch(
            "carillon.claim", {PARTITIONS: partitions, EXECUTIONS: executions}
        ) as span:
            yield span

    # -- the attempt -------------------------------------------------------------------------

    def start_attempt(self, attempt: Attempt, start_delay_s: float, *, client: bool) -> Span:
        """The span of ``attempt``'s run, started now (the caller ends it with
        :meth:`end_attempt`, in a ``finally``); ``client``: its handler calls out (a webhook,
        a broker), so the span is the client side of the receiver's trace."""
        execution = attempt.item
        links: list[Link] = []
        if attempt.claim_span is not None:
            links.append(Link(attempt.claim_span))
        planned = self._plan_links.pop((execution.schedule_id, execution.planned_at), None)
        if planned is not None:
            links.append(Link(planned))
        return self.tracer.start_span(
            "carillon.attempt",
            kind=SpanKind.CLIENT if client else SpanKind.INTERNAL,
            links=links,
            attributes={
                EXECUTION_ID: execution.execution_id,
                SCHEDULE_ID: execution.schedule_id,
                TENANT_ID: execution.tenant_id,
                TASK_TYPE: execution.task_type,
                ATTEMPT: attempt.number,
                PLANNED_AT: execution.planned_at.isoformat(),
                START_DELAY_S: start_delay_s,
                PARTITION: execution.partition_id,
            },
        )

    @staticmethod
    def end_attempt(span: Span, completion: Completion | None, kind: str | None) -> None:
        """End ``span`` with the attempt's fate: its handler result's classification
        ``kind`` (``succeeded``, ``transient``, ``permanent`` or ``unknown``: the status is
        OK for ``succeeded``, an error otherwise) and ``completion`` (the outcome it was
        written with; ``None``: abandoned or cancelled, nothing written, status unset)."""
        attributes: dict[str, str | bool] = {}
        if completion is None:
            attributes[ABANDONED] = True
        else:
            attributes[OUTCOME] = str(completion.outcome)
            if completion.error_code is not None:
                attributes[ERROR_CODE] = completion.error_code
        if kind is not None:
            attributes[OUTCOME_KIND] = kind
        span.set_attributes(attributes)
        if kind is not None:
            if kind == "succeeded":
                span.set_status(Status(StatusCode.OK))
            else:
                error_code = None if completion is None else completion.error_code
                span.set_status(Status(StatusCode.ERROR, error_code or kind))
        span.end()

    @staticmethod
    def attach(span: Span) -> object:
        """Make ``span`` the current span of this trio task (and of the threads it starts);
        give the token back to :meth:`detach` in a ``finally``."""
        return otel_context.attach(trace.set_span_in_context(span))

    @staticmethod
    def detach(token: object) -> None:
        otel_context.detach(token)  # type: ignore[arg-type]

    @staticmethod
    def exemplar(span: Span) -> dict[str, str] | None:
        """The exemplar labels of ``span`` for a histogram observation (``None``: not
        sampled, so no trace to point at)."""
        span_context = span.get_span_context()
        if not span_context.trace_flags.sampled:
            return None
        return {
            "trace_id": format(span_context.trace_id, "032x"),
            "span_id": format(span_context.span_id, "016x"),
        }


def trace_headers() -> dict[str, str]:
    """The W3C trace-context headers of the attempt running in this task or thread:
    ``traceparent``, and ``tracestate`` when it has one; empty when tracing is off (or no
    attempt span is current). What the webhook handler sends, and what a broker handler
    puts on its message (as headers or properties of those names)."""
    if not _traced:
        return {}  # no node of this process traces: nothing to read (a webhook's fast path)
    span_context = trace.get_current_span().get_span_context()
    if not span_context.is_valid:
        return {}
    headers = {
        "traceparent": (
            f"00-{span_context.trace_id:032x}-{span_context.span_id:016x}-"
            f"{int(span_context.trace_flags):02x}"
        )
    }
    state = span_context.trace_state.to_header()
    if state:
        headers["tracestate"] = state
    return headers


# -- turning it on ---------------------------------------------------------------------------

_traced = False
"""A :class:`Tracing` was made in this process: :func:`trace_headers` has spans to look for."""
_EXPORTERS: Final = ("otlp", "console", "none")
_provider_installed = False


def wanted(environ: Mapping[str, str]) -> bool:
    """Whether the standard variables ask for traces: ``OTEL_TRACES_EXPORTER`` names an
    exporter other than ``none``, or an OTLP endpoint is set (``OTEL_EXPORTER_OTLP_ENDPOINT``
    or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) and ``OTEL_TRACES_EXPORTER`` is not ``none``;
    never when ``OTEL_SDK_DISABLED`` is ``true``."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporters = _exporter_names(environ)
    if exporters:
        return exporters != ["none"]
    return bool(
        environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
        or environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
    )


def from_environment(environ: Mapping[str, str] | None = None) -> Tracing | None:
    """A node's :class:`Tracing`, or ``None`` when the ``OTEL_*`` variables of ``environ``
    (the process's by default) do not ask for traces (:func:`wanted`). The first call that
    wants them installs the process's tracer provider (the SDK's, with a batching processor
    per exporter named, every ``OTEL_*`` setting read by the SDK itself); later calls share
    it. A tracer provider installed before (by an embedding application) is used as it is."""
    environ = os.environ if environ is None else environ
    if not wanted(environ):
        return None
    _install_provider(environ)
    return Tracing(trace.get_tracer(INSTRUMENTATION_NAME))


def _exporter_names(environ: Mapping[str, str]) -> list[str]:
    raw = environ.get("OTEL_TRACES_EXPORTER", "")
    return [name.strip().lower() for name in raw.split(",") if name.strip()]


def _install_provider(environ: Mapping[str, str]) -> None:
    global _provider_installed
    if _provider_installed:
        return
    if not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        _provider_installed = True  # someone configured OpenTelemetry already: theirs
        return
    names = _exporter_names(environ) or ["otlp"]
    unknown = [name for name in names if name not in _EXPORTERS]
    if unknown:
        raise ConfigError(
            f"OTEL_TRACES_EXPORTER: {', '.join(unknown)} not supported "
            f"(Carillon knows {', '.join(_EXPORTERS)})"
        )
    protocol = environ.get(
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "")
    ).strip()
    if "otlp" in names and protocol not in ("", "http/protobuf"):
        raise ConfigError(
            f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol}: Carillon exports OTLP over HTTP "
            "(http/protobuf) only"
        )
    try:
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import (
            BatchSpanProcessor,
            ConsoleSpanExporter,
            SpanExporter,
        )

        exporters: list[SpanExporter] = []
        if "otlp" in names:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            exporters.append(OTLPSpanExporter())
    except ImportError as error:
        raise ConfigError(
            "the OTEL_* variables ask for traces, but the OpenTelemetry SDK or its OTLP "
            f"exporter is not installed ({error.name}): pip install 'carillon[tracing]'"
        ) from error
    if "console" in names:
        exporters.append(ConsoleSpanExporter())
    named = environ.get("OTEL_SERVICE_NAME") or "service.name=" in environ.get(
        "OTEL_RESOURCE_ATTRIBUTES", ""
    )
    defaults = {} if named else {SERVICE_NAME: SERVICE_NAME_DEFAULT}
    provider = TracerProvider(resource=Resource.create(defaults))
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    _provider_installed = True
    log.info("tracing on: exporting spans to %s", ", ".join(names))
