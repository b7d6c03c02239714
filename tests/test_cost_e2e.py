"""What a request cost, in its reply: the ``usage`` of a JSON reply (chat, embeddings) and the stream's usage
chunk carry ``cost_micro_pln``, the integer the usage record and the ledger hold for that request id, and
``estimated: true`` where the tokens are the gateway's estimate (docs/billing.md).  Through the whole
stack (Envoy and its relay, the ext_proc, Redis, the usage writer, PostgreSQL), read raw and by the
official openai SDK; docs/clients.md's snippets (the openai SDK, langchain, the Vercel AI SDK) are run by
tests/test_clients_e2e.py."""
from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest

from conftest import Gateway, wait_for

MSGS = [{"role": "user", "content": "Dzień dobry, policz mi to"}]


@pytest.fixture(scope="module")
def key(gateway: Gateway) -> str:
    return gateway.new_org(10_000_000)[2]


def billed(gw: Gateway, request_id: str) -> dict[str, Any]:
    """The request's usage record, once written, with its ledger debit checked against it."""
    rows = wait_for(lambda: gw.sql("SELECT * FROM usage_records WHERE request_id = $1", request_id),
                    timeout=10, interval=0.05)
    rec = rows[0]
    ledger = gw.sql("SELECT amount_micro_pln FROM ledger WHERE ref = $1", "usage:" + request_id)
    assert [r["amount_micro_pln"] for r in ledger] == ([-rec["cost_micro_pln"]] if rec["cost_micro_pln"] else [])
    return rec


def shown_is_billed(gw: Gateway, request_id: str, usage: dict[str, Any], estimated: bool) -> dict[str, Any]:
    """The usage a client got says exactly what the request was billed."""
    rec = billed(gw, request_id)
    cost = usage["cost_micro_pln"]
    assert type(cost) is int and cost > 0 and cost == rec["cost_micro_pln"], (usage, rec)
    assert rec["estimated"] is estimated and usage.get("estimated", False) is estimated
    assert "estimated" not in usage or usage["estimated"] is True  # present only where it is true
    assert usage["prompt_tokens"] == rec["prompt_tokens"]
    return rec


def post(gw: Gateway, key: str, path: str, body: dict[str, Any]) -> httpx.Response:
    r = httpx.post(gw.v1 + path, json=body, headers={"Authorization": f"Bearer {key}"}, timeout=30)
    assert r.status_code == 200, r.text
    return r


def stream_events(r: httpx.Response) -> list[Any]:
    return [json.loads(e[6:]) for e in r.text.split("\n\n") if e.startswith("data: {")]


# ---- raw HTTP ------------------------------------------------------------------------------------

@pytest.mark.parametrize("sim,estimated", [({}, False), ({"no_usage": True, "output_tokens": 5}, True)])
def test_a_chat_reply_says_what_it_cost(gateway: Gateway, key: str, sim: dict[str, Any], estimated: bool) -> None:
    r = post(gateway, key, "/chat/completions", {"model": "polish-pro", "messages": MSGS, "sim": sim})
    usage = r.json()["usage"]
    rec = shown_is_billed(gateway, r.headers["x-request-id"], usage, estimated)
    assert usage["completion_tokens"] == rec["completion_tokens"]
    # polish-pro: 1.5 / 3 PLN per million, each term rounded up on its own (docs/billing.md)
    assert usage["cost_micro_pln"] == -(-usage["prompt_tokens"] * 3 // 2) - (-usage["completion_tokens"] * 3)
    assert int(r.headers["content-length"]) == len(r.content)


@pytest.mark.parametrize("sim,estimated", [({}, False), ({"no_usage": True}, True)])
def test_an_embeddings_reply_says_what_it_cost(gateway: Gateway, key: str, sim: dict[str, Any],
                                               estimated: bool) -> None:
    r = post(gateway, key, "/embeddings", {"model": "embed", "input": ["Ala ma kota", "a pies"], "sim": sim})
    doc = r.json()
    assert len(doc["data"]) == 2 and "completion_tokens" not in doc["usage"]
    shown_is_billed(gateway, r.headers["x-request-id"], doc["usage"], estimated)


@pytest.mark.parametrize("sim,estimated", [({}, False), ({"usage_shape": "tgi"}, False),
                                           ({"no_usage": True, "output_tokens": 4}, True)])
def test_the_streams_usage_chunk_says_what_it_cost(gateway: Gateway, key: str, sim: dict[str, Any],
                                                   estimated: bool) -> None:
    """The model server's usage chunk (vLLM's shape), usage moved off a finish chunk (TGI's), and the
    gateway's own estimate of a stream that reported none: each the last chunk before [DONE]."""
    r = post(gateway, key, "/chat/completions", {"model": "advanced", "messages": MSGS, "stream": True,
                                                 "stream_options": {"include_usage": True}, "sim": sim})
    events = stream_events(r)
    assert r.text.endswith("data: [DONE]\n\n") and events[-1]["choices"] == []
    assert [e for e in events if e.get("usage")] == [events[-1]]
    usage = events[-1]["usage"]
    rec = shown_is_billed(gateway, r.headers["x-request-id"], usage, estimated)
    assert usage["completion_tokens"] == rec["completion_tokens"] and rec["stream"] is True
    # advanced: 4 / 8 PLN per million
    assert usage["cost_micro_pln"] == 4 * usage["prompt_tokens"] + 8 * usage["completion_tokens"]


def test_a_stream_without_usage_asked_shows_none(gateway: Gateway, key: str) -> None:
    r = post(gateway, key, "/chat/completions", {"model": "polish-fast", "messages": MSGS, "stream": True})
    assert "usage" not in r.text and "cost_micro_pln" not in r.text
    assert billed(gateway, r.headers["x-request-id"])["cost_micro_pln"] > 0


# ---- clients -------------------------------------------------------------------------------------

def test_the_openai_sdk_reads_the_cost(gateway: Gateway, key: str) -> None:
    """Clients ignore members they do not know: the openai SDK keeps it in the usage's extras."""
    sdk = openai.OpenAI(base_url=gateway.v1, api_key=key, max_retries=0, timeout=30)
    done = sdk.chat.completions.create(model="polish-pro", messages=MSGS)  # type: ignore[arg-type]
    assert done.usage is not None and done.usage.model_extra is not None
    assert list(done.usage.model_extra) == ["cost_micro_pln"]
    shown_is_billed(gateway, done._request_id or "", done.usage.model_dump(), False)
    assert getattr(done.usage, "cost_micro_pln") == done.usage.model_extra["cost_micro_pln"]

    stream = sdk.chat.completions.create(model="polish-pro", messages=MSGS, stream=True,  # type: ignore[arg-type]
                                         stream_options={"include_usage": True})
    last = [c for c in stream][-1]
    assert last.choices == [] and last.usage is not None and last.usage.model_extra is not None
    assert list(last.usage.model_extra) == ["cost_micro_pln"]
    shown_is_billed(gateway, stream.response.headers["x-request-id"], last.usage.model_dump(), False)

    emb = sdk.embeddings.create(model="embed", input="Ala ma kota")
    assert emb.usage.model_extra is not None and "cost_micro_pln" in emb.usage.model_extra
    shown_is_billed(gateway, emb._request_id or "", emb.usage.model_dump(), False)

