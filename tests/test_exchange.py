"""extproc/exchange.py alone: one request's phases as plain calls, on an in-memory store and directory
(tests/extproc_fakes.py).  What each phase answers, what is billed and when the slot is released,
however the request ends: a reply in full, a stream, an upstream error, Envoy's own error reply, an
idle gap, a stream reset."""
from __future__ import annotations

import asyncio
import json
from typing import Any, Awaitable, TypeVar

import pytest

from core.cost import estimate_chat_prompt
from core.stream_context import HEADER as STREAM_HEADER, StreamContext
from extproc import exchange
from extproc.exchange import CLUSTER_HEADER, Answer, Exchange
from extproc_fakes import (CHAT_BODY, KEY, OTHER_KEY, chat_reply, chunk, gateway, logged_free, sse, store,
                           usage_chunk)

T = TypeVar("T")
EST = estimate_chat_prompt([{"role": "user", "content": "Dzień dobry"}])
HEADERS = {"x-request-id": "rid-1", "authorization": "Bearer " + KEY}


def run(aw: Awaitable[T]) -> T:
    return asyncio.run(aw)  # type: ignore[arg-type]


def error_of(a: Answer, status: int, code: str, param: str | None = None) -> dict[str, Any]:
    assert a.reply is not None, a
    st, body, headers = a.reply
    assert st == status and headers["content-type"] == "application/json"
    err = json.loads(body)["error"]
    assert (err["code"], err["param"], err["request_id"]) == (code, param, "rid-1"), err
    assert set(err) == {"message", "type", "code", "param", "request_id"}
    return dict(err)


async def _forwarded(ex: Exchange, body: bytes = CHAT_BODY) -> Answer:
    return await ex.request_body(body, {"request.id": "rid-1", "request.method": "POST",
                                        "request.path": "/v1/chat/completions",
                                        "request.headers['authorization']": "Bearer " + KEY})


# ---- request headers: everything but a POST with a body is answered here ---------------------------
def test_models_list_after_authentication_only() -> None:
    gw = gateway(balance=0)  # no balance needed: models skip the balance check and the rate limit

    async def go() -> Answer:
        return await Exchange(gw).request_headers({**HEADERS, ":method": "GET", ":path": "/v1/models"}, True)
    a = run(go())
    assert a.reply is not None and a.reply[0] == 200
    ids = {m["id"] for m in json.loads(a.reply[1])["data"]}
    assert {"polish-pro", "polish-fast", "embed"} <= ids
    assert store(gw).admits == [("rid-1", False)]  # asked without limits
    assert store(gw).held() == 0


def test_model_object_and_unknown_model() -> None:
    gw = gateway()

    async def go(path: str) -> Answer:
        return await Exchange(gw).request_headers({**HEADERS, ":method": "GET", ":path": path}, True)
    a = run(go("/v1/models/polish-fast"))
    assert a.reply is not None and a.reply[0] == 200 and json.loads(a.reply[1])["id"] == "polish-fast"
    error_of(run(go("/v1/models/gpt-4o")), 404, "model_not_found", "model")


def test_missing_or_malformed_key_is_401_before_any_lookup() -> None:
    gw = gateway()
    for auth in (None, "Bearer sk-short", "Basic " + KEY, "Bearer " + KEY[:-1]):
        h = {"x-request-id": "rid-1", ":method": "GET", ":path": "/v1/models"}
        if auth is not None:
            h["authorization"] = auth
        error_of(run(Exchange(gw).request_headers(h, True)), 401, "invalid_api_key")
    assert store(gw).admits == [] and gw.directory.lookups == 0  # type: ignore[attr-defined]


def test_unknown_key_is_401_after_the_directory_said_so() -> None:
    gw = gateway()
    h = {"x-request-id": "rid-1", "authorization": "Bearer " + OTHER_KEY, ":method": "GET", ":path": "/v1/models"}
    error_of(run(Exchange(gw).request_headers(h, True)), 401, "invalid_api_key")
    assert gw.directory.lookups == 1  # type: ignore[attr-defined]


def test_unsupported_endpoint_after_authentication() -> None:
    gw = gateway()
    h = {"x-request-id": "rid-1", ":method": "GET", ":path": "/v1/files"}
    error_of(run(Exchange(gw).request_headers(h, True)), 401, "invalid_api_key")  # 401 first
    error_of(run(Exchange(gw).request_headers({**h, "authorization": "Bearer " + KEY}, True)),
             404, "unsupported_endpoint")
    error_of(run(Exchange(gw).request_headers({**HEADERS, ":method": "DELETE", ":path": "/v1/models"}, True)),
             404, "unsupported_endpoint")


