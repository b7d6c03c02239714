"""A sans-I/O HTTP/2 server connection, cut to what a gRPC server behind Envoy needs (RFC 9113).

Fed the bytes a client sent (``receive``), it returns events: a stream opened with its headers, a whole
gRPC message (the 5-byte length prefix taken off), a stream ended or reset by the client, the connection
going away.  What the server says goes into ``outbound`` (``data_to_send`` takes it): the response
headers, gRPC messages framed to the client's frame size and flow-control windows (held back while a
window is shut and sent when it opens), trailers.  No sockets and no asyncio here: ``grpc_server`` is
the I/O.

Why not grpcio or grpclib (over h2): the same pass-through processor serves 2.36x the requests on this
connection that it serves on grpcio's asyncio server, at a sixth of the CPU per request, and 0.91x on
grpclib (BENCHMARKS.md, "Which gRPC server the ext_proc runs on"), because it only does what one trusted
peer on a local socket needs.  Incoming headers are
decoded with ``hpack`` (the dynamic table is the client's to drive); outgoing ones are literal fields that
never touch the encoder's table, so they are constant bytes.
"""
from __future__ import annotations

from collections import deque
from struct import Struct
from typing import cast

from hpack import Decoder

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY_FLAG = 0x1, 0x1, 0x4, 0x8, 0x20

# settings identifiers
HEADER_TABLE_SIZE, ENABLE_PUSH, INITIAL_WINDOW_SIZE, MAX_FRAME_SIZE = 1, 2, 4, 5

NO_ERROR, PROTOCOL_ERROR, FLOW_CONTROL_ERROR, FRAME_SIZE_ERROR, REFUSED_STREAM, COMPRESSION_ERROR = 0, 1, 3, 6, 7, 9
MAX_WINDOW = 2**31 - 1
OUR_MAX_FRAME = 2**24 - 1  # what the client may send us: big bodies come in few frames
REPLENISH = 2**30  # give the window back once this much has been received

_HEAD = Struct(">HBBBL")  # length (24 bits, split 16 + 8), type, flags, stream id
_U32 = Struct(">L")
_SETTING = Struct(">HL")
_MSG = Struct(">BL")  # gRPC: compressed flag, message length

# Events: (kind, stream id, value)
OPENED, MESSAGE, ENDED, RESET, GONE = range(5)


class ProtocolError(Exception):
    def __init__(self, code: int, why: str) -> None:
        super().__init__(why)
        self.code = code


def frame(kind: int, flags: int, sid: int, payload: bytes | memoryview = b"") -> bytes:
    n = len(payload)
    return _HEAD.pack(n >> 8, n & 0xFF, kind, flags, sid) + payload


def literal(name: bytes, value: bytes) -> bytes:
    """An HPACK literal header field without indexing, new name, no Huffman (RFC 7541 section 6.2.2)."""
    return b"\x00" + _length(name) + name + _length(value) + value


def _length(s: bytes) -> bytes:
    n = len(s)
    if n < 127:
        return bytes((n,))
    out = bytearray((127,))
    n -= 127
    while n >= 128:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


RESPONSE_HEADERS = b"\x88" + literal(b"content-type", b"application/grpc")  # 0x88: ":status: 200"


def trailers(status: int, message: str = "") -> bytes:
    block = literal(b"grpc-status", str(status).encode())
    if message:
        block += literal(b"grpc-message", message.encode("ascii", "replace"))
    return block


OK_TRAILERS = trailers(0)


class _Stream:
    __slots__ = ("parts", "have", "need", "window", "pending", "headers_sent", "closed_remote")

    def __init__(self, window: int) -> None:
        # a gRPC message not yet whole: its pieces, their length, the length that makes it whole (joined
        # once, when whole: a 20 MiB body in 16 KiB frames is not copied again with every frame)
        self.parts: list[bytes] = []
        self.have = 0
        self.need = 0
        self.window = window  # how much we may still send on this stream
        self.pending: deque[tuple[bytes | memoryview, int]] = deque()  # (DATA payload or trailer block, flags) held back
        self.headers_sent = False
        self.closed_remote = False  # (a stream we have closed is no longer in ``streams``)


