"""extproc/hold.py alone: a request's worst-case cost, the largest max_tokens an available balance allows
(exact against the interface's billing rule) and the 402 that says so; the credit limit as the admission script
decides it."""
from __future__ import annotations

import pytest

from core.cost import Prices, cost_micro_pln
from core.cost import credit_limit
from extproc.hold import MAX_HOLD, WorstCase

ADVANCED = Prices(4_000_000, 8_000_000)  # micro-PLN per 1M tokens (the demo catalog's "advanced")


def test_the_worst_case_is_the_billing_rule_on_n_times_max_tokens() -> None:
    w = WorstCase(input_tokens=9, choices=500, max_tokens=4096, prices=ADVANCED)
    # 2,048,000 output tokens at 8 PLN per 1M: 16.384 PLN, and the 9 input tokens' 36 micro-PLN
    assert w.cost == 36 + 16_384_000 == cost_micro_pln(9, 500 * 4096, ADVANCED)
    assert WorstCase(9, 1, 0, Prices(200_000, 0)).cost == 2  # embeddings: the input, rounded up
    assert WorstCase(1, 10**12, 10**6, ADVANCED).cost == MAX_HOLD


@pytest.mark.parametrize("available", [1, 36, 37, 44, 45, 10_000, 16_383_999, 16_384_036, 98_765_432])
@pytest.mark.parametrize("choices", [1, 3, 500])
def test_the_largest_max_tokens_is_exact(available: int, choices: int) -> None:
    """It fits, and one more token does not (each term of the cost rounded up on its own)."""
    w = WorstCase(9, choices, 4096, ADVANCED)
    m = w.largest_max_tokens(available)
    if m:
        assert cost_micro_pln(9, choices * m, ADVANCED) <= available
    assert cost_micro_pln(9, choices * (m + 1), ADVANCED) > available
    assert m >= 0


def test_the_refusal_says_what_would_fit_and_nothing_of_the_request() -> None:
    w = WorstCase(9, 500, 4096, ADVANCED)
    e = w.refusal(10_000)
    assert (e.status, e.code, e.type, e.param) == (402, "insufficient_quota", "insufficient_quota", None)
    assert e.message == ("This request could cost up to 16.384036 PLN, more than the organisation's available "
                         "balance of 0.010000 PLN; the largest max_tokens it allows with n = 500 is 2. Ask for "
                         "fewer tokens, or top up to continue.")
    assert cost_micro_pln(9, 500 * 2, ADVANCED) <= 10_000 < cost_micro_pln(9, 500 * 3, ADVANCED)
    one = WorstCase(9, 1, 4096, ADVANCED).refusal(10_000)
    assert one.message.endswith("the largest max_tokens it allows is 1245. Ask for fewer tokens, or top up to continue.")
    assert "even with max_tokens 1" in WorstCase(9, 500, 4096, ADVANCED).refusal(3_000).message
    assert "even with max_tokens 1" in WorstCase(9, 1, 10, ADVANCED).refusal(36).message  # the input alone
    emb = WorstCase(50_000, 1, 0, Prices(200_000, 0)).refusal(5)
    assert emb.message == ("This request could cost up to 0.010000 PLN, more than the organisation's available "
                           "balance of 0.000005 PLN; send less input, or top up to continue.")
    held = w.refusal(0)
    assert held.code == "insufficient_quota" and "requests in flight" in held.message
    assert w.refusal(-5).message == held.message


def test_the_credit_limit_in_force() -> None:
    assert credit_limit(False, "none", 5) == 0  # the trial credit only: never below zero
    assert credit_limit(False, "7", None) == 0
    assert credit_limit(True, "default", None) is None  # paid, no limit anywhere: the interface's rule alone
    assert credit_limit(True, "default", 2_000_000) == 2_000_000
    assert credit_limit(True, "500", 2_000_000) == 500  # its own wins
    assert credit_limit(True, "none", 2_000_000) is None
