"""End-to-end tests (raw HTTP) of docs/interface.md sections 4, 5, 7 and 8: every client-visible error row and the
request rules of chat completions, embeddings, models and other paths.

Each assertion follows the interface, not the implementation. Where the interface leaves the ``param`` member of an error
open (errors reported by the model server), the test accepts ``null`` or the offending field's name.
"""
from __future__ import annotations

import json
import time
from typing import Any, Iterable

import httpx
import pytest

from conftest import Gateway, assert_error, rate_window_with, wait_for

MiB = 1024 * 1024
BODY_LIMIT = 20 * MiB
CANARY = "Kanarek7QzXv"
MSGS = [{"role": "user", "content": "Cześć"}]
ERR_TYPES = {"invalid_request_error", "authentication_error", "permission_error", "insufficient_quota",
             "rate_limit_error", "server_error", "upstream_error"}


# ----------------------------------------------------------------------------------------------- helpers


def no_limit_headers(r: httpx.Response) -> None:
    """Section 7: Retry-After only on 429; never X-RateLimit-* headers."""
    if r.status_code != 429:
        assert "retry-after" not in r.headers, dict(r.headers)
    assert not [h for h in r.headers if h.lower().startswith("x-ratelimit")], dict(r.headers)


def err(r: httpx.Response, status: int, code: str, type_: str, param: str | None = None) -> dict[str, Any]:
    e = assert_error(r, status, code, type_, param)
    assert e["type"] in ERR_TYPES
    no_limit_headers(r)
    return e


def err_any_param(r: httpx.Response, status: int, code: str, type_: str,
                  params: Iterable[str | None]) -> dict[str, Any]:
    """Like ``err`` where the interface does not pin ``param`` (model-server errors): null or the offending field."""
    assert r.status_code == status, (r.status_code, r.text)
    param = r.json()["error"].get("param")
    assert param is None or param in set(params), ("param", param, r.text)
    return err(r, status, code, type_, param)


def ok(r: httpx.Response) -> dict[str, Any]:
    assert r.status_code == 200, (r.status_code, r.text)
    assert r.headers.get("x-request-id")
    no_limit_headers(r)
    return dict(r.json())


def chat(client: httpx.Client, body: dict[str, Any], **kw: Any) -> httpx.Response:
    return client.post("/chat/completions", json=body, **kw)


def echo(client: httpx.Client, body: dict[str, Any], headers: dict[str, str] | None = None) -> tuple[
        httpx.Response, dict[str, Any], dict[str, str]]:
    """Non-streaming chat with the echo knob; (response, body the model server got, its headers)."""
    b = dict(body)
    b.setdefault("model", "polish-pro")
    b.setdefault("messages", MSGS)
    b["sim"] = {"echo": True}
    r = chat(client, b, headers=headers or {})
    doc = ok(r)
    seen = json.loads(doc["choices"][0]["message"]["content"])
    return r, seen["body"], seen["headers"]


def echo_stream(client: httpx.Client, body: dict[str, Any]) -> tuple[httpx.Response, list[dict[str, Any]],
                                                                     dict[str, Any]]:
    """Streaming chat with the echo knob; (response, chunks, body the model server got)."""
    b = dict(body)
    b.setdefault("model", "polish-pro")
    b.setdefault("messages", MSGS)
    b["stream"] = True
    b["sim"] = {"echo": True}
    r = chat(client, b)
    assert r.status_code == 200, (r.status_code, r.text)
    assert r.headers["content-type"].startswith("text/event-stream")
    events = [ln[len("data: "):] for ln in r.text.split("\n") if ln.startswith("data: ")]
    assert events and events[-1] == "[DONE]", r.text[-500:]
    chunks = [json.loads(e) for e in events[:-1]]
    text = "".join((c["choices"][0]["delta"].get("content") or "") for c in chunks if c["choices"])
    return r, chunks, json.loads(text)["body"]


def long_text(tokens: int) -> str:
    return " ".join(["słowo"] * tokens)


@pytest.fixture
def anon(gateway: Gateway) -> Iterable[httpx.Client]:
    with httpx.Client(base_url=gateway.v1, timeout=30) as c:
        yield c


def keyed(gateway: Gateway, key: str) -> httpx.Client:
    return httpx.Client(base_url=gateway.v1, headers={"Authorization": f"Bearer {key}"}, timeout=30)


# ------------------------------------------------------------------------------ section 5: authentication

ENDPOINTS = [
    ("POST", "/chat/completions", {"model": "polish-pro", "messages": MSGS}),
    ("POST", "/embeddings", {"model": "embed", "input": "tekst"}),
    ("GET", "/models", None),
    ("GET", "/models/polish-pro", None),
]


@pytest.mark.parametrize("method,path,body", ENDPOINTS)
def test_missing_key_401(anon: httpx.Client, method: str, path: str, body: Any) -> None:
    r = anon.request(method, path, json=body)
    err(r, 401, "invalid_api_key", "authentication_error")


BAD_AUTH = {
    "empty": "",
    "scheme_only": "Bearer",
    "basic_scheme": "Basic c2stc2VydmljZS1hYWFh",
    "no_scheme": "sk-service-" + "a" * 40,
    "short_key": "Bearer sk-service-abc",
    "long_key": "Bearer sk-service-" + "a" * 41,
    "wrong_prefix": "Bearer sk-other00-" + "a" * 40,
    "openai_style": "Bearer sk-proj-" + "a" * 48,
    "unknown_wellformed": "Bearer sk-service-" + "Zq9" * 13 + "Z",
}


