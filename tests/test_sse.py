"""Unit tests of the stream relay (Envoy's Lua, run in LuaJIT) and the ext_proc's meter of the same bytes:
fed bytes cut anywhere."""
import json

import pytest
from hypothesis import given, settings, strategies as st

from core.cost import Prices, cost_micro_pln
from core.sse import StreamMeter
from tests.lua_relay import PRICES, Relay as StreamRelay, lua_cost


def _event(doc: object) -> bytes:
    return b"data: " + json.dumps(doc, separators=(",", ":")).encode() + b"\n\n"


def _stream(model: str = "up-pro") -> bytes:
    base = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": model}
    parts = [
        _event({**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}),
        _event({**base, "choices": [{"index": 0, "delta": {"content": "Dzień"}, "finish_reason": None}]}),
        _event({**base, "choices": [{"index": 0, "delta": {"content": " dobry \"model\":\"up-pro\""}, "finish_reason": None}]}),
        _event({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}),
        _event({**base, "choices": [], "usage": {"prompt_tokens": 11, "completion_tokens": 2, "total_tokens": 13}}),
        b"data: [DONE]\n\n",
    ]
    return b"".join(parts)


def _relay_all(relay: StreamRelay, data: bytes, step: int) -> bytes:
    out = b""
    for i in range(0, len(data), step):
        out += relay.feed(data[i:i + step])
    return out + relay.end()


def _events(out: bytes) -> list[object]:
    return [json.loads(e[6:]) if e != b"data: [DONE]" else "[DONE]" for e in out.split(b"\n\n") if e]


def test_any_cut_gives_same_events_with_alias_and_usage_kept_when_asked() -> None:
    data = _stream()
    for step in (1, 7, 64, len(data)):
        relay = StreamRelay("up-pro", "polish-pro", show_usage=True)
        events = _events(_relay_all(relay, data, step))
        assert events[-1] == "[DONE]"
        assert all(e["model"] == "polish-pro" for e in events[:-1])  # type: ignore[index]
        assert events[-2]["choices"] == [] and events[-2]["usage"]["prompt_tokens"] == 11  # type: ignore[index]
        # content that merely looks like the model member is left alone (it is escaped in JSON)
        assert events[2]["choices"][0]["delta"]["content"] == ' dobry "model":"up-pro"'  # type: ignore[index]
        assert relay.usage == (11, 2)


def test_usage_chunk_removed_when_not_asked() -> None:
    relay = StreamRelay("up-pro", "polish-pro", show_usage=False)
    events = _events(_relay_all(relay, _stream(), 5))
    assert all("usage" not in e for e in events[:-1])  # type: ignore[operator]
    assert len(events) == 5 and relay.usage == (11, 2)


@pytest.mark.parametrize("usage_event", [
    # vLLM's own usage chunk, which the relay tells by one pattern ...
    b'{"id":"c1","object":"chat.completion.chunk","created":1,"model":"up-pro","choices":[],'
    b'"usage":{"prompt_tokens":11,"completion_tokens":2,"total_tokens":13}}',
    b'{"id":"c1","object":"chat.completion.chunk","created":1,"model":"up-pro","choices":[],'
    b'"usage":{"prompt_tokens":11,"total_tokens":13,"completion_tokens":2}}',
    # ... and near ones its JSON scanner reads
    b'{"id":"c\\"1","object":"chat.completion.chunk","created":1,"model":"up-pro","choices":[],'
    b'"usage":{"prompt_tokens":11,"completion_tokens":2,"total_tokens":13}}',
    b'{"id":"c1","object":"chat.completion.chunk","created":1,"model":"up-pro","choices":[],'
    b'"usage":{"prompt_tokens":11,"prompt_tokens_details":null,"completion_tokens":2,"total_tokens":13}}',
    b'{"id":"c1","object":"chat.completion.chunk","created":1,"model":"up-pro","choices":[],'
    b'"usage":{"prompt_tokens":11,"completion_tokens":2,"total_tokens":13},"system_fingerprint":"x"}',
])
@pytest.mark.parametrize("show_usage", [True, False])
def test_the_usage_chunk_of_vllm_and_near_shapes_is_shown_or_taken_out_alike(usage_event: bytes,
                                                                           show_usage: bool) -> None:
    content = _event({"id": "c1", "model": "up-pro", "choices": [{"index": 0, "delta": {"content": "x"}}]})
    usage = b"data: " + usage_event + b"\n\n"
    relay = StreamRelay("up-pro", "polish-pro", show_usage=show_usage, prompt_estimate=5)
    out = relay.feed(content + usage + b"data: [DONE]\n\n")
    end = usage.index(b"}", usage.index(b'"usage":{'))  # shown with what the request is billed last
    priced = usage[:end] + b',"cost_micro_pln":%d' % cost_micro_pln(11, 2, PRICES) + usage[end:]
    renamed = [e.replace(b'"model":"up-pro"', b'"model":"polish-pro"') for e in (content, priced)]
    assert out == renamed[0] + (renamed[1] if show_usage else b"") + b"data: [DONE]\n\n"
    assert relay.usage == (11, 2)


