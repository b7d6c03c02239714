"""What the model server gets (issue 22): a canonical request whatever the client sent; usage read by
content whatever shape the model server gives its usage chunk; SSE framings; deployment credentials."""
from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest

from conftest import Gateway, wait_for

MSGS = [{"role": "user", "content": "Dzień dobry"}]


def _record(gateway: Gateway, r: httpx.Response) -> dict[str, Any]:
    rec = gateway.sim_record(r.headers["x-request-id"])
    assert rec is not None, "the model server never saw the request"
    return rec


@pytest.mark.parametrize("content_type", ["application/x-www-form-urlencoded", "text/plain", None])
def test_forwarded_request_is_json_whatever_the_client_said(gateway: Gateway, client: httpx.Client,
                                                           content_type: str | None) -> None:
    """`curl -d` sends a JSON body as a form: the gateway parsed it as JSON and forwards its own JSON,
    so the model server (which refuses other media types, like vLLM) must be told application/json."""
    body = json.dumps({"model": "polish-pro", "messages": MSGS, "max_tokens": 3}).encode()
    headers = {} if content_type is None else {"Content-Type": content_type}
    r = client.post("/chat/completions", content=body, headers=headers)
    assert r.status_code == 200, r.text
    assert r.json()["model"] == "polish-pro"
    rec = _record(gateway, r)
    assert rec["content_type"] == "application/json"
    assert rec["content_length"] == str(rec["body_bytes"]) and rec["transfer_encoding"] is None


