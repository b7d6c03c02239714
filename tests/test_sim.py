"""Tests of the vLLM simulator (``python -m sim``)."""

from __future__ import annotations

import base64
import json
import os
import struct
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from conftest import wait_for
from sim.tokens import chat_prompt_tokens, count_tokens
from free_ports import free_port

ROOT = Path(__file__).resolve().parent.parent
CHAT = "sim-chat"
SMALL = "sim-small"
EMBED = "sim-embed"



@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "sim", "--port", str(port), "--name", "dep-a",
         "--chat-model", CHAT, "--chat-model", f"{SMALL}@64", "--embed-model", f"{EMBED}@32"],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    url = f"http://127.0.0.1:{port}"
    try:
        def up() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"sim did not start: {proc.stderr.read() if proc.stderr else ''}")
            try:
                return httpx.get(f"{url}/health", timeout=0.5).status_code == 200
            except httpx.TransportError:
                return False
        wait_for(up, timeout=10)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()


@pytest.fixture()
def client(base_url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=base_url, timeout=10) as c:
        yield c


def _msgs(text: str = "Ile to kosztuje?") -> list[dict[str, Any]]:
    return [{"role": "system", "content": "Jesteś pomocny."}, {"role": "user", "content": text}]


def _chat(client: httpx.Client, rid: str | None = None, **body: Any) -> httpx.Response:
    body.setdefault("model", CHAT)
    body.setdefault("messages", _msgs())
    headers = {"X-Request-Id": rid} if rid else {}
    return client.post("/v1/chat/completions", json=body, headers=headers)


def _events(text: str) -> list[str]:
    assert text.endswith("\n\n")
    out = []
    for block in text.split("\n\n")[:-1]:
        assert block.startswith("data: "), block
        out.append(block[len("data: "):])
    return out


def _record(client: httpx.Client, rid: str) -> dict[str, Any]:
    r = client.get(f"/sim/requests/{rid}")
    assert r.status_code == 200
    return r.json()


def _assert_error(r: httpx.Response, status: int, etype: str) -> str:
    assert r.status_code == status
    assert r.headers["content-type"].startswith("application/json")
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["type"] == etype and err["code"] == status and err["param"] is None
    return str(err["message"])


# --------------------------------------------------------------------------- unit


def test_token_counting() -> None:
    assert count_tokens("Hello, world!") == 4
    assert count_tokens("  ") == 0
    msgs = [{"role": "user", "content": "a b"}, {"role": "assistant", "content": None},
            {"role": "user", "content": [{"type": "text", "text": "x y z"}]}]
    assert chat_prompt_tokens(msgs) == 3 + (3 + 1 + 2) + (3 + 1) + (3 + 1 + 3)


# --------------------------------------------------------------------------- basics


def test_health_and_models(client: httpx.Client) -> None:
    r = client.get("/health")
    assert r.status_code == 200 and r.content == b""
    models = client.get("/v1/models").json()
    assert models["object"] == "list"
    assert {m["id"] for m in models["data"]} == {CHAT, SMALL, EMBED}
    assert {m["id"]: m["max_model_len"] for m in models["data"]}[SMALL] == 64


def test_chat_non_stream(client: httpx.Client) -> None:
    rid = f"t-{uuid.uuid4().hex}"
    r = _chat(client, rid, unknown_field={"x": 1})
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/json"
    doc = r.json()
    assert doc["id"].startswith("chatcmpl-") and doc["object"] == "chat.completion"
    assert doc["model"] == CHAT and isinstance(doc["created"], int) and doc["prompt_logprobs"] is None
    (choice,) = doc["choices"]
    assert choice["index"] == 0 and choice["finish_reason"] == "stop" and choice["stop_reason"] is None
    assert choice["logprobs"] is None
    msg = choice["message"]
    assert msg["role"] == "assistant" and msg["tool_calls"] == []
    assert count_tokens(msg["content"]) == 16
    prompt = chat_prompt_tokens(_msgs())
    assert doc["usage"] == {"prompt_tokens": prompt, "total_tokens": prompt + 16, "completion_tokens": 16}
    # deterministic
    assert _chat(client).json()["choices"][0]["message"]["content"] == msg["content"]
    rec = _record(client, rid)
    assert rec == {"request_id": rid, "deployment": "dep-a", "model": CHAT, "endpoint": "chat", "stream": False,
                   "status": 200, "prompt_tokens": prompt, "completion_tokens": 16, "events_sent": 0,
                   "usage_reported": True, "completed": True, "content_type": "application/json",
                   "content_length": str(rec["body_bytes"]), "transfer_encoding": None,
                   "body_bytes": rec["body_bytes"]}
    assert rec["body_bytes"] > 0


