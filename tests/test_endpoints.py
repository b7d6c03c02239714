"""The endpoint registry (core/endpoints.py) drives the exchange, the stream watch, the catalog's
capabilities and Envoy's routes: a test-only endpoint, the record docs/adding-an-endpoint.md shows
(read from the document), registered beside the two served, is forwarded and billed by the exchange,
metered and billed by the stream watch, listed by the catalog and routed by the rendered bootstrap, which
Envoy's own check accepts.  (Not through a running stack: a stack's processes register REGISTRY's
endpoints only.)"""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import make_catalog
from control.envoy_config import render_bootstrap, write_cds
from control.settings import Settings
from docs_blocks import ROOT, marked
from core import catalog as catalog_mod
from core.catalog import CatalogError
from core.cost import estimate_text
from core.endpoints import REGISTRY, Endpoint
from core.stream_context import HEADER, StreamContext
from extproc.exchange import CLUSTER_HEADER, Exchange, Gateway
from extproc.observer import StreamWatch
from extproc_fakes import KEY, gateway, sse, store, usage_chunk

DOC = "docs/adding-an-endpoint.md"
PROMPT = "Once upon a time"


def documented() -> Endpoint:
    """The record the document shows, as written there."""
    [block] = [b for b in marked("run by: tests/test_endpoints.py") if b.document == DOC]
    ns: dict[str, Any] = {}
    exec(compile(block.text, block.where, "exec"), ns)  # noqa: S102 - the project's own document
    endpoint = ns["COMPLETIONS"]
    assert isinstance(endpoint, Endpoint)
    return endpoint


COMPLETIONS = documented()
WITH_COMPLETIONS = REGISTRY.with_endpoint(COMPLETIONS)


def catalog_doc() -> dict[str, Any]:
    doc = make_catalog(20000)
    doc["aliases"]["storyteller"] = {
        "capabilities": ["completions"], "context_length": 8192, "max_output_tokens": 256,
        "prices": [{"effective": "2026-01-01T00:00:00Z", "input_micro_pln_per_1m": 1_000_000,
                    "output_micro_pln_per_1m": 2_000_000}],
        "upstreams": [{"model": "up-pro"}]}
    return doc


def with_completions() -> Gateway:
    gw = gateway()
    gw.catalog = catalog_mod.parse(catalog_doc(), endpoints=WITH_COMPLETIONS)
    gw.endpoints = WITH_COMPLETIONS
    return gw


async def forwarded(ex: Exchange, body: dict[str, Any]) -> None:
    answer = await ex.request_body(json.dumps(body).encode(), {
        "request.id": "rid-1", "request.method": "POST", "request.path": "/v1/completions",
        "request.headers['authorization']": "Bearer " + KEY})
    assert answer.reply is None and answer.set_headers[CLUSTER_HEADER] == "upstream_up-pro"
    assert answer.body is not None
    sent = json.loads(answer.body)
    assert (sent["model"], sent["prompt"], sent["max_tokens"]) == ("up-pro", PROMPT, 256)


def test_the_registry_serves_chat_completions_and_embeddings() -> None:
    assert [(e.name, e.path, e.capability) for e in REGISTRY] == [
        ("chat", "/v1/chat/completions", "chat"), ("embeddings", "/v1/embeddings", "embeddings")]
    assert REGISTRY.by_path["/v1/embeddings"].input_param == "input"
    assert not REGISTRY.by_name["embeddings"].bills_output and REGISTRY.by_name["chat"].bills_output
    with pytest.raises(ValueError, match="share a path or a name"):
        REGISTRY.with_endpoint(COMPLETIONS).with_endpoint(COMPLETIONS)


def test_an_alias_lists_a_registered_endpoints_capability_or_vision() -> None:
    with pytest.raises(CatalogError) as refused:
        catalog_mod.parse(catalog_doc())
    assert str(refused.value) == ("<catalog>: aliases.storyteller.capabilities: each must be one of "
                                  "['chat', 'embeddings', 'vision']")
    cat = catalog_mod.parse(catalog_doc(), endpoints=WITH_COMPLETIONS)
    storyteller = cat.aliases["storyteller"]
    assert storyteller.model_object(storyteller.price_steps[0].effective)["capabilities"] == ["completions"]


def test_a_registered_endpoint_is_forwarded_and_billed_by_the_exchange() -> None:
    gw = with_completions()
    reply = {"id": "c1", "object": "text_completion", "model": "up-pro",
             "choices": [{"index": 0, "text": " there was a gateway.", "finish_reason": "stop"}],
             "usage": {"prompt_tokens": 5, "completion_tokens": 6, "total_tokens": 11}}

    async def go() -> dict[str, Any]:
        ex = Exchange(gw)
        await forwarded(ex, {"model": "storyteller", "prompt": PROMPT})
        await ex.response_headers({":status": "200", "content-type": "application/json"})
        answer = await ex.response_body(json.dumps(reply).encode(), True)
        await ex.close()
        assert answer.body is not None
        return dict(json.loads(answer.body))
    got = asyncio.run(go())
    # the usage the client gets says what the request is billed: the record's figure
    assert got["model"] == "storyteller" and got["usage"] == {**reply["usage"], "cost_micro_pln": 17}
    [rec] = store(gw).records
    assert (rec.endpoint, rec.alias, rec.upstream_model, rec.status, rec.stream) == (
        "completions", "storyteller", "up-pro", 200, False)
    assert (rec.prompt_tokens, rec.completion_tokens, rec.estimated, rec.cost_micro_pln) == (5, 6, False, 17)
    assert store(gw).held() == 0


