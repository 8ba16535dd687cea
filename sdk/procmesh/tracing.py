"""OpenTelemetry tracing for procmesh processes: optional, and off unless the standard variables ask.

Install the ``otel`` extra (``pip install 'procmesh-sdk[otel]'``) and set
``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``): spans are exported
over OTLP/HTTP (protobuf) with the exporter's own variables (headers, timeout, ...), the
service named by ``OTEL_SERVICE_NAME`` or the process's default. ``OTEL_SDK_DISABLED=true`` or
``OTEL_TRACES_EXPORTER=none`` turn it off. Without the extra, or without an endpoint, every
function here is a no-op that costs one attribute check.

The W3C trace context travels in gRPC metadata (``traceparent``, ``tracestate``): the
orchestrator injects it into every hook call and stream, the SDKs continue it in a child span
around each hook. No user content goes into span attributes: ids, names, counts, outcomes.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from typing import Any

log = logging.getLogger(__name__)

Carrier = Iterable[tuple[str, Any]] | Mapping[str, Any]
"""Where a trace context arrives: gRPC metadata pairs, or HTTP headers."""

_KINDS = ("internal", "server", "client")
_tracer: Any = None
_provider: Any = None


def _wanted() -> bool:
    env = os.environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if "none" in env.get("OTEL_TRACES_EXPORTER", "otlp").lower().split(","):
        return False
    return bool(env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT"))


def setup(service_name: str) -> bool:
    """Start exporting spans when the environment asks for it (idempotent); whether tracing is on.

    `service_name` is the default ``service.name`` (``OTEL_SERVICE_NAME`` wins).
    """
    global _tracer, _provider
    if _tracer is not None:
        return True
    if not _wanted():
        return False
    protocol = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or os.environ.get(
        "OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"
    )
    if protocol != "http/protobuf":
        log.warning("tracing is off: OTLP protocol %r is not supported (use http/protobuf)", protocol)
        return False
    try:
        from opentelemetry import trace
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        log.warning(
            "tracing is off: OTEL_EXPORTER_OTLP_ENDPOINT is set but OpenTelemetry is not installed "
            "(pip install 'procmesh-sdk[otel]')"
        )
        return False
    name = os.environ.get("OTEL_SERVICE_NAME") or service_name
    provider = TracerProvider(resource=Resource.create({SERVICE_NAME: name}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    _provider = provider
    _tracer = provider.get_tracer("procmesh")
    trace.set_tracer_provider(provider)
    return True


def enabled() -> bool:
    """Whether spans are being recorded."""
    return _tracer is not None


def shutdown() -> None:
    """Export what is buffered and stop (at process exit)."""
    global _tracer, _provider
    if _provider is not None:
        _provider.shutdown()
    _tracer = _provider = None


class Span:
    """A recording span's handle (attributes, the outcome); a no-op when tracing is off."""

    def __init__(self, span: Any = None) -> None:
        self._span = span
        self._counts: dict[str, int] = {}

    def set(self, key: str, value: Any) -> None:
        """Set an attribute (str, bool, int, float, or a list of them)."""
        if self._span is not None and value is not None:
            self._span.set_attribute(key, value)

    def add(self, key: str, value: int) -> None:
        """Add `value` to a counting attribute of a span still open (an ended one keeps its own)."""
        if self._span is None or not self._span.is_recording():
            return
        self._counts[key] = self._counts.get(key, 0) + value
        self._span.set_attribute(key, self._counts[key])

    def outcome(self, value: str) -> None:
        """The ``procmesh.outcome`` attribute (pass, rewrite, abort, retry, failure, ...)."""
        self.set("procmesh.outcome", value)

    def trace_id(self) -> str:
        """The span's trace id in hex, "" when off (log lines carry it)."""
        if self._span is None:
            return ""
        return format(self._span.get_span_context().trace_id, "032x")

    def metadata(self) -> list[tuple[str, str]]:
        """This span's context as gRPC metadata (a call made on its behalf from another task)."""
        if self._span is None:
            return []
        from opentelemetry import propagate, trace

        carrier: dict[str, str] = {}
        propagate.inject(carrier, context=trace.set_span_in_context(self._span))
        return list(carrier.items())

    def end(self, error: BaseException | None = None) -> None:
        """End a span from `start` (marked as an error of `error`'s type when given)."""
        if self._span is None:
            return
        if error is not None:
            from opentelemetry import trace

            self._span.set_status(trace.Status(trace.StatusCode.ERROR, type(error).__name__))
        self._span.end()


def start(
    name: str,
    *,
    kind: str = "internal",
    attributes: Mapping[str, Any] | None = None,
    parent: Carrier | None = None,
) -> Span:
    """A span that is not made current, child of the current one (or of `parent`'s context);
    end it with `Span.end`.

    For work that spans several tasks or an async generator's yields (a model call, a stream
    session), where a current span could not be detached in the context that attached it.
    """
    if _tracer is None:
        return Span()
    from opentelemetry import trace

    assert kind in _KINDS, kind
    attrs = {k: v for k, v in (attributes or {}).items() if v is not None}
    context = extract(parent) if parent is not None else None
    kind_value = getattr(trace.SpanKind, kind.upper())
    return Span(_tracer.start_span(name, context=context, kind=kind_value, attributes=attrs))


class _Off:
    """What `span` gives while tracing is off: one shared no-op (a hook call pays no generator)."""

    _span = Span()

    def __enter__(self) -> Span:
        return self._span

    def __exit__(self, *exc: object) -> None:
        return None


_OFF = _Off()


def span(
    name: str,
    *,
    kind: str = "internal",
    attributes: Mapping[str, Any] | None = None,
    parent: Carrier | None = None,
) -> AbstractContextManager[Span]:
    """A span around the block, current inside it; `parent` continues a remote trace context.

    An exception leaving the block marks the span as an error (its type only, never its message:
    messages may quote user content).
    """
    if _tracer is None:
        return _OFF
    return _recording(name, kind, attributes, parent)


@contextmanager
def _recording(
    name: str, kind: str, attributes: Mapping[str, Any] | None, parent: Carrier | None
) -> Iterator[Span]:
    from opentelemetry import trace

    assert kind in _KINDS, kind
    context = extract(parent) if parent is not None else None
    with _tracer.start_as_current_span(
        name,
        context=context,
        kind=getattr(trace.SpanKind, kind.upper()),
        attributes={k: v for k, v in (attributes or {}).items() if v is not None},
        record_exception=False,
        set_status_on_exception=False,
    ) as current:
        try:
            yield Span(current)
        except BaseException as exc:
            current.set_status(trace.Status(trace.StatusCode.ERROR, type(exc).__name__))
            raise


def metadata() -> list[tuple[str, str]]:
    """The current trace context as gRPC metadata (empty when off or outside a span)."""
    if _tracer is None:
        return []
    from opentelemetry import propagate

    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return list(carrier.items())


def extract(carrier: Carrier) -> Any:
    """The trace context in `carrier` (gRPC metadata pairs or headers), for `span(parent=...)`."""
    from opentelemetry import propagate

    pairs = carrier.items() if isinstance(carrier, Mapping) else carrier
    found: dict[str, str] = {}
    for key, value in pairs:
        key = key.lower()
        if key in ("traceparent", "tracestate", "baggage"):
            found[key] = value.decode("latin-1") if isinstance(value, bytes) else str(value)
    return propagate.extract(found)
