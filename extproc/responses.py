"""Model-server replies, translated for the client.  Pure.

- ``rewrite_body``: a successful JSON reply with the alias put back in ``model`` and its usage read,
  at the bytes level (no full JSON parse of a possibly large embeddings reply);
  ``with_estimated_usage``: one that reports none given the estimate it is billed.
- ``upstream_error``: a model-server error reply mapped to SPEC section 7, with a message of our own:
  nothing of the model server's text (which may quote the prompt) reaches the client.
"""
from __future__ import annotations

import functools
import json
from typing import Any
import re

from .cost import estimate_reply_completion
from .errors import (NO_CAPACITY, UPSTREAM_FAILED, UPSTREAM_TIMEOUT, ApiError, context_length_exceeded, text_only,
                     upstream_rejected)

_USAGE_KEY = b'"usage"'
_PROMPT = re.compile(rb'"prompt_tokens":\s*(\d+)')
_COMPLETION = re.compile(rb'"completion_tokens":\s*(\d+)')
_SAFE_PARAM = re.compile(r"[A-Za-z_][A-Za-z0-9_.\[\]]{0,63}")


@functools.lru_cache(maxsize=256)  # one per upstream model
def model_pattern(upstream_model: str) -> re.Pattern[bytes]:
    return re.compile(rb'"model":\s*' + re.escape(json.dumps(upstream_model).encode()))


_EMB_COMPLETION = re.compile(rb',\s*"completion_tokens":\s*\d+|"completion_tokens":\s*\d+\s*,?')


def rewrite_body(body: bytes, upstream_model: str, alias: str, *, embeddings: bool = False
                 ) -> tuple[bytes, tuple[int, int] | None]:
    """(body with ``model`` = alias, (prompt, completion) usage or None when not reported).
    Embeddings usage carries no ``completion_tokens`` (SPEC section 2): it is taken out."""
    new = model_pattern(upstream_model).sub(b'"model":' + json.dumps(alias).encode(), body, count=1)
    usage = read_usage(new)
    if embeddings and usage is not None:
        at = new.rfind(_USAGE_KEY)
        new = new[:at] + _EMB_COMPLETION.sub(b"", new[at:], count=1)
    return new, usage


def with_estimated_usage(body: bytes, prompt_tokens: int, *, embeddings: bool = False) -> tuple[bytes, int]:
    """A successful reply that reports no usage, given the usage it is billed (SPEC section 2: a reply
    has ``usage``): the estimated input, and for chat the estimate of its output.  (body, completion
    tokens).  The one JSON parse of such a reply; one that is not a JSON object is passed on as it is."""
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return body, 0
    if not isinstance(doc, dict):
        return body, 0
    completion = 0 if embeddings else estimate_reply_completion(doc)
    usage: dict[str, int] = {"prompt_tokens": prompt_tokens}
    if not embeddings:
        usage["completion_tokens"] = completion
    usage["total_tokens"] = prompt_tokens + completion
    doc["usage"] = usage
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode(), completion


def read_usage(body: bytes) -> tuple[int, int] | None:
    at = body.rfind(_USAGE_KEY)
    if at < 0:
        return None
    end = body.find(b"}", at)
    tail = body[at:end if end > 0 else len(body)]
    p = _PROMPT.search(tail)
    if p is None:
        return None
    c = _COMPLETION.search(tail)
    return int(p.group(1)), int(c.group(1)) if c else 0


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
    """Map a model server's error status and body to SPEC section 7; ``input_param`` names the
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
