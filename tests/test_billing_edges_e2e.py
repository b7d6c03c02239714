"""Endings the billing rules once got wrong, through the real stack (Envoy, the ext_proc, Redis,
PostgreSQL, the simulator): each reconciled by request id between what the client received, what the
simulator sent and the usage record (tests/test_billing_outcome.py holds the same rows as a table).

- a stream that breaks after only its role chunk produced no output: billed nothing;
- a client that leaves a stream after its headers, before the first chunk: the estimated input, 499;
- the concurrency slot is free again within a second of any reply's end, streamed or not;
- a JSON reply's usage is read as JSON, whatever the order of its members;
- a price is applied from its effective time on, never before.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest
import yaml

from conftest import Gateway, assert_error, wait_for
from core.cost import estimate_chat_prompt

MSGS = [{"role": "user", "content": "Ile kosztuje bilet do Krakowa?"}]
EST_PROMPT = estimate_chat_prompt(MSGS)
CHAT = "/chat/completions"


def _h(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def _row(gateway: Gateway, rid: str) -> dict:
    rows = wait_for(lambda: gateway.sql("SELECT * FROM usage_records WHERE request_id = $1", rid), 15)
    return dict(rows[0])


def _free(row: dict) -> bool:
    return (row["prompt_tokens"], row["completion_tokens"], row["cost_micro_pln"], row["estimated"]) == (0, 0, 0, False)


def _stream(gateway: Gateway, key: str, sim: dict[str, object]) -> tuple[httpx.Response, bytes, bool]:
    """(response, body received, whether the connection broke)."""
    body = {"model": "polish-pro", "messages": MSGS, "stream": True, "sim": sim}
    got, broke = b"", False
    with httpx.stream("POST", gateway.v1 + CHAT, json=body, headers=_h(key), timeout=30) as s:
        try:
            for chunk in s.iter_bytes():
                got += chunk
        except httpx.RemoteProtocolError:
            broke = True
    return s, got, broke


def test_a_stream_broken_after_only_its_role_chunk_is_billed_nothing(gateway: Gateway) -> None:
    """The role chunk carries no content: the model server produced no output before the failure."""
    org, _, key = gateway.new_org(10_000_000)
    # the role chunk 0.3 s after the headers (so Envoy has passed them on), then the connection drops
    r, got, broke = _stream(gateway, key, {"fail_after_chunks": 1, "first_event_ms": 300, "output_tokens": 10})
    rid = r.headers["x-request-id"]
    assert r.status_code == 200 and broke and b"[DONE]" not in got
    [event] = [e for e in got.split(b"\n\n") if e.startswith(b"data:")]
    assert json.loads(event[6:])["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    served = gateway.sim_record(rid)
    assert served is not None and (served["events_sent"], served["completed"]) == (1, False)
    row = _row(gateway, rid)
    assert (row["status"], row["error_code"]) == (200, "upstream_unavailable"), row
    assert _free(row), row
    assert gateway.slots_held(org) == 0


def test_a_client_that_leaves_a_stream_before_its_first_chunk_is_billed_the_estimated_input(
        gateway: Gateway) -> None:
    """The request reached the model server, the client got the 200 and left before any event:
    docs/interface.md's client-disconnect rule, logged 499."""
    org, _, key = gateway.new_org(10_000_000)
    body = {"model": "polish-pro", "messages": MSGS, "stream": True,
            "sim": {"first_event_ms": 3000, "output_tokens": 10}}
    with httpx.stream("POST", gateway.v1 + CHAT, json=body, headers=_h(key), timeout=30) as s:
        assert s.status_code == 200
        rid = s.headers["x-request-id"]
    left = time.monotonic()  # the client closed the stream on leaving the block, having read nothing
    wait_for(lambda: gateway.slots_held(org) == 0, 5)
    freed = time.monotonic() - left
    row = _row(gateway, rid)
    assert (row["status"], row["error_code"], row["estimated"]) == (499, None, True), row
    assert (row["prompt_tokens"], row["completion_tokens"]) == (EST_PROMPT, 0), row
    assert row["cost_micro_pln"] == _ceil(EST_PROMPT * 1_500_000, 10**6)
    served = gateway.sim_record(rid)
    assert served is not None and (served["events_sent"], served["completed"]) == (0, False)
    assert freed < 1.0, f"the slot was held {freed:.2f} s after the client left"


@pytest.mark.parametrize("sim", [
    pytest.param({"stream": True, "sim": {"fail_after_chunks": 0}}, id="stream-broken-at-once"),
    pytest.param({"stream": True, "sim": {"fail_after_chunks": 3, "itl_ms": 5}}, id="stream-broken-after-content"),
    pytest.param({"sim": {"fail_after_chunks": 0}}, id="json-broken"),
    pytest.param({"stream": True, "sim": {"output_tokens": 3}}, id="stream-complete"),
])
def test_the_slot_is_free_within_a_second_of_any_replys_end(gateway: Gateway, sim: dict[str, object]) -> None:
    """Concurrency limit 1: a reply ends however it ends (the client got Envoy's 502, a stream without
    [DONE], or all of it); the next request, sent within a second, is admitted."""
    org, _, key = gateway.new_org(10_000_000)
    gateway.admin(lambda a: a.set_limits(org, None, 1))
    body = {"model": "polish-pro", "messages": MSGS, **sim}
    for _ in range(3):
        with httpx.stream("POST", gateway.v1 + CHAT, json=body, headers=_h(key), timeout=30) as s:
            with_status = s.status_code
            try:
                s.read()
            except httpx.RemoteProtocolError:
                pass
        ended = time.monotonic()
        assert with_status in (200, 502), with_status
        wait_for(lambda: gateway.slots_held(org) == 0, 1.0)
        freed = time.monotonic() - ended
        assert freed < 1.0, f"the slot was held {freed:.2f} s after the reply ended"
        r = httpx.post(gateway.v1 + CHAT, headers=_h(key),
                       json={"model": "polish-pro", "messages": MSGS, "sim": {"output_tokens": 2}})
        assert r.status_code == 200, r.text
        _row(gateway, r.headers["x-request-id"])
    wait_for(lambda: len(gateway.sql("SELECT 1 FROM usage_records WHERE org_id = $1", org)) == 6, 15)


