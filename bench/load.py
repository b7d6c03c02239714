"""wrk runs (one thread, the same settings for every system) and a functional check of each system
before it is loaded, so a number is never reported for a path that does not work."""
from __future__ import annotations

import json
import os
import subprocess
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import fixtures as fx
from .systems import System

LUA = Path(__file__).resolve().parent / "lua"


@dataclass(frozen=True)
class Scenario:
    name: str
    method: str
    path: str
    body: str | None  # file name of the request body in the run's directory
    route: str  # x-bench-route: json | sse
    script: str


SCENARIOS = {
    "chat": Scenario("chat", "POST", "/v1/chat/completions", "chat.json", "json", "post.lua"),
    "stream": Scenario("stream", "POST", "/v1/chat/completions", "stream.json", "sse", "stream.lua"),
    "embeddings": Scenario("embeddings", "POST", "/v1/embeddings", "embed.json", "json", "post.lua"),
    "models": Scenario("models", "GET", "/v1/models", None, "json", "post.lua"),
}


def write_bodies(d: Path) -> None:
    (d / "chat.json").write_bytes(fx.chat_request())
    (d / "stream.json").write_bytes(fx.stream_request())
    (d / "embed.json").write_bytes(fx.embed_request())


def wrk(system: System, sc: Scenario, conns: int, seconds: float, bodies: Path,
        script: str | None = None, extra_env: dict[str, str] | None = None) -> dict[str, Any]:
    env = dict(os.environ, BENCH_METHOD=sc.method, BENCH_PATH=sc.path, BENCH_KEY=system.key,
               BENCH_ROUTE=sc.route, BENCH_BODY=str(bodies / sc.body) if sc.body else "")
    env.update(extra_env or {})
    argv = ["wrk", "-t1", f"-c{conns}", f"-d{max(1, round(seconds))}s", "--timeout", "30s",
            "-s", str(LUA / (script or sc.script)), system.url(sc.name) + sc.path]
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=seconds + 120)
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("BENCH_RESULT ")), None)
    if out.returncode != 0 or line is None:
        raise RuntimeError(f"wrk failed ({out.returncode}): {out.stdout[-500:]} {out.stderr[-500:]}")
    r: dict[str, Any] = json.loads(line[len("BENCH_RESULT "):])
    r["conns"] = conns
    failed = max(r["err_status"], r.get("bad_streams", 0), r.get("bad_replies", 0))
    secs = r["duration_us"] / 1e6 if r["duration_us"] else 0.0
    # Only successful replies count: a fast error reply must not raise the figure.
    r["rps"] = max(0, r["requests"] - failed) / secs if secs else 0.0
    r["rps_all_replies"] = r["requests"] / secs if secs else 0.0
    r["socket_errors"] = r["err_connect"] + r["err_read"] + r["err_write"] + r["err_timeout"]
    # wrk counts replies with status >= 400; the stream/mixed scripts check each reply themselves too.
    r["errors"] = r["socket_errors"] + r["err_status"] + r.get("bad_streams", 0)
    if "bad_streams" in r:
        r["errors"] = r["socket_errors"] + max(r["err_status"], r["bad_streams"])
    if "bad_replies" in r:
        r["errors"] = r["socket_errors"] + max(r["err_status"], r["bad_replies"])
    return r


# ---- functional check -------------------------------------------------------------------------
def _get(system: System, sc: Scenario, bodies: Path) -> tuple[int, dict[str, str], bytes]:
    data = (bodies / sc.body).read_bytes() if sc.body else None
    headers = {"Authorization": f"Bearer {system.key}", "x-bench-route": sc.route}
    if data is not None:
        headers["Content-Type"] = "application/json"
    req = urllib.request.Request(system.url(sc.name) + sc.path, data=data, method=sc.method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, {k.lower(): v for k, v in r.headers.items()}, r.read()
    except urllib.error.HTTPError as e:
        return e.code, {k.lower(): v for k, v in e.headers.items()}, e.read()


def check(system: System, scenario: str, bodies: Path) -> str | None:
    """None if the reply is what a client must get, else what is wrong."""
    sc = SCENARIOS[scenario]
    try:
        status, headers, body = _get(system, sc, bodies)
    except Exception as e:  # noqa: BLE001
        return f"request failed: {e!r}"
    if status != 200:
        return f"HTTP {status}: {body[:200]!r}"
    try:
        if scenario == "stream":
            if not headers.get("content-type", "").startswith("text/event-stream"):
                return f"content-type {headers.get('content-type')!r}"
            events = [e for e in body.split(b"\n\n") if e.strip()]
            if events[-1].strip() != b"data: [DONE]":
                return f"stream does not end with [DONE]: {events[-1][:80]!r}"
            docs = [json.loads(e.strip()[5:]) for e in events[:-1]]
            content = [d for d in docs if d.get("choices") and d["choices"][0].get("delta", {}).get("content")]
            if len(content) != fx.STREAM_CHUNKS:
                return f"{len(content)} content chunks, expected {fx.STREAM_CHUNKS}"
            if not any(d.get("usage") for d in docs):
                return "no usage chunk although include_usage was asked for"
            want = fx.STREAM_ALIAS if system.expect_alias else fx.UP_STREAM
            if system.name != "litellm" and any(d.get("model") != want for d in docs):
                return f"model {docs[0].get('model')!r} in the stream, expected {want!r}"
            return None
        doc = json.loads(body)
        if scenario == "chat":
            want = fx.CHAT_ALIAS if system.expect_alias else fx.UP_CHAT
            if not doc["choices"][0]["message"]["content"] or not doc.get("usage"):
                return "no content or usage"
            if system.name != "litellm" and doc.get("model") != want:
                return f"model {doc.get('model')!r}, expected {want!r}"
        elif scenario == "embeddings":
            data = doc["data"]
            if len(data) != fx.EMBED_INPUTS or any(len(d["embedding"]) != fx.EMBED_DIM for d in data):
                return "wrong embeddings shape"
            want = fx.EMBED_ALIAS if system.expect_alias else fx.UP_EMBED
            if system.name != "litellm" and doc.get("model") != want:
                return f"model {doc.get('model')!r}, expected {want!r}"
        elif scenario == "models":
            if doc.get("object") != "list" or not doc.get("data"):
                return "not a model list"
    except (ValueError, KeyError, IndexError, TypeError) as e:
        return f"unexpected reply ({e!r}): {body[:200]!r}"
    return None