def test_chunked_post_waits_for_its_body_and_a_declared_oversize_is_refused() -> None:
    gw = gateway(max_body_bytes=1000)
    post = {**HEADERS, ":method": "POST", ":path": "/v1/chat/completions"}
    assert run(Exchange(gw).request_headers(post, False)) == Answer()  # the body comes next
    error_of(run(Exchange(gw).request_headers({**post, "content-length": "1001"}, False)), 400, "invalid_request")
    assert [limits for _, limits in store(gw).admits] == [False]  # the key checked first, no slot taken
    assert store(gw).held() == 0


# ---- request body ----------------------------------------------------------------------------------
def test_chat_body_rewritten_routed_and_a_slot_taken() -> None:
    gw = gateway()
    a = run(_forwarded(Exchange(gw)))
    assert a.reply is None and a.clear_route_cache
    assert a.body is not None and json.loads(a.body)["model"] == "up-pro"
    assert a.set_headers == {CLUSTER_HEADER: a.cluster, "content-length": str(len(a.body))}
    assert a.cluster is not None and "up-pro" in a.cluster
    assert store(gw).admits == [("rid-1", True)] and store(gw).held() == 1


def test_body_errors_take_no_slot() -> None:
    gw = gateway()
    error_of(run(_forwarded(Exchange(gw), b'{"model": "polish-pro", "messages": [')), 400, "invalid_json")
    error_of(run(_forwarded(Exchange(gw), b'{"model": "gpt-4o", "messages": [{"role": "user", "content": "x"}]}')),
             404, "model_not_found", "model")
    error_of(run(_forwarded(Exchange(gw), b'{"model": "polish-pro", "messages": []}')),
             400, "invalid_request", "messages")
    assert store(gw).held() == 0 and not store(gw).records


async def _refused(ex: Exchange, body: bytes = CHAT_BODY) -> Answer:
    """A request refused on the way in, to its end: the answer, then the close that follows it."""
    a = await _forwarded(ex, body)
    await ex.send_finish()
    await ex.close()
    return a


def test_refusals_are_logged_at_no_cost() -> None:
    """Every refused chat/embeddings request of a known key goes to the usage log: the status and the interface
    code the client got, no tokens, cost 0, no slot, no balance touched."""
    cases = [(10_000_000, "active", b'{"model": "polish-pro", "messages": [', 400, "invalid_json"),
             (10_000_000, "active", b'{"model": "gpt-4o", "messages": [{"role": "user", "content": "x"}]}', 404,
              "model_not_found"),
             (0, "active", CHAT_BODY, 402, "insufficient_quota"),
             (10_000_000, "suspended", CHAT_BODY, 403, "org_suspended")]
    for balance, org_status, body, status, code in cases:
        gw = gateway(balance=balance, status=org_status)
        a = run(_refused(Exchange(gw), body))
        error_of(a, status, code, "model" if code == "model_not_found" else None)
        assert logged_free(store(gw)) == (status, code)
        [rec] = store(gw).records
        assert (rec.request_id, rec.key_id, rec.endpoint, rec.alias) == ("rid-1", "key_1", "chat", "")
        assert store(gw).held() == 0 and store(gw).orgs["org_1"].balance == balance


def test_a_401_is_not_logged() -> None:
    """No key, no organisation: nothing to list it under."""
    gw = gateway()

    async def go() -> None:
        ex = Exchange(gw)
        await ex.request_body(CHAT_BODY, {"request.id": "rid-1", "request.method": "POST",
                                          "request.path": "/v1/chat/completions",
                                          "request.headers['authorization']": "Bearer " + OTHER_KEY})
        await ex.send_finish()
        await ex.close()
    run(go())
    assert store(gw).records == [] and store(gw).finishes == []


def test_body_over_the_limit() -> None:
    gw = gateway(max_body_bytes=len(CHAT_BODY) - 1)
    error_of(run(_forwarded(Exchange(gw))), 400, "invalid_request")
    assert store(gw).held() == 0
    # the key is checked first (docs/interface.md section 5), without taking a slot
    assert store(gw).admits == [("rid-1", False)]
    ex = Exchange(gw)
    a = run(ex.request_body(CHAT_BODY, {
        "request.id": "rid-1", "request.method": "POST", "request.path": "/v1/chat/completions",
        "request.headers['authorization']": "Bearer " + OTHER_KEY}))
    error_of(a, 401, "invalid_api_key")