@pytest.mark.parametrize("name", sorted(BAD_AUTH))
@pytest.mark.parametrize("method,path,body", ENDPOINTS)
def test_bad_key_401(anon: httpx.Client, name: str, method: str, path: str, body: Any) -> None:
    r = anon.request(method, path, json=body, headers={"Authorization": BAD_AUTH[name]})
    err(r, 401, "invalid_api_key", "authentication_error")


@pytest.mark.parametrize("scheme", ["Bearer", "bearer", "BEARER", "bEaReR"])
def test_scheme_word_case_insensitive(gateway: Gateway, org: tuple[str, str, str], scheme: str) -> None:
    with httpx.Client(base_url=gateway.v1, headers={"Authorization": f"{scheme} {org[2]}"}, timeout=30) as c:
        ok(c.get("/models"))
        doc = ok(chat(c, {"model": "polish-fast", "messages": MSGS}))
        assert doc["model"] == "polish-fast"


def test_revoked_key_401_everywhere(gateway: Gateway) -> None:
    org_id, kid, key = gateway.new_org(10_000_000)
    gateway.admin(lambda a: a.revoke_key(kid))
    with keyed(gateway, key) as c:
        for method, path, body in ENDPOINTS:
            err(c.request(method, path, json=body), 401, "invalid_api_key", "authentication_error")


def test_key_revoked_after_use_401_within_1s(gateway: Gateway) -> None:
    org_id, kid, key = gateway.new_org(10_000_000)
    with keyed(gateway, key) as c:
        ok(chat(c, {"model": "polish-fast", "messages": MSGS}))
        ok(c.get("/models"))
        gateway.admin(lambda a: a.revoke_key(kid))
        t0 = time.monotonic()
        # docs/interface.md section 3: refused within a second of the revocation (polled until then, not slept through)
        r = wait_for(lambda: (x := chat(c, {"model": "polish-fast", "messages": MSGS})).status_code == 401 and x,
                     timeout=1.0, interval=0.02)
        err(r, 401, "invalid_api_key", "authentication_error")
        r = wait_for(lambda: (x := c.get("/models")).status_code == 401 and x,
                     timeout=max(0.0, t0 + 1.0 - time.monotonic()), interval=0.02)
        err(r, 401, "invalid_api_key", "authentication_error")
        err(chat(c, {"model": "polish-fast", "messages": MSGS}), 401, "invalid_api_key", "authentication_error")


def test_other_key_of_same_org_still_works_after_revoke(gateway: Gateway) -> None:
    org_id, kid, key = gateway.new_org(10_000_000)
    kid2, key2 = gateway.admin(lambda a: a.create_key(org_id))
    gateway.admin(lambda a: a.revoke_key(kid))
    with keyed(gateway, key) as c:
        err(c.get("/models"), 401, "invalid_api_key", "authentication_error")
    with keyed(gateway, key2) as c:
        ok(c.get("/models"))


def test_suspended_org_403(gateway: Gateway) -> None:
    org_id, kid, key = gateway.new_org(10_000_000)
    gateway.admin(lambda a: a.set_status(org_id, "suspended"))
    with keyed(gateway, key) as c:
        for method, path, body in ENDPOINTS:
            err(c.request(method, path, json=body), 403, "org_suspended", "permission_error")


def test_suspended_org_unknown_key_still_401(gateway: Gateway) -> None:
    """A malformed key is rejected before any lookup, whatever the organisation's state."""
    org_id, kid, key = gateway.new_org(10_000_000)
    gateway.admin(lambda a: a.set_status(org_id, "suspended"))
    with keyed(gateway, key[:-1]) as c:
        err(c.get("/models"), 401, "invalid_api_key", "authentication_error")


def test_suspension_after_use_takes_effect(gateway: Gateway) -> None:
    org_id, kid, key = gateway.new_org(10_000_000)
    with keyed(gateway, key) as c:
        ok(chat(c, {"model": "polish-fast", "messages": MSGS}))
        gateway.admin(lambda a: a.set_status(org_id, "suspended"))
        r = wait_for(lambda: (lambda x: x if x.status_code == 403 else None)(
            chat(c, {"model": "polish-fast", "messages": MSGS})), timeout=5)
        err(r, 403, "org_suspended", "permission_error")


@pytest.mark.parametrize("balance", [0, -1_000_000])
def test_not_positive_balance_402(gateway: Gateway, balance: int) -> None:
    org_id, kid, key = gateway.new_org(balance)
    with keyed(gateway, key) as c:
        err(chat(c, {"model": "polish-fast", "messages": MSGS}), 402, "insufficient_quota", "insufficient_quota")
        err(chat(c, {"model": "polish-fast", "messages": MSGS, "stream": True}), 402, "insufficient_quota",
            "insufficient_quota")
        err(c.post("/embeddings", json={"model": "embed", "input": "tekst"}), 402, "insufficient_quota",
            "insufficient_quota")


def test_models_skip_balance_check(gateway: Gateway) -> None:
    org_id, kid, key = gateway.new_org(0)
    with keyed(gateway, key) as c:
        doc = ok(c.get("/models"))
        assert doc["object"] == "list"
        assert {"polish-fast", "polish-pro", "advanced", "embed"} <= {m["id"] for m in doc["data"]}
        m = ok(c.get("/models/polish-pro"))
        assert m["id"] == "polish-pro"
        # the id percent-encoded is the same id (RFC 3986)
        assert ok(c.get("/models/%70olish%2Dpro"))["id"] == "polish-pro"
        err(c.get("/models/no-such-alias"), 404, "model_not_found", "invalid_request_error", "model")


