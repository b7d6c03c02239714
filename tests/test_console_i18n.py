"""The console in Polish (default) and English: the catalogue is complete (every text of the templates
and the Python code has a Polish translation), the formats per language (``24,99 zł`` / ``PLN 24.99``,
Warsaw time with its zone), and over HTTP against the real stack: ``lang``, the switch and its memory,
the pages and e-mails in the chosen language."""
from __future__ import annotations

import datetime as dt
import re
from pathlib import Path

from babel.messages.extract import extract_from_dir
from babel.messages.frontend import parse_mapping_cfg
from babel.messages.pofile import read_po

from conftest import Gateway, wait_for
from control.console import i18n
from core.catalog import WARSAW
from test_console_billing import start_topup
from test_console_support import PASSWORD, ConsoleClient, mail_link, mails, new_email, signed_up

CONSOLE = Path(__file__).resolve().parent.parent / "control" / "console"
PO = CONSOLE / "locale" / "pl" / "LC_MESSAGES" / "messages.po"
NBSP = "\xa0"


def _extracted() -> set[str | tuple[str, ...]]:
    with (CONSOLE / "babel.cfg").open() as f:
        method_map, options_map = parse_mapping_cfg(f)
    return {msg[2] if isinstance(msg[2], str) else tuple(msg[2])
            for msg in extract_from_dir(str(CONSOLE), method_map, options_map)}


def test_the_polish_catalogue_translates_every_text() -> None:
    found = _extracted()
    assert len(found) > 250  # the extraction really read the templates and the code
    with PO.open("rb") as f:
        po = read_po(f)
    ids = {m.id if isinstance(m.id, str) else tuple(m.id): m for m in po if m.id}
    missing = sorted(map(str, found - ids.keys()))
    assert not missing, f"texts without a Polish translation (update messages.po): {missing}"
    obsolete = sorted(map(str, ids.keys() - found))
    assert not obsolete, f"translations of texts no longer used: {obsolete}"
    untranslated = [m.id for m in ids.values() if m.fuzzy or not all(m.string if isinstance(m.string, tuple)
                                                                         else (m.string,))]
    assert not untranslated, untranslated
    problems = [(m.id, [str(e) for e in errs]) for m, errs in po.check()]  # %(name)s placeholders kept
    assert not problems, problems
    for m in ids.values():  # {name} placeholders kept too
        for text in (m.string if isinstance(m.string, tuple) else (m.string,)):
            source = m.id if isinstance(m.id, str) else m.id[0]
            assert set(re.findall(r"\{\w+\}", text)) == set(re.findall(r"\{\w+\}", source)), m.id


def test_the_template_catalogue_is_current() -> None:
    with (CONSOLE / "locale" / "messages.pot").open("rb") as f:
        pot = {m.id if isinstance(m.id, str) else tuple(m.id) for m in read_po(f) if m.id}
    assert pot == _extracted()


def test_money_per_language() -> None:
    with i18n.speaking("pl"):
        assert i18n.money(24_990_000) == f"24,99{NBSP}zł"
        assert i18n.money(24_999_999) == f"24,99{NBSP}zł"  # rounded down: never more than there is
        assert i18n.money(1_234_500_000) == f"1{NBSP}234,50{NBSP}zł"
        assert i18n.money_exact(123) == f"0,000123{NBSP}zł"
        assert i18n.money_exact(24_999_053) == f"24,999053{NBSP}zł"
        assert i18n.money_exact(2_500_000) == f"2,500000{NBSP}zł"
    with i18n.speaking("en"):
        assert i18n.money(24_990_000) == f"PLN{NBSP}24.99"
        assert i18n.money(24_999_999) == f"PLN{NBSP}24.99"
        assert i18n.money(1_234_500_000) == f"PLN{NBSP}1,234.50"
        assert i18n.money_exact(24_999_053) == f"PLN{NBSP}24.999053"
    assert i18n.lang() == "pl"  # the default again outside


