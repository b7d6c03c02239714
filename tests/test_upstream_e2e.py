"""What the model server gets: a canonical request whatever the client sent; usage read by
content whatever shape the model server gives its usage chunk; SSE framings; deployment credentials."""
from __future__ import annotations

import json
import os
import secrets
import ssl
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Iterator

import httpx
import openai
import pytest
import trustme

from conftest import Gateway, assert_error, make_catalog, running_stack, wait_for
from free_ports import free_port

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
    """Client credentials (other vendors' too), vendor organisation/project headers, SDK telemetry,
    cookies, the client's address, an expectation, its accept-encoding (a compressed reply could not be relayed event by event) and its
    content-encoding stay here."""
    sent = {"OpenAI-Organization": "org-abc", "OpenAI-Project": "proj-xyz", "OpenAI-Beta": "assistants=v2",
            "X-Api-Key": "xk-secret", "Api-Key": "ak-secret", "Proxy-Authorization": "Basic cHJveHk=",
            "Cookie": "session=c00kie", "X-Stainless-Lang": "stainless-lang-x", "X-Stainless-Os": "stainless-os-x",
            "Accept-Encoding": "gzip, br", "X-Forwarded-For": "203.0.113.9", "X-Real-IP": "203.0.113.10",
            "Forwarded": "for=203.0.113.11", "X-Forwarded-Host": "evil.example", "User-Agent": "OpenAI/Python 9.9",
            "X-OpenAI-Client-User-Agent": "{\"lang\": \"python-x\"}", "Anthropic-Version": "2023-06-01-x",
            "X-Goog-Api-Key": "goog-secret", "Ocp-Apim-Subscription-Key": "apim-secret",
            # an expectation Envoy does not meet itself: the model server would refuse it (417)
            "Expect": "fancy-x",
            # a plain JSON body said to be compressed: the ext_proc read it as JSON; what it forwards is its
            # own JSON, never compressed (the model server would fail to inflate it: a 502 for nothing)
            "Content-Encoding": "gzip"}
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


def test_no_envoy_internal_header_reaches_the_client(client: httpx.Client) -> None:
    """Replies a model server served (JSON, a stream, embeddings) carry no x-envoy-* header (Envoy's
    router added x-envoy-upstream-service-time) and no internal header of the gateway."""
    replies = [client.post("/chat/completions", json={"model": "polish-pro", "messages": MSGS}),
               client.post("/chat/completions", json={"model": "polish-pro", "messages": MSGS, "stream": True}),
               client.post("/embeddings", json={"model": "embed", "input": "zdanie"})]
    for r in replies:
        assert r.status_code == 200, r.text
        assert not [k for k in r.headers if k.lower().startswith(("x-envoy-", "x-gateway-"))], dict(r.headers)


# ---- SSE framings through the stack ------------------------------------------------

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
    # The interface's streaming rule 1, whatever the model server's framing: each event one "data: " line + a blank line
    assert r.text.endswith("\n\n") and "\r" not in r.text
    assert all(e.startswith("data: ") and "\n" not in e for e in r.text[:-2].split("\n\n")), r.text[:300]
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


# ---- usage by content ----------------------------------------------------------------

@pytest.mark.parametrize("include_usage", [True, False])
def test_a_null_usage_on_every_chunk_never_reaches_the_client(gateway: Gateway, client: httpx.Client,
                                                               include_usage: bool) -> None:
    """SGLang writes "usage": null on every chunk; the interface shows usage only on the final chunk, only when
    asked (the SDK reads null as no usage, a raw client sees the member)."""
    r = client.post("/chat/completions", json={
        "model": "polish-pro", "messages": MSGS, "stream": True, "stream_options": {"include_usage": include_usage},
        "sim": {"usage_shape": "sglang", "output_tokens": 3}})
    assert r.status_code == 200, r.text
    assert "null" not in r.text.replace('"finish_reason":null', "").replace('"logprobs":null', "")
    events = _sse(r.text)
    carrying = [e for e in events[:-1] if "usage" in e]
    assert carrying == ([events[-2]] if include_usage else [])
    if include_usage:
        assert events[-2]["choices"] == [] and events[-2]["usage"]["completion_tokens"] == 3


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
                # The interface's streaming rule 2: an empty delta closes the choice (TGI's says role and "")
                assert ch.delta.content is None and ch.delta.role is None, (shape, ch)
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


