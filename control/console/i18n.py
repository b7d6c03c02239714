"""The console's languages: Polish (default) and English.  The texts are English in the code and the
templates (gettext msgids); Polish comes from the catalogue ``locale/pl/LC_MESSAGES/messages.po``,
read and compiled in memory at start (no binary ``.mo`` in the repository).  The language of the
current request (or of the mail being written) is a context variable, so ``_()`` in Python and in the
templates needs no request at hand.  Money, dates and times are formatted per language with Babel:
``24,99 zł`` / ``PLN 24.99``, times in Europe/Warsaw with the zone shown.  English uses British conventions
(day first, 24-hour clock), as its spelling does.  Dates are typed day first in both ("03.07.2026",
"03/07/2026"); ISO dates are read too."""
from __future__ import annotations

import contextlib
import datetime as dt
import gettext as _gettext
import io
import re
from contextvars import ContextVar
from decimal import ROUND_FLOOR, Decimal
from pathlib import Path
from typing import Iterator

from babel import Locale
from babel.dates import format_date, format_datetime, format_skeleton
from babel.messages.mofile import write_mo
from babel.messages.pofile import read_po
from babel.numbers import format_currency
from babel.support import Translations

from core.catalog import WARSAW

LANGS = ("pl", "en")
DEFAULT = "pl"
LANG_COOKIE = "lang"
YEAR_S = 365 * 86400  # how long the choice is remembered
LOCALES = {"pl": "pl_PL", "en": "en_GB"}  # the formats of each language
CATALOGUES = Path(__file__).resolve().parent / "locale"
# The amount next to the code or symbol, never broken apart: "24,99 zł", "PLN 24.99".
_MONEY = {"pl": "#,##0.00\xa0¤", "en": "¤\xa0#,##0.00"}


def _load(lang: str) -> _gettext.NullTranslations:
    po = CATALOGUES / lang / "LC_MESSAGES" / "messages.po"
    if not po.exists():
        return _gettext.NullTranslations()  # English: the msgids themselves
    with po.open("rb") as f:
        catalog = read_po(f, locale=lang)
    mo = io.BytesIO()
    write_mo(mo, catalog)
    mo.seek(0)
    return Translations(mo)


TRANSLATIONS = {lang: _load(lang) for lang in LANGS}
_CURRENT: ContextVar[str] = ContextVar("console_lang", default=DEFAULT)


def lang() -> str:
    return _CURRENT.get()


def set_lang(value: str) -> None:
    """For the rest of this request's task (the middleware calls it first)."""
    _CURRENT.set(value if value in LANGS else DEFAULT)


@contextlib.contextmanager
def speaking(value: str | None) -> Iterator[None]:
    """Texts written inside are in ``value`` (a mail to someone whose language is stored)."""
    token = _CURRENT.set(value if value in LANGS else DEFAULT)
    try:
        yield
    finally:
        _CURRENT.reset(token)


def _(message: str) -> str:
    return TRANSLATIONS[lang()].gettext(message)


def ngettext(singular: str, plural: str, n: int) -> str:
    return TRANSLATIONS[lang()].ngettext(singular, plural, n)


def N_(message: str) -> str:
    """Marks a text for the catalogue; translated where it is shown."""
    return message


def choose(cookie: str | None, accept_language: str | None) -> str:
    """The ``lang`` cookie (the visitor's choice); else English only when the browser asks for it before
    Polish (``Accept-Language``); else Polish."""
    if cookie in LANGS:
        return str(cookie)
    wanted: list[tuple[float, str]] = []
    for i, part in enumerate((accept_language or "").split(",")[:20]):
        tag, _sep, q = part.strip().partition(";q=")
        try:
            weight = float(q) if q else 1.0
        except ValueError:
            continue
        wanted.append((-weight + i * 1e-6, tag.split("-")[0].strip().lower()))
    for _w, tag in sorted(wanted):
        if tag in LANGS:
            return tag
    return DEFAULT


# ---- formats -----------------------------------------------------------------------------------

def money(micro: int | None) -> str:
    """A balance or a top-up: two decimals, rounded down to the grosz (a balance shown is never more
    than there is)."""
    value = (Decimal(int(micro or 0)) / 1_000_000).quantize(Decimal("0.01"), rounding=ROUND_FLOOR)
    return format_currency(value, "PLN", format=_MONEY[lang()], locale=LOCALES[lang()], currency_digits=False)


def money_exact(micro: int | None) -> str:
    """A cost, a price or a ledger entry to the micro-PLN, nothing rounded: "0,000123 zł"."""
    value = Decimal(int(micro or 0)).scaleb(-6)
    return format_currency(value, "PLN", format=_MONEY[lang()].replace("0.00", "0.000000"),
                           locale=LOCALES[lang()], currency_digits=False)


def _moment(value: dt.datetime | int | float) -> dt.datetime:
    if isinstance(value, dt.datetime):
        return value if value.tzinfo else value.replace(tzinfo=dt.timezone.utc)
    return dt.datetime.fromtimestamp(value, dt.timezone.utc)


def when(value: dt.datetime | int | float | None) -> str:
    """A moment in Warsaw time, the zone shown: "3 lip 2026, 14:05 CEST" / "3 Jul 2026, 14:05 CEST"."""
    if value is None or value == "":
        return ""
    loc = Locale.parse(LOCALES[lang()])
    pattern = str(loc.datetime_formats["medium"]).replace("{1}", loc.date_formats["medium"].pattern) \
        .replace("{0}", loc.time_formats["short"].pattern)
    moment = _moment(value).astimezone(WARSAW)
    # the zone as Poland writes it in both languages (CLDR's English has "GMT+1" for it)
    return f"{format_datetime(moment, pattern, tzinfo=WARSAW, locale=loc)} {moment.strftime('%Z')}"


def day(value: dt.date | dt.datetime | None) -> str:
    """A calendar day (of a moment: its Warsaw day) in the language's format: "3 lip 2026" / "3 Jul 2026"."""
    if isinstance(value, dt.datetime):
        value = _moment(value).astimezone(WARSAW).date()
    return format_date(value, "medium", locale=LOCALES[lang()]) if value else ""


def day_short(value: dt.date) -> str:
    """A chart's tick: "3.07" / "03/07"."""
    return format_skeleton("Md", dt.datetime.combine(value, dt.time()), locale=LOCALES[lang()])


DATE_HINT = N_("DD/MM/YYYY")  # how a date is typed (Polish: DD.MM.RRRR)
_TYPED = re.compile(r"(\d{1,2})[./-](\d{1,2})[./-](\d{4})")


def day_typed(value: dt.date | None) -> str:
    """A date as a form shows it for typing: "03.07.2026" / "03/07/2026"."""
    return value.strftime("%d.%m.%Y" if lang() == "pl" else "%d/%m/%Y") if value else ""


def parse_day(text: str) -> dt.date:
    """A typed date, day first ("3.07.2026", "03/07/2026") or ISO ("2026-07-03"); ValueError if none."""
    text = text.strip()
    m = _TYPED.fullmatch(text)
    if m:
        return dt.date(int(m.group(3)), int(m.group(2)), int(m.group(1)))
    return dt.date.fromisoformat(text)
