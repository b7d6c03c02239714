"""The ext_proc's own gRPC server (extproc/h2.py, extproc/grpc_server.py).

The connection is tested sans-I/O with hand-made frames (flow control, split frames, resets); the
server is tested with grpcio's own client, the other HTTP/2 + gRPC implementation the gateway meets
(``gateway status`` and the Kubernetes probe use it; Envoy's client is exercised by every e2e test)."""
from __future__ import annotations

import asyncio
import socket
import struct
import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hpack import Encoder

from extproc import h2
from extproc.grpc_server import EOF, FROZEN_S, Call
from extproc.server import PROCESS_PATH
from conftest import wait_for
from grpc_peers import REQUEST_HEADERS, Peer, Running, body_msg, echo, frames, grpc_msg, reply_bodies


# ---- sans-I/O ----------------------------------------------------------------------------------
def settings(**values: int) -> bytes:
    ids = {"window": h2.INITIAL_WINDOW_SIZE, "frame": h2.MAX_FRAME_SIZE}
    return h2.frame(h2.SETTINGS, 0, 0, b"".join(struct.pack(">HL", ids[k], v) for k, v in values.items()))


def open_stream(enc: Encoder, sid: int, path: bytes = PROCESS_PATH, end: bool = False) -> bytes:
    block = enc.encode([(b":method", b"POST"), (b":scheme", b"http"), (b":path", path),
                        (b":authority", b"extproc"), (b"content-type", b"application/grpc"), (b"te", b"trailers")])
    return h2.frame(h2.HEADERS, h2.END_HEADERS | (h2.END_STREAM if end else 0), sid, block)


def test_handshake_settings_ack_and_ping() -> None:
    c = h2.Connection()
    first = frames(c.data_to_send())
    assert [f[0] for f in first] == [h2.SETTINGS, h2.WINDOW_UPDATE]
    assert first[0][3] == struct.pack(">HLHL", h2.INITIAL_WINDOW_SIZE, h2.STREAM_WINDOW, h2.MAX_FRAME_SIZE,
                                      h2.OUR_MAX_FRAME)
    assert struct.unpack(">L", first[1][3])[0] == h2.CONNECTION_WINDOW - 65535  # the connection window opened
    assert c.receive(h2.PREFACE + settings(window=1000) + h2.frame(h2.PING, 0, 0, b"12345678")) == []
    out = frames(c.data_to_send())
    assert out == [(h2.SETTINGS, h2.ACK, 0, b""), (h2.PING, h2.ACK, 0, b"12345678")]


