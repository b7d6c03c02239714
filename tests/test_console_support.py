"""Helpers of the console tests (a cookie-keeping HTTP client, sign-up and e-mail flows), and the
checks of what every console answer carries: security headers and cookie flags."""
from __future__ import annotations

import re
import secrets
from http.cookies import SimpleCookie
from typing import Any
from urllib.parse import urljoin, urlparse

import httpx
import redis

from conftest import Gateway, wait_for
from control.console.limits import Limit

PASSWORD = "correct horse battery"
_CSRF = re.compile(r'name="csrf" value="([0-9a-f]+)"')
_FORM_ID = re.compile(r'name="form_id" value="([^"]+)"')


class ConsoleClient:
    """A browser-like client: keeps the console's cookies itself (they are ``Secure``, which
    http.cookiejar never sends over plain http to 127.0.0.1) and the last page's CSRF token.
    ``lang``: the language cookie it starts with ("en": the texts most tests read; None: none, as a
    first visit)."""

    def __init__(self, base: str, address: str | None = None, lang: str | None = "en") -> None:
        self.base = base
        # Each client comes from an address of its own (all of 127.0.0.0/8 is loopback): the
        # console's per-address limits then count each test's client apart, as for real clients.
        self.address = address or loopback_address()
        self.http = httpx.Client(base_url=base, follow_redirects=False, timeout=30,
                                 transport=httpx.HTTPTransport(local_address=self.address))
        self.jar: dict[str, str] = {"lang": lang} if lang else {}
        self.raw_cookies: list[str] = []
        self.csrf = ""
        self.form_id = ""
        self.last: httpx.Response | None = None

    def close(self) -> None:
        self.http.close()

    def _send(self, method: str, path: str, **kw: Any) -> httpx.Response:
        headers = dict(kw.pop("headers", {}) or {})
        if self.jar:
            headers["Cookie"] = "; ".join(f"{k}={v}" for k, v in self.jar.items())
        r = self.http.request(method, path, headers=headers, **kw)
        self.http.cookies.clear()
        for h in r.headers.get_list("set-cookie"):
            self.raw_cookies.append(h)
            c: SimpleCookie = SimpleCookie()
            c.load(h)
            for k, m in c.items():
                if m["max-age"] == "0" or "1970" in m["expires"]:
                    self.jar.pop(k, None)
                else:
                    self.jar[k] = m.value
        m = _CSRF.search(r.text) if r.headers.get("content-type", "").startswith("text/html") else None
        if m:
            self.csrf = m.group(1)
        f = _FORM_ID.search(r.text) if r.headers.get("content-type", "").startswith("text/html") else None
        if f:
            self.form_id = f.group(1)  # the key form's one-time id, sent as a browser would
        self.last = r
        return r

    def _follow(self, r: httpx.Response) -> httpx.Response:
        for _ in range(10):
            if r.status_code not in (301, 302, 303, 307, 308):
                return r
            loc = urljoin(str(r.request.url), r.headers["location"])
            if not loc.startswith(self.base):
                return r  # leaves the console (a payment provider)
            r = self._send("GET", loc[len(self.base):] or "/")
        return r

    def get(self, path: str, follow: bool = True, **kw: Any) -> httpx.Response:
        r = self._send("GET", path, **kw)
        return self._follow(r) if follow else r

    def post(self, path: str, data: dict[str, str] | None = None, follow: bool = False,
             csrf: str | None = None) -> httpx.Response:
        d = dict(data or {})
        d.setdefault("csrf", self.csrf if csrf is None else csrf)
        if path == "/keys" and self.form_id:
            d.setdefault("form_id", self.form_id)
        r = self._send("POST", path, data=d)
        return self._follow(r) if follow else r

    @property
    def logged_in(self) -> bool:
        return "gw_session" in self.jar


def loopback_address() -> str:
    return f"127.{secrets.randbelow(256)}.{secrets.randbelow(256)}.{secrets.randbelow(253) + 2}"


def mails(gw: Gateway, to: str) -> list[dict[str, Any]]:
    return list(httpx.get(gw.console + "/dev/mail.json", params={"to": to}).json())


def mail_link(gw: Gateway, to: str, path: str, count: int = 1) -> str:
    """The console path of the newest link to ``path`` in the ``count``-th message to ``to``."""
    def find() -> str | None:
        msgs = [m for m in mails(gw, to) if gw.console + path in m["body"]]
        if len(msgs) < count:
            return None
        m = re.search(re.escape(gw.console) + r"(" + re.escape(path) + r"[A-Za-z0-9_\-]+)", msgs[0]["body"])
        return m.group(1) if m else None
    return str(wait_for(find, timeout=10))


def clear_limit(gw: Gateway, limit: Limit, subject: str) -> None:
    r = redis.Redis.from_url(gw.stack.redis_url)
    try:
        r.delete(limit.key(subject))
    finally:
        r.close()


def new_email() -> str:
    return f"user-{secrets.token_hex(5)}@example.com"


def signed_up(gw: Gateway, org: str = "Acme sp. z o.o.", lang: str = "en") -> tuple[ConsoleClient, str, str]:
    """A confirmed, logged-in account (signed up in ``lang``): (client, e-mail, organisation id)."""
    c = ConsoleClient(gw.console, lang=lang)
    email = new_email()
    c.get("/signup")
    r = c.post("/signup", {"email": email, "password": PASSWORD, "org": org})
    assert r.status_code == 303, r.text
    link = mail_link(gw, email, "/confirm/")
    assert c.get(link).status_code == 200
    r = c.post(link, follow=True)
    assert r.status_code == 200 and c.logged_in, r.text
    org_id = gw.sql("SELECT m.org_id FROM memberships m JOIN users u ON u.id = m.user_id WHERE u.email = $1",
                    email)[0]["org_id"]
    return c, email, org_id


# ---- what every answer carries -------------------------------------------------------------------

def test_security_headers_on_every_kind_of_answer(gateway: Gateway) -> None:
    c = ConsoleClient(gateway.console)
    for path, status in (("/login", 200), ("/keys", 303), ("/nope", 404), ("/static/console.css", 200)):
        r = c.get(path, follow=False)
        assert r.status_code == status, path
        csp = r.headers["content-security-policy"]
        assert "default-src 'self'" in csp and "frame-ancestors 'none'" in csp and "script-src 'self'" in csp
        assert r.headers["x-content-type-options"] == "nosniff"
        assert r.headers["x-frame-options"] == "DENY"
        assert r.headers["referrer-policy"] == "no-referrer"
    assert c.get("/login").headers["cache-control"] == "no-store"


def test_cookies_are_secure_httponly_samesite(gateway: Gateway) -> None:
    c, _, _ = signed_up(gateway)
    session = [h for h in c.raw_cookies if h.startswith("gw_session=")]
    anon = [h for h in c.raw_cookies if h.startswith("gw_anon=")]
    assert session and anon
    for h in session + anon:
        flags = {p.strip().split("=")[0].lower() for p in h.split(";")[1:]}
        assert {"secure", "httponly", "samesite"} <= flags, h
        assert "samesite=lax" in h.lower()
    assert urlparse(gateway.console).hostname == "127.0.0.1"
