"""Request rules of docs/interface.md section 4 for chat completions and embeddings.

Pure: bytes in, a ``Prepared`` request (the body to forward upstream and what billing needs)
or an ``ApiError`` out.  The body is parsed once and serialised once.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Callable

from .catalog_types import Alias, Catalog
from .cost import estimate_chat_prompt, estimate_embedding_prompt
from . import errors
from .errors import ApiError

CHAT = "chat"  # the capability an alias needs for chat completions, and the endpoint's name
EMBEDDINGS = "embeddings"
_ROLES = frozenset({"system", "user", "assistant", "tool", "developer"})


@dataclass(frozen=True, slots=True)
class Prepared:
    alias: Alias
    upstream_model: str
    body: bytes  # what goes upstream
    stream: bool
    client_wants_usage: bool  # show the usage chunk to the client
    estimated_prompt_tokens: int
    max_tokens: int = 0  # the max_tokens forwarded (chat; 0: embeddings)
    choices: int = 1  # the choices the model server may return (chat's n, ``choices``)


def _body(doc: dict[str, Any]) -> bytes | ApiError:
    """The body to forward: compact JSON, or the refusal of a number out of range."""
    try:
        return json.dumps(doc, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()
    except ValueError:
        return errors.NUMBER_OUT_OF_RANGE  # no model server could read the body


# Arrays and objects nested deeper than this are refused (README, "Upstream budgets and routing"):
# 400 invalid_json.
MAX_JSON_DEPTH = 128
_TOO_DEEP = errors.too_deep(MAX_JSON_DEPTH)


def _no_constant(name: str) -> Any:
    """NaN, Infinity and -Infinity are not JSON (RFC 8259); Python's parser takes them by default."""
    raise ValueError(f"{name} is not JSON")


# A UTF-16 surrogate can only come as a \u escape (UTF-8 bytes of one do not decode): a body without
# such an escape is spared the check.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89abcdefABCDEF]")


def _parse(raw: bytes) -> dict[str, Any] | ApiError:
    try:
        doc = json.loads(raw, parse_constant=_no_constant)
    except (ValueError, UnicodeDecodeError) as e:
        if type(e) is ValueError and "integer string conversion" in str(e):
            return errors.TOO_MANY_DIGITS  # valid JSON, but a number out of range (Python's guard, README)
        return errors.INVALID_JSON
    except RecursionError:  # deeper than the parser's own recursion limit (about 1,000 levels)
        return _TOO_DEEP
    if not isinstance(doc, dict):
        return errors.NOT_AN_OBJECT
    # No body with fewer opening brackets than the limit can be nested deeper than it (a count runs at
    # memory speed); only a body with more is walked, once, through its arrays and objects.
    if raw.count(b"[") + raw.count(b"{") > MAX_JSON_DEPTH and _deeper_than(doc, MAX_JSON_DEPTH):
        return _TOO_DEEP
    # a lone surrogate is refused (README): no model server could read it, and no text holds one
    if b"\\u" in raw and _SURROGATE_ESCAPE.search(raw):
        try:
            json.dumps(doc, ensure_ascii=False).encode()
        except UnicodeEncodeError:
            return errors.LONE_SURROGATE
    return doc


def _deeper_than(doc: dict[str, Any], limit: int) -> bool:
    """Whether arrays and objects nest more than ``limit`` levels (the top-level object is level 1),
    level by level: each pass keeps only the next level's arrays and objects."""
    level: list[Any] = [doc]
    for _ in range(limit):
        deeper: list[Any] = []
        for node in level:
            deeper += [v for v in (node.values() if type(node) is dict else node)
                       if type(v) is list or type(v) is dict]
        if not deeper:
            return False
        level = deeper
    return True


def _alias(doc: dict[str, Any], catalog: Catalog, capability: str) -> Alias | ApiError:
    model = doc.get("model")
    if model is None:
        return errors.MODEL_REQUIRED
    if not isinstance(model, str):
        return errors.MODEL_NOT_A_STRING
    alias = catalog.aliases.get(model)
    if alias is None:
        return errors.MODEL_NOT_FOUND
    if capability not in alias.capabilities:
        return errors.naming(errors.wrong_capability("chat completions" if capability == CHAT else "embeddings"),
                             alias.id)
    return alias


def _upstream(alias: Alias, pick: Callable[[Alias], str | None]) -> str | ApiError:
    up = pick(alias)
    return errors.NO_CAPACITY if up is None else up


def _max_tokens(doc: dict[str, Any], alias: Alias) -> int | ApiError:
    ceiling = alias.max_output_tokens
    chosen = ceiling
    for name in ("max_tokens", "max_completion_tokens"):
        v = doc.pop(name, None)
        if v is None:
            continue
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            return errors.not_a_positive_integer(name)
        chosen = min(chosen, v)
    return chosen


