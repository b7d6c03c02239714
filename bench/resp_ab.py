"""The request path's Redis client against redis-py's: the CPU of the ext_proc's own process per admission
and per finish, with its own client (core/resp.py) and with redis-py's asyncio client on hiredis, both
driving the same scripts through ``Store.admit`` and ``Store.finish`` (as bench/redis_ceiling.py does)
against the same throwaway redis-server, configured as the launcher runs the embedded one.  redis-py is
opened as the ext_proc opens its own redis-py client (``extproc.store.redis_client``, a blocking pool of
``REDIS_POOL`` connections) and, as a second variant, with a pool as large as the callers, so that no
caller waits for a connection.  Each round runs every client in turn (the order reversed every other
round) at 1 caller and at ``CONCURRENCY`` callers at once (a busy gateway); the figures are the rounds'
medians and spreads (bench/rounds.py).  Redis's own CPU per call is reported beside them.
``python -m bench.resp_ab [--rounds 3] [--requests 5000]``; prints one JSON line."""
from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any, cast

import redis.asyncio as aioredis
from redis.commands.core import AsyncScript
from redis.utils import HIREDIS_AVAILABLE

from core import redis_keys as rk
from core.redis_client import redis_client
from core.redis_keys import USAGE_STREAM
from core.resp import RespClient
from extproc.__main__ import REDIS_POOL
from extproc.store import Store

from . import rounds
from .markdown import md_table
from .event_loop import cpu_s
from .procs import redis_server
from .redis_ceiling import HOLD, _record

CLIENTS = ("own", "redis_py", "redis_py_pool64")
CONCURRENCY = 64
KEY = "h" * 64
TIMEOUT_S = 60.0  # a call's deadline: a loaded machine makes calls late, it must not make them fail


class RedisPyScripts:
    """redis-py in the place of ``RespClient`` in ``Store``: a script's EVALSHA, loaded on NOSCRIPT."""

    def __init__(self, r: aioredis.Redis) -> None:
        self.r = r
        self.timeout = TIMEOUT_S
        self._scripts: dict[str, AsyncScript] = {}

    async def evalsha(self, script: str, keys: list[Any], args: list[Any]) -> Any:
        s = self._scripts.get(script)
        if s is None:
            s = self._scripts[script] = self.r.register_script(script)
        return await s(keys=keys, args=args)

    async def close(self) -> None:
        await self.r.aclose()


def _fast(name: str, url: str) -> RespClient | RedisPyScripts:
    if name == "own":
        own = RespClient.from_url(url)
        own.timeout = TIMEOUT_S
        return own
    if name == "redis_py":
        return RedisPyScripts(redis_client(url, REDIS_POOL))
    return RedisPyScripts(redis_client(url, CONCURRENCY))


async def _phase(callers: int, ids: list[str], call: Callable[[str], Awaitable[None]]) -> float:
    """CPU seconds of this process while ``callers`` tasks run ``call`` over ``ids``."""
    queue = iter(ids)

    async def caller() -> None:
        for rid in queue:
            await call(rid)

    t0 = time.process_time()
    await asyncio.gather(*(caller() for _ in range(callers)))
    return time.process_time() - t0


async def one(name: str, url: str, redis_pid: int, requests: int, callers: int, tag: str) -> dict[str, float]:
    """``requests`` admissions, then as many finishes, with client ``name``: µs per call of this process's
    CPU and of Redis's."""
    fast = _fast(name, url)
    plain = aioredis.Redis.from_url(url)
    store = Store(plain, cast(RespClient, fast), default_rpm=10**9, default_concurrency=10**6, lease_s=600,
                  key_ttl_s=3600)
    pending = "bench|" + _record(0).to_json()
    try:
        async def admit(rid: str) -> None:
            adm = await store.admit(KEY, rid, limits=True, pending=pending, deadline=time.time() + TIMEOUT_S,
                                    hold=HOLD)
            assert adm.admitted, adm

        async def finish(rid: str) -> None:
            await store.finish("org_1", rid, _record(0))

        warm = [f"warm-{tag}-{i}" for i in range(200)]  # connections opened, scripts loaded
        await _phase(callers, warm, admit)
        await _phase(callers, warm, finish)
        ids = [f"{tag}-{i}" for i in range(requests)]
        out: dict[str, float] = {}
        for what, call in (("admit", admit), ("finish", finish)):
            r0 = cpu_s(redis_pid)
            cpu = await _phase(callers, ids, call)
            out[f"{what}_us"] = round(cpu * 1e6 / requests, 1)
            out[f"{what}_redis_us"] = round((cpu_s(redis_pid) - r0) * 1e6 / requests, 1)
        return out
    finally:
        await plain.delete(USAGE_STREAM)  # the queued records: no run carries the one before it
        await fast.close()
        await plain.aclose()


async def _setup(url: str) -> None:
    r = aioredis.Redis.from_url(url)
    await r.hset(rk.key(KEY), mapping={"id": "key_1", "org": "org_1"})
    # a paying organisation with a credit limit of its own: the admission checks and takes the hold
    await r.hset(rk.org("org_1"), mapping={"status": "active", "balance": 10**15, "paid": 1, "climit": 10**6})
    await r.aclose()


