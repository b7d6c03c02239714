"""extproc/server.py alone: hand-made ext_proc ProcessingRequest messages into the stream loop (a
scripted call, tests/extproc_fakes.py), ProcessingResponse messages out.  Every phase, the idle timer
(armed only once the reply started), the idle gap, a stream reset by Envoy, Envoy's own error replies
passed through, a failing phase turned into the interface's 500."""
from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2 as pm
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep

from core.cost import estimate_chat_prompt
from core.stream_context import HEADER as STREAM_HEADER, StreamContext
from extproc import exchange, server
from extproc.billing_outcome import ANSWERED, LEFT
from extproc.exchange import CLUSTER_HEADER, Gateway
from extproc.grpc_server import EOF, UNAVAILABLE, Status
from extproc.server import END_WAIT_S, LEFT_GRACE_S, ROLE_HEADER, WATCH_ROLE, Processor
from extproc_fakes import (CHAT_BODY, OTHER_KEY, STALL, FakeCall, chat_reply, chunk, gateway, logged_free,
                           request_body, request_headers, response_body, response_headers, sse, store,
                           usage_chunk)

EST = estimate_chat_prompt([{"role": "user", "content": "Dzień dobry"}])
STREAM_BODY = json.dumps({"model": "polish-pro", "stream": True, "stream_options": {"include_usage": True},
                          "messages": [{"role": "user", "content": "Dzień dobry"}]}).encode()


def process(gw: Gateway, *script: Any) -> FakeCall:
    call = FakeCall(*script)
    asyncio.run(Processor(gw).process(call))  # type: ignore[arg-type]
    return call


def immediate(msg: ep.ProcessingResponse, status: int, code: str | None = None) -> dict[str, Any]:
    assert msg.WhichOneof("response") == "immediate_response", msg
    ir = msg.immediate_response
    assert ir.status.code == status
    headers = {h.header.key: h.header.raw_value.decode() for h in ir.headers.set_headers}
    assert headers["content-type"] == "application/json"
    doc = json.loads(ir.body)
    if code is not None:
        err = doc["error"]
        assert err["code"] == code and err["request_id"] == "rid-1", err
        assert set(err) == {"message", "type", "code", "param", "request_id"}
    return {"headers": headers, "body": doc}


def mutated(common: ep.CommonResponse) -> tuple[dict[str, str], bytes]:
    headers = {h.header.key: h.header.raw_value.decode() for h in common.header_mutation.set_headers}
    return headers, common.body_mutation.body


# ---- request headers -------------------------------------------------------------------------------
def test_models_answered_on_the_headers_message_and_the_stream_ends() -> None:
    gw = gateway()
    call = process(gw, request_headers("GET", "/v1/models"), response_headers(200))
    [msg] = call.written
    doc = immediate(msg, 200)["body"]
    assert doc["object"] == "list" and "polish-pro" in {m["id"] for m in doc["data"]}
    # the reply was the last answer: what came after it is not answered, and the call is read to Envoy's end
    assert call.script == [] and call.ended


def test_401_immediate_reply_for_a_missing_or_unknown_key() -> None:
    for key in (None, OTHER_KEY):
        gw = gateway()
        call = process(gw, request_headers("GET", "/v1/models", key=key))
        [msg] = call.written
        immediate(msg, 401, "invalid_api_key")


def test_chunked_post_continues_to_its_body() -> None:
    gw = gateway()
    call = process(gw, request_headers("POST", "/v1/chat/completions", end_of_stream=False,
                                       **{"content-type": "application/json"}))
    [msg] = call.written
    assert msg.WhichOneof("response") == "request_headers"
    assert not msg.request_headers.response.HasField("header_mutation")


