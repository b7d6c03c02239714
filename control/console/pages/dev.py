"""Development mode only (GATEWAY_DEV=1 without GATEWAY_SMTP_HOST), to loopback peers only: the
messages the local capture SMTP server received."""
from __future__ import annotations

from aiohttp import web

from ..smtp_capture import read_messages
from ..web import console, dev_only, render

routes = web.RouteTableDef()


def _messages(request: web.Request) -> list[dict[str, object]]:
    c = console(request)
    dev_only(request)
    if not c.mailer.capture:
        raise web.HTTPNotFound()
    return read_messages(c.settings.state / "mail", request.query.get("to") or None)


@routes.get("/dev/mail")
async def mail_page(request: web.Request) -> web.Response:
    return render(request, "dev_mail.html", messages=_messages(request))


@routes.get("/dev/mail.json")
async def mail_json(request: web.Request) -> web.Response:
    return web.json_response(_messages(request))