def test_broken_stream_has_no_usage_and_counts_content() -> None:
    data = _stream()
    cut = data.index(b"finish_reason\":\"stop")
    relay = StreamRelay("up-pro", "polish-pro", show_usage=True)
    out = relay.feed(data[:cut])
    assert relay.usage is None and relay.content_events == 2
    assert out.endswith(b"\n\n")


def test_spaced_json_from_another_server_is_handled_too() -> None:
    data = _stream().replace(b'":', b'": ').replace(b'","', b'", "')
    relay = StreamRelay("up-pro", "polish-pro", show_usage=False)
    events = _events(_relay_all(relay, data, 9))
    assert all(e["model"] == "polish-pro" for e in events[:-1])  # type: ignore[index]
    assert all("usage" not in e for e in events[:-1])  # type: ignore[operator]
    assert relay.usage == (11, 2)


@pytest.mark.parametrize("spaced", [b'"model": "up-pro"', b'"model" :"up-pro"', b'"model" : "up-pro"'])
def test_a_spaced_model_member_after_compact_ones_renames_them_all(spaced: bytes) -> None:
    """The relay renames compact "model" members as it passes them; one with a space around its colon
    later in the same chunk sends the whole chunk to the pattern, the compact ones before it included.
    A "model" naming another model and the name inside a content string stay as they came."""
    compact = _event({"model": "up-pro", "choices": [{"delta": {"content": 'x "model":"up-pro"'}}]})
    other = _event({"model": "up-pro-2", "choices": []})
    chunk = compact + other + b'data: {' + spaced + b',"choices":[]}\n\n' + compact
    out = StreamRelay("up-pro", "polish-pro", show_usage=False).feed(chunk)
    models = [e["model"] for e in _events(out)]  # type: ignore[index]
    assert models == ["polish-pro", "up-pro-2", "polish-pro", "polish-pro"]
    assert _events(out)[0]["choices"][0]["delta"]["content"] == 'x "model":"up-pro"'  # type: ignore[index]
    compact_only = StreamRelay("up-pro", "polish-pro", show_usage=False).feed(compact + other + compact)
    assert compact_only == compact.replace(b'"model":"up-pro"', b'"model":"polish-pro"', 1) + other + \
        compact.replace(b'"model":"up-pro"', b'"model":"polish-pro"', 1)


# ---- framing: any SSE line ending, comments, multi-line data, any cut ------------

def sse_data(out: bytes) -> list[str]:
    """The data of each event as an SSE client reads it (the HTML standard's parser): lines end with
    CRLF, LF or CR; a blank line dispatches; comment lines are ignored; data lines are joined by LF."""
    text = out.decode().replace("\r\n", "\n").replace("\r", "\n")
    events, data = [], []
    for line in text.split("\n"):
        if not line:
            if data:
                events.append("\n".join(data))
            data = []
        elif line.startswith(":"):
            continue
        else:
            name, _, value = line.partition(":")
            if name == "data":
                data.append(value[1:] if value.startswith(" ") else value)
    return events


