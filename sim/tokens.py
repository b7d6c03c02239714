"""Deterministic token counting, text generation and embedding vectors.

Token counting rule (the simulator's "tokenizer")::

    count_tokens(text) = len(re.findall(r"\\w+|[^\\w\\s]", text))

i.e. every run of word characters is one token and every other non-space
character is one token on its own; whitespace is free.

* Chat prompt tokens = sum over messages of
  ``3 + count_tokens(role) + count_tokens(text of content)``, plus 3.
  ``content`` may be a string, ``null`` or an array of parts; only the
  ``text`` member of parts of type ``text`` is counted.
* Embedding prompt tokens = sum of ``count_tokens`` over the input strings,
  or the length of each pre-tokenized (integer array) input.

Generated text cycles through a fixed list of Polish words; every word is
exactly one token (words after the first carry a leading space), and the
starting point in the list depends only on ``(model, choice index)``.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import random
import re
import struct
from typing import Any

_TOKEN_RE = re.compile(r"\w+|[^\w\s]")

WORDS: tuple[str, ...] = (
    "Dzień", "dobry", ",", "jak", "mogę", "pomóc", "?",
    "Chętnie", "odpowiem", "na", "każde", "pytanie", ".",
    "To", "jest", "symulowana", "odpowiedź", "modelu", "!",
)

EMBEDDING_DIM = 1024


def count_tokens(text: str) -> int:
    """Number of simulated tokens in ``text`` (see module docstring)."""
    return len(_TOKEN_RE.findall(text))


def content_text(content: Any) -> str:
    """Concatenated text of a chat message ``content`` (string, null or parts)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(p["text"] for p in content
                        if isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str))
    return ""


def chat_prompt_tokens(messages: list[dict[str, Any]]) -> int:
    """Prompt tokens of a (validated) chat ``messages`` array."""
    total = 3
    for msg in messages:
        role = msg.get("role")
        total += 3 + count_tokens(role if isinstance(role, str) else "")
        total += count_tokens(content_text(msg.get("content")))
    return total


def generate_tokens(model: str, index: int, count: int) -> list[str]:
    """``count`` deterministic tokens for choice ``index`` of ``model``."""
    digest = hashlib.sha256(f"{model}\x00{index}".encode("utf-8")).digest()
    start = int.from_bytes(digest[:8], "big") % len(WORDS)
    return [("" if i == 0 else " ") + WORDS[(start + i) % len(WORDS)] for i in range(count)]


def apply_stop(tokens: list[str], stops: list[str]) -> tuple[list[str], bool]:
    """Cut ``tokens`` before the earliest occurrence of any stop string.

    Returns the emitted pieces (a token cut in the middle is emitted as its
    prefix, when non-empty) and whether a stop string was hit.
    """
    text = "".join(tokens)
    found = [pos for pos in (text.find(s) for s in stops if s) if pos != -1]
    if not found:
        return tokens, False
    cut = min(found)
    pieces: list[str] = []
    used = 0
    for tok in tokens:
        if used >= cut:
            break
        pieces.append(tok[: cut - used])
        used += len(tok)
    return pieces, True


def unit(vec: list[float]) -> list[float]:
    """``vec`` scaled to length 1."""
    norm = math.sqrt(sum(v * v for v in vec)) or 1.0
    return [v / norm for v in vec]


def embedding_vector(item: str | list[int]) -> list[float]:
    """Deterministic unit-length vector of ``EMBEDDING_DIM`` floats for one input."""
    key = "s:" + item if isinstance(item, str) else "t:" + json.dumps(item, separators=(",", ":"))
    rng = random.Random(int.from_bytes(hashlib.sha256(key.encode("utf-8")).digest(), "big"))
    return unit([rng.gauss(0.0, 1.0) for _ in range(EMBEDDING_DIM)])


def pack_base64(vec: list[float]) -> str:
    """Base64 of the little-endian float32 representation (vLLM's base64 format)."""
    return base64.b64encode(struct.pack(f"<{len(vec)}f", *vec)).decode("ascii")
