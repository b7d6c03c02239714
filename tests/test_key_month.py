"""A key's spend month (core/key_limits.month): the Warsaw calendar month of a moment, answered from the
bounds of the month asked last when the moment is within them; the same answer as a time-zone conversion
on both sides of every month's first midnight (winter and summer time), asked in any order."""
from __future__ import annotations

import datetime as dt
import random

from core.catalog import WARSAW
from core.key_limits import month


def _converted(t: float) -> str:
    return dt.datetime.fromtimestamp(t, WARSAW).strftime("%Y-%m")


def test_every_month_boundary_on_both_sides_forwards_and_backwards() -> None:
    moments = []
    for year in range(2024, 2029):
        for m in range(1, 13):
            first = dt.datetime(year, m, 1, tzinfo=WARSAW).timestamp()
            moments += [first - 0.001, first, first + 0.001, first + 15 * 86400]
    assert len(moments) == 240
    for t in moments + moments[::-1]:
        assert month(t) == _converted(t), dt.datetime.fromtimestamp(t, dt.timezone.utc).isoformat()
    # 23:30 UTC on 31 October 2025 is already November in Warsaw; an hour earlier it is still October
    nov = dt.datetime(2025, 10, 31, 23, 30, tzinfo=dt.timezone.utc).timestamp()
    assert (month(nov - 3600), month(nov), month(nov - 3600)) == ("2025-10", "2025-11", "2025-10")


def test_random_moments_in_any_order() -> None:
    rnd = random.Random(7)
    for _ in range(5000):
        t = rnd.uniform(1.6e9, 1.95e9)
        assert month(t) == _converted(t)