def test_not_http2_is_refused() -> None:
    with pytest.raises(h2.ProtocolError):
        h2.Connection().receive(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")


def test_header_blocks_decode_as_a_fresh_decoder_would_while_the_table_changes() -> None:
    """Blocks seen before are taken from a cache; a block that refers to the dynamic table must still
    mean what the table says now (the cache is dropped whenever a block changes the table)."""
    from hpack import Decoder
    c, enc, ref = h2.Connection(), Encoder(), Decoder()
    lists = [[(b":path", PROCESS_PATH), (b"x-a", b"1")], [(b":path", PROCESS_PATH), (b"x-a", b"1")],
             [(b":path", PROCESS_PATH), (b"x-b", b"2")], [(b":path", PROCESS_PATH), (b"x-a", b"1")]]
    wire, want = [h2.PREFACE], []
    sid = 1
    for i in range(40):
        fields = lists[i % 4] if i % 7 else [(b":path", PROCESS_PATH), (b"x-n", str(i).encode())]
        block = enc.encode(fields, huffman=bool(i % 2))
        # the same bytes again, and a literal never-indexed block (Envoy's kind), twice
        literal = enc.encode([(b":path", PROCESS_PATH), (b"x-c", b"3", True)])
        for b in (block, block, literal, literal):
            wire.append(h2.frame(h2.HEADERS, h2.END_HEADERS | h2.END_STREAM, sid, b))
            want.append([(bytes(k), bytes(v)) for k, v in ref.decode(b, raw=True)])
            sid += 2
    # the sharpest case: the very same indexed bytes, sent again after the table moved under them
    indexed = enc.encode([(b":path", PROCESS_PATH), (b"x-a", b"1")])
    moved = enc.encode([(b":path", PROCESS_PATH), (b"x-z", b"9")])
    for b in (indexed, indexed, moved, indexed):
        wire.append(h2.frame(h2.HEADERS, h2.END_HEADERS | h2.END_STREAM, sid, b))
        want.append([(bytes(k), bytes(v)) for k, v in ref.decode(b, raw=True)])
        sid += 2
    assert want[-1] != want[-3]  # the same bytes now mean another field
    got = [[(bytes(k), bytes(v)) for k, v in e.headers] for e in c.receive(b"".join(wire))
           if isinstance(e, h2.Opened)]
    assert got == want and len(got) == 164
    # the indexed block was cached, yet decoded right after each change of the table
    assert 0 < len(c._seen) <= 32


def test_messages_cut_anywhere_arrive_whole_and_in_order() -> None:
    c, enc = h2.Connection(), Encoder()
    big = bytes(range(256)) * 400  # ~100 KB, in 7 frames cut at odd places
    wire = (h2.PREFACE + open_stream(enc, 1) + h2.frame(h2.DATA, 0, 1, grpc_msg(b"one") + grpc_msg(big)[:3])
            + b"".join(h2.frame(h2.DATA, 0, 1, p) for p in _cut(grpc_msg(big)[3:], 16381))
            + h2.frame(h2.DATA, h2.END_STREAM, 1, grpc_msg(b"")))
    events: list[h2.Event] = []
    for i in range(0, len(wire), 777):  # and the bytes themselves arrive in 777-byte reads
        events += c.receive(wire[i:i + 777])
    assert [(type(e), e.sid) for e in events] == [(h2.Opened, 1), (h2.Message, 1), (h2.Message, 1), (h2.Message, 1),
                                                  (h2.Ended, 1)]
    assert isinstance(events[0], h2.Opened) and dict(events[0].headers)[b":path"] == PROCESS_PATH
    assert events[1:4] == [h2.Message(1, b"one"), h2.Message(1, big), h2.Message(1, b"")]


def _cut(data: bytes, n: int) -> Iterator[bytes]:
    for i in range(0, len(data), n):
        yield data[i:i + n]


def test_replies_wait_for_the_window_and_frame_size() -> None:
    c, enc = h2.Connection(), Encoder()
    c.receive(h2.PREFACE + settings(window=10, frame=16384) + open_stream(enc, 1, end=True))
    c.data_to_send()
    c.send_message(1, b"x" * 20)  # 25 bytes framed: only 10 fit the stream's window
    c.end_stream(1)
    out = frames(c.data_to_send())
    assert [(k, f) for k, f, _, _ in out] == [(h2.HEADERS, h2.END_HEADERS), (h2.DATA, 0)]
    assert len(out[1][3]) == 10
    c.receive(h2.frame(h2.WINDOW_UPDATE, 0, 1, struct.pack(">L", 100)))
    out = frames(c.data_to_send())
    # the rest of the message, then the trailers (held behind it), ending the stream
    assert [(k, f) for k, f, _, _ in out] == [(h2.DATA, 0), (h2.HEADERS, h2.END_HEADERS | h2.END_STREAM)]
    assert len(out[0][3]) == 15 and out[1][3] == h2.OK_TRAILERS
    assert c.streams == {}


def test_large_reply_is_cut_to_the_clients_frame_size() -> None:
    c, enc = h2.Connection(), Encoder()
    c.receive(h2.PREFACE + settings(window=10**6, frame=16384) + open_stream(enc, 1, end=True))
    c.receive(h2.frame(h2.WINDOW_UPDATE, 0, 0, struct.pack(">L", 10**6)))  # connection window: 65535 + 1e6
    c.data_to_send()
    payload = b"y" * 100_000
    c.send_message(1, payload)
    c.end_stream(1)
    out = frames(c.data_to_send())
    data = [p for k, _, _, p in out if k == h2.DATA]
    assert max(map(len, data)) == 16384 and b"".join(data) == grpc_msg(payload)
    assert out[-1][0] == h2.HEADERS and out[-1][1] & h2.END_STREAM


def _window_updates(out: list[tuple[int, int, int, bytes]]) -> dict[int, int]:
    got: dict[int, int] = {}
    for k, _, sid, p in out:
        if k == h2.WINDOW_UPDATE:
            got[sid] = got.get(sid, 0) + struct.unpack(">L", p)[0]
    return got


def _held_and_filled() -> h2.Connection:
    """A stream with more than HOLD of replies held back by its shut window, whose 1 MiB the client
    then filled with requests, all read by the handler."""
    c, enc = h2.Connection(), Encoder()
    c.receive(h2.PREFACE + settings(window=0) + open_stream(enc, 1))
    c.send_message(1, b"r" * (h2.HOLD + 1))
    msg = grpc_msg(b"q" * (2**16 - 5))
    for _ in range(h2.STREAM_WINDOW // len(msg)):
        for e in c.receive(h2.frame(h2.DATA, 0, 1, msg)):
            assert isinstance(e, h2.Message) and e.sid == 1
            c.consumed(1, len(e.data))
    assert c.unconsumed == 0
    return c


def test_a_stream_whose_replies_the_client_leaves_unread_gets_no_more_window() -> None:
    """What the handler reads is not given back to the stream's window while the client leaves the
    replies unread; once it takes them, it is."""
    c = _held_and_filled()
    out = frames(c.data_to_send())
    assert _window_updates(out) == {0: h2.CONNECTION_WINDOW - 65535}  # (the opening one) and no other
    with pytest.raises(h2.ProtocolError) as e:  # the stream's window is spent
        c.receive(h2.frame(h2.DATA, 0, 1, grpc_msg(b"")))
    assert e.value.code == h2.FLOW_CONTROL_ERROR
    c = _held_and_filled()
    c.data_to_send()
    c.receive(h2.frame(h2.WINDOW_UPDATE, 0, 0, struct.pack(">L", 2**21))
              + h2.frame(h2.WINDOW_UPDATE, 0, 1, struct.pack(">L", 2**21)))
    out = frames(c.data_to_send())
    assert sum(len(p) for k, _, _, p in out if k == h2.DATA) == h2.HOLD + 6  # the reply went out
    assert _window_updates(out) == {1: h2.STREAM_WINDOW}  # and the stream's window came back whole


def test_reset_stream_ends_the_call_and_drops_its_replies() -> None:
    c, enc = h2.Connection(), Encoder()
    c.receive(h2.PREFACE + open_stream(enc, 1))
    c.data_to_send()
    assert c.receive(h2.frame(h2.RST_STREAM, 0, 1, struct.pack(">L", 8))) == [h2.Reset(1)]
    c.send_message(1, b"late")
    c.end_stream(1)
    assert c.data_to_send() == b""
    # data still in flight for it is ignored, and counted against nothing that blocks other streams
    assert c.receive(h2.frame(h2.DATA, 0, 1, grpc_msg(b"late data"))) == []


def test_answer_before_the_client_ended_tells_it_to_stop() -> None:
    c, enc = h2.Connection(), Encoder()
    c.receive(h2.PREFACE + open_stream(enc, 3))
    c.data_to_send()
    c.end_stream(3, h2.trailers(5, "unknown"))
    out = frames(c.data_to_send())
    assert [(k, f) for k, f, _, _ in out] == [(h2.HEADERS, h2.END_HEADERS | h2.END_STREAM), (h2.RST_STREAM, 0)]
    assert out[0][3] == h2.RESPONSE_HEADERS + h2.trailers(5, "unknown")  # trailers-only
    assert struct.unpack(">L", out[1][3])[0] == h2.NO_ERROR


# ---- the server, with grpcio's client ----------------------------------------------------------
@pytest.fixture()
def running() -> Iterator[Running]:
    r = Running({PROCESS_PATH: (echo, ep.ProcessingRequest.FromString)})
    yield r
    r.stop()


def _process(channel: grpc.Channel) -> Any:
    return channel.stream_stream(PROCESS_PATH.decode(), request_serializer=ep.ProcessingRequest.SerializeToString,
                                 response_deserializer=ep.ProcessingResponse.FromString)


def test_health_check_as_the_probe_asks_it(running: Running) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{running.port}") as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        assert stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=2).status == \
            health_pb2.HealthCheckResponse.SERVING
        running.server.health[""] = health_pb2.HealthCheckResponse.NOT_SERVING
        assert stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=2).status == \
            health_pb2.HealthCheckResponse.NOT_SERVING
        with pytest.raises(grpc.RpcError) as e:
            stub.Check(health_pb2.HealthCheckRequest(service="nope"), timeout=2)
        assert e.value.code() == grpc.StatusCode.NOT_FOUND


def test_streams_many_and_large_messages_both_ways(running: Running) -> None:
    bodies = [b"abc", b"", bytes(range(256)) * 80_000, b"z" * 70_000]  # one of ~20 MB
    with grpc.insecure_channel(f"127.0.0.1:{running.port}", options=[
            ("grpc.max_receive_message_length", 64 * 1024 * 1024),
            ("grpc.max_send_message_length", 64 * 1024 * 1024)]) as ch:
        replies = list(_process(ch)(iter(ep.ProcessingRequest(request_body=ep.HttpBody(body=b)) for b in bodies),
                                    timeout=30))
        assert [r.request_body.response.body_mutation.body for r in replies] == [b[::-1] for b in bodies]
        # calls under way together on the one connection do not mix
        calls = [_process(ch)(iter([ep.ProcessingRequest(request_body=ep.HttpBody(body=b"call-%d" % i))]), timeout=10)
                 for i in range(20)]
        for i, it in enumerate(calls):
            assert [r.request_body.response.body_mutation.body for r in it] == [(b"call-%d" % i)[::-1]]


def test_a_failing_handler_ends_its_call_with_internal_and_the_server_goes_on(running: Running) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{running.port}") as ch:
        with pytest.raises(grpc.RpcError) as e:
            list(_process(ch)(iter([ep.ProcessingRequest(request_body=ep.HttpBody(body=b"fail"))]), timeout=5))
        assert e.value.code() == grpc.StatusCode.INTERNAL
        with pytest.raises(grpc.RpcError) as e:
            ch.unary_unary("/no.Such/Method")(b"", timeout=5)
        assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED
        ok = list(_process(ch)(iter([ep.ProcessingRequest(request_body=ep.HttpBody(body=b"ok"))]), timeout=5))
        assert ok[0].request_body.response.body_mutation.body == b"ko"


def test_a_stopping_server_refuses_new_calls_but_answers_health(running: Running) -> None:
    running.server.stopping = True
    with grpc.insecure_channel(f"127.0.0.1:{running.port}") as ch:
        with pytest.raises(grpc.RpcError) as e:
            list(_process(ch)(iter([ep.ProcessingRequest(request_body=ep.HttpBody(body=b"x"))]), timeout=5))
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE  # REFUSED_STREAM: Envoy may retry elsewhere
        assert health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=2).status == \
            health_pb2.HealthCheckResponse.SERVING