def test_times_are_warsaw_with_the_zone_and_dates_per_language() -> None:
    winter = dt.datetime(2026, 1, 5, 12, 0, tzinfo=dt.timezone.utc)
    summer = dt.datetime(2026, 7, 3, 22, 30, tzinfo=dt.timezone.utc)
    with i18n.speaking("pl"):
        assert i18n.when(winter) == "5 sty 2026, 13:00 CET"
        assert i18n.when(summer) == "4 lip 2026, 00:30 CEST"  # the next day in Warsaw
        assert i18n.when(int(summer.timestamp())) == "4 lip 2026, 00:30 CEST"
        assert i18n.day(dt.date(2026, 7, 3)) == "3 lip 2026"
        assert i18n.day(summer) == "4 lip 2026"
    with i18n.speaking("en"):
        assert i18n.when(winter) == "5 Jan 2026, 13:00 CET"  # British conventions: day first, 24 hours
        assert i18n.day(dt.date(2026, 7, 3)) == "3 Jul 2026"


def test_dates_are_typed_day_first_or_iso() -> None:
    assert i18n.parse_day("3.07.2026") == i18n.parse_day("03/07/2026") == i18n.parse_day("2026-07-03") \
        == dt.date(2026, 7, 3)
    for bad in ("2026-02-31", "31.02.2026", "07/2026", "tomorrow"):
        try:
            i18n.parse_day(bad)
        except ValueError:
            continue
        raise AssertionError(bad)
    with i18n.speaking("pl"):
        assert i18n.day_typed(dt.date(2026, 7, 3)) == "03.07.2026"
    with i18n.speaking("en"):
        assert i18n.day_typed(dt.date(2026, 7, 3)) == "03/07/2026"


def test_the_language_is_the_cookie_else_the_browser_else_polish() -> None:
    assert i18n.choose(None, None) == "pl"
    assert i18n.choose(None, "de-DE,de;q=0.9") == "pl"
    assert i18n.choose(None, "en-US,en;q=0.9") == "en"
    assert i18n.choose(None, "en;q=0.5,pl") == "pl"
    assert i18n.choose(None, "pl-PL,en;q=0.8") == "pl"
    assert i18n.choose("pl", "en-US") == "pl" and i18n.choose("en", "pl") == "en"
    assert i18n.choose("xx", "en") == "en"


# ---- over HTTP, against the real stack -----------------------------------------------------------

def test_a_first_visit_is_polish_and_the_switch_is_remembered(gateway: Gateway) -> None:
    c = ConsoleClient(gateway.console, lang=None)
    r = c.get("/login")
    assert r.status_code == 200 and '<html lang="pl">' in r.text
    assert "Zaloguj się" in r.text and "Nie pamiętasz hasła?" in r.text and "Forgot your password?" not in r.text
    en = ConsoleClient(gateway.console, lang=None)
    r = en.get("/login", headers={"Accept-Language": "en-GB,en;q=0.9"})
    assert '<html lang="en">' in r.text and "Forgot your password?" in r.text
    # the switch: a form on every page, back to the same page, remembered in a cookie for a year
    r = c.post("/lang", {"lang": "en", "next": "/signup?x=1"})
    assert r.status_code == 303 and r.headers["location"] == "/signup?x=1"
    cookie = next(h for h in c.raw_cookies if h.startswith("lang="))
    assert "max-age=31536000" in cookie.lower() and "samesite=lax" in cookie.lower()
    r = c.get("/signup")
    assert '<html lang="en">' in r.text and "Create an account" in r.text and 'value="pl"' in r.text
    r = c.get("/login", headers={"Accept-Language": "pl"})  # the choice beats the browser's
    assert '<html lang="en">' in r.text
    assert c.post("/lang", {"lang": "de", "next": "/"}).status_code == 400
    assert ConsoleClient(gateway.console).post("/lang", {"lang": "pl"}, csrf="x").status_code == 403
    assert c.post("/lang", {"lang": "pl", "next": "https://evil.example/"}).headers["location"] == "/"