def _frame(stream: bytes, eol: bytes, *, comments: bool = False, multiline: bool = False) -> bytes:
    """The LF-framed stream written with another line ending, keep-alive comments between events and a
    comment inside each, and each JSON document cut over several data lines (at its commas)."""
    out = []
    for event in stream.split(b"\n\n"):
        if not event:
            continue
        lines = [event]
        if multiline and event != b"data: [DONE]":
            lines = [b"data: " + piece for piece in event[len(b"data: "):].replace(b',"', b'\n"').split(b"\n")]
            lines = [ln.replace(b'\n"', b',"') for ln in lines]
            lines = [ln + b"," if i < len(lines) - 1 else ln for i, ln in enumerate(lines)]
        if comments:
            lines = [b": ping"] + lines
            out.append(b": keep-alive" + eol + eol)
        out.append(eol.join(lines) + eol + eol)
    return b"".join(out)


def _docs(events: list[str]) -> list[object]:
    return [json.loads(e) if e != "[DONE]" else e for e in events]


FRAMINGS = [(b"\n", False, False), (b"\r\n", False, False), (b"\r", False, False),
            (b"\n", True, True), (b"\r\n", True, True), (b"\r", True, True)]


def _expected(show_usage: bool) -> list[str]:
    return sse_data(_relay_all(StreamRelay("up-pro", "polish-pro", show_usage), _stream(), 1 << 20))


@pytest.mark.parametrize("show_usage", [True, False])
@pytest.mark.parametrize("eol,comments,multiline", FRAMINGS)
def test_every_framing_cut_at_every_byte(eol: bytes, comments: bool, multiline: bool, show_usage: bool) -> None:
    """Cut in two at every byte boundary (a CR and its LF apart included): the same events, the alias
    put in, the usage read, the usage chunk where (and only where) it was asked for."""
    data = _frame(_stream(), eol, comments=comments, multiline=multiline)
    assert _docs(sse_data(data)) == _docs(sse_data(_stream())), "the framing helper keeps the events"
    want = _docs(_expected(show_usage))
    assert want[-1] == "[DONE]" and any("usage" in e for e in want[:-1]) is show_usage
    for cut in range(len(data) + 1):
        relay = StreamRelay("up-pro", "polish-pro", show_usage)
        out = relay.feed(data[:cut]) + relay.feed(data[cut:]) + relay.end()
        assert _docs(sse_data(out)) == want, (eol, cut)
        assert relay.usage == (11, 2), (eol, cut)
    # without the usage event, the events with content are the estimate billing reads: the same at any cut
    data = _frame(_without_usage(_stream()), eol, comments=comments, multiline=multiline)
    for cut in range(len(data) + 1):
        meter = StreamMeter()
        meter.feed(data[:cut])
        meter.feed(data[cut:])
        assert (meter.usage, meter.content_events) == (None, 2), (eol, cut)


def _without_usage(data: bytes) -> bytes:
    return b"".join(e + b"\n\n" for e in data.split(b"\n\n") if e and b'"usage"' not in e)


def test_the_meter_counts_content_only_while_no_usage_was_reported() -> None:
    """Billing reads the events with content only of a stream without usage: once a usage came (in the
    same chunk or an earlier one), none is counted; a usage billing cannot read is no usage."""
    data = _stream()
    meter = StreamMeter()
    meter.feed(data)
    assert (meter.usage, meter.content_events) == ((11, 2), 0)
    usage_at = data.index(b'data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"up-pro","choices":[],')
    meter = StreamMeter()
    meter.feed(data[:usage_at])
    meter.feed(data[usage_at:] + data[:usage_at])  # content after the usage: not counted
    assert (meter.usage, meter.content_events) == ((11, 2), 2)
    meter = StreamMeter()
    meter.feed(data.replace(b'"prompt_tokens":11', b'"prompt_tokens":"11"'))  # not a whole number
    assert (meter.usage, meter.content_events) == (None, 2)


