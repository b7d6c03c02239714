"""The request path's Redis client (core/resp.py): its sans-I/O RESP parser and encoder, and the
client against peers that misbehave: a Redis that stops answering must not hang a request
(ConnectionError after the timeout, the connection dropped), and a reply that comes late must never
be taken as the answer to a later command."""
from __future__ import annotations

import asyncio
import time

import pytest

from core.resp import RespClient, RespError, RespParser, encode


def test_encode() -> None:
    assert encode(("EVALSHA", "ab", 0, "x y")) == b"*4\r\n$7\r\nEVALSHA\r\n$2\r\nab\r\n$1\r\n0\r\n$3\r\nx y\r\n"
    assert encode((b"\x00\xff",)) == b"*1\r\n$2\r\n\x00\xff\r\n"


def test_parser_any_cut() -> None:
    wire = (b"+OK\r\n:42\r\n$5\r\nhello\r\n$-1\r\n*3\r\n$2\r\nok\r\n:7\r\n*2\r\n$1\r\na\r\n$-1\r\n"
            b"-NOSCRIPT No matching script\r\n*0\r\n")
    for step in (1, 2, 5, len(wire)):
        p = RespParser()
        out = []
        for i in range(0, len(wire), step):
            out += p.feed(wire[i:i + step])
        assert out[:6] == [b"OK", 42, b"hello", None, [b"ok", 7, [b"a", None]], out[5]]
        assert isinstance(out[5], RespError) and str(out[5]).startswith("NOSCRIPT")
        assert out[6] == [] and len(out) == 7



async def _silent_server() -> tuple[asyncio.Server, int, list[bytes]]:
    got: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            got.append(data)  # reads the commands, never answers
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1], got


def test_a_silent_redis_times_out_and_the_connection_is_dropped() -> None:
    async def go() -> None:
        server, port, got = await _silent_server()
        client = RespClient("127.0.0.1", port, timeout=0.2)
        try:
            t0 = time.monotonic()
            with pytest.raises(ConnectionError, match="did not answer in time"):
                await client.call("PING")
            assert 0.15 < time.monotonic() - t0 < 1.0
            assert got and got[0].startswith(b"*1\r\n$4\r\nPING\r\n")
            assert client._conn is None  # never reused: a late reply would answer the wrong command
            # the next call opens a new connection (and times out again, the peer still being silent)
            with pytest.raises(ConnectionError):
                await client.call("PING")
        finally:
            await client.close()
            server.close()
            await server.wait_closed()
    asyncio.run(go())
