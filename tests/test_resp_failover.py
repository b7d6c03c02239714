"""The request path's Redis client across a failover, against Debian's redis-server (a primary and its
replica): a write that must survive one is confirmed by ``WAIT`` on its own connection
(``RespClient.call_replicated``), and a client closed while it connected to a frozen node never sends
anything once the node comes back (a primary frozen past its failover takes writes as a primary until
the sentinels demote it, and drops them then).  The choice among the sentinels' answers
(core/resp_sentinel.py, ``newest``) is a pure function, tested here; tests/test_redis_sentinel_e2e.py
drives it against real sentinels."""
from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Iterator

import pytest
import redis

from conftest import wait_for
from core.resp import RespClient
from core.resp_sentinel import Named, newest
from free_ports import free_port
from redis_cluster import REDIS_SERVER, require_redis_server

require_redis_server()


def _start(d: Path, port: int, *conf: str) -> subprocess.Popen[bytes]:
    (d / str(port)).mkdir()
    with (d / str(port) / "log").open("wb") as log:
        return subprocess.Popen([str(REDIS_SERVER), "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                 "--appendonly", "no", "--dir", str(d / str(port)), *conf],
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


@pytest.fixture(scope="module")
def pair() -> Iterator[tuple[int, int, subprocess.Popen[bytes]]]:
    """(the primary's port, its replica's, the primary's process)."""
    d = Path(tempfile.mkdtemp(prefix="redis-pair-"))
    primary, replica = free_port(), free_port()
    procs = [_start(d, primary), _start(d, replica, "--replicaof", "127.0.0.1", str(primary))]
    try:
        def linked() -> bool:
            try:
                with redis.Redis(port=replica) as r:
                    return bool(r.info("replication").get("master_link_status") == "up")
            except redis.exceptions.ConnectionError:
                return False
        wait_for(linked, timeout=20, interval=0.1)
        yield primary, replica, procs[0]
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_a_write_is_confirmed_by_the_replica_on_its_own_connection(pair: tuple[int, int, subprocess.Popen[bytes]]) -> None:
    primary, replica, _ = pair

    async def go() -> None:
        client = RespClient("127.0.0.1", primary)
        try:
            reply, acked = await client.call_replicated("SET", "resp-failover:a", "1", wait_ms=2000)
            assert (reply, acked) == (b"OK", 1)
            with redis.Redis(port=replica) as r:
                assert r.get("resp-failover:a") == b"1"  # confirmed: the replica has it
            reply, acked = await client.call_replicated("GET", "resp-failover:a")  # a read: nothing to wait for
            assert (reply, acked) == (b"1", 1)
        finally:
            await client.close()
    asyncio.run(go())


def test_a_write_no_replica_takes_is_not_confirmed(pair: tuple[int, int, subprocess.Popen[bytes]]) -> None:
    """The replica's own (a replica of nobody's writes): WAIT counts no replica, after its wait."""
    _, replica, _ = pair

    async def go() -> None:
        client = RespClient("127.0.0.1", replica)
        try:
            t0 = time.monotonic()
            reply, acked = await client.call_replicated("PING", wait_ms=300)
            assert (reply, acked) == (b"PONG", 0)
            assert time.monotonic() - t0 < 2.0
        finally:
            await client.close()
    asyncio.run(go())


def test_a_client_closed_while_connecting_to_a_frozen_node_sends_nothing_when_it_wakes(
        pair: tuple[int, int, subprocess.Popen[bytes]]) -> None:
    """A call connecting to a frozen primary (the kernel takes the connection, the process answers
    nothing) whose client is closed meanwhile (the sentinels named another primary): once the node
    comes back, the call fails and its write was never sent."""
    primary, _, proc = pair

    async def go() -> None:
        client = RespClient("127.0.0.1", primary, password=None, timeout=5.0, name="frozen-test")
        os.kill(proc.pid, signal.SIGSTOP)
        try:
            call = asyncio.ensure_future(client.call("SET", "resp-failover:late", "1"))
            await asyncio.sleep(0.3)  # connecting: its CLIENT SETNAME unanswered
            await client.close()
        finally:
            os.kill(proc.pid, signal.SIGCONT)
        with pytest.raises(ConnectionError, match="closed"):
            await call
        with pytest.raises(ConnectionError, match="closed"):
            await client.call("PING")  # and none after
    asyncio.run(go())
    with redis.Redis(port=primary) as r:
        time.sleep(0.2)
        assert r.get("resp-failover:late") is None


def test_the_newest_configuration_counts_and_a_primary_seen_down_is_not_used() -> None:
    old, new = ("10.0.0.1", 6379), ("10.0.0.2", 6379)
    stale = Named(old, epoch=3, down=False, replicas=1)  # a sentinel that has not heard of the failover
    current = Named(new, epoch=4, down=False, replicas=0)
    assert newest([stale, current]) == current
    assert newest([current, stale]) == current
    assert newest([stale]) == stale  # the only answer
    # the newest configuration's primary seen down by one sentinel, up by another: the other's answer
    assert newest([stale, Named(new, 4, True, 0), current]) == current
    # seen down by every sentinel of the newest configuration: none (a call fails at once), even though
    # an older configuration names a primary that is up
    assert newest([stale, Named(new, 4, True, 0)]) is None
    assert newest([]) is None