@pytest.mark.parametrize("eol,comments,multiline", FRAMINGS)
def test_events_are_relayed_as_they_come(eol: bytes, comments: bool, multiline: bool) -> None:
    """Each whole event goes out when its blank line has come, not at the end of the stream."""
    data = _frame(_stream(), eol, comments=comments, multiline=multiline)
    relay = StreamRelay("up-pro", "polish-pro", False)
    seen: list[str] = []
    first_end = data.index(eol + eol, data.index(b"data:")) + 2 * len(eol)
    for i in range(len(data)):
        seen += sse_data(relay.feed(data[i:i + 1]))
        if i == first_end:  # (a CR may be the first half of a CRLF: it is known one byte later)
            assert len(seen) == 1, "the first event was held back"
    seen += sse_data(relay.end())  # (a CR at the very end may still have been waiting for its LF)
    assert len(seen) == 5 and seen[-1] == "[DONE]"
    assert relay.usage == (11, 2)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(FRAMINGS), st.lists(st.integers(min_value=0, max_value=2000), max_size=12),
       st.booleans())
def test_any_cuts_property(framing: tuple[bytes, bool, bool], cuts: list[int], show_usage: bool) -> None:
    data = _frame(_stream(), framing[0], comments=framing[1], multiline=framing[2])
    bounds = sorted({c % (len(data) + 1) for c in cuts})
    relay = StreamRelay("up-pro", "polish-pro", show_usage)
    out, last = b"", 0
    for b in bounds + [len(data)]:
        out += relay.feed(data[last:b])
        last = b
    out += relay.end()
    assert _docs(sse_data(out)) == _docs(_expected(show_usage))
    assert relay.usage == (11, 2)


# ---- usage recognised by content, not shape ---------------------------------------

SHAPES = ["vllm", "sglang", "llamacpp", "tgi", "litellm"]
USAGE = {"prompt_tokens": 11, "total_tokens": 14, "completion_tokens": 3}
# the usage the client is shown: with what the request is billed (ceil(16.5) + 9)
SHOWN = {**USAGE, "cost_micro_pln": 26}


def _shaped(shape: str, n: int = 1) -> bytes:
    """A stream as the simulator's usage_shape knob writes it (the shapes of those servers)."""
    from sim.app import ChoicePlan, Simulator
    plans = [ChoicePlan(pieces=["Dzień", " dobry", "!"], weights=[1, 1, 1]) for _ in range(n)]
    return b"".join(e.data for e in Simulator._stream_events("c1", 1, "up-pro", plans, USAGE, shape))


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("n", [1, 2])
def test_usage_read_whatever_the_chunk_holds(shape: str, n: int) -> None:
    for show_usage in (False, True):
        data = _shaped(shape, n)
        for step in (1, 13, len(data)):
            relay = StreamRelay("up-pro", "polish-pro", show_usage)
            out = _docs(sse_data(_relay_all(relay, data, step)))
            assert relay.usage == (11, 3), (shape, show_usage, step)
            assert out[-1] == "[DONE]"
            chunks: list[dict] = out[:-1]  # type: ignore[assignment]
            assert all(c["model"] == "polish-pro" for c in chunks)
            # every choice's text and its finish_reason reach the client, whatever carried the usage
            for i in range(n):
                text = "".join(ch["delta"].get("content") or "" for c in chunks for ch in c["choices"]
                               if ch["index"] == i)
                assert text == "Dzień dobry!", (shape, text)
                assert [ch["finish_reason"] for c in chunks for ch in c["choices"]
                        if ch["index"] == i and ch.get("finish_reason")] == ["stop"]
                # The interface's streaming rule 2: the chunk that closes a choice has an empty delta (TGI's says
                # role and empty content)
                assert [ch["delta"] for c in chunks for ch in c["choices"]
                        if ch["index"] == i and ch.get("finish_reason")] == [{}], (shape, chunks)
            carrying = [c for c in chunks if c.get("usage")]
            if show_usage:  # The interface's streaming rule 3: the last chunk before [DONE], with empty choices
                assert len(carrying) == 1 and carrying[0] is chunks[-1], (shape, chunks[-2:])
                assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == SHOWN
                assert chunks[-1]["id"] == "c1" and chunks[-1]["object"] == "chat.completion.chunk"
            else:  # no usage object, and no chunk left with nothing to say
                assert carrying == [], (shape, step)
                assert all(any(ch.get("delta") or ch.get("finish_reason") for ch in c["choices"])
                           for c in chunks), (shape, chunks)


