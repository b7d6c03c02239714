"""Unit tests of the sans-I/O stream relay: fed bytes cut anywhere."""
import json

from extproc.sse import StreamRelay


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
        assert relay.content_events == 2


def test_usage_chunk_removed_when_not_asked() -> None:
    relay = StreamRelay("up-pro", "polish-pro", show_usage=False)
    events = _events(_relay_all(relay, _stream(), 5))
    assert all("usage" not in e for e in events[:-1])  # type: ignore[operator]
    assert len(events) == 5 and relay.usage == (11, 2)


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
    assert relay.usage == (11, 2) and relay.content_events == 2