def measure(n_rounds: int, log: Callable[[str], None] = print, requests: int = 5000) -> dict[str, Any]:
    """Every client at 1 and ``CONCURRENCY`` callers, ``n_rounds`` rounds: per cell and client the median
    µs per admission and per finish, their spreads, and each redis-py variant's over the own client's."""
    runs: dict[str, dict[str, list[dict[str, float]]]] = {c: {n: [] for n in CLIENTS} for c in ("c1", "c64")}
    with redis_server(append_only=True) as (port, pid):
        url = f"redis://127.0.0.1:{port}/0"
        asyncio.run(_setup(url))
        for i in range(n_rounds):
            for cell, callers in (("c1", 1), ("c64", CONCURRENCY)):
                n = requests if callers > 1 else requests // 2
                for name in rounds.order(CLIENTS, i):
                    r = asyncio.run(one(name, url, pid, n, callers, f"r{i}-{cell}-{name}"))
                    runs[cell][name].append(r)
                    log(f"r{i + 1} RESP client {name:16s} {cell:3s}: {r['admit_us']:6.1f} us per admission, "
                        f"{r['finish_us']:6.1f} us per finish (Redis {r['admit_redis_us']:.1f} / {r['finish_redis_us']:.1f})")
    out: dict[str, Any] = {"hiredis": HIREDIS_AVAILABLE, "requests": requests, "concurrency": CONCURRENCY,
                           "rounds": n_rounds, "redis_py_pool": REDIS_POOL, "cells": {}}
    for cell, by_client in runs.items():
        doc: dict[str, Any] = {}
        for name, rs in by_client.items():
            for k in rs[0]:
                doc[f"{name}_{k}"] = round(rounds.median(r[k] for r in rs) or 0.0, 1)
                doc[f"{name}_{k}_spread"] = rounds.spread(r[k] for r in rs)
        for name in CLIENTS[1:]:
            for what in ("admit", "finish"):  # within each round, then the median
                doc[f"{name}_{what}_vs_own"] = round(rounds.median(
                    a[f"{what}_us"] / b[f"{what}_us"] for a, b in zip(by_client[name], by_client["own"])) or 0, 3)
        out["cells"][cell] = doc
    return out


def headline(ab: dict[str, Any] | None) -> dict[str, Any]:
    """The headline's RESP client keys: CPU µs per admission and per finish at ``CONCURRENCY`` callers,
    the own client's and redis-py's (the ext_proc's pool)."""
    c = (ab or {}).get("cells", {}).get("c64", {})
    return {f"resp_{n}_us_per_{w}{s}": c.get(f"{n}_{w}_us{s}") for n in ("own", "redis_py") for w in ("admit", "finish")
            for s in ("", "_spread")}


LABELS = {"own": "own client (`core/resp.py`)", "redis_py": "redis-py + hiredis, the ext_proc's pool",
          "redis_py_pool64": "redis-py + hiredis, a pool as large as the callers"}


def section(ab: dict[str, Any]) -> list[str]:
    """BENCHMARKS.md's section from ``measure``'s result."""
    body = []
    for cell, callers in (("c64", ab["concurrency"]), ("c1", 1)):
        c = ab["cells"][cell]
        for name in CLIENTS:
            vs = "1.00× / 1.00×" if name == "own" else f"{c[f'{name}_admit_vs_own']:.2f}× / {c[f'{name}_finish_vs_own']:.2f}×"
            body.append([str(callers), LABELS[name].replace("the ext_proc's pool", f"a pool of {ab['redis_py_pool']}"),
                         rounds.mark(f"{c[f'{name}_admit_us']:.1f}", c[f"{name}_admit_us_spread"]),
                         rounds.mark(f"{c[f'{name}_finish_us']:.1f}", c[f"{name}_finish_us_spread"]), vs,
                         f"{c[f'{name}_admit_redis_us']:.1f} / {c[f'{name}_finish_redis_us']:.1f}"])
    return ["## The request path's Redis client: its own, or redis-py", "",
            "`bench/resp_ab.py`: the CPU of the calling process per admission and per finish (the same scripts "
            "through `Store.admit` and `Store.finish`, against one redis-server configured as the launcher's), "
            f"with the ext_proc's own client and with redis-py's asyncio client on hiredis (hiredis "
            f"{'in use' if ab['hiredis'] else 'NOT installed'}), {ab['requests']:,} calls each ({ab['requests'] // 2:,} "
            f"at one caller), {ab['rounds']} rounds, the clients' order reversed every other round; medians, "
            "the ratios taken within each round. Redis's own CPU per call (/proc, in 10 ms ticks: rough) is "
            "beside them: the own client's commands of one turn of the event loop go out in one write, which "
            "saves Redis reads too:", "",
            md_table(["callers", "client", "µs per admission", "µs per finish", "vs own (admission / finish)",
                      "Redis µs (admission / finish)"], body), ""]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=5000)
    args = ap.parse_args()
    print(json.dumps(measure(args.rounds, requests=args.requests)))


if __name__ == "__main__":
    main()
