"""Stopping drains: new connections are refused, streams in flight finish with [DONE], and their usage
records are written before the ext_proc exits."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

import httpx

from conftest import Gateway, free_base, running_stack, wait_for


def test_stop_drains_streams_and_flushes_usage() -> None:
    with running_stack("gw-drain-", drain_grace_s=20) as gw:
        stack = gw.stack
        org, _, key = gw.new_org()
        results, threads = _streams(gw.v1, key, tokens=20)
        wait_for(lambda: gw.slots_held(org) == 3, timeout=5, interval=0.02)  # all three in flight
        drainer = threading.Thread(target=stack.stop_proc, args=("envoy",))
        drainer.start()
        # new connections are refused (soon after the drain starts; the streams take 2 s more)
        wait_for(lambda: _refused(gw.v1, key), timeout=1.5, interval=0.05)
        assert all(t.is_alive() for t in threads)  # ... while the streams are still in flight
        for t in threads:
            t.join()
        drainer.join()
        assert len(results) == 3
        assert all(body.rstrip().endswith(b"data: [DONE]") for _, body in results)
        stack.stop_proc("extproc")  # SIGTERM: finishes and flushes usage records
        rows = gw.sql("SELECT request_id, completion_tokens, estimated FROM usage_records WHERE org_id = $1", org)
        assert sorted(r["request_id"] for r in rows) == sorted(rid for rid, _ in results)
        assert all(r["completion_tokens"] == 20 and not r["estimated"] for r in rows)


def test_sigterm_to_gateway_up_drains_streams(gateway: Gateway) -> None:
    """`gateway up` as an operator runs it, on the session's PostgreSQL and Redis (given by URL, so they
    outlive it) and its simulators; SIGTERM arrives while streams are in flight."""
    base = free_base()
    s = gateway.stack.s
    env = dict(os.environ, GATEWAY_PORT=str(base), GATEWAY_METRICS_PORT=str(base + 19),
               GATEWAY_STATE_DIR=str(s.state) + "-sigterm", GATEWAY_CATALOG=s.catalog, GATEWAY_RUN_SIM="0",
               DATABASE_URL=gateway.stack.database_url, REDIS_URL=gateway.stack.redis_url,
               GATEWAY_DRAIN_GRACE_S="20", GATEWAY_DEV="1")  # as `make run` (no SMTP server, no Przelewy24)
    up = subprocess.Popen([sys.executable, "-m", "control.cli", "up"], env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        v1 = f"http://127.0.0.1:{base}/v1"
        org, _, key = gateway.new_org()
        wait_for(lambda: _ready(v1, key), timeout=60, interval=0.2)
        results, threads = _streams(v1, key, tokens=15)
        wait_for(lambda: gateway.slots_held(org) == 3, timeout=5, interval=0.02)  # all three in flight
        up.send_signal(signal.SIGTERM)
        for t in threads:
            t.join()
        assert up.wait(60) == 0
        assert len(results) == 3 and all(b.rstrip().endswith(b"data: [DONE]") for _, b in results)
        rows = gateway.sql("SELECT request_id FROM usage_records WHERE org_id = $1 AND NOT estimated", org)
        assert sorted(r["request_id"] for r in rows) == sorted(rid for rid, _ in results)
    finally:
        if up.poll() is None:
            os.killpg(up.pid, signal.SIGKILL)


def _refused(v1: str, key: str) -> bool:
    """A new connection gets no answer: refused, or (taken into the listener's queue as it closed) reset
    before any byte of a reply."""
    try:
        httpx.get(v1 + "/models", headers={"Authorization": f"Bearer {key}"}, timeout=2)
    except (httpx.ConnectError, httpx.ReadError, httpx.RemoteProtocolError):
        return True
    return False


def _ready(v1: str, key: str) -> bool:
    try:
        return httpx.get(v1 + "/models", headers={"Authorization": f"Bearer {key}"}, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _streams(v1: str, key: str, tokens: int, n: int = 3) -> tuple[list[tuple[str, bytes]], list[threading.Thread]]:
    """``n`` paced streams started in threads; each appends (request id, whole body) when it ends."""
    results: list[tuple[str, bytes]] = []
    body = {"model": "polish-pro", "messages": [{"role": "user", "content": "x"}], "stream": True,
            "sim": {"itl_ms": 100, "output_tokens": tokens}}

    def stream() -> None:
        with httpx.stream("POST", v1 + "/chat/completions", json=body, timeout=30,
                          headers={"Authorization": f"Bearer {key}"}) as st:
            results.append((st.headers["x-request-id"], st.read()))

    threads = [threading.Thread(target=stream) for _ in range(n)]
    for t in threads:
        t.start()
    return results, threads
