"""Per-phase spans of the ext_proc, children of the span Envoy opens for the ext_proc stream (its W3C
``traceparent`` arrives in the stream's gRPC metadata), exported in batches over OTLP/gRPC.  Off unless
GATEWAY_OTLP_ENDPOINT is set: then ``NULL`` stands in and costs nothing.  Attributes are metadata only
(request id, phase, status); never a body or a header value."""
from __future__ import annotations

import asyncio
import logging
import os

import grpc
# the OTLP protos that xds-protos ships (wire-compatible with current OTLP: scope spans are field 2)
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.resource.v1 import resource_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

log = logging.getLogger("extproc.tracing")
_EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"


class NullTracer:
    enabled = False

    def span(self, parent: str | None, name: str, start_ns: int, end_ns: int, attrs: dict[str, str]) -> None:
        return None

    async def run(self) -> None:
        return None


NULL = NullTracer()


def _parse(traceparent: str | None) -> tuple[bytes, bytes] | None:
    if not traceparent:
        return None
    parts = traceparent.split("-")
    if len(parts) != 4 or len(parts[1]) != 32 or len(parts[2]) != 16:
        return None
    try:
        return bytes.fromhex(parts[1]), bytes.fromhex(parts[2])
    except ValueError:
        return None


class OtlpTracer(NullTracer):
    enabled = True

    def __init__(self, endpoint: str, service: str = "llm-gateway-extproc", every: float = 1.0) -> None:
        self.endpoint = endpoint
        self.every = every
        self.pending: list[trace_pb2.Span] = []
        self.resource = resource_pb2.Resource(attributes=[common_pb2.KeyValue(
            key="service.name", value=common_pb2.AnyValue(string_value=service))])

    def span(self, parent: str | None, name: str, start_ns: int, end_ns: int, attrs: dict[str, str]) -> None:
        ctx = _parse(parent)
        if ctx is None or len(self.pending) > 10000:
            return
        trace_id, parent_id = ctx
        self.pending.append(trace_pb2.Span(
            trace_id=trace_id, span_id=os.urandom(8), parent_span_id=parent_id, name=name,
            kind=trace_pb2.Span.SPAN_KIND_INTERNAL, start_time_unix_nano=start_ns, end_time_unix_nano=end_ns,
            attributes=[common_pb2.KeyValue(key=k, value=common_pb2.AnyValue(string_value=v))
                        for k, v in attrs.items()]))

    async def run(self) -> None:
        async with grpc.aio.insecure_channel(self.endpoint) as channel:
            export = channel.unary_unary(
                _EXPORT, request_serializer=trace_service_pb2.ExportTraceServiceRequest.SerializeToString,
                response_deserializer=trace_service_pb2.ExportTraceServiceResponse.FromString)
            while True:
                await asyncio.sleep(self.every)
                if not self.pending:
                    continue
                batch, self.pending = self.pending, []
                req = trace_service_pb2.ExportTraceServiceRequest(resource_spans=[trace_pb2.ResourceSpans(
                    resource=self.resource,
                    instrumentation_library_spans=[trace_pb2.InstrumentationLibrarySpans(spans=batch)])])
                try:
                    await export(req, timeout=5)
                except grpc.aio.AioRpcError as e:
                    log.warning("span export failed: %s", e.code().name)


def tracer(endpoint: str) -> NullTracer:
    return OtlpTracer(endpoint) if endpoint else NULL
