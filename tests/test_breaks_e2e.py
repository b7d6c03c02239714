"""Streams the model server breaks, through the real stack: reconciled per request id, the
events the client received, what the simulator sent, the tokens billed, the estimated flag and the
logged status.  Every event sent before the failure reaches the client; the client pays for nothing it
did not receive, and a failure before anything reached it (an error status, or an empty broken stream)
costs nothing."""
from __future__ import annotations

import json
import time

import httpx
import pytest

from conftest import Gateway, wait_for
from core.cost import estimate_chat_prompt

MSGS = [{"role": "user", "content": "Ile kosztuje bilet do Krakowa?"}]
EST_PROMPT = estimate_chat_prompt(MSGS)


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def _h(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _stream(gateway: Gateway, key: str, sim: dict[str, object]) -> tuple[httpx.Response, bytes, bool]:
    """(response, body received, whether the connection broke)."""
    body = {"model": "polish-pro", "messages": MSGS, "stream": True, "sim": sim}
    got = b""
    broke = False
    with httpx.stream("POST", gateway.v1 + "/chat/completions", json=body, headers=_h(key), timeout=30) as s:
        try:
            for chunk in s.iter_bytes():
                got += chunk
        except httpx.RemoteProtocolError:
            broke = True
    return s, got, broke


def _leave(gateway: Gateway, key: str, sim: dict[str, object], after: int) -> str:
    """A stream the client closes once ``after`` events have come: its request id."""
    body = {"model": "polish-pro", "messages": MSGS, "stream": True, "sim": sim}
    got = b""
    with httpx.stream("POST", gateway.v1 + "/chat/completions", json=body, headers=_h(key), timeout=30) as s:
        for chunk in s.iter_bytes():
            got += chunk
            if got.count(b"\n\n") >= after:
                break  # the client closes the connection mid-stream (on leaving this block)
    return s.headers["x-request-id"]


def _settled(gateway: Gateway, rid: str) -> dict:
    """The usage record of ``rid`` (every request is listed, billed or not).  A broken stream is billed
    once Envoy closed the stream watch's call (1 s after the stream ended), or, when the client got
    Envoy's 502, by the ext_proc 5 s after the stream ended."""
    rows = wait_for(lambda: gateway.sql("SELECT * FROM usage_records WHERE request_id = $1", rid), 15)
    return dict(rows[0])


def _free(row: dict) -> bool:
    """Listed, and billed nothing."""
    return (row["prompt_tokens"], row["completion_tokens"], row["cost_micro_pln"], row["estimated"]) == (0, 0, 0, False)


@pytest.mark.parametrize("gap_ms", [0, 5, 20, 100])
@pytest.mark.parametrize("sent", [0, 1, 2, 4])
def test_a_broken_stream_delivers_every_event_and_is_billed_what_reached_the_client(
        gateway: Gateway, gap_ms: int, sent: int) -> None:
    org, _, key = gateway.new_org(10_000_000)
    r, got, broke = _stream(gateway, key, {"fail_after_chunks": sent, "itl_ms": gap_ms, "output_tokens": 10})
    rid = r.headers["x-request-id"]
    served = gateway.sim_record(rid)
    assert served is not None and served["completed"] is False and served["events_sent"] == sent
    events = [e for e in got.split(b"\n\n") if e.startswith(b"data:")]
    content = [e for e in events if b'"content":"' in e and b'"content":""' not in e]
    row = _settled(gateway, rid)
    if r.status_code != 200:
        # the model server failed before Envoy passed its reply's headers on: Envoy's 502, nothing billed
        assert r.status_code == 502 and json.loads(got)["error"]["code"] == "upstream_unavailable"
        assert _free(row) and (row["status"], row["error_code"]) == (502, "upstream_unavailable"), row
        return
    # every event the model server sent reached the client (Envoy relays each as soon as it is whole),
    # then the stream ended without [DONE]
    assert broke and b"[DONE]" not in got and b'"error"' not in got
    assert len(events) == sent, (len(events), sent)
    assert all(json.loads(e[6:])["model"] == "polish-pro" for e in events)
    assert (row["status"], row["error_code"]) == (200, "upstream_unavailable"), row
    if not content:  # no output before the failure (the role chunk carries none): nothing billed
        assert _free(row), row
        return
    # the estimated input and one token per event with content that reached the client
    assert row["estimated"] is True and row["prompt_tokens"] == EST_PROMPT, row
    assert row["completion_tokens"] == len(content), (row, len(content))
    assert row["cost_micro_pln"] == _ceil(EST_PROMPT * 1_500_000, 10**6) + _ceil(len(content) * 3_000_000, 10**6)
    assert gateway.slots_held(org) == 0


@pytest.mark.parametrize("gap_ms", [0, 20])
def test_a_client_that_leaves_a_flowing_stream_is_billed_the_estimated_input(gateway: Gateway, gap_ms: int) -> None:
    """The interface: "A client disconnect at any point after the request reached the model server is billed the
    estimated input tokens": told from a model server's break by Envoy's access log, whatever the gap."""
    org, _, key = gateway.new_org(10_000_000)
    rid = _leave(gateway, key, {"itl_ms": gap_ms or 1, "output_tokens": 2000}, after=4)
    row = _settled(gateway, rid)
    assert (row["status"], row["error_code"], row["estimated"]) == (499, None, True), row
    assert (row["prompt_tokens"], row["completion_tokens"]) == (EST_PROMPT, 0), row
    assert row["cost_micro_pln"] == _ceil(EST_PROMPT * 1_500_000, 10**6)
    served = gateway.sim_record(rid)
    assert served is not None and served["completed"] is False
    assert gateway.slots_held(org) == 0


def test_a_client_that_leaves_a_stream_frees_its_concurrency_slot_at_once(gateway: Gateway) -> None:
    """A client that stops a stream and sends its next request at once is not refused for the slot the
    stopped stream held: Envoy's access log tells the stream watch, which bills the request and frees
    the slot then, not when Envoy's deferred close of the watch's call (1 s later) would end it."""
    org, _, key = gateway.new_org(10_000_000)
    gateway.admin(lambda a: a.set_limits(org, None, 1))
    rid = _leave(gateway, key, {"itl_ms": 20, "output_tokens": 2000}, after=3)
    left = time.monotonic()
    wait_for(lambda: gateway.slots_held(org) == 0, 5)
    freed = time.monotonic() - left
    assert freed < 0.7, f"the slot was held {freed:.2f} s after the client left"  # was about 1.1 s
    r = httpx.post(gateway.v1 + "/chat/completions", headers=_h(key),
                   json={"model": "polish-pro", "messages": MSGS, "sim": {"output_tokens": 2}})
    assert r.status_code == 200, r.text
    row = _settled(gateway, rid)
    assert (row["status"], row["error_code"], row["estimated"], row["prompt_tokens"], row["completion_tokens"]) == (
        499, None, True, EST_PROMPT, 0), row


def test_a_client_that_leaves_a_non_streaming_reply_it_began_to_get_is_logged_499(gateway: Gateway) -> None:
    """A client that gives up while the model server is half-way through a non-streaming reply (the
    simulator's pause mid-body): billed the estimated input and logged 499 as every client that left, not
    as a reply the model server broke (502): Envoy's access log tells the two apart."""
    org, _, key = gateway.new_org(10_000_000)
    body = {"model": "polish-pro", "messages": MSGS, "sim": {"stall_ms": 3000, "output_tokens": 40}}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(gateway.v1 + "/chat/completions", json=body, headers=_h(key), timeout=httpx.Timeout(10, read=1.0))
    rows = wait_for(lambda: gateway.sql("SELECT * FROM usage_records WHERE org_id = $1", org), 15)
    [row] = [dict(r) for r in rows]
    assert (row["status"], row["error_code"], row["estimated"], row["prompt_tokens"], row["completion_tokens"]) == (
        499, None, True, EST_PROMPT, 0), row
    assert row["cost_micro_pln"] == _ceil(EST_PROMPT * 1_500_000, 10**6)
    served = gateway.sim_record(row["request_id"])
    assert served is not None and served["completed"] is False
    assert gateway.slots_held(org) == 0


def _watch_calls(gateway: Gateway) -> int:
    stats = httpx.get(f"http://127.0.0.1:{gateway.stack.s.envoy_admin_port}/stats?filter=stream_watch").text
    return sum(int(line.split(": ")[1]) for line in stats.splitlines() if line.endswith("streams_started") or
               ".streams_started:" in line)


def test_only_a_streamed_reply_goes_to_the_stream_watch_and_its_relay(gateway: Gateway) -> None:
    """The relay and the stream watch are skipped for every other reply (no second gRPC call for a JSON
    reply, an error or a stream the model server refused), and the internal header never reaches a client."""
    _, _, key = gateway.new_org(10_000_000)
    before = _watch_calls(gateway)
    for sim in ({}, {"status": 500}):
        r = httpx.post(gateway.v1 + "/chat/completions", headers=_h(key),
                       json={"model": "polish-pro", "messages": MSGS, "sim": {"output_tokens": 2, **sim}})
        assert r.status_code in (200, 502) and "x-gateway-stream" not in r.headers
    r, got, broke = _stream(gateway, key, {"status": 500})
    assert r.status_code == 502 and not broke
    assert _watch_calls(gateway) == before
    r, got, broke = _stream(gateway, key, {"output_tokens": 3})
    assert r.status_code == 200 and not broke and got.endswith(b"data: [DONE]\n\n")
    assert "x-gateway-stream" not in r.headers
    wait_for(lambda: _watch_calls(gateway) == before + 1, 5)
