"""The ext_proc gRPC stream loop: protocol plumbing only.

Each gRPC stream is one HTTP request; its messages become calls on an ``Exchange`` and the
``Answer``s become ``ProcessingResponse``s.  No policy lives here.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from time import perf_counter, time_ns
from google.protobuf import struct_pb2
from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2 as pm
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from envoy.type.v3 import http_status_pb2

from core.errors import INTERNAL_ERROR
from . import metrics, tracing
from .billing_outcome import LEFT
from .exchange import Answer, Exchange, Gateway, error_answer
from .grpc_server import EOF, UNAVAILABLE, Call, Status
from .observer import StreamWatch

log = logging.getLogger("extproc")

# A streamed reply handed over to Envoy's relay: no body here, and the trailers phase only so that this
# call lasts as long as the stream (it ends when the stream does; Envoy sends no trailers message when the
# model server sent no trailers).
_HANDED_OVER = pm.ProcessingMode(response_body_mode=pm.ProcessingMode.NONE,
                                 response_trailer_mode=pm.ProcessingMode.SEND)
# The gRPC metadata by which Envoy's second ext_proc filter, the stream watch's, names its calls.
ROLE_HEADER, WATCH_ROLE = "x-gateway-role", "stream-watch"


def _headers(hm: base_pb2.HeaderMap) -> dict[str, str]:
    return {h.key: (h.raw_value.decode("latin-1") if h.raw_value else h.value) for h in hm.headers}


_ATTRIBUTES = "envoy.filters.http.ext_proc"


def _attributes(req: ep.ProcessingRequest) -> dict[str, str] | None:
    """The request attributes Envoy sends with the first message when the route skips the headers."""
    if _ATTRIBUTES not in req.attributes:
        return None
    return {k: v.string_value for k, v in req.attributes[_ATTRIBUTES].fields.items()}


_ROUTES: dict[str, struct_pb2.Struct] = {}


def _route(cluster: str) -> struct_pb2.Struct:
    """Dynamic metadata ``gateway: {cluster: ...}``, from which Envoy sets the routing header."""
    md = _ROUTES.get(cluster)
    if md is None:
        md = _ROUTES[cluster] = struct_pb2.Struct()
        md.update({"gateway": {"cluster": cluster}})
    return md


def _common(answer: Answer) -> ep.CommonResponse:
    c = ep.CommonResponse()
    for k, v in answer.set_headers.items():
        c.header_mutation.set_headers.append(base_pb2.HeaderValueOption(
            header=base_pb2.HeaderValue(key=k, raw_value=v.encode()),
            append_action=base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD))
    if answer.remove_headers:
        c.header_mutation.remove_headers.extend(answer.remove_headers)
    if answer.body is not None:
        if answer.body:
            c.body_mutation.body = answer.body
        else:
            c.body_mutation.clear_body = True
    if answer.clear_route_cache:
        c.clear_route_cache = True
    return c


# The answer to a reply's headers that changes nothing (every non-streamed reply's), built once.
_HEADERS_AS_THEY_ARE = ep.ProcessingResponse(response_headers=ep.HeadersResponse(response=ep.CommonResponse()))


def _to_message(phase: str, answer: Answer) -> ep.ProcessingResponse:
    if (phase == "response_headers" and answer.reply is None and not answer.hand_over and not answer.set_headers
            and not answer.remove_headers and answer.body is None and not answer.clear_route_cache):
        return _HEADERS_AS_THEY_ARE
    if answer.reply is not None:
        status, body, headers = answer.reply
        ir = ep.ImmediateResponse(status=http_status_pb2.HttpStatus(code=status), body=body, details="gateway")
        for k, v in headers.items():
            ir.headers.set_headers.append(base_pb2.HeaderValueOption(
                header=base_pb2.HeaderValue(key=k, raw_value=v.encode())))
        return ep.ProcessingResponse(immediate_response=ir)
    common = _common(answer)
    if phase == "request_headers":
        return ep.ProcessingResponse(request_headers=ep.HeadersResponse(response=common))
    if phase == "request_body":
        msg = ep.ProcessingResponse(request_body=ep.BodyResponse(response=common))
        if answer.cluster is not None:
            msg.dynamic_metadata.CopyFrom(_route(answer.cluster))
        return msg
    if phase == "response_headers":
        msg = ep.ProcessingResponse(response_headers=ep.HeadersResponse(response=common))
        if answer.hand_over:
            msg.mode_override.CopyFrom(_HANDED_OVER)
        return msg
    if phase == "response_body":
        return ep.ProcessingResponse(response_body=ep.BodyResponse(response=common))
    if phase == "request_trailers":
        return ep.ProcessingResponse(request_trailers=ep.TrailersResponse())
    return ep.ProcessingResponse(response_trailers=ep.TrailersResponse())


# A model server that drops the connection makes Envoy reset the client's stream at once, dropping the
# reply's headers if the ext_proc still holds them: the gRPC call then ends right after the answer to
# them (measured: 5 us to 0.3 ms after it; 0.6 to 5 ms when Envoy had read the answer and the model
# server failed just after).  A call that ends within this window of that answer may have been cut so.
CUT_WINDOW_S = 0.025

PROCESS_PATH = b"/envoy.service.ext_proc.v3.ExternalProcessor/Process"

# Envoy ends a call about a millisecond after it read the request's last answer; an end this much later
# says Envoy stalled meanwhile (paused, starved of CPU), when its message timeout may have answered the
# client before it read that answer (``Exchange.maybe_unread``).  ``END_WAIT_S``: the longest wait for it.
LATE_S = 1.0
END_WAIT_S = 30.0

# How long a stream watch whose client left (Envoy's access log) goes on reading copies Envoy sent before
# it: its call is one stream of the connection the access log's is another of (loopback, in order).
LEFT_GRACE_S = 0.1


class Processor:
    """The ``ExternalProcessor.Process`` call (``grpc_server`` routes ``PROCESS_PATH`` here)."""

    def __init__(self, gateway: Gateway, tracer: tracing.NullTracer = tracing.NULL) -> None:
        self.gateway = gateway
        self.tracer = tracer

    async def process(self, call: Call) -> None:
        if call.metadata(ROLE_HEADER) == WATCH_ROLE:
            await self.watch(call)
            return
        ex = Exchange(self.gateway)
        parent = call.metadata("traceparent") if self.tracer.enabled else None
        written = perf_counter()  # when the last answer went
        open_reply: str | None = None  # the reply phase it answered, when more of the reply was due
        try:
            while True:
                try:
                    req = await call.read(ex.idle)
                except TimeoutError:
                    # the reply stalled: Envoy takes an immediate response at any point of the stream
                    call.write(_to_message("", await ex.idle_gap()))
                    break
                if req is EOF:
                    if open_reply is not None and call.expired and not ex.handed_over:
                        ex.timed_out()  # answered after Envoy's message timeout had answered the client
                    elif open_reply is not None and perf_counter() - written < CUT_WINDOW_S:
                        ex.cut_off(open_reply)  # Envoy reset the client's stream: that answer was never read
                    break
                assert isinstance(req, ep.ProcessingRequest)
                phase = req.WhichOneof("request")
                if phase in ("response_headers", "response_body") and await call.settle():
                    ex.timed_out()  # Envoy answered the client while this process held the reply's headers
                    break
                t0 = perf_counter()
                last = False  # the end of the reply came with this message
                try:
                    if phase == "request_headers":
                        h = req.request_headers
                        answer = await ex.request_headers(_headers(h.headers), h.end_of_stream)
                    elif phase == "request_body" and call.reset:
                        answer = await ex.answered_by_envoy(_attributes(req))  # and never admitted
                    elif phase == "request_body":
                        answer = await ex.request_body(req.request_body.body, _attributes(req))
                    elif phase == "response_headers":
                        last = req.response_headers.end_of_stream
                        answer = await ex.response_headers(_headers(req.response_headers.headers), _attributes(req))
                    elif phase == "response_body":
                        b = req.response_body
                        last = b.end_of_stream
                        answer = await ex.response_body(b.body, last)
                    elif phase == "response_trailers":  # the end of a handed-over stream
                        answer = ex.response_trailers()
                    else:  # the trailers of a request: nothing to do
                        answer = Answer()
                except Exception:  # noqa: BLE001 - every failure becomes the interface's 500, never a hang
                    log.exception("ext_proc phase %s failed", phase, extra={"request_id": ex.request_id})
                    answer = error_answer(INTERNAL_ERROR, ex.request_id)
                msg = _to_message(phase or "", answer)
                spent = perf_counter() - t0
                metrics.labelled(metrics.PHASE, phase or "other").observe(spent)
                if parent is not None:
                    end = time_ns()
                    self.tracer.span(parent, f"ext_proc {phase}", end - int(spent * 1e9), end,
                                     {"gateway.request_id": ex.request_id, "gateway.phase": phase or "",
                                      "gateway.status": str(answer.reply[0]) if answer.reply else "continue"})
                call.write(msg)
                written = perf_counter()
                open_reply = phase if answer.reply is None and not last and phase in (
                    "response_headers", "response_body") else None
                if phase == "request_body" and answer.reply is None and call.ended:
                    ex.undelivered()  # Envoy gave up before this answer let the request through
                if answer.reply is not None or last or phase == "response_trailers":
                    # That was the request's last message: its record waits for Envoy's end of the call
                    await _envoys_end(call, ex, written)
                    break
                if ex.finishing is not None:  # checked here: no coroutine made for every stream chunk
                    await ex.send_finish()  # after the answer: Redis is not on the client's wait
        finally:
            try:
                await ex.close()
            except Exception:  # noqa: BLE001
                log.exception("closing a request failed", extra={"request_id": ex.request_id})

    async def watch(self, call: Call) -> None:
        """The stream watch's call (``observer``): copies of a streamed reply's chunks, never answered.
        They are fed to the watch as they arrive (``Call.consume``): no wake-up of this task per chunk."""
        sink = _WatchSink(StreamWatch(self.gateway), self.gateway.leaving, call)
        try:
            try:
                await call.consume(sink)
            except TimeoutError:
                sink.w.stalled()
                await sink.w.close()
                # an error ends the call: Envoy resets the client's stream (it ends without [DONE])
                raise Status(UNAVAILABLE, "the model server went idle") from None
            # the stream's end (Envoy passed it on before it sent this copy: billed now, and the call
            # ends here rather than when Envoy's deferred close, 1 s later, would end it), or EOF
        finally:
            if sink.w.ctx is not None:
                sink.leaving.pop(sink.w.ctx.request_id, None)
            await sink.w.close()


async def _envoys_end(call: Call, ex: Exchange, written: float) -> None:
    """The request's last answer went at ``written``: Envoy ends the call once it has read it, and the
    decided record is sent then (after the answer: Redis is not on the client's wait).  A call Envoy had
    ended before the answer went (this process paused past Envoy's message timeout), or ends ``LATE_S``
    late (Envoy paused with the answer unread), may have had the answer unread: ``maybe_unread``.  A
    call whose connection went away instead of ending: Envoy died with the reply (``envoy_gone``)."""
    unread = call.ended  # (nothing was awaited since the answer was written)
    try:
        while await call.read(END_WAIT_S) is not EOF:
            pass  # (nothing comes after the last message but the end)
    except TimeoutError:
        pass
    if ex.finishing is not None:
        if call.gone:
            ex.envoy_gone()
        elif unread or perf_counter() - written > LATE_S:
            await ex.maybe_unread()
    await ex.send_finish()


class _WatchSink:
    """Envoy's copies of a streamed reply, as ``Call.consume`` hands them over, to a ``StreamWatch``."""

    __slots__ = ("w", "leaving", "call")

    def __init__(self, w: StreamWatch, leaving: dict[str, Callable[[str], None]], call: Call) -> None:
        self.w = w
        self.leaving = leaving
        self.call = call

    @property
    def idle(self) -> float | None:
        return self.w.idle

    def told(self, how: str) -> None:
        """Envoy's access log said how the stream ended for its client (``access_log``)."""
        if how != LEFT:  # (Envoy's own 500 takes no stream's place: its headers went before the hand-over)
            return
        # the client left: copies Envoy sent before it may still be on their way (another stream of the
        # connection): read for a moment more, then the call is taken as ended
        self.w.client_left()
        self.call.end_soon(LEFT_GRACE_S)

    def feed(self, req: ep.ProcessingRequest) -> bool:
        """True at the stream's end."""
        phase = req.WhichOneof("request")
        if phase == "response_body":
            b = req.response_body
            self.w.response_body(b.body, b.end_of_stream)
            return bool(b.end_of_stream)
        if phase == "response_headers":
            self.w.response_headers(_headers(req.response_headers.headers))
            if self.w.ctx is not None:  # the request, named by its headers
                self.leaving[self.w.ctx.request_id] = self.told
        return False