def choices(n: Any) -> int:
    """How many choices a chat request's ``n`` (forwarded unchanged, the interface) can make the model server
    return, as it reads ``n``: an integer, or a number or a string of digits with an integral value
    (vLLM's lax parsing takes 2.0 and "2" as 2).  Anything else - absent, null, a boolean, less than 1,
    not a number - counts as 1: the model server refuses an invalid ``n`` before it generates."""
    if isinstance(n, bool):
        return 1
    if isinstance(n, float) and n.is_integer():
        n = int(n)
    elif isinstance(n, str) and n.strip().isascii() and n.strip().isdigit() and len(n.strip()) <= 18:
        n = int(n.strip())
    return n if isinstance(n, int) and n > 1 else 1


def prepare_chat(raw: bytes, catalog: Catalog, pick: Callable[[Alias], str | None]) -> Prepared | ApiError:
    doc = _parse(raw)
    if isinstance(doc, ApiError):
        return doc
    alias = _alias(doc, catalog, CHAT)
    if isinstance(alias, ApiError):
        return alias
    prepared = _prepare_chat(doc, alias, pick)
    return errors.naming(prepared, alias.id) if isinstance(prepared, ApiError) else prepared


def _prepare_chat(doc: dict[str, Any], alias: Alias, pick: Callable[[Alias], str | None]) -> Prepared | ApiError:
    messages = doc.get("messages")
    if not isinstance(messages, list) or not messages:
        return errors.MESSAGES_REQUIRED
    for m in messages:
        if not isinstance(m, dict) or m.get("role") not in _ROLES:
            return errors.MESSAGE_ROLE
    stream = doc.get("stream", False)
    if stream is not None and not isinstance(stream, bool):
        return errors.STREAM_NOT_A_BOOLEAN
    max_tokens = _max_tokens(doc, alias)
    if isinstance(max_tokens, ApiError):
        return max_tokens
    up = _upstream(alias, pick)
    if isinstance(up, ApiError):
        return up
    wants_usage = False
    if stream:
        opts = doc.get("stream_options")
        if opts is None:  # The interface rule 4: a null one is replaced by include_usage true (absent: not asked)
            opts = {"include_usage": True} if "stream_options" in doc else {}
        elif not isinstance(opts, dict):
            return errors.STREAM_OPTIONS_NOT_AN_OBJECT
        # a boolean (null: not asked); the model server never sees the client's, so it is checked here
        asked = opts.get("include_usage")
        if asked is not None and not isinstance(asked, bool):
            return errors.INCLUDE_USAGE_NOT_A_BOOLEAN
        wants_usage = asked is True
        doc["stream_options"] = {**opts, "include_usage": True}
    doc["model"] = up
    doc["max_tokens"] = max_tokens
    body = _body(doc)
    if isinstance(body, ApiError):
        return body
    return Prepared(alias, up, body, bool(stream), wants_usage, estimate_chat_prompt(messages), max_tokens,
                    choices(doc.get("n")))


def _tokens(x: Any) -> bool:
    """A token id, or an array of token ids (pre-tokenized input); a boolean is neither."""
    if type(x) is int:
        return True
    return type(x) is list and bool(x) and all(type(t) is int for t in x)


def prepare_embeddings(raw: bytes, catalog: Catalog, pick: Callable[[Alias], str | None]) -> Prepared | ApiError:
    doc = _parse(raw)
    if isinstance(doc, ApiError):
        return doc
    alias = _alias(doc, catalog, EMBEDDINGS)
    if isinstance(alias, ApiError):
        return alias
    prepared = _prepare_embeddings(doc, alias, pick)
    return errors.naming(prepared, alias.id) if isinstance(prepared, ApiError) else prepared


def _prepare_embeddings(doc: dict[str, Any], alias: Alias,
                        pick: Callable[[Alias], str | None]) -> Prepared | ApiError:
    inp = doc.get("input")
    if isinstance(inp, str):
        inputs = [inp]
    elif isinstance(inp, list) and inp and all(isinstance(s, str) for s in inp):
        inputs = inp
    elif isinstance(inp, list) and inp and all(_tokens(s) for s in inp):
        return errors.TOKEN_INPUT
    else:
        return errors.INPUT_REQUIRED
    fmt = doc.get("encoding_format")
    if fmt is not None and fmt not in ("float", "base64"):
        return errors.ENCODING_FORMAT
    up = _upstream(alias, pick)
    if isinstance(up, ApiError):
        return up
    doc["model"] = up
    body = _body(doc)
    if isinstance(body, ApiError):
        return body
    return Prepared(alias, up, body, False, False, estimate_embedding_prompt(inputs))