# ---- a whole non-streaming exchange ----------------------------------------------------------------
def test_every_phase_of_a_non_streaming_chat() -> None:
    gw = gateway(idle_timeout_s=60.0)
    call = process(gw, request_body(CHAT_BODY), response_headers(200),
                   response_body(chat_reply(prompt=11, completion=7)))
    body_msg, headers_msg, reply_msg = call.written
    # request body: rewritten for the model server, routed by header and by dynamic metadata
    assert body_msg.WhichOneof("response") == "request_body"
    common = body_msg.request_body.response
    headers, body = mutated(common)
    assert json.loads(body)["model"] == "up-pro" and headers["content-length"] == str(len(body))
    assert common.clear_route_cache
    cluster = headers[CLUSTER_HEADER]
    assert body_msg.dynamic_metadata.fields["gateway"].struct_value.fields["cluster"].string_value == cluster
    # response headers: passed on, the body stays buffered
    assert headers_msg.WhichOneof("response") == "response_headers"
    assert not headers_msg.HasField("mode_override")
    # response body: the alias back in "model", the length set
    assert reply_msg.WhichOneof("response") == "response_body"
    headers, body = mutated(reply_msg.response_body.response)
    assert json.loads(body)["model"] == "polish-pro" and headers["content-length"] == str(len(body))
    # no idle timer until the reply started; then the idle budget; then the wait for Envoy's end
    assert call.timeouts == [None, None, 60.0, END_WAIT_S]
    [rec] = store(gw).records
    assert (rec.request_id, rec.prompt_tokens, rec.completion_tokens, rec.estimated) == ("rid-1", 11, 7, False)
    assert store(gw).held() == 0


def test_a_streamed_reply_is_handed_over_and_the_call_lasts_as_long_as_the_stream() -> None:
    gw = gateway()
    call = process(gw, request_body(STREAM_BODY), response_headers(200, "text/event-stream"),
                   ep.ProcessingRequest(response_trailers=ep.HttpTrailers()))
    _, headers_msg, trailers_msg = call.written
    # no body here (Envoy relays it), but the trailers phase: the call ends when the stream does
    mode = headers_msg.mode_override
    assert (mode.response_body_mode, mode.response_trailer_mode) == (pm.ProcessingMode.NONE, pm.ProcessingMode.SEND)
    headers, _ = mutated(headers_msg.response_headers.response)
    assert StreamContext.parse(headers[STREAM_HEADER]).alias == "polish-pro"
    assert list(headers_msg.response_headers.response.header_mutation.remove_headers) == ["content-length"]
    assert trailers_msg.WhichOneof("response") == "response_trailers"
    assert call.timeouts[-2:] == [None, END_WAIT_S]  # the idle budget is the stream watch's
    # the stream reached its end (its trailers phase): the stream watch finishes it at once, slot and
    # record, so no early release of the slot is sent
    assert store(gw).records == [] and store(gw).held() == 1 and store(gw).released == []


