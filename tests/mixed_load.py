"""A mixed load through the gateway (the suite's catalog, conftest.make_catalog): chat, streaming chat and
embeddings that succeed, an unknown model (404), model-server errors (sim 500), a dead deployment and an
alias without deployments (5xx), a key over its rate limit (429) and an organisation without balance
(402).  Used to fill the dashboard's panels (tests/test_prometheus_e2e.py)."""
from __future__ import annotations

import random
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import httpx

MSGS = [{"role": "user", "content": "Dzień dobry! Opowiedz krótko o Krakowie."}]
KINDS = ("chat", "stream", "embed", "chat", "stream", "unknown_model", "sim_500", "dead_deployment", "no_capacity")


@dataclass(frozen=True)
class Keys:
    paying: str         # a funded organisation with the stack's (high) default limits
    limited: str        # a funded organisation whose key may send 1 request per minute
    broke: str          # an organisation with no balance


def make_keys(gw: Any) -> Keys:
    """Fresh organisations and keys on the stack (a conftest.Gateway)."""
    _, _, paying = gw.new_org(1_000_000_000)
    _, limited_id, limited = gw.new_org(1_000_000_000)
    gw.admin(lambda a: a.set_key_limits(limited_id, 1))
    _, _, broke = gw.new_org(0)
    return Keys(paying, limited, broke)


def _body(kind: str, rng: random.Random) -> tuple[str, dict[str, Any]]:
    sim = {"ttft_ms": rng.choice([20, 40, 80, 150, 300]), "output_tokens": rng.randint(8, 48)}
    if kind == "chat":
        return "/chat/completions", {"model": rng.choice(["polish-fast", "polish-pro", "advanced"]),
                                     "messages": MSGS, "sim": sim}
    if kind == "stream":
        return "/chat/completions", {"model": rng.choice(["polish-fast", "polish-pro", "advanced"]),
                                     "messages": MSGS, "stream": True,
                                     "stream_options": {"include_usage": rng.random() < 0.5},
                                     "sim": {**sim, "itl_ms": rng.choice([5, 10, 20])}}
    if kind == "embed":
        return "/embeddings", {"model": "embed", "input": ["Ala ma kota", "Kot ma Alę"],
                               "sim": {"ttft_ms": rng.choice([10, 20, 40])}}
    model = {"unknown_model": "no-such-model", "sim_500": "polish-pro", "dead_deployment": "dead-alias",
             "no_capacity": "empty-alias"}[kind]
    return "/chat/completions", {"model": model, "messages": MSGS, **({"sim": {"status": 500}} if kind == "sim_500" else {})}


def _send(c: httpx.Client, key: str, kind: str, rng: random.Random) -> int:
    path, body = _body(kind, rng)
    with c.stream("POST", path, json=body, headers={"Authorization": f"Bearer {key}"}) as r:
        for _ in r.iter_bytes():
            pass
        return int(r.status_code)


def run_load(v1: str, keys: Keys, seconds: float, workers: int = 4) -> Counter[tuple[str, int]]:
    """``workers`` clients cycling through KINDS with the paying key, and one alternating the limited and
    the broke key, for ``seconds``: how many replies of each (kind, HTTP status) came back."""
    seen: Counter[tuple[str, int]] = Counter()
    lock = threading.Lock()
    deadline = time.monotonic() + seconds

    def client(k: int) -> None:
        rng = random.Random(k)
        with httpx.Client(base_url=v1, timeout=30) as c:
            n = k
            while time.monotonic() < deadline:
                if k < workers:
                    key, kind = keys.paying, KINDS[n % len(KINDS)]
                else:
                    key, kind = ((keys.limited, "limited"), (keys.broke, "broke"))[n % 2]
                status = _send(c, key, "chat" if kind in ("limited", "broke") else kind, rng)
                with lock:
                    seen[(kind, status)] += 1
                n += 1
                time.sleep(rng.uniform(0.05, 0.2))

    threads = [threading.Thread(target=client, args=(k,)) for k in range(workers + 1)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return seen
