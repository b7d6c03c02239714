"""Streams the model server breaks, through the real stack (issue 18): reconciled per request id, the
events the client received, what the simulator sent, the tokens billed, the estimated flag and the
logged status.  The client pays for nothing it did not receive, and a failure before anything reached
it (an error status, or an empty broken stream) costs nothing."""
from __future__ import annotations

import json

import httpx
import pytest

from conftest import Gateway, wait_for
from extproc.cost import estimate_chat_prompt

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


def _settled(gateway: Gateway, org: str, key: str, rid: str) -> dict:
    """The usage record of ``rid`` (every request is listed, billed or not), read once a later request of
    the same key has been recorded (records are written in order: no fixed sleep)."""
    r = httpx.post(gateway.v1 + "/chat/completions", headers=_h(key),
                   json={"model": "polish-pro", "messages": MSGS, "sim": {"output_tokens": 1}})
    assert r.status_code == 200
    marker = r.headers["x-request-id"]
    wait_for(lambda: gateway.sql("SELECT 1 FROM usage_records WHERE request_id = $1", marker), 5)
    [row] = gateway.sql("SELECT * FROM usage_records WHERE request_id = $1", rid)
    return dict(row)


def _free(row: dict) -> bool:
    """Listed, and billed nothing."""
    return (row["prompt_tokens"], row["completion_tokens"], row["cost_micro_pln"], row["estimated"]) == (0, 0, 0, False)


@pytest.mark.parametrize("gap_ms", [0, 5, 20, 100])
@pytest.mark.parametrize("sent", [0, 1, 2, 4])
def test_a_broken_stream_is_billed_what_reached_the_client(gateway: Gateway, gap_ms: int, sent: int) -> None:
    org, _, key = gateway.new_org(10_000_000)
    r, got, broke = _stream(gateway, key, {"fail_after_chunks": sent, "itl_ms": gap_ms, "output_tokens": 10})
    rid = r.headers["x-request-id"]
    served = gateway.sim_record(rid)
    assert served is not None and served["completed"] is False and served["events_sent"] == sent
    events = [e for e in got.split(b"\n\n") if e.startswith(b"data:")]
    content = [e for e in events if b'"content":"' in e and b'"content":""' not in e]
    row = _settled(gateway, org, key, rid)
    if r.status_code != 200:
        # too early for the reply's headers to have gone out: Envoy's 502, and nothing billed
        assert r.status_code == 502 and json.loads(got)["error"]["code"] == "upstream_unavailable"
        assert _free(row) and (row["status"], row["error_code"]) == (502, "upstream_unavailable"), row
        return
    assert broke and b"[DONE]" not in got and b'"error"' not in got
    # Envoy drops the piece of the reply the ext_proc is still answering when the model server resets
    # (README, Billing): the client gets every event before it (events apart, with a gap, come in
    # pieces apart; with none, one piece may hold several)
    assert len(events) <= sent
    if gap_ms:
        assert len(events) >= sent - 1
    if _free(row):
        assert row["status"] == 200  # what the client got: a 200 that broke
        # nothing billed: nothing reached the client, or only what came in the reply's last piece (the
        # gateway cannot tell whether that one got through, and does not bill it)
        assert not events or gap_ms == 0 or len(events) == 1
        return
    assert (row["status"], row["estimated"]) == (200, True)
    billed = row["completion_tokens"]
    # never billed for an event the client did not get; the last event is not billed when the gateway
    # cannot tell whether it got through (events apart come in chunks apart)
    assert billed <= len(content)
    if gap_ms:
        assert billed >= len(content) - 1
    assert row["prompt_tokens"] == EST_PROMPT
    assert row["cost_micro_pln"] == _ceil(EST_PROMPT * 1_500_000, 10**6) + _ceil(billed * 3_000_000, 10**6)
