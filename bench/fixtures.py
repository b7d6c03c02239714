"""What every system in the comparison is fed and what the fixed-reply upstream answers.

The client bodies are the same for every system; the aliases below are the names clients use, the
upstream names are what the fixed-reply upstream reports (the proxies put the alias back)."""
from __future__ import annotations

import json
import random

CHAT_ALIAS, STREAM_ALIAS, EMBED_ALIAS = "bench-chat", "bench-stream", "bench-embed"
UP_CHAT, UP_STREAM, UP_EMBED = "upstream-chat-model", "upstream-stream-model", "upstream-embed-model"
LONG_ALIAS, UP_LONG = "bench-long", "upstream-long-model"  # the long-stream cell (bench/long_streams.py)
ALIASES = {CHAT_ALIAS: UP_CHAT, STREAM_ALIAS: UP_STREAM, EMBED_ALIAS: UP_EMBED, LONG_ALIAS: UP_LONG}

STREAM_CHUNKS = 64
LONG_TOKENS = 200  # tokens of a long-stream reply, one event each
LONG_CADENCE_MS = 25  # between two of its events
EMBED_INPUTS = 16
EMBED_DIM = 1024


def _dumps(doc: object) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode()


# ---- client request bodies -------------------------------------------------------------------
def chat_request() -> bytes:
    return _dumps({"model": CHAT_ALIAS, "max_tokens": 64, "messages": [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Dzień dobry! Jak się masz?"}]})


def stream_request(model: str = STREAM_ALIAS, max_tokens: int = 64) -> bytes:
    return _dumps({"model": model, "max_tokens": max_tokens, "stream": True,
                   "stream_options": {"include_usage": True},
                   "messages": [{"role": "user", "content": "Opowiedz krótką bajkę."}]})


def embed_request() -> bytes:
    return _dumps({"model": EMBED_ALIAS, "input": [f"Ala ma kota numer {i}." for i in range(EMBED_INPUTS)]})


# ---- fixed replies of the upstream -------------------------------------------------------------
def chat_reply() -> bytes:
    return _dumps({
        "id": "chatcmpl-bench", "object": "chat.completion", "created": 1767225600, "model": UP_CHAT,
        "choices": [{"index": 0, "message": {"role": "assistant",
                                             "content": "Dzień dobry! Wszystko dobrze, dziękuję."},
                     "logprobs": None, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 24, "completion_tokens": 12, "total_tokens": 36}})


def _stream_events(model: str, chunks: int) -> list[bytes]:
    """vLLM-style SSE: a role chunk's worth of content chunks, a finish chunk, the usage chunk, [DONE]."""
    out = []
    base = {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 1767225600, "model": model}
    for i in range(chunks):
        delta = {"content": f"słowo{i} "} if i else {"role": "assistant", "content": "Był "}
        fin = "stop" if i == chunks - 1 else None
        out.append(b"data: " + _dumps({**base, "choices": [{"index": 0, "delta": delta, "logprobs": None,
                                                             "finish_reason": fin}]}) + b"\n\n")
    out.append(b"data: " + _dumps({**base, "choices": [], "usage": {
        "prompt_tokens": 12, "completion_tokens": chunks, "total_tokens": 12 + chunks}}) + b"\n\n")
    out.append(b"data: [DONE]\n\n")
    return out


def stream_reply() -> bytes:
    return b"".join(_stream_events(UP_STREAM, STREAM_CHUNKS))


def long_stream_frames() -> bytes:
    """The long-stream upstream's frames (bench/sse_upstream.c), NUL-separated, one sent per cadence
    tick: one token event each, the last one followed at once by the usage event and [DONE]."""
    events = _stream_events(UP_LONG, LONG_TOKENS)
    return b"\0".join(events[:LONG_TOKENS - 1] + [b"".join(events[LONG_TOKENS - 1:])])


def embed_reply() -> bytes:
    rnd = random.Random(9)
    # Four significant digits keep the body moderate (~130 KB) while being a real 16 x 1024 reply.
    data = [{"object": "embedding", "index": i,
             "embedding": [round(rnd.uniform(-1, 1), 4) for _ in range(EMBED_DIM)]} for i in range(EMBED_INPUTS)]
    return _dumps({"object": "list", "data": data, "model": UP_EMBED,
                   "usage": {"prompt_tokens": 96, "total_tokens": 96}})


def models_reply() -> bytes:
    return _dumps({"object": "list", "data": [
        {"id": m, "object": "model", "created": 1767225600, "owned_by": "bench"}
        for m in (UP_CHAT, UP_STREAM, UP_EMBED)]})
