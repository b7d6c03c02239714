"""Conformance of the own HTTP/2 server (extproc/h2.py + extproc/grpc_server.py) against real peers.

The ``h2`` library is a client on a real socket (``grpc_peers.Peer``; raw frames where a test breaks the
protocol on purpose, which the library refuses to do) and every frame the server sends is checked: its
type, stream, error code and bytes.  grpcio's client (``grpc.aio``) makes real ext_proc calls on it.
Covered: GOAWAY both ways, RST_STREAM in every stream state, CONTINUATION, padding, SETTINGS changes
mid-connection, flow-control windows exhausted across concurrent streams and given back as handlers
read, oversized and malformed frames, a peer that stops reading."""
from __future__ import annotations

import asyncio
import struct
import threading
import time
from collections.abc import Iterator
from typing import Any, Callable

import grpc
import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from h2.settings import SettingCodes

from extproc import h2
from extproc.grpc_server import EOF, READ_BACKLOG, Call, _Protocol
from extproc.server import PROCESS_PATH
from grpc_peers import REQUEST_HEADERS, Peer, Running, body_msg, echo, reply_bodies

GATED = b"/test.Gated/Process"  # echo, but each read waits until the test opens the gate
METADATA = b"/test.Metadata/Process"  # answers each request with its x-big header's value


class Gate:
    def __init__(self) -> None:
        self.event = asyncio.Event()
        self.done: list[int] = []  # requests read

    async def handle(self, call: Call) -> None:
        while True:
            await self.event.wait()
            req = await call.read()
            if req is EOF:
                return
            self.done.append(len(req.request_body.body))
            call.write(_reply(req.request_body.body[::-1]))


def _reply(body: bytes) -> ep.ProcessingResponse:
    return ep.ProcessingResponse(request_body=ep.BodyResponse(response=ep.CommonResponse(
        body_mutation=ep.BodyMutation(body=body))))


async def metadata(call: Call) -> None:
    while (await call.read()) is not EOF:
        call.write(_reply((call.metadata("x-big") or "").encode()))


class Server(Running):
    def __init__(self) -> None:
        self.gate = Gate()
        parse = ep.ProcessingRequest.FromString
        super().__init__({PROCESS_PATH: (echo, parse), GATED: (self.gate.handle, parse), METADATA: (metadata, parse)})

    def open_gate(self) -> None:
        self.call(self.gate.event.set)

    def protocol(self, peer: Peer) -> _Protocol:
        """The server's side of the peer's connection."""
        name = peer.sock.getsockname()

        def find() -> _Protocol:
            return next(p for p in self.server._protocols
                        if p.transport is not None and p.transport.get_extra_info("peername") == name)
        return self.call(find)  # type: ignore[no-any-return]

    def wait(self, cond: Callable[[], bool], timeout: float = 10) -> None:
        deadline = time.monotonic() + timeout
        while not self.call(cond):
            assert time.monotonic() < deadline, "timed out"
            time.sleep(0.02)


@pytest.fixture()
def server() -> Iterator[Server]:
    s = Server()
    yield s
    s.stop()


@pytest.fixture()
def peers(server: Server) -> Iterator[Callable[..., Peer]]:
    made: list[Peer] = []

    def make(**kw: Any) -> Peer:
        made.append(Peer(server.port, **kw))
        return made[-1]
    yield make
    for p in made:
        p.close()


def _raw_headers(p: Peer, sid: int, flags: int = h2.END_HEADERS, path: bytes = PROCESS_PATH) -> bytes:
    """A HEADERS frame opening a call, its block from the library's own encoder (so the server's
    decoder and the library's stay in step)."""
    block = p.h2.encoder.encode([(k, path if k == b":path" else v) for k, v in REQUEST_HEADERS])
    p.new_sid(taken=sid)
    return h2.frame(h2.HEADERS, flags, sid, block)


def _msg_of(size: int, fill: bytes) -> bytes:
    """A framed request of exactly ``size`` bytes."""
    body = size - (len(body_msg(fill * (size - 20))) - (size - 20))
    msg = body_msg(fill * body)
    assert len(msg) == size
    return msg


