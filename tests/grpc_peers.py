"""The own gRPC server (extproc/grpc_server.py) run in a thread of its own, the ext_proc service the
tests call on it (``echo``), and the peers that call it: hand-made frames, and the ``h2`` library as a
raw HTTP/2 client on a real socket (``Peer``)."""
from __future__ import annotations

import asyncio
import socket
import struct
import threading
import time
from typing import Any, Callable

from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from grpc_health.v1 import health_pb2
from h2.config import H2Configuration
from h2.connection import H2Connection
from h2.events import Event
from h2.settings import SettingCodes

from extproc import h2
from extproc.grpc_server import EOF, Call, Server
from extproc.server import PROCESS_PATH

Frame = tuple[int, int, int, bytes]  # type, flags, stream id, payload


def frames(data: bytes) -> list[Frame]:
    out, pos = [], 0
    while pos < len(data):
        n = int.from_bytes(data[pos:pos + 3], "big")
        kind, flags = data[pos + 3], data[pos + 4]
        sid = int.from_bytes(data[pos + 5:pos + 9], "big") & 0x7FFFFFFF
        out.append((kind, flags, sid, data[pos + 9:pos + 9 + n]))
        pos += 9 + n
    return out


def grpc_msg(payload: bytes) -> bytes:
    return struct.pack(">BL", 0, len(payload)) + payload


def body_msg(body: bytes) -> bytes:
    """A framed ext_proc request carrying ``body``."""
    return grpc_msg(ep.ProcessingRequest(request_body=ep.HttpBody(body=body)).SerializeToString())


def reply_bodies(data: bytes) -> list[bytes]:
    """The bodies the ``echo`` replies in a stream's DATA carry (the whole messages among them)."""
    out, pos = [], 0
    while len(data) - pos >= 5:
        flag, n = struct.unpack(">BL", data[pos:pos + 5])
        assert flag == 0
        if pos + 5 + n > len(data):
            break  # (a message not yet whole)
        reply = ep.ProcessingResponse.FromString(data[pos + 5:pos + 5 + n])
        out.append(bytes(reply.request_body.response.body_mutation.body))
        pos += 5 + n
    return out


class Running:
    def __init__(self, routes: dict[bytes, Any]) -> None:
        self.loop = asyncio.new_event_loop()
        self.server = Server(routes)
        self.server.health[""] = health_pb2.HealthCheckResponse.SERVING
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.run(self.server.start("127.0.0.1", 0))
        assert self.server._server is not None
        self.port = self.server._server.sockets[0].getsockname()[1]

    def run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(10)

    def call(self, fn: Callable[[], Any]) -> Any:
        """``fn()`` on the server's loop (its state is the loop's alone)."""
        async def on_loop() -> Any:
            return fn()
        return self.run(on_loop())

    def stop(self) -> None:
        if not self.loop.is_closed():
            self.run(self.server.stop(1))
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(5)
            self.loop.close()


async def echo(call: Call) -> None:
    """Answers every request message with a body response carrying the request body reversed."""
    while True:
        req = await call.read()
        if req is EOF:
            return
        if req.request_body.body == b"fail":
            raise RuntimeError("boom")
        call.write(ep.ProcessingResponse(request_body=ep.BodyResponse(response=ep.CommonResponse(
            body_mutation=ep.BodyMutation(body=req.request_body.body[::-1])))))


REQUEST_HEADERS = [(b":method", b"POST"), (b":scheme", b"http"), (b":path", PROCESS_PATH),
                   (b":authority", b"extproc"), (b"content-type", b"application/grpc"), (b"te", b"trailers")]


