"""The console end to end in a real headless browser (Debian's chromium driven by Playwright):
sign up, read the captured e-mail, confirm, see the trial balance, create a key, use it with the
openai SDK, watch the request appear on the usage page without reloading, top up through the
sandbox provider, invite a member who accepts -- in Polish, the default (a phone in English follows).
Screenshots of each page go to
tests/artifacts/console/ (the path is printed)."""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Iterator

import httpx
import openai
import pytest

from conftest import Gateway, wait_for
from test_console_support import PASSWORD, new_email

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parent / "artifacts" / "console"

if not os.access(CHROMIUM, os.X_OK):
    pytest.skip(f"browser tests did not run: {CHROMIUM} is missing (Debian's chromium package; `make test` "
                "installs it where apt-get is available)", allow_module_level=True)

sync_api = pytest.importorskip("playwright.sync_api", reason="browser tests did not run: playwright is not installed")


@pytest.fixture(scope="module")
def browser(request: pytest.FixtureRequest) -> Iterator[Any]:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"], headless=True)
        try:
            yield b
        finally:
            b.close()
    tr = request.config.pluginmanager.get_plugin("terminalreporter")
    if tr is not None:
        tr.write_line(f"console screenshots: {ARTIFACTS}")


def shot(page: Any, name: str) -> None:
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def captured_link(page: Any, console: str, to: str, path: str) -> str:
    """The link from the capture page, reloaded until the message is there (mail is sent off the
    request path)."""
    link = page.locator(f"a[href^='{console}{path}']").first

    def arrived() -> bool:
        page.goto(f"{console}/dev/mail?to={to}")
        return bool(link.count())
    wait_for(arrived, timeout=10, interval=0.2)
    return str(link.get_attribute("href"))


def test_the_whole_console_flow_in_a_browser(gateway: Gateway, browser: Any) -> None:
    expect = sync_api.expect
    con = gateway.console
    ctx = browser.new_context(viewport={"width": 1280, "height": 900}, locale="pl-PL")
    page = ctx.new_page()
    page.set_default_timeout(15_000)
    email = new_email()

    # sign up (in Polish: the default language)
    page.goto(con + "/signup")
    page.fill("input[name=email]", email)
    page.fill("input[name=password]", PASSWORD)
    page.fill("input[name=org]", "Kancelaria Nowak")
    shot(page, "01-signup")
    page.click("main button[type=submit]")
    assert page.locator("html").get_attribute("lang") == "pl"
    expect(page.locator(".message")).to_contain_text("Sprawdź pocztę")

    # read the captured e-mail, confirm
    link = captured_link(page, con, email, "/confirm/")
    shot(page, "02-captured-mail")
    page.goto(link)
    page.click("#confirm")
    expect(page.locator("#balance")).to_have_text("5,00\xa0zł")
    shot(page, "03-overview-trial-balance")

    # create a key; it is shown once
    page.goto(con + "/keys")
    page.fill("input[name=name]", "backend")
    page.click("form.row button[type=submit]")
    key = page.locator("#new-key").inner_text().strip()
    assert re.fullmatch(r"sk-service-[A-Za-z0-9]{40}", key)
    shot(page, "04-keys-new-key")

    # the usage page is open while the requests are made: they appear without a reload
    page.goto(con + "/usage")
    expect(page.locator("#count")).to_have_text("0")
    client = openai.OpenAI(base_url=gateway.v1, api_key=key, max_retries=0)
    rids = []
    for alias, text in (("polish-pro", "Dzień dobry!"), ("polish-fast", "Streść umowę"), ("advanced", "Policz 2+2")):
        raw = client.chat.completions.with_raw_response.create(model=alias, messages=[{"role": "user", "content": text}])
        assert raw.parse().model == alias
        rids.append(raw.headers["x-request-id"])
    for rid in rids:
        page.locator(f"tr[data-request='{rid}']").wait_for(timeout=10_000)
    expect(page.locator("#count")).to_have_text("3")
    expect(page.locator("svg.chart rect.bar")).to_have_count(1)
    shot(page, "05-usage")

    # top up through the sandbox provider
    page.goto(con + "/billing")
    before = page.locator("#balance").inner_text()
    page.fill("input[name=amount]", "50")
    page.click("#topup")
    expect(page.locator("h1")).to_have_text("Testowy operator płatności")
    shot(page, "06-sandbox-provider")
    page.click("#sandbox-pay")
    expect(page.locator("#payment-state")).to_contain_text("saldo zostało zasilone", timeout=15_000)
    after = page.locator("#balance").inner_text()
    assert _micro(after) == _micro(before) + 50_000_000
    shot(page, "07-billing")

    # invite a member, who accepts in another browser
    invitee = new_email()
    page.goto(con + "/members")
    page.fill("input[name=email]", invitee)
    page.click("#invite")
    expect(page.locator(".message")).to_contain_text("Zaproszenie zostało wysłane")
    shot(page, "08-members")
    link = captured_link(page, con, invitee, "/invite/")
    other = browser.new_context(viewport={"width": 1280, "height": 900}, locale="pl-PL")
    p2 = other.new_page()
    p2.goto(link)
    p2.fill("input[name=password]", PASSWORD)
    p2.click("#accept")
    expect(p2.locator(".message")).to_contain_text("Dołączono do organizacji")
    expect(p2.locator("header")).to_contain_text("członek")
    # the switch to English, on the page where it is clicked, and remembered
    p2.click("#lang-en")
    expect(p2.locator("header")).to_contain_text("member")
    assert p2.locator("html").get_attribute("lang") == "en"
    p2.goto(con + "/usage")
    expect(p2.locator("h1")).to_have_text("Usage")
    shot(p2, "09-member-overview")
    page.goto(con + "/members")
    expect(page.locator("#members")).to_contain_text(invitee)
    other.close()
    ctx.close()