def _reply_size(body: bytes) -> int:
    return 5 + len(_reply(body).SerializeToString())


def _settings(ident: int, value: int) -> bytes:
    return h2.frame(h2.SETTINGS, 0, 0, struct.pack(">HL", ident, value))


def _u32(n: int) -> bytes:
    return struct.pack(">L", n)


def _assert_connection_error(p: Peer, last: int, code: int) -> None:
    """Exactly one GOAWAY, with this code and last stream, then the connection closed."""
    p.until_closed()
    assert p.goaways() == [(last, code)]
    assert p.frames[-1][0] == h2.GOAWAY


# ---- GOAWAY --------------------------------------------------------------------------------------
def test_goaway_from_the_client_lets_open_calls_finish_refuses_new_ones_then_closes(
        server: Server, peers: Callable[..., Peer]) -> None:
    p = peers()
    sids = [p.open(body_msg(b"first-%d" % i)) for i in range(3)]
    p.until(lambda: all(p.data(s) for s in sids))
    p.h2.close_connection()  # GOAWAY(NO_ERROR) from the client, its streams 1, 3, 5 still open
    p.flush()
    p.raw(_raw_headers(p, 7) + h2.frame(h2.DATA, h2.END_STREAM, 7, body_msg(b"late")))
    for s in sids:  # (raw: the library sends nothing after its own GOAWAY)
        p.raw(h2.frame(h2.DATA, h2.END_STREAM, s, body_msg(b"second-%d" % s)))
    p.until_closed()
    for i, s in enumerate(sids):
        assert reply_bodies(p.data(s)) == [(b"first-%d" % i)[::-1], (b"second-%d" % s)[::-1]]
        trailers = [f for f in p.of(h2.HEADERS, s) if f[1] & h2.END_STREAM]
        assert len(trailers) == 1 and trailers[0][3] == h2.OK_TRAILERS
    assert p.resets() == [(7, h2.REFUSED_STREAM)]  # the stream opened after the GOAWAY
    assert not p.of(h2.DATA, 7)
    assert p.goaways() == [(5, h2.NO_ERROR)]  # one, once the open calls were done, naming the last taken
    assert p.frames[-1][0] == h2.GOAWAY


def test_server_stop_sends_one_goaway_and_finishes_the_calls_under_way(server: Server,
                                                                        peers: Callable[..., Peer]) -> None:
    p = peers()
    sids = [p.open(body_msg(b"a%d" % i)) for i in range(2)]
    p.until(lambda: all(p.data(s) for s in sids))
    stopped = asyncio.run_coroutine_threadsafe(server.server.stop(10), server.loop)
    p.until(lambda: bool(p.goaways()))
    assert p.goaways() == [(3, h2.NO_ERROR)]
    p.raw(_raw_headers(p, 5, h2.END_HEADERS | h2.END_STREAM))  # a call after the GOAWAY is refused
    for s in sids:
        p.raw(h2.frame(h2.DATA, h2.END_STREAM, s, body_msg(b"b%d" % s)))
    p.until_closed()
    stopped.result(5)
    for i, s in enumerate(sids):
        assert reply_bodies(p.data(s)) == [b"%d" % i + b"a", (b"b%d" % s)[::-1]]
        assert p.ended(s)
    assert p.resets() == [(5, h2.REFUSED_STREAM)]
    assert p.goaways() == [(3, h2.NO_ERROR)]


def test_a_protocol_error_sends_one_goaway_with_its_code_not_a_second_no_error(
        server: Server, peers: Callable[..., Peer]) -> None:
    p = peers()
    sid = p.open(body_msg(b"x"))
    p.until(lambda: bool(p.data(sid)))
    p.raw(h2.frame(h2.WINDOW_UPDATE, 0, 0, _u32(0)))  # an increment of 0 on the connection
    _assert_connection_error(p, sid, h2.PROTOCOL_ERROR)


