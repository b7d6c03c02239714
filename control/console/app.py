"""The console's aiohttp application: cookies, CSRF, security headers, safe access log, routes."""
from __future__ import annotations

import asyncio
import re
import secrets
from typing import AsyncIterator, Awaitable, Callable

import asyncpg
from aiohttp import web

from control.admin import Admin
from core.redis_client import redis_client

from .background import every
from . import einvoices, i18n, key_caps, logs, low_balance, model_changes
from .listener import BODY_MAX, GUARD, Guard, guard_mw, serve
from .mail import Mailer
from .payments import make_provider
from .security import load_secret
from .settings import ConsoleSettings
from .store import Store
from .web import ANON_COOKIE, CONSOLE, HERE, SESSION_COOKIE, Console, PageError, cookie, csrf_ok, render, templates

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

# Requests that do not come from our forms: the payment providers' server-to-server notifications
# (authenticated by their signatures instead).
CSRF_EXEMPT = ("/payments/notify/",)

HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self';"
                               " object-src 'none'; base-uri 'none'; form-action 'self' https:; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Permissions-Policy": "camera=(), microphone=(), geolocation=(), payment=()",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Strict-Transport-Security": "max-age=31536000",
}


@web.middleware
async def lang_mw(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every text of this request in the visitor's language (``i18n.choose``)."""
    i18n.set_lang(i18n.choose(request.cookies.get(i18n.LANG_COOKIE), request.headers.get("Accept-Language")))
    return await handler(request)


@web.middleware
async def session_mw(request: web.Request, handler: Handler) -> web.StreamResponse:
    c = request.app[CONSOLE]
    anon = request.cookies.get(ANON_COOKIE, "")
    if len(anon) < 20:
        anon = secrets.token_urlsafe(24)
        request["new_anon"] = anon
    request["anon"] = anon
    token = request.cookies.get(SESSION_COOKIE)
    if token and len(token) < 100:
        v = await c.store.viewer(token)
        if v is not None:
            request["viewer"] = v
            request["orgs"] = await c.store.orgs_of(v.user_id)
        else:
            request["drop_session"] = True
    try:
        resp = await handler(request)
    except web.HTTPException as e:
        _cookies(request, e)
        raise
    _cookies(request, resp)
    return resp


def _cookies(request: web.Request, resp: web.StreamResponse) -> None:
    if "new_anon" in request:
        cookie(resp, ANON_COOKIE, request["new_anon"], None)
    if request.get("drop_session") and SESSION_COOKIE not in resp.cookies:
        resp.del_cookie(SESSION_COOKIE, path="/")


@web.middleware
async def csrf_mw(request: web.Request, handler: Handler) -> web.StreamResponse:
    if request.method not in ("GET", "HEAD", "OPTIONS") and not request.path.startswith(CSRF_EXEMPT):
        form = await request.post()
        if not csrf_ok(request, str(form.get("csrf", ""))):
            return render(request, "error.html", status=403,
                          error=i18n._("The form expired or did not come from this site; go back, reload and try again."))
    return await handler(request)


FORMS = ("application/x-www-form-urlencoded", "multipart/form-data")
_FIELD_NAME = re.compile(r"[a-z_]{1,20}")


def storable(text: str) -> bool:
    """PostgreSQL keeps no NUL character, UTF-8 no lone surrogate."""
    return "\x00" not in text and not any("\ud800" <= ch <= "\udfff" for ch in text)


@web.middleware
async def inputs_mw(request: web.Request, handler: Handler) -> web.StreamResponse:
    """A path, query or form value that could not be stored is refused (400, naming the field when
    its name is one of ours) before any page reads it."""
    fields = [*request.match_info.items(), *request.query.items()]
    if request.method == "POST" and request.content_type in FORMS and not request.path.startswith(CSRF_EXEMPT):
        fields += [(k, v) for k, v in (await request.post()).items() if isinstance(v, str)]
    for name, value in fields:
        if not (storable(name) and storable(value)):
            raise PageError(400, i18n._("The field “{name}” holds a character that cannot be used (a NUL or a"
                                        " broken one).").format(name=name) if _FIELD_NAME.fullmatch(name)
                            else i18n._("A field holds a character that cannot be used (a NUL or a broken one)."))
    return await handler(request)


@web.middleware
async def errors_mw(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except PageError as e:
        return render(request, "error.html", status=e.status, error=e.text)
    except web.HTTPNotFound:
        return render(request, "error.html", status=404, error=i18n._("There is nothing here."))


async def on_prepare(request: web.Request, resp: web.StreamResponse) -> None:
    for k, v in HEADERS.items():
        resp.headers.setdefault(k, v)
    if not request.path.startswith("/static/"):
        resp.headers["Cache-Control"] = "no-store"


async def healthz(request: web.Request) -> web.Response:
    return web.Response(text="ok")


def make_app(settings: ConsoleSettings) -> web.Application:
    from .pages import api_docs, auth, billing, changelog, dev, key_limits, keys, language, members, security, usage
    app = web.Application(middlewares=[logs.request_id_mw, guard_mw, lang_mw, session_mw, errors_mw, inputs_mw,
                                       csrf_mw], client_max_size=BODY_MAX)
    app[GUARD] = Guard(settings)

    async def resources(app: web.Application) -> AsyncIterator[None]:
        pool = await asyncpg.create_pool(settings.database_url, min_size=1, max_size=8)
        r = redis_client(settings.redis_url, 8)
        secret = load_secret(settings.console_secret, settings.state)
        app[CONSOLE] = Console(settings, pool, r, Admin(pool, r, settings.credit_limit_micro), Store(pool), Mailer(settings),
                               make_provider(settings, secret), secret, templates())
        c, every_s = app[CONSOLE], settings.low_balance_check_s
        watchers = [asyncio.create_task(every(every_s, lambda: low_balance.check_once(c), "low-balance check")),
                    asyncio.create_task(every(every_s, lambda: model_changes.mail_once(c), "model-change mail")),
                    asyncio.create_task(every(every_s, lambda: key_caps.check_once(c), "key limit check")),
                    asyncio.create_task(einvoices.worker(app[CONSOLE]).watch())]
        yield
        for w in watchers:
            w.cancel()
        await app[CONSOLE].background.drain()
        await pool.close()
        await r.aclose()

    app.cleanup_ctx.append(resources)
    app.on_response_prepare.append(on_prepare)
    app.on_response_prepare.append(logs.on_prepare)
    app.router.add_get("/healthz", healthz)
    app.router.add_static("/static", HERE / "static")
    for mod in (auth, security, keys, key_limits, usage, billing, members, dev, api_docs, changelog, language):
        app.add_routes(mod.routes)
    return app


def run(settings: ConsoleSettings) -> None:
    from .launch import refusal
    why = refusal(settings)
    if why:
        raise SystemExit(f"console: {why}")
    logs.setup()
    asyncio.run(serve(make_app(settings), settings, logs.AccessLogger))
