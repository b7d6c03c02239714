"""The SSE counting rule as one table: what billing reads of a model server's event stream, written
once and run against both readers of the same bytes, the ext_proc's meter (core/sse.py) and Envoy's
relay (envoy/sse_relay.lua, whose usage chunk of its own tells a client the billed estimate):
tests/test_sse_cases.py.

The rule (docs/billing.md, "Billing on failure"; docs/interface.md, section 4's streaming response rules):
- only whole events count: one the stream never ends with a blank line reached no client;
- an event counts as output when it has a "content" member whose value is a string that is not empty
  (one output token per such member: the estimate of a stream without usage); text that only quotes
  the member, a null or an empty content, a role or a tool call alone do not count;
- the usage is a "usage" object with a whole, non-negative prompt_tokens and a whole, non-negative
  completion_tokens (null or absent: 0); any other usage is no usage; the last one reported wins;
- any SSE framing: lines end with LF, CRLF or CR, comments and other fields are skipped, data over
  several lines is one event.
"""
from __future__ import annotations

import json
from dataclasses import dataclass


@dataclass(frozen=True)
class Case:
    name: str
    stream: bytes
    content_events: int  # events with a content piece, as counted (the meter: only where no usage was reported)
    usage: tuple[int, int] | None  # (prompt, completion) as reported, None: no usage reported


def event(doc: object, *, spaced: bool = False) -> bytes:
    sep = (", ", ": ") if spaced else (",", ":")
    return b"data: " + json.dumps(doc, separators=sep, ensure_ascii=False).encode() + b"\n\n"


def chunk(*choices: dict[str, object], **extra: object) -> dict[str, object]:
    return {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "up-pro",
            "choices": list(choices), **extra}


def delta(d: dict[str, object], finish: str | None = None, index: int = 0) -> dict[str, object]:
    return {"index": index, "delta": d, "logprobs": None, "finish_reason": finish}


DONE = b"data: [DONE]\n\n"
ROLE = event(chunk(delta({"role": "assistant", "content": ""})))
WORDS = b"".join(event(chunk(delta({"content": w}))) for w in ("Ala", " ma", " kota"))
FINISH = event(chunk(delta({}, "stop")))
USAGE = {"prompt_tokens": 11, "completion_tokens": 3, "total_tokens": 14}


def usage_event(usage: object) -> bytes:
    return event(chunk(usage=usage))


def _framed(stream: bytes, eol: bytes, comments: bool = False, multiline: bool = False) -> bytes:
    out = []
    for e in stream.split(b"\n\n"):
        if not e:
            continue
        lines = [e]
        if multiline and e != b"data: [DONE]":
            body = e[len(b"data: "):]
            cut = body.index(b',"choices"') + 1  # after a comma: the lines joined by LF are the same JSON
            lines = [b"data: " + body[:cut], b"data:" + body[cut:]]
        if comments:
            out.append(b": keep-alive" + eol + eol)
            lines = [b": ping", b"event: message", *lines]
        out.append(eol.join(lines) + eol + eol)
    return b"".join(out)


VLLM = ROLE + WORDS + FINISH + usage_event(USAGE) + DONE

CASES = [
    # what vLLM and the simulator write
    Case("vllm", VLLM, 3, (11, 3)),
    Case("vllm without usage", ROLE + WORDS + FINISH + DONE, 3, None),
    # what counts as output
    Case("empty and null contents", ROLE + event(chunk(delta({"content": None}))) + WORDS + FINISH + DONE, 3, None),
    Case("a role alone", event(chunk(delta({"role": "assistant"}))) + WORDS + DONE, 3, None),
    Case("tool calls alone", ROLE + event(chunk(delta({"tool_calls": [{"index": 0, "function": {
        "arguments": "{\"content\": \"x\"}"}}]}))) + FINISH + DONE, 0, None),
    Case("text quoting the member", event(chunk(delta({"content": '"content":"x"'}))) + DONE, 1, None),
    Case("an escaped quote first", event(chunk(delta({"content": '"'}))) + DONE, 1, None),
    Case("two choices in one event", event(chunk(delta({"content": "a"}), delta({"content": "b"}, index=1)))
         + DONE, 2, None),
    Case("spaced JSON", b"".join(event(chunk(delta({"content": w})), spaced=True) for w in ("a", "", "b"))
         + DONE, 2, None),
    # only whole events
    Case("an event the stream never ended", WORDS + b'data: {"choices":[{"delta":{"content":"x"}}]}', 3, None),
    Case("usage in an unended event", WORDS + usage_event(USAGE)[:-2], 3, None),
    # the usage, whatever chunk carries it
    Case("usage on the finish chunk (TGI)", ROLE + WORDS
         + event(chunk(delta({"role": "assistant", "content": ""}, "stop"), usage=USAGE)) + DONE, 3, (11, 3)),
    Case("null usage on every chunk (SGLang)", event(chunk(delta({"content": "a"}), usage=None))
         + event(chunk(delta({}, "stop"), usage=None), spaced=True) + usage_event(USAGE) + DONE, 1, (11, 3)),
    Case("running usage: the last wins", event(chunk(delta({"content": "a"}), usage={"prompt_tokens": 11,
         "completion_tokens": 1})) + usage_event({"prompt_tokens": 11, "completion_tokens": 2}) + DONE, 1, (11, 2)),
    Case("spaced usage", WORDS + usage_event(USAGE).replace(b'":', b'": ') + DONE, 3, (11, 3)),
    Case("completion_tokens null", WORDS + usage_event({"prompt_tokens": 7, "completion_tokens": None}) + DONE,
         3, (7, 0)),
    Case("completion_tokens absent", WORDS + usage_event({"prompt_tokens": 7}) + DONE, 3, (7, 0)),
    Case("no prompt_tokens: no usage", WORDS + usage_event({"completion_tokens": 3}) + DONE, 3, None),
    Case("a negative count: no usage", WORDS + usage_event({"prompt_tokens": -1, "completion_tokens": 3}) + DONE,
         3, None),
    Case("a fraction: no usage", WORDS + usage_event({"prompt_tokens": 1.5, "completion_tokens": 3}) + DONE,
         3, None),
    Case("a string count: no usage", WORDS + usage_event({"prompt_tokens": "11", "completion_tokens": 3}) + DONE,
         3, None),
    Case("a boolean count: no usage", WORDS + usage_event({"prompt_tokens": True, "completion_tokens": 3}) + DONE,
         3, None),
    Case("completion_tokens false: no usage", WORDS + usage_event({"prompt_tokens": 7, "completion_tokens": False})
         + DONE, 3, None),
    Case("usage not an object", WORDS + usage_event([11, 3]) + DONE, 3, None),
    # any framing
    *[Case(f"vllm, {name}", _framed(VLLM, eol, comments, multiline), 3, (11, 3))
      for name, eol, comments, multiline in [("CRLF", b"\r\n", False, False), ("CR", b"\r", False, False),
                                             ("comments", b"\n", True, False),
                                             ("data over two lines", b"\n", False, True),
                                             ("CRLF, comments, two lines", b"\r\n", True, True)]],
    Case("without usage, CR, comments, two lines", _framed(ROLE + WORDS + FINISH + DONE, b"\r", True, True), 3, None),
]