def test_a_hand_over_cut_off_at_once_is_logged_as_envoys_502_unless_the_watch_billed_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The call ended right after the hand-over: Envoy may have reset the client's stream before reading
    it (the client got 502 and the stream watch saw nothing).  The ext_proc records that 502, later than
    the watch would have, and only if the watch did not (the first finish counts).  The watch's call may
    be read after this one ended: it is looked for again a moment later (``WATCH_WAIT_S``), and a watch
    that saw the stream end needs no early release of the slot."""
    monkeypatch.setattr(exchange, "HAND_OVER_GRACE_S", 0.01)
    monkeypatch.setattr(exchange, "WATCH_WAIT_S", 0.005)
    for watched in (False, True):
        gw = gateway()

        async def go() -> None:
            call = FakeCall(request_body(STREAM_BODY), response_headers(200, "text/event-stream"), EOF)
            await Processor(gw).process(call)  # type: ignore[arg-type]
            if watched:
                ctx = mutated(call.written[1].response_headers.response)[0][STREAM_HEADER]
                await Processor(gw).process(watch_call(  # type: ignore[arg-type]
                    response_headers(200, "text/event-stream", **{STREAM_HEADER: ctx}),
                    response_body(sse(chunk("a"), usage_chunk(9, 1)), end_of_stream=True)))
            await asyncio.sleep(0.05)
        asyncio.run(go())
        if watched:
            [rec] = store(gw).records
            assert (rec.status, rec.prompt_tokens, rec.completion_tokens) == (200, 9, 1)
            # the watch ran in this process: no finish of the ext_proc's own, no Redis call for it
            assert len(store(gw).finishes) == 1 and gw.watched == {} and store(gw).released == []
        else:
            assert logged_free(store(gw)) == (502, "upstream_unavailable")
            assert store(gw).released == [rec.request_id for rec in store(gw).records]
        assert store(gw).held() == 0


@pytest.mark.parametrize("answered", [False, True])
def test_a_stream_whose_watch_never_finished_is_billed_the_estimated_input(monkeypatch: pytest.MonkeyPatch,
                                                                            answered: bool) -> None:
    """The stream ended (the call's trailers phase) and no stream watch finished it in the grace (its
    process died): billed the estimated input, as the reaper bills a request whose ext_proc died; unless
    Envoy's access log says its message timeout answered the client in the headers' place (Envoy paused
    before it read the hand-over): then logged as that 500, billed nothing."""
    monkeypatch.setattr(exchange, "HAND_OVER_GRACE_S", 0.01)
    gw = gateway()
    if answered:
        store(gw).answered.add("rid-1")

    async def go() -> None:
        await Processor(gw).process(FakeCall(  # type: ignore[arg-type]
            request_body(STREAM_BODY), response_headers(200, "text/event-stream"),
            ep.ProcessingRequest(response_trailers=ep.HttpTrailers())))
        await asyncio.sleep(0.05)
    asyncio.run(go())
    [rec] = store(gw).records
    assert (rec.status, rec.error_code, rec.prompt_tokens, rec.completion_tokens, rec.estimated,
            rec.cost_micro_pln > 0) == ((500, "internal_error", 0, 0, False, False) if answered
                                        else (200, "", EST, 0, True, True))
    assert store(gw).held() == 0


# ---- the stream watch (extproc/observer.py): copies of a handed-over stream, never answered ---------
def watch_call(*script: Any) -> FakeCall:
    return FakeCall(*script, metadata={ROLE_HEADER: WATCH_ROLE})


def watched(gw: Gateway, *script: Any, left: bool = False) -> tuple[FakeCall, BaseException | None]:
    """The main call hands the stream over; the watch's call then gets ``script`` after the headers."""
    main = process(gw, request_body(STREAM_BODY), response_headers(200, "text/event-stream"),
                   ep.ProcessingRequest(response_trailers=ep.HttpTrailers()))
    ctx = mutated(main.written[1].response_headers.response)[0][STREAM_HEADER]
    if left:
        store(gw).left.add("rid-1")
    call = watch_call(response_headers(200, "text/event-stream", **{STREAM_HEADER: ctx}), *script)
    try:
        asyncio.run(Processor(gw).process(call))  # type: ignore[arg-type]
    except Status as e:
        return call, e
    return call, None


def test_the_watch_bills_the_usage_of_a_whole_stream_and_answers_nothing() -> None:
    gw = gateway()
    events = sse(chunk("Cześć"), chunk(None, finish="stop"), usage_chunk(9, 1))
    call, failed = watched(gw, response_body(events[:40], end_of_stream=False),
                           response_body(events[40:], end_of_stream=False), response_body(b"", end_of_stream=True))
    assert failed is None and call.written == []  # observability mode: Envoy reads no answer
    [rec] = store(gw).records
    assert (rec.status, rec.prompt_tokens, rec.completion_tokens, rec.estimated, rec.stream) == (200, 9, 1, False, True)
    assert rec.cost_micro_pln == 14 + 3 and store(gw).held() == 0


def test_the_watch_estimates_a_whole_stream_without_usage() -> None:
    gw = gateway()
    watched(gw, response_body(sse(chunk("a"), chunk("b"), chunk(None, finish="stop")), end_of_stream=True))
    [rec] = store(gw).records
    assert (rec.status, rec.prompt_tokens, rec.completion_tokens, rec.estimated) == (200, EST, 2, True)


