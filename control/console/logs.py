"""The console's logs: JSON lines on standard output (core/logs.py's format), each line of a request
(its access line and whatever the handlers log) with the request's id.

The console is not behind Envoy (its own port, its own Service): it mints a request id for every request
(a UUID, as Envoy does), returns it as ``X-Request-Id`` so that a user can quote it, and every log line
written while the request is handled carries it.  Access lines name the route's pattern, never the path
(e-mail links carry single-use tokens)."""
from __future__ import annotations

import contextvars
import logging
import uuid
from typing import Awaitable, Callable

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger

from core.logs import JsonFormatter

REQUEST_ID = contextvars.ContextVar("console_request_id", default="")
HEADER = "X-Request-Id"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def request_id_mw(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The request's id: minted here (a client's X-Request-Id is not taken: it would choose what the logs
    say), kept on the request and in the context the handlers' log lines read it from."""
    rid = str(uuid.uuid4())
    request["request_id"] = rid
    REQUEST_ID.set(rid)
    return await handler(request)


async def on_prepare(request: web.Request, resp: web.StreamResponse) -> None:
    rid = request.get("request_id")
    if rid:
        resp.headers[HEADER] = rid


class AccessLogger(AbstractAccessLogger):
    """One JSON line per request: method and route pattern, status, duration and the request id."""

    def log(self, request: web.BaseRequest, response: web.StreamResponse, time: float) -> None:
        route = "?"
        mi = getattr(request, "match_info", None)
        if mi is not None and mi.route.resource is not None:
            route = mi.route.resource.canonical
        self.logger.info("%s %s", request.method, route,
                         extra={"request_id": request.get("request_id") or response.headers.get(HEADER),
                                "status": response.status, "duration_ms": round(time * 1000, 1)})


class _WithRequestId(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "request_id", None) is None and (rid := REQUEST_ID.get()):
            record.request_id = rid
        return True


def setup(level: int = logging.INFO) -> None:
    """JSON lines on standard output for every logger of the process (aiohttp's included)."""
    import sys
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(JsonFormatter())
    handler.addFilter(_WithRequestId())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    logging.getLogger("aiohttp.access").setLevel(logging.INFO)