def _zrems(gateway: Gateway) -> int:
    """ZREM calls Redis ran so far (a finish's script runs one; an early slot release is one more)."""
    stats = gateway.redis(lambda r: r.info("commandstats"))
    return int(stats.get("cmdstat_zrem", {}).get("calls", 0))


def test_only_a_stream_that_did_not_reach_its_end_has_its_slot_released_ahead_of_its_record(
        gateway: Gateway) -> None:
    """A complete stream is finished by the stream watch at once (one Redis script: slot, debit, record);
    a broken one gives its slot back when Envoy ends it, its record following when the watch's call ends."""
    org, _, key = gateway.new_org(10_000_000)
    for sim, releases in (({"output_tokens": 3}, 0), ({"fail_after_chunks": 3, "itl_ms": 5}, 1)):
        before = _zrems(gateway)
        r, _, _ = _stream(gateway, key, sim)
        _row(gateway, r.headers["x-request-id"])
        assert gateway.slots_held(org) == 0
        time.sleep(0.3)  # nothing more comes
        assert _zrems(gateway) - before == 1 + releases, (sim, _zrems(gateway) - before)


@pytest.mark.parametrize("where", ["first", "middle"])
def test_a_json_replys_usage_is_billed_whatever_the_order_of_its_members(gateway: Gateway, where: str) -> None:
    """``prompt_tokens_details`` before the counts, or between them (as some servers order the usage
    object): the reported usage is billed, not estimated, and the client sees the same usage."""
    org, _, key = gateway.new_org(10_000_000)
    r = httpx.post(gateway.v1 + CHAT, headers=_h(key),
                   json={"model": "polish-pro", "messages": MSGS, "sim": {"output_tokens": 9, "usage_details": where}})
    assert r.status_code == 200, r.text
    rid = r.headers["x-request-id"]
    served = gateway.sim_record(rid)
    assert served is not None and served["completion_tokens"] == 9
    usage = r.json()["usage"]
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == (served["prompt_tokens"], 9)
    assert usage["prompt_tokens_details"] == {"cached_tokens": 0}
    row = _row(gateway, rid)
    assert (row["status"], row["estimated"], row["prompt_tokens"], row["completion_tokens"]) == (
        200, False, served["prompt_tokens"], 9), row
    assert row["cost_micro_pln"] == _ceil(served["prompt_tokens"] * 1_500_000, 10**6) + _ceil(9 * 3_000_000, 10**6)
    assert gateway.slots_held(org) == 0


def test_an_alias_whose_first_price_lies_ahead_is_not_offered_before_it(gateway: Gateway) -> None:
    """A price is applied from its effective time on, never before: an alias added to the catalog with
    its first price ahead has no price in force, so it is not offered until then (404 model_not_found,
    not listed), and nothing is billed at a price not yet in force."""
    org, _, key = gateway.new_org(1_000_000)
    path = Path(gateway.stack.s.catalog)
    original = path.read_text()
    doc = yaml.safe_load(original)
    marker = doc["aliases"]["empty-alias"]["prices"][0]["output_micro_pln_per_1m"]
    doc["aliases"]["later-alias"] = {
        "capabilities": ["chat"], "context_length": 8192, "max_output_tokens": 2048,
        "upstreams": [{"model": "up-fast"}],
        "prices": [{"effective": "2099-01-01", "input_micro_pln_per_1m": 7, "output_micro_pln_per_1m": 9}]}
    doc["aliases"]["empty-alias"]["prices"][0]["output_micro_pln_per_1m"] = marker + 1  # tells when it is in force

    def models() -> httpx.Response:
        return httpx.get(gateway.v1 + "/models", headers=_h(key), timeout=10)

    def marked(m: int) -> bool:
        return any(a["id"] == "empty-alias" and a["pricing"]["output_micro_pln_per_1m"] == m
                   for a in models().json()["data"])
    try:
        path.write_text(yaml.safe_dump(doc))
        wait_for(lambda: marked(marker + 1), 10)
        assert "later-alias" not in [a["id"] for a in models().json()["data"]]
        assert_error(httpx.get(gateway.v1 + "/models/later-alias", headers=_h(key), timeout=10),
                     404, "model_not_found", "invalid_request_error", "model")
        r = httpx.post(gateway.v1 + CHAT, headers=_h(key), timeout=10,
                       json={"model": "later-alias", "messages": MSGS, "sim": {"output_tokens": 2}})
        assert_error(r, 404, "model_not_found", "invalid_request_error", "model")
        row = _row(gateway, r.headers["x-request-id"])  # a refusal: listed at cost 0
        assert (row["status"], row["error_code"], row["cost_micro_pln"]) == (404, "model_not_found", 0), row
        assert gateway.sim_record(r.headers["x-request-id"]) is None  # no model server saw it
    finally:
        path.write_text(original)
        wait_for(lambda: marked(marker), 10)
