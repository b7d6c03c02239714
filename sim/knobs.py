"""Parsing of the optional ``"sim"`` request member (simulation knobs).

Recognised knobs (all optional):

=====================  ==========  ==============================================
knob                   type        effect
=====================  ==========  ==============================================
``ttft_ms``            number>=0   delay before the response headers
``first_event_ms``     number>=0   stream: delay between the response headers and
                                   the first event (a model server that sends its
                                   headers at once and its first token later)
``itl_ms``             number>=0   delay between stream events
``output_tokens``      int>=0      tokens to produce (default 16), before max_tokens
``fail_after_chunks``  int>=0      stream: drop the connection after N data events;
                                   non-stream: drop after half of the body
``status``             int 400-599 reply with this status and a vLLM error body
``message``            string      message of that error (default "simulated error")
``quote_prompt``       bool        append " Prompt: <first user message>" to errors
``stall_ms``           number>=0   pause in the middle of the reply
``reply_bytes``        int>=0      pad a non-streaming JSON reply with spaces
``no_usage``           bool        never report usage
``echo``               bool        completion content = JSON of request body + headers
``framing``            string      stream line ends: ``lf`` (default), ``crlf``, ``cr``
``comments``           bool        stream: a keep-alive comment event before each
                                   event and a comment line inside it
``multiline``          bool        stream: each JSON document over several
                                   ``data:`` lines (cut after its commas)
``write_bytes``        int>=1      stream: write each event in pieces of this size,
                                   1 ms apart
``usage_shape``        string      stream: how the usage is sent, as ``vllm`` does
                                   (default: its own chunk, ``choices: []``),
                                   ``sglang`` (the same, ``"usage":null`` on every
                                   other chunk), ``llamacpp`` (usage and timings on
                                   the finish chunk), ``tgi`` (usage on the finish
                                   chunk) or ``litellm`` (its own chunk after the
                                   finish chunk, ``choices: [{index, delta: {}}]``)
``usage_details``      string      JSON reply: the usage object carries
                                   ``prompt_tokens_details`` ``first`` (before every
                                   count) or ``middle`` (between the prompt and the
                                   completion counts), as some servers order it
=====================  ==========  ==============================================

Unknown knob names and values of the wrong type are rejected (HTTP 400).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


class SimError(Exception):
    """An error reply: HTTP ``status`` with a vLLM-format body carrying ``message``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


@dataclass(frozen=True)
class Knobs:
    ttft_ms: float = 0.0
    first_event_ms: float = 0.0
    itl_ms: float = 0.0
    output_tokens: int = 16
    fail_after_chunks: int | None = None
    status: int | None = None
    message: str = "simulated error"
    quote_prompt: bool = False
    stall_ms: float = 0.0
    reply_bytes: int = 0
    no_usage: bool = False
    echo: bool = False
    framing: str = "lf"
    comments: bool = False
    multiline: bool = False
    write_bytes: int | None = None
    usage_shape: str = "vllm"
    usage_details: str = ""


_NUMBER = ("ttft_ms", "first_event_ms", "itl_ms", "stall_ms")
_CHOICES = {"framing": ("lf", "crlf", "cr"), "usage_shape": ("vllm", "sglang", "llamacpp", "tgi", "litellm"),
            "usage_details": ("first", "middle")}
# knob -> (what it must be, its check)
_RULES: dict[str, tuple[str, Callable[[Any], bool]]] = {
    **{n: ("a non-negative number", lambda v: is_number(v) and not v < 0) for n in _NUMBER},
    **{n: ("a non-negative integer", lambda v: is_int(v) and v >= 0)
       for n in ("output_tokens", "fail_after_chunks", "reply_bytes")},
    **{n: ("a boolean", lambda v: isinstance(v, bool))
       for n in ("quote_prompt", "no_usage", "echo", "comments", "multiline")},
    **{n: ("one of " + ", ".join(c), c.__contains__) for n, c in _CHOICES.items()},
    "status": ("an integer HTTP status in 400..599", lambda v: is_int(v) and 400 <= v <= 599),
    "write_bytes": ("a positive integer", lambda v: is_int(v) and v >= 1),
    "message": ("a string", lambda v: isinstance(v, str)),
}


def parse_knobs(raw: Any) -> Knobs:
    """Validate the ``sim`` member (``None`` → defaults); raises :class:`SimError`."""
    if raw is None:
        return Knobs()
    if not isinstance(raw, dict):
        raise SimError(400, "Invalid 'sim' member: expected an object.")
    values: dict[str, Any] = {}
    for name, value in raw.items():
        if name not in _RULES:
            raise SimError(400, f"Unknown sim knob '{name}'.")
        what, ok = _RULES[name]
        if not ok(value):
            raise SimError(400, f"Invalid sim knob '{name}': expected {what}, got {value!r}.")
        values[name] = float(value) if name in _NUMBER else value
    return Knobs(**values)
