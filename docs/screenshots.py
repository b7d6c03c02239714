"""Screenshots of the console in both languages at both widths: docs/screenshots/{pl,en}-{1280,390}-<page>.png.

    .venv/bin/python docs/screenshots.py        (make screenshots; needs /usr/bin/chromium: make browser)

Starts a stack of its own (as the tests do, development mode), signs up an organisation over HTTP, makes a few
requests with two keys, tops up 50 zł through the sandbox provider, then photographs each page with
Chromium for each language (the ``lang`` cookie) and width.  The PNGs are reduced to a 64-colour palette
to stay small in the repository."""
from __future__ import annotations

import sys
from pathlib import Path

import httpx
from PIL import Image
from playwright.sync_api import sync_playwright

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT)]

from conftest import Gateway, running_stack, wait_for  # noqa: E402
from test_console_support import ConsoleClient, signed_up  # noqa: E402

OUT = ROOT / "docs" / "screenshots"
PAGES = {"login": "/login", "overview": "/", "keys": "/keys", "usage": "/usage", "billing": "/billing"}
WIDTHS = {1280: 900, 390: 844}
BROWSER_LOCALE = {"pl": "pl-PL", "en": "en-GB"}


def _populate(gw: Gateway) -> ConsoleClient:
    """An organisation with two keys, a few requests and a paid top-up; its owner's session."""
    c, _, org = signed_up(gw, "Kancelaria Nowak sp. k.", lang="pl")
    for name, calls in (("produkcja", (("polish-pro", 3), ("polish-fast", 2))), ("testy", (("advanced", 1),))):
        c.get("/keys")
        key = c.post("/keys", {"name": name}).text.split('id="new-key">', 1)[1].split("<", 1)[0]
        for alias, n in calls:
            for _ in range(n):
                r = httpx.post(gw.v1 + "/chat/completions", headers={"Authorization": f"Bearer {key}"}, timeout=30,
                               json={"model": alias, "messages": [{"role": "user", "content": "Dzień dobry!"}]})
                r.raise_for_status()
    c.get("/billing")
    c.post("/billing/details", {"name": "Kancelaria Nowak sp. k.", "nip": "PL5260250274",
                                "address": "ul. Długa 1, 00-001 Warszawa"})
    pay = c.post("/billing/topup", {"amount": "50"}).headers["location"].split("/sandbox/pay/", 1)[1]
    c.get(f"/sandbox/pay/{pay}")
    c.post(f"/sandbox/pay/{pay}", {"action": "pay"})
    wait_for(lambda: gw.sql("SELECT 1 FROM payments WHERE id = $1 AND status = 'paid'", pay), timeout=15)
    wait_for(lambda: len(gw.sql("SELECT 1 FROM usage_records WHERE org_id = $1", org)) == 6, timeout=15)
    return c


def _small(path: Path) -> None:
    Image.open(path).convert("RGB").quantize(64).save(path, optimize=True)


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    with running_stack("gw-shots-") as gw:
        session = _populate(gw).jar["gw_session"]
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
            for lang in ("pl", "en"):
                for width, height in WIDTHS.items():
                    # the browser's own language too: <input type="date"> shows its format (dd.mm.rrrr)
                    ctx = browser.new_context(viewport={"width": width, "height": height}, locale=BROWSER_LOCALE[lang])
                    ctx.add_cookies([{"name": "lang", "value": lang, "url": gw.console}])
                    page = ctx.new_page()
                    for name, path in PAGES.items():
                        if name == "overview":  # signed in from here on
                            ctx.add_cookies([{"name": "gw_session", "value": session, "url": gw.console}])
                        page.goto(gw.console + path)
                        shot = OUT / f"{lang}-{width}-{name}.png"
                        page.screenshot(path=str(shot), full_page=True)
                        _small(shot)
                        print(shot.relative_to(ROOT), shot.stat().st_size // 1024, "KiB")
                    ctx.close()
            browser.close()


if __name__ == "__main__":
    main()