# ---- RST_STREAM in every stream state --------------------------------------------------------------
@pytest.mark.parametrize("sid", [7, 4, 0], ids=["idle-odd", "idle-even", "stream-0"])
def test_rst_stream_on_an_idle_stream_is_a_connection_error(server: Server, peers: Callable[..., Peer],
                                                             sid: int) -> None:
    p = peers()
    done = p.open(body_msg(b"x"), end=True)
    p.until(lambda: p.ended(done))
    p.raw(h2.frame(h2.RST_STREAM, 0, sid, _u32(h2.NO_ERROR)))
    _assert_connection_error(p, 1, h2.PROTOCOL_ERROR)


def _calls(server: Server) -> int:
    return server.call(lambda: len(server.server.calls))  # type: ignore[no-any-return]


def _still_serves(p: Peer) -> None:
    sid = p.new_sid()
    p.raw(_raw_headers(p, sid) + h2.frame(h2.DATA, h2.END_STREAM, sid, body_msg(b"after")))
    p.until(lambda: p.ended(sid))
    assert reply_bodies(p.data(sid)) == [b"retfa"]
    assert not p.goaways()


def test_rst_stream_on_an_open_stream_ends_its_call_and_nothing_more_is_sent_on_it(
        server: Server, peers: Callable[..., Peer]) -> None:
    p = peers()
    sid = p.open(body_msg(b"one"))
    p.until(lambda: bool(p.data(sid)))
    p.h2.reset_stream(sid, 8)  # CANCEL
    p.flush()
    server.wait(lambda: not server.server.calls)  # the handler read EOF and returned
    p.settle()
    assert [f[0] for f in p.frames if f[2] == sid] == [h2.HEADERS, h2.DATA]  # no trailers, no reset back
    _still_serves(p)


def test_rst_stream_on_a_half_closed_stream_drops_the_answer(server: Server, peers: Callable[..., Peer]) -> None:
    p = peers()
    sid = p.open(body_msg(b"unanswered"), end=True, headers=[(k, GATED if k == b":path" else v)
                                                              for k, v in REQUEST_HEADERS])
    p.settle()  # the server has the whole request; its handler waits at the gate
    p.h2.reset_stream(sid, 8)
    p.flush()
    p.settle()
    server.open_gate()  # the handler reads the request (the call ended) and writes an answer
    server.wait(lambda: not server.server.calls)
    assert server.gate.done == [len(b"unanswered")]
    p.settle()
    assert [f for f in p.frames if f[2] == sid] == []  # not headers, data, trailers or a reset
    _still_serves(p)


def test_rst_stream_on_a_closed_stream_is_ignored(server: Server, peers: Callable[..., Peer]) -> None:
    p = peers()
    sid = p.open(body_msg(b"done"), end=True)
    p.until(lambda: p.ended(sid))
    p.raw(h2.frame(h2.RST_STREAM, 0, sid, _u32(8)))
    p.settle()
    assert not p.resets() and not p.goaways()
    _still_serves(p)


# ---- CONTINUATION ----------------------------------------------------------------------------------
def test_a_header_block_in_continuation_frames_is_read_whole(server: Server, peers: Callable[..., Peer]) -> None:
    p = peers()
    big = "v" * 40_000
    block = p.h2.encoder.encode([(k, METADATA if k == b":path" else v) for k, v in REQUEST_HEADERS]
                                + [(b"x-big", big.encode())])
    p.raw(h2.frame(h2.HEADERS, 0, 1, block[:100]) + h2.frame(h2.CONTINUATION, 0, 1, block[100:20_000])
          + h2.frame(h2.CONTINUATION, h2.END_HEADERS, 1, block[20_000:])
          + h2.frame(h2.DATA, h2.END_STREAM, 1, body_msg(b"")))
    p.until(lambda: p.ended(1))
    assert reply_bodies(p.data(1)) == [big.encode()]


