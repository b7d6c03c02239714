"""The SSE counting rule's one table (tests/sse_cases.py) run against both readers of a streamed reply:
the ext_proc's meter (core/sse.py), which bills it, and Envoy's relay (envoy/sse_relay.lua, in
LuaJIT), whose usage chunk of its own tells a client that asked for usage what the request is billed.
Each case is fed whole, a byte at a time and in pieces of 7 bytes."""
from __future__ import annotations

import json

import pytest

from core.sse import StreamMeter
from tests.lua_relay import Relay
from tests.sse_cases import CASES, Case

STEPS = [1, 7, 1 << 20]
PROMPT_ESTIMATE = 5


def _pieces(data: bytes, step: int) -> list[bytes]:
    return [data[i:i + step] for i in range(0, len(data), step)]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_the_meter(case: Case) -> None:
    for step in STEPS:
        meter = StreamMeter()
        for piece in _pieces(case.stream, step):
            meter.feed(piece)
        assert meter.usage == case.usage, step
        if case.usage is None:  # (the events with content are counted only while no usage was reported)
            assert meter.content_events == case.content_events, step


def _usage_chunks(out: bytes) -> list[tuple[int, int]]:
    """The (prompt, completion) of each chunk the client gets with a usage object."""
    docs = [json.loads(e[6:]) for e in out.split(b"\n\n") if e.startswith(b"data: {")]
    return [(d["usage"]["prompt_tokens"], d["usage"].get("completion_tokens") or 0) for d in docs
            if isinstance(d.get("usage"), dict)]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_the_relay(case: Case) -> None:
    """The client asked for usage: it gets the reported usage, or (where the model server reported none)
    the billed estimate, the estimated input and the relay's own count of events with content, in one
    chunk, the last before [DONE]; a stream without [DONE] gets none of ours."""
    done = b"[DONE]" in case.stream
    for step in STEPS:
        relay = Relay("up-pro", "polish-pro", show_usage=True, prompt_estimate=PROMPT_ESTIMATE)
        out = b"".join(relay.feed(piece) for piece in _pieces(case.stream, step)) + relay.end()
        assert out.endswith(b"data: [DONE]\n\n") is done, (step, out[-80:])
        if case.usage is None:
            assert relay.lua_content_events == case.content_events, step
            assert _usage_chunks(out) == ([(PROMPT_ESTIMATE, case.content_events)] if done else []), step
        else:
            assert _usage_chunks(out) == [case.usage], step
            assert out.index(b'"usage":') > out.rindex(b'"choices":[{')  # (the last chunk before [DONE])
