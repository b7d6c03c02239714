"""The reference pass-through ext_proc: the least a Python (grpc.aio) ext_proc can do on this path.

Each of request headers, request body, response headers and response body is answered at once; the
only work is the body's ``model``: request body JSON-parsed, ``model`` alias -> upstream name, dumped
(content-length set, as Envoy requires); a JSON response body parsed, ``model`` put back, dumped (above
64 KiB -- the embeddings reply -- the first ``"model":"..."`` is replaced at the bytes level instead).  An
SSE response is switched to streamed mode (as the gateway does) and each chunk gets the model name
replaced at the bytes level.  No authentication, no limits, no billing, no Redis.

    python -m bench.minimal_extproc --port N
"""
from __future__ import annotations

import argparse
import asyncio
import json
import signal
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


class Minimal(ep_grpc.ExternalProcessorServicer):
    async def Process(self, it: AsyncIterator[ep.ProcessingRequest],  # noqa: N802
                      context: grpc.aio.ServicerContext) -> AsyncIterator[ep.ProcessingResponse]:
        sse: tuple[bytes, bytes] | None = None
        async for req in it:
            phase = req.WhichOneof("request")
            if phase == "request_headers":
                yield ep.ProcessingResponse(request_headers=ep.HeadersResponse())
            elif phase == "request_body":
                common = ep.CommonResponse()
                new = _rewrite(req.request_body.body, ALIASES)
                if new is not None:
                    common.body_mutation.body = new
                    _length(common, len(new))
                yield ep.ProcessingResponse(request_body=ep.BodyResponse(response=common))
            elif phase == "response_headers":
                msg = ep.ProcessingResponse(response_headers=ep.HeadersResponse())
                for h in req.response_headers.headers.headers:
                    if h.key == "content-type":
                        value = h.raw_value or h.value.encode()
                        if value.startswith(b"text/event-stream"):
                            msg.mode_override.CopyFrom(_STREAMED)
                            sse = (b"", b"")  # filled from the first chunk's model
                yield msg
            elif phase == "response_body":
                body = req.response_body.body
                common = ep.CommonResponse()
                if sse is not None:
                    if not sse[0]:
                        for up, alias in _TO_ALIAS.items():
                            if up.encode() in body:
                                sse = (b'"model":"' + up.encode() + b'"', b'"model":"' + alias.encode() + b'"')
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
                yield ep.ProcessingResponse(response_body=ep.BodyResponse(response=common))
            elif phase == "request_trailers":
                yield ep.ProcessingResponse(request_trailers=ep.TrailersResponse())
            else:
                yield ep.ProcessingResponse(response_trailers=ep.TrailersResponse())


async def serve(port: int) -> None:
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", 128 * 1024 * 1024),
                                      ("grpc.max_send_message_length", 128 * 1024 * 1024)])
    ep_grpc.add_ExternalProcessorServicer_to_server(Minimal(), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.stop(grace=1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    asyncio.run(serve(ap.parse_args().port))


if __name__ == "__main__":
    main()