# ---- the order of the checks (docs/interface.md section 5) ------------------------------------------------------
def test_authentication_comes_before_everything() -> None:
    gw = gateway(balance=0)
    ex = Exchange(gw)
    a = run(ex.request_body(b'{"model": "gpt-4o", "messages": [', {
        "request.id": "rid-1", "request.method": "POST", "request.path": "/v1/chat/completions",
        "request.headers['authorization']": "Bearer " + OTHER_KEY}))
    error_of(a, 401, "invalid_api_key")


def test_suspended_before_body_errors_and_limits() -> None:
    gw = gateway(status="suspended", balance=0)
    error_of(run(_forwarded(Exchange(gw))), 403, "org_suspended")
    error_of(run(_forwarded(Exchange(gw), b'{"model": "gpt-4o"}')), 403, "org_suspended")
    error_of(run(Exchange(gw).request_headers({**HEADERS, ":method": "GET", ":path": "/v1/models"}, True)),
             403, "org_suspended")


def test_balance_402_before_the_rate_limit() -> None:
    gw = gateway(balance=0, rpm=1)
    for _ in range(3):  # the rate limit would refuse the second: the balance answers first every time
        error_of(run(_forwarded(Exchange(gw))), 402, "insufficient_quota")
    assert store(gw).held() == 0


def test_rate_limit_429_with_retry_after() -> None:
    gw = gateway(rpm=1)
    assert run(_forwarded(Exchange(gw))).reply is None
    a = run(_forwarded(Exchange(gw)))
    error_of(a, 429, "rate_limit_exceeded")
    assert a.reply is not None and a.reply[2]["retry-after"] == "17"


def test_concurrency_429_retry_after_1() -> None:
    gw = gateway(conc=1)
    assert run(_forwarded(Exchange(gw))).reply is None
    a = run(_forwarded(Exchange(gw)))
    error_of(a, 429, "concurrency_limit_exceeded")
    assert a.reply is not None and a.reply[2]["retry-after"] == "1"


