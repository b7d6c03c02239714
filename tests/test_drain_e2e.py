"""Stopping drains: new connections are refused, streams in flight finish with [DONE], and their usage
records are written before the ext_proc exits."""
from __future__ import annotations

import threading
import time

import httpx
import pytest

from conftest import running_stack


def test_stop_drains_streams_and_flushes_usage() -> None:
    with running_stack("gw-drain-", drain_grace_s=20) as gw:
        stack = gw.stack
        org, _, key = gw.new_org()
        results: list[tuple[str, bytes]] = []

        def stream() -> None:
            body = {"model": "polish-pro", "messages": [{"role": "user", "content": "x"}], "stream": True,
                    "sim": {"itl_ms": 100, "output_tokens": 20}}
            with httpx.stream("POST", gw.v1 + "/chat/completions", json=body, timeout=30,
                              headers={"Authorization": f"Bearer {key}"}) as s:
                results.append((s.headers["x-request-id"], s.read()))

        threads = [threading.Thread(target=stream) for _ in range(3)]
        for t in threads:
            t.start()
        time.sleep(0.5)
        drainer = threading.Thread(target=stack.stop_proc, args=("envoy",))
        drainer.start()
        time.sleep(0.3)
        with pytest.raises(httpx.ConnectError):
            httpx.get(gw.v1 + "/models", headers={"Authorization": f"Bearer {key}"}, timeout=2)
        for t in threads:
            t.join()
        drainer.join()
        assert len(results) == 3
        assert all(body.rstrip().endswith(b"data: [DONE]") for _, body in results)
        stack.stop_proc("extproc")  # SIGTERM: finishes and flushes usage records
        rows = gw.sql("SELECT request_id, completion_tokens, estimated FROM usage_records WHERE org_id = $1", org)
        assert sorted(r["request_id"] for r in rows) == sorted(rid for rid, _ in results)
        assert all(r["completion_tokens"] == 20 and not r["estimated"] for r in rows)