@pytest.mark.parametrize("after_headers", [
    h2.frame(h2.PING, 0, 0, b"12345678"),  # another frame inside the block
    h2.frame(h2.CONTINUATION, h2.END_HEADERS, 3, b""),  # the block's end on another stream
    h2.frame(h2.DATA, 0, 1, body_msg(b"x")),
], ids=["ping", "other-stream", "data"])
def test_a_header_block_interrupted_is_a_protocol_error(server: Server, peers: Callable[..., Peer],
                                                         after_headers: bytes) -> None:
    p = peers()
    p.raw(_raw_headers(p, 1, flags=0) + after_headers)
    _assert_connection_error(p, 0, h2.PROTOCOL_ERROR)


def test_continuation_without_headers_is_a_protocol_error(server: Server, peers: Callable[..., Peer]) -> None:
    p = peers()
    p.raw(h2.frame(h2.CONTINUATION, h2.END_HEADERS, 1, b"\x88"))
    _assert_connection_error(p, 0, h2.PROTOCOL_ERROR)


def test_an_endless_header_block_is_cut_off(server: Server, peers: Callable[..., Peer]) -> None:
    p = peers()
    first = _raw_headers(p, 1, flags=0)
    p.raw(first)
    for _ in range((h2.MAX_HEADER_BLOCK - (len(first) - 9)) // 16_384 + 1):  # the last one crosses the line
        p.raw(h2.frame(h2.CONTINUATION, 0, 1, b"\x00" * 16_384))
    _assert_connection_error(p, 0, h2.ENHANCE_YOUR_CALM)
    q = peers()  # and in one HEADERS frame
    q.raw(h2.frame(h2.HEADERS, h2.END_HEADERS, 1, b"\x00" * (h2.MAX_HEADER_BLOCK + 1)))
    _assert_connection_error(q, 0, h2.ENHANCE_YOUR_CALM)


# ---- padding -----------------------------------------------------------------------------------------
def test_padded_data_and_headers(server: Server, peers: Callable[..., Peer]) -> None:
    p = peers(wide_open=True)
    sid = p.h2.get_next_available_stream_id()
    p.h2.send_headers(sid, REQUEST_HEADERS)
    bodies = [b"p%d" % i * (i * 50) for i in range(40)]
    for i, b in enumerate(bodies):
        p.h2.send_data(sid, body_msg(b), pad_length=i * 6, end_stream=i == len(bodies) - 1)
    p.flush()
    p.until(lambda: p.ended(sid))
    assert reply_bodies(p.data(sid)) == [b[::-1] for b in bodies]
    # HEADERS padded and with a priority, raw (the library pads DATA only); its data frame padded too
    block = p.h2.encoder.encode(REQUEST_HEADERS)
    p.raw(h2.frame(h2.HEADERS, h2.END_HEADERS | h2.PADDED | h2.PRIORITY_FLAG, 3,
                   bytes((9,)) + _u32(0) + b"\x10" + block + b"\0" * 9)
          + h2.frame(h2.DATA, h2.END_STREAM | h2.PADDED, 3, b"\xff" + body_msg(b"padded") + b"\0" * 255))
    p.until(lambda: p.ended(3))
    assert reply_bodies(p.data(3)) == [b"deddap"]


@pytest.mark.parametrize("kind", [h2.DATA, h2.HEADERS])
def test_padding_as_long_as_the_frame_is_a_protocol_error(server: Server, peers: Callable[..., Peer],
                                                          kind: int) -> None:
    p = peers()
    if kind == h2.DATA:
        sid = p.open(body_msg(b"x"))
        p.until(lambda: bool(p.data(sid)))
        p.raw(h2.frame(h2.DATA, h2.PADDED, sid, b"\x05abcd"))
        _assert_connection_error(p, sid, h2.PROTOCOL_ERROR)
    else:
        p.raw(h2.frame(h2.HEADERS, h2.END_HEADERS | h2.PADDED, 1, b"\x09" + b"\x88" * 8))
        _assert_connection_error(p, 0, h2.PROTOCOL_ERROR)


# ---- SETTINGS mid-connection -------------------------------------------------------------------------
def _new_data(p: Peer, sid: int, before: int) -> int:
    p.settle()
    return len(p.data(sid)) - before


def test_initial_window_cut_below_what_was_sent_then_raised(server: Server, peers: Callable[..., Peer]) -> None:
    """(In raw frames: the h2 library does not take a window below 0.)"""
    p = peers()  # the client's windows: 65,535 per stream and for the connection
    p.raw(h2.frame(h2.WINDOW_UPDATE, 0, 0, _u32(10**6)))
    sid = 1
    p.raw(_raw_headers(p, sid) + h2.frame(h2.DATA, 0, sid, body_msg(b"a" * 60_000)))
    p.until(lambda: len(p.data(sid)) == _reply_size(b"a" * 60_000))
    first = len(p.data(sid))
    p.raw(_settings(h2.INITIAL_WINDOW_SIZE, 1000))  # the stream's window: 1000 - first < 0
    p.raw(h2.frame(h2.DATA, 0, sid, body_msg(b"b" * 2000)))
    assert _new_data(p, sid, first) == 0  # a negative window: nothing
    p.raw(h2.frame(h2.WINDOW_UPDATE, 0, sid, _u32(first - 1000 + 500)))  # window 500
    assert _new_data(p, sid, first) == 500  # exactly the window
    p.raw(_settings(h2.INITIAL_WINDOW_SIZE, 65_535))  # +64,535: room for the rest
    p.raw(h2.frame(h2.DATA, h2.END_STREAM, sid, b""))
    p.until(lambda: p.ended(sid))
    assert reply_bodies(p.data(sid)) == [b"a" * 60_000, b"b" * 2000]
    assert sum(len(f[3]) for f in p.of(h2.DATA, sid)) == first + _reply_size(b"b" * 2000)


def test_max_frame_size_raised_then_lowered(server: Server, peers: Callable[..., Peer]) -> None:
    p = peers(settings={SettingCodes.MAX_FRAME_SIZE: 20_000}, wide_open=True)
    sid = p.open(body_msg(b"m" * 100_000))
    p.until(lambda: len(p.data(sid)) == _reply_size(b"m" * 100_000))
    assert max(len(f[3]) for f in p.of(h2.DATA, sid)) == 20_000
    p.h2.update_settings({SettingCodes.MAX_FRAME_SIZE: 16_384})
    p.flush()
    p.settle()
    before = len(p.of(h2.DATA, sid))
    p.h2.send_data(sid, body_msg(b"n" * 100_000), end_stream=True)
    p.flush()
    p.until(lambda: p.ended(sid))
    assert max(len(f[3]) for f in p.of(h2.DATA, sid)[before:]) == 16_384
    assert reply_bodies(p.data(sid)) == [b"m" * 100_000, b"n" * 100_000]
    assert p.following


@pytest.mark.parametrize("payload,code", [
    (struct.pack(">HL", h2.MAX_FRAME_SIZE, 1000), h2.PROTOCOL_ERROR),
    (struct.pack(">HL", h2.MAX_FRAME_SIZE, 2**24), h2.PROTOCOL_ERROR),
    (struct.pack(">HL", h2.INITIAL_WINDOW_SIZE, 2**31), h2.FLOW_CONTROL_ERROR),
    (struct.pack(">HL", h2.ENABLE_PUSH, 2), h2.PROTOCOL_ERROR),
    (b"\x00\x04\x00\x00\x10", h2.FRAME_SIZE_ERROR),  # not a multiple of 6 bytes
], ids=["frame-small", "frame-large", "window-large", "push", "length"])
def test_bad_settings_are_connection_errors(server: Server, peers: Callable[..., Peer], payload: bytes,
                                            code: int) -> None:
    p = peers()
    p.raw(h2.frame(h2.SETTINGS, 0, 0, payload))
    _assert_connection_error(p, 0, code)


def test_window_raised_past_the_maximum_by_settings_is_a_flow_control_error(
        server: Server, peers: Callable[..., Peer]) -> None:
    p = peers()
    sid = p.open(body_msg(b"x"))
    p.until(lambda: bool(p.data(sid)))
    p.raw(h2.frame(h2.WINDOW_UPDATE, 0, sid, _u32(2**31 - 1 - 65_535 + len(p.data(sid)))))  # at the max
    p.raw(h2.frame(h2.SETTINGS, 0, 0, struct.pack(">HL", h2.INITIAL_WINDOW_SIZE, 65_536)))  # one past it
    _assert_connection_error(p, sid, h2.FLOW_CONTROL_ERROR)


# ---- flow control across streams ---------------------------------------------------------------------
def test_the_connection_window_is_shared_by_concurrent_streams_and_reopens(
        server: Server, peers: Callable[..., Peer]) -> None:
    p = peers()  # 65,535 for the whole connection, never given back until the test says
    sids = [p.open(body_msg(bytes([65 + i]) * 30_000), end=True) for i in range(8)]
    size = _reply_size(b"A" * 30_000)
    p.until(lambda: sum(len(p.data(s)) for s in sids) >= 65_535)
    p.settle()
    sent = {s: len(p.data(s)) for s in sids}
    assert sum(sent.values()) == 65_535  # to the byte, spread over the streams
    assert sum(1 for n in sent.values() if n) >= 3 and not any(p.ended(s) for s in sids if sent[s] < size)
    p.h2.increment_flow_control_window(8 * size)
    p.flush()
    p.until(lambda: all(p.ended(s) for s in sids))
    for i, s in enumerate(sids):
        assert reply_bodies(p.data(s)) == [bytes([65 + i]) * 30_000]
    assert p.following


def test_a_client_overrunning_the_stream_window_is_a_flow_control_error(
        server: Server, peers: Callable[..., Peer]) -> None:
    p = peers()
    p.raw(_raw_headers(p, 1, path=GATED))  # nobody reads: the stream's window is not given back
    msg = _msg_of(2**18, b"z")  # four whole messages fill the 1 MiB window exactly
    p.raw(b"".join(h2.frame(h2.DATA, 0, 1, msg) for _ in range(4)))
    p.settle()
    assert not p.goaways() and not p.of(h2.WINDOW_UPDATE, 1)
    p.raw(h2.frame(h2.DATA, 0, 1, b"\0"))
    _assert_connection_error(p, 1, h2.FLOW_CONTROL_ERROR)


def test_windows_are_given_back_as_handlers_read_and_reading_stops_while_they_lag(
        server: Server, peers: Callable[..., Peer]) -> None:
    p = peers(wide_open=True)
    msg = _msg_of(2**17, b"q")  # 8 messages fill a stream's 1 MiB
    headers = [(k, GATED if k == b":path" else v) for k, v in REQUEST_HEADERS]
    sids = [p.open(*[msg] * 8, headers=headers) for _ in range(5)]  # 5 MiB, handlers not reading
    assert all(p.h2.local_flow_control_window(s) == 0 for s in sids)  # the library used up every window
    proto = server.protocol(p)
    server.wait(lambda: proto.read_paused)  # more than READ_BACKLOG waits for the handlers: reading stops
    assert READ_BACKLOG < server.call(lambda: proto.conn.unconsumed) <= READ_BACKLOG + h2.OUR_MAX_FRAME
    server.open_gate()
    p.until(lambda: all(len(reply_bodies(p.data(s))) == 8 for s in sids))
    # what the handlers read went back to the client: each stream's window, and the connection's
    for s in sids:
        assert sum(struct.unpack(">L", f[3])[0] for f in p.of(h2.WINDOW_UPDATE, s)) >= h2.STREAM_WINDOW // 2
    conn_updates = [struct.unpack(">L", f[3])[0] for f in p.of(h2.WINDOW_UPDATE, 0)]
    assert conn_updates[0] == h2.CONNECTION_WINDOW - 65_535 and len(conn_updates) == 1  # 5 MiB < half of 16
    assert server.call(lambda: (proto.read_paused, proto.conn.unconsumed)) == (False, 0)
    for s in sids:  # and the streams go on
        p.h2.send_data(s, body_msg(b"more"), end_stream=True)
    p.flush()
    p.until(lambda: all(p.ended(s) for s in sids))
    assert all(reply_bodies(p.data(s))[-1] == b"erom" for s in sids)


# ---- oversized and malformed frames --------------------------------------------------------------------
@pytest.mark.parametrize("bad", [
    struct.pack(">L", h2.OUR_MAX_FRAME + 1)[1:] + bytes((h2.DATA, 0)) + _u32(1) + b"x" * 1000,
    h2.frame(h2.PING, 0, 0, b"1234567"),
    h2.frame(h2.WINDOW_UPDATE, 0, 0, b"\0\0\1"),
    h2.frame(h2.SETTINGS, h2.ACK, 0, struct.pack(">HL", h2.MAX_FRAME_SIZE, 20_000)),
    h2.frame(h2.RST_STREAM, 0, 1, b"\0\0\0\0\0"),
    h2.frame(h2.GOAWAY, 0, 0, b"\0\0\0\1"),
], ids=["larger-than-max-frame-size", "ping", "window-update", "settings-ack", "rst-stream", "goaway"])
def test_frames_of_the_wrong_size_are_frame_size_errors(server: Server, peers: Callable[..., Peer],
                                                        bad: bytes) -> None:
    p = peers()
    sid = p.open(body_msg(b"x"))
    p.until(lambda: bool(p.data(sid)))
    p.raw(bad)
    _assert_connection_error(p, sid, h2.FRAME_SIZE_ERROR)


def test_data_on_an_idle_stream_and_headers_on_a_server_stream_are_protocol_errors(
        server: Server, peers: Callable[..., Peer]) -> None:
    p = peers()
    p.raw(h2.frame(h2.DATA, 0, 9, body_msg(b"x")))
    _assert_connection_error(p, 0, h2.PROTOCOL_ERROR)
    q = peers()
    q.raw(_raw_headers(q, 2))
    _assert_connection_error(q, 0, h2.PROTOCOL_ERROR)


def test_data_after_the_clients_end_resets_that_stream_only(server: Server, peers: Callable[..., Peer]) -> None:
    p = peers()
    p.raw(_raw_headers(p, 1, path=GATED) + h2.frame(h2.DATA, h2.END_STREAM, 1, body_msg(b"x"))
          + h2.frame(h2.DATA, 0, 1, body_msg(b"y")))
    p.settle()
    assert p.resets() == [(1, h2.STREAM_CLOSED)] and not p.goaways()
    _still_serves(p)


# ---- a peer that stops reading ---------------------------------------------------------------------------
@pytest.mark.alone  # the server's memory read while it relays at full speed: no other worker's test meanwhile
def test_a_peer_that_stops_reading_holds_its_handlers_not_the_servers_memory(
        server: Server, peers: Callable[..., Peer]) -> None:
    p = peers(wide_open=True, rcvbuf=32 * 1024)
    p.settle()  # the server's windows (16 MiB for the connection) are known to the library
    msg = _msg_of(2**17, b"r")
    sids = [p.new_sid() for _ in range(15)]
    for s in sids:
        p.h2.send_headers(s, REQUEST_HEADERS)
        for _ in range(8):
            p.h2.send_data(s, msg)  # 15 MiB asked for, 15 MiB of answers
    p.sock.settimeout(30)
    sender = threading.Thread(target=p.flush)  # the server stops reading too, so this may block a while
    sender.start()
    proto = server.protocol(p)
    server.wait(lambda: proto.write_paused)
    time.sleep(0.5)
    buffered = server.call(lambda: proto.transport.get_write_buffer_size())  # type: ignore[union-attr]
    assert buffered <= 15 * len(msg) // 4, buffered  # the answers are not all queued up in the server
    # because the handlers wait to read until the client takes what was written, and the socket is
    # not read meanwhile
    assert server.call(lambda: (proto.write_paused, proto.read_paused, bool(proto._writable))) == (True, True, True)
    # another connection is served meanwhile, by grpcio's client
    assert asyncio.run(_grpcio_echo(server.port, [b"other"])) == [b"rehto"]
    # the peer reads again: every answer arrives, whole and in order
    got = 0
    while got < len(sids) * 8 * len(msg):
        data = p.sock.recv(1 << 20)
        assert data
        p.take(data)
        got = sum(len(p.data(s)) for s in sids)
    sender.join(10)
    body = ep.ProcessingRequest.FromString(msg[5:]).request_body.body
    assert all(reply_bodies(p.data(s)) == [body[::-1]] * 8 for s in sids)


# ---- grpcio's client ---------------------------------------------------------------------------------------
def _stub(ch: grpc.aio.Channel) -> Any:
    return ch.stream_stream(PROCESS_PATH.decode(), request_serializer=ep.ProcessingRequest.SerializeToString,
                            response_deserializer=ep.ProcessingResponse.FromString)


async def _grpcio_echo(port: int, bodies: list[bytes]) -> list[bytes]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        call = _stub(ch)(iter(ep.ProcessingRequest(request_body=ep.HttpBody(body=b)) for b in bodies), timeout=10)
        return [r.request_body.response.body_mutation.body async for r in call]


def test_grpcio_many_concurrent_calls_through_small_windows(server: Server) -> None:
    async def main() -> list[list[bytes]]:
        # no BDP probing: grpcio keeps its 64 KiB windows, which 24 calls of 3 x 100 KB overrun many times
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}", options=[("grpc.http2.bdp_probe", 0)]) as ch:
            async def one(i: int) -> list[bytes]:
                bodies = [bytes([i]) * 100_000, bytes([i + 1]) * 100_000, b"end-%d" % i]
                call = _stub(ch)(iter(ep.ProcessingRequest(request_body=ep.HttpBody(body=b)) for b in bodies),
                                 timeout=30)
                return [r.request_body.response.body_mutation.body async for r in call]
            return await asyncio.gather(*(one(i) for i in range(24)))
    got = asyncio.run(main())
    assert got == [[bytes([i]) * 100_000, bytes([i + 1]) * 100_000, (b"end-%d" % i)[::-1]] for i in range(24)]


