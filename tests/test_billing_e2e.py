"""Billing through the real stack: the cost rule, the ledger, and billing on failure (docs/interface.md section 4)."""
from __future__ import annotations

import json

import httpx
import pytest

from conftest import Gateway, assert_error, usage_caught_up, wait_for
from core.cost import estimate_chat_prompt, estimate_text

MSGS = [{"role": "user", "content": "Ile kosztuje bilet do Krakowa?"}]
EST_PROMPT = estimate_chat_prompt(MSGS)


@pytest.fixture
def fresh(gateway: Gateway) -> tuple[str, str, str]:
    return gateway.new_org(10_000_000)


def _h(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _records(gateway: Gateway, org: str) -> list[dict]:
    return gateway.sql("SELECT * FROM usage_records WHERE org_id = $1 ORDER BY started_at", org)


def _record(gateway: Gateway, rid: str) -> dict:
    return wait_for(lambda: gateway.sql("SELECT * FROM usage_records WHERE request_id = $1", rid), 5)[0]


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def _ledger(gateway: Gateway, org: str) -> int:
    return int(gateway.sql("SELECT COALESCE(SUM(amount_micro_pln),0) AS s FROM ledger WHERE org_id=$1", org)[0]["s"])


def test_balance_is_the_sum_of_the_ledger(gateway: Gateway, fresh: tuple[str, str, str]) -> None:
    org, _, key = fresh
    for i in range(3):
        r = httpx.post(gateway.v1 + "/chat/completions", headers=_h(key),
                       json={"model": "advanced", "messages": MSGS, "sim": {"output_tokens": 7 + i}})
        assert r.status_code == 200
        _record(gateway, r.headers["x-request-id"])
    rows = _records(gateway, org)
    assert len(rows) == 3
    for row in rows:  # advanced: 4 / 8 PLN per 1M tokens
        assert row["cost_micro_pln"] == _ceil(row["prompt_tokens"] * 4_000_000, 10**6) + _ceil(
            row["completion_tokens"] * 8_000_000, 10**6)
        assert (row["input_price"], row["output_price"]) == (4_000_000, 8_000_000)
    spent = sum(r["cost_micro_pln"] for r in rows)
    assert _ledger(gateway, org) == 10_000_000 - spent
    bal = gateway.admin(lambda a: a.balance(org))
    assert bal["balance_micro_pln"] == bal["ledger_micro_pln"] == 10_000_000 - spent


def test_broken_stream_billed_estimated(gateway: Gateway, fresh: tuple[str, str, str]) -> None:
    org, _, key = fresh
    body = {"model": "polish-pro", "messages": MSGS, "stream": True,
            "sim": {"fail_after_chunks": 4, "itl_ms": 30, "output_tokens": 10}}
    got = b""
    with httpx.stream("POST", gateway.v1 + "/chat/completions", json=body, headers=_h(key)) as s:
        assert s.status_code == 200
        rid = s.headers["x-request-id"]
        with pytest.raises(httpx.RemoteProtocolError):
            for chunk in s.iter_bytes():
                got += chunk
    assert b"[DONE]" not in got and b'"error"' not in got
    row = _record(gateway, rid)
    served = gateway.sim_record(rid)
    assert served is not None and served["completed"] is False
    assert (row["estimated"], row["status"]) == (True, 200)
    # role chunk + 3 pieces sent; billed: the pieces that reached the client, but for the last one when
    # the gateway cannot tell whether it did (tests/test_breaks_e2e.py)
    pieces = got.count(b'"content":"') - got.count(b'"content":""')
    assert row["prompt_tokens"] == EST_PROMPT and pieces - 1 <= row["completion_tokens"] <= pieces
    assert row["cost_micro_pln"] == _ceil(EST_PROMPT * 1_500_000, 10**6) + _ceil(
        row["completion_tokens"] * 3_000_000, 10**6)


def test_stream_without_usage_from_model_server_is_estimated(gateway: Gateway, fresh: tuple[str, str, str]) -> None:
    org, _, key = fresh
    r = httpx.post(gateway.v1 + "/chat/completions", headers=_h(key),
                   json={"model": "polish-pro", "messages": MSGS, "stream": True,
                         "stream_options": {"include_usage": True},
                         "sim": {"no_usage": True, "output_tokens": 5}})
    assert r.status_code == 200 and r.text.rstrip().endswith("data: [DONE]")
    row = _record(gateway, r.headers["x-request-id"])
    assert (row["estimated"], row["prompt_tokens"], row["completion_tokens"]) == (True, EST_PROMPT, 5)
    # The interface's streaming rule 3: the client asked for usage, so the last chunk before [DONE] carries it, and
    # it is what the request is billed (the model server reported none)
    events = [e[len("data: "):] for e in r.text.split("\n\n") if e]
    assert events[-1] == "[DONE]"
    last = json.loads(events[-2])
    assert (last["object"], last["model"], last["choices"]) == ("chat.completion.chunk", "polish-pro", [])
    assert last["usage"] == {"prompt_tokens": EST_PROMPT, "completion_tokens": 5, "total_tokens": EST_PROMPT + 5,
                             "cost_micro_pln": row["cost_micro_pln"], "estimated": True}
    first = json.loads(events[0])
    assert (last["id"], last["created"]) == (first["id"], first["created"])
    assert sum(1 for e in events[:-1] if "usage" in json.loads(e)) == 1
    # not asked: no usage chunk
    r2 = httpx.post(gateway.v1 + "/chat/completions", headers=_h(key),
                    json={"model": "polish-pro", "messages": MSGS, "stream": True,
                          "sim": {"no_usage": True, "output_tokens": 5}})
    assert r2.status_code == 200 and r2.text.rstrip().endswith("data: [DONE]") and '"usage"' not in r2.text


def test_model_server_error_bills_nothing(gateway: Gateway, fresh: tuple[str, str, str]) -> None:
    org, _, key = fresh
    r = httpx.post(gateway.v1 + "/chat/completions", headers=_h(key),
                   json={"model": "polish-pro", "messages": MSGS, "sim": {"status": 503}})
    assert_error(r, 502, "upstream_unavailable", "upstream_error")
    r2 = httpx.post(gateway.v1 + "/chat/completions", headers=_h(key),
                    json={"model": "dead-alias", "messages": MSGS})
    assert_error(r2, 502, "upstream_unavailable", "upstream_error")
    later = usage_caught_up(gateway, key)  # the writer has caught up past both failed requests
    wait_for(lambda: gateway.usage_drained(org))  # and nothing of the organisation is in flight or queued
    rows = {r["request_id"]: r for r in _records(gateway, org)}
    assert [rid for rid, row in rows.items() if row["cost_micro_pln"] > 0] == [later["request_id"]]
    for failed in (r, r2):  # listed as the client saw them, at no cost
        row = rows[failed.headers["x-request-id"]]
        assert (row["status"], row["error_code"], row["prompt_tokens"], row["completion_tokens"],
                row["cost_micro_pln"], row["estimated"]) == (502, "upstream_unavailable", 0, 0, 0, False)
    assert _ledger(gateway, org) == 10_000_000 - later["cost_micro_pln"]


def test_non_streaming_reply_broken_after_start_bills_estimated_input(gateway: Gateway, fresh: tuple[str, str, str]) -> None:
    org, _, key = fresh
    r = httpx.post(gateway.v1 + "/chat/completions", headers=_h(key),
                   json={"model": "polish-pro", "messages": MSGS, "sim": {"fail_after_chunks": 1}})
    assert_error(r, 502, "upstream_unavailable", "upstream_error")
    row = _record(gateway, r.headers["x-request-id"])
    assert (row["estimated"], row["prompt_tokens"], row["completion_tokens"]) == (True, EST_PROMPT, 0)
    assert row["cost_micro_pln"] == _ceil(EST_PROMPT * 1_500_000, 10**6)
    assert row["status"] == 502  # what the client got


def test_client_that_gives_up_is_billed_estimated_input(gateway: Gateway, fresh: tuple[str, str, str]) -> None:
    org, _, key = fresh
    with pytest.raises(httpx.TimeoutException):
        httpx.post(gateway.v1 + "/chat/completions", headers=_h(key), timeout=0.5,
                   json={"model": "polish-pro", "messages": MSGS, "sim": {"ttft_ms": 1500}})
    rows = wait_for(lambda: _records(gateway, org), 5)
    assert len(rows) == 1
    row = rows[0]
    assert (row["estimated"], row["prompt_tokens"], row["completion_tokens"]) == (True, EST_PROMPT, 0)
    assert row["status"] == 499  # the client's disconnect, recorded as such
    assert gateway.sim_record(row["request_id"]) is not None  # it did reach the model server


def test_client_that_leaves_a_stream_is_billed_estimated_input_only(gateway: Gateway, fresh: tuple[str, str, str]) -> None:
    """The interface: "A client disconnect at any point after the request reached the model server is billed the
    estimated input tokens" -- not the output relayed before it left."""
    org, _, key = fresh
    # the model server pauses half-way; the client's read timeout gives up during the pause
    body = {"model": "polish-pro", "messages": MSGS, "stream": True, "sim": {"stall_ms": 3000, "output_tokens": 12}}
    got = b""
    with httpx.stream("POST", gateway.v1 + "/chat/completions", json=body, headers=_h(key), timeout=0.5) as s:
        rid = s.headers["x-request-id"]
        with pytest.raises(httpx.ReadTimeout):
            for chunk in s.iter_bytes():
                got += chunk
    assert got.count(b'"content":"') >= 4  # output relayed before the client left
    row = _record(gateway, rid)
    assert (row["estimated"], row["prompt_tokens"], row["completion_tokens"]) == (True, EST_PROMPT, 0)
    assert row["cost_micro_pln"] == _ceil(EST_PROMPT * 1_500_000, 10**6)
    assert row["status"] == 499
    served = gateway.sim_record(rid)
    assert served is not None and served["completed"] is False


def test_complete_reply_without_usage_has_its_output_estimated(gateway: Gateway, fresh: tuple[str, str, str]) -> None:
    """A complete non-streaming reply that reports no usage: input and output estimated (docs/billing.md)."""
    org, _, key = fresh
    r = httpx.post(gateway.v1 + "/chat/completions", headers=_h(key),
                   json={"model": "polish-pro", "messages": MSGS, "sim": {"no_usage": True, "output_tokens": 9}})
    assert r.status_code == 200
    text = r.json()["choices"][0]["message"]["content"]
    out = estimate_text(text)
    assert out > 0
    # the client is shown the usage it is billed (docs/interface.md section 2: a reply has ``usage``)
    row = _record(gateway, r.headers["x-request-id"])
    assert r.json()["usage"] == {"prompt_tokens": EST_PROMPT, "completion_tokens": out,
                                 "total_tokens": EST_PROMPT + out, "cost_micro_pln": row["cost_micro_pln"],
                                 "estimated": True}
    assert (row["estimated"], row["status"], row["prompt_tokens"], row["completion_tokens"]) == (
        True, 200, EST_PROMPT, out)
    assert row["cost_micro_pln"] == _ceil(EST_PROMPT * 1_500_000, 10**6) + _ceil(out * 3_000_000, 10**6)


def test_embeddings_without_usage_show_and_bill_the_estimated_input(gateway: Gateway,
                                                                    fresh: tuple[str, str, str]) -> None:
    org, _, key = fresh
    inputs = ["abcdefgh", "xyz"]  # 8 and 3 bytes: 2 + 1 tokens at 4 bytes a token, rounded up
    r = httpx.post(gateway.v1 + "/embeddings", headers=_h(key),
                   json={"model": "embed", "input": inputs, "sim": {"no_usage": True}})
    assert r.status_code == 200, r.text
    doc = r.json()
    row = _record(gateway, r.headers["x-request-id"])
    assert doc["usage"] == {"prompt_tokens": 3, "total_tokens": 3, "cost_micro_pln": row["cost_micro_pln"],
                            "estimated": True} and doc["model"] == "embed"
    assert len(doc["data"]) == 2
    assert (row["estimated"], row["status"], row["prompt_tokens"], row["completion_tokens"]) == (True, 200, 3, 0)
    assert row["cost_micro_pln"] == _ceil(3 * 200_000, 10**6)


def test_stream_broken_before_any_output_bills_nothing(gateway: Gateway, fresh: tuple[str, str, str]) -> None:
    """The interface: "If the model server produced no output before the failure, nothing is billed."  The client
    gets Envoy's 502 or an empty broken stream, and the balance is untouched."""
    org, _, key = fresh
    for _ in range(3):
        body = {"model": "polish-pro", "messages": MSGS, "stream": True, "sim": {"fail_after_chunks": 0}}
        with httpx.stream("POST", gateway.v1 + "/chat/completions", json=body, headers=_h(key)) as s:
            try:
                got = s.read()
            except httpx.RemoteProtocolError:
                got = b""
            assert s.status_code in (200, 502) and b"data:" not in got
    marker = httpx.post(gateway.v1 + "/chat/completions", headers=_h(key),
                        json={"model": "polish-pro", "messages": MSGS, "sim": {"output_tokens": 1}})
    row = _record(gateway, marker.headers["x-request-id"])
    # a broken stream is recorded when Envoy closed the stream watch's call (1 s after the stream ended),
    # or by the ext_proc 5 s after it when the client got Envoy's 502
    rows = wait_for(lambda: (lambda rs: rs if len(rs) == 4 else None)(_records(gateway, org)), 15)
    assert [r["request_id"] for r in rows if r["cost_micro_pln"] > 0] == [row["request_id"]]
    broken = [r for r in rows if r["request_id"] != row["request_id"]]  # logged as the client saw them
    assert len(broken) == 3 and all(r["status"] in (200, 502) and (r["prompt_tokens"], r["completion_tokens"])
                                    == (0, 0) for r in broken), broken
    assert _ledger(gateway, org) == 10_000_000 - row["cost_micro_pln"]
