"""The request path's Redis client (extproc/resp.py) against peers that misbehave: a Redis that stops
answering must not hang a request (ConnectionError after the timeout, the connection dropped), and a
reply that comes late must never be taken as the answer to a later command."""
from __future__ import annotations

import asyncio
import time

import pytest

from extproc.resp import RespClient


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
