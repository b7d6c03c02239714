"""Per-phase spans of the ext_proc, children of the span Envoy opens for the ext_proc stream (its W3C
``traceparent`` arrives in the stream's gRPC metadata), exported in batches by the OpenTelemetry SDK over
OTLP/gRPC.  Off unless GATEWAY_OTLP_ENDPOINT is set: then ``NULL`` stands in and costs nothing.  Attributes
are metadata only (request id, phase, status); never a body or a header value."""
from __future__ import annotations

from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import SpanKind, get_current_span
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

_W3C = TraceContextTextMapPropagator()


class NullTracer:
    enabled = False

    def span(self, parent: str | None, name: str, start_ns: int, end_ns: int, attrs: dict[str, str]) -> None:
        return None


NULL = NullTracer()


class SdkTracer(NullTracer):
    """The OpenTelemetry SDK's tracer: ``span`` hands each span to ``processor``.  The SDK's default
    sampler follows the parent's sampled flag: spans are kept when Envoy keeps its stream span."""
    enabled = True

    def __init__(self, processor: SpanProcessor, service: str = "llm-gateway-extproc") -> None:
        provider = TracerProvider(resource=Resource.create({SERVICE_NAME: service}))
        provider.add_span_processor(processor)
        self.tracer = provider.get_tracer(__name__)

    def span(self, parent: str | None, name: str, start_ns: int, end_ns: int, attrs: dict[str, str]) -> None:
        if not parent:
            return
        ctx = _W3C.extract({"traceparent": parent})
        if not get_current_span(ctx).get_span_context().is_valid:
            return  # a malformed traceparent: no trace to join
        self.tracer.start_span(name, ctx, SpanKind.INTERNAL, attrs, start_time=start_ns).end(end_ns)


def tracer(endpoint: str) -> NullTracer:
    """Spans exported in batches every second by the processor's thread to the collector at ``endpoint``
    (what is still queued when the process exits is flushed by the provider's exit hook); ``NULL``
    when no endpoint is set."""
    if not endpoint:
        return NULL
    return SdkTracer(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint, insecure=True, timeout=5),
                                       schedule_delay_millis=1000))