def test_chat_stream_format(client: httpx.Client) -> None:
    rid = f"t-{uuid.uuid4().hex}"
    r = _chat(client, rid, stream=True, stream_options={"include_usage": True}, sim={"output_tokens": 5})
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/event-stream")
    events = _events(r.text)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    ids = {c["id"] for c in chunks}
    assert len(ids) == 1 and next(iter(ids)).startswith("chatcmpl-")
    assert all(c["object"] == "chat.completion.chunk" and c["model"] == CHAT for c in chunks)
    first, *content, closing, usage = chunks
    assert first["choices"] == [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                 "logprobs": None, "finish_reason": None}]
    assert "usage" not in first
    assert len(content) == 5
    for c in content:
        (ch,) = c["choices"]
        assert set(ch["delta"]) == {"content"} and ch["finish_reason"] is None
        assert count_tokens(ch["delta"]["content"]) == 1
    assert closing["choices"] == [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}]
    prompt = chat_prompt_tokens(_msgs())
    assert usage["choices"] == [] and usage["usage"] == {
        "prompt_tokens": prompt, "total_tokens": prompt + 5, "completion_tokens": 5}
    text = "".join(c["choices"][0]["delta"]["content"] for c in content)
    nonstream = _chat(client, sim={"output_tokens": 5}).json()["choices"][0]["message"]["content"]
    assert text == nonstream
    rec = _record(client, rid)
    assert rec["stream"] and rec["completed"] and rec["usage_reported"] and rec["completion_tokens"] == 5


def test_stream_without_usage(client: httpx.Client) -> None:
    rid = f"t-{uuid.uuid4().hex}"
    events = _events(_chat(client, rid, stream=True, max_tokens=3).text)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all("usage" not in c and c["choices"] for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    rec = _record(client, rid)
    assert rec["completed"] and not rec["usage_reported"] and rec["completion_tokens"] == 3


def test_max_tokens_length_and_n(client: httpx.Client) -> None:
    doc = _chat(client, max_tokens=4, n=2).json()
    assert [c["index"] for c in doc["choices"]] == [0, 1]
    for c in doc["choices"]:
        assert c["finish_reason"] == "length" and count_tokens(c["message"]["content"]) == 4
    assert doc["usage"]["completion_tokens"] == 8
    doc = _chat(client, max_completion_tokens=100, sim={"output_tokens": 3}).json()
    assert doc["choices"][0]["finish_reason"] == "stop" and doc["usage"]["completion_tokens"] == 3


def test_stop(client: httpx.Client) -> None:
    full = _chat(client, sim={"output_tokens": 10}).json()["choices"][0]["message"]["content"]
    words = full.split(" ")
    doc = _chat(client, stop=[" " + words[4], "never-there"], sim={"output_tokens": 10}).json()
    choice = doc["choices"][0]
    assert choice["message"]["content"] == " ".join(words[:4])
    assert choice["finish_reason"] == "stop" and doc["usage"]["completion_tokens"] == 4
    doc = _chat(client, stop="never-there", max_tokens=2, sim={"output_tokens": 10}).json()
    assert doc["choices"][0]["finish_reason"] == "length"


def test_tools(client: httpx.Client) -> None:
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}},
             {"type": "function", "function": {"name": "other"}}]
    doc = _chat(client, tools=tools).json()
    (choice,) = doc["choices"]
    assert choice["finish_reason"] == "tool_calls"
    msg = choice["message"]
    assert msg["content"] is None
    (call,) = msg["tool_calls"]
    assert call["id"].startswith("call_") and call["type"] == "function"
    assert call["function"] == {"name": "get_weather", "arguments": "{}"}
    assert doc["usage"]["completion_tokens"] == 5
    # tool_choice none → plain text
    doc = _chat(client, tools=tools, tool_choice="none").json()
    assert doc["choices"][0]["message"]["tool_calls"] == [] and doc["choices"][0]["finish_reason"] == "stop"
    # streaming
    events = _events(_chat(client, tools=tools, stream=True, stream_options={"include_usage": True}).text)
    chunks = [json.loads(e) for e in events[:-1]]
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    calls = [d["tool_calls"][0] for d in deltas if "tool_calls" in d]
    assert calls[0]["index"] == 0 and calls[0]["function"]["name"] == "get_weather"
    assert "".join(c["function"].get("arguments", "") for c in calls) == "{}"
    assert chunks[-2]["choices"][0]["finish_reason"] == "tool_calls"
    assert chunks[-1]["usage"]["completion_tokens"] == 5


