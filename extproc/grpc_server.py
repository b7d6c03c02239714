"""The ext_proc's gRPC server: ``h2.Connection`` on asyncio sockets, with the few calls it serves.

A call is a ``Call`` (``read`` the next request message, ``write`` a reply message, ``metadata``); a
handler is ``async def handler(call) -> None`` registered by its gRPC path.  Each call runs as one task;
when it returns the call ends with status OK (an exception ends it with INTERNAL).  Writes are not
awaited: they are framed at once and what one turn of the event loop produced goes out in one write.
(Writing each reply message at once let Envoy start on it sooner where cores were idle, but cost a
write here and a read in Envoy per message: on saturated cores the chat cell's ext_proc CPU rose from
about 283 to 334 µs per request and Envoy's from 285 to 308, alternated A/B over 5 rounds.)

Backpressure: a message's bytes go back to the client's flow-control windows when its handler reads it,
so a client can get at most the windows ahead of the handlers; the socket is not read while more than
``READ_BACKLOG`` bytes of whole messages wait for their handlers, nor while the transport's write buffer
is full (``pause_writing``), when handlers also wait in ``Call.read`` until the client takes what was
written.  A GOAWAY either way lets the calls under way finish; the connection closes once none is left.

A pause: a process that resumes (from SIGSTOP, a starved CPU, a long collection: its loop's tick is
``FROZEN_S`` late) starts no call for ``SETTLE_S`` while it reads what waited, so that the resets Envoy
sent for the calls whose message timeout answered their clients meanwhile, which come behind them
(measured), are known (``Call.reset``) before their handlers look: none of those requests is admitted
late, where each would take a concurrency slot and a request of the per-minute budget for a client that
got its 500 long ago.  A handler already running when the process paused answers late: its admission's
deadline undoes it (``exchange``).  A reset read while settling, or of a call whose last message came in
while paused (its reset may come several reads later), marks the call ``expired``: a reply whose headers
the paused process held was answered by Envoy's 500, not by the model server (``server``).

Also served: ``grpc.health.v1.Health/Check``, which Envoy's health checker and ``gateway status`` ask.
"""
from __future__ import annotations

import asyncio
import logging
import os
from collections import deque
from pathlib import Path
from typing import Any, Awaitable, Callable, Protocol, cast

from google.protobuf.message import Message
from grpc_health.v1 import health_pb2

from core.resp import expire
from . import h2

log = logging.getLogger("extproc")

EOF = object()  # what ``Call.read`` returns once the client has sent everything
NOT_FOUND, UNIMPLEMENTED, INTERNAL, UNAVAILABLE = 5, 12, 13, 14
HEALTH_CHECK = b"/grpc.health.v1.Health/Check"
READ_BACKLOG = 2**22  # bytes of whole messages not yet read by their handlers at which reading stops
TICK_S = 0.1  # the loop notes the time this often
FROZEN_S = 1.0  # a tick this late: the process was paused (or its loop blocked) and has just resumed
SETTLE_S = 0.25  # how long after resuming calls are not started: what Envoy sent meanwhile is read first


