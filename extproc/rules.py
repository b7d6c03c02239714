"""Request rules of SPEC section 4 for chat completions and embeddings.

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
from .errors import MODEL_NOT_FOUND, NO_CAPACITY, ApiError

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


# A number such as 1e400 is valid JSON, but parses to infinity, which JSON cannot write: no model
# server could read the body.
_OUT_OF_RANGE = ApiError("invalid_request", "A number in the request body is beyond the range of a "
                         "64-bit floating-point number.")

# Python's guard against the quadratic cost of converting huge integers (sys.get_int_max_str_digits()).
_TOO_MANY_DIGITS = ApiError("invalid_request", "An integer in the request body has more than 4,300 digits.")


def _body(doc: dict[str, Any]) -> bytes | ApiError:
    """The body to forward: compact JSON, or the refusal of a number out of range."""
    try:
        return json.dumps(doc, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()
    except ValueError:
        return _OUT_OF_RANGE


def _bad(message: str, param: str | None) -> ApiError:
    return ApiError("invalid_request", message, param)


# Arrays and objects nested deeper than this are refused (README, "Upstream budgets and routing"):
# 400 invalid_json.
MAX_JSON_DEPTH = 128
_TOO_DEEP = ApiError("invalid_json",
                     f"The request body nests arrays and objects deeper than {MAX_JSON_DEPTH} levels.")


def _no_constant(name: str) -> Any:
    """NaN, Infinity and -Infinity are not JSON (RFC 8259); Python's parser takes them by default."""
    raise ValueError(f"{name} is not JSON")


# A UTF-16 surrogate can only come as a \u escape (UTF-8 bytes of one do not decode): a body without
# such an escape is spared the check.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89abcdefABCDEF]")
_LONE_SURROGATE = ApiError("invalid_request", "The request body contains a lone UTF-16 surrogate "
                           "(a \\ud800-\\udfff escape not part of a pair), which is not text.")


def _parse(raw: bytes) -> dict[str, Any] | ApiError:
    try:
        doc = json.loads(raw, parse_constant=_no_constant)
    except (ValueError, UnicodeDecodeError) as e:
        if type(e) is ValueError and "integer string conversion" in str(e):
            return _TOO_MANY_DIGITS  # valid JSON, but a number out of range (Python's guard, README)
        return ApiError("invalid_json", "The request body is not valid JSON.")
    except RecursionError:  # deeper than the parser's own recursion limit (about 1,000 levels)
        return _TOO_DEEP
    if not isinstance(doc, dict):
        return _bad("The request body must be a JSON object.", None)
    # No body with fewer opening brackets than the limit can be nested deeper than it (a count runs at
    # memory speed); only a body with more is walked, once, through its arrays and objects.
    if raw.count(b"[") + raw.count(b"{") > MAX_JSON_DEPTH and _deeper_than(doc, MAX_JSON_DEPTH):
        return _TOO_DEEP
    # a lone surrogate is refused (README): no model server could read it, and no text holds one
    if b"\\u" in raw and _SURROGATE_ESCAPE.search(raw):
        try:
            json.dumps(doc, ensure_ascii=False).encode()
        except UnicodeEncodeError:
            return _LONE_SURROGATE
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
        return _bad("The 'model' field is required.", "model")
    if not isinstance(model, str):
        return _bad("The 'model' field must be a string.", "model")
    alias = catalog.aliases.get(model)
    if alias is None:
        return MODEL_NOT_FOUND
    if capability not in alias.capabilities:
        what = "chat completions" if capability == CHAT else "embeddings"
        return _bad(f"This model does not support {what}.", "model")
    return alias


def _upstream(alias: Alias, pick: Callable[[Alias], str | None]) -> str | ApiError:
    up = pick(alias)
    return NO_CAPACITY if up is None else up


def _max_tokens(doc: dict[str, Any], alias: Alias) -> int | ApiError:
    ceiling = alias.max_output_tokens
    chosen = ceiling
    for name in ("max_tokens", "max_completion_tokens"):
        v = doc.pop(name, None)
        if v is None:
            continue
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            return _bad(f"'{name}' must be an integer >= 1.", name)
        chosen = min(chosen, v)
    return chosen


def choices(n: Any) -> int:
    """How many choices a chat request's ``n`` (forwarded unchanged, SPEC) can make the model server
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
    messages = doc.get("messages")
    if not isinstance(messages, list) or not messages:
        return _bad("'messages' must be a non-empty array.", "messages")
    for m in messages:
        if not isinstance(m, dict) or m.get("role") not in _ROLES:
            return _bad("Each message must be an object with a valid 'role'.", "messages")
    stream = doc.get("stream", False)
    if stream is not None and not isinstance(stream, bool):
        return _bad("'stream' must be a boolean.", "stream")
    max_tokens = _max_tokens(doc, alias)
    if isinstance(max_tokens, ApiError):
        return max_tokens
    up = _upstream(alias, pick)
    if isinstance(up, ApiError):
        return up
    wants_usage = False
    if stream:
        opts = doc.get("stream_options")
        if opts is None:  # SPEC rule 4: a null one is replaced by include_usage true (absent: not asked)
            opts = {"include_usage": True} if "stream_options" in doc else {}
        elif not isinstance(opts, dict):
            return _bad("'stream_options' must be an object.", "stream_options")
        # a boolean (null: not asked); the model server never sees the client's, so it is checked here
        asked = opts.get("include_usage")
        if asked is not None and not isinstance(asked, bool):
            return _bad("'stream_options.include_usage' must be a boolean.", "stream_options")
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
    inp = doc.get("input")
    if isinstance(inp, str):
        inputs = [inp]
    elif isinstance(inp, list) and inp and all(isinstance(s, str) for s in inp):
        inputs = inp
    elif isinstance(inp, list) and inp and all(_tokens(s) for s in inp):
        return _bad("Pre-tokenized (integer) input is not accepted; send strings.", "input")
    else:
        return _bad("'input' must be a string or a non-empty array of strings.", "input")
    fmt = doc.get("encoding_format")
    if fmt is not None and fmt not in ("float", "base64"):
        return _bad("'encoding_format' must be 'float' or 'base64'.", "encoding_format")
    up = _upstream(alias, pick)
    if isinstance(up, ApiError):
        return up
    doc["model"] = up
    body = _body(doc)
    if isinstance(body, ApiError):
        return body
    return Prepared(alias, up, body, False, False, estimate_embedding_prompt(inputs))
