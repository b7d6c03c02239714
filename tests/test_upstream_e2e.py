"""What the model server gets (issue 22): a canonical request whatever the client sent; usage read by
content whatever shape the model server gives its usage chunk; SSE framings; deployment credentials."""
from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from conftest import Gateway

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
