"""When ``gateway up`` may say "Gateway ready": a real request for every alias went through this stack's
Envoy, ext_proc, Redis and PostgreSQL to this stack's model server and back.

The requests are made with the key of an organisation the stack keeps for this alone (created on the first
start, its key only in the state directory, mode 0600, never printed): one chat request of one token, or one
embedding of one word, per alias, costing a few micro-PLN of that organisation's own balance.  Where an
alias's model runs on the launcher's simulators, the request's id must be found in one of them: a 200 from
some other stack's simulator on the same port is not this stack being ready.
"""
from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from core.catalog import Alias, Catalog

from .admin import Admin, pln_to_micro
from .embedded import write_private
from .ports import LOOPBACK

PROBE_FILE = "readiness.json"
PROBE_BALANCE_PLN = "1"  # about 100,000 starts' worth of probes
PROBE_TEXT = "ok"


async def probe_key(admin: Admin, state: Path) -> str:
    """The key of the stack's readiness organisation, made on the first start."""
    f = state / PROBE_FILE
    if f.exists():
        return str(json.loads(f.read_text())["key"])
    org = await admin.create_org("gateway readiness probes", pln_to_micro(PROBE_BALANCE_PLN))
    kid, key = await admin.create_key(org, "readiness")
    write_private(f, json.dumps({"org": org, "key_id": kid, "key": key}))
    return key


@dataclass(frozen=True)
class Outcome:
    ok: bool
    detail: str  # what the last try saw (for the line printed when an alias is not ready)


def _call(url: str, key: str, body: dict[str, Any] | None) -> tuple[int, str, dict[str, Any]]:
    """(status, request id, JSON body) of one request; status 0 when no reply came."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Authorization": f"Bearer {key}",
                                                          "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.headers.get("X-Request-Id", ""), json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        try:
            doc = json.loads(e.read() or b"{}")
        except ValueError:
            doc = {}
        return e.code, e.headers.get("X-Request-Id", ""), doc
    except (OSError, ValueError) as e:
        return 0, "", {"error": {"code": type(e).__name__}}


def _seen_by_simulator(ports: list[int], request_id: str) -> bool:
    for port in ports:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/sim/requests/{request_id}", timeout=2) as r:
                if r.status == 200:
                    return True
        except (OSError, ValueError):
            continue
    return False


def probe(base: str, key: str, alias: Alias, sim_ports: list[int]) -> Outcome:
    """One request for ``alias`` through the stack at ``base`` (``…/v1``)."""
    if "chat" in alias.capabilities:
        status, rid, doc = _call(base + "/chat/completions", key, {
            "model": alias.id, "max_tokens": 1, "messages": [{"role": "user", "content": PROBE_TEXT}]})
    else:
        status, rid, doc = _call(base + "/embeddings", key, {"model": alias.id, "input": PROBE_TEXT})
    if status != 200:
        err = doc.get("error") if isinstance(doc, dict) else None
        code = err.get("code") if isinstance(err, dict) else None
        return Outcome(False, f"HTTP {status}" + (f" {code}" if code else "") if status else f"no reply ({code})")
    if sim_ports and not _seen_by_simulator(sim_ports, rid):
        return Outcome(False, f"HTTP 200, but none of this stack's simulators (ports {sim_ports}) saw request {rid}")
    return Outcome(True, "HTTP 200")


def sim_ports_of(cat: Catalog, alias: Alias, gateway_port: int, run_sim: bool) -> list[int]:
    """The launcher's simulator ports among the alias's deployments (none when it starts no simulator)."""
    if not run_sim:
        return []
    return sorted({d.port_at(gateway_port) for u in alias.upstreams for d in cat.deployments[u.model]
                   if d.host in LOOPBACK})


def wait_ready(base: str, key: str, cat: Catalog, gateway_port: int, run_sim: bool, timeout: float,
               should_stop: Callable[[], bool]) -> dict[str, Outcome]:
    """Probe every alias with a deployment until each has gone through, ``timeout`` passes or the stack is
    told to stop; returns each alias's last outcome (an alias without deployments is not probed)."""
    todo = {a.id: a for a in cat.aliases.values() if any(cat.deployments[u.model] for u in a.upstreams)}
    out = {a: Outcome(False, "no deployments (503 no_capacity)") for a in cat.aliases if a not in todo}
    deadline = time.monotonic() + timeout
    while todo and not should_stop():
        for name, alias in list(todo.items()):
            out[name] = probe(base, key, alias, sim_ports_of(cat, alias, gateway_port, run_sim))
            if out[name].ok:
                del todo[name]
        if not todo or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    return out