@pytest.mark.parametrize("delta, closed", [
    ({"role": "assistant", "content": ""}, {}), ({"role": "assistant"}, {}), ({"content": None}, {}),
    ({}, {}), ({"content": "!"}, {"content": "!"}), ({"role": "assistant", "content": "!"},
                                                     {"role": "assistant", "content": "!"}),
    ({"tool_calls": [{"index": 0}]}, {"tool_calls": [{"index": 0}]})])
def test_a_finish_chunk_that_says_nothing_new_has_an_empty_delta(delta: dict, closed: dict) -> None:
    """The finish chunk that carries the usage (TGI's, llama.cpp's): a delta with nothing new in it (a
    role, empty content) becomes the empty delta of the interface's streaming rule 2; one with content stays."""
    base = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "up-pro"}
    data = (_event({**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                         "finish_reason": None}]})
            + _event({**base, "choices": [{"index": 0, "delta": {"content": "Dzień"}, "finish_reason": None}]})
            + _event({**base, "choices": [{"index": 0, "delta": delta, "finish_reason": "stop"}],
                      "usage": {"prompt_tokens": 11, "completion_tokens": 2, "total_tokens": 13}})
            + b"data: [DONE]\n\n")
    for show_usage in (False, True):
        relay = StreamRelay("up-pro", "polish-pro", show_usage)
        chunks = _docs(sse_data(_relay_all(relay, data, 7)))[:-1]
        assert relay.usage == (11, 2)
        closing = [ch for c in chunks for ch in c["choices"] if ch["finish_reason"]]  # type: ignore[index]
        assert [ch["delta"] for ch in closing] == [closed], chunks
        assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}  # type: ignore[index]


def test_llamacpp_timings_stay_on_the_finish_chunk() -> None:
    relay = StreamRelay("up-pro", "polish-pro", False)
    chunks = _docs(sse_data(_relay_all(relay, _shaped("llamacpp"), 1 << 20)))[:-1]
    last: dict = chunks[-1]  # type: ignore[assignment]
    assert last["choices"][0]["finish_reason"] == "stop" and "usage" not in last
    assert last["timings"] == {"prompt_n": 11, "predicted_n": 3}


def test_usage_on_every_chunk_keeps_the_last_one() -> None:
    """A server reporting running usage on each chunk (vLLM's continuous_usage_stats): billed the last
    report; the client sees one usage chunk, the final one."""
    base = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "up-pro"}
    parts = [_event({**base, "choices": [{"index": 0, "delta": {"content": w}, "finish_reason": None}],
                     "usage": {"prompt_tokens": 11, "completion_tokens": k + 1, "total_tokens": 12 + k}})
             for k, w in enumerate(["a", "b"])]
    parts.append(_event({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
                         "usage": {"prompt_tokens": 11, "completion_tokens": 2, "total_tokens": 13}}))
    parts.append(_event({**base, "choices": [], "usage": {"prompt_tokens": 11, "completion_tokens": 2,
                                                          "total_tokens": 13}}))
    data = b"".join(parts) + b"data: [DONE]\n\n"
    for show_usage in (False, True):
        relay = StreamRelay("up-pro", "polish-pro", show_usage)
        chunks = _docs(sse_data(_relay_all(relay, data, 17)))[:-1]
        assert relay.usage == (11, 2)
        carrying = [c for c in chunks if c.get("usage")]  # type: ignore[union-attr]
        assert carrying == ([chunks[-1]] if show_usage else [])
        assert len(chunks) == 3 + show_usage


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(SHAPES), st.sampled_from(FRAMINGS), st.lists(st.integers(min_value=0, max_value=3000),
       max_size=10), st.booleans())