def test_idle_gap_in_a_stream_fails_the_watch_call_and_bills_what_was_sent() -> None:
    gw = gateway(idle_timeout_s=0.6)
    call, failed = watched(gw, response_body(sse(chunk("a"), chunk("b"), done=False), end_of_stream=False), STALL)
    assert isinstance(failed, Status) and failed.code == UNAVAILABLE  # Envoy resets the client's stream
    assert call.timeouts == [None, 0.6, 0.6]  # the idle budget, once the stream is known
    [rec] = store(gw).records
    assert (rec.status, rec.error_code, rec.prompt_tokens, rec.completion_tokens, rec.estimated) == (
        200, "upstream_timeout", EST, 2, True)


def test_a_stream_the_model_server_broke_bills_the_events_that_reached_the_client() -> None:
    """Envoy relays each whole event at once: every one the watch saw reached the client."""
    gw = gateway()
    watched(gw, response_body(sse(chunk("a"), chunk("b"), done=False), end_of_stream=False),
            response_body(sse(chunk("c"), done=False) + b'data: {"id"', end_of_stream=False), EOF)
    [rec] = store(gw).records
    assert (rec.status, rec.error_code, rec.prompt_tokens, rec.completion_tokens, rec.estimated) == (
        200, "upstream_unavailable", EST, 3, True)
    assert store(gw).held() == 0


def test_a_stream_broken_before_any_output_bills_nothing() -> None:
    gw = gateway()
    watched(gw, EOF)
    assert logged_free(store(gw)) == (200, "upstream_unavailable") and store(gw).held() == 0


def test_a_stream_the_client_left_bills_the_estimated_input() -> None:
    """The interface: a client disconnect at any point after the request reached the model server is billed the
    estimated input tokens (Envoy's access log says the client left: ``access_log``)."""
    gw = gateway()
    watched(gw, response_body(sse(chunk("a"), chunk("b"), done=False), end_of_stream=False), EOF, left=True)
    [rec] = store(gw).records
    assert (rec.status, rec.error_code, rec.prompt_tokens, rec.completion_tokens, rec.estimated) == (
        499, "", EST, 0, True)


def test_a_client_that_left_per_envoys_access_log_ends_the_watch_at_once() -> None:
    """Envoy's access log reaches this process (``Gateway.leaving``): the watch bills the request 499 at
    once, from its own knowledge (no Redis look-up), after a short grace for copies still on their way,
    not when Envoy's deferred close of its call (1 s) would end it."""
    gw = gateway()
    told: list[str] = []

    def access_log_says_left() -> None:
        [rid] = gw.leaving
        told.append(rid)
        gw.leaving.pop(rid)(LEFT)

    call, failed = watched(gw, response_body(sse(chunk("a"), chunk("b"), done=False), end_of_stream=False),
                           access_log_says_left, response_body(sse(chunk("c"), done=False), end_of_stream=False),
                           EOF)
    assert failed is None and told == ["rid-1"] and call.ending == [LEFT_GRACE_S] and gw.leaving == {}
    [rec] = store(gw).records
    assert (rec.status, rec.error_code, rec.prompt_tokens, rec.completion_tokens, rec.estimated) == (
        499, "", EST, 0, True)
    assert "rid-1" not in store(gw).left and store(gw).held() == 0  # told, not looked up


def test_a_watch_that_ended_is_no_longer_told() -> None:
    gw = gateway()
    watched(gw, response_body(sse(chunk("a"), chunk(None, finish="stop")), end_of_stream=True))
    assert gw.leaving == {}


def test_a_reply_that_ends_on_its_headers_ends_the_stream() -> None:
    gw = gateway()
    call = process(gw, request_body(CHAT_BODY), response_headers(204, end_of_stream=True), response_body(b"x"))
    # the body that followed the end is not answered: the call is read to Envoy's end
    assert [m.WhichOneof("response") for m in call.written] == ["request_body", "response_headers"]
    assert call.script == [] and call.ended
    [rec] = store(gw).records  # the request reached the model server: estimated input (docs/interface.md section 4)
    assert (rec.prompt_tokens, rec.estimated) == (EST, True)


# ---- errors -----------------------------------------------------------------------------------------
def test_body_error_is_an_immediate_reply() -> None:
    gw = gateway()
    call = process(gw, request_body(b'{"model": "polish-pro", "messages": ['))
    [msg] = call.written
    immediate(msg, 400, "invalid_json")
    assert store(gw).held() == 0


