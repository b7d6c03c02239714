"""A request's worst-case cost, held against its organisation's available balance at admission (README,
"Billing"), and the 402 that says what would fit when it is not.  Pure, integers only."""
from __future__ import annotations

from dataclasses import dataclass

from core.cost import Prices, cost_micro_pln, micro_to_pln
from core.errors import QUOTA_HELD, ApiError, key_limit_reached, over_balance, over_key_limit
from core.rules import Prepared

# The most one request holds: a request whose worst case is more (an n of millions) is refused wherever a
# credit limit applies, and the held totals stay far inside Redis's 64-bit integers and Lua's exact ones.
MAX_HOLD = 10**15


@dataclass(frozen=True, slots=True)
class WorstCase:
    """The most a request can cost: its estimated input and ``choices`` x ``max_tokens`` output tokens,
    at the prices in force (the interface's billing rule, each term rounded up).  Embeddings: ``max_tokens`` 0."""

    input_tokens: int
    choices: int
    max_tokens: int
    prices: Prices

    @property
    def cost(self) -> int:
        return min(MAX_HOLD, cost_micro_pln(self.input_tokens, self.choices * self.max_tokens, self.prices))

    def largest_max_tokens(self, available: int) -> int:
        """The largest max_tokens whose worst case fits ``available`` (0: not even 1).  Exact: the output
        term ceil(n x m x price / 1e6) fits a room R exactly when n x m x price <= R x 1e6."""
        room = available - cost_micro_pln(self.input_tokens, 0, self.prices)
        if room <= 0 or self.prices.output == 0:
            return 0
        return room * 1_000_000 // (self.choices * self.prices.output)

    def refusal(self, available: int) -> ApiError:
        """402 for a request whose worst case does not fit ``available`` (balance - holds + credit limit);
        it names amounts and max_tokens, never anything the request says."""
        if available <= 0:
            return QUOTA_HELD
        fits = None if self.max_tokens == 0 else self.largest_max_tokens(available)
        return over_balance(micro_to_pln(self.cost), micro_to_pln(available), fits, self.choices)

    def key_refusal(self, left: int, limit: int) -> ApiError:
        """402 for a request whose worst case does not fit what is ``left`` of its key's monthly ``limit``
        (the limit less this month's spend and the key's requests in flight); it names the key's limit."""
        if left <= 0:
            return key_limit_reached(limit)
        fits = None if self.max_tokens == 0 else self.largest_max_tokens(left)
        return over_key_limit(micro_to_pln(self.cost), micro_to_pln(left), limit, fits, self.choices)


def worst_case(p: Prepared, prices: Prices) -> WorstCase:
    return WorstCase(p.estimated_prompt_tokens, p.choices, p.max_tokens, prices)


