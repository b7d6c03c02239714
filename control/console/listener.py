"""The console's listener, guarded as the API's Envoy listener is: a request's head must be whole
within GATEWAY_CONSOLE_HEADERS_TIMEOUT_S of its first byte (a client trickling header lines is cut
off), its body within GATEWAY_CONSOLE_BODY_TIMEOUT_S of the head (else 408) and at most 64 KiB (else
413), a connection without a request is closed after GATEWAY_CONSOLE_IDLE_TIMEOUT_S (aiohttp's
keep-alive timeout, which also runs from the connection's start), and at most
GATEWAY_CONSOLE_MAX_CONNECTIONS are open at once: one more is answered 503 and closed at once.

Each connection's aiohttp protocol is wrapped in a ``Connection`` that counts it and keeps the head's
deadline; the ``guard`` middleware tells it when a head arrived whole and when its request is done."""
from __future__ import annotations

import asyncio
import signal
from typing import Awaitable, Callable

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger

from .settings import ConsoleSettings

BODY_MAX = 64 * 1024
REFUSAL = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n"
           b"Content-Length: 41\r\nRetry-After: 5\r\nConnection: close\r\n\r\n"
           b"Too many connections; try again shortly.\n")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Guard:
    """The open connections (each by its transport) and the limits they live under."""

    def __init__(self, s: ConsoleSettings) -> None:
        self.max_connections = s.console_max_connections
        self.headers_timeout = s.console_headers_timeout_s
        self.body_timeout = s.console_body_timeout_s
        self.open: dict[asyncio.BaseTransport, Connection] = {}

    def protocols(self, make: Callable[[], asyncio.Protocol]) -> Callable[[], asyncio.Protocol]:
        """The protocol factory for ``loop.create_server``: each of ``make``'s protocols, guarded."""
        return lambda: Connection(self, make)


class Connection(asyncio.Protocol):
    """One client connection: refused over the cap, else aiohttp's protocol under a head deadline."""

    def __init__(self, guard: Guard, make: Callable[[], asyncio.Protocol]) -> None:
        self.guard = guard
        self.make = make
        self.inner: asyncio.Protocol | None = None
        self.transport: asyncio.BaseTransport | None = None
        self.busy = False                           # a request is being answered
        self.deadline: asyncio.TimerHandle | None = None  # the head under way must be whole by then

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        if len(self.guard.open) >= self.guard.max_connections:
            if isinstance(transport, asyncio.WriteTransport):
                transport.write(REFUSAL)
            transport.close()
            return
        self.guard.open[transport] = self
        self.inner = self.make()
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self.inner is None:
            return
        if not self.busy and self.deadline is None:  # the first byte of a request's head
            self.deadline = asyncio.get_running_loop().call_later(self.guard.headers_timeout, self._too_slow)
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received() if self.inner is not None else None

    def pause_writing(self) -> None:
        if self.inner is not None:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self.inner is not None:
            self.inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel()
        if self.transport is not None:
            self.guard.open.pop(self.transport, None)
        if self.inner is not None:
            self.inner.connection_lost(exc)

    def head_arrived(self) -> None:
        self._cancel()
        self.busy = True

    def request_done(self) -> None:
        self.busy = False

    def _cancel(self) -> None:
        if self.deadline is not None:
            self.deadline.cancel()
            self.deadline = None

    def _too_slow(self) -> None:
        self.deadline = None
        if isinstance(self.transport, asyncio.WriteTransport) and not self.busy:
            self.transport.abort()


GUARD: web.AppKey[Guard] = web.AppKey("guard", Guard)


@web.middleware
async def guard_mw(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The head is whole (its deadline is off); the body must follow within the body timeout."""
    guard = request.app[GUARD]
    conn = guard.open.get(request.transport) if request.transport is not None else None
    if conn is not None:
        conn.head_arrived()
    try:
        if request.can_read_body:
            try:
                async with asyncio.timeout(guard.body_timeout):
                    await request.read()  # kept: request.post() and read() later answer from it
            except TimeoutError:
                slow = web.Response(status=408, text="The request's body came too slowly.\n")
                slow.force_close()
                return slow
        return await handler(request)
    finally:
        if conn is not None:
            conn.request_done()


async def serve(app: web.Application, s: ConsoleSettings, access_log: type[AbstractAccessLogger]) -> None:
    """Serve ``app`` on the console's address under its guard until SIGINT or SIGTERM."""
    # lingering_time: what is left of a body the answer did not need (a 408, a 413) is read for 1 s at
    # most before the connection closes (aiohttp's default: 10 s)
    runner = web.AppRunner(app, access_log_class=access_log, keepalive_timeout=s.console_idle_timeout_s,
                           lingering_time=1.0, shutdown_timeout=2)
    await runner.setup()
    loop = asyncio.get_running_loop()
    assert runner.server is not None
    server = await loop.create_server(app[GUARD].protocols(runner.server), s.gateway_host, s.console_http_port,
                                      reuse_address=True, backlog=1024)
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        server.close()
        await runner.cleanup()