def test_shapes_framings_and_cuts_property(shape: str, framing: tuple[bytes, bool, bool], cuts: list[int],
                                           show_usage: bool) -> None:
    plain = _shaped(shape, 2).replace(b"\"content\":\"!\"", b"\"content\":\"data: [DONE]\"")
    data = _frame(plain, framing[0], comments=framing[1], multiline=framing[2])
    relay = StreamRelay("up-pro", "polish-pro", show_usage)
    out, last = b"", 0
    for b in sorted({c % (len(data) + 1) for c in cuts}) + [len(data)]:
        out += relay.feed(data[last:b])
        last = b
    out += relay.end()
    whole = StreamRelay("up-pro", "polish-pro", show_usage)
    assert _docs(sse_data(out)) == _docs(sse_data(whole.feed(plain) + whole.end()))
    assert relay.usage == whole.usage == (11, 3)
    chunks = _docs(sse_data(out))[:-1]
    assert [c for c in chunks if c.get("usage")] == (chunks[-1:] if show_usage else [])  # type: ignore[union-attr]


# ---- The interface's streaming rules 1 and 3 whatever the model server writes ------------------------------------

@pytest.mark.parametrize("eol,comments,multiline", FRAMINGS)
def test_every_event_leaves_as_one_data_line(eol: bytes, comments: bool, multiline: bool) -> None:
    """The interface's streaming rule 1: each event is "data: " + JSON + a blank line, whatever the framing the
    model server used (line endings, comments, keep-alives, data over several lines), at any cut."""
    data = _frame(_stream(), eol, comments=comments, multiline=multiline)
    for step in (1, 3, 17, len(data)):
        out = _relay_all(StreamRelay("up-pro", "polish-pro", True), data, step)
        assert out.endswith(b"\n\n") and b"\r" not in out
        events = out[:-2].split(b"\n\n")
        assert all(e.startswith(b"data: ") and b"\n" not in e for e in events), (eol, step, out[:200])
        assert [e[6:] for e in events][-1] == b"[DONE]"
        assert _docs([e[6:].decode() for e in events]) == _docs(_expected(True))


@pytest.mark.parametrize("eol,comments,multiline", FRAMINGS)
@pytest.mark.parametrize("n", [1, 3])
def test_asked_usage_the_model_server_did_not_report_is_the_billed_estimate(
        eol: bytes, comments: bool, multiline: bool, n: int) -> None:
    """The interface's streaming rule 3 for a model server that reports no usage: the client that asked gets, as the
    last chunk before [DONE], the usage the request is billed (observer.outcome: the estimated input,
    one output token per event with content, as the ext_proc's meter counts them on the same bytes)."""
    base = {"id": "c9", "object": "chat.completion.chunk", "created": 77, "model": "up-pro"}
    events = [_event({**base, "choices": [{"index": i, "delta": {"role": "assistant", "content": ""},
                                           "finish_reason": None}]}) for i in range(n)]
    events += [_event({**base, "choices": [{"index": i, "delta": {"content": w}, "finish_reason": None}]})
               for w in ("Ala", " ma", " kota") for i in range(n)]
    events += [_event({**base, "choices": [{"index": i, "delta": {}, "finish_reason": "stop"}]}) for i in range(n)]
    data = _frame(b"".join(events) + b"data: [DONE]\n\n", eol, comments=comments, multiline=multiline)
    for step in (1, 5, len(data)):
        relay = StreamRelay("up-pro", "polish-pro", True, prompt_estimate=42)
        out = _events(_relay_all(relay, data, step))
        assert relay.usage is None and relay.content_events == 3 * n
        assert out[-1] == "[DONE]"
        assert out[-2] == {"id": "c9", "object": "chat.completion.chunk", "created": 77, "model": "polish-pro",
                           "choices": [], "usage": {"prompt_tokens": 42, "completion_tokens": 3 * n,
                                                    "total_tokens": 42 + 3 * n,
                                                    "cost_micro_pln": cost_micro_pln(42, 3 * n, PRICES),
                                                    "estimated": True}}, (step, out[-2])
        assert sum(1 for e in out[:-1] if "usage" in e) == 1  # type: ignore[operator]
        # not asked: no usage chunk at all
        quiet = _events(_relay_all(StreamRelay("up-pro", "polish-pro", False, 42), data, step))
        assert all("usage" not in e for e in quiet[:-1]) and len(quiet) == len(out) - 1  # type: ignore[operator]


