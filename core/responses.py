"""Model-server replies, translated for the client.  Pure.

- ``rewrite_body``: a successful JSON reply with the alias put back in ``model`` and its usage read:
  the usage object alone is decoded as JSON (no full parse of a possibly large embeddings reply);
  ``with_estimated_usage``: one that reports none given the estimate it is billed.  Both give a
  ``Reply``, whose ``body`` puts in its usage what the request is billed (``cost_micro_pln``).
- ``upstream_error``: a model-server error reply mapped to docs/interface.md section 7, with a message of our own:
  nothing of the model server's text (which may quote the prompt) reaches the client.
"""
from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Any
import re

from .cost import estimate_reply_completion, usage_json_tokens
from .errors import (NO_CAPACITY, UPSTREAM_FAILED, UPSTREAM_TIMEOUT, ApiError, context_length_exceeded, text_only,
                     upstream_rejected)

_USAGE_KEY = b'"usage"'
_USAGE_MEMBER = re.compile(rb'"usage"\s*:\s*(?=\{)')  # a member named usage whose value is an object
_DECODER = json.JSONDecoder()
_SAFE_PARAM = re.compile(r"[A-Za-z_][A-Za-z0-9_.\[\]]{0,63}")
# the usage members the gateway writes (docs/interface.md, "Usage"): a model server's own are not passed on
COST, ESTIMATED = "cost_micro_pln", "estimated"


@dataclass(frozen=True, slots=True)
class Reply:
    """A successful reply for the client, cut around its usage object: ``head``, the usage, ``tail``.
    ``usage`` is that object decoded (None: the reply reports none, and ``head`` is all of it), ``text``
    its bytes as the model server wrote them (empty: written from ``usage``)."""

    head: bytes
    usage: dict[str, Any] | None = None
    tail: bytes = b""
    text: bytes = b""

    @property
    def tokens(self) -> tuple[int, int] | None:
        """(prompt, completion) the usage reports, or None."""
        return usage_json_tokens(self.usage)

    def body(self, cost_micro_pln: int | None = None, estimated: bool = False) -> bytes:
        """The reply's bytes, its usage saying what the request is billed: ``cost_micro_pln`` (the usage
        record's integer), and ``estimated: true`` where the tokens are the gateway's estimate."""
        if self.usage is None:
            return self.head
        text = self.text
        if not text or COST in self.usage or ESTIMATED in self.usage:  # (a model server's own: not passed on)
            usage = {k: v for k, v in self.usage.items() if k not in (COST, ESTIMATED)}
            text = json.dumps(usage, ensure_ascii=False, separators=(",", ":")).encode()
        members = b"" if cost_micro_pln is None else b',"%s":%d%s' % (
            COST.encode(), cost_micro_pln, b',"estimated":true' if estimated else b"")
        return self.head + text[:-1] + members + b"}" + self.tail


@functools.lru_cache(maxsize=256)  # one per upstream model
def model_pattern(upstream_model: str) -> re.Pattern[bytes]:
    return re.compile(rb'"model":\s*' + re.escape(json.dumps(upstream_model).encode()))


def rewrite_body(body: bytes, upstream_model: str, alias: str, *, embeddings: bool = False) -> Reply:
    """The reply with ``model`` = alias, cut around its usage object (none: ``Reply.usage`` None).
    Embeddings usage carries no ``completion_tokens`` (docs/interface.md section 2): it is taken out."""
    new = model_pattern(upstream_model).sub(b'"model":' + json.dumps(alias).encode(), body, count=1)
    at, end, usage = _usage_member(new)
    if usage is None:
        return Reply(new)
    text = new[at:end]
    if embeddings and "completion_tokens" in usage:
        del usage["completion_tokens"]
        text = b""
    return Reply(new[:at], usage, new[end:], text)


def with_estimated_usage(body: bytes, prompt_tokens: int, *, embeddings: bool = False) -> tuple[Reply, int]:
    """A successful reply that reports no usage, given the usage it is billed (docs/interface.md section 2: a reply
    has ``usage``): the estimated input, and for chat the estimate of its output.  (reply, completion
    tokens).  The one JSON parse of such a reply; one that is not a JSON object is passed on as it is."""
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return Reply(body), 0
    if not isinstance(doc, dict):
        return Reply(body), 0
    completion = 0 if embeddings else estimate_reply_completion(doc)
    usage: dict[str, Any] = {"prompt_tokens": prompt_tokens}
    if not embeddings:
        usage["completion_tokens"] = completion
    usage["total_tokens"] = prompt_tokens + completion
    doc.pop("usage", None)  # (a null one), so that the usage is the last member
    rest = json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode()[:-1]
    return Reply(rest + (b',"usage":' if doc else b'"usage":'), usage, b"}"), completion


def read_usage(body: bytes) -> tuple[int, int] | None:
    """(prompt, completion) of a reply's usage object, or None when it has none."""
    return usage_json_tokens(_usage_member(body)[2])


def _usage_member(body: bytes) -> tuple[int, int, dict[str, Any] | None]:
    """Where the reply's usage object starts and ends, and the object: the last member ``"usage": {...}``
    of the body whose value decodes as a Usage object, decoded as JSON (its members in any order, nested
    objects such as ``prompt_tokens_details`` anywhere in it).  A string that merely says "usage" (a
    logprobs token, content) is no member: inside a JSON string its quotes are escaped."""
    at = body.rfind(_USAGE_KEY)
    while at >= 0:
        m = _USAGE_MEMBER.match(body, at)
        if m is not None:
            tail = body[m.end():].decode("utf-8", "replace")
            try:
                value, end = _DECODER.raw_decode(tail)
            except ValueError:
                value = None
            if usage_json_tokens(value) is not None:
                return m.end(), m.end() + len(tail[:end].encode()), value
        at = body.rfind(_USAGE_KEY, 0, at)
    return -1, -1, None


def _upstream_message_and_param(body: bytes) -> tuple[str, str | None]:
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return "", None
    if not isinstance(doc, dict):
        return "", None
    inner = doc.get("error")
    err: dict[str, Any] = inner if isinstance(inner, dict) else doc
    msg = err.get("message")
    param = err.get("param")
    return (msg if isinstance(msg, str) else ""), (
        param if isinstance(param, str) and _SAFE_PARAM.fullmatch(param) else None)


# How model servers say the input does not fit the context: vLLM ("maximum context length", v1's "longer
# than the maximum model length"), SGLang ("longer than the model's context length"), TGI ("`inputs`
# tokens + `max_new_tokens` must be <= N"), llama.cpp ("exceeds the available context size").
_CONTEXT_WORDS = ("context length", "context_length", "maximum context", "maximum model length",
                  "context size", "context window", "max_new_tokens` must be", "max_model_len")


def upstream_error(status: int, body: bytes, input_param: str = "messages") -> ApiError:
    """Map a model server's error status and body to docs/interface.md section 7; ``input_param`` names the
    request field that carries the input (``messages`` for chat, ``input`` for embeddings)."""
    message, param = _upstream_message_and_param(body)
    low = message.lower()
    if status in (400, 413, 422):
        if any(words in low for words in _CONTEXT_WORDS):
            return context_length_exceeded(input_param)
        if "multimodal" in low or "image" in low or "vision" in low:
            return text_only(input_param)
        return upstream_rejected(param)
    if status == 429:
        return NO_CAPACITY
    if status == 504:
        return UPSTREAM_TIMEOUT
    return UPSTREAM_FAILED