def test_pages_and_mails_in_polish(gateway: Gateway) -> None:
    c, email, org_id = signed_up(gateway, lang="pl")
    confirm = [m for m in mails(gateway, email) if "/confirm/" in m["body"]][0]
    assert confirm["subject"] == "Potwierdź swój adres e-mail" and "Witamy!" in confirm["body"]
    assert gateway.sql("SELECT lang FROM users WHERE email = $1", email)[0]["lang"] == "pl"
    page = c.get("/").text
    assert '<html lang="pl">' in page and "Saldo" in page and "Przegląd" in page
    assert f'id="balance">5,00{NBSP}zł<' in page
    assert f"środki próbne w wysokości 5,00{NBSP}zł" in page
    billing = c.get("/billing").text
    assert "Doładuj" in billing and "Obowiązujące ceny" in billing and "Balance" not in billing
    # a ledger entry in Warsaw time with its zone, in Polish month names
    trial_at = gateway.sql("SELECT created_at FROM ledger WHERE org_id = $1", org_id)[0]["created_at"]
    with i18n.speaking("pl"):
        shown = i18n.when(trial_at)
    assert re.search(r"\d{1,2} [a-ząćęłńóśźż]{3} \d{4}, \d\d:\d\d CES?T", shown), shown
    assert shown in billing and "środki próbne" in billing
    # a validation message in Polish
    r = c.get("/usage?from=2026-03-05&to=2026-03-01")
    assert r.status_code == 400 and "Data „Od” jest późniejsza niż data „Do”." in r.text
    r = c.get("/usage?from=31.02.2026")
    assert r.status_code == 400 and "Data „Od” nie jest poprawną datą (DD.MM.RRRR)." in r.text
    # dates typed as Poles write them, shown back the same way (a Warsaw day)
    today = dt.datetime.now(WARSAW).date()
    r = c.get(f"/usage?from={today:%d.%m.%Y}&to={today:%-d.%m.%Y}")
    assert r.status_code == 200 and f'name="from" value="{today:%d.%m.%Y}"' in r.text
    assert 'placeholder="DD.MM.RRRR"' in r.text
    # a paid top-up: the mail (sent on the provider's notification, no page) in the owner's language
    pid = start_topup(c, "12,5")
    c.get(f"/sandbox/pay/{pid}")
    assert c.post(f"/sandbox/pay/{pid}", {"action": "pay"}).status_code == 303
    paid = wait_for(lambda: [m for m in mails(gateway, email) if m["subject"].startswith("Otrzymaliśmy")], timeout=15)
    assert paid[0]["subject"] == f"Otrzymaliśmy płatność: 12,50{NBSP}zł"
    assert f"kwota 12,50{NBSP}zł została dopisana" in paid[0]["body"] and "Faktura VAT FV/" in paid[0]["body"]


def test_pages_in_english_and_the_choice_stored_for_mails(gateway: Gateway) -> None:
    c, email, org_id = signed_up(gateway, lang="en")
    page = c.get("/").text
    assert '<html lang="en">' in page and f'id="balance">PLN{NBSP}5.00<' in page
    assert gateway.sql("SELECT lang FROM users WHERE email = $1", email)[0]["lang"] == "en"
    # a signed-in choice is stored on the account: the mails sent without a request follow it
    assert c.post("/lang", {"lang": "pl", "next": "/billing"}).status_code == 303
    assert gateway.sql("SELECT lang FROM users WHERE email = $1", email)[0]["lang"] == "pl"
    # a log-in from a browser that never chose: the account's language
    other = ConsoleClient(gateway.console, lang=None)
    other.get("/login")
    r = other.post("/login", {"email": email, "password": PASSWORD}, follow=True)
    assert r.status_code == 200 and '<html lang="pl">' in r.text and other.jar["lang"] == "pl"
    again = ConsoleClient(gateway.console, lang="en")  # a browser's own choice is kept
    again.get("/login")
    assert '<html lang="en">' in again.post("/login", {"email": email, "password": PASSWORD}, follow=True).text
    assert c.post("/billing/low-balance", {"threshold": "6,5"}).status_code == 303
    assert 'value="6,50"' in c.get("/billing").text
    wait_for(lambda: any(m["subject"].startswith("Niskie saldo") for m in mails(gateway, email)), timeout=15)
    mail = next(m for m in mails(gateway, email) if m["subject"].startswith("Niskie saldo"))
    assert f"wynosi 5,00{NBSP}zł, poniżej ustawionego progu 6,50{NBSP}zł" in mail["body"]


def test_an_invitation_mail_in_the_inviters_language(gateway: Gateway) -> None:
    c, _, _ = signed_up(gateway, lang="pl")
    guest = new_email()
    assert c.post("/members/invite", {"email": guest, "role": "member"}).status_code == 303
    link = mail_link(gateway, guest, "/invite/")
    mail = mails(gateway, guest)[0]
    assert mail["subject"].startswith("Zaproszenie do ") and "Przyjmij zaproszenie tutaj" in mail["body"]
    g = ConsoleClient(gateway.console, lang="en")
    assert "Create account and accept" in g.get(link).text
    g.post(link, {"password": PASSWORD}, follow=True)
    assert gateway.sql("SELECT lang FROM users WHERE email = $1", guest)[0]["lang"] == "en"