class Connection:
    """One client connection's HTTP/2 state, server side."""

    def __init__(self, max_message: int = 128 * 1024 * 1024) -> None:
        self.max_message = max_message
        self._in = bytearray()
        self._preface = False
        self._decoder = Decoder()
        self._decoder.max_allowed_table_size = 65536
        self._block: tuple[int, int, bytearray] | None = None  # a header block waiting for CONTINUATION
        # Envoy sends the same header block for every call (literal fields, decoded anew each time by
        # hpack: ~7% of the process's time); a block already decoded is taken from here, as long as the
        # dynamic table is the one it was decoded against.
        self._seen: dict[bytes, list[tuple[bytes, bytes]]] = {}
        self.streams: dict[int, _Stream] = {}
        self._window = 65535  # connection-level send window
        self._initial = 65535  # the client's initial stream window
        self._max_frame = 16384  # the largest frame the client takes
        self._received = 0  # connection-level bytes received since the window was last given back
        self._blocked: dict[int, _Stream] = {}  # streams with data held back, in arrival order
        self.last_stream = 0
        self.outbound = bytearray(
            frame(SETTINGS, 0, 0, _SETTING.pack(ENABLE_PUSH, 0) + _SETTING.pack(INITIAL_WINDOW_SIZE, MAX_WINDOW)
                  + _SETTING.pack(MAX_FRAME_SIZE, OUR_MAX_FRAME))
            + frame(WINDOW_UPDATE, 0, 0, _U32.pack(MAX_WINDOW - 65535)))

    def data_to_send(self) -> bytes:
        out = bytes(self.outbound)
        self.outbound.clear()
        return out

    # ---- receiving -------------------------------------------------------------------------
    def receive(self, data: bytes) -> list[tuple[int, int, object]]:
        """Parse what arrived; raises ``ProtocolError`` (the caller sends ``goaway`` and closes)."""
        buf = self._in
        buf += data
        events: list[tuple[int, int, object]] = []
        pos = 0
        if not self._preface:
            if len(buf) < 24:
                if not PREFACE.startswith(bytes(buf)):
                    raise ProtocolError(PROTOCOL_ERROR, "not an HTTP/2 client")
                return events
            if buf[:24] != PREFACE:
                raise ProtocolError(PROTOCOL_ERROR, "not an HTTP/2 client")
            self._preface = True
            pos = 24
        end = len(buf)
        while end - pos >= 9:
            hi, lo, kind, flags, sid = _HEAD.unpack_from(buf, pos)
            n = (hi << 8) | lo
            if pos + 9 + n > end:
                break
            sid &= 0x7FFFFFFF
            payload = bytes(buf[pos + 9:pos + 9 + n])
            pos += 9 + n
            if self._block is not None and kind != CONTINUATION:
                raise ProtocolError(PROTOCOL_ERROR, "header block interrupted")
            self._frame(kind, flags, sid, payload, events)
        del buf[:pos]
        return events

    def _frame(self, kind: int, flags: int, sid: int, payload: bytes, events: list[tuple[int, int, object]]) -> None:
        if kind == DATA:
            self._data(flags, sid, payload, events)
        elif kind == HEADERS:
            if flags & PADDED:
                payload = payload[1:len(payload) - payload[0]]
            if flags & PRIORITY_FLAG:
                payload = payload[5:]
            self._block = (sid, flags, bytearray(payload))
            if flags & END_HEADERS:
                self._headers(events)
        elif kind == CONTINUATION:
            if self._block is None or self._block[0] != sid:
                raise ProtocolError(PROTOCOL_ERROR, "unexpected CONTINUATION")
            self._block[2].extend(payload)
            if flags & END_HEADERS:
                self._headers(events)
        elif kind == WINDOW_UPDATE:
            if len(payload) != 4:
                raise ProtocolError(FRAME_SIZE_ERROR, "bad WINDOW_UPDATE")
            inc = _U32.unpack(payload)[0] & 0x7FFFFFFF
            if sid == 0:
                self._window += inc
            elif sid in self.streams:
                self.streams[sid].window += inc
            self._flush_blocked()
        elif kind == SETTINGS:
            if not flags & ACK:
                self._settings(payload)
                self.outbound += frame(SETTINGS, ACK, 0)
        elif kind == PING:
            if not flags & ACK:
                self.outbound += frame(PING, ACK, 0, payload)
        elif kind == RST_STREAM:
            st = self.streams.pop(sid, None)
            self._blocked.pop(sid, None)
            if st is not None:
                events.append((RESET, sid, None))
        elif kind == GOAWAY:
            events.append((GONE, 0, None))
        # PRIORITY, PUSH_PROMISE (never sent to a server) and unknown frame types are ignored

    def _settings(self, payload: bytes) -> None:
        for i in range(0, len(payload) - 5, 6):
            ident, value = _SETTING.unpack_from(payload, i)
            if ident == INITIAL_WINDOW_SIZE:
                if value > MAX_WINDOW:
                    raise ProtocolError(FLOW_CONTROL_ERROR, "window too large")
                delta = value - self._initial
                self._initial = value
                for st in self.streams.values():
                    st.window += delta
            elif ident == MAX_FRAME_SIZE:
                self._max_frame = value
            # HEADER_TABLE_SIZE needs nothing: our header blocks never use the dynamic table
        self._flush_blocked()

    def _decode(self, block: bytes) -> list[tuple[bytes, bytes]]:
        cached = self._seen.get(block)
        if cached is not None:
            return cached
        table = self._decoder.header_table.dynamic_entries
        before = (len(table), table[0] if table else None)
        try:
            headers = cast(list[tuple[bytes, bytes]], self._decoder.decode(block, raw=True))
        except Exception as e:  # noqa: BLE001 - hpack raises several kinds; all are the client's fault
            raise ProtocolError(COMPRESSION_ERROR, "bad header block") from e
        if len(table) == before[0] and (table[0] if table else None) is before[1]:
            if len(self._seen) < 32:  # a block that left the table as it was means the same next time
                self._seen[block] = headers
        else:
            self._seen.clear()  # the table changed: a cached block's indexes may now mean other fields
        return headers

    def _headers(self, events: list[tuple[int, int, object]]) -> None:
        assert self._block is not None
        sid, flags, block = self._block
        self._block = None
        headers = self._decode(bytes(block))
        st = self.streams.get(sid)
        if st is None:
            if sid % 2 == 0 or sid <= self.last_stream:
                return  # trailers of a stream already gone, or not a client stream: nothing to do
            self.last_stream = sid
            st = self.streams[sid] = _Stream(self._initial)
            events.append((OPENED, sid, headers))
        if flags & END_STREAM:
            self._remote_end(sid, st, events)

    def _data(self, flags: int, sid: int, payload: bytes, events: list[tuple[int, int, object]]) -> None:
        self._received += len(payload)
        if self._received >= REPLENISH:
            self.outbound += frame(WINDOW_UPDATE, 0, 0, _U32.pack(self._received))
            self._received = 0
        st = self.streams.get(sid)
        if st is None or st.closed_remote:
            return  # a stream already answered or reset: its data has no reader
        if flags & PADDED:
            payload = payload[1:len(payload) - payload[0]]
        if st.parts:
            st.parts.append(payload)
            st.have += len(payload)
            if st.have < st.need:
                if flags & END_STREAM:
                    self._remote_end(sid, st, events)
                return
            buf = b"".join(st.parts)
            st.parts = []
        else:
            buf = payload
        pos, end = 0, len(buf)
        while end - pos >= 5:
            _, n = _MSG.unpack_from(buf, pos)
            if n > self.max_message:
                raise ProtocolError(PROTOCOL_ERROR, "gRPC message too large")
            if pos + 5 + n > end:
                break
            events.append((MESSAGE, sid, buf[pos + 5:pos + 5 + n]))
            pos += 5 + n
        if pos < end:
            rest = buf[pos:]
            st.parts = [rest]
            st.have = len(rest)
            st.need = 5 + _MSG.unpack_from(rest)[1] if len(rest) >= 5 else 5
        if flags & END_STREAM:
            self._remote_end(sid, st, events)

    def _remote_end(self, sid: int, st: _Stream, events: list[tuple[int, int, object]]) -> None:
        st.closed_remote = True
        events.append((ENDED, sid, None))

    # ---- sending ---------------------------------------------------------------------------
    def send_message(self, sid: int, message: bytes) -> None:
        """One gRPC message on the stream; the response headers go first if they have not."""
        st = self.streams.get(sid)
        if st is None:
            return  # ended, or reset by the client: nobody to send to
        if not st.headers_sent:
            st.headers_sent = True
            self.outbound += frame(HEADERS, END_HEADERS, sid, RESPONSE_HEADERS)
        data = _MSG.pack(0, len(message)) + message
        if st.pending or len(data) > st.window or len(data) > self._window or len(data) > self._max_frame:
            st.pending.append((data, 0))
            self._blocked[sid] = st
            self._flush_blocked()
            return
        st.window -= len(data)
        self._window -= len(data)
        self.outbound += frame(DATA, 0, sid, data)

    def end_stream(self, sid: int, block: bytes = OK_TRAILERS) -> None:
        """Trailers (``trailers(status)``) with END_STREAM; trailers-only if no message was sent."""
        st = self.streams.get(sid)
        if st is None:
            return
        if not st.headers_sent:
            st.headers_sent = True
            block = RESPONSE_HEADERS + block
        if st.pending:
            st.pending.append((block, -1))
            return
        self._close_local(sid, st, block)

    def _close_local(self, sid: int, st: _Stream, block: bytes) -> None:
        self.outbound += frame(HEADERS, END_HEADERS | END_STREAM, sid, block)
        if not st.closed_remote:  # the client has not ended its side: it is told this stream is over
            self.outbound += frame(RST_STREAM, 0, sid, _U32.pack(NO_ERROR))
        del self.streams[sid]

    def _flush_blocked(self) -> None:
        for sid, st in list(self._blocked.items()):
            while st.pending:
                data, kind = st.pending[0]
                if kind == -1:
                    st.pending.popleft()
                    self._close_local(sid, st, bytes(data))
                    break
                room = min(st.window, self._window, self._max_frame)
                if room <= 0:
                    break
                view = memoryview(data)  # slices of a large reply are not copies of the rest of it
                chunk = view[:room]
                if len(chunk) < len(data):
                    st.pending[0] = (view[room:], 0)
                else:
                    st.pending.popleft()
                st.window -= len(chunk)
                self._window -= len(chunk)
                self.outbound += frame(DATA, 0, sid, chunk)
            if not st.pending:
                del self._blocked[sid]
            if self._window <= 0:
                return

    def reset(self, sid: int, code: int = NO_ERROR) -> None:
        if self.streams.pop(sid, None) is not None:
            self._blocked.pop(sid, None)
            self.outbound += frame(RST_STREAM, 0, sid, _U32.pack(code))

    def goaway(self, code: int = NO_ERROR) -> None:
        self.outbound += frame(GOAWAY, 0, 0, _U32.pack(self.last_stream) + _U32.pack(code))