# ---- Call.consume: a call that only listens (the stream watch's) --------------------------------
CONSUME_PATH = b"/test.Listen/Consume"


class _Counting:
    """A sink that keeps the bodies it is fed (and when it was fed last), ends at b"end", fails at
    b"fail", and allows ``idle`` seconds between messages once it saw b"arm" (None before: no limit)."""

    def __init__(self, idle: float) -> None:
        self.bodies: list[bytes] = []
        self.fed_at = 0.0
        self._idle = idle
        self.armed = False

    @property
    def idle(self) -> float | None:
        return self._idle if self.armed else None

    def feed(self, req: ep.ProcessingRequest) -> bool:
        body = bytes(req.request_body.body)
        if body == b"fail":
            raise ValueError("a sink that fails")
        self.bodies.append(body)
        self.fed_at = time.monotonic()
        self.armed = self.armed or body == b"arm"
        return body == b"end"


def test_consume_feeds_every_message_until_the_sink_is_done_or_the_client_ends_or_goes_idle() -> None:
    """What came before ``consume`` and what comes while it waits reach the sink in order; its answer
    ends the call (OK, the reply says how it ended: done, eof, idle after how long, or the failure)."""
    async def listen(call: Any) -> None:
        await asyncio.sleep(0.2)  # messages queue meanwhile
        sink = _Counting(idle=0.3)
        try:
            await call.consume(sink)
            how = b"done" if sink.bodies[-1:] == [b"end"] else b"eof"
        except TimeoutError:
            how = b"idle %.3f" % (time.monotonic() - sink.fed_at)
        except ValueError:
            how = b"failed"
        call.write(ep.ProcessingResponse(request_body=ep.BodyResponse(response=ep.CommonResponse(
            body_mutation=ep.BodyMutation(body=how + b":" + b",".join(sink.bodies))))))

    r = Running({CONSUME_PATH: (listen, ep.ProcessingRequest.FromString)})
    try:
        with grpc.insecure_channel(f"127.0.0.1:{r.port}") as ch:
            method = ch.stream_stream(CONSUME_PATH.decode(), request_serializer=ep.ProcessingRequest.SerializeToString,
                                      response_deserializer=ep.ProcessingResponse.FromString)

            def run(*items: bytes | float) -> bytes:
                def requests() -> Iterator[ep.ProcessingRequest]:
                    for item in items:
                        if isinstance(item, float):
                            time.sleep(item)
                        else:
                            yield ep.ProcessingRequest(request_body=ep.HttpBody(body=item))
                    time.sleep(1.5)  # the call stays open unless the server ends it
                [reply] = list(method(requests(), timeout=10))
                return bytes(reply.request_body.response.body_mutation.body)

            assert run(b"a", b"b", 0.3, b"c", b"end", b"after") == b"done:a,b,c,end"
            assert run(b"a", 0.4, b"b") == b"eof:a,b"  # (no idle limit before b"arm")
            # idle counts from the last message: 0.25 s gaps pass, then 0.3 s without one ends it
            how, fed = run(b"arm", 0.25, b"x", 0.25, b"y", 0.25, b"z").split(b":")
            assert fed == b"arm,x,y,z" and how.startswith(b"idle ")
            assert 0.3 <= float(how[5:]) < 1.0, how  # (slack for a loaded machine)
            assert run(b"a", b"fail", b"b") == b"failed:a"
            assert run(b"a", b"b", b"end") == b"done:a,b,end"  # all of it queued before ``consume``
    finally:
        r.stop()