# ---- null stream_options ------------------------------------------------------------

def test_null_stream_options_gets_the_usage_chunk(gateway: Gateway, client: httpx.Client) -> None:
    """docs/interface.md section 4 rule 4 replaces a null stream_options by include_usage true: the client gets the
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


# ---- deployment credentials and TLS -------------------------------------------------

KEY_ENV = "GW_TEST_UPSTREAM_KEY"
SIM_HOST = "127.0.0.3"  # the launcher starts simulators on 127.0.0.1 only: these are the test's own



def _start_sim(port: int, name: str, *extra: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "sim", "--host", SIM_HOST, "--port", str(port), "--name", name,
                             "--chat-model", "up-keyed", "--chat-model", "up-unkeyed", "--chat-model", "up-secure",
                             "--chat-model", "up-untrusted", "--api-key-env", KEY_ENV, *extra],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def remote() -> Iterator[tuple[Gateway, str, str]]:
    """A stack whose model servers want a bearer key (like vLLM's --api-key), one over plain HTTP and one
    over TLS with a certificate from a test CA; (gateway, deployment key, CA file)."""
    tmp = Path(tempfile.mkdtemp(prefix="gw-remote-"))
    ca = trustme.CA()
    cert = ca.issue_cert("sim.test")
    ca_file, chain, key_file = tmp / "ca.pem", tmp / "chain.pem", tmp / "key.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    cert.private_key_pem.write_to_path(str(key_file))
    chain.write_bytes(b"".join(blob.bytes() for blob in cert.cert_chain_pems))
    deployment_key = "dk-" + secrets.token_hex(16)
    saved = dict(os.environ)
    os.environ[KEY_ENV] = deployment_key
    plain_port, tls_port = free_port(SIM_HOST), free_port(SIM_HOST)
    sims = [_start_sim(plain_port, "plain"),
            _start_sim(tls_port, "tls", "--tls-cert", str(chain), "--tls-key", str(key_file))]
    with httpx.Client(verify=ssl.create_default_context(cafile=str(ca_file))) as c:
        wait_for(lambda: _up(c, f"http://{SIM_HOST}:{plain_port}") and _up(c, f"https://sim.test:{tls_port}",
                                                                             tls_port), 20)

    def catalog(base: int) -> dict[str, Any]:
        doc = make_catalog(base)
        price = doc["aliases"]["polish-pro"]["prices"]

        def alias(model: str) -> dict[str, Any]:
            return {"capabilities": ["chat"], "context_length": 8192, "max_output_tokens": 2048,
                    "prices": price, "upstreams": [{"model": model}]}
        doc["aliases"].update({"keyed": alias("up-keyed"), "unkeyed": alias("up-unkeyed"),
                               "secure": alias("up-secure"), "untrusted": alias("up-untrusted")})
        plain = {"name": "plain", "host": SIM_HOST, "port": plain_port}
        tls = {"name": "tls", "host": SIM_HOST, "port": tls_port, "tls": True, "sni": "sim.test"}
        doc["upstream_models"].update({
            "up-keyed": {"deployments": [{**plain, "api_key_env": KEY_ENV}]},
            "up-unkeyed": {"deployments": [plain]},
            "up-secure": {"deployments": [{**tls, "api_key_env": KEY_ENV, "ca_file": str(ca_file)}]},
            # the system's CAs do not know the test CA: the certificate is verified, so this one fails
            "up-untrusted": {"deployments": [{**tls, "api_key_env": KEY_ENV}]}})
        return doc
    try:
        with running_stack("gw-remote-", catalog, default_rpm=100000, default_concurrency=1000) as gw:
            yield gw, deployment_key, str(ca_file)
    finally:
        for p in sims:
            p.terminate()
            p.wait(10)
        os.environ.clear()
        os.environ.update(saved)


def _up(c: httpx.Client, url: str, tls_port: int | None = None) -> bool:
    try:
        if tls_port is not None:  # sim.test is the test CA's name for 127.0.0.3
            ext = {"sni_hostname": "sim.test"}
            return c.get(f"https://{SIM_HOST}:{tls_port}/health", extensions=ext).status_code == 200
        return c.get(url + "/health").status_code == 200
    except httpx.HTTPError:
        return False


def _remote_chat(gw: Gateway, key: str, alias: str, **extra: Any) -> httpx.Response:
    return httpx.post(gw.v1 + "/chat/completions", headers={"Authorization": f"Bearer {key}"}, timeout=30,
                      json={"model": alias, "messages": MSGS, "sim": {"echo": True}, **extra})


def test_deployment_key_replaces_the_clients(remote: tuple[Gateway, str, str]) -> None:
    gw, deployment_key, _ = remote
    _, _, client_key = gw.new_org(10_000_000)
    for alias in ("keyed", "secure"):
        r = _remote_chat(gw, client_key, alias)
        assert r.status_code == 200, (alias, r.text)
        assert r.json()["model"] == alias
        seen = json.loads(r.json()["choices"][0]["message"]["content"])["headers"]
        assert seen["authorization"] == f"Bearer {deployment_key}", alias
        # Host is the deployment's name (its TLS server name where it has one), not the gateway's
        assert seen["host"] == {"keyed": SIM_HOST, "secure": "sim.test"}[alias], seen["host"]
        assert client_key not in json.dumps(seen), "the client's key reached the model server"
        # streaming too
        r = _remote_chat(gw, client_key, alias, stream=True, sim={"output_tokens": 3})
        assert r.status_code == 200 and r.text.rstrip().endswith("data: [DONE]"), r.text[-200:]


def test_deployment_without_key_is_refused_by_a_server_that_wants_one(remote: tuple[Gateway, str, str]) -> None:
    """The same server as 'keyed', catalogued without api_key_env: nothing of the client's reaches it as a
    key, so it answers 401 (and the client gets 502 upstream_unavailable, nothing billed)."""
    gw, _, _ = remote
    _, _, client_key = gw.new_org(10_000_000)
    r = _remote_chat(gw, client_key, "unkeyed")
    assert_error(r, 502, "upstream_unavailable", "upstream_error")


def test_tls_certificate_is_verified(remote: tuple[Gateway, str, str]) -> None:
    """Without the test CA (the system's CAs by default) the model server's certificate is refused."""
    gw, _, _ = remote
    _, _, client_key = gw.new_org(10_000_000)
    r = _remote_chat(gw, client_key, "untrusted")
    assert_error(r, 502, "upstream_unavailable", "upstream_error")


def test_the_key_is_in_no_file_of_the_gateway(remote: tuple[Gateway, str, str]) -> None:
    """Envoy reads the key from its environment: the configuration it was given (and its dump) names the
    variable only; nor is the key in any log or state file."""
    gw, deployment_key, _ = remote
    _, _, client_key = gw.new_org(10_000_000)
    assert _remote_chat(gw, client_key, "keyed").status_code == 200
    state = Path(gw.stack.s.state_dir)
    for path in state.rglob("*"):
        if path.is_file() and path.stat().st_size < 50_000_000:
            assert deployment_key.encode() not in path.read_bytes(), path
    dump = httpx.get(f"http://127.0.0.1:{gw.stack.s.envoy_admin_port}/config_dump").text
    assert deployment_key not in dump and f"%ENVIRONMENT({KEY_ENV})%" in dump