def test_top_up_lifts_402(gateway: Gateway) -> None:
    org_id, kid, key = gateway.new_org(0)
    with keyed(gateway, key) as c:
        err(chat(c, {"model": "polish-fast", "messages": MSGS}), 402, "insufficient_quota", "insufficient_quota")
        gateway.admin(lambda a: a.credit(org_id, 5_000_000))
        r = wait_for(lambda: (lambda x: x if x.status_code == 200 else None)(
            chat(c, {"model": "polish-fast", "messages": MSGS})), timeout=5)
        ok(r)


# ------------------------------------------------------------------------- section 4: request ids


def test_request_id_on_every_response_and_unique(client: httpx.Client, anon: httpx.Client) -> None:
    rs = [client.get("/models"), client.get("/models"), anon.get("/models"),
          chat(client, {"model": "polish-fast", "messages": MSGS}),
          client.post("/embeddings", json={"model": "embed", "input": "x"}),
          client.get("/completions"), client.post("/chat/completions", content=b"{")]
    ids = [r.headers.get("x-request-id") for r in rs]
    assert all(ids), ids
    assert len(set(ids)) == len(ids), ids


def test_client_request_id_ignored_and_not_echoed(gateway: Gateway, client: httpx.Client) -> None:
    mine = "client-chosen-id-0123456789"
    r, body, headers = echo(client, {}, headers={"X-Request-Id": mine})
    rid = r.headers["x-request-id"]
    assert rid != mine and mine not in rid
    assert headers.get("x-request-id") == rid, headers
    assert mine not in json.dumps(headers)
    rec = gateway.sim_record(rid)
    assert rec is not None and rec["endpoint"] == "chat"
    assert gateway.sim_record(mine) is None


def test_client_request_id_ignored_on_errors(client: httpx.Client, anon: httpx.Client) -> None:
    mine = "client-chosen-id-err"
    for r in (anon.get("/models", headers={"X-Request-Id": mine}),
              client.post("/chat/completions", json={"model": "nope", "messages": MSGS},
                          headers={"X-Request-Id": mine})):
        rid = r.headers["x-request-id"]
        assert rid != mine
        assert r.json()["error"]["request_id"] == rid


# -------------------------------------------------------------------- section 4: chat model / messages


@pytest.mark.parametrize("model", ["nope", "gpt-4o", "gpt-3.5-turbo", "up-pro", "POLISH-PRO", ""])
def test_chat_unknown_alias_404(client: httpx.Client, model: str) -> None:
    err(chat(client, {"model": model, "messages": MSGS}), 404, "model_not_found", "invalid_request_error", "model")


def test_chat_unknown_alias_404_stream(client: httpx.Client) -> None:
    err(chat(client, {"model": "gpt-4o", "messages": MSGS, "stream": True}), 404, "model_not_found",
        "invalid_request_error", "model")


def test_chat_with_embed_alias_400(client: httpx.Client) -> None:
    err(chat(client, {"model": "embed", "messages": MSGS}), 400, "invalid_request", "invalid_request_error", "model")


def test_chat_null_model_400(client: httpx.Client) -> None:
    err(chat(client, {"model": None, "messages": MSGS}), 400, "invalid_request", "invalid_request_error", "model")


def test_chat_missing_model_400(client: httpx.Client) -> None:
    err(chat(client, {"messages": MSGS}), 400, "invalid_request", "invalid_request_error", "model")


@pytest.mark.parametrize("messages", ["<missing>", None, [], "hello", {"role": "user", "content": "x"}])
def test_chat_bad_messages_400(client: httpx.Client, messages: Any) -> None:
    body: dict[str, Any] = {"model": "polish-pro"}
    if messages != "<missing>":
        body["messages"] = messages
    err(chat(client, body), 400, "invalid_request", "invalid_request_error", "messages")


def test_chat_empty_messages_400_stream(client: httpx.Client) -> None:
    err(chat(client, {"model": "polish-pro", "messages": [], "stream": True}), 400, "invalid_request",
        "invalid_request_error", "messages")


# ----------------------------------------------------------------------- section 4 rule 3: max_tokens

BAD_MAX = [0, -1, "5", 1.5, True, False, [], {}, "abc"]


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
@pytest.mark.parametrize("value", BAD_MAX, ids=[repr(v) for v in BAD_MAX])
def test_bad_max_tokens_400(client: httpx.Client, field: str, value: Any) -> None:
    r = chat(client, {"model": "polish-pro", "messages": MSGS, field: value})
    err(r, 400, "invalid_request", "invalid_request_error", field)


@pytest.mark.parametrize("alias,ceiling", [("polish-pro", 2048), ("polish-fast", 2048), ("advanced", 4096)])
@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_max_tokens_clamped(client: httpx.Client, alias: str, ceiling: int, field: str) -> None:
    r, body, _ = echo(client, {"model": alias, field: 999999})
    assert body["max_tokens"] == ceiling
    assert "max_completion_tokens" not in body
    assert r.json()["model"] == alias


