"""No prompt, completion, embedding input or key is ever stored, logged or exported: a canary goes
through every endpoint and error path (model-server errors that quote it included), then every log,
the metrics, PostgreSQL's data directory (WAL included) and Redis's append-only file are searched."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import httpx

from conftest import Gateway, wait_for

CANARY = "Kanarek-7f3a9c-PRYWATNE"


def _files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file()]


def test_canary_is_nowhere(gateway: Gateway) -> None:
    org, kid, key = gateway.new_org()
    h = {"Authorization": f"Bearer {key}"}
    msgs = [{"role": "user", "content": CANARY}]
    c = httpx.Client(base_url=gateway.v1, headers=h, timeout=30)
    sent = [
        c.post("/chat/completions", json={"model": "polish-pro", "messages": msgs, "sim": {"echo": True}}),
        c.post("/chat/completions", json={"model": "polish-fast", "messages": msgs, "stream": True,
                                          "stream_options": {"include_usage": True}}),
        c.post("/embeddings", json={"model": "embed", "input": [CANARY, CANARY + " 2"]}),
        c.post("/embeddings", json={"model": "embed", "input": CANARY, "encoding_format": "base64"}),
        # model-server errors that quote the prompt back
        c.post("/chat/completions", json={"model": "polish-pro", "messages": msgs, "temperature": -1,
                                          "sim": {"quote_prompt": True}}),
        c.post("/chat/completions", json={"model": "polish-pro", "messages": msgs,
                                          "sim": {"status": 500, "message": CANARY, "quote_prompt": True}}),
        c.post("/embeddings", json={"model": "embed", "input": CANARY + " słowo" * 9000, "sim": {"quote_prompt": True}}),
        # malformed and rejected bodies
        c.post("/chat/completions", content=b'{"model": "polish-pro", "messages": [' + CANARY.encode()),
        c.post("/chat/completions", json={"model": CANARY, "messages": msgs}),
        c.post("/chat/completions", json={"model": "polish-pro", "messages": msgs, "max_tokens": CANARY}),
        c.post("/embeddings", json={"model": "embed", "input": [CANARY, 5]}),
        c.post("/v1/" + CANARY, json={"x": CANARY}),
        c.get("/models/" + CANARY),
        httpx.post(gateway.v1 + "/chat/completions", json={"model": "polish-pro", "messages": msgs},
                   headers={"Authorization": "Bearer " + CANARY}),
    ]
    statuses = [r.status_code for r in sent]
    assert statuses[:4] == [200, 200, 200, 200] and all(s >= 400 for s in statuses[4:]), statuses
    for r in sent[4:]:
        assert CANARY not in r.text
    c.close()

    # let the usage writer and the logs catch up, then stop nothing: search what is on disk now.  Envoy
    # writes its access log about once a second: wait until every request above is in it.
    ids = [r.headers["x-request-id"] for r in sent]
    access = gateway.stack.state / "logs" / "envoy-access.log"
    wait_for(lambda: all(i.encode() in access.read_bytes() for i in ids), timeout=15)
    lines = {d["request_id"]: d for d in map(json.loads, access.read_text().splitlines())}
    # it says which route a request took, never its path
    assert [lines[i]["route"] for i in ids] == ["chat"] * 2 + ["embeddings"] * 2 + ["chat"] * 2 + ["embeddings"] \
        + ["chat"] * 3 + ["embeddings", "other", "model", "chat"]
    assert all("path" not in d for d in lines.values())
    gateway.sql("CHECKPOINT")
    subprocess.run(["sync"], check=False)
    needles = [CANARY.encode(), key.encode()]
    state = gateway.stack.state
    hits = []
    places = _files(state / "logs") + _files(state / "pg") + _files(state / "redis")
    assert any("pg_wal" in str(p) for p in places) and any(p.suffix == ".aof" or "appendonly" in p.name
                                                           for p in places)
    for p in places:
        if p.name.startswith("sim-"):
            continue  # the model server's own log (a stand-in for vLLM), not the gateway's
        try:
            data = p.read_bytes()
        except OSError:
            continue
        hits += [f"{p}: {n[:12]!r}" for n in needles if n in data]
    metrics = httpx.get(f"http://127.0.0.1:{gateway.stack.s.metrics_http_port}/metrics").content
    hits += [f"metrics: {n[:12]!r}" for n in needles if n in metrics]
    assert not hits, hits
    assert os.path.exists(state / "logs" / "envoy-access.log")
