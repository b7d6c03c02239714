"""The whole stack against a real third-party OpenAI-compatible server: LiteLLM's proxy,
answering with mock responses and wanting its master key, which the gateway sends from api_key_env.

LiteLLM runs from its own environment (bench/.venv-litellm, `make litellm-env`); usage is what LiteLLM
reports (its mock token counts), read back from LiteLLM itself, never assumed."""
from __future__ import annotations

import json
import os
import secrets
import tempfile
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest
import yaml

from bench import litellm_env
from bench.procs import Procs
from conftest import Gateway, assert_error, make_catalog, running_stack, wait_for
from free_ports import free_port

KEY_ENV = "GW_TEST_LITELLM_KEY"
HOST = "127.0.0.3"  # the launcher starts a simulator for each deployment on 127.0.0.1: this one is LiteLLM's
MSGS = [{"role": "user", "content": "Ile kosztuje bilet do Krakowa?"}]
REPLY = "Dzień dobry z LiteLLM"
VECTOR = [0.25, -0.5, 0.125]
P_IN, P_OUT, P_EMB = 1_234_567, 2_345_679, 345_677  # micro-PLN per 1M tokens: odd, so rounding shows



def _ceil(a: int, b: int) -> int:
    return -(-a // b)


class Lite:
    """The running LiteLLM proxy: its URL and master key."""

    def __init__(self, port: int, key: str) -> None:
        self.port = port
        self.url = f"http://{HOST}:{port}/v1"
        self.key = key
        self.procs: Procs | None = None

    def post(self, path: str, body: dict[str, Any], key: str | None = None) -> httpx.Response:
        return httpx.post(self.url + path, json=body, timeout=30,
                          headers={"Authorization": f"Bearer {key or self.key}"})

    def wait_ready(self) -> None:
        """Ready when a real request goes through; else the end of its log says why."""
        assert self.procs is not None
        try:
            self.procs.wait_ready("litellm", self.answers, 120)
        except RuntimeError as e:
            tail = (self.procs.logs / "litellm.log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"LiteLLM did not start: {e}\n{tail}") from None

    def answers(self) -> bool:
        try:
            return self.post("/chat/completions", {"model": "up-lite-chat", "messages": MSGS}).status_code == 200
        except httpx.HTTPError:
            return False


@pytest.fixture(scope="module")
def lite() -> Iterator[Lite]:
    binary = litellm_env.ensure()
    if binary is None:
        pytest.skip(f"{litellm_env.SPEC} could not be installed into bench/.venv-litellm "
                    f"(see {litellm_env.LOG}); run `make litellm-env`")
    tmp = Path(tempfile.mkdtemp(prefix="gw-litellm-"))
    models = [("up-lite-chat", REPLY), ("up-lite-open", REPLY), ("up-lite-embed", VECTOR)]
    cfg = {"model_list": [{"model_name": name, "litellm_params": {
        "model": f"openai/{name}", "api_key": "sk-unused", "mock_response": mock}} for name, mock in models]}
    (tmp / "litellm.yaml").write_text(yaml.safe_dump(cfg))
    key = "sk-master-" + secrets.token_hex(16)
    port = free_port(HOST)
    procs, lite = Procs(tmp / "logs"), Lite(port, key)
    try:
        procs.start("litellm", litellm_env.proxy_argv(binary, tmp / "litellm.yaml", port, host=HOST),
                    env=litellm_env.proxy_env(key), cwd=str(tmp))
        lite.procs = procs  # gw waits for it once its own stack is up (they start side by side)
        yield lite
    finally:
        procs.stop_all()  # its own session: SIGTERM, then SIGKILL after 10 s


@pytest.fixture(scope="module")
def gw(lite: Lite) -> Iterator[Gateway]:
    def catalog(base: int) -> dict[str, Any]:
        doc = make_catalog(base)
        price = lambda i, o: [{"effective": "2026-01-01T00:00:00Z",  # noqa: E731
                               "input_micro_pln_per_1m": i, "output_micro_pln_per_1m": o}]
        chat = {"capabilities": ["chat"], "context_length": 8192, "max_output_tokens": 512, "prices": price(P_IN, P_OUT)}
        doc["aliases"].update({
            "lite-chat": {**chat, "upstreams": [{"model": "up-lite-chat"}]},
            "lite-open": {**chat, "upstreams": [{"model": "up-lite-open"}]},
            "lite-embed": {"capabilities": ["embeddings"], "context_length": 8192, "max_output_tokens": 0,
                           "prices": price(P_EMB, 0), "upstreams": [{"model": "up-lite-embed"}]}})
        dep = {"name": "litellm", "host": HOST, "port": lite.port}
        doc["upstream_models"].update({
            "up-lite-chat": {"deployments": [{**dep, "api_key_env": KEY_ENV}]},
            "up-lite-embed": {"deployments": [{**dep, "api_key_env": KEY_ENV}]},
            # the same server catalogued without a key: nothing the client sent may authenticate it
            "up-lite-open": {"deployments": [dep]}})
        return doc
    os.environ[KEY_ENV] = lite.key  # Envoy inherits it; running_stack restores the environment after
    with running_stack("gw-litellm-", catalog, default_rpm=100000, default_concurrency=1000) as g:
        lite.wait_ready()
        yield g


@pytest.fixture
def fresh(gw: Gateway) -> tuple[str, str, str]:
    return gw.new_org(10_000_000)


def _post(gw: Gateway, key: str, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(gw.v1 + path, json=body, headers={"Authorization": f"Bearer {key}"}, timeout=30)


def _sse(text: str) -> list[Any]:
    out: list[Any] = []
    for event in text.replace("\r\n", "\n").split("\n\n"):
        data = "\n".join(line[6:] if line.startswith("data: ") else line[5:]
                         for line in event.split("\n") if line.startswith("data:"))
        if data:
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def _billed(gw: Gateway, org: str, rid: str, usage: tuple[int, int], prices: tuple[int, int]) -> None:
    """The usage record has LiteLLM's tokens, not an estimate, at the catalog's prices, and the balance
    went down by exactly its cost."""
    row = wait_for(lambda: gw.sql("SELECT * FROM usage_records WHERE request_id = $1", rid), 10)[0]
    assert (row["estimated"], row["prompt_tokens"], row["completion_tokens"]) == (False, *usage)
    cost = _ceil(prices[0] * usage[0], 10**6) + _ceil(prices[1] * usage[1], 10**6)
    assert (row["input_price"], row["output_price"], row["cost_micro_pln"]) == (*prices, cost)
    bal = gw.admin(lambda a: a.balance(org))
    assert bal["balance_micro_pln"] == bal["ledger_micro_pln"] == 10_000_000 - cost


def _tokens(usage: dict[str, Any]) -> tuple[int, int]:
    return usage["prompt_tokens"], usage.get("completion_tokens") or 0


def test_chat(gw: Gateway, lite: Lite, fresh: tuple[str, str, str]) -> None:
    org, _, key = fresh
    assert key != lite.key
    r = _post(gw, key, "/chat/completions", {"model": "lite-chat", "messages": MSGS})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["model"] == "lite-chat" and body["choices"][0]["message"]["content"] == REPLY
    # what LiteLLM reports for this request, asked directly
    direct = lite.post("/chat/completions", {"model": "up-lite-chat", "messages": MSGS, "max_tokens": 512})
    assert direct.status_code == 200, direct.text
    assert _tokens(body["usage"]) == _tokens(direct.json()["usage"])
    _billed(gw, org, r.headers["x-request-id"], _tokens(body["usage"]), (P_IN, P_OUT))


def _litellm_stream_usage(lite: Lite) -> tuple[int, int]:
    r = lite.post("/chat/completions", {"model": "up-lite-chat", "messages": MSGS, "max_tokens": 512,
                                         "stream": True, "stream_options": {"include_usage": True}})
    assert r.status_code == 200, r.text
    (usage,) = [e["usage"] for e in _sse(r.text)[:-1] if e.get("usage")]
    return _tokens(usage)


@pytest.mark.parametrize("include_usage", [False, True])
def test_chat_stream(gw: Gateway, lite: Lite, fresh: tuple[str, str, str], include_usage: bool) -> None:
    """The gateway always asks LiteLLM for the usage (LiteLLM puts it in a chunk of its own with one empty
    choice); the client gets it only when it asked, as a last chunk with choices == [] before [DONE]."""
    org, _, key = fresh
    r = _post(gw, key, "/chat/completions", {"model": "lite-chat", "messages": MSGS, "stream": True,
                                              "stream_options": {"include_usage": include_usage}})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/event-stream")
    events = _sse(r.text)
    assert events[-1] == "[DONE]" and "[DONE]" not in events[:-1]
    chunks = events[:-1]
    assert all(c["model"] == "lite-chat" for c in chunks)
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]) == REPLY
    carrying = [c for c in chunks if c.get("usage")]
    reported = _litellm_stream_usage(lite)
    if include_usage:
        assert carrying == [chunks[-1]] and chunks[-1]["choices"] == []
        assert _tokens(chunks[-1]["usage"]) == reported
    else:
        assert carrying == [] and all(c["choices"] for c in chunks)
        assert all("usage" not in c for c in chunks)
    _billed(gw, org, r.headers["x-request-id"], reported, (P_IN, P_OUT))


def test_embeddings(gw: Gateway, lite: Lite, fresh: tuple[str, str, str]) -> None:
    org, _, key = fresh
    r = _post(gw, key, "/embeddings", {"model": "lite-embed", "input": "zdanie"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["model"] == "lite-embed" and body["data"][0]["embedding"] == VECTOR
    direct = lite.post("/embeddings", {"model": "up-lite-embed", "input": "zdanie"})
    assert direct.status_code == 200, direct.text
    assert body["usage"]["prompt_tokens"] == direct.json()["usage"]["prompt_tokens"] > 0
    _billed(gw, org, r.headers["x-request-id"], (body["usage"]["prompt_tokens"], 0), (P_EMB, 0))


def test_the_clients_key_never_authenticates_at_litellm(gw: Gateway, lite: Lite,
                                                        fresh: tuple[str, str, str]) -> None:
    """LiteLLM accepts its master key only: the client's key, sent to it directly, is refused; through the
    gateway the keyed alias works (so LiteLLM got the master key) and the same server catalogued without
    api_key_env refuses (nothing of the client's reached it as a key), billed nothing."""
    org, _, key = fresh
    assert key != lite.key
    direct = lite.post("/chat/completions", {"model": "up-lite-open", "messages": MSGS}, key=key)
    assert direct.status_code in (400, 401, 403), direct.status_code  # 400 "No connected db." in 1.106
    r = _post(gw, key, "/chat/completions", {"model": "lite-open", "messages": MSGS})
    assert_error(r, 502, "upstream_unavailable", "upstream_error")
    ok = _post(gw, key, "/chat/completions", {"model": "lite-chat", "messages": MSGS})
    assert ok.status_code == 200, ok.text
    _billed(gw, org, ok.headers["x-request-id"], _tokens(ok.json()["usage"]), (P_IN, P_OUT))  # and no more
    rows = {row["request_id"]: row for row in gw.sql("SELECT * FROM usage_records WHERE org_id = $1", org)}
    assert set(rows) == {ok.headers["x-request-id"], r.headers["x-request-id"]}
    refused = rows[r.headers["x-request-id"]]  # listed as the client saw it, at no cost
    assert (refused["status"], refused["error_code"], refused["cost_micro_pln"]) == (502, "upstream_unavailable", 0)
