"""OpenTelemetry traces through Envoy to an OTLP/gRPC collector (one run by the test): a span per request
and per upstream try, the client's W3C traceparent continued, attributes from metadata only."""
from __future__ import annotations

import socket
import threading
from concurrent import futures
from typing import NamedTuple

import grpc
import httpx
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.trace.v1 import trace_pb2

from conftest import Gateway, running_stack, wait_for

CANARY = "Kanarek-trace-91b2"


class Received(NamedTuple):
    service: str  # the service.name of the resource it came with
    scope: str  # the instrumentation scope that made it
    span: trace_pb2.Span


class Collector(trace_service_pb2_grpc.TraceServiceServicer):
    """An OTLP/gRPC trace collector that keeps what it is sent."""

    def __init__(self) -> None:
        self.requests: list[trace_service_pb2.ExportTraceServiceRequest] = []
        self.lock = threading.Lock()

    def Export(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802 - the RPC's name
        with self.lock:
            self.requests.append(request)
        return trace_service_pb2.ExportTraceServiceResponse()

    def spans(self) -> list[Received]:
        with self.lock:
            return [Received({a.key: a.value.string_value for a in rs.resource.attributes}["service.name"],
                             ss.scope.name, s)
                    for r in self.requests for rs in r.resource_spans for ss in rs.scope_spans for s in ss.spans]


def test_traces_exported_without_content() -> None:
    # The collector starts once the stack is up: starting the stack forks (initdb runs as another user),
    # and a fork while gRPC's server threads run once crashed the child (initdb: SIGSEGV).  Its port is
    # chosen first, so that the stack can be told where to send.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    collector = Collector()
    with running_stack("gw-trace-", otlp_endpoint=f"127.0.0.1:{port}") as gw:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(collector, server)  # type: ignore[no-untyped-call]
        assert server.add_insecure_port(f"127.0.0.1:{port}") == port
        server.start()
        try:
            _check(gw, collector)
        finally:
            server.stop(0).wait()


def _check(gw: Gateway, collector: Collector) -> None:
    _, _, key = gw.new_org()
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    r = httpx.post(gw.v1 + "/chat/completions", headers={
        "Authorization": f"Bearer {key}", "traceparent": f"00-{trace_id}-00f067aa0ba902b7-01"},
        json={"model": "polish-pro", "messages": [{"role": "user", "content": CANARY}], "sim": {"echo": True}})
    assert r.status_code == 200
    rid = r.headers["x-request-id"]
    # the model server received the trace context, continued
    assert trace_id in r.json()["choices"][0]["message"]["content"]
    stream_name = "async envoy.service.ext_proc.v3.ExternalProcessor.Process egress"
    # (no request-headers phase: Envoy skips that message for a POST with a body, envoy/envoy.yaml)
    wanted = {"ingress", stream_name, "router upstream_up-pro egress",
              "ext_proc request_body", "ext_proc response_headers", "ext_proc response_body"}

    def trace() -> list[Received]:
        return [r for r in collector.spans() if r.span.trace_id.hex() == trace_id]

    wait_for(lambda: wanted <= {r.span.name for r in trace()}, timeout=20, interval=0.2,
             describe=lambda: sorted(r.span.name for r in trace()))
    spans = [r.span for r in trace()]
    # the request, the ext_proc stream, the upstream try, and the ext_proc's own phases as children of
    # the span Envoy opened for the ext_proc stream
    assert wanted <= {s.name for s in spans}, sorted(s.name for s in spans)
    assert "ext_proc request_headers" not in {s.name for s in spans}
    stream_span = next(s for s in spans if s.name == stream_name)
    phases = [r for r in trace() if r.span.name.startswith("ext_proc ")]
    assert sorted(r.span.name for r in phases) == sorted(n for n in wanted if n.startswith("ext_proc "))
    for svc, scope, p in phases:
        # made by the OpenTelemetry SDK's tracer of extproc/tracing.py
        assert (svc, scope) == ("llm-gateway-extproc", "extproc.tracing")
        assert p.parent_span_id == stream_span.span_id and p.span_id not in (b"", stream_span.span_id)
        assert p.kind == trace_pb2.Span.SPAN_KIND_INTERNAL
        # the phase's own start and end, inside the stream's
        assert stream_span.start_time_unix_nano <= p.start_time_unix_nano <= p.end_time_unix_nano \
            <= stream_span.end_time_unix_nano
        assert {a.key: a.value.string_value for a in p.attributes} == {
            "gateway.request_id": rid, "gateway.phase": p.name.removeprefix("ext_proc "),
            "gateway.status": "continue"}
    assert {r.service for r in trace() if r.span.name == stream_name} == {"llm-gateway"}
    attrs = {a.key: a.value.string_value for s in spans for a in s.attributes}
    assert attrs.get("guid:x-request-id") == rid
    assert attrs.get("gateway.upstream_cluster") == "upstream_up-pro"
    dump = b"".join(req.SerializeToString() for req in collector.requests)
    assert CANARY.encode() not in dump and key.encode() not in dump
