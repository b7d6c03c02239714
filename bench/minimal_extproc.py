"""The reference pass-through ext_proc: the least a Python (grpc.aio) ext_proc can do on this path.

Each of request headers, request body, response headers and response body is answered at once; the
only work is the body's ``model``: request body JSON-parsed, ``model`` alias -> upstream name, dumped
(content-length set, as Envoy requires); a JSON response body parsed, ``model`` put back, dumped (above
64 KiB -- the embeddings reply -- the first ``"model":"..."`` is replaced at the bytes level instead).  An
SSE response is switched to streamed mode (as the gateway does) and each chunk gets the model name
replaced at the bytes level.  No authentication, no limits, no billing, no Redis.

    python -m bench.minimal_extproc --port N [--unix PATH] [--server grpcio|own|grpclib]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import signal
from pathlib import Path
from typing import AsyncIterator

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2 as pm
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ep_grpc

from .fixtures import ALIASES

_STREAMED = pm.ProcessingMode(response_body_mode=pm.ProcessingMode.STREAMED)
_TO_ALIAS = {v: k for k, v in ALIASES.items()}
# A JSON round trip of the ~130 KB embeddings reply costs more than everything else the gateway does
# (measured: 96 vs ~1,000 req/s); a reference must not be slower than the thing it is a reference for.
_JSON_LIMIT = 64 * 1024


def _length(common: ep.CommonResponse, n: int) -> None:
    common.header_mutation.set_headers.append(base_pb2.HeaderValueOption(
        header=base_pb2.HeaderValue(key="content-length", raw_value=str(n).encode()),
        append_action=base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD))


def _rewrite(body: bytes, table: dict[str, str]) -> bytes | None:
    try:
        doc = json.loads(body)
    except ValueError:
        return None
    if not isinstance(doc, dict) or doc.get("model") not in table:
        return None
    doc["model"] = table[doc["model"]]
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode()


class PassThrough:
    """One call's answers, whatever server carries them (the same work on each: see ``--server``)."""

    def __init__(self) -> None:
        self.sse: tuple[bytes, bytes] | None = None

    def answer(self, req: ep.ProcessingRequest) -> ep.ProcessingResponse:
        phase = req.WhichOneof("request")
        if phase == "request_headers":
            return ep.ProcessingResponse(request_headers=ep.HeadersResponse())
        if phase == "request_body":
            common = ep.CommonResponse()
            new = _rewrite(req.request_body.body, ALIASES)
            if new is not None:
                common.body_mutation.body = new
                _length(common, len(new))
            return ep.ProcessingResponse(request_body=ep.BodyResponse(response=common))
        if phase == "response_headers":
            msg = ep.ProcessingResponse(response_headers=ep.HeadersResponse())
            for h in req.response_headers.headers.headers:
                if h.key == "content-type":
                    value = h.raw_value or h.value.encode()
                    if value.startswith(b"text/event-stream"):
                        msg.mode_override.CopyFrom(_STREAMED)
                        self.sse = (b"", b"")  # filled from the first chunk's model
            return msg
        if phase == "response_body":
            body = req.response_body.body
            common = ep.CommonResponse()
            sse = self.sse
            if sse is not None:
                if not sse[0]:
                    for up, alias in _TO_ALIAS.items():
                        if up.encode() in body:
                            self.sse = sse = (b'"model":"' + up.encode() + b'"', b'"model":"' + alias.encode() + b'"')
                            break
                if sse[0] and body:
                    common.body_mutation.body = body.replace(sse[0], sse[1])
            elif len(body) > _JSON_LIMIT:
                # Large replies (the embeddings one): the first "model" at the bytes level.
                for up, alias in _TO_ALIAS.items():
                    key = b'"model":"' + up.encode() + b'"'
                    if key in body:
                        new = body.replace(key, b'"model":"' + alias.encode() + b'"', 1)
                        common.body_mutation.body = new
                        _length(common, len(new))
                        break
            else:
                new = _rewrite(body, _TO_ALIAS)
                if new is not None:
                    common.body_mutation.body = new
                    _length(common, len(new))
            return ep.ProcessingResponse(response_body=ep.BodyResponse(response=common))
        if phase == "request_trailers":
            return ep.ProcessingResponse(request_trailers=ep.TrailersResponse())
        return ep.ProcessingResponse(response_trailers=ep.TrailersResponse())


class Minimal(ep_grpc.ExternalProcessorServicer):
    async def Process(self, it: AsyncIterator[ep.ProcessingRequest],  # noqa: N802
                      context: grpc.aio.ServicerContext) -> AsyncIterator[ep.ProcessingResponse]:
        p = PassThrough()
        async for req in it:
            yield p.answer(req)


async def _until_signalled() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


async def serve_own(port: int, unix: str | None = None) -> None:
    """The same processor on the gateway's own HTTP/2 server (extproc/grpc_server.py)."""
    from extproc.grpc_server import EOF, Call, Server
    from extproc.server import PROCESS_PATH

    async def process(call: Call) -> None:
        p = PassThrough()
        while True:
            req = await call.read(None)
            if req is EOF:
                return
            call.write(p.answer(req))

    server = Server({PROCESS_PATH: (process, ep.ProcessingRequest.FromString)})
    await server.start("127.0.0.1", port, None if unix is None else Path(unix))
    await _until_signalled()


async def serve_grpclib(port: int, unix: str | None = None) -> None:
    """The same processor on grpclib (pure-Python gRPC over the h2 library)."""
    from grpclib.const import Cardinality, Handler
    from grpclib.server import Server, Stream

    class Service:
        async def process(self, stream: Stream[ep.ProcessingRequest, ep.ProcessingResponse]) -> None:
            p = PassThrough()
            async for req in stream:
                await stream.send_message(p.answer(req))

        def __mapping__(self) -> dict[str, Handler]:
            return {"/envoy.service.ext_proc.v3.ExternalProcessor/Process": Handler(
                self.process, Cardinality.STREAM_STREAM, ep.ProcessingRequest, ep.ProcessingResponse)}

    servers = [Server([Service()]) for _ in range(1 if unix is None else 2)]
    await servers[0].start("127.0.0.1", port)
    if unix is not None:
        await servers[1].start(path=unix)
    await _until_signalled()
    for server in servers:
        server.close()
        await server.wait_closed()


async def serve(port: int, unix: str | None = None) -> None:
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", 128 * 1024 * 1024),
                                      ("grpc.max_send_message_length", 128 * 1024 * 1024)])
    ep_grpc.add_ExternalProcessorServicer_to_server(Minimal(), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    if unix is not None:
        server.add_insecure_port(f"unix:{unix}")
    await server.start()
    await _until_signalled()
    await server.stop(grace=1)


SERVERS = {"grpcio": serve, "own": serve_own, "grpclib": serve_grpclib}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--unix", metavar="PATH", help="serve on this Unix socket too")
    ap.add_argument("--server", choices=sorted(SERVERS), default="grpcio",
                    help="grpcio's asyncio server (the reference), the gateway's own HTTP/2 server, or grpclib")
    args = ap.parse_args()
    asyncio.run(SERVERS[args.server](args.port, args.unix))


if __name__ == "__main__":
    main()
