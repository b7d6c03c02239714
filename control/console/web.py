"""What every page shares: the console's dependencies, the viewer, rendering, CSRF and redirects."""
from __future__ import annotations

import asyncio
import hmac
import ipaddress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn
from urllib.parse import quote, urlsplit

import asyncpg
import jinja2
from core.redis_client import AnyRedis
from aiohttp import web

from control.admin import Admin
from core import catalog

from . import i18n
from .background import Background
from .i18n import N_
from .mail import Mailer
from .payments import Provider
from .roles import REFUSALS, Capability
from .security import csrf_token, sub_key
from .settings import ConsoleSettings
from .store import Store, Viewer

HERE = Path(__file__).resolve().parent
SESSION_COOKIE = "gw_session"
PENDING_COOKIE = "gw_2fa"  # a password proved right, the second step to come (``totp.Pending``)
ANON_COOKIE = "gw_anon"

MESSAGES = {
    "signed_up": N_("Check your e-mail: we sent a confirmation link."),
    "confirmed": N_("Your e-mail address is confirmed."),
    "logged_out": N_("You are logged out."),
    "reset_sent": N_("If an account exists for that address, we sent a link to reset its password."),
    "reset_done": N_("Your password is changed; log in with the new one."),
    "unverified": N_("Confirm your e-mail address first: we sent you a new link."),
    "unverified_sent_lately": N_("Confirm your e-mail address first with the link we sent you lately"
                                 " (a new one goes out at most every 5 minutes and 5 times a day)."),
    "no_trial_used": N_("No trial credit: this address (or the same mailbox under another spelling) already"
                        " had one. Top up to use the API."),
    "no_trial_client": N_("No trial credit: too many trial credits went to your network today. Top up to use"
                          " the API."),
    "no_trial_disposable": N_("No trial credit for addresses at disposable-mail services. Top up to use the API."),
    "key_revoked": N_("The key is revoked; the gateway refuses it from now on."),
    "key_limits_saved": N_("Saved: the key's limits apply to its next request."),
    "key_form_used": N_("That form was already sent and its key created (a key is shown only once); "
                        "nothing new was created. Create another key below if you need one."),
    "invited": N_("The invitation is sent."),
    "2fa_required": N_("Your organisation requires two-factor sign-in: set it up to go on."),
    "2fa_off": N_("Two-factor sign-in is off."),
    "2fa_org_on": N_("Everyone in the organisation now signs in with a second factor."),
    "2fa_org_off": N_("The organisation no longer requires a second factor."),
    "role_changed": N_("The role is changed; it applies from the member's next page."),
    "member_removed": N_("The member is removed; the keys they created still work."),
    "member_removed_keys_revoked": N_("The member is removed and the keys they created are revoked."),
    "invite_revoked": N_("The invitation is withdrawn."),
    "joined": N_("You joined the organisation."),
    "bad_link": N_("That link is invalid, used or expired."),
    "low_balance_set": N_("Saved: the owners get an e-mail when the balance falls under the threshold."),
    "low_balance_off": N_("Saved: no low-balance e-mail."),
    "details_saved": N_("Saved: the next invoices carry these billing details."),
}

# The words the database holds (roles, ledger entries, payment states) as the pages show them.
TERMS = {"owner": N_("owner"), "member": N_("member"), "billing": N_("billing"), "topup": N_("top-up"), "trial": N_("trial credit"),
         "correction": N_("correction"), "usage": N_("usage"), "pending": N_("pending"), "paid": N_("paid"),
         "failed": N_("failed"), "cancelled": N_("cancelled")}


def term(word: str) -> str:
    return i18n._(TERMS[word]) if word in TERMS else word


@dataclass
class Console:
    settings: ConsoleSettings
    pool: asyncpg.Pool
    redis: AnyRedis
    admin: Admin
    store: Store
    mailer: Mailer
    provider: Provider
    secret: bytes
    templates: jinja2.Environment
    background: Background = field(default_factory=Background)
    ksef_wake: asyncio.Event = field(default_factory=asyncio.Event)  # an invoice issued: KSeF's loop starts at once

    @property
    def base_url(self) -> str:
        return self.settings.console_base_url


CONSOLE: web.AppKey[Console] = web.AppKey("console", Console)


def console(request: web.Request) -> Console:
    return request.app[CONSOLE]


def pending_key(c: Console) -> bytes:
    """What signs the pending second step's cookie."""
    return sub_key(c.secret, "2fa-pending")


def templates() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(HERE / "templates")), autoescape=True,
                             undefined=jinja2.StrictUndefined, extensions=["jinja2.ext.i18n"])
    env.install_gettext_callables(i18n._, i18n.ngettext, newstyle=True)  # type: ignore[attr-defined]
    env.filters.update(money=i18n.money, money_exact=i18n.money_exact, when=i18n.when, day=i18n.day, term=term,
                       day_typed=i18n.day_typed)
    return env


def load_catalog(request: web.Request) -> catalog.Catalog | None:
    """The catalog in force, or None when it cannot be read now."""
    try:
        return catalog.load(console(request).settings.catalog)
    except (OSError, ValueError):
        return None