class Status(Exception):
    """Ends a call with a gRPC status other than OK."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class Call:
    __slots__ = ("_proto", "_sid", "_queue", "_waiter", "ended", "reset", "gone", "expired", "late", "headers",
                 "_parse", "_sink", "_last", "_timer")

    def __init__(self, proto: "_Protocol", sid: int, headers: list[tuple[bytes, bytes]],
                 parse: Callable[[bytes], Any]) -> None:
        self._proto = proto
        self._sid = sid
        self._queue: deque[bytes] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self.ended = False  # the client ended or reset the call: an answer written now is never read
        self.reset = False  # the client reset it (or the connection is gone): it reads no answer at all
        self.gone = False  # its connection went away with it open (the client process died, say)
        # reset while this process was paused (read on resuming): Envoy's message timeout answered the client
        self.expired = False
        self.late = False  # its last message came in while this process was paused
        self.headers = headers
        self._parse = parse
        self._sink: Sink | None = None  # ``consume``'s, while it waits
        self._last = 0.0  # when ``consume`` was last fed a message (the loop's clock)
        self._timer: asyncio.TimerHandle | None = None  # ``consume``'s idle timer

    def metadata(self, name: str) -> str | None:
        key = name.encode()
        for k, v in self.headers:
            if k == key:
                return v.decode("latin-1")
        return None

    async def read(self, timeout: float | None = None) -> Any:
        """The next request message, parsed; ``EOF`` once the client ended (or reset) the call.
        ``TimeoutError`` if none came within ``timeout`` seconds (a timer only while it waits: cheaper
        than ``asyncio.timeout`` around every read)."""
        proto = self._proto
        if proto.write_paused:
            await proto.writable()
        while not self._queue:
            if self.ended:
                return EOF
            loop = asyncio.get_running_loop()
            waiter = self._waiter = loop.create_future()
            timer = None if timeout is None else loop.call_later(timeout, expire, waiter)
            try:
                await waiter
            finally:
                self._waiter = None
                if timer is not None:
                    timer.cancel()
        return self._take(self._queue.popleft())

    async def settle(self) -> bool:
        """Whether the call is ``expired``, once what Envoy sent while this process was paused has been
        read (a message that came before its call's reset is read first)."""
        wait = self._proto.server.settling()
        if wait:
            await asyncio.sleep(wait)
        return self.expired

    def _take(self, message: bytes) -> Any:
        """A message read: its bytes back to the client's windows, then parsed."""
        proto = self._proto
        if proto.conn.consumed(self._sid, len(message)) or proto.read_paused:
            proto.after_read()
        return self._parse(message)

    async def consume(self, sink: "Sink") -> None:
        """Hand every request message to ``sink.feed`` as it arrives, in the connection's own callback:
        no wake-up of this task and no timer per message (a call that only listens: the stream watch's
        copies of every chunk).  Returns once ``feed`` returned True or the client ended the call;
        ``TimeoutError`` once ``sink.idle`` seconds (None: no limit) passed since the last message (one
        timer, moved on only when it fires); an exception of ``feed`` ends it too.  Messages after the
        end are left unread."""
        loop = self._proto.loop
        self._last = loop.time()
        while self._queue:  # what came before
            if sink.feed(self._take(self._queue.popleft())):
                return
        if self.ended:
            return
        waiter = self._waiter = loop.create_future()
        self._sink = sink
        self._arm()
        try:
            await waiter
        finally:
            self._sink = self._waiter = None
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

    def _arm(self) -> None:
        """The idle timer, at ``idle`` after the last message (none while ``idle`` is None)."""
        sink, waiter = self._sink, self._waiter
        if sink is None or waiter is None or (idle := sink.idle) is None:
            return
        self._timer = self._proto.loop.call_at(self._last + idle, self._check)

    def _check(self) -> None:
        self._timer = None
        waiter, sink = self._waiter, self._sink
        if waiter is None or sink is None or waiter.done() or (idle := sink.idle) is None:
            return
        if self._proto.loop.time() - self._last >= idle:
            expire(waiter)
        else:
            self._arm()  # messages came meanwhile: the wait starts from the last of them

    def write(self, message: Message) -> None:
        """Sent at once, in a write of its own (with what else this turn framed so far), not with the
        rest of this turn of the loop's writes: Envoy starts on the answer while this process goes on
        (the two hand requests back and forth, and a batched answer left the machine idle meanwhile:
        BENCHMARKS.md, "The machine left idle, and answers written at once")."""
        self._proto.conn.send_message(self._sid, message.SerializeToString())
        self._proto.flush()

    def _push(self, data: bytes) -> None:
        sink = self._sink
        if sink is None:
            self._queue.append(data)
            self._wake()
            return
        self._last = self._proto.loop.time()
        try:
            done = sink.feed(self._take(data))
        except Exception as e:  # noqa: BLE001 - the consuming handler fails, not the connection
            self._stop_consuming(e)
            return
        if done:
            self._stop_consuming(None)
        elif self._timer is None:
            self._arm()  # the sink may know its ``idle`` only now

    def _stop_consuming(self, error: Exception | None) -> None:
        """``consume`` returns (or raises ``error``): no message is fed to its sink after this one."""
        self._sink = None
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            if error is None:
                waiter.set_result(None)
            else:
                waiter.set_exception(error)

    def _drop_unread(self) -> None:
        """The handler is done: messages it did not read are given back to the windows unread."""
        if self._queue:
            proto = self._proto
            while self._queue:
                proto.conn.consumed(self._sid, len(self._queue.popleft()))
            proto.after_read()

    def _end(self) -> None:
        self.ended = True
        self._wake()

    def end_soon(self, delay: float) -> None:
        """Take the call as ended by the client in ``delay`` seconds: ``read`` then returns what is queued,
        then ``EOF`` (for a call whose end the server learns of another way)."""
        asyncio.get_running_loop().call_later(delay, self._end)

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)


class Sink(Protocol):
    """What ``Call.consume`` feeds: ``feed`` takes each parsed message and says whether it was the
    last one wanted; ``idle`` is the longest wait for the next (None: no limit), read when a wait starts
    and when its timer fires."""

    @property
    def idle(self) -> float | None: ...

    def feed(self, message: Any) -> bool: ...


Handler = Callable[[Call], Awaitable[None]]