def test_echo(client: httpx.Client) -> None:
    body = {"model": CHAT, "messages": _msgs(), "sim": {"echo": True}, "extra": [1, 2]}
    r = client.post("/v1/chat/completions", json=body, headers={"X-Custom": "abc"})
    doc = r.json()
    content = doc["choices"][0]["message"]["content"]
    echoed = json.loads(content)
    assert echoed["body"] == body
    assert echoed["headers"]["x-custom"] == "abc"
    assert doc["usage"]["completion_tokens"] == count_tokens(content)
    body["stream"] = True
    events = _events(client.post("/v1/chat/completions", json=body).text)
    contents = [json.loads(e)["choices"][0]["delta"].get("content") for e in events[1:-2]]
    assert len(contents) == 1 and json.loads(contents[0])["body"]["stream"] is True


# --------------------------------------------------------------------------- errors


def test_unknown_model(client: httpx.Client) -> None:
    msg = _assert_error(_chat(client, model="nope"), 404, "NotFoundError")
    assert msg == "The model `nope` does not exist."
    _assert_error(client.post("/v1/embeddings", json={"model": "nope", "input": "x"}), 404, "NotFoundError")


def test_wrong_kind(client: httpx.Client) -> None:
    _assert_error(_chat(client, model=EMBED), 400, "BadRequestError")
    _assert_error(client.post("/v1/embeddings", json={"model": CHAT, "input": "x"}), 400, "BadRequestError")


def test_context_length(client: httpx.Client) -> None:
    long_text = " ".join(["słowo"] * 70)
    prompt = chat_prompt_tokens(_msgs(long_text))
    msg = _assert_error(_chat(client, model=SMALL, messages=_msgs(long_text)), 400, "BadRequestError")
    assert msg == (f"This model's maximum context length is 64 tokens. However, your request has {prompt} "
                   "input tokens. Please reduce the length of the input messages.")
    prompt = chat_prompt_tokens(_msgs())
    msg = _assert_error(_chat(client, model=SMALL, max_tokens=60), 400, "BadRequestError")
    assert msg == (f"This model's maximum context length is 64 tokens. However, you requested {prompt + 60} "
                   f"tokens ({prompt} in the messages, 60 in the completion). Please reduce the length of the "
                   "messages or completion.")