def _micro(text: str) -> int:
    """A Polish amount as the page shows it ("1\xa0234,50\xa0zł") in micro-PLN."""
    whole, frac = text.replace("\xa0zł", "").replace("\xa0", "").split(",")
    return int(whole) * 1_000_000 + int(frac.ljust(6, "0"))


PAGES_SIGNED_IN = ["/", "/keys", "/usage", "/billing", "/members", "/docs/api"]
PAGES_SIGNED_OUT = ["/login", "/signup", "/reset", "/docs/api"]


def _sql(gateway: Gateway, query: str, *args: Any) -> list[dict[str, Any]]:
    """``gateway.sql`` from a thread of its own: Playwright's sync API keeps an event loop in this one."""
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(1) as ex:
        return ex.submit(gateway.sql, query, *args).result()


def _too_wide(page: Any, con: str, paths: list[str]) -> dict[str, int]:
    """The pages among ``paths`` wider than the screen: path -> the page's scroll width."""
    wide = {}
    for path in paths:
        page.goto(con + path)
        width = page.evaluate("document.documentElement.scrollWidth")
        if width > page.evaluate("window.innerWidth"):
            wide[path] = width
    return wide


def test_first_call_from_what_the_pages_show_on_a_phone(gateway: Gateway, browser: Any) -> None:
    """From sign-up to a first 200 at 390 px, using only what the pages show: the
    captured confirmation mail, the trial explained on Overview, the key page's curl snippet run as it is
    shown.  Revoking asks first.  Every page fits the screen, in both languages.  The phone asks for
    English (Accept-Language)."""
    import json
    import subprocess
    expect = sync_api.expect
    con = gateway.console
    ctx = browser.new_context(viewport={"width": 390, "height": 844}, locale="en-US")
    page = ctx.new_page()
    page.set_default_timeout(15_000)
    assert _too_wide(page, con, PAGES_SIGNED_OUT) == {}
    assert page.locator("html").get_attribute("lang") == "en"
    email = new_email()
    page.goto(con + "/signup")
    page.fill("input[name=email]", email)
    page.fill("input[name=password]", PASSWORD)
    page.fill("input[name=org]", "Piekarnia Kowalski")
    page.click("main button[type=submit]")
    page.goto(captured_link(page, con, email, "/confirm/"))
    page.click("#confirm")
    expect(page.locator("#trial")).to_contain_text("trial credit of PLN\xa05.00")
    assert page.locator("link[rel=icon]").get_attribute("href") == "/static/favicon.svg"
    assert page.request.get(con + "/static/favicon.svg").ok
    page.locator("#trial a[href='/keys']").click()
    page.fill("input[name=name]", "first")
    page.click("form.row button[type=submit]")
    key = page.locator("#new-key").inner_text().strip()
    curl = page.locator("#snippet-curl").inner_text()
    assert key in curl and key in page.locator("#snippet-python").inner_text()
    assert key in page.locator("#snippet-js").inner_text()
    shot(page, "10-first-call-390")
    out = subprocess.run(["bash", "-c", curl + " -sS -w '\\n%{http_code}'"], capture_output=True, text=True,
                         timeout=30)
    body, _, code = out.stdout.rpartition("\n")
    assert code == "200", (out.stdout, out.stderr)
    reply = json.loads(body)
    assert reply["object"] == "chat.completion" and reply["model"] in curl and reply["usage"]["prompt_tokens"] > 0
    assert page.locator("nav a[href='/docs/api']").count() == 1

    # revoking asks first: dismissed, nothing happens; accepted, the key is revoked
    page.goto(con + "/keys")
    asked: list[str] = []
    page.once("dialog", lambda d: (asked.append(d.message), d.dismiss()))
    page.click("form.revoke button")
    assert asked and "Revoke the key “first”" in asked[0]
    assert _sql(gateway, "SELECT revoked_at FROM api_keys WHERE name = 'first' AND created_by ="
                       " (SELECT id FROM users WHERE email = $1)", email)[0]["revoked_at"] is None
    page.once("dialog", lambda d: d.accept())
    page.click("form.revoke button")
    expect(page.locator(".message")).to_contain_text("The key is revoked")
    assert _too_wide(page, con, PAGES_SIGNED_IN) == {}
    page.click("#lang-pl")  # Polish texts are longer: the pages still fit
    assert page.locator("html").get_attribute("lang") == "pl"
    assert _too_wide(page, con, PAGES_SIGNED_IN + ["/changelog"]) == {}
    ctx.close()
    polish = browser.new_context(viewport={"width": 390, "height": 844}, locale="pl-PL").new_page()
    assert _too_wide(polish, con, PAGES_SIGNED_OUT) == {}
    assert polish.locator("html").get_attribute("lang") == "pl"
    polish.context.close()


