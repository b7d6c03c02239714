"""The usage writer removes the consumers of writers that stopped (each start is a consumer of its own)
from the Redis group, on the stack's real Redis: only those idle long with no pending entry, never one
holding entries (removing it would drop them), never itself.  A stream and group of the test's own, so
the running writer's records are not touched."""
from __future__ import annotations

import asyncio
import os
from typing import Any

import asyncpg
import httpx
import pytest
import redis.asyncio as aioredis

from conftest import Gateway, wait_for
from core.resp import RespClient
from extproc import usage_writer
from core.redis_client import redis_client
from extproc.store import Store
from core.redis_keys import USAGE_STREAM
from extproc.usage_writer import GROUP, UsageWriter, prune


def test_dead_consumers_without_entries_are_removed(gateway: Gateway) -> None:
    stream = f"test:usage:{os.urandom(4).hex()}"

    def consumers() -> dict[str, int]:
        return {c["name"].decode(): c["pending"] for c in gateway.redis(lambda r: r.xinfo_consumers(stream, "g"))}

    def setup(r: Any) -> None:
        r.xgroup_create(stream, "g", id="0", mkstream=True)
        for i in range(3):
            r.xadd(stream, {"r": f"record {i}"})
        r.xreadgroup("g", "dead-holding", {stream: ">"}, count=1)  # read one entry, then died
        r.xgroup_createconsumer(stream, "g", "dead-empty")
        r.xgroup_createconsumer(stream, "g", "me")
    gateway.redis(setup)
    assert consumers() == {"dead-holding": 1, "dead-empty": 0, "me": 0}

    async def run(idle_ms: int) -> list[str]:
        r = redis_client(gateway.stack.redis_url, 1)
        try:
            return await prune(r, stream, "g", "me", idle_ms)
        finally:
            await r.aclose()
    try:
        assert asyncio.run(run(60_000)) == []  # nobody idle a minute yet
        wait_for(lambda: all(c["idle"] >= 300 for c in gateway.redis(lambda r: r.xinfo_consumers(stream, "g"))))
        assert asyncio.run(run(300)) == ["dead-empty"]
        assert consumers() == {"dead-holding": 1, "me": 0}  # its entry stays pending until claimed
        claimed = gateway.redis(lambda r: r.xautoclaim(stream, "g", "me", 0, "0-0"))
        assert len(claimed[1]) == 1
        # the claim reset no idle time of the dead one; "me" is kept however idle it is
        wait_for(lambda: all(c["idle"] >= 300 for c in gateway.redis(lambda r: r.xinfo_consumers(stream, "g"))))
        assert asyncio.run(run(300)) == ["dead-holding"]
        assert consumers() == {"me": 1}
    finally:
        gateway.redis(lambda r: r.delete(stream))


def test_a_writer_removes_a_stopped_writers_consumer_from_the_real_group(
        gateway: Gateway, monkeypatch: pytest.MonkeyPatch) -> None:
    """A second writer (the design allows several) on the stack's group: its step removes a consumer
    left by a writer that stopped (created here, never reading) and keeps its own.  Redis before 7.2
    counts a consumer's idle time from the last entries it was given, so the stack's writer, quiet, may
    go too: harmless, it holds no entry then, and it is back in the group with the next record it
    writes (checked: a request's record reaches PostgreSQL)."""
    monkeypatch.setattr(usage_writer, "DEAD_IDLE_MS", 300)
    gateway.redis(lambda r: r.xgroup_createconsumer(USAGE_STREAM, GROUP, "stopped-host-1"))

    def names() -> set[str]:
        return {c["name"].decode() for c in gateway.redis(lambda r: r.xinfo_consumers(USAGE_STREAM, GROUP))}

    def idle(name: str) -> int:
        return next(int(c["idle"]) for c in gateway.redis(lambda r: r.xinfo_consumers(USAGE_STREAM, GROUP))
                    if c["name"].decode() == name)

    wait_for(lambda: idle("stopped-host-1") >= 300)

    async def step() -> str:
        r = aioredis.from_url(gateway.stack.redis_url)
        fast = RespClient.from_url(gateway.stack.redis_url)
        pool = await asyncpg.create_pool(gateway.stack.database_url, min_size=1, max_size=1)
        try:
            w = UsageWriter(pool, Store(r, fast, default_rpm=100000, default_concurrency=1000, lease_s=600,
                                        key_ttl_s=60))
            w.consumer = "test-writer"
            await w.step()
            return w.consumer
        finally:
            await pool.close()
            await fast.close()
            await r.aclose()
    try:
        asyncio.run(step())
        assert "stopped-host-1" not in names() and "test-writer" in names()
        _, _, key = gateway.new_org()
        r = httpx.post(gateway.v1 + "/embeddings", headers={"Authorization": f"Bearer {key}"},
                       json={"model": "embed", "input": "x"})
        assert r.status_code == 200, r.text
        rid = r.headers["x-request-id"]
        wait_for(lambda: gateway.sql("SELECT 1 FROM usage_records WHERE request_id = $1", rid), timeout=10)
        pid = gateway.stack.procs["usage-writer"].popen.pid  # type: ignore[union-attr]
        assert any(n.endswith(f"-{pid}") for n in names()), (pid, names())
    finally:
        gateway.redis(lambda r: [r.xgroup_delconsumer(USAGE_STREAM, GROUP, n)
                                 for n in ("stopped-host-1", "test-writer")])
