"""extproc/tracing.py: a phase span joins the trace of the traceparent Envoy sends, with the phase's own
times and metadata attributes, through the OpenTelemetry SDK (its in-memory exporter stands in for the
collector; tests/test_tracing_e2e.py runs the whole path to a real OTLP/gRPC collector)."""
from __future__ import annotations

import pytest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from extproc import tracing

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"
ATTRS = {"gateway.request_id": "req-1", "gateway.phase": "request_body", "gateway.status": "402"}


def spans(parent: str | None) -> InMemorySpanExporter:
    out = InMemorySpanExporter()
    tracing.SdkTracer(SimpleSpanProcessor(out)).span(parent, "ext_proc request_body", 1_000, 5_000, ATTRS)
    return out


def test_a_phase_span_is_a_child_of_envoys_stream_span() -> None:
    [s] = spans(f"00-{TRACE}-{PARENT}-01").get_finished_spans()
    assert s.name == "ext_proc request_body" and s.kind == SpanKind.INTERNAL
    assert s.parent is not None and s.parent.is_remote
    assert (f"{s.parent.trace_id:032x}", f"{s.parent.span_id:016x}") == (TRACE, PARENT)
    assert f"{s.context.trace_id:032x}" == TRACE and f"{s.context.span_id:016x}" != PARENT
    assert (s.start_time, s.end_time) == (1_000, 5_000)
    assert dict(s.attributes or {}) == ATTRS
    assert s.resource.attributes["service.name"] == "llm-gateway-extproc"


@pytest.mark.parametrize("parent", [
    None, "", "garbage", f"00-{TRACE}-{PARENT}", f"00-{TRACE[:-1]}-{PARENT}-01", f"00-{'0' * 32}-{PARENT}-01",
    f"00-{TRACE}-{'0' * 16}-01", f"ff-{TRACE}-{PARENT}-01", f"00-{TRACE}-{PARENT}-0g"])
def test_no_span_without_a_valid_traceparent(parent: str | None) -> None:
    assert spans(parent).get_finished_spans() == ()


def test_no_span_when_envoy_does_not_sample_the_stream() -> None:
    assert spans(f"00-{TRACE}-{PARENT}-00").get_finished_spans() == ()


def test_tracing_is_on_only_with_an_endpoint() -> None:
    assert tracing.tracer("") is tracing.NULL and not tracing.NULL.enabled
    on = tracing.tracer("127.0.0.1:4317")
    assert isinstance(on, tracing.SdkTracer) and on.enabled