def test_chunked_client_body_arrives_with_its_length(gateway: Gateway, client: httpx.Client) -> None:
    body = json.dumps({"model": "polish-pro", "messages": MSGS, "max_tokens": 3}).encode()
    r = client.post("/chat/completions", content=iter([body[:7], body[7:]]),
                    headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert r.request.headers["transfer-encoding"] == "chunked"
    assert r.status_code == 200, r.text
    rec = _record(gateway, r)
    assert rec["content_type"] == "application/json"
    assert rec["content_length"] == str(rec["body_bytes"]) and rec["transfer_encoding"] is None


def test_embeddings_forwarded_as_json(gateway: Gateway, client: httpx.Client) -> None:
    body = json.dumps({"model": "embed", "input": "zdanie"}).encode()
    r = client.post("/embeddings", content=body, headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert r.status_code == 200, r.text
    assert _record(gateway, r)["content_type"] == "application/json"


def test_only_what_the_model_server_needs_is_forwarded(client: httpx.Client, org: tuple[str, str, str]) -> None:
    """Client credentials, vendor organisation/project headers, SDK telemetry, cookies, the client's
    address and its accept-encoding (a compressed reply could not be relayed event by event) stay here."""
    sent = {"OpenAI-Organization": "org-abc", "OpenAI-Project": "proj-xyz", "OpenAI-Beta": "assistants=v2",
            "X-Api-Key": "xk-secret", "Api-Key": "ak-secret", "Proxy-Authorization": "Basic cHJveHk=",
            "Cookie": "session=c00kie", "X-Stainless-Lang": "stainless-lang-x", "X-Stainless-Os": "stainless-os-x",
            "Accept-Encoding": "gzip, br", "X-Forwarded-For": "203.0.113.9"}
    body = {"model": "polish-pro", "messages": MSGS, "sim": {"echo": True}}
    r = client.post("/chat/completions", json=body, headers=sent)
    assert r.status_code == 200, r.text
    seen = json.loads(r.json()["choices"][0]["message"]["content"])["headers"]
    low = {k.lower() for k in seen}
    for name in sent:
        assert name.lower() not in low, (name, sorted(low))
    assert "authorization" not in low and "x-envoy-external-address" not in low
    assert seen["content-type"] == "application/json"
    dump = json.dumps(seen)
    for value in [org[2], *sent.values()]:
        assert value not in dump, value


# ---- SSE framings through the stack (issue 18 part 6) ------------------------------------------------

def _usage_row(gateway: Gateway, rid: str) -> dict[str, Any]:
    return dict(wait_for(lambda: gateway.sql("SELECT * FROM usage_records WHERE request_id = $1", rid), 10)[0])


def _sse(text: str) -> list[Any]:
    """Each event's data as an SSE client reads it (any line ending, comments ignored, data lines joined)."""
    events, data = [], []
    for line in text.replace("\r\n", "\n").replace("\r", "\n").split("\n"):
        if not line:
            if data:
                joined = "\n".join(data)
                events.append(joined if joined == "[DONE]" else json.loads(joined))
            data = []
        elif line.startswith("data:"):
            data.append(line[6:] if line.startswith("data: ") else line[5:])
    return events


FRAMING_KNOBS = [{"framing": "crlf"}, {"framing": "cr"}, {"framing": "lf", "comments": True, "multiline": True},
                 {"framing": "crlf", "comments": True, "multiline": True, "write_bytes": 7},
                 {"framing": "cr", "write_bytes": 1}]


@pytest.mark.parametrize("include_usage", [True, False])
@pytest.mark.parametrize("knobs", FRAMING_KNOBS, ids=lambda k: "-".join(f"{a}={b}" for a, b in k.items()))
def test_stream_framings(gateway: Gateway, client: httpx.Client, knobs: dict[str, Any], include_usage: bool) -> None:
    """Whatever SSE line ending, comments, multi-line data or write size the model server uses: the
    client gets every event with the alias, the usage chunk only when asked, and the usage is read
    (billed as reported, not estimated)."""
    body = {"model": "polish-pro", "messages": MSGS, "stream": True, "max_tokens": 50,
            "stream_options": {"include_usage": include_usage}, "sim": {"output_tokens": 6, **knobs}}
    r = client.post("/chat/completions", json=body)
    assert r.status_code == 200, r.text
    events = _sse(r.text)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all(c["model"] == "polish-pro" for c in chunks)
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    with_usage = [c for c in chunks if c.get("usage")]
    if include_usage:
        assert len(with_usage) == 1 and chunks[-1] is with_usage[0] and chunks[-1]["choices"] == []
    else:
        assert with_usage == [] and all(c["choices"] for c in chunks)
    row = _usage_row(gateway, r.headers["x-request-id"])
    assert row["estimated"] is False and row["completion_tokens"] == 6
    if include_usage:
        assert row["prompt_tokens"] == with_usage[0]["usage"]["prompt_tokens"]


# ---- usage by content (issue 22 part 2) ----------------------------------------------------------------

SHAPES = ["vllm", "sglang", "llamacpp", "tgi", "litellm"]


@pytest.mark.parametrize("include_usage", [True, False])
@pytest.mark.parametrize("shape", SHAPES)
def test_usage_chunk_shapes_with_the_sdk(gateway: Gateway, org: tuple[str, str, str], shape: str,
                                         include_usage: bool) -> None:
    """The usage of vLLM, SGLang, llama.cpp's server, TGI and LiteLLM, each in its own place: billed as
    reported; the openai SDK gets it on the last chunk (empty choices) only when it asked, and every
    choice's text and finish_reason either way."""
    sdk = openai.OpenAI(base_url=gateway.v1, api_key=org[2], max_retries=0, timeout=30)
    raw = sdk.chat.completions.with_raw_response.create(
        model="polish-pro", messages=MSGS, stream=True, n=2,  # type: ignore[arg-type]
        stream_options={"include_usage": include_usage},
        extra_body={"sim": {"usage_shape": shape, "output_tokens": 4}})
    rid = raw.headers["x-request-id"]
    chunks = list(raw.parse())
    texts = ["", ""]
    finishes: list[tuple[int, str]] = []
    for c in chunks:
        assert c.model == "polish-pro"
        for ch in c.choices:
            texts[ch.index] += ch.delta.content or ""
            if ch.finish_reason:
                finishes.append((ch.index, ch.finish_reason))
    assert all(len(t) > 0 for t in texts) and sorted(finishes) == [(0, "stop"), (1, "stop")]
    carrying = [c for c in chunks if c.usage is not None]
    if include_usage:
        assert carrying == [chunks[-1]] and chunks[-1].choices == []
        assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 8
    else:
        assert carrying == [] and all(c.choices for c in chunks)
    row = _usage_row(gateway, rid)
    assert row["estimated"] is False and row["completion_tokens"] == 8
    served = gateway.sim_record(rid)
    assert served is not None and served["prompt_tokens"] == row["prompt_tokens"]


# ---- null stream_options (issue 18 part 3) ------------------------------------------------------------

def test_null_stream_options_gets_the_usage_chunk(gateway: Gateway, client: httpx.Client) -> None:
    """SPEC section 4 rule 4 replaces a null stream_options by include_usage true: the client gets the
    usage chunk, last before [DONE], and the request is billed that usage."""
    r = client.post("/chat/completions", json={"model": "polish-pro", "messages": MSGS, "stream": True,
                                               "stream_options": None, "sim": {"output_tokens": 5}})
    assert r.status_code == 200, r.text
    events = _sse(r.text)
    assert events[-1] == "[DONE]"
    last = events[-2]
    assert last["choices"] == [] and last["usage"]["completion_tokens"] == 5
    assert [e for e in events[:-1] if e.get("usage")] == [last]
    row = _usage_row(gateway, r.headers["x-request-id"])
    assert (row["estimated"], row["prompt_tokens"], row["completion_tokens"]) == (
        False, last["usage"]["prompt_tokens"], 5)