PHONE_PAGES = ["/", "/keys", "/usage", "/billing", "/members", "/account/security", "/changelog", "/docs/api"]


def test_every_table_keeps_time_status_and_cost_in_view_on_a_phone(gateway: Gateway, browser: Any) -> None:
    """At 390 px, on every signed-in page, each table row is a card whose every cell (time, status and
    cost above all) lies inside the screen and inside its card, with its column's name beside it; the
    organisation has requests, a paid top-up with its invoice, a pending invitation and a key."""
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(1) as ex:  # Playwright's sync API keeps an event loop in this thread
        session = ex.submit(_phone_organisation, gateway).result()

    for lang in ("en", "pl"):
        ctx = browser.new_context(viewport={"width": 390, "height": 844})
        ctx.add_cookies([{"name": "gw_session", "value": session, "url": gateway.console},
                         {"name": "lang", "value": lang, "url": gateway.console}])
        page = ctx.new_page()
        page.set_default_timeout(15_000)
        kept: dict[str, set[str]] = {}
        for path in PHONE_PAGES:
            page.goto(gateway.console + path)
            assert page.evaluate("document.documentElement.scrollWidth") <= 390, (lang, path)
            out = page.evaluate("""() => {
              const bad = [], labels = [];
              for (const td of document.querySelectorAll('main table td')) {
                const cell = td.getBoundingClientRect(), card = td.closest('tr').getBoundingClientRect();
                if (cell.width === 0) continue;
                if (cell.left < 0 || cell.right > window.innerWidth || cell.left < card.left - 0.5
                    || cell.right > card.right + 0.5 || cell.top < card.top - 0.5 || cell.bottom > card.bottom + 0.5)
                  bad.push([td.dataset.label || td.textContent.slice(0, 30), cell.left, cell.right, card.left, card.right]);
                if (td.dataset.label) labels.push(td.dataset.label);
              }
              const heads = [...document.querySelectorAll('main table th')].filter(th => th.getBoundingClientRect().height > 0);
              return {bad, labels, heads: heads.length};
            }""")
            assert out["bad"] == [], (lang, path, out["bad"])
            assert out["heads"] == 0, (lang, path)  # the column's name is beside each value instead
            kept[path] = set(out["labels"])
        if lang == "en":  # the data the organisation has shows up, with the labels of the columns kept in view
            assert {"Time", "Status", "Cost"} <= kept["/"] and {"Time", "Status", "Cost"} <= kept["/usage"]
            assert {"Date", "Amount", "Issued", "Gross", "Started", "State"} <= kept["/billing"]
            assert {"Day", "Cost"} <= kept["/usage"] and "Created" in kept["/keys"] and "Expires" in kept["/members"]
        page.goto(gateway.console + "/usage")
        row = page.locator("#requests tr[data-request]").first
        box, card = row.locator("td.num").last.bounding_box(), row.bounding_box()
        assert box is not None and card is not None and 0 <= box["x"] and box["x"] + box["width"] <= 390
        assert card["x"] <= box["x"] and box["x"] + box["width"] <= card["x"] + card["width"]
        if lang == "en":
            shot(page, "40-usage-cards-390")
        ctx.close()


def _phone_organisation(gw: Gateway) -> str:
    """An organisation with two requests, a paid top-up with its invoice, a pending invitation and a
    key; its owner's session."""
    from test_console_billing import sandbox, start_topup
    from test_console_keys_usage import create_key
    from test_console_support import signed_up

    c, _, org = signed_up(gw, "Telefon sp. z o.o.")
    _, key = create_key(c, "phone key with a rather long name")
    for _ in range(2):
        r = httpx.post(gw.v1 + "/chat/completions", headers={"Authorization": f"Bearer {key}"}, timeout=30,
                       json={"model": "polish-pro", "messages": [{"role": "user", "content": "x"}]})
        assert r.status_code == 200
    c.get("/billing")
    assert c.post("/billing/details", {"name": "Telefon sp. z o.o.", "nip": "526-025-02-74",
                                       "address": "ul. Długa 1, 00-001 Warszawa"}).status_code == 303
    pid = start_topup(c, "12,34")
    r = httpx.post(gw.console + "/payments/notify/sandbox", json=sandbox(gw).notification(pid, 12_340_000, True))
    assert r.json() == {"status": "paid", "credited": True}
    c.get("/members")
    assert c.post("/members/invite", {"email": new_email(), "role": "billing"}).status_code == 303
    wait_for(lambda: len(gw.sql("SELECT 1 FROM usage_records WHERE org_id = $1", org)) == 2, timeout=10)
    return c.jar["gw_session"]