# ---- a paused process: the calls reset meanwhile are known as such before their handlers start -----
def freeze(r: Running) -> threading.Event:
    """The server's loop frozen, as SIGSTOP or a starved CPU freezes it (the socket fills, nothing is
    read) until the returned event is set, then long enough to be taken for a pause."""
    frozen, thaw = threading.Event(), threading.Event()

    def frozen_loop() -> None:
        frozen.set()
        thaw.wait(10)
        time.sleep(FROZEN_S)
    r.loop.call_soon_threadsafe(frozen_loop)
    assert frozen.wait(5)
    return thaw


def test_calls_reset_while_the_process_was_paused_are_known_reset_when_their_handlers_start() -> None:
    """The server's loop frozen (as SIGSTOP or a starved CPU freezes it) while the client opens calls and
    resets most of them, as Envoy resets each whose message timeout answered its client: on resuming,
    each handler starts knowing whether its call was reset (the ext_proc then admits none of those),
    even when the resets come several reads after the calls (a 40 KB message between them, the server's
    reads cut to 4 KiB); a call the client only ended is not reset, and the live ones are answered."""
    started: dict[bytes, bool] = {}

    async def record(call: Call) -> None:
        started[(call.metadata("x-n") or "").encode()] = call.reset
        await echo(call)

    r = Running({PROCESS_PATH: (record, ep.ProcessingRequest.FromString)})
    try:
        peer = Peer(r.port)
        [proto] = r.call(lambda: list(r.server._protocols))
        proto.transport.max_size = 4096  # (asyncio's transport reads up to this much at once)
        thaw = freeze(r)
        names = (b"reset-1", b"live", b"reset-2", b"ended", b"big-reset")
        sids = {name: peer.open(body_msg(name), headers=[*REQUEST_HEADERS, (b"x-n", name)], end=name == b"ended")
                for name in names}
        peer.h2.send_data(sids[b"big-reset"], body_msg(b"x" * 40_000))
        peer.flush()
        for name in (b"reset-1", b"reset-2", b"big-reset"):
            peer.h2.reset_stream(sids[name])
        peer.flush()
        thaw.set()
        replies = {sid: b"" for sid in sids.values()}
        seen: list[Any] = []

        def answered() -> bool:
            for e in peer.events[len(seen):]:
                seen.append(e)
                if type(e).__name__ == "DataReceived":
                    replies[e.stream_id] += e.data
            return all(reply_bodies(replies[sids[n]]) for n in (b"live", b"ended"))
        peer.until(answered)
        assert reply_bodies(replies[sids[b"live"]]) == [b"evil"]
        assert reply_bodies(replies[sids[b"ended"]]) == [b"dedne"]
        wait_for(lambda: len(started) == 5)
        assert started == {b"reset-1": True, b"live": False, b"reset-2": True, b"ended": False, b"big-reset": True}
        # nothing of the reset calls is held: their bytes are back in the windows; only "live" is left
        # (its client has not ended it)
        wait_for(lambda: r.call(lambda: (len(proto.calls), proto.conn.unconsumed, len(proto._opened))) == (1, 0, 0))
        peer.sock.close()
    finally:
        r.stop()