def test_validation_errors(client: httpx.Client) -> None:
    msg = _assert_error(_chat(client, temperature=-1), 400, "BadRequestError")
    assert msg == "temperature must be non-negative, got -1.0."
    image = [{"role": "user", "content": [{"type": "text", "text": "co to?"},
                                          {"type": "image_url", "image_url": {"url": "data:,"}}]}]
    assert "is not a multimodal model" in _assert_error(_chat(client, messages=image), 400, "BadRequestError")
    for bad in ({"messages": []}, {"max_tokens": 0}, {"max_tokens": "5"}, {"n": 0}, {"top_p": 0},
                {"top_p": 1.5}, {"sim": {"ttft_ms": "slow"}}, {"sim": {"status": "500"}}, {"sim": 3},
                {"stream_options": {"include_usage": True}}, {"sim": {"framing": "crcr"}},
                {"sim": {"write_bytes": 0}}, {"sim": {"usage_shape": "openai"}}):
        _assert_error(_chat(client, **bad), 400, "BadRequestError")
    r = client.post("/v1/chat/completions", content=b"{not json", headers={"Content-Type": "application/json"})
    _assert_error(r, 400, "BadRequestError")
    # like vLLM (validate_json_request): a JSON body under another media type is refused
    ok = json.dumps({"model": CHAT, "messages": [{"role": "user", "content": "hej"}]}).encode()
    for media in ("application/x-www-form-urlencoded", "text/plain"):
        r = client.post("/v1/chat/completions", content=ok, headers={"Content-Type": media})
        assert "Only 'application/json'" in _assert_error(r, 400, "BadRequestError")
    r = client.post("/v1/chat/completions", content=ok, headers={"Content-Type": "application/json; charset=utf-8"})
    assert r.status_code == 200


def test_status_knob_and_quote_prompt(client: httpx.Client) -> None:
    rid = f"t-{uuid.uuid4().hex}"
    r = _chat(client, rid, sim={"status": 503, "message": "overloaded"})
    assert _assert_error(r, 503, "InternalServerError") == "overloaded"
    rec = _record(client, rid)
    assert rec["status"] == 503 and rec["completed"] and not rec["usage_reported"]
    assert rec["completion_tokens"] == 0
    assert _assert_error(_chat(client, sim={"status": 429}), 429, "TooManyRequestsError") == "simulated error"
    _assert_error(_chat(client, sim={"status": 422}), 422, "UnprocessableEntity")
    secret = "tajne hasło 1234"
    msg = _assert_error(_chat(client, messages=_msgs(secret), sim={"status": 500, "quote_prompt": True}),
                        500, "InternalServerError")
    assert msg == f"simulated error Prompt: {secret}"
    msg = _assert_error(_chat(client, messages=_msgs(secret), temperature=-2, sim={"quote_prompt": True}),
                        400, "BadRequestError")
    assert msg.endswith(f"Prompt: {secret}")


# --------------------------------------------------------------------------- knobs


def test_fail_after_chunks_stream(client: httpx.Client) -> None:
    rid = f"t-{uuid.uuid4().hex}"
    received = b""
    with pytest.raises(httpx.RemoteProtocolError):
        with client.stream("POST", "/v1/chat/completions", headers={"X-Request-Id": rid},
                           json={"model": CHAT, "messages": _msgs(), "stream": True,
                                 "sim": {"fail_after_chunks": 3}}) as r:
            assert r.status_code == 200
            for part in r.iter_raw():
                received += part
    text = received.decode()
    assert text.count("data: ") == 3 and "[DONE]" not in text
    rec = _record(client, rid)
    assert rec["status"] == 200 and not rec["completed"] and rec["completion_tokens"] == 2
    assert not rec["usage_reported"]


def test_fail_after_chunks_non_stream(client: httpx.Client) -> None:
    rid = f"t-{uuid.uuid4().hex}"
    with pytest.raises(httpx.RemoteProtocolError):
        _chat(client, rid, sim={"fail_after_chunks": 0})
    rec = _record(client, rid)
    assert rec["status"] == 200 and not rec["completed"] and not rec["usage_reported"]