# ---- the reply ------------------------------------------------------------------------------------
def test_non_streaming_reply_billed_as_reported_and_slot_released() -> None:
    gw = gateway()

    async def go() -> tuple[Answer, Answer]:
        ex = Exchange(gw)
        await _forwarded(ex)
        h = await ex.response_headers({":status": "200", "content-type": "application/json"})
        b = await ex.response_body(chat_reply(prompt=11, completion=7), True)
        await ex.send_finish()
        await ex.close()  # the stream's end after a settled request changes nothing
        return h, b
    h, b = run(go())
    assert h == Answer()
    assert b.body is not None and json.loads(b.body)["model"] == "polish-pro"
    assert b.set_headers == {"content-length": str(len(b.body))}
    [rec] = store(gw).records
    assert (rec.request_id, rec.prompt_tokens, rec.completion_tokens, rec.estimated, rec.status) == (
        "rid-1", 11, 7, False, 200)
    assert rec.cost_micro_pln == -(-11 * 1_500_000 // 10**6) + -(-7 * 3_000_000 // 10**6)
    # the usage the client gets says what the request costs (not an estimate: no "estimated")
    assert json.loads(b.body)["usage"] == {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18,
                                           "cost_micro_pln": rec.cost_micro_pln}
    assert store(gw).held() == 0 and store(gw).orgs["org_1"].balance == 10_000_000 - rec.cost_micro_pln
    assert len(store(gw).finishes) == 1  # released once


def test_reply_without_usage_is_estimated() -> None:
    gw = gateway()

    async def go() -> None:
        ex = Exchange(gw)
        await _forwarded(ex)
        await ex.response_headers({":status": "200", "content-type": "application/json"})
        doc = json.loads(chat_reply())
        del doc["usage"]
        doc["choices"][0]["message"]["content"] = "x" * 46  # 46 characters: 10 tokens at 4.6 a token
        answer = await ex.response_body(json.dumps(doc).encode(), True)
        await ex.close()
        # the client gets the usage it is billed (docs/interface.md section 2: a reply has one), the rest as it came
        assert answer.body is not None and answer.set_headers["content-length"] == str(len(answer.body))
        got = json.loads(answer.body)
        # ... what it costs, and that it is an estimate: the usage record's figure
        [rec] = store(gw).records
        assert got.pop("usage") == {"prompt_tokens": EST, "completion_tokens": 10, "total_tokens": EST + 10,
                                    "cost_micro_pln": rec.cost_micro_pln, "estimated": True}
        assert got == {**doc, "model": "polish-pro"}
    run(go())
    [rec] = store(gw).records  # a complete reply: its input and its output are estimated (docs/interface.md section 4)
    assert (rec.prompt_tokens, rec.completion_tokens, rec.estimated) == (EST, 10, True)
    assert rec.cost_micro_pln == -(-EST * 1_500_000 // 10**6) + 30


def test_a_stream_is_handed_over_to_envoys_relay_named_in_a_header() -> None:
    """A 200 event stream: Envoy relays it (envoy/sse_relay.lua) and the stream watch bills it; the
    exchange names it for both in x-gateway-stream and bills nothing itself.  Its call ends with the
    stream: the concurrency slot is given back then, the record and the debit are the watch's."""
    gw = gateway()
    body = json.dumps({"model": "polish-pro", "stream": True,
                       "messages": [{"role": "user", "content": "Dzień dobry"}]}).encode()

    async def go() -> Answer:
        ex = Exchange(gw)
        await _forwarded(ex, body)
        h = await ex.response_headers({":status": "200", "content-type": "text/event-stream"})
        await ex.close()
        await asyncio.sleep(exchange.WATCH_WAIT_S + 0.01)  # (no stream watch of this process came)
        return h
    h = run(go())
    assert h.hand_over and h.remove_headers == ["content-length"]
    ctx = StreamContext.parse(h.set_headers[STREAM_HEADER])
    assert (ctx.endpoint, ctx.alias, ctx.upstream_model, ctx.client_wants_usage, ctx.request_id, ctx.org_id,
            ctx.key_id, ctx.estimated_prompt_tokens, ctx.owner) == (
        "chat", "polish-pro", "up-pro", False, "rid-1", "org_1", "key_1", EST, gw.owner)
    assert (ctx.input_price, ctx.output_price) == (1_500_000, 3_000_000) and isinstance(ctx.started, float)
    # the slot free, the journal entry (the record and the debit) the stream watch's to finish
    assert store(gw).records == [] and store(gw).held() == 0 and store(gw).journal == {"rid-1"}
    assert store(gw).released == ["rid-1"]


def test_upstream_error_bills_nothing() -> None:
    gw = gateway()

    async def go() -> Answer:
        ex = Exchange(gw)
        await _forwarded(ex)
        await ex.response_headers({":status": "503", "content-type": "application/json"})
        a = await ex.response_body(b'{"error": {"message": "overloaded"}}', True)
        await ex.send_finish()
        await ex.close()
        return a
    error_of(run(go()), 502, "upstream_unavailable")
    assert logged_free(store(gw)) == (502, "upstream_unavailable") and store(gw).held() == 0


def _error_reply(gw: Any, status: int, details: str, body: bytes) -> Answer:
    """A forwarded request whose reply is an error ``body``; ``details``: Envoy's response.code_details."""
    async def go() -> Answer:
        ex = Exchange(gw)
        await _forwarded(ex)
        await ex.response_headers({":status": str(status), "content-type": "application/json"},
                                  {"response.code_details": details})
        a = await ex.response_body(body, True)
        await ex.close()
        return a
    return run(go())


def test_envoys_own_error_reply_passes_unchanged_and_bills_nothing() -> None:
    """Envoy's local replies (no capacity, upstream timeout or reset; envoy/envoy.yaml) already have
    the interface's shape and the request id: they go to the client as they are."""
    gw = gateway()
    local = (b'{"error":{"message":"The model server timed out; retry with backoff.","type":"upstream_error",'
             b'"code":"upstream_timeout","param":null,"request_id":"rid-1"}}')
    a = _error_reply(gw, 504, "upstream_response_timeout", local)
    assert a.reply is None and a.body is None and a.set_headers == {}
    assert logged_free(store(gw)) == (504, "upstream_timeout") and store(gw).held() == 0


def test_a_model_servers_reply_shaped_like_envoys_own_is_still_the_model_servers() -> None:
    """Which reply is Envoy's own is Envoy's word (the response.code_details attribute), not the body's:
    a model server that answers the interface's JSON with the request id is mapped like any model-server error."""
    gw = gateway()
    lookalike = (b'{"error":{"message":"No capacity.","type":"server_error","code":"no_capacity","param":null,'
                 b'"request_id":"rid-1"}}')
    error_of(_error_reply(gw, 503, "via_upstream", lookalike), 502, "upstream_unavailable")
    assert logged_free(store(gw)) == (502, "upstream_unavailable")


def test_idle_gap_in_a_non_streaming_reply_is_502_and_billed_estimated_input() -> None:
    gw = gateway(idle_timeout_s=0.6)

    async def go() -> tuple[float | None, Answer]:
        ex = Exchange(gw)
        await _forwarded(ex)
        assert ex.idle is None  # no idle budget before the reply starts (Envoy's first-byte timer runs)
        await ex.response_headers({":status": "200", "content-type": "application/json"})
        idle = ex.idle
        return idle, await ex.idle_gap()
    idle, a = run(go())
    assert idle == 0.6
    error_of(a, 502, "upstream_timeout")
    [rec] = store(gw).records
    assert (rec.status, rec.prompt_tokens, rec.completion_tokens, rec.estimated) == (502, EST, 0, True)
    assert store(gw).held() == 0


@pytest.mark.parametrize("left", [True, False])
def test_a_call_that_ends_before_the_reply_bills_the_estimated_input_only_if_the_client_left(left: bool) -> None:
    """The call ended while the model server worked, before its reply: the client left (Envoy's access
    log says so: 499, the estimated input), or Envoy itself went away and the client got no byte
    (nothing billed, logged 500 internal_error)."""
    gw = gateway()
    if left:
        store(gw).left.add("rid-1")

    async def go() -> None:
        ex = Exchange(gw)
        await _forwarded(ex)
        await ex.close()
    run(go())
    [rec] = store(gw).records
    got = (rec.status, rec.error_code, rec.prompt_tokens, rec.completion_tokens, rec.estimated, rec.ttfb_ms)
    assert got == ((499, "", EST, 0, True, None) if left else (500, "internal_error", 0, 0, False, None))
    assert rec.cost_micro_pln == (-(-EST * 1_500_000 // 10**6) if left else 0)
    assert store(gw).held() == 0


def test_stream_reset_after_the_usage_chunk_bills_the_reported_usage() -> None:
    gw = gateway()
    body = json.dumps({"model": "polish-pro", "stream": True,
                       "messages": [{"role": "user", "content": "Dzień dobry"}]}).encode()

    async def go() -> None:
        ex = Exchange(gw)
        await _forwarded(ex, body)
        await ex.response_headers({":status": "200", "content-type": "text/event-stream"})
        await ex.response_body(sse(chunk("a"), usage_chunk(9, 1), done=False), False)
        await ex.close()
    run(go())
    [rec] = store(gw).records
    assert (rec.prompt_tokens, rec.completion_tokens, rec.estimated) == (9, 1, False)


def test_stream_reset_before_anything_was_forwarded_bills_nothing() -> None:
    gw = gateway()

    async def go() -> None:
        ex = Exchange(gw)
        await ex.request_headers({**HEADERS, ":method": "POST", ":path": "/v1/chat/completions"}, False)
        await ex.close()  # gone before the body came
    run(go())
    assert store(gw).records == [] and store(gw).finishes == []


def test_a_cache_miss_is_filled_from_the_directory_once() -> None:
    gw = gateway()
    run(_forwarded(Exchange(gw)))
    lookups = gw.directory.lookups  # type: ignore[attr-defined]
    assert lookups == 2  # the key, then its organisation
    run(_forwarded(Exchange(gw)))
    assert gw.directory.lookups == lookups  # type: ignore[attr-defined]


def test_the_admission_holds_the_worst_case_at_the_prices_in_force() -> None:
    """The store is asked to hold the estimated input + n x the max_tokens forwarded (clamped to the
    ceiling), at the prices in force when the request started; embeddings: their input."""
    from core.cost import Prices, cost_micro_pln
    gw = gateway()
    body = json.dumps({"model": "polish-pro", "n": 3, "max_tokens": 999_999,
                       "messages": [{"role": "user", "content": "Dzień dobry"}]}).encode()
    a = run(_forwarded(Exchange(gw), body))
    assert a.reply is None and a.body is not None
    hold = store(gw).holds[-1]
    assert hold is not None and (hold.input_tokens, hold.choices, hold.max_tokens) == (EST, 3, 2048)
    assert hold.prices == Prices(1_500_000, 3_000_000)
    assert hold.cost == cost_micro_pln(EST, 3 * 2048, hold.prices)

    async def embeddings() -> Answer:
        return await Exchange(gw).request_body(json.dumps({"model": "embed", "input": ["abcd", "efgh"]}).encode(), {
            "request.id": "rid-2", "request.method": "POST", "request.path": "/v1/embeddings",
            "request.headers['authorization']": "Bearer " + KEY})
    assert run(embeddings()).reply is None
    emb = store(gw).holds[-1]
    assert emb is not None and (emb.input_tokens, emb.choices, emb.max_tokens) == (2, 1, 0)
    assert emb.cost == cost_micro_pln(2, 0, Prices(200_000, 0))