class Peer:
    """The ``h2`` library as a client on a real socket.  What it sends is the library's own framing
    (``raw`` for a frame the library will not make); every frame the server sends is kept, in order,
    in ``frames`` (and fed to the library while its state machine can follow)."""

    def __init__(self, port: int, settings: dict[int, int] | None = None, rcvbuf: int | None = None,
                 wide_open: bool = False) -> None:
        """``wide_open``: the client's windows at their largest (it never has to give them back)."""
        self.sock = socket.socket()
        if rcvbuf is not None:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.connect(("127.0.0.1", port))
        self.sock.settimeout(10)
        self.h2 = H2Connection(H2Configuration(client_side=True, header_encoding=None))
        self.h2.initiate_connection()
        if wide_open:
            settings = {**(settings or {}), SettingCodes.INITIAL_WINDOW_SIZE: h2.MAX_WINDOW}
            self.h2.increment_flow_control_window(h2.MAX_WINDOW - 65_535)
        if settings:
            self.h2.update_settings(settings)
        self.flush()
        self.frames: list[Frame] = []
        self.events: list[Event] = []
        self.closed = False  # the server closed the connection
        self._buf = b""
        self.following = True  # the library's state machine took every frame (it checks their flow control)
        self.broken: Exception | None = None  # what it raised when it stopped following
        self.next_sid = 1
        # the server's SETTINGS and its connection WINDOW_UPDATE, so the library knows the windows
        self.until(lambda: bool(self.of(h2.SETTINGS) and self.of(h2.WINDOW_UPDATE, 0)))

    def flush(self) -> None:
        self.sock.sendall(self.h2.data_to_send())

    def raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def open(self, *messages: bytes, end: bool = False, headers: list[tuple[bytes, bytes]] | None = None) -> int:
        """A new call on the ext_proc path, with these request messages (framed)."""
        sid = self.new_sid()
        self.h2.send_headers(sid, headers or REQUEST_HEADERS)
        for i, m in enumerate(messages):
            self.h2.send_data(sid, m, end_stream=end and i == len(messages) - 1)
        if end and not messages:
            self.h2.end_stream(sid)
        self.flush()
        return sid

    def new_sid(self, taken: int = 0) -> int:
        """The next stream id to open (after ``taken``, one a test opened with a raw frame)."""
        if taken % 2:
            self.next_sid = max(self.next_sid, taken + 2)
        sid = self.next_sid
        self.next_sid += 2
        return sid

    def until(self, done: Callable[[], bool], timeout: float = 10) -> None:
        """Read until ``done()`` (or the server closes the connection: then ``done()`` must hold)."""
        deadline = time.monotonic() + timeout
        while not done():
            if self.closed:
                raise AssertionError("the server closed the connection")
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                data = self.sock.recv(1 << 20)
            except socket.timeout:
                raise AssertionError(f"timed out; frames so far: {[f[:3] for f in self.frames]}") from None
            except ConnectionResetError:
                data = b""  # (closed with our bytes unread: what came before the reset is all there is)
            self.take(data)

    def take(self, data: bytes) -> None:
        if not data:
            self.closed = True
            return
        buf = self._buf + data
        pos = 0
        while len(buf) - pos >= 9:
            n = int.from_bytes(buf[pos:pos + 3], "big")
            if len(buf) - pos < 9 + n:
                break
            frame = buf[pos:pos + 9 + n]
            self.frames += frames(frame)
            pos += 9 + n
            # one frame a call: the library applies a SETTINGS change (its largest frame) only from
            # its next call on, so an ACK and a frame it allows must not come in the same call
            self._follow(frame)
        self._buf = buf[pos:]

    def _follow(self, frame: bytes) -> None:
        if self.following:
            try:
                self.events += self.h2.receive_data(frame)
            except Exception as e:  # noqa: BLE001 - a test broke the protocol on purpose: frames still count
                self.following, self.broken = False, e

    def until_closed(self, timeout: float = 10) -> None:
        self.until(lambda: self.closed, timeout)

    def settle(self) -> None:
        """Everything the server had to say so far is in: a PING it answers comes after it."""
        self.raw(h2.frame(h2.PING, 0, 0, b"settled!"))
        self.until(lambda: any(f[0] == h2.PING and f[3] == b"settled!" for f in self.frames))
        self.frames = [f for f in self.frames if f[3] != b"settled!"]

    def of(self, kind: int, sid: int | None = None) -> list[Frame]:
        return [f for f in self.frames if f[0] == kind and (sid is None or f[2] == sid)]

    def data(self, sid: int) -> bytes:
        return b"".join(p for _, _, _, p in self.of(h2.DATA, sid))

    def ended(self, sid: int) -> bool:
        return any(f[1] & h2.END_STREAM for f in self.frames if f[2] == sid and f[0] in (h2.HEADERS, h2.DATA))

    def goaways(self) -> list[tuple[int, int]]:
        """(last stream id, error code) of every GOAWAY received."""
        return [struct.unpack(">LL", p[:8]) for _, _, _, p in self.of(h2.GOAWAY)]

    def resets(self) -> list[tuple[int, int]]:
        """(stream id, error code) of every RST_STREAM received."""
        return [(sid, struct.unpack(">L", p)[0]) for _, _, sid, p in self.of(h2.RST_STREAM)]

    def close(self) -> None:
        self.sock.close()