def test_timing_knobs(client: httpx.Client) -> None:
    t0 = time.monotonic()
    with client.stream("POST", "/v1/chat/completions",
                       json={"model": CHAT, "messages": _msgs(), "stream": True,
                             "sim": {"ttft_ms": 150, "itl_ms": 10, "output_tokens": 4}}) as r:
        t_headers = time.monotonic() - t0
        body = r.read()
    assert t_headers >= 0.14
    assert time.monotonic() - t0 >= 0.14 + 6 * 0.009
    assert body.endswith(b"data: [DONE]\n\n")
    t0 = time.monotonic()
    doc = _chat(client, sim={"stall_ms": 150}).json()
    assert time.monotonic() - t0 >= 0.14 and doc["usage"]["completion_tokens"] == 16


def test_reply_bytes_and_no_usage(client: httpx.Client) -> None:
    r = _chat(client, sim={"reply_bytes": 5 * 1024 * 1024})
    assert len(r.content) == 5 * 1024 * 1024 and r.json()["object"] == "chat.completion"
    rid = f"t-{uuid.uuid4().hex}"
    doc = _chat(client, rid, sim={"no_usage": True}).json()
    assert "usage" not in doc
    assert not _record(client, rid)["usage_reported"]
    events = _events(_chat(client, stream=True, stream_options={"include_usage": True},
                           sim={"no_usage": True}).text)
    assert all("usage" not in json.loads(e) for e in events[:-1])


# --------------------------------------------------------------------------- embeddings


def _unpack(b64: str) -> list[float]:
    raw = base64.b64decode(b64)
    assert len(raw) == 4 * 1024
    return list(struct.unpack("<1024f", raw))


def test_embeddings(client: httpx.Client) -> None:
    rid = f"t-{uuid.uuid4().hex}"
    r = client.post("/v1/embeddings", json={"model": EMBED, "input": ["ala ma kota", "pies"]},
                    headers={"X-Request-Id": rid})
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    doc = r.json()
    assert doc["id"].startswith("embd-") and doc["object"] == "list" and doc["model"] == EMBED
    assert [d["index"] for d in doc["data"]] == [0, 1]
    assert all(d["object"] == "embedding" and len(d["embedding"]) == 1024 for d in doc["data"])
    assert abs(sum(v * v for v in doc["data"][0]["embedding"]) - 1) < 1e-6
    assert doc["usage"] == {"prompt_tokens": 4, "total_tokens": 4, "completion_tokens": 0}
    again = client.post("/v1/embeddings", json={"model": EMBED, "input": "ala ma kota"}).json()
    assert again["data"][0]["embedding"] == doc["data"][0]["embedding"]
    assert doc["data"][1]["embedding"] != doc["data"][0]["embedding"]
    b64 = client.post("/v1/embeddings", json={"model": EMBED, "input": "ala ma kota",
                                              "encoding_format": "base64"}).json()
    vec = _unpack(b64["data"][0]["embedding"])
    assert all(abs(a - b) < 1e-6 for a, b in zip(vec, doc["data"][0]["embedding"]))
    rec = _record(client, rid)
    assert rec["endpoint"] == "embeddings" and rec["prompt_tokens"] == 4 and rec["completion_tokens"] == 0
    assert rec["completed"] and rec["usage_reported"] and rec["deployment"] == "dep-a"


def test_embeddings_token_inputs_and_errors(client: httpx.Client) -> None:
    doc = client.post("/v1/embeddings", json={"model": EMBED, "input": [1, 2, 3]}).json()
    assert len(doc["data"]) == 1 and doc["usage"]["prompt_tokens"] == 3
    doc = client.post("/v1/embeddings", json={"model": EMBED, "input": [[1, 2], [3]]}).json()
    assert len(doc["data"]) == 2 and doc["usage"]["prompt_tokens"] == 3
    for bad in ({"input": []}, {"input": "x", "encoding_format": "int8"}, {"input": [1, "a"]}, {}):
        _assert_error(client.post("/v1/embeddings", json={"model": EMBED, **bad}), 400, "BadRequestError")
    msg = _assert_error(client.post("/v1/embeddings", json={"model": EMBED, "input": list(range(40))}),
                        400, "BadRequestError")
    assert msg == ("This model's maximum context length is 32 tokens. However, you requested 40 tokens in the "
                   "input for embedding generation. Please reduce the length of the input.")
    _assert_error(client.post("/v1/embeddings", json={"model": EMBED, "input": "x", "sim": {"status": 500}}),
                  500, "InternalServerError")


