"""Happy paths through the real stack with the official openai SDK: only base_url, api_key and model
changed.  Each test also proves what was billed."""
from __future__ import annotations

import base64
import json
import struct

import openai
import pytest

from conftest import Gateway, wait_for


@pytest.fixture
def sdk(gateway: Gateway, org: tuple[str, str, str]) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.v1, api_key=org[2], max_retries=0, timeout=30)


def _usage_row(gateway: Gateway, request_id: str) -> dict:
    rows = wait_for(lambda: gateway.sql("SELECT * FROM usage_records WHERE request_id = $1", request_id),
                    timeout=5)
    return rows[0]


def test_chat_non_streaming(gateway: Gateway, sdk: openai.OpenAI) -> None:
    raw = sdk.chat.completions.with_raw_response.create(
        model="polish-pro", messages=[{"role": "user", "content": "Dzień dobry, jak się masz?"}], max_tokens=5)
    c = raw.parse()
    rid = raw.headers["x-request-id"]
    assert c.model == "polish-pro" and c.object == "chat.completion"
    assert c.choices[0].message.role == "assistant" and c.choices[0].finish_reason == "length"
    assert c.usage is not None and c.usage.completion_tokens == 5
    assert c.usage.total_tokens == c.usage.prompt_tokens + 5
    served = gateway.sim_record(rid)
    assert served is not None and served["model"] == "up-pro"
    assert (served["prompt_tokens"], served["completion_tokens"]) == (c.usage.prompt_tokens, 5)
    row = _usage_row(gateway, rid)
    assert (row["prompt_tokens"], row["completion_tokens"], row["estimated"]) == (c.usage.prompt_tokens, 5, False)
    # ceil(p x 1.5 PLN/M) + ceil(5 x 3 PLN/M) in micro-PLN
    assert row["cost_micro_pln"] == -(-c.usage.prompt_tokens * 1_500_000 // 1_000_000) + 15
    assert (row["alias"], row["upstream_model"], row["status"], row["stream"]) == ("polish-pro", "up-pro", 200, False)


def test_chat_streaming_with_usage(gateway: Gateway, sdk: openai.OpenAI) -> None:
    stream = sdk.chat.completions.create(
        model="polish-fast", messages=[{"role": "user", "content": "Napisz coś"}], stream=True,
        stream_options={"include_usage": True}, extra_body={"sim": {"output_tokens": 6}})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[0].choices[0].delta.content == ""
    assert all(ch.model == "polish-fast" for ch in chunks)
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text
    closing = [ch for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    assert len(closing) == 1 and closing[0].choices[0].finish_reason == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 6
    row = _usage_row(gateway, chunks[0].id and stream.response.headers["x-request-id"])
    assert (row["completion_tokens"], row["estimated"], row["stream"]) == (6, False, True)


def test_chat_streaming_without_usage_hides_usage_chunk(gateway: Gateway, sdk: openai.OpenAI) -> None:
    stream = sdk.chat.completions.create(
        model="polish-pro", messages=[{"role": "user", "content": "Hej"}], stream=True,
        extra_body={"sim": {"output_tokens": 4}})
    chunks = list(stream)
    assert all(ch.usage is None for ch in chunks)
    assert all(ch.choices for ch in chunks)
    # billed all the same, from the usage the gateway always requests upstream
    row = _usage_row(gateway, stream.response.headers["x-request-id"])
    assert (row["completion_tokens"], row["estimated"]) == (4, False)


def test_n_choices_all_billed(gateway: Gateway, sdk: openai.OpenAI) -> None:
    raw = sdk.chat.completions.with_raw_response.create(
        model="polish-pro", messages=[{"role": "user", "content": "x"}], n=3, extra_body={"sim": {"output_tokens": 4}})
    c = raw.parse()
    assert len(c.choices) == 3 and c.usage is not None and c.usage.completion_tokens == 12
    assert _usage_row(gateway, raw.headers["x-request-id"])["completion_tokens"] == 12


def test_tools_forwarded(sdk: openai.OpenAI) -> None:
    c = sdk.chat.completions.create(
        model="advanced", messages=[{"role": "user", "content": "Pogoda?"}],
        tools=[{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}])
    assert c.choices[0].finish_reason == "tool_calls"
    assert c.choices[0].message.tool_calls and c.choices[0].message.tool_calls[0].function.name == "weather"


def test_embeddings_float_and_base64(gateway: Gateway, sdk: openai.OpenAI) -> None:
    raw = sdk.embeddings.with_raw_response.create(model="embed", input=["Ala ma kota", "Kot ma Alę"])
    e = raw.parse()
    assert e.model == "embed" and [d.index for d in e.data] == [0, 1]
    assert all(len(d.embedding) == 1024 for d in e.data)
    assert e.usage.prompt_tokens > 0 and e.usage.total_tokens == e.usage.prompt_tokens
    row = _usage_row(gateway, raw.headers["x-request-id"])
    assert (row["prompt_tokens"], row["completion_tokens"]) == (e.usage.prompt_tokens, 0)
    assert row["cost_micro_pln"] == -(-e.usage.prompt_tokens * 200_000 // 1_000_000)
    b = sdk.embeddings.create(model="embed", input="Ala ma kota", encoding_format="base64")
    vec = b.data[0].embedding
    if isinstance(vec, str):  # the SDK may hand back the string as it came
        vec = list(struct.unpack("<1024f", base64.b64decode(vec)))
    assert len(vec) == 1024
    assert vec == pytest.approx(e.data[0].embedding, rel=1e-6)


def test_models_list_and_get(sdk: openai.OpenAI) -> None:
    ids = [m.id for m in sdk.models.list()]
    assert set(ids) == {"polish-fast", "polish-pro", "advanced", "embed", "empty-alias", "dead-alias"}
    m = sdk.models.retrieve("polish-pro")
    d = m.model_dump()
    assert d["owned_by"] == "service" and d["object"] == "model" and isinstance(d["created"], int)
    assert d["capabilities"] == ["chat"] and d["context_length"] == 8192 and d["max_output_tokens"] == 2048
    assert d["pricing"] == {"input_micro_pln_per_1m": 1500000, "output_micro_pln_per_1m": 3000000,
                            "currency": "PLN"}


def test_sdk_errors_are_typed(gateway: Gateway, sdk: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as nf:
        sdk.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "x"}])
    assert nf.value.code == "model_not_found" and nf.value.param == "model"
    bad = openai.OpenAI(base_url=gateway.v1, api_key="sk-service-" + "x" * 40, max_retries=0)
    with pytest.raises(openai.AuthenticationError) as au:
        bad.models.list()
    assert au.value.code == "invalid_api_key" and json.loads(au.value.response.text)["error"]["type"] == "authentication_error"