def test_max_tokens_huge_integer_clamped(client: httpx.Client) -> None:
    _, body, _ = echo(client, {"max_tokens": 2 ** 70})
    assert body["max_tokens"] == 2048


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_max_tokens_within_ceiling_forwarded(client: httpx.Client, field: str) -> None:
    _, body, _ = echo(client, {field: 77})
    assert body["max_tokens"] == 77
    assert "max_completion_tokens" not in body
    _, body, _ = echo(client, {field: 2048})
    assert body["max_tokens"] == 2048


@pytest.mark.parametrize("extra", [{}, {"max_tokens": None}, {"max_completion_tokens": None},
                                   {"max_tokens": None, "max_completion_tokens": None}],
                         ids=["omitted", "null_max_tokens", "null_max_completion_tokens", "both_null"])
@pytest.mark.parametrize("alias,ceiling", [("polish-pro", 2048), ("advanced", 4096)])
def test_max_tokens_absent_or_null_is_ceiling(client: httpx.Client, extra: dict[str, Any], alias: str,
                                              ceiling: int) -> None:
    _, body, _ = echo(client, {"model": alias, **extra})
    assert body["max_tokens"] == ceiling
    assert "max_completion_tokens" not in body


def test_max_tokens_clamped_stream(client: httpx.Client) -> None:
    _, _, body = echo_stream(client, {"max_completion_tokens": 999999})
    assert body["max_tokens"] == 2048
    assert "max_completion_tokens" not in body


# -------------------------------------------------------------- section 4 rules 4-6, 8: forwarding


def test_model_rewritten_and_alias_echoed(client: httpx.Client) -> None:
    r, body, _ = echo(client, {"model": "polish-pro"})
    assert body["model"] == "up-pro"
    assert r.json()["model"] == "polish-pro"


def test_null_fields_forwarded_as_sent(client: httpx.Client) -> None:
    nulls = {k: None for k in ("temperature", "top_p", "stop", "user", "n", "seed", "tools", "tool_choice",
                               "response_format", "logprobs", "presence_penalty", "frequency_penalty",
                               "stream_options", "some_unknown_field")}
    _, body, _ = echo(client, dict(nulls))
    for k in nulls:
        assert k in body and body[k] is None, (k, body)


def test_null_stream_forwarded_and_non_streaming(client: httpx.Client) -> None:
    r, body, _ = echo(client, {"stream": None})
    assert r.headers["content-type"].startswith("application/json")
    assert "stream" in body and body["stream"] is None


def test_null_stream_options_on_stream_becomes_include_usage(client: httpx.Client) -> None:
    _, chunks, body = echo_stream(client, {"stream_options": None})
    assert body["stream_options"] == {"include_usage": True}


def test_stream_usage_always_requested_upstream(client: httpx.Client) -> None:
    _, chunks, body = echo_stream(client, {})
    assert body["stream_options"]["include_usage"] is True
    assert all("usage" not in c or c["usage"] is None for c in chunks), "usage not requested by the client"
    _, chunks, body = echo_stream(client, {"stream_options": {"include_usage": False}})
    assert body["stream_options"]["include_usage"] is True
    assert all("usage" not in c or c["usage"] is None for c in chunks)
    _, chunks, body = echo_stream(client, {"stream_options": {"include_usage": True}})
    assert body["stream_options"]["include_usage"] is True
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["prompt_tokens"] > 0