def cookie(resp: web.StreamResponse, name: str, value: str, max_age: int | None) -> None:
    resp.set_cookie(name, value, max_age=max_age, path="/", secure=True, httponly=True, samesite="Lax")


def viewer(request: web.Request) -> Viewer | None:
    return request.get("viewer")


SECURITY_PAGE = "/account/security"


def need_viewer(request: web.Request, *, enrolling: bool = False) -> Viewer:
    """The signed-in viewer, else off to log in.  One whose organisation requires two-factor sign-in
    that they have not set up is sent to set it up (``enrolling``: the pages that do that, and those
    that leave)."""
    v = viewer(request)
    if v is None:
        nxt = request.path_qs if request.method == "GET" else "/"
        raise web.HTTPSeeOther("/login?next=" + quote(nxt, safe="/"))
    if v.must_enrol and not enrolling:
        raise web.HTTPSeeOther(SECURITY_PAGE + "?msg=2fa_required")
    return v


def need(request: web.Request, capability: Capability) -> Viewer:
    """The signed-in viewer whose role has ``capability`` (``roles.GRANTS``), else the 403 page."""
    v = need_viewer(request)
    if not v.may(capability):
        raise_page(request, 403, i18n._(REFUSALS[capability]))
    return v


def safe_next(value: str | None) -> str:
    r"""A path on this site to go to after logging in, else "/".  Browsers drop tab, CR and LF from a
    URL and read a backslash as a slash, so "/\t/evil", "/\\evil" and "\\\\evil" all mean //evil: any
    control character, backslash, a second leading slash or a scheme is refused."""
    if not value or not value.startswith("/") or value.startswith("//") or len(value) > 2000:
        return "/"
    if "\\" in value or any(ord(ch) < 0x20 or 0x7f <= ord(ch) <= 0x9f for ch in value):
        return "/"
    parts = urlsplit(value)
    return "/" if parts.scheme or parts.netloc else value


def csrf_for(request: web.Request) -> str:
    v = viewer(request)
    return csrf_token(console(request).secret, "s:" + v.session_token if v is not None else "a:" + str(request["anon"]))


def csrf_ok(request: web.Request, sent: str) -> bool:
    # bytes: compare_digest refuses a str with a letter beyond ASCII (a TypeError, answered 500)
    return bool(sent) and hmac.compare_digest(sent.encode(), csrf_for(request).encode())


def render(request: web.Request, name: str, status: int = 200, **ctx: Any) -> web.Response:
    c = console(request)
    # a page may carry two messages (confirmed, and why no trial credit came): shown in order
    msgs = [i18n._(MESSAGES[m]) for m in request.query.getall("msg", [])[:3] if m in MESSAGES]
    html = c.templates.get_template(name).render(
        viewer=viewer(request), csrf=csrf_for(request), message=" ".join(msgs) or None,
        dev_mail=c.mailer.capture and dev_local(request), orgs=request.get("orgs", []), path=request.path,
        lang=i18n.lang(), **ctx)
    return web.Response(text=html, status=status, content_type="text/html")


class PageError(Exception):
    """Answered with the error page (the middleware renders it)."""

    def __init__(self, status: int, text: str) -> None:
        super().__init__(text)
        self.status = status
        self.text = text


def raise_page(request: web.Request, status: int, text: str) -> NoReturn:
    raise PageError(status, text)


def see_other(location: str) -> NoReturn:
    raise web.HTTPSeeOther(location)


def peer_ip(request: web.Request) -> str:
    """The socket's peer (never a header)."""
    peer = request.transport.get_extra_info("peername") if request.transport else None
    return str(peer[0]) if isinstance(peer, (tuple, list)) and peer else "?"


def client_ip(request: web.Request) -> str:
    """The client's address for the limiters.  GATEWAY_TRUSTED_HOPS = 0: the socket's peer (headers
    are the client's to invent).  N > 0: N proxies in front, each appending the address it received
    the request from to X-Forwarded-For, so the Nth entry from the right is the one the outermost
    trusted proxy saw; what is left of it, the client may have written.  Too few entries (a request
    that did not come through the proxies) or a malformed one: the socket's peer."""
    peer = peer_ip(request)
    hops = console(request).settings.trusted_hops
    if hops <= 0:
        return peer
    entries = [e.strip() for h in request.headers.getall("X-Forwarded-For", []) for e in h.split(",") if e.strip()]
    if len(entries) < hops:
        return peer
    try:
        return str(ipaddress.ip_address(entries[-hops]))
    except ValueError:
        return peer


def dev_local(request: web.Request) -> bool:
    """Development mode, and a loopback peer that no proxy forwarded."""
    if not console(request).settings.dev:
        return False
    try:
        loopback = ipaddress.ip_address(peer_ip(request)).is_loopback
    except ValueError:
        return False
    return loopback and not any(h in request.headers for h in ("X-Forwarded-For", "Forwarded", "X-Real-IP"))


def dev_only(request: web.Request) -> None:
    """Development conveniences (mail capture, sandbox payments): only in development mode, and only
    to a loopback peer that no proxy forwarded; 404 (absent) for everyone else."""
    if not dev_local(request):
        raise web.HTTPNotFound()