def test_calls_opened_while_the_process_was_paused_run_even_when_the_connection_is_gone_on_resuming() -> None:
    """While the loop is frozen the client opens calls, sends their messages, resets one and closes the
    whole connection (Envoy drains its connections to a process that failed a health check, and closes
    one once no stream of its is left: a stream watch's call, opened while the process was paused, carries
    the copies of a stream that ended meanwhile).  On resuming, every such call's handler still runs: it
    reads what was sent on it, then its end, so nothing that was sent is lost (the watch bills it)."""
    got: dict[bytes, list[bytes]] = {}

    async def record(call: Call) -> None:
        name = (call.metadata("x-n") or "").encode()
        seen: list[bytes] = []
        while (msg := await call.read()) is not EOF:
            seen.append(bytes(msg.request_body.body))
        got[name] = [*seen, b"reset" if call.reset else b"open"]  # (the connection gone: no answer is read)

    r = Running({PROCESS_PATH: (record, ep.ProcessingRequest.FromString)})
    try:
        peer = Peer(r.port)
        thaw = freeze(r)
        sids = {name: peer.open(body_msg(name + b"-1"), body_msg(name + b"-2"),
                                headers=[*REQUEST_HEADERS, (b"x-n", name)], end=name == b"ended")
                for name in (b"watch", b"reset", b"ended")}
        peer.h2.reset_stream(sids[b"reset"])
        peer.flush()
        # closed as Envoy closes it: a FIN after everything sent.  (A close() with the server's frames
        # unread sends an RST instead, and the kernel then drops what the server had not read yet.)
        peer.sock.shutdown(socket.SHUT_WR)
        thaw.set()
        wait_for(lambda: len(got) == 3, describe=lambda: got)
        peer.sock.close()
        assert got == {n: [n + b"-1", n + b"-2", b"reset"] for n in (b"watch", b"reset", b"ended")}
    finally:
        r.stop()