def test_reported_usage_is_never_doubled_by_an_estimate() -> None:
    relay = StreamRelay("up-pro", "polish-pro", True, prompt_estimate=99)
    out = _events(_relay_all(relay, _stream(), 4))
    assert [e["usage"] for e in out[:-1] if "usage" in e] == [  # type: ignore[index,operator]
        {"prompt_tokens": 11, "completion_tokens": 2, "total_tokens": 13, "cost_micro_pln": 17 + 6}]


def test_a_stream_cut_before_done_gets_no_usage_of_ours() -> None:
    """Without [DONE] the stream is incomplete (the interface rule 4): nothing is added to it."""
    data = _without_usage(_stream()).replace(b"data: [DONE]\n\n", b"")
    out = _events(_relay_all(StreamRelay("up-pro", "polish-pro", True, 5), data, 3))
    assert all("usage" not in e for e in out)  # type: ignore[operator]


@pytest.mark.parametrize("show_usage", [True, False])
def test_a_null_usage_on_every_chunk_is_taken_out(show_usage: bool) -> None:
    """Some servers (SGLang) write "usage": null on every chunk; the interface shows usage only on the final chunk
    and only when asked."""
    data = _stream().replace(b',"model":"up-pro","choices":[{', b',"model":"up-pro","usage":null,"choices":[{')
    data = data.replace(b'"finish_reason":"stop"}]}', b'"finish_reason":"stop"}],"usage": null}')
    assert data.count(b'"usage":null') == 4 and data.count(b'"usage": null}') == 1
    relay = StreamRelay("up-pro", "polish-pro", show_usage)
    out = _events(_relay_all(relay, data, 6))
    assert [e for e in out[:-1] if "usage" in e] == (  # type: ignore[operator]
        [out[-2]] if show_usage else [])
    assert relay.usage == (11, 2)


# (a line break there would end the data line: not a stream a model server writes)
_SEPARATORS = [b'"content":"', b'"content": "', b'"content":\t"', b'"content": \t "', b'"content":\t\t"']


@settings(max_examples=300, deadline=None)
@given(events=st.lists(st.tuples(st.sampled_from(_SEPARATORS), st.sampled_from([b"", b"x", b'\\"', b"a b"]),
                                 st.booleans()), min_size=1, max_size=6),
       spaced_usage=st.booleans(), cut=st.integers(1, 40))
def test_the_relay_counts_content_events_as_the_meter_does(events: list[tuple[bytes, bytes, bool]],
                                                            spaced_usage: bool, cut: int) -> None:
    """The relay's usage chunk of its own says what the request is billed: its count of events with
    content equals the ext_proc meter's on any bytes (compact or spaced JSON, white space of any kind
    before the string, empty contents, a "usage": null in spaced form), cut anywhere."""
    data = b""
    for sep, text, with_null in events:
        data += b'data: {"choices":[{"delta":{' + sep + text + b'"}}]' + (
            b',"usage": null' if with_null and spaced_usage else b"") + b"}\n\n"
    data += b"data: [DONE]\n\n"
    relay = StreamRelay("up-pro", "polish-pro", True, prompt_estimate=3)
    out = _relay_all(relay, data, cut)
    assert relay.usage is None
    assert relay.lua_content_events == relay.content_events, data
    assert _events(out)[-2]["usage"]["completion_tokens"] == relay.content_events  # type: ignore[index]


