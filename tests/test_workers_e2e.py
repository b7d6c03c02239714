"""Several ext_proc processes behind one Envoy (GATEWAY_EXTPROC_WORKERS=2): both serve requests, one
killed leaves the other serving every new request, it comes back after a restart, and `gateway
status` reports each of them."""
from __future__ import annotations

import asyncio
import dataclasses
import threading
from typing import Any

import httpx

from conftest import Gateway, running_stack, wait_for
from control.cli import status
from control.ports import extproc_workers

BODY = {"model": "polish-fast", "messages": [{"role": "user", "content": "Dzień dobry"}], "max_tokens": 8}


def served(metrics_port: int) -> float:
    """The worker's gateway_requests_total, every label set summed."""
    text = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).text
    return sum(float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines() if ln.startswith("gateway_requests_total{"))


def counts(gw: Gateway) -> dict[str, float]:
    return {name: served(m) for name, _, m in extproc_workers(gw.stack.s)}


def chat(c: httpx.Client) -> httpx.Response:
    return c.post("/chat/completions", json=BODY)


def burst(c: httpx.Client, n: int, threads: int = 4) -> list[httpx.Response]:
    out: list[httpx.Response] = []
    lock = threading.Lock()

    def run() -> None:
        for _ in range(n // threads):
            r = chat(c)
            with lock:
                out.append(r)

    ts = [threading.Thread(target=run) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return out


def test_two_workers_share_the_load_and_survive_one_killed() -> None:
    with running_stack("gw-workers-", extproc_workers=2, default_rpm=100000, default_concurrency=1000) as gw:
        stack = gw.stack
        workers = extproc_workers(stack.s)
        assert [w[0] for w in workers] == ["extproc", "extproc-2"]
        assert stack.procs["extproc"].alive and stack.procs["extproc-2"].alive
        assert stack.procs["extproc"].popen.pid != stack.procs["extproc-2"].popen.pid  # type: ignore[union-attr]
        assert len({p for w in workers for p in w[1:]}) == 4  # gRPC and metrics ports of their own

        _, _, key = gw.new_org(100_000_000)
        with httpx.Client(base_url=gw.v1, headers={"Authorization": f"Bearer {key}"}, timeout=30) as c:
            # both processes serve requests
            before = counts(gw)
            replies = burst(c, 40)
            assert all(r.status_code == 200 for r in replies), [r.text for r in replies if r.status_code != 200]
            after = wait_for(lambda: (lambda a: a if sum(a.values()) - sum(before.values()) >= 40 else None)(counts(gw)))
            for name in after:
                assert after[name] > before[name], (name, before, after)

            # `gateway status` lists each worker (the CLI's settings need not say how many: the running
            # stack recorded it)
            doc = asyncio.run(status(stack.s))
            for name in ("extproc", "extproc-2", "metrics", "metrics-2", "envoy"):
                assert doc[name]["ok"] is True, (name, doc[name])
            assert asyncio.run(status(dataclasses.replace(stack.s, extproc_workers=1)))["extproc-2"]["ok"] is True

            # one worker killed while requests are in flight: only those may fail (500 internal_error);
            # every later request is served by the other
            stop = threading.Event()
            during: list[httpx.Response] = []

            def load() -> None:
                while not stop.is_set():
                    during.append(chat(c))

            ts = [threading.Thread(target=load) for _ in range(3)]
            for t in ts:
                t.start()
            wait_for(lambda: len(during) >= 6, timeout=10, interval=0.02)  # the load is under way
            stack.kill("extproc-2")
            at_kill = len(during)
            wait_for(lambda: len(during) >= at_kill + 9, timeout=10, interval=0.02)  # and goes on after
            stop.set()
            for t in ts:
                t.join()
            for r in during:
                assert r.status_code in (200, 500), (r.status_code, r.text)
                if r.status_code == 500:
                    err: dict[str, Any] = r.json()["error"]
                    assert err["code"] == "internal_error" and err["request_id"] == r.headers["x-request-id"]
            assert sum(r.status_code == 200 for r in during) > 0
            after_kill = [chat(c) for _ in range(30)] + burst(c, 20)
            assert all(r.status_code == 200 for r in after_kill), [(r.status_code, r.text) for r in after_kill
                                                                  if r.status_code != 200]
            doc = asyncio.run(status(stack.s))
            assert doc["extproc"]["ok"] is True and doc["extproc-2"]["ok"] is False, doc

            # restarted (what `gateway up`'s supervisor does), it takes its share again
            stack.restart("extproc-2")
            assert stack.procs["extproc-2"].alive
            assert asyncio.run(status(stack.s))["extproc-2"]["ok"] is True
            m2 = workers[1][2]

            def serves_again() -> bool:
                assert all(r.status_code == 200 for r in burst(c, 8))
                return served(m2) > 0

            wait_for(serves_again, timeout=10, interval=0.2)