@pytest.mark.parametrize("how", ["reset", "connection closed"])
def test_a_call_reset_while_the_process_was_paused_is_known_expired_once_it_settled(how: str) -> None:
    """A call under way when the loop froze (its first message answered): meanwhile the client sends its
    next message and then resets it, as Envoy resets a call whose message timeout answered its client.  The
    message is read on resuming before the reset is (a 40 KB message, the server's reads cut to 4 KiB), so
    the handler's ``settle`` waits for what was sent during the pause: it then knows that call expired (the
    ext_proc bills none of that reply), and a live call, sent the same, not.  Envoy may instead close the
    whole connection to a process that stopped answering: each of its calls whose message came in while
    paused is expired then."""
    settled: dict[bytes, bool] = {}
    ended: dict[bytes, bool] = {}

    async def record(call: Call) -> None:
        first = await call.read()
        name = bytes(first.request_body.body)
        call.write(ep.ProcessingResponse(request_body=ep.BodyResponse()))
        if await call.read() is not EOF:
            settled[name] = await call.settle()
            if how == "connection closed" and await call.read() is EOF:
                ended[name] = call.expired

    r = Running({PROCESS_PATH: (record, ep.ProcessingRequest.FromString)})
    try:
        peer = Peer(r.port)
        [proto] = r.call(lambda: list(r.server._protocols))
        proto.transport.max_size = 4096  # (asyncio's transport reads up to this much at once)
        sids = {name: peer.open(body_msg(name)) for name in (b"late", b"live")}
        peer.until(lambda: all(peer.of(h2.DATA, sid) for sid in sids.values()))
        thaw = freeze(r)
        for sid in sids.values():
            peer.h2.send_data(sid, body_msg(b"x" * 40_000))
        peer.flush()
        if how == "reset":
            peer.h2.reset_stream(sids[b"late"])
            peer.flush()
        thaw.set()
        wait_for(lambda: len(settled) == 2)
        if how == "reset":
            assert settled == {b"late": True, b"live": False}
        else:
            assert settled == {b"late": False, b"live": False}  # (not yet: the connection is still open)
            peer.sock.close()
            wait_for(lambda: len(ended) == 2)
            assert ended == {b"late": True, b"live": True}  # both messages came in while it was paused
        peer.sock.close()
    finally:
        r.stop()


# ---- when answers go out -----------------------------------------------------------------------
def test_an_answer_goes_out_at_once_not_after_the_rest_of_the_loops_turn() -> None:
    """``Call.write`` sends the answer in a write of its own at once, while the loop still has work of
    this turn to do (here: a loop kept busy after the answer)."""
    busy = threading.Event()

    async def answer_then_stay_busy(call: Call) -> None:
        req = await call.read()
        assert req is not EOF
        call.write(ep.ProcessingResponse(request_body=ep.BodyResponse()))
        busy.wait(5)  # the rest of the loop's turn: other calls' work, here the loop held

    r = Running({PROCESS_PATH: (answer_then_stay_busy, ep.ProcessingRequest.FromString)})
    try:
        peer = Peer(r.port)
        sid = peer.open(body_msg(b"x"))
        data = lambda: [f for f in peer.frames if f[0] == h2.DATA and f[2] == sid]  # noqa: E731
        peer.until(lambda: bool(data()), timeout=2)  # while the loop is still busy
        assert not busy.is_set()
        assert ep.ProcessingResponse.FromString(data()[0][3][5:]).HasField("request_body")
    finally:
        busy.set()
        r.stop()
