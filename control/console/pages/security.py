"""Two-factor sign-in: the second step of logging in, each account's own setting (enrol with a QR
code and a code, recovery codes, turn off) and an owner's requirement for the organisation."""
from __future__ import annotations

from aiohttp import web

from .. import limits, second_factor, totp
from ..i18n import _
from ..totp import Pending
from ..web import (PENDING_COOKIE, SECURITY_PAGE, client_ip, console, need, need_viewer, pending_key, raise_page,
                   render, see_other)
from .auth import start_session

routes = web.RouteTableDef()


def _spent(p: Pending) -> str:
    """The Redis key that marks a proof of the password spent by its sign-in (until it expires anyway)."""
    return "console:2fa-spent:" + p.nonce


async def _pending(request: web.Request) -> Pending:
    """The sign-in whose password was right, is still the account's and was not yet used to sign in,
    else back to the log-in page."""
    c = console(request)
    p = Pending.open(request.cookies.get(PENDING_COOKIE, ""), pending_key(c))
    if p is None or await c.redis.exists(_spent(p)):
        see_other("/login")
    user = await c.store.user_by_id(p.user_id)
    if user is None or not p.proves(user["password_hash"]):
        see_other("/login")  # the password was changed (or reset) since it was proved
    return p


@routes.get("/login/2fa")
async def second_step_form(request: web.Request) -> web.Response:
    await _pending(request)
    return render(request, "login_2fa.html", error=None)


@routes.post("/login/2fa")
async def second_step(request: web.Request) -> web.Response:
    c = console(request)
    p = await _pending(request)
    code = str((await request.post()).get("code", ""))[:64]
    ip = client_ip(request)
    # like the password: counted before the code is checked, so parallel guesses cannot outrun the limit
    if not await limits.hit(c.redis, (limits.CODE_USER, p.user_id), (limits.LOGIN_IP, ip)):
        return render(request, "login_2fa.html", status=429, error=_(
            "Too many failed attempts; try again in {minutes} minutes.").format(minutes=limits.CODE_USER.window_s // 60))
    if not await second_factor.verify(c.pool, p.user_id, code):
        return render(request, "login_2fa.html", status=401, error=_("That code is not right (or was used already)."))
    await limits.forget(c.redis, limits.CODE_USER, p.user_id)
    await limits.undo(c.redis, limits.LOGIN_IP, ip)
    if not await c.redis.set(_spent(p), "1", nx=True, ex=totp.PENDING_S):
        see_other("/login")  # a copy of the cookie signed in at the same moment
    try:
        return await start_session(request, p.user_id, None, p.next, p.lang)
    except web.HTTPSeeOther as resp:
        resp.del_cookie(PENDING_COOKIE, path="/")  # the proof of the password is spent
        raise


async def _page(request: web.Request, status: int = 200, error: str | None = None,
                recovery_codes: list[str] | None = None) -> web.Response:
    v = need_viewer(request, enrolling=True)
    c = console(request)
    state = await second_factor.status(c.pool, v.user_id)
    qr = secret = None
    if state["enabled_at"] is None:
        secret = await second_factor.pending_secret(c.pool, v.user_id)
        qr = totp.qr_data_uri(secret, v.email)
    return render(request, "security.html", status=status, error=error, state=state, secret=secret, qr=qr,
                  recovery_codes=recovery_codes, org_requires=await second_factor.required_of(c.pool, v.user_id))


@routes.get(SECURITY_PAGE)
async def security_page(request: web.Request) -> web.Response:
    return await _page(request)


async def _code(request: web.Request) -> str:
    return str((await request.post()).get("code", ""))[:64]


async def _checked_code(request: web.Request) -> str:
    """The signed-in account's own code (authenticator or recovery), limited like the second step."""
    v = need_viewer(request, enrolling=True)
    c = console(request)
    if not await limits.hit(c.redis, (limits.CODE_USER, v.user_id), (limits.LOGIN_IP, client_ip(request))):
        raise_page(request, 429, _("Too many failed attempts; try again in {minutes} minutes.")
                   .format(minutes=limits.CODE_USER.window_s // 60))
    if not await second_factor.verify(c.pool, v.user_id, await _code(request)):
        raise_page(request, 400, _("That code is not right (or was used already)."))
    await limits.forget(c.redis, limits.CODE_USER, v.user_id)
    return v.user_id


@routes.post(SECURITY_PAGE + "/enable")
async def enable(request: web.Request) -> web.Response:
    v = need_viewer(request, enrolling=True)
    c = console(request)
    if not await limits.hit(c.redis, (limits.CODE_USER, v.user_id), (limits.LOGIN_IP, client_ip(request))):
        return await _page(request, 429, _("Too many failed attempts; try again in {minutes} minutes.")
                           .format(minutes=limits.CODE_USER.window_s // 60))
    codes = await second_factor.enable(c.pool, v.user_id, await _code(request), v.session_token)
    if codes is None:
        return await _page(request, 400, _("That code is not right: type the 6 digits your app shows now."))
    await limits.forget(c.redis, limits.CODE_USER, v.user_id)
    return await _page(request, recovery_codes=codes)


@routes.post(SECURITY_PAGE + "/recovery")
async def renew_recovery(request: web.Request) -> web.Response:
    uid = await _checked_code(request)
    return await _page(request, recovery_codes=await second_factor.renew_recovery_codes(console(request).pool, uid))


@routes.post(SECURITY_PAGE + "/disable")
async def disable(request: web.Request) -> web.Response:
    v = need_viewer(request, enrolling=True)
    if await second_factor.required_of(console(request).pool, v.user_id):
        return await _page(request, 400, _("Your organisation requires two-factor sign-in; it stays on."))
    uid = await _checked_code(request)
    await second_factor.disable(console(request).pool, uid)
    see_other(SECURITY_PAGE + "?msg=2fa_off")


@routes.post("/members/2fa")
async def require_for_org(request: web.Request) -> web.Response:
    """An owner requires a second factor of everyone in the organisation (those without one are sent
    to set it up on their next page), having set up their own first."""
    v = need(request, "members")
    c = console(request)
    on = (await request.post()).get("require") == "1"
    if on and not await second_factor.enabled(c.pool, v.user_id):
        raise_page(request, 400, _("Set up your own two-factor sign-in first (Security, in the header)."))
    await second_factor.require(c.pool, v.org_id, on)
    see_other("/members?msg=" + ("2fa_org_on" if on else "2fa_org_off"))
