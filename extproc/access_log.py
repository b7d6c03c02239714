"""How requests ended for their clients where the ext_proc cannot tell: Envoy's gRPC access log service,
fed only the entries of requests whose client went away (response flag DC, DR) or that Envoy's ext_proc
filter answered itself (details ``ext_proc_error...``: its message timeout answered the client with the
interface's 500 although the ext_proc's answer was on its way, as when Envoy was paused) (envoy/envoy.yaml
filters them).

A model server that breaks a stream and a client that leaves it both end Envoy's stream, at any moment
between two events: only Envoy knows which it was.  Each such entry marks its request in Redis (any
ext_proc process may receive it), where the stream watch (``observer``) looks when a stream ended early;
a watch in this process is told at once (``Gateway.leaving``), so that it bills the request and frees its
slot now rather than when Envoy's deferred close of its call would end it.  Only the request id of an
entry is read; nothing of it is kept or logged.
"""
from __future__ import annotations

import logging
from typing import Callable

from envoy.data.accesslog.v3 import accesslog_pb2
from envoy.service.accesslog.v3 import als_pb2

from .billing_outcome import ANSWERED, LEFT
from .grpc_server import EOF, Call
from .store import Store

log = logging.getLogger("extproc")

ALS_PATH = b"/envoy.service.accesslog.v3.AccessLogService/StreamAccessLogs"
parse = als_pb2.StreamAccessLogsMessage.FromString


def _closed_by_envoy(entry: accesslog_pb2.HTTPAccessLogEntry) -> bool:
    """Envoy closed the connection itself (its drain ran out, or it is stopping): the stream was the
    gateway's to end, not the client's leaving."""
    return str(entry.response.response_code_details).startswith("downstream_local_disconnect")


def _ending(entry: accesslog_pb2.HTTPAccessLogEntry) -> str:
    """``LEFT``, ``ANSWERED``, or "" (neither: nothing to tell)."""
    flags = entry.common_properties.response_flags
    if (flags.downstream_connection_termination or flags.downstream_remote_reset) and not _closed_by_envoy(entry):
        return LEFT
    if str(entry.response.response_code_details).startswith("ext_proc_error"):
        return ANSWERED
    return ""


class ClientsLeft:
    def __init__(self, store: Store, leaving: dict[str, Callable[[str], None]] | None = None) -> None:
        self.store = store
        self.leaving = {} if leaving is None else leaving  # request id -> what waits for its ending, told

    async def stream(self, call: Call) -> None:
        while True:
            msg = await call.read()
            if msg is EOF:
                return
            assert isinstance(msg, als_pb2.StreamAccessLogsMessage)
            for entry in msg.http_logs.log_entry:
                rid = entry.request.request_id
                how = _ending(entry) if rid else ""
                if how:
                    told = self.leaving.pop(rid, None)
                    if told is not None:
                        told(how)
                    try:
                        await self.store.mark_ended(rid, how)
                    except Exception as e:  # noqa: BLE001 - Redis down or hung: that stream is taken for a break
                        log.warning("could not mark how a request ended: %s", type(e).__name__,
                                    extra={"request_id": rid})