def test_unknown_and_optional_fields_forwarded_unchanged(client: httpx.Client) -> None:
    sent = {
        "temperature": 0.3, "top_p": 0.9, "stop": ["###", "KONIEC"], "user": "u-123", "n": 1, "seed": 7,
        "response_format": {"type": "text"}, "logprobs": False, "presence_penalty": 0.5,
        "frequency_penalty": -0.25, "best_of": 1,
        "x_custom": {"nested": [1, None, "zażółć", {"a": True}], "num": 1.5e-7},
        "metadata": {"k": "v"},
    }
    messages = [{"role": "system", "content": "Jesteś pomocny.", "name": "sys"},
                {"role": "user", "content": [{"type": "text", "text": "Cześć"}]},
                {"role": "assistant", "content": None,
                 "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
                {"role": "tool", "content": "wynik", "tool_call_id": "c1"},
                {"role": "user", "content": "Dalej"}]
    _, body, _ = echo(client, {**sent, "messages": messages})
    for k, v in sent.items():
        assert body[k] == v, k
    assert body["messages"] == messages


def test_vendor_and_auth_headers_not_forwarded(client: httpx.Client, org: tuple[str, str, str]) -> None:
    _, _, headers = echo(client, {}, headers={"OpenAI-Organization": "org-abc", "OpenAI-Project": "proj-xyz",
                                              "X-Api-Key": "xk-secret", "X-Gateway-Cluster": "upstream_up-adv"})
    low = {k.lower(): v for k, v in headers.items()}
    assert "openai-organization" not in low and "openai-project" not in low, low
    assert "x-api-key" not in low and "authorization" not in low, low
    # the routing header is the gateway's choice, never the client's
    assert low["x-gateway-cluster"] == "upstream_up-pro", low
    dump = json.dumps(headers)
    assert org[2] not in dump, "client API key forwarded upstream"
    assert "org-abc" not in dump and "proj-xyz" not in dump and "xk-secret" not in dump


ENVOY_CONTROLS = {"X-Envoy-Retry-On": "5xx,reset", "X-Envoy-Max-Retries": "3", "X-Envoy-Upstream-Rq-Timeout-Ms": "100",
                  "X-Envoy-Upstream-Rq-Per-Try-Timeout-Ms": "50", "X-Envoy-Internal": "true"}


def test_a_clients_envoy_control_headers_are_dropped_at_the_door(client: httpx.Client, gateway: Gateway) -> None:
    """x-envoy-* request headers steer Envoy's router (retries, timeouts) for a client it counts as
    internal, and it counts a loopback peer so: a client's never reach the router or the model server.
    A model server's 503 stays one attempt (docs/interface.md section 7 retries only a connection failure or a
    missing first byte) and the interface's first-byte wait stays 180 s, whatever the client asks."""
    _, _, headers = echo(client, {}, headers=ENVOY_CONTROLS)
    low = {k.lower(): v for k, v in headers.items()}
    for name in ENVOY_CONTROLS:
        if name.lower() != "x-envoy-internal":
            assert name.lower() not in low, low
    assert int(low.get("x-envoy-expected-rq-timeout-ms", "180000")) >= 180_000, low
    # a slow first byte (0.8 s) is waited for, not cut at the client's 100 ms
    r = chat(client, {"model": "polish-pro", "messages": MSGS, "max_tokens": 2, "sim": {"ttft_ms": 800}},
             headers=ENVOY_CONTROLS)
    assert r.status_code == 200, r.text
    # a model server's 503 is not retried on the other deployment
    r = chat(client, {"model": "polish-pro", "messages": MSGS, "max_tokens": 2, "sim": {"status": 503}},
             headers=ENVOY_CONTROLS)
    assert r.status_code == 502 and r.json()["error"]["code"] == "upstream_unavailable", r.text
    rid = r.headers["x-request-id"]
    seen = [gateway.sim_record(rid, sim) for sim in (gateway.sim_a, gateway.sim_b)]
    assert sum(rec is not None for rec in seen) == 1, seen


def test_chunked_and_body_less_posts(client: httpx.Client, org: tuple[str, str, str]) -> None:
    """A POST without a length (chunked) or without a body takes Envoy's other route, on which the
    ext_proc sees the request headers: the same answers, headers stripped the same way."""
    body = json.dumps({"model": "polish-pro", "messages": MSGS, "sim": {"echo": True}}).encode()
    r = client.post("/chat/completions", content=iter([body[:10], body[10:]]),
                    headers={"Content-Type": "application/json", "OpenAI-Project": "proj-xyz"})
    assert "content-length" not in r.request.headers and r.request.headers["transfer-encoding"] == "chunked"
    seen = json.loads(ok(r)["choices"][0]["message"]["content"])
    assert seen["body"]["model"] == "up-pro" and seen["body"]["messages"] == MSGS
    low = {k.lower() for k in seen["headers"]}
    assert "authorization" not in low and "openai-project" not in low, low
    assert org[2] not in json.dumps(seen["headers"])
    for kw in ({}, {"content": b""}):
        err(client.post("/chat/completions", **kw), 400, "invalid_json", "invalid_request_error")
        err(client.post("/embeddings", **kw), 400, "invalid_json", "invalid_request_error")
    r = client.post("/chat/completions", content=b"", headers={"Authorization": "Bearer sk-nope"})
    err(r, 401, "invalid_api_key", "authentication_error")


# ------------------------------------------------------------------------------- bodies, JSON, size


@pytest.mark.parametrize("path", ["/chat/completions", "/embeddings"])
@pytest.mark.parametrize("raw", [b"{", b"not json", b"", b'{"model": "polish-pro",}', b"\xff\xfe{}"],
                         ids=["open_brace", "text", "empty", "trailing_comma", "bad_utf8"])
def test_malformed_json_400(client: httpx.Client, path: str, raw: bytes) -> None:
    r = client.post(path, content=raw, headers={"Content-Type": "application/json"})
    err(r, 400, "invalid_json", "invalid_request_error")


def test_malformed_json_message_has_no_prompt_text(client: httpx.Client) -> None:
    raw = ('{"model": "polish-pro", "messages": [{"role": "user", "content": "' + CANARY + '"}').encode()
    e = err(client.post("/chat/completions", content=raw, headers={"Content-Type": "application/json"}),
            400, "invalid_json", "invalid_request_error")
    assert CANARY not in e["message"]


def test_malformed_json_without_key_401_first(anon: httpx.Client) -> None:
    err(anon.post("/chat/completions", content=b"{"), 401, "invalid_api_key", "authentication_error")


def _padded(path: str, size: int) -> bytes:
    base: dict[str, Any] = ({"model": "polish-fast", "messages": MSGS} if path == "/chat/completions"
                            else {"model": "embed", "input": "tekst"})
    base["padding"] = ""
    empty = len(json.dumps(base).encode())
    base["padding"] = "x" * (size - empty)
    raw = json.dumps(base).encode()
    assert len(raw) == size
    return raw


@pytest.mark.parametrize("path", ["/chat/completions", "/embeddings"])
def test_body_over_20_mib_400(client: httpx.Client, path: str) -> None:
    r = client.post(path, content=_padded(path, BODY_LIMIT + 1), headers={"Content-Type": "application/json"})
    err(r, 400, "invalid_request", "invalid_request_error")
    r = client.post(path, content=_padded(path, 21 * MiB), headers={"Content-Type": "application/json"})
    err(r, 400, "invalid_request", "invalid_request_error")


@pytest.mark.parametrize("path", ["/chat/completions", "/embeddings"])
def test_body_over_20_mib_with_an_unknown_key_401_first(anon: httpx.Client, path: str) -> None:
    """docs/interface.md section 5: authentication before everything, the size cap too (a key of the right shape
    that no organisation has: found out in Redis/PostgreSQL, not by its form)."""
    r = anon.post(path, content=_padded(path, BODY_LIMIT + 1),
                  headers={"Content-Type": "application/json", "Authorization": "Bearer sk-service-" + "A" * 40})
    err(r, 401, "invalid_api_key", "authentication_error")


@pytest.mark.parametrize("path", ["/chat/completions", "/embeddings"])
def test_body_at_20_mib_accepted(client: httpx.Client, path: str) -> None:
    r = client.post(path, content=_padded(path, BODY_LIMIT), headers={"Content-Type": "application/json"})
    ok(r)


# ---------------------------------------------------------------------------------------- embeddings


def test_embeddings_chat_alias_400(client: httpx.Client) -> None:
    for alias in ("polish-pro", "polish-fast", "advanced"):
        err(client.post("/embeddings", json={"model": alias, "input": "x"}), 400, "invalid_request",
            "invalid_request_error", "model")


@pytest.mark.parametrize("model", ["nope", "text-embedding-3-small", "up-embed"])
def test_embeddings_unknown_alias_404(client: httpx.Client, model: str) -> None:
    err(client.post("/embeddings", json={"model": model, "input": "x"}), 404, "model_not_found",
        "invalid_request_error", "model")


@pytest.mark.parametrize("inp", [[1, 2, 3], [[1, 2]], [[1, 2], [3]], 5, ["a", 1], []],
                         ids=["ints", "nested_ints", "nested_ints_2", "int", "mixed", "empty"])
def test_embeddings_bad_input_400(client: httpx.Client, inp: Any) -> None:
    r = client.post("/embeddings", json={"model": "embed", "input": inp})
    err_any_param(r, 400, "invalid_request", "invalid_request_error", ["input"])


def test_embeddings_pretokenized_input_param_is_input(client: httpx.Client) -> None:
    for inp in ([1, 2, 3], [[1, 2]]):
        err(client.post("/embeddings", json={"model": "embed", "input": inp}), 400, "invalid_request",
            "invalid_request_error", "input")
    err(client.post("/embeddings", json={"model": "embed", "input": []}), 400, "invalid_request",
        "invalid_request_error", "input")


def test_embeddings_ok_shapes(client: httpx.Client) -> None:
    doc = ok(client.post("/embeddings", json={"model": "embed", "input": ["a", "b", "c"]}))
    assert doc["model"] == "embed" and [d["index"] for d in doc["data"]] == [0, 1, 2]
    assert len(doc["data"][0]["embedding"]) == 1024
    assert "completion_tokens" not in doc["usage"]


def test_embeddings_context_exceeded_400(client: httpx.Client) -> None:
    r = client.post("/embeddings", json={"model": "embed", "input": ["krótki", CANARY + " " + long_text(9000)],
                                         "sim": {"quote_prompt": True}})
    e = err_any_param(r, 400, "context_length_exceeded", "invalid_request_error", ["input"])
    assert CANARY not in e["message"] and "słowo" not in e["message"]


# ----------------------------------------------------------------------------------------- models


def test_models_list_shape(client: httpx.Client) -> None:
    r = client.get("/models")
    doc = ok(r)
    assert r.headers["content-type"].startswith("application/json")
    assert doc["object"] == "list"
    by_id = {m["id"]: m for m in doc["data"]}
    assert by_id["polish-pro"]["max_output_tokens"] == 2048 and by_id["advanced"]["max_output_tokens"] == 4096
    assert by_id["embed"]["max_output_tokens"] == 0


@pytest.mark.parametrize("alias", ["polish-fast", "polish-pro", "advanced", "embed"])
def test_models_get_200(client: httpx.Client, alias: str) -> None:
    m = ok(client.get(f"/models/{alias}"))
    assert m["id"] == alias and m["object"] == "model" and m["owned_by"] == "service"
    assert m["pricing"]["currency"] == "PLN"


@pytest.mark.parametrize("alias", ["nope", "gpt-4o", "up-pro", "Polish-Pro"])
def test_models_get_unknown_404(client: httpx.Client, alias: str) -> None:
    err(client.get(f"/models/{alias}"), 404, "model_not_found", "invalid_request_error", "model")


# ------------------------------------------------------------------------------------ other paths

UNSUPPORTED = [
    ("POST", "/v1/completions"), ("POST", "/v1/responses"), ("GET", "/v1/files"), ("POST", "/v1/files"),
    ("POST", "/v1/images/generations"), ("POST", "/v1/audio/transcriptions"), ("POST", "/v1/audio/speech"),
    ("POST", "/v1/fine_tuning/jobs"), ("POST", "/v1/batches"), ("GET", "/v1/assistants"),
    ("POST", "/v1/moderations"),
    ("GET", "/v1/chat/completions"), ("PUT", "/v1/chat/completions"), ("DELETE", "/v1/chat/completions"),
    ("GET", "/v1/embeddings"), ("PATCH", "/v1/embeddings"),
    ("DELETE", "/v1/models"), ("POST", "/v1/models"), ("DELETE", "/v1/models/polish-pro"),
    ("POST", "/v1/models/polish-pro"),
    ("GET", "/foo"), ("POST", "/foo"), ("GET", "/"), ("GET", "/v1"), ("GET", "/v2/models"),
    ("POST", "/v2/chat/completions"),
]


@pytest.mark.parametrize("method,path", UNSUPPORTED)
def test_unsupported_endpoint_404(gateway: Gateway, org: tuple[str, str, str], method: str, path: str) -> None:
    body = {"model": "polish-pro", "prompt": "x"} if method in ("POST", "PUT", "PATCH") else None
    r = httpx.request(method, gateway.url + path, json=body, timeout=30,
                      headers={"Authorization": f"Bearer {org[2]}"})
    err(r, 404, "unsupported_endpoint", "invalid_request_error")


@pytest.mark.parametrize("method,path", UNSUPPORTED)
def test_unsupported_endpoint_without_key_401(gateway: Gateway, method: str, path: str) -> None:
    r = httpx.request(method, gateway.url + path, timeout=30)
    err(r, 401, "invalid_api_key", "authentication_error")
    r = httpx.request(method, gateway.url + path, timeout=30, headers={"Authorization": "Bearer sk-service-x"})
    err(r, 401, "invalid_api_key", "authentication_error")


# ------------------------------------------------------------------- model-server errors (sections 4, 7)


@pytest.mark.parametrize("status", [500, 502, 503])
def test_model_server_5xx_is_502(client: httpx.Client, status: int) -> None:
    r = chat(client, {"model": "polish-fast", "messages": [{"role": "user", "content": CANARY}],
                      "sim": {"status": status, "message": "boom internal detail", "quote_prompt": True}})
    e = err(r, 502, "upstream_unavailable", "upstream_error")
    assert CANARY not in e["message"]


def test_model_server_500_on_stream_is_502(client: httpx.Client) -> None:
    r = chat(client, {"model": "polish-fast", "messages": [{"role": "user", "content": CANARY}], "stream": True,
                      "sim": {"status": 500, "quote_prompt": True}})
    e = err(r, 502, "upstream_unavailable", "upstream_error")
    assert CANARY not in e["message"]


def test_model_server_500_on_embeddings_is_502(client: httpx.Client) -> None:
    r = client.post("/embeddings", json={"model": "embed", "input": [CANARY],
                                         "sim": {"status": 500, "quote_prompt": True}})
    e = err(r, 502, "upstream_unavailable", "upstream_error")
    assert CANARY not in e["message"]


def test_model_server_400_is_invalid_request_sanitised(client: httpx.Client) -> None:
    r = chat(client, {"model": "polish-fast", "messages": [{"role": "user", "content": "Tekst " + CANARY}],
                      "sim": {"status": 400, "message": "Unsupported field xyz.", "quote_prompt": True}})
    e = err_any_param(r, 400, "invalid_request", "invalid_request_error", [])
    assert CANARY not in e["message"]


def test_context_length_exceeded_400(client: httpx.Client) -> None:
    content = CANARY + " " + long_text(9000)
    r = chat(client, {"model": "polish-pro", "messages": [{"role": "user", "content": content}],
                      "sim": {"quote_prompt": True}})
    e = err_any_param(r, 400, "context_length_exceeded", "invalid_request_error", ["messages"])
    assert CANARY not in e["message"] and "słowo" not in e["message"]


def test_context_length_exceeded_stream_400(client: httpx.Client) -> None:
    r = chat(client, {"model": "polish-pro", "stream": True,
                      "messages": [{"role": "user", "content": long_text(9000)}]})
    err_any_param(r, 400, "context_length_exceeded", "invalid_request_error", ["messages"])


def test_long_prompt_fits_advanced(client: httpx.Client) -> None:
    doc = ok(chat(client, {"model": "advanced", "messages": [{"role": "user", "content": long_text(9000)}],
                           "max_tokens": 10}))
    assert doc["model"] == "advanced" and doc["usage"]["prompt_tokens"] > 9000


@pytest.mark.parametrize("field,value", [("temperature", -1), ("top_p", 5), ("n", 0), ("stop", 5)])
def test_field_rejected_by_model_server_400(client: httpx.Client, field: str, value: Any) -> None:
    r = chat(client, {"model": "polish-pro", "messages": [{"role": "user", "content": CANARY}], field: value,
                      "sim": {"quote_prompt": True}})
    e = err_any_param(r, 400, "invalid_request", "invalid_request_error", [field])
    assert CANARY not in e["message"]


def test_image_part_rejected_400(client: httpx.Client) -> None:
    content = [{"type": "text", "text": "Co to jest? " + CANARY},
               {"type": "image_url", "image_url": {"url": "https://example.com/kot.png"}}]
    r = chat(client, {"model": "polish-pro", "messages": [{"role": "user", "content": content}],
                      "sim": {"quote_prompt": True}})
    e = err_any_param(r, 400, "invalid_request", "invalid_request_error", ["messages"])
    assert CANARY not in e["message"]


def test_no_deployments_503(client: httpx.Client) -> None:
    for body in ({"model": "empty-alias", "messages": MSGS},
                 {"model": "empty-alias", "messages": MSGS, "stream": True}):
        err(chat(client, body), 503, "no_capacity", "server_error")


def test_embeddings_reply_over_64_mib_502(client: httpx.Client) -> None:
    r = client.post("/embeddings", json={"model": "embed", "input": "x", "sim": {"reply_bytes": 70_000_000}},
                    timeout=120)
    err(r, 502, "upstream_unavailable", "upstream_error")


def test_chat_reply_over_64_mib_502(client: httpx.Client) -> None:
    r = chat(client, {"model": "polish-fast", "messages": MSGS, "sim": {"reply_bytes": 70_000_000}}, timeout=120)
    err(r, 502, "upstream_unavailable", "upstream_error")


@pytest.mark.parametrize("size_mib", [25, 60])
def test_reply_under_64_mib_relayed(client: httpx.Client, size_mib: int) -> None:
    r = client.post("/embeddings", json={"model": "embed", "input": "x", "sim": {"reply_bytes": size_mib * MiB}},
                    timeout=120)
    doc = ok(r)
    assert len(doc["data"][0]["embedding"]) == 1024


# ---------------------------------------------------------------------- check order and misc. rows


def test_auth_checked_before_request_validation(anon: httpx.Client) -> None:
    for path, body in (("/chat/completions", {"model": "gpt-4o", "messages": MSGS}),
                       ("/chat/completions", {"model": "polish-pro", "messages": []}),
                       ("/chat/completions", {"model": "embed", "messages": MSGS, "max_tokens": 0}),
                       ("/embeddings", {"model": "polish-pro", "input": [1, 2]})):
        err(anon.post(path, json=body), 401, "invalid_api_key", "authentication_error")
    err(anon.get("/models/no-such-alias"), 401, "invalid_api_key", "authentication_error")


def test_stream_validation_errors_are_json(client: httpx.Client) -> None:
    err(chat(client, {"model": "polish-pro", "messages": MSGS, "stream": True, "max_tokens": 0}), 400,
        "invalid_request", "invalid_request_error", "max_tokens")
    err(chat(client, {"model": "embed", "messages": MSGS, "stream": True}), 400, "invalid_request",
        "invalid_request_error", "model")


def test_stream_response_has_request_id(gateway: Gateway, client: httpx.Client) -> None:
    r, _, _ = echo_stream(client, {})
    rid = r.headers["x-request-id"]
    assert rid and gateway.sim_record(rid) is not None
    no_limit_headers(r)


def test_embeddings_missing_input_400(client: httpx.Client) -> None:
    err_any_param(client.post("/embeddings", json={"model": "embed"}), 400, "invalid_request",
                  "invalid_request_error", ["input"])


def test_embeddings_bad_encoding_format_400(client: httpx.Client) -> None:
    err_any_param(client.post("/embeddings", json={"model": "embed", "input": "x", "encoding_format": "int8"}),
                  400, "invalid_request", "invalid_request_error", ["encoding_format"])


@pytest.mark.parametrize("body", [{"input": "x"}, {"model": None, "input": "x"}], ids=["missing", "null"])
def test_embeddings_missing_or_null_model_400(client: httpx.Client, body: dict[str, Any]) -> None:
    err(client.post("/embeddings", json=body), 400, "invalid_request", "invalid_request_error", "model")


def test_rate_limit_429_has_retry_after(gateway: Gateway) -> None:
    org_id, kid, key = gateway.new_org(10_000_000)
    gateway.admin(lambda a: a.set_key_limits(kid, 2))
    rate_window_with()  # every request below counts against one window
    with keyed(gateway, key) as c:
        statuses = []
        r = None
        for _ in range(6):
            r = chat(c, {"model": "polish-fast", "messages": MSGS})
            statuses.append(r.status_code)
            if r.status_code == 429:
                break
        assert r is not None and r.status_code == 429, statuses
        err(r, 429, "rate_limit_exceeded", "rate_limit_error")
        ra = r.headers.get("retry-after")
        assert ra is not None and ra.isdigit() and 1 <= int(ra) <= 60, ra
        # embeddings share the per-key limit; models are never rate limited
        e = c.post("/embeddings", json={"model": "embed", "input": "x"})
        err(e, 429, "rate_limit_exceeded", "rate_limit_error")
        for _ in range(5):
            ok(c.get("/models"))
            ok(c.get("/models/embed"))


def test_balance_checked_before_rate_limit(gateway: Gateway) -> None:
    org_id, kid, key = gateway.new_org(0)
    gateway.admin(lambda a: a.set_key_limits(kid, 1))
    with keyed(gateway, key) as c:
        for _ in range(4):
            err(chat(c, {"model": "polish-fast", "messages": MSGS}), 402, "insufficient_quota",
                "insufficient_quota")


def test_concurrency_limit_429_retry_after_1(gateway: Gateway) -> None:
    import threading
    org_id, kid, key = gateway.new_org(10_000_000)
    gateway.admin(lambda a: a.set_limits(org_id, None, 1))
    slow: list[httpx.Response] = []

    def run() -> None:
        with keyed(gateway, key) as c:
            slow.append(chat(c, {"model": "polish-fast", "messages": MSGS, "sim": {"ttft_ms": 3000}}))

    t = threading.Thread(target=run)
    t.start()
    try:
        wait_for(lambda: gateway.slots_held(org_id) == 1, timeout=2.5, interval=0.02)  # the slow one holds it
        with keyed(gateway, key) as c:
            r = chat(c, {"model": "polish-fast", "messages": MSGS})
            err(r, 429, "concurrency_limit_exceeded", "rate_limit_error")
            assert r.headers.get("retry-after") == "1"
            ok(c.get("/models"))
    finally:
        t.join()
    ok(slow[0])