# --------------------------------------------------------------------------- records


def test_records_endpoints(client: httpx.Client) -> None:
    assert client.get("/sim/requests/does-not-exist").status_code == 404
    rid = f"t-{uuid.uuid4().hex}"
    _chat(client, rid)
    _chat(client)  # no X-Request-Id: gets a generated id
    data = client.get("/sim/requests").json()["data"]
    assert any(r["request_id"] == rid for r in data)
    assert all(set(r) == {"request_id", "deployment", "model", "endpoint", "stream", "status", "prompt_tokens",
                          "completion_tokens", "events_sent", "usage_reported", "completed", "content_type",
                          "content_length", "transfer_encoding", "body_bytes"} for r in data)
    assert client.delete("/sim/requests").status_code == 200
    assert client.get("/sim/requests").json() == {"data": []}
    assert client.get(f"/sim/requests/{rid}").status_code == 404


# --------------------------------------------------------------------------- embedded


def test_make_app_in_process() -> None:
    """``sim.make_app`` runs inside another event loop (here: a thread) without warnings."""
    import asyncio
    import threading

    from aiohttp import web

    from sim import make_app

    port = free_port()
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(make_app("emb", {"c": 100}, {"e": 100}))
    started = threading.Event()

    def run() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(runner.setup())
        loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
        started.set()
        loop.run_forever()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert started.wait(5)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=5) as c:
            r = c.post("/v1/chat/completions", json={"model": "c", "messages": _msgs(), "max_tokens": 2})
            assert r.json()["usage"]["completion_tokens"] == 2
            with pytest.raises(httpx.RemoteProtocolError):
                c.post("/v1/chat/completions", json={"model": "c", "messages": _msgs(), "stream": True,
                                                     "sim": {"fail_after_chunks": 1}}).read()
            assert c.get("/sim/requests").json()["data"][0]["deployment"] == "emb"
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(5)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()


# --- guided decoding ---------------------------------------------------------------

def _pydantic_schema() -> dict[str, Any]:
    from typing import Literal

    from pydantic import BaseModel

    class Address(BaseModel):
        city: str
        zip_code: str | None = None

    class Person(BaseModel):
        name: str
        age: int
        role: Literal["admin", "user"]
        tags: list[str]
        address: Address
        previous: list[Address]
        nickname: str | None

    return Person.model_json_schema()


def _stream_content(text: str) -> tuple[str, list[dict[str, Any]]]:
    chunks = [json.loads(e) for e in _events(text)[:-1]]
    content = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    return content, chunks


def test_json_schema_response_format(client: httpx.Client) -> None:
    import jsonschema

    schema = _pydantic_schema()
    assert "$defs" in schema
    for strict in (True, False):
        rf = {"type": "json_schema", "json_schema": {"name": "Person", "schema": schema, "strict": strict}}
        doc = _chat(client, response_format=rf).json()
        content = doc["choices"][0]["message"]["content"]
        value = json.loads(content)
        jsonschema.validate(value, schema)
        assert isinstance(value["address"], dict) and value["role"] in ("admin", "user")
        assert doc["usage"]["completion_tokens"] == count_tokens(content)
        assert _chat(client, response_format=rf).json()["choices"][0]["message"]["content"] == content
        streamed, chunks = _stream_content(_chat(client, response_format=rf, stream=True,
                                                 stream_options={"include_usage": True}).text)
        assert json.loads(streamed) == value
        assert chunks[-1]["usage"]["completion_tokens"] == count_tokens(content)
    doc = _chat(client, response_format={"type": "json_object"}).json()
    assert isinstance(json.loads(doc["choices"][0]["message"]["content"]), dict)
    assert _chat(client, response_format={"type": "bogus"}).status_code == 400