# ---- what the usage shown says the request is billed --------------------------------------------------

@settings(max_examples=200, deadline=None)
@given(prompt=st.integers(0, 2 * 10**6), completion=st.integers(0, 2 * 10**6),
       input_price=st.one_of(st.integers(0, 10**10), st.sampled_from([1, 999_999, 10**6, 10**6 + 1])),
       output_price=st.one_of(st.integers(0, 10**10), st.sampled_from([1, 999_999, 10**6, 10**6 + 1])))
def test_the_relays_cost_is_billings_integer(prompt: int, completion: int, input_price: int,
                                              output_price: int) -> None:
    """The relay computes the cost in LuaJIT's doubles: the same integer as core/cost.py's rounding
    (each term up on its own), for prices up to 10 000 PLN per million tokens and millions of tokens."""
    prices = Prices(input_price, output_price)
    assert lua_cost(prompt, completion, prices) == cost_micro_pln(prompt, completion, prices)


def test_a_product_past_two_to_the_53_is_still_exact() -> None:
    """tokens x price beyond a double's integers: the price is split, so the figure stays exact."""
    prices = Prices(10**9 + 999_999, 10**9 + 1)
    assert 10**9 * prices.input > 2**53 and (10**9 - 1) * prices.output > 2**53
    assert lua_cost(10**9, 10**9 - 1, prices) == cost_micro_pln(10**9, 10**9 - 1, prices)


@pytest.mark.parametrize("shape", SHAPES)
def test_the_usage_shown_carries_the_cost_at_the_streams_prices(shape: str) -> None:
    """Whatever chunk the model server reports usage on, the usage chunk the client gets carries
    cost_micro_pln at the prices the stream context gave (not estimated: it is the model server's count)."""
    data = _shaped(shape, 1)
    for prices in (Prices(1, 1), Prices(4_000_000, 8_000_000), Prices(0, 0)):
        relay = StreamRelay("up-pro", "polish-pro", True, prompt_estimate=5, prices=prices)
        chunks = _docs(sse_data(_relay_all(relay, data, 11)))[:-1]
        shown = [c["usage"] for c in chunks if c.get("usage")]  # type: ignore[union-attr]
        assert shown == [{**USAGE, "cost_micro_pln": cost_micro_pln(11, 3, prices)}], (shape, prices)
        assert type(shown[0]["cost_micro_pln"]) is int and "estimated" not in shown[0]


def test_a_model_servers_own_cost_members_are_replaced() -> None:
    """A model server that is itself a gateway may put cost_micro_pln or estimated in its usage: the
    client gets this request's figure once, not the model server's."""
    base = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "up-pro"}
    theirs = {"prompt_tokens": 11, "cost_micro_pln": 999, "completion_tokens": 2, "estimated": True}
    for carrier in ([], [{"index": 0, "delta": {}, "finish_reason": "stop"}]):
        data = (_event({**base, "choices": [{"index": 0, "delta": {"content": "a"}, "finish_reason": None}]})
                + _event({**base, "choices": carrier, "usage": theirs}) + b"data: [DONE]\n\n")
        out = _relay_all(StreamRelay("up-pro", "polish-pro", True), data, 1 << 20)
        assert out.count(b"cost_micro_pln") == 1 and b"estimated" not in out
        assert _events(out)[-2]["usage"] == {"prompt_tokens": 11, "completion_tokens": 2,  # type: ignore[index]
                                            "cost_micro_pln": 17 + 6}