def test_grpcio_calls_under_way_finish_when_the_server_stops(server: Server) -> None:
    async def main() -> tuple[list[Any], Any]:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
            calls = [_stub(ch)(timeout=10) for _ in range(4)]
            for i, c in enumerate(calls):
                await c.write(ep.ProcessingRequest(request_body=ep.HttpBody(body=b"one-%d" % i)))
                assert (await c.read()).request_body.response.body_mutation.body == (b"one-%d" % i)[::-1]
            stopping = asyncio.wrap_future(asyncio.run_coroutine_threadsafe(server.server.stop(10), server.loop))
            await asyncio.sleep(0.2)  # the GOAWAY is out
            out = []
            for i, c in enumerate(calls):
                await c.write(ep.ProcessingRequest(request_body=ep.HttpBody(body=b"two-%d" % i)))
                out.append((await c.read()).request_body.response.body_mutation.body)
                await c.done_writing()
                out.append(await c.code())
            await stopping
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await _stub(ch)(iter([ep.ProcessingRequest()]), timeout=2).read()
            return out, e.value.code()
    out, refused = asyncio.run(main())
    assert out == [x for i in range(4) for x in ((b"two-%d" % i)[::-1], grpc.StatusCode.OK)]
    assert refused == grpc.StatusCode.UNAVAILABLE


def test_grpcio_channel_closed_mid_calls_ends_them_on_the_server(server: Server) -> None:
    async def main() -> None:
        ch = grpc.aio.insecure_channel(f"127.0.0.1:{server.port}")
        calls = [_stub(ch)(timeout=10) for _ in range(3)]
        for c in calls:
            await c.write(ep.ProcessingRequest(request_body=ep.HttpBody(body=b"x")))
            await c.read()
        assert _calls(server) == 3
        await ch.close()  # cancels the calls and goes away
    asyncio.run(main())
    server.wait(lambda: not server.server.calls and not server.server._protocols)