def test_guided_integers_stay_within_fractional_bounds() -> None:
    from sim.guided import generate

    for seed in map(str, range(200)):
        assert 3 <= generate({"type": "integer", "minimum": 2.5, "maximum": 3.7}, seed, {}, 0) <= 3
        n = generate({"type": "integer", "minimum": 40.2}, seed, {}, 0)
        assert isinstance(n, int) and n >= 41


def test_tool_call_arguments_and_choice(client: httpx.Client) -> None:
    import jsonschema

    schema = _pydantic_schema()
    tools = [{"type": "function", "function": {"name": "add_person", "parameters": schema}},
             {"type": "function", "function": {"name": "get_time", "parameters": {
                 "type": "object", "properties": {"tz": {"type": "string", "enum": ["UTC", "CET"]}},
                 "required": ["tz"]}}}]
    doc = _chat(client, tools=tools).json()
    (call,) = doc["choices"][0]["message"]["tool_calls"]
    assert call["function"]["name"] == "add_person"
    jsonschema.validate(json.loads(call["function"]["arguments"]), schema)
    named = {"type": "function", "function": {"name": "get_time"}}
    for choice in (named, "required"):
        doc = _chat(client, tools=tools[1:] if choice == "required" else tools, tool_choice=choice).json()
        (call,) = doc["choices"][0]["message"]["tool_calls"]
        assert call["function"]["name"] == "get_time"
        assert json.loads(call["function"]["arguments"])["tz"] in ("UTC", "CET")
    assert _chat(client, tools=tools, tool_choice="none").json()["choices"][0]["finish_reason"] == "stop"
    # second turn: the tool answered → final text (auto), so agent loops end
    msgs = _msgs() + [{"role": "assistant", "content": None, "tool_calls": [call]},
                      {"role": "tool", "tool_call_id": call["id"], "content": "12:00"}]
    doc = _chat(client, tools=tools, messages=msgs).json()
    choice0 = doc["choices"][0]
    assert choice0["finish_reason"] == "stop" and "12:00" in choice0["message"]["content"]
    # streamed: first delta id/type/name/arguments "", then pieces that join into the arguments
    events = _events(_chat(client, tools=tools, stream=True, stream_options={"include_usage": True}).text)
    chunks = [json.loads(e) for e in events[:-1]]
    calls = [c["choices"][0]["delta"]["tool_calls"][0] for c in chunks
             if c["choices"] and "tool_calls" in c["choices"][0]["delta"]]
    assert calls[0]["id"].startswith("call_") and calls[0]["type"] == "function"
    assert calls[0]["function"] == {"name": "add_person", "arguments": ""}
    assert len(calls) > 2 and all("id" not in c for c in calls[1:])
    args = "".join(c["function"]["arguments"] for c in calls[1:])
    jsonschema.validate(json.loads(args), schema)
    assert chunks[-1]["usage"]["completion_tokens"] == 3 + count_tokens(args)
    assert chunks[-2]["choices"][0]["finish_reason"] == "tool_calls"


def test_embedding_dimensions(client: httpx.Client) -> None:
    full = client.post("/v1/embeddings", json={"model": EMBED, "input": "abc"}).json()["data"][0]["embedding"]
    doc = client.post("/v1/embeddings", json={"model": EMBED, "input": "abc", "dimensions": 256}).json()
    vec = doc["data"][0]["embedding"]
    assert len(vec) == 256 and abs(sum(v * v for v in vec) - 1) < 1e-9
    norm = sum(v * v for v in full[:256]) ** 0.5
    assert all(abs(a - b / norm) < 1e-12 for a, b in zip(vec, full[:256]))
    assert client.post("/v1/embeddings", json={"model": EMBED, "input": "a", "dimensions": 0}).status_code == 400