class Server:
    """``routes``: gRPC path -> (handler, request message parser)."""

    def __init__(self, routes: dict[bytes, tuple[Handler, Callable[[bytes], Any]]]) -> None:
        self.routes = {HEALTH_CHECK: (self._health, health_pb2.HealthCheckRequest.FromString), **routes}
        self.health: dict[str, int] = {}
        self._server: asyncio.base_events.Server | None = None
        self._unix: asyncio.base_events.Server | None = None
        self._protocols: set[_Protocol] = set()
        self.calls: set[asyncio.Task[None]] = set()
        self.stopping = False
        self._tick = 0.0  # the loop's time at its last tick
        self.resumed_at = float("-inf")  # when the loop last came back from a pause

    def _on_tick(self) -> None:
        loop = asyncio.get_running_loop()
        self.settling()  # (a pause that no read noticed)
        self._tick = loop.time()
        loop.call_later(TICK_S, self._on_tick)

    def settling(self) -> float:
        """Seconds until calls may start after the loop's last pause (0: now).  Reads come before the
        loop's timers once it runs again, so a late tick is seen by the first read after a pause."""
        now = asyncio.get_running_loop().time()
        if now - self._tick > FROZEN_S and self._tick:
            self.resumed_at = now
            self._tick = now
        return max(0.0, self.resumed_at + SETTLE_S - now)

    async def _health(self, call: Call) -> None:
        """grpc.health.v1 ``Check``: the service's status; a service never registered is NOT_FOUND."""
        req = await call.read()
        status = self.health.get("" if req is EOF else req.service)
        if status is None:
            raise Status(NOT_FOUND, "unknown service")
        call.write(health_pb2.HealthCheckResponse(status=status))

    async def start(self, host: str, port: int, unix: Path | None = None) -> None:
        """Serve on ``host``:``port``, and on the Unix socket ``unix`` too (Envoy's way in where it runs on
        the same machine: a write over it costs the sender less than one over TCP on the loopback)."""
        loop = asyncio.get_running_loop()
        if unix is not None:
            unix.parent.mkdir(mode=0o700, exist_ok=True)  # this account's alone
            if unix.is_socket():
                unix.unlink()  # a killed process's
            self._unix = await loop.create_unix_server(lambda: _Protocol(self), os.fspath(unix))
            unix.chmod(0o600)  # as every file of the state directory
        self._server = await loop.create_server(lambda: _Protocol(self), host, port, reuse_address=True)
        self._on_tick()

    async def stop(self, grace: float) -> None:
        """Stop taking connections and calls (a GOAWAY on every connection; a new call is refused, so
        Envoy may open it on another process), let the calls under way finish (up to ``grace`` s), then
        close."""
        self.stopping = True
        for listening in (self._server, self._unix):
            if listening is not None:
                listening.close()
        for p in list(self._protocols):
            p.drain()
        if self.calls:
            await asyncio.wait(list(self.calls), timeout=grace)
        for t in list(self.calls):
            t.cancel()
        for p in list(self._protocols):
            p.close()


