"""The billing rule (docs/interface.md section 4, cost computation) and the token estimator. Pure, integers only."""
from __future__ import annotations

import re
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


# The token estimator, for what a model server did not report (docs/interface.md section 4: such a request is billed
# estimated tokens and marked estimated).  Calibrated against four real tokenizers (GPT-4's cl100k_base,
# GPT-4o's o200k_base, Llama 3's and Qwen 3's) and the simulator's on Polish and English text
# (tests/test_estimator.py measures it; README, "Billing", states the error): English and other
# unaccented text runs at 4.6 characters per token, Polish at 2.8.  Which rate is told by the share of
# letters with diacritics (Latin, U+00C0-U+024F): none of the text at the Polish rate up to 1.5 % of its
# characters, all of it from 4 % (Polish prose has 4-15 %), in proportion between; so an English text
# with a curly quote, a dash or a Polish place name is not billed as Polish.  It leans low: over the
# corpus it is within a few per cent of the tokenizer that needs the fewest tokens (o200k_base) and up
# to 15 % below the others, never above them: an estimate that is off should cost the client less.
PER_1000_CHARS = 217  # tokens per 1000 characters: 1 per 4.6
PER_1000_CHARS_POLISH = 357  # 1 per 2.8
_DIACRITICS = re.compile("[\u00c0-\u024f]")
TOKENS_PER_MESSAGE = 4  # a chat message's framing (its role, its delimiters)
TOKENS_PER_CHAT = 3  # the framing that primes the reply


def estimate_text(text: str) -> int:
    """Estimated tokens of one text, rounded up (at least 1 for a non-empty text)."""
    chars = len(text)
    polish = 0  # the characters counted at the Polish rate
    if not text.isascii():  # O(1): an ASCII text (most English) is never scanned
        polish = min(max((200 * len(_DIACRITICS.findall(text)) - 3 * chars) // 5, 0), chars)
    return _ceil_div(PER_1000_CHARS * chars + (PER_1000_CHARS_POLISH - PER_1000_CHARS) * polish, 1000)


def _text_tokens(value: Any) -> int:
    if isinstance(value, str):
        return estimate_text(value)
    if isinstance(value, list):
        return sum(_text_tokens(v) for v in value)
    if isinstance(value, dict):
        # content parts: only text counts; an image part counts as nothing here
        return _text_tokens(value.get("text")) if value.get("type", "text") == "text" else 0
    return 0


def estimate_chat_prompt(messages: list[Any]) -> int:
    """Estimated prompt tokens of a chat request: its message texts, the framing of each message and the
    reply's priming (OpenAI's count for its chat models, and the simulator's)."""
    total = TOKENS_PER_CHAT
    for m in messages:
        if isinstance(m, dict):
            total += _text_tokens(m.get("content")) + TOKENS_PER_MESSAGE
    return total


def estimate_embedding_prompt(inputs: list[str]) -> int:
    return sum(estimate_text(s) for s in inputs)


def estimate_reply_completion(doc: Any) -> int:
    """Estimated completion tokens of a complete chat reply (its JSON, parsed) that reports no usage:
    the estimator over the text of each choice's message (its content and its tool calls' arguments)."""
    choices = doc.get("choices") if isinstance(doc, dict) else None
    total = 0
    for c in choices if isinstance(choices, list) else []:
        msg = c.get("message") if isinstance(c, dict) else None
        if not isinstance(msg, dict):
            continue
        total += _text_tokens(msg.get("content"))
        for call in msg.get("tool_calls") or []:
            fn = call.get("function") if isinstance(call, dict) else None
            if isinstance(fn, dict):
                total += _text_tokens(fn.get("arguments"))
    return total


def usage_json_tokens(usage: Any) -> tuple[int, int] | None:
    """(prompt, completion) from a Usage object, or None when it is not a valid one."""
    if not isinstance(usage, dict):
        return None
    p = usage.get("prompt_tokens")
    c = usage.get("completion_tokens")
    c = 0 if c is None else c
    # (a JSON true or false is no count, though Python's bool is an int)
    if type(p) is not int or type(c) is not int or p < 0 or c < 0:
        return None
    return p, c


def credit_limit(paid: bool, own: str, default: int | None) -> int | None:
    """How far below zero an organisation's balance may go (micro-PLN; None: no limit, the interface's rule alone),
    as the admission script decides it: 0 while its only money is the trial credit (``paid`` false), else
    its own limit ``own`` (micro-PLN, or "none"), else (``own`` "default") GATEWAY_CREDIT_LIMIT_PLN's."""
    if not paid:
        return 0
    if own == "none":
        return None
    return default if own == "default" else int(own)
