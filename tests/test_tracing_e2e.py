"""OpenTelemetry traces through Envoy to an OTLP/gRPC collector (one run by the test): a span per request
and per upstream try, the client's W3C traceparent continued, attributes from metadata only."""
from __future__ import annotations

import socket
import threading
from concurrent import futures

import grpc
import httpx
# The OTLP protos that xds-protos ships (no gRPC stub: the service is registered by hand below).
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

from conftest import Gateway, running_stack, wait_for

CANARY = "Kanarek-trace-91b2"


class Collector:
    """An OTLP/gRPC trace collector that keeps what it is sent."""

    def __init__(self) -> None:
        self.requests: list[trace_service_pb2.ExportTraceServiceRequest] = []
        self.lock = threading.Lock()

    def export(self, request, context):  # type: ignore[no-untyped-def]
        with self.lock:
            self.requests.append(request)
        return trace_service_pb2.ExportTraceServiceResponse()

    def handler(self) -> grpc.GenericRpcHandler:
        return grpc.method_handlers_generic_handler("opentelemetry.proto.collector.trace.v1.TraceService", {
            "Export": grpc.unary_unary_rpc_method_handler(
                self.export, request_deserializer=trace_service_pb2.ExportTraceServiceRequest.FromString,
                response_serializer=trace_service_pb2.ExportTraceServiceResponse.SerializeToString)})

    def spans(self) -> list:  # type: ignore[type-arg]
        with self.lock:
            # older OTLP protos name the span groups instrumentation_library_spans (same wire field)
            return [s for r in self.requests for rs in r.resource_spans
                    for ss in (getattr(rs, "scope_spans", None) or rs.instrumentation_library_spans)
                    for s in ss.spans]


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
        server.add_generic_rpc_handlers((collector.handler(),))
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

    def trace() -> list:  # type: ignore[type-arg]
        return [s for s in collector.spans() if s.trace_id.hex() == trace_id]

    wait_for(lambda: wanted <= {s.name for s in trace()}, timeout=20, interval=0.2,
             describe=lambda: sorted(s.name for s in trace()))
    spans = trace()
    # the request, the ext_proc stream, the upstream try, and the ext_proc's own phases as children of
    # the span Envoy opened for the ext_proc stream
    assert wanted <= {s.name for s in spans}, sorted(s.name for s in spans)
    assert "ext_proc request_headers" not in {s.name for s in spans}
    stream_span = next(s for s in spans if s.name == stream_name)
    for p in (s for s in spans if s.name.startswith("ext_proc ")):
        assert p.parent_span_id == stream_span.span_id
        assert {a.key: a.value.string_value for a in p.attributes}["gateway.request_id"] == rid
    attrs = {a.key: a.value.string_value for s in spans for a in s.attributes}
    assert attrs.get("guid:x-request-id") == rid
    assert attrs.get("gateway.upstream_cluster") == "upstream_up-pro"
    dump = b"".join(req.SerializeToString() for req in collector.requests)
    assert CANARY.encode() not in dump and key.encode() not in dump
