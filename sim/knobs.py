"""Parsing of the optional ``"sim"`` request member (simulation knobs).

Recognised knobs (all optional):

=====================  ==========  ==============================================
knob                   type        effect
=====================  ==========  ==============================================
``ttft_ms``            number>=0   delay before the response headers
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
``write_bytes``        int>=1      stream: write each event in pieces of this size
``usage_shape``        string      stream: how the usage is sent, as ``vllm`` does
                                   (default: its own chunk, ``choices: []``),
                                   ``sglang`` (the same, ``"usage":null`` on every
                                   other chunk), ``llamacpp`` (usage and timings on
                                   the finish chunk), ``tgi`` (usage on the finish
                                   chunk) or ``litellm`` (its own chunk after the
                                   finish chunk, ``choices: [{index, delta: {}}]``)
=====================  ==========  ==============================================

Unknown knob names and values of the wrong type are rejected (HTTP 400).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .errors import SimError

DEFAULT_OUTPUT_TOKENS = 16


@dataclass(frozen=True)
class Knobs:
    ttft_ms: float = 0.0
    itl_ms: float = 0.0
    output_tokens: int = DEFAULT_OUTPUT_TOKENS
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


_NUMBER = ("ttft_ms", "itl_ms", "stall_ms")
_INT = ("output_tokens", "fail_after_chunks", "reply_bytes")
_BOOL = ("quote_prompt", "no_usage", "echo", "comments", "multiline")
_CHOICES = {"framing": ("lf", "crlf", "cr"), "usage_shape": ("vllm", "sglang", "llamacpp", "tgi", "litellm")}


def _bad(name: str, what: str, value: Any) -> SimError:
    return SimError(400, f"Invalid sim knob '{name}': expected {what}, got {value!r}.")


def parse_knobs(raw: Any) -> Knobs:
    """Validate the ``sim`` member (``None`` → defaults); raises :class:`SimError`."""
    if raw is None:
        return Knobs()
    if not isinstance(raw, dict):
        raise SimError(400, "Invalid 'sim' member: expected an object.")
    values: dict[str, Any] = {}
    for name, value in raw.items():
        if name in _NUMBER:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise _bad(name, "a non-negative number", value)
            values[name] = float(value)
        elif name in _INT:
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise _bad(name, "a non-negative integer", value)
            values[name] = value
        elif name in _BOOL:
            if not isinstance(value, bool):
                raise _bad(name, "a boolean", value)
            values[name] = value
        elif name == "status":
            if isinstance(value, bool) or not isinstance(value, int) or not 400 <= value <= 599:
                raise _bad(name, "an integer HTTP status in 400..599", value)
            values[name] = value
        elif name in _CHOICES:
            if value not in _CHOICES[name]:
                raise _bad(name, "one of " + ", ".join(_CHOICES[name]), value)
            values[name] = value
        elif name == "write_bytes":
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise _bad(name, "a positive integer", value)
            values[name] = value
        elif name == "message":
            if not isinstance(value, str):
                raise _bad(name, "a string", value)
            values[name] = value
        else:
            raise SimError(400, f"Unknown sim knob '{name}'.")
    return Knobs(**values)
