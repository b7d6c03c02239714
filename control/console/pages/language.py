"""``POST /lang``: the visitor's choice of language, remembered in a cookie for a year and, when
signed in, on the account (the language of the e-mails sent to it without a request: low balance,
payments; and of a browser that logs in without a choice of its own)."""
from __future__ import annotations

from aiohttp import web

from .. import i18n
from ..web import console, cookie, safe_next, viewer

routes = web.RouteTableDef()


@routes.post("/lang")
async def choose_language(request: web.Request) -> web.Response:
    form = await request.post()
    lang = str(form.get("lang", ""))
    if lang not in i18n.LANGS:
        raise web.HTTPBadRequest(text="lang: pl or en")
    v = viewer(request)
    if v is not None:
        await console(request).store.set_lang(v.user_id, lang)
    resp = web.HTTPSeeOther(safe_next(str(form.get("next", ""))))
    cookie(resp, i18n.LANG_COOKIE, lang, i18n.YEAR_S)
    raise resp
