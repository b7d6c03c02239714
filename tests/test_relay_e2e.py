"""The stream relay's common case, counted through the real Envoy: the simulator's stream (vLLM's shape:
whole events, one "data: " line each, LF only) is relayed chunk by chunk without reframing, as Envoy's
access log says (``relay_chunks``, ``relay_common``: envoy/sse_relay.lua); a stream in another framing
takes the general path and still reaches the client whole.  A guard that is not a timing test: a change
that sends vLLM's stream down the general path fails here."""
from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from conftest import Gateway, wait_for

MSGS = [{"role": "user", "content": "Opowiedz o Wiśle."}]
TOKENS = 5


def _stream(gateway: Gateway, key: str, usage: bool, sim: dict[str, Any]) -> tuple[str, list[Any]]:
    body: dict[str, Any] = {"model": "polish-fast", "messages": MSGS, "stream": True,
                            "sim": {"output_tokens": TOKENS, "itl_ms": 20, **sim}}
    if usage:
        body["stream_options"] = {"include_usage": True}
    with httpx.stream("POST", gateway.v1 + "/chat/completions", json=body,
                      headers={"Authorization": f"Bearer {key}"}, timeout=30) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        raw = r.read()
        rid = r.headers["x-request-id"]
    assert raw.endswith(b"\n\n") and b"\r" not in raw
    events = raw[:-2].split(b"\n\n")
    assert all(e.startswith(b"data: ") and b"\n" not in e for e in events), raw[:300]
    return rid, [json.loads(e[6:]) if e != b"data: [DONE]" else "[DONE]" for e in events]


def _logged(gateway: Gateway, rid: str) -> dict[str, Any]:
    """The request's line of Envoy's access log (written about once a second)."""
    access = gateway.stack.state / "logs" / "envoy-access.log"
    wait_for(lambda: rid.encode() in access.read_bytes(), timeout=15)
    line: dict[str, Any] = next(d for d in map(json.loads, access.read_text().splitlines())
                                if d["request_id"] == rid)
    return line


def _check_events(events: list[Any], usage: bool) -> None:
    """The streaming rules (docs/interface.md, section 4), as the client reads them: the alias in every
    chunk, the role chunk first, the closing chunk's empty delta, the usage chunk last before [DONE] only
    where it was asked for."""
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all(c["model"] == "polish-fast" for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = [c["choices"][0]["delta"]["content"] for c in chunks[1:] if c["choices"]
            and c["choices"][0]["delta"].get("content")]
    assert len(text) >= 1
    closing = [c["choices"][0] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert len(closing) == 1 and closing[0]["delta"] == {}
    carrying = [c for c in chunks if "usage" in c]
    if usage:
        assert carrying == [chunks[-1]] and chunks[-1]["choices"] == []
        assert chunks[-1]["usage"]["completion_tokens"] == TOKENS and chunks[-1]["usage"]["prompt_tokens"] > 0
    else:
        assert carrying == []


@pytest.mark.parametrize("usage", [True, False])
def test_the_simulators_stream_takes_the_common_case_chunk_by_chunk(gateway: Gateway, usage: bool) -> None:
    _, _, key = gateway.new_org(10_000_000)
    rid, events = _stream(gateway, key, usage, {})
    _check_events(events, usage)
    line = _logged(gateway, rid)
    # one chunk per event at 20 ms apart (a loaded machine may join a few): all by the common case
    assert line["status"] == 200 and line["route"] == "chat"
    assert line["relay_chunks"] >= 3 and line["relay_common"] == line["relay_chunks"], line


@pytest.mark.parametrize("sim", [{"framing": "crlf"}, {"comments": True}, {"write_bytes": 7}])
def test_another_framing_takes_the_general_path_and_arrives_whole(gateway: Gateway, sim: dict[str, Any]) -> None:
    """CRLF line ends, comments, events cut into pieces: none is the common case, each is relayed as
    one-data-line events all the same (tests/test_sse.py holds every framing at every cut)."""
    _, _, key = gateway.new_org(10_000_000)
    rid, events = _stream(gateway, key, True, sim)
    _check_events(events, True)
    line = _logged(gateway, rid)
    assert line["status"] == 200 and line["relay_chunks"] >= 3, line
    assert line["relay_common"] < line["relay_chunks"], line
    if "framing" in sim or "comments" in sim:  # every chunk: CRs, or comments to leave out
        assert line["relay_common"] == 0, line


def test_a_reply_that_is_not_streamed_has_no_relay_counts(gateway: Gateway) -> None:
    _, _, key = gateway.new_org(10_000_000)
    r = httpx.post(gateway.v1 + "/chat/completions", json={"model": "polish-fast", "messages": MSGS},
                   headers={"Authorization": f"Bearer {key}"}, timeout=30)
    assert r.status_code == 200
    line = _logged(gateway, r.headers["x-request-id"])
    assert line["relay_chunks"] is None and line["relay_common"] is None, line
