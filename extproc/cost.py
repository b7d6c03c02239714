"""The billing rule (SPEC section 4, cost computation) and the token estimator. Pure, integers only."""
from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any


@dataclass(frozen=True, slots=True)
class Prices:
    """micro-PLN per 1 000 000 tokens."""

    input: int
    output: int


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


MAX_PLN = 10**12  # far beyond any balance (a bigint of micro-PLN holds 9.2e12 PLN)


def pln_to_micro(pln: str | int | Decimal) -> int:
    """An amount in PLN ("12.50", 3) in micro-PLN; ValueError when it is not one, or is finer than 1 micro-PLN."""
    try:
        d = Decimal(str(pln).strip())
    except InvalidOperation:
        raise ValueError(f"not an amount in PLN: {str(pln)!r}") from None
    # Infinity, NaN and sNaN are Decimals too; 1e999999999 one whose product overflows (copy_abs does
    # not round, so it cannot), 1e-999999999 one whose product underflows to 0
    if not d.is_finite():
        raise ValueError(f"not an amount in PLN: {str(pln)!r}")
    if d.copy_abs() > MAX_PLN:
        raise ValueError(f"an amount in PLN is at most {MAX_PLN} either way")
    if d and d.adjusted() < -6:
        raise ValueError("amounts have at most 6 decimal places (1 micro-PLN)")
    micro = d * 1_000_000
    if micro != micro.to_integral_value():
        raise ValueError("amounts have at most 6 decimal places (1 micro-PLN)")
    return int(micro)


def micro_to_pln(micro: int) -> str:
    """micro-PLN as PLN with all six decimals: 1500 -> "0.001500"."""
    whole, fraction = divmod(abs(micro), 1_000_000)
    return f"{'-' if micro < 0 else ''}{whole}.{fraction:06d}"


def cost_micro_pln(prompt_tokens: int, completion_tokens: int, prices: Prices) -> int:
    """ceil(prompt x input / 1e6) + ceil(completion x output / 1e6), each term rounded up alone."""
    return _ceil_div(prompt_tokens * prices.input, 1_000_000) + _ceil_div(completion_tokens * prices.output, 1_000_000)


def estimate_tokens(text_bytes: int) -> int:
    """The one estimator: 1 token per 4 UTF-8 bytes of text, rounded up (at least 1 for non-empty text)."""
    return _ceil_div(text_bytes, 4)


def _text_bytes(value: Any) -> int:
    if isinstance(value, str):
        return len(value.encode())
    if isinstance(value, list):
        return sum(_text_bytes(v) for v in value)
    if isinstance(value, dict):
        # content parts: only text counts; an image part counts as nothing here
        return _text_bytes(value.get("text")) if value.get("type", "text") == "text" else 0
    return 0


def estimate_chat_prompt(messages: list[Any]) -> int:
    """Estimated prompt tokens of a chat request: its message texts, plus 4 tokens of framing per message."""
    total = 0
    for m in messages:
        if isinstance(m, dict):
            total += estimate_tokens(_text_bytes(m.get("content"))) + 4
    return total


def estimate_embedding_prompt(inputs: list[str]) -> int:
    return sum(estimate_tokens(len(s.encode())) for s in inputs)


def estimate_reply_completion(doc: Any) -> int:
    """Estimated completion tokens of a complete chat reply (its JSON, parsed) that reports no usage:
    the estimator over the text of each choice's message (its content and its tool calls' arguments)."""
    choices = doc.get("choices") if isinstance(doc, dict) else None
    total = 0
    for c in choices if isinstance(choices, list) else []:
        msg = c.get("message") if isinstance(c, dict) else None
        if not isinstance(msg, dict):
            continue
        text = _text_bytes(msg.get("content"))
        for call in msg.get("tool_calls") or []:
            fn = call.get("function") if isinstance(call, dict) else None
            if isinstance(fn, dict):
                text += _text_bytes(fn.get("arguments"))
        total += estimate_tokens(text)
    return total


def usage_json_tokens(usage: Any) -> tuple[int, int] | None:
    """(prompt, completion) from a Usage object, or None when it is not a valid one."""
    if not isinstance(usage, dict):
        return None
    p = usage.get("prompt_tokens")
    c = usage.get("completion_tokens", 0) or 0
    if not isinstance(p, int) or not isinstance(c, int) or p < 0 or c < 0:
        return None
    return p, c
