"""The gateway as compose and Kubernetes run it: each component a process of its own, started through the
image's entrypoint (deploy/docker/entrypoint.py), not `gateway up`.  A catalog change reaches Envoy
without a restart (a new alias on a new upstream model answers 200), and SIGTERM to the image's Envoy
drains it as `gateway up` does: new connections refused, streams in flight finish with [DONE] and are
billed as the clients saw them."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest
import yaml

from conftest import Gateway, free_base, wait_for
from control.procs import http_ok, port_open
from test_drain_e2e import _refused, _streams

ENTRYPOINT = Path(__file__).resolve().parent.parent / "deploy" / "docker" / "entrypoint.py"


def catalog(base: int, new_alias: bool = False) -> dict[str, Any]:
    price = [{"effective": "2026-01-01T00:00:00Z", "input_micro_pln_per_1m": 1500000, "output_micro_pln_per_1m": 3000000}]
    sim = [{"name": "sim-c", "host": "127.0.0.1", "port_offset": 15}]
    doc: dict[str, Any] = {
        "aliases": {"polish-pro": {"capabilities": ["chat"], "context_length": 8192, "max_output_tokens": 2048,
                                   "prices": price, "upstreams": [{"model": "up-pro"}]}},
        "upstream_models": {"up-pro": {"deployments": sim}}}
    if new_alias:
        doc["aliases"]["nowy"] = {**doc["aliases"]["polish-pro"], "upstreams": [{"model": "up-new"}]}
        doc["upstream_models"]["up-new"] = {"deployments": sim}
    return doc


class Components:
    def __init__(self, gateway: Gateway, tmp: Path) -> None:
        self.base = base = free_base()
        self.catalog = tmp / "catalog.yaml"
        self.catalog.write_text(yaml.safe_dump(catalog(base)))
        self.env = {**os.environ, "GATEWAY_PORT": str(base), "GATEWAY_METRICS_PORT": str(base + 19),
                    "GATEWAY_STATE_DIR": str(tmp / "state"), "GATEWAY_CATALOG": str(self.catalog),
                    "DATABASE_URL": gateway.stack.database_url, "REDIS_URL": gateway.stack.redis_url,
                    "GATEWAY_DRAIN_GRACE_S": "20", "GATEWAY_METRICS_ENVOY": "0", "GATEWAY_DRAIN_ENVOY_ON_STOP": "1",
                    "PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")}
        self.v1 = f"http://127.0.0.1:{base}/v1"
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.logs = tmp

    def start(self, name: str, *argv: str) -> None:
        with open(self.logs / f"{name}.log", "ab") as log:
            self.procs[name] = subprocess.Popen([sys.executable, str(ENTRYPOINT), *argv], env=self.env,
                                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def envoy_up(self, grace_s: int) -> None:
        """The image's Envoy running, draining for ``grace_s`` on SIGTERM (started anew if it is not)."""
        p = self.procs.get("envoy")
        if p is not None and p.poll() is None and self.env["GATEWAY_DRAIN_GRACE_S"] == str(grace_s):
            return
        if p is not None and p.poll() is None:
            p.send_signal(signal.SIGTERM)
            p.wait(30)
        self.env["GATEWAY_DRAIN_GRACE_S"] = str(grace_s)
        self.start("envoy", "envoy", "--log-level", "warn", "--disable-hot-restart")
        wait_for(lambda: http_ok(f"http://127.0.0.1:{self.base + 11}/ready"), timeout=30, interval=0.1)

    def log(self, name: str) -> str:
        return (self.logs / f"{name}.log").read_text(errors="replace")[-3000:]

    def stop(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


@pytest.fixture(scope="module")
def parts(gateway: Gateway, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Components]:
    c = Components(gateway, tmp_path_factory.mktemp("components"))
    b = c.base
    try:
        c.start("sim", "python", "-m", "sim", "--port", str(b + 15), "--name", "sim-c",
                "--chat-model", "up-pro@8192", "--chat-model", "up-new@8192")
        c.start("extproc", "python", "-m", "extproc")
        wait_for(lambda: port_open(b + 10) and http_ok(f"http://127.0.0.1:{b + 15}/health"), timeout=30, interval=0.1)
        yield c
    finally:
        c.stop()


def _chat(v1: str, key: str, model: str) -> httpx.Response:
    return httpx.post(v1 + "/chat/completions", headers={"Authorization": f"Bearer {key}"}, timeout=30,
                      json={"model": model, "max_tokens": 3, "messages": [{"role": "user", "content": "x"}]})


def test_a_catalog_change_reaches_the_images_envoy_without_a_restart(parts: Components, gateway: Gateway) -> None:
    parts.envoy_up(grace_s=20)
    _, _, key = gateway.new_org()
    assert _chat(parts.v1, key, "polish-pro").status_code == 200
    r = _chat(parts.v1, key, "nowy")
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    envoy_pid, extproc_pid = parts.procs["envoy"].pid, parts.procs["extproc"].pid
    tmp = parts.catalog.with_name(".catalog.yaml.new")  # replaced at once, as a ConfigMap update is
    tmp.write_text(yaml.safe_dump(catalog(parts.base, new_alias=True)))
    os.replace(tmp, parts.catalog)
    wait_for(lambda: _chat(parts.v1, key, "nowy").status_code == 200, timeout=10, interval=0.2)
    r = _chat(parts.v1, key, "nowy")
    assert r.status_code == 200 and r.json()["model"] == "nowy", r.text
    rec = httpx.get(f"http://127.0.0.1:{parts.base + 15}/sim/requests/{r.headers['x-request-id']}").json()
    assert rec["model"] == "up-new"  # the new upstream model's cluster, which Envoy did not have before
    assert (parts.procs["envoy"].pid, parts.procs["extproc"].pid) == (envoy_pid, extproc_pid)
    assert all(p.poll() is None for p in parts.procs.values())
    assert "catalog change applied" in parts.log("envoy")


def test_sigterm_to_the_images_envoy_drains_streams(parts: Components, gateway: Gateway) -> None:
    """Streams in flight finish, new connections are refused at once, and each stream is billed and logged
    as its client saw it (200, not 499)."""
    parts.envoy_up(grace_s=20)
    org, _, key = gateway.new_org()
    results, threads = _streams(parts.v1, key, tokens=20)
    wait_for(lambda: gateway.slots_held(org) == 3, timeout=5, interval=0.02)
    envoy = parts.procs["envoy"]
    t0 = time.monotonic()
    envoy.send_signal(signal.SIGTERM)
    wait_for(lambda: _refused(parts.v1, key), timeout=1.5, interval=0.05)
    assert all(t.is_alive() for t in threads)  # refused while the streams are still in flight
    for t in threads:
        t.join()
    assert envoy.wait(30) == 0, parts.log("envoy")
    assert time.monotonic() - t0 < 15
    assert len(results) == 3 and all(body.rstrip().endswith(b"data: [DONE]") for _, body in results)
    q = "SELECT request_id, status, completion_tokens, estimated FROM usage_records WHERE org_id = $1"
    wait_for(lambda: len(gateway.sql(q, org)) == 3, timeout=10, interval=0.1)
    rows = gateway.sql(q, org)
    assert sorted(r["request_id"] for r in rows) == sorted(rid for rid, _ in results)
    assert all((r["status"], r["completion_tokens"], r["estimated"]) == (200, 20, False) for r in rows), rows


def test_streams_the_drain_cuts_are_not_logged_as_clients_leaving(parts: Components, gateway: Gateway) -> None:
    """A stream still running when the drain's grace runs out is ended by the gateway (Envoy stops): its
    client saw 200 and events without [DONE]; it is logged 200 with a failure code and billed the input
    and the events it got (estimated), never 499 as if the client had left."""
    parts.envoy_up(grace_s=1)
    org, _, key = gateway.new_org()
    cut: list[tuple[int, bytes]] = []

    def stream() -> None:
        body = {"model": "polish-pro", "messages": [{"role": "user", "content": "x"}], "stream": True,
                "sim": {"itl_ms": 100, "output_tokens": 60}}  # 6 s
        got = b""
        with httpx.stream("POST", parts.v1 + "/chat/completions", json=body, timeout=30,
                          headers={"Authorization": f"Bearer {key}"}) as st:
            try:
                for chunk in st.iter_raw():
                    got += chunk
            except httpx.HTTPError:
                pass
            cut.append((st.status_code, got))

    threads = [threading.Thread(target=stream) for _ in range(3)]
    for t in threads:
        t.start()
    wait_for(lambda: gateway.slots_held(org) == 3, timeout=5, interval=0.02)
    time.sleep(0.5)
    parts.procs["envoy"].send_signal(signal.SIGTERM)
    for t in threads:
        t.join()
    assert len(cut) == 3 and all(status == 200 and b"data: " in got and b"[DONE]" not in got for status, got in cut)
    q = "SELECT status, error_code, completion_tokens, estimated FROM usage_records WHERE org_id = $1"
    wait_for(lambda: len(gateway.sql(q, org)) == 3, timeout=10, interval=0.1)
    rows = gateway.sql(q, org)
    assert all((r["status"], r["error_code"], r["estimated"]) == (200, "upstream_unavailable", True)
               and 5 <= r["completion_tokens"] < 60 for r in rows), rows
    assert gateway.slots_held(org) == 0


def test_sigterm_to_the_ext_proc_first_drains_its_envoy(parts: Components, gateway: Gateway) -> None:
    """compose stops the ext_proc before the Envoy whose network it shares (Kubernetes: both at once): the
    ext_proc drains that Envoy first, so new connections are refused while the streams in flight finish
    with [DONE] through it, and are billed as their clients saw them; then it stops."""
    parts.envoy_up(grace_s=20)
    org, _, key = gateway.new_org()
    results, threads = _streams(parts.v1, key, tokens=20)
    wait_for(lambda: gateway.slots_held(org) == 3, timeout=5, interval=0.02)
    extproc = parts.procs["extproc"]
    extproc.send_signal(signal.SIGTERM)
    wait_for(lambda: _refused(parts.v1, key), timeout=1.5, interval=0.05)
    assert all(t.is_alive() for t in threads)
    for t in threads:
        t.join()
    assert extproc.wait(30) == 0, parts.log("extproc")
    assert len(results) == 3 and all(body.rstrip().endswith(b"data: [DONE]") for _, body in results)
    q = "SELECT status, completion_tokens, estimated FROM usage_records WHERE org_id = $1"
    wait_for(lambda: len(gateway.sql(q, org)) == 3, timeout=10, interval=0.1)
    assert all((r["status"], r["completion_tokens"], r["estimated"]) == (200, 20, False) for r in gateway.sql(q, org))
    parts.procs["envoy"].send_signal(signal.SIGTERM)  # its listeners are closed: the next test starts both anew
    assert parts.procs["envoy"].wait(30) == 0
    parts.start("extproc", "python", "-m", "extproc")
    wait_for(lambda: port_open(parts.base + 10), timeout=30, interval=0.1)
