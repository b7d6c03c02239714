"""A key's own limits (docs/limits.md, "Key limits"): a monthly spending cap (a calendar month in
Europe/Warsaw), the aliases it may use, and an expiry date.  What the CLI and the console accept and how
months and days are counted; pure, no I/O.  The ext_proc enforces them in its admission script
(extproc/store.py) from the key's cache entry; PostgreSQL's ``api_keys`` holds them."""
from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from typing import Collection, Literal

from .catalog import WARSAW
from .cost import pln_to_micro

# An alias id as a key's allowed list holds it: no commas, no spaces (the list is stored comma-joined)
_ALIAS = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,127}")
NONE: Literal["none"] = "none"


# the month ``month`` named last: its first and its next month's first moment (epoch seconds), its name
_MONTH: tuple[float, float, str] = (0.0, 0.0, "")


def month(now: float) -> str:
    """The Warsaw calendar month of a moment, as "YYYY-MM" (the key's spend counter of that month).
    Asked on every admission: the month's bounds are kept, and its name is made again only outside them
    (a time zone's conversion and a strftime cost ~10 us)."""
    global _MONTH
    start, end, name = _MONTH
    if start <= now < end:
        return name
    first = month_start(now)
    _MONTH = (first.timestamp(), next_month_start(now).timestamp(), first.strftime("%Y-%m"))
    return _MONTH[2]


def month_start(now: float) -> dt.datetime:
    """00:00 Warsaw time on the first day of the month of ``now``."""
    d = dt.datetime.fromtimestamp(now, WARSAW)
    return dt.datetime(d.year, d.month, 1, tzinfo=WARSAW)


def next_month_start(now: float) -> dt.datetime:
    """00:00 Warsaw time on the first day of the month after that of ``now``."""
    d = month_start(now)
    return dt.datetime(d.year + d.month // 12, d.month % 12 + 1, 1, tzinfo=WARSAW)


def expiry_moment(day: dt.date) -> dt.datetime:
    """A key that expires on ``day`` works through that day (Warsaw time): it stops at the next midnight."""
    return dt.datetime(day.year, day.month, day.day, tzinfo=WARSAW) + dt.timedelta(days=1)


def expiry_day(moment: dt.datetime) -> dt.date:
    """The expiry date a stored moment stands for (``expiry_moment``'s inverse)."""
    return (moment.astimezone(WARSAW) - dt.timedelta(days=1)).date()


@dataclass(frozen=True, slots=True)
class Change:
    """What an owner or operator asked to change: None leaves a limit as it is, NONE lifts it."""

    monthly_limit: int | Literal["none"] | None = None  # micro-PLN
    models: tuple[str, ...] | Literal["none"] | None = None
    expires: dt.date | Literal["none"] | None = None

    @property
    def empty(self) -> bool:
        return self.monthly_limit is None and self.models is None and self.expires is None


def parse_monthly_limit(text: str) -> int | Literal["none"]:
    """"none", or an amount in PLN above 0 (ValueError otherwise)."""
    if text.strip().lower() == NONE:
        return NONE
    micro = pln_to_micro(text)
    if micro <= 0:
        raise ValueError("a monthly limit is more than 0 PLN (none: no limit)")
    return micro


def parse_models(text: str, known: Collection[str] | None = None) -> tuple[str, ...] | Literal["none"]:
    """"none", or aliases separated by commas (ValueError for an empty list, a malformed name, or, given
    ``known``, an alias not among them: a mistyped name would leave the key no model at all)."""
    if text.strip().lower() == NONE:
        return NONE
    names = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    if not names:
        raise ValueError("name at least one model alias (none: every model)")
    for n in names:
        if not _ALIAS.fullmatch(n):
            raise ValueError("a model alias is letters, digits and . _ : / @ + - (up to 128 characters)")
    unknown = [n for n in names if known is not None and n not in known]
    if unknown:
        has = ", ".join(sorted(known or ())) or "none"
        raise ValueError(f"no such model alias: {', '.join(unknown)} (the catalog has: {has})")
    return names


def parse_expires(text: str) -> dt.date | Literal["none"]:
    """"none", or a date YYYY-MM-DD (ValueError otherwise)."""
    if text.strip().lower() == NONE:
        return NONE
    try:
        return dt.date.fromisoformat(text.strip())
    except ValueError:
        raise ValueError("an expiry date is YYYY-MM-DD (none: never)") from None


def parse(monthly_limit: str | None, models: str | None, expires: str | None,
          known: Collection[str] | None = None) -> Change:
    """The three options as the CLI and the console take them (None: not given); ``known``: the catalog's
    aliases, the only ones a key may be allowed."""
    return Change(None if monthly_limit is None else parse_monthly_limit(monthly_limit),
                  None if models is None else parse_models(models, known),
                  None if expires is None else parse_expires(expires))
