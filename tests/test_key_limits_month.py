"""``key_limits.month``: the Warsaw calendar month of a moment, kept between calls, right at every edge
whatever moment was asked before."""
from __future__ import annotations

import datetime as dt

from core import key_limits
from core.catalog import WARSAW


def _slow(t: float) -> str:
    return dt.datetime.fromtimestamp(t, WARSAW).strftime("%Y-%m")


def test_the_month_at_every_edge_in_any_order() -> None:
    firsts = [dt.datetime(y, m, 1, tzinfo=WARSAW).timestamp() for y in (2025, 2026) for m in range(1, 13)]
    moments = [t + d for t in firsts for d in (-1.0, -1e-3, 0.0, 1e-3, 86400.0 * 14)]
    for order in (moments, moments[::-1], moments[::2] + moments[1::2]):
        for t in order:
            assert key_limits.month(t) == _slow(t), t
    # 23:30 UTC on 31 October 2025 is already November in Warsaw; 22:30 UTC still October
    oct_end = dt.datetime(2025, 10, 31, 22, 30, tzinfo=dt.timezone.utc).timestamp()
    assert [key_limits.month(t) for t in (oct_end + 3600, oct_end, oct_end + 3600)] == ["2025-11", "2025-10", "2025-11"]