def test_a_registered_endpoints_refusals_name_its_own_fields() -> None:
    """A model server's refusal of the input names the endpoint's ``input_param``; a refusal on the way
    in is logged under the endpoint's name, at no cost."""
    gw = with_completions()

    async def go() -> tuple[Any, Any]:
        ex = Exchange(gw)
        await forwarded(ex, {"model": "storyteller", "prompt": PROMPT})
        await ex.response_headers({":status": "400", "content-type": "application/json"})
        upstream = await ex.response_body(b'{"error":{"message":"maximum context length is 8192"}}', True)
        await ex.close()
        ex = Exchange(gw)
        refused = await ex.request_body(json.dumps({"model": "storyteller", "prompt": 7}).encode(), {
            "request.id": "rid-2", "request.method": "POST", "request.path": "/v1/completions",
            "request.headers['authorization']": "Bearer " + KEY})
        await ex.send_finish()
        return upstream.reply, refused.reply
    upstream, refused = asyncio.run(go())
    err = json.loads(upstream[1])["error"]
    assert (upstream[0], err["code"], err["param"], err["request_id"]) == (
        400, "context_length_exceeded", "prompt", "rid-1")
    err = json.loads(refused[1])["error"]
    assert (refused[0], err["code"], err["param"], err["message"], err["request_id"]) == (
        400, "invalid_request", "prompt", "'prompt' must be a string.", "rid-2")
    first, second = store(gw).records
    assert (first.endpoint, first.status, first.error_code, first.cost_micro_pln) == (
        "completions", 400, "context_length_exceeded", 0)
    assert (second.endpoint, second.status, second.error_code, second.cost_micro_pln) == (
        "completions", 400, "invalid_request", 0)


def test_a_registered_endpoints_stream_is_billed_by_the_stream_watch() -> None:
    gw = with_completions()
    text = {"id": "c1", "object": "text_completion", "model": "up-pro",
            "choices": [{"index": 0, "text": " there", "finish_reason": None}]}

    async def go() -> StreamContext:
        ex = Exchange(gw)
        await forwarded(ex, {"model": "storyteller", "prompt": PROMPT, "stream": True})
        handed = await ex.response_headers({":status": "200", "content-type": "text/event-stream"})
        assert handed.hand_over
        header = handed.set_headers[HEADER]
        watch = StreamWatch(gw)
        watch.response_headers({HEADER: header})
        watch.response_body(sse(text, usage_chunk(5, 1)), True)
        await watch.close()
        await ex.close()
        return StreamContext.parse(header)
    ctx = asyncio.run(go())
    assert (ctx.endpoint, ctx.alias, ctx.estimated_prompt_tokens) == ("completions", "storyteller",
                                                                      estimate_text(PROMPT))
    [rec] = store(gw).records
    assert (rec.endpoint, rec.stream, rec.prompt_tokens, rec.completion_tokens, rec.estimated) == (
        "completions", True, 5, 1, False)
    assert store(gw).held() == 0


def routes(doc: dict[str, Any]) -> list[dict[str, Any]]:
    hcm = doc["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    return list(hcm["route_config"]["virtual_hosts"][0]["routes"])


def test_the_registry_renders_envoys_routes_and_envoy_accepts_them(tmp_path: Path) -> None:
    s = Settings(state_dir=str(tmp_path / "state"))
    served = routes(yaml.safe_load(render_bootstrap(s)))
    assert [(r["name"], r["match"].get("path") or r["match"]["prefix"]) for r in served] == [
        ("chat", "/v1/chat/completions"), ("embeddings", "/v1/embeddings"),
        ("chat", "/v1/chat/completions"), ("embeddings", "/v1/embeddings"),
        ("models", "/v1/models"), ("model", "/v1/models/"), ("other", "/")]
    boot = render_bootstrap(s, WITH_COMPLETIONS)
    got = routes(yaml.safe_load(boot))
    names = [r["name"] for r in got]
    assert names == ["chat", "embeddings", "completions", "chat", "embeddings", "completions", "models", "model",
                     "other"]
    with_body, other = got[2], got[5]
    mode = lambda r: r["typed_per_filter_config"]["envoy.filters.http.ext_proc"]["overrides"][  # noqa: E731
        "processing_mode"]
    assert with_body["match"] == {"path": "/v1/completions", "headers": [
        {"name": ":method", "string_match": {"exact": "POST"}},
        {"name": "content-length", "string_match": {"safe_regex": {"regex": "[1-9][0-9]*"}}}]}
    assert mode(with_body)["request_header_mode"] == "SKIP" and mode(other)["request_header_mode"] == "SEND"
    assert other["match"] == {"path": "/v1/completions"}
    assert with_body["route"] == other["route"] == got[6]["route"]  # the upstream settings of models'
    assert with_body["route"]["cluster_header"] == "x-gateway-cluster"
    (tmp_path / "state" / "logs").mkdir(parents=True)
    write_cds(catalog_mod.parse(catalog_doc(), endpoints=WITH_COMPLETIONS), s)
    path = tmp_path / "bootstrap.yaml"
    path.write_text(boot)
    envoy = Path(sys.executable).parent / "envoy"
    check = subprocess.run([str(envoy), "--mode", "validate", "-c", str(path)], capture_output=True, text=True,
                           timeout=120, cwd=ROOT)
    assert check.returncode == 0, check.stdout[-2000:] + check.stderr[-2000:]
    assert "OK" in check.stdout + check.stderr