def test_check_order_on_the_wire_401_then_402_then_429() -> None:
    gw = gateway(balance=0, rpm=1)
    immediate(process(gw, request_body(CHAT_BODY, key=OTHER_KEY)).written[0], 401, "invalid_api_key")
    immediate(process(gw, request_body(CHAT_BODY)).written[0], 402, "insufficient_quota")
    immediate(process(gw, request_body(CHAT_BODY)).written[0], 402, "insufficient_quota")  # not 429
    store(gw).orgs["org_1"].balance = 1_000_000  # topped up: now the rate limit
    assert process(gw, request_body(CHAT_BODY)).written[0].WhichOneof("response") == "request_body"
    r = immediate(process(gw, request_body(CHAT_BODY, request_id="rid-1")).written[0], 429, "rate_limit_exceeded")
    assert r["headers"]["retry-after"] == "17"


def test_upstream_error_becomes_spec_502_and_bills_nothing() -> None:
    gw = gateway()
    call = process(gw, request_body(CHAT_BODY), response_headers(500),
                   response_body(b'{"detail": "CUDA out of memory"}'))
    r = immediate(call.written[-1], 502, "upstream_unavailable")
    assert "CUDA" not in json.dumps(r["body"])
    assert logged_free(store(gw)) == (502, "upstream_unavailable") and store(gw).held() == 0


def test_envoys_local_reply_passes_through_unchanged() -> None:
    """Envoy's own error replies (no capacity, upstream timeout or reset, body too large) come back
    through the response phases already in the interface's shape: continued as they are, nothing billed."""
    gw = gateway()
    local = json.dumps({"error": {"message": "No capacity for this model right now; retry with backoff.",
                                  "type": "server_error", "code": "no_capacity", "param": None,
                                  "request_id": "rid-1"}}, separators=(",", ":")).encode()
    call = process(gw, request_body(CHAT_BODY), response_headers(503, details="no_healthy_upstream"),
                   response_body(local))
    last = call.written[-1]
    assert last.WhichOneof("response") == "response_body"
    assert not last.response_body.response.HasField("body_mutation")
    assert not last.response_body.response.HasField("header_mutation")
    assert logged_free(store(gw)) == (503, "no_capacity") and store(gw).held() == 0


def test_idle_gap_in_a_non_streaming_reply_is_an_immediate_502() -> None:
    gw = gateway(idle_timeout_s=0.6)
    call = process(gw, request_body(CHAT_BODY), response_headers(200), STALL, response_body(chat_reply()))
    immediate(call.written[-1], 502, "upstream_timeout")
    assert call.timeouts[-1] == 0.6 and len(call.script) == 1  # the late body was never read
    [rec] = store(gw).records
    assert (rec.status, rec.prompt_tokens, rec.completion_tokens, rec.estimated) == (502, EST, 0, True)
    assert store(gw).held() == 0


def test_stream_reset_by_envoy_mid_request_releases_and_bills_estimated_input() -> None:
    gw = gateway()
    store(gw).left.add("rid-1")  # Envoy's access log: the client went away while the model server worked
    call = process(gw, request_body(CHAT_BODY), EOF)
    assert [m.WhichOneof("response") for m in call.written] == ["request_body"]
    [rec] = store(gw).records
    assert (rec.status, rec.prompt_tokens, rec.completion_tokens, rec.estimated) == (499, EST, 0, True)
    assert store(gw).held() == 0


def test_a_request_envoy_reset_before_it_was_admitted_is_logged_as_its_500_and_never_admitted() -> None:
    """A process that resumed from a pause reads the request and, before it, Envoy's reset of its call
    (Envoy's message timeout answered the client: the interface's 500 internal_error): authenticated only, logged
    as that 500 at no cost, never admitted (no slot, nothing of the per-minute budget)."""
    gw = gateway()
    call = FakeCall(request_body(CHAT_BODY), EOF)
    call.reset = call.ended = True
    asyncio.run(Processor(gw).process(call))  # type: ignore[arg-type]
    [msg] = call.written
    immediate(msg, 500, "internal_error")
    assert store(gw).admits == [("rid-1", False)]  # authentication only
    [rec] = store(gw).records
    assert (rec.request_id, rec.status, rec.error_code, rec.cost_micro_pln, rec.prompt_tokens) == (
        "rid-1", 500, "internal_error", 0, 0)
    assert store(gw).held() == 0 and not any(store(gw).used.values())