class _Protocol(asyncio.Protocol):
    def __init__(self, server: Server) -> None:
        self.server = server
        self.conn = h2.Connection()
        self.calls: dict[int, Call] = {}
        self.transport: asyncio.Transport | None = None
        self._flush_pending = False
        self.loop = asyncio.get_running_loop()
        self.write_paused = False  # the transport's write buffer is full: the client is not reading
        self.read_paused = False
        self._writable: list[asyncio.Future[None]] = []  # handlers waiting in ``Call.read`` for that to pass
        self._opened: list[tuple[int, Call, Handler]] = []  # calls not started yet (``_start_opened``)
        self._starting: asyncio.TimerHandle | None = None  # their start, after a pause

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # a stream transport (uvloop's are not subclasses of asyncio.Transport, only alike)
        self.transport = cast(asyncio.Transport, transport)
        self.server._protocols.add(self)
        self.transport.write(self.conn.data_to_send())

    def connection_lost(self, exc: Exception | None) -> None:
        self.server._protocols.discard(self)
        self.transport = None
        paused = self.server.settling() > 0
        for call in self.calls.values():
            call.reset = call.gone = True
            call.expired = call.late or paused  # (Envoy closes a connection that stopped answering)
            call._end()
        self.calls.clear()
        # the calls opened while paused start now, everything of theirs read: a stream watch's call carries
        # the copies of a stream that ended meanwhile (Envoy drains its connections to a process that failed
        # a health check and closes one once its streams are over)
        self._start_opened()
        self._wake_writers()

    def close(self) -> None:
        """GOAWAY (unless one was sent: its code stands) and close once it is written."""
        if self.transport is not None:
            self.conn.goaway()
            self.transport.write(self.conn.data_to_send())
            self.transport.close()

    def drain(self) -> None:
        """GOAWAY now; the calls under way finish, then the connection closes."""
        self.conn.goaway()
        self.flush_soon()
        self._close_if_drained()

    def _close_if_drained(self) -> None:
        if self.conn.draining and not self.conn.streams:
            self.close()

    # ---- backpressure ------------------------------------------------------------------------
    def after_read(self) -> None:
        """Messages were read: window updates to send, reading to resume perhaps."""
        if self.read_paused:
            self._pace()
        self.flush_soon()

    def pause_writing(self) -> None:
        self.write_paused = True
        self._pace()

    def resume_writing(self) -> None:
        self.write_paused = False
        self._pace()
        self._wake_writers()

    def _pace(self) -> None:
        pause = self.write_paused or self.conn.unconsumed > READ_BACKLOG
        if pause != self.read_paused and self.transport is not None:
            self.read_paused = pause
            if pause:
                self._start_opened()  # nothing more is read meanwhile: no reset of theirs comes first
                self.transport.pause_reading()
            else:
                self.transport.resume_reading()

    async def writable(self) -> None:
        while self.write_paused and self.transport is not None:
            waiter = self.loop.create_future()
            self._writable.append(waiter)
            await waiter

    def _wake_writers(self) -> None:
        for waiter in self._writable:
            if not waiter.done():
                waiter.set_result(None)
        self._writable.clear()

    def flush_soon(self) -> None:
        if not self._flush_pending:
            self._flush_pending = True
            self.loop.call_soon(self.flush)

    def flush(self) -> None:
        """What this turn of the loop framed goes out in one write."""
        self._flush_pending = False
        if self.conn.outbound and self.transport is not None:
            self.transport.write(self.conn.data_to_send())

    def data_received(self, data: bytes) -> None:
        try:
            events = self.conn.receive(data)
        except h2.ProtocolError as e:
            log.warning("ext_proc connection closed: %s", e)
            self.conn.goaway(e.code)
            self.close()
            return
        for ev in events:
            if isinstance(ev, h2.Message):
                call = self.calls.get(ev.sid)
                if call is not None:
                    call.late = self.server.settling() > 0
                    call._push(ev.data)
                else:
                    self.conn.consumed(ev.sid, len(ev.data))
            elif isinstance(ev, h2.Opened):
                self._open(ev.sid, ev.headers)
            else:  # ended or reset by the client
                call = self.calls.get(ev.sid)
                if call is not None:
                    if isinstance(ev, h2.Reset):
                        call.reset = True
                        call.expired = call.late or self.server.settling() > 0
                    call._end()
        if self.conn.unconsumed > READ_BACKLOG:
            self._pace()
        if self.conn.outbound:  # acknowledgements, window updates, replies let go by them
            self.flush_soon()
        if self.conn.draining:
            self._close_if_drained()

    def _open(self, sid: int, headers: list[tuple[bytes, bytes]]) -> None:
        path = next((v for k, v in headers if k == b":path"), b"")
        if self.server.stopping and path != HEALTH_CHECK:
            self.conn.reset(sid, h2.REFUSED_STREAM)
            return
        route = self.server.routes.get(path)
        if route is None:
            self.conn.end_stream(sid, h2.trailers(UNIMPLEMENTED, "unknown method"))
            return
        handler, parse = route
        call = self.calls[sid] = Call(self, sid, headers, parse)
        wait = 0.0 if self.read_paused else self.server.settling()
        if not wait and not self._opened:
            self._start(sid, call, handler)
            return
        self._opened.append((sid, call, handler))
        if self._starting is None:
            self._starting = self.loop.call_later(wait, self._start_opened)

    def _start_opened(self) -> None:
        """The calls held since a pause start, in the order they came."""
        if self._starting is not None:
            self._starting.cancel()
            self._starting = None
        opened, self._opened = self._opened, []
        for sid, call, handler in opened:
            self._start(sid, call, handler)

    def _start(self, sid: int, call: Call, handler: Handler) -> None:
        task = self.loop.create_task(self._run(sid, call, handler))
        self.server.calls.add(task)
        task.add_done_callback(self.server.calls.discard)

    async def _run(self, sid: int, call: Call, handler: Handler) -> None:
        block = h2.OK_TRAILERS
        try:
            await handler(call)
        except Status as e:
            block = h2.trailers(e.code, e.message)
        except asyncio.CancelledError:
            block = h2.trailers(INTERNAL, "server stopping")
            raise
        except Exception:  # noqa: BLE001 - the call fails, the server goes on
            log.exception("gRPC call failed")
            block = h2.trailers(INTERNAL, "internal error")
        finally:
            self.calls.pop(sid, None)
            call._drop_unread()
            self.conn.end_stream(sid, block)
            self.flush_soon()
            if self.conn.draining:
                self._close_if_drained()
