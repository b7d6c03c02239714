"""A sans-I/O HTTP/2 server connection, cut to what a gRPC server behind Envoy needs (RFC 9113).

Fed the bytes a client sent (``receive``), it returns events: a stream opened with its headers, a whole
gRPC message (the 5-byte length prefix taken off), a stream ended or reset by the client (a GOAWAY
sets ``draining``).  What the server says goes into ``outbound`` (``data_to_send`` takes it): the response
headers, gRPC messages framed to the client's frame size and flow-control windows (held back while a
window is shut, even below 0 after a SETTINGS cut, and sent when it opens), trailers.  No sockets and no
asyncio here: ``grpc_server`` is the I/O.

Receive side: the client gets 1 MiB of window per stream and 16 MiB for the connection, and a message's
bytes go back to both when the application says it read the message (``consumed``), so a client is at
most the windows ahead of the handlers.  A frame that breaks the protocol is a ``ProtocolError`` with its
RFC code (the caller sends the one ``goaway`` and closes); a stream-level error resets that stream only.
After a GOAWAY either way new streams are refused (REFUSED_STREAM) and the open ones go on.  Conformance
is checked against real peers by tests/test_h2_conformance.py.

Why not grpcio or grpclib (over h2): the same pass-through processor serves 2.36x the chat requests on
this server that it serves on grpcio's asyncio server, at a sixth of the CPU per request, while grpclib
reaches 0.91x of grpcio (BENCHMARKS.md, "Which gRPC server the ext_proc runs on"), because it only does
what one trusted peer on a local socket needs.  Incoming headers are decoded with ``hpack`` (the dynamic
table is the client's to drive); outgoing ones are literal fields that never touch the encoder's table,
so they are constant bytes.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from struct import Struct
from typing import cast

from hpack import Decoder

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = 0, 1, 3, 4, 6, 7, 8, 9
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY_FLAG = 0x1, 0x1, 0x4, 0x8, 0x20

# settings identifiers
ENABLE_PUSH, INITIAL_WINDOW_SIZE, MAX_FRAME_SIZE = 2, 4, 5

NO_ERROR, PROTOCOL_ERROR, FLOW_CONTROL_ERROR, STREAM_CLOSED, FRAME_SIZE_ERROR, REFUSED_STREAM = 0, 1, 3, 5, 6, 7
COMPRESSION_ERROR, ENHANCE_YOUR_CALM = 9, 11
MAX_WINDOW = 2**31 - 1
MIN_FRAME, MAX_FRAME = 2**14, 2**24 - 1  # the range of SETTINGS_MAX_FRAME_SIZE
OUR_MAX_FRAME = 2**20  # what the client may send us: big bodies come in few frames
MAX_HEADER_BLOCK = 2**18  # a header block (HEADERS + CONTINUATION) larger than this ends the connection
# Receive windows: what the client may send before the handlers have read it.  A whole message's bytes
# are given back when the handler reads it; padding, data nobody will read and the bytes of a message
# still incomplete at once (a message larger than the window must be able to arrive).
STREAM_WINDOW = 2**20
CONNECTION_WINDOW = 2**24
HOLD = 2**20  # replies held back on a stream by the client's windows beyond which its window stays shut

_HEAD = Struct(">HBBBL")  # length (24 bits, split 16 + 8), type, flags, stream id
_U32 = Struct(">L")
_SETTING = Struct(">HL")
_MSG = Struct(">BL")  # gRPC: compressed flag, message length



# ---- events: what ``receive`` returns ------------------------------------------------------------
@dataclass(slots=True)
class Opened:
    """The client opened a stream with these headers."""
    sid: int
    headers: list[tuple[bytes, bytes]]


@dataclass(slots=True)
class Message:
    """A whole gRPC message on the stream (its 5-byte length prefix taken off)."""
    sid: int
    data: bytes


@dataclass(slots=True)
class Ended:
    """The client ended the stream (END_STREAM): it sends nothing more, and reads the answer."""
    sid: int


@dataclass(slots=True)
class Reset:
    """The stream is gone: the client reset it, or an error of its own made us reset it."""
    sid: int


Event = Opened | Message | Ended | Reset


class ProtocolError(Exception):
    """A connection error (RFC 9113 section 5.4.1): the caller sends ``goaway(code)`` and closes."""

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
    __slots__ = ("sid", "parts", "have", "need", "window", "recv", "unacked", "pending", "held", "headers_sent",
                 "closed_remote")

    def __init__(self, sid: int, window: int) -> None:
        self.sid = sid
        # a gRPC message not yet whole: its pieces, their length, the length that makes it whole (joined
        # once, when whole: a 20 MiB body in 16 KiB frames is not copied again with every frame)
        self.parts: list[bytes] = []
        self.have = 0
        self.need = 0
        self.window = window  # how much we may still send on this stream (negative after a SETTINGS cut)
        self.recv = STREAM_WINDOW  # how much the client may still send on it
        self.unacked = 0  # bytes to give back to ``recv`` (negative: whole messages given back ahead, see _data)
        self.pending: deque[tuple[bytes | memoryview, int]] = deque()  # (DATA payload or trailer block, flags) held back
        self.held = 0  # bytes of DATA in ``pending``
        self.headers_sent = False
        self.closed_remote = False  # (a stream we have closed is no longer in ``streams``)


def _unpad(payload: bytes) -> bytes:
    if not payload or payload[0] >= len(payload):
        raise ProtocolError(PROTOCOL_ERROR, "padding as long as the frame")
    return payload[1:len(payload) - payload[0]]


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
        self._max_frame = MIN_FRAME  # the largest frame the client takes
        self._recv = CONNECTION_WINDOW  # how much the client may still send on the connection
        self._unacked = 0  # bytes to give back to ``_recv`` (negative: see _data)
        self.unconsumed = 0  # bytes of whole messages handed out as events and not yet ``consumed``
        self._blocked: dict[int, _Stream] = {}  # streams with data held back, in arrival order
        self.last_stream = 0  # the highest stream the client opened
        self._accepted = 0  # the highest stream not refused (a GOAWAY's last stream)
        self.draining = False  # a GOAWAY went one way or the other: new streams are refused
        self._goaway_sent = False
        self.outbound = bytearray(
            frame(SETTINGS, 0, 0, _SETTING.pack(INITIAL_WINDOW_SIZE, STREAM_WINDOW)
                  + _SETTING.pack(MAX_FRAME_SIZE, OUR_MAX_FRAME))
            + frame(WINDOW_UPDATE, 0, 0, _U32.pack(CONNECTION_WINDOW - 65535)))

    def data_to_send(self) -> bytes:
        out = bytes(self.outbound)
        self.outbound.clear()
        return out

    # ---- receiving -------------------------------------------------------------------------
    def receive(self, data: bytes) -> list[Event]:
        """Parse what arrived; raises ``ProtocolError`` (the caller sends ``goaway`` and closes)."""
        buf = self._in
        buf += data
        events: list[Event] = []
        pos = 0
        if not self._preface:
            if not PREFACE.startswith(bytes(buf[:24])):
                raise ProtocolError(PROTOCOL_ERROR, "not an HTTP/2 client")
            if len(buf) < 24:
                return events
            self._preface = True
            pos = 24
        end = len(buf)
        while end - pos >= 9:
            hi, lo, kind, flags, sid = _HEAD.unpack_from(buf, pos)
            n = (hi << 8) | lo
            if n > OUR_MAX_FRAME:
                raise ProtocolError(FRAME_SIZE_ERROR, "frame larger than SETTINGS_MAX_FRAME_SIZE")
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

    def _frame(self, kind: int, flags: int, sid: int, payload: bytes, events: list[Event]) -> None:
        if kind == DATA:
            self._data(flags, sid, payload, events)
        elif kind == HEADERS or kind == CONTINUATION:
            self._header_block(kind, flags, sid, payload, events)
        elif kind == WINDOW_UPDATE:
            self._window_update(sid, payload, events)
        elif kind == SETTINGS:
            self._connection_frame(sid)
            if flags & ACK:
                if payload:
                    raise ProtocolError(FRAME_SIZE_ERROR, "SETTINGS acknowledgement with a payload")
            else:
                self._settings(payload)
                self.outbound += frame(SETTINGS, ACK, 0)
        elif kind == PING:
            self._connection_frame(sid)
            if len(payload) != 8:
                raise ProtocolError(FRAME_SIZE_ERROR, "PING not 8 bytes")
            if not flags & ACK:
                self.outbound += frame(PING, ACK, 0, payload)
        elif kind == RST_STREAM:
            if len(payload) != 4:
                raise ProtocolError(FRAME_SIZE_ERROR, "RST_STREAM not 4 bytes")
            self._stream_frame(sid)
            if self._drop(sid):
                events.append(Reset(sid))
        elif kind == GOAWAY:
            self._connection_frame(sid)
            if len(payload) < 8:
                raise ProtocolError(FRAME_SIZE_ERROR, "GOAWAY shorter than 8 bytes")
            self.draining = True
        # PRIORITY, PUSH_PROMISE (never sent to a server) and unknown frame types are ignored

    def _header_block(self, kind: int, flags: int, sid: int, payload: bytes,
                      events: list[Event]) -> None:
        if kind == HEADERS:
            if flags & PADDED:
                payload = _unpad(payload)
            if flags & PRIORITY_FLAG:
                if len(payload) < 5:
                    raise ProtocolError(FRAME_SIZE_ERROR, "HEADERS too short for its priority")
                payload = payload[5:]
            self._block = (sid, flags, bytearray())
        elif self._block is None or self._block[0] != sid:
            raise ProtocolError(PROTOCOL_ERROR, "unexpected CONTINUATION")
        block = self._block[2]
        block += payload
        if len(block) > MAX_HEADER_BLOCK:
            raise ProtocolError(ENHANCE_YOUR_CALM, "header block too large")
        if flags & END_HEADERS:
            self._headers(events)

    @staticmethod
    def _connection_frame(sid: int) -> None:
        if sid:
            raise ProtocolError(PROTOCOL_ERROR, "connection frame on a stream")

    def _stream_frame(self, sid: int) -> None:
        """A frame for a stream the client may have opened (not 0, not idle: RFC 9113 section 5.1)."""
        if sid % 2 == 0 or sid > self.last_stream:
            raise ProtocolError(PROTOCOL_ERROR, "frame on an idle stream")

    def _settings(self, payload: bytes) -> None:
        if len(payload) % 6:
            raise ProtocolError(FRAME_SIZE_ERROR, "SETTINGS not a multiple of 6 bytes")
        for i in range(0, len(payload), 6):
            ident, value = _SETTING.unpack_from(payload, i)
            if ident == INITIAL_WINDOW_SIZE:
                if value > MAX_WINDOW:
                    raise ProtocolError(FLOW_CONTROL_ERROR, "window too large")
                delta = value - self._initial
                self._initial = value
                for st in self.streams.values():
                    st.window += delta
                    if st.window > MAX_WINDOW:
                        raise ProtocolError(FLOW_CONTROL_ERROR, "window too large")
            elif ident == MAX_FRAME_SIZE:
                if not MIN_FRAME <= value <= MAX_FRAME:
                    raise ProtocolError(PROTOCOL_ERROR, "SETTINGS_MAX_FRAME_SIZE out of range")
                self._max_frame = value
            elif ident == ENABLE_PUSH and value > 1:
                raise ProtocolError(PROTOCOL_ERROR, "SETTINGS_ENABLE_PUSH not 0 or 1")
            # HEADER_TABLE_SIZE needs nothing: our header blocks never use the dynamic table
        self._flush_blocked()

    def _window_update(self, sid: int, payload: bytes, events: list[Event]) -> None:
        if len(payload) != 4:
            raise ProtocolError(FRAME_SIZE_ERROR, "WINDOW_UPDATE not 4 bytes")
        inc = _U32.unpack(payload)[0] & 0x7FFFFFFF
        if sid == 0:
            if inc == 0:
                raise ProtocolError(PROTOCOL_ERROR, "WINDOW_UPDATE of 0")
            self._window += inc
            if self._window > MAX_WINDOW:
                raise ProtocolError(FLOW_CONTROL_ERROR, "connection window too large")
        else:
            self._stream_frame(sid)
            st = self.streams.get(sid)
            if st is None:
                return  # a closed stream
            st.window += inc
            if inc == 0 or st.window > MAX_WINDOW:
                self._stream_error(sid, PROTOCOL_ERROR if inc == 0 else FLOW_CONTROL_ERROR, events)
                return
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

    def _headers(self, events: list[Event]) -> None:
        assert self._block is not None
        sid, flags, block = self._block
        self._block = None
        headers = self._decode(bytes(block))  # even for a stream refused or gone: the table must follow
        if sid % 2 == 0:
            raise ProtocolError(PROTOCOL_ERROR, "HEADERS on a stream id a client may not open")
        st = self.streams.get(sid)
        if st is None:
            if sid <= self.last_stream:
                return  # trailers of a stream already gone (reset or answered): nothing to do
            self.last_stream = sid
            if self.draining:
                self.outbound += frame(RST_STREAM, 0, sid, _U32.pack(REFUSED_STREAM))
                return
            self._accepted = sid
            st = self.streams[sid] = _Stream(sid, self._initial)
            events.append(Opened(sid, headers))
        elif st.closed_remote or not flags & END_STREAM:  # more HEADERS after the end / trailers not ending it
            self._stream_error(sid, STREAM_CLOSED if st.closed_remote else PROTOCOL_ERROR, events)
            return
        if flags & END_STREAM:
            self._remote_end(sid, st, events)

    def _data(self, flags: int, sid: int, payload: bytes, events: list[Event]) -> None:
        size = len(payload)
        self._recv -= size
        if self._recv < 0:
            raise ProtocolError(FLOW_CONTROL_ERROR, "connection window exceeded")
        if flags & PADDED:
            payload = _unpad(payload)
        st = self.streams.get(sid)
        if st is None or st.closed_remote:
            self._stream_frame(sid)
            if st is not None:  # data after the client's END_STREAM
                self._stream_error(sid, STREAM_CLOSED, events)
            self._give_back(None, size)  # nobody reads it
            return
        st.recv -= size
        if st.recv < 0:
            raise ProtocolError(FLOW_CONTROL_ERROR, "stream window exceeded")
        if st.parts:
            st.parts.append(payload)
            st.have += len(payload)
            if st.have < st.need:
                self._give_back(st, size)
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
            events.append(Message(sid, buf[pos + 5:pos + 5 + n]))
            pos += 5 + n
        if pos < end:
            rest = buf[pos:]
            st.parts = [rest]
            st.have = len(rest)
            st.need = 5 + _MSG.unpack_from(rest)[1] if len(rest) >= 5 else 5
        # the whole messages (``pos`` bytes, partly from earlier frames whose bytes were given back as
        # they came) are given back when read: until then the windows owe them (``unacked`` < 0)
        self.unconsumed += pos
        self._give_back(st, size - pos)
        if flags & END_STREAM:
            self._remote_end(sid, st, events)

    def consumed(self, sid: int, length: int) -> bool:
        """The handler has read (or dropped) a message of ``length`` bytes from the stream: its bytes
        are given back to the client's windows.  True if that queued a WINDOW_UPDATE to send."""
        self.unconsumed -= 5 + length
        return self._give_back(self.streams.get(sid), 5 + length)

    def _give_back(self, st: _Stream | None, n: int) -> bool:
        unacked = self._unacked + n
        queued = unacked >= CONNECTION_WINDOW // 2
        if queued:
            self.outbound += frame(WINDOW_UPDATE, 0, 0, _U32.pack(unacked))
            self._recv += unacked
            unacked = 0
        self._unacked = unacked
        if st is not None:
            st.unacked += n
            if st.unacked >= STREAM_WINDOW // 2:
                queued = self._top_up(st) or queued
        return queued

    def _top_up(self, st: _Stream) -> bool:
        """Give the stream's window back once half of it is owed, unless the client leaves our replies
        on it unread (``HOLD``): then it sends no more requests on it until it takes them."""
        if st.unacked < STREAM_WINDOW // 2 or st.held > HOLD or st.closed_remote:
            return False
        self.outbound += frame(WINDOW_UPDATE, 0, st.sid, _U32.pack(st.unacked))
        st.recv += st.unacked
        st.unacked = 0
        return True

    def _remote_end(self, sid: int, st: _Stream, events: list[Event]) -> None:
        st.closed_remote = True
        events.append(Ended(sid))

    def _stream_error(self, sid: int, code: int, events: list[Event]) -> None:
        if self.reset(sid, code):
            events.append(Reset(sid))

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
            st.held += len(data)
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
                st.held -= len(chunk)
                self._window -= len(chunk)
                self.outbound += frame(DATA, 0, sid, chunk)
            if not st.pending:
                del self._blocked[sid]
            if sid in self.streams:
                self._top_up(st)
            if self._window <= 0:
                return

    def reset(self, sid: int, code: int = NO_ERROR) -> bool:
        """Abandon the stream with RST_STREAM; False if it was no longer open."""
        if not self._drop(sid):
            return False
        self.outbound += frame(RST_STREAM, 0, sid, _U32.pack(code))
        return True

    def _drop(self, sid: int) -> bool:
        self._blocked.pop(sid, None)
        return self.streams.pop(sid, None) is not None

    def goaway(self, code: int = NO_ERROR) -> None:
        """GOAWAY with the last stream taken (the open ones may still finish; later ones are refused);
        only the first call sends one, so a connection error's code is the one the client sees."""
        if not self._goaway_sent:
            self._goaway_sent = True
            self.draining = True
            self.outbound += frame(GOAWAY, 0, 0, _U32.pack(self._accepted) + _U32.pack(code))