@pytest.mark.parametrize("paused_at", ["response_headers", "response_body", "the headers' answer"])
def test_a_reply_whose_headers_envoy_answered_while_the_process_was_paused_is_its_500_billed_nothing(
        paused_at: str) -> None:
    """The process paused holding a reply's headers (a JSON reply's are held with its body) past Envoy's
    message timeout: Envoy answered the client the interface's 500 internal_error in the reply's place and
    reset the call.  The resumed process reads the reply's message, then (once settled) that reset: it answers
    nothing more, logs that 500 and bills nothing, whatever the model server sent.  Its reset may also come
    only after the process answered the headers late (the call ends then, expired)."""
    gw = gateway()
    call = FakeCall()

    def pause() -> None:
        call.expired = call.reset = True
    script: list[Any] = [request_body(CHAT_BODY), response_headers(200), response_body(chat_reply())]
    if paused_at == "the headers' answer":
        script[2:] = [pause, EOF]
    else:
        script.insert(1 if paused_at == "response_headers" else 2, pause)
    call.script = script
    asyncio.run(Processor(gw).process(call))  # type: ignore[arg-type]
    answered = ["request_body"] + (["response_headers"] if paused_at != "response_headers" else [])
    assert [m.WhichOneof("response") for m in call.written] == answered
    [rec] = store(gw).records
    assert (rec.status, rec.error_code, rec.cost_micro_pln, rec.prompt_tokens, rec.completion_tokens,
            rec.estimated) == (500, "internal_error", 0, 0, 0, False)
    assert store(gw).held() == 0


@pytest.mark.parametrize("ending", [LEFT, ANSWERED])
@pytest.mark.parametrize("how", ["told", "marked", "neither"])
def test_a_non_streaming_reply_cut_after_it_began_is_logged_as_envoys_access_log_says(how: str, ending: str) -> None:
    """The client leaving, the model server breaking a reply and Envoy's message timeout answering the
    client (Envoy paused, say, its timer firing before it read the answer to the reply's headers) all end
    the call after the reply's headers: Envoy's access log, told here (``Gateway.leaving``) or marked in
    Redis by another process, says which.  The client that left is billed the estimated input, logged 499;
    the reply the model server broke, the estimated input, 502; Envoy's own 500 took the reply's place:
    nothing, logged as that 500."""
    gw = gateway()
    script: list[Any] = [request_body(CHAT_BODY), response_headers(200)]
    if how == "told":  # the access log's entry arrives while the call's end waits for it
        script.append(lambda: asyncio.get_running_loop().call_later(0.05, lambda: gw.leaving.pop("rid-1")(ending)))
    elif how == "marked":
        (store(gw).left if ending == LEFT else store(gw).answered).add("rid-1")
    process(gw, *script, EOF)
    [rec] = store(gw).records
    got = (rec.status, rec.error_code, rec.prompt_tokens, rec.completion_tokens, rec.estimated, rec.cost_micro_pln > 0)
    if how == "neither":
        assert got == (502, "upstream_unavailable", EST, 0, True, True)
    elif ending == LEFT:
        assert got == (499, "", EST, 0, True, True)
    else:
        assert got == (500, "internal_error", 0, 0, False, False)
    assert gw.leaving == {} and store(gw).held() == 0


@pytest.mark.parametrize("told", [ANSWERED, LEFT, ""])
@pytest.mark.parametrize("reply", [200, 400])
@pytest.mark.parametrize("when", ["ended late", "ended before the answer"])
def test_a_last_answer_envoy_may_not_have_read_is_recorded_as_its_access_log_says(
        monkeypatch: pytest.MonkeyPatch, told: str, reply: int, when: str) -> None:
    """The record of a request waits for Envoy's end of the call after the last answer (about a
    millisecond).  A call Envoy ended before the answer went (this process paused past Envoy's message
    timeout), or ends late (Envoy paused with the answer unread, its timer seen first on resuming), asks
    Envoy's access log what the client got: its message timeout's 500 (billed nothing, whatever the model
    server replied: a 200 with usage, or its own 400), or nothing, the client having left (499, the
    estimated input); otherwise the record stands."""
    monkeypatch.setattr(exchange, "LEFT_WAIT_S", 0.01)
    gw = gateway()
    if told:
        (store(gw).answered if told == ANSWERED else store(gw).left).add("rid-1")
    error = json.dumps({"object": "error", "message": "bad", "type": "BadRequestError", "code": 400}).encode()
    script: list[Any] = [request_body(CHAT_BODY), response_headers(reply)]
    if when == "ended late":
        monkeypatch.setattr(server, "LATE_S", -1.0)  # every end taken as late
    else:
        script.append(lambda: setattr(call, "ended", True))  # Envoy's end came while the reply waited here
    script.append(response_body(chat_reply() if reply == 200 else error))
    call = FakeCall(*script)
    asyncio.run(Processor(gw).process(call))  # type: ignore[arg-type]
    [rec] = store(gw).records
    got = (rec.status, rec.error_code, rec.prompt_tokens, rec.completion_tokens, rec.estimated, rec.cost_micro_pln > 0)
    if told == ANSWERED:
        assert got == (500, "internal_error", 0, 0, False, False)
    elif told == LEFT and reply == 200:
        assert got == (499, "", EST, 0, True, True)
    elif reply == 200:
        assert got == (200, "", 11, 7, False, True)
    else:
        assert got[:2] == (400, "invalid_request") and not got[5], got
    assert store(gw).held() == 0


@pytest.mark.parametrize("reply", [200, 400])
def test_a_reply_whose_envoy_died_before_it_ended_the_call_is_billed_nothing(reply: int) -> None:
    """Envoy ends the call in the same turn of its loop as it hands the reply to the client, and both go
    out together.  A call whose connection went away after the last answer instead (Envoy killed): the
    client got no byte of the reply, whatever the model server sent, so the request is recorded as one
    whose connection went with Envoy (500 internal_error), billed nothing; its slot is given back."""
    gw = gateway()
    error = json.dumps({"object": "error", "message": "bad", "type": "BadRequestError", "code": 400}).encode()

    def envoy_killed() -> None:
        call.gone = call.reset = True
    call = FakeCall(request_body(CHAT_BODY), response_headers(reply),
                    response_body(chat_reply() if reply == 200 else error), envoy_killed)
    asyncio.run(Processor(gw).process(call))  # type: ignore[arg-type]
    # the answer went (the reply let go, or the model server's error in the interface's shape)
    assert call.written[-1].WhichOneof("response") == ("response_body" if reply == 200 else "immediate_response")
    assert logged_free(store(gw)) == (500, "internal_error")
    assert store(gw).held() == 0


def test_a_failing_phase_is_spec_500_never_a_hang() -> None:
    gw = gateway()

    async def broken(*_: Any, **__: Any) -> Any:
        raise RuntimeError("boom")
    store(gw).admit = broken  # type: ignore[method-assign]
    call = process(gw, request_body(CHAT_BODY), response_headers(200))
    [msg] = call.written
    r = immediate(msg, 500, "internal_error")
    assert "boom" not in json.dumps(r["body"])
    assert call.script == [] and call.ended  # nothing answered after the reply


def test_one_key_may_hold_many_streams_each_with_its_own_record() -> None:
    gw = gateway()
    for i in range(3):
        process(gw, request_body(CHAT_BODY, request_id=f"rid-{i}"), response_headers(200),
                response_body(chat_reply(prompt=5 + i, completion=1)))
    assert [(r.request_id, r.prompt_tokens) for r in store(gw).records] == [("rid-0", 5), ("rid-1", 6),
                                                                             ("rid-2", 7)]
    assert store(gw).held() == 0
