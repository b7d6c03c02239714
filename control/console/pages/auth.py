"""Sign-up, e-mail confirmation (with the trial credit, once), log in and out, password reset,
switching organisation, and the overview page."""
from __future__ import annotations

from aiohttp import web

from control.admin import pln_to_micro

from .. import limits, mail, trial
from ..i18n import LANG_COOKIE, YEAR_S, N_, _, lang
from ..security import hashed, new_token, password_matches, password_problem
from ..store import SESSION_DAYS, name_problem, normal_email, valid_email
from ..totp import PENDING_S, Pending
from ..trial import NoTrial
from ..web import PENDING_COOKIE, SESSION_COOKIE, pending_key, Console, client_ip, console, cookie, need_viewer, raise_page, render, safe_next, see_other, viewer

routes = web.RouteTableDef()


async def start_session(request: web.Request, user_id: str, org_id: str | None, location: str,
                        lang: str | None = None) -> web.Response:
    """``lang``: the account's language, for a browser that has not chosen one (a log-in elsewhere)."""
    c = console(request)
    if org_id is None:
        orgs = await c.store.orgs_of(user_id)
        if not orgs:
            raise_page(request, 403, _("This account belongs to no organisation."))
        org_id = next((o["id"] for o in orgs if o["role"] == "owner"), orgs[0]["id"])
    token = new_token()
    await c.store.create_session(token, user_id, org_id)
    resp = web.HTTPSeeOther(location)
    cookie(resp, SESSION_COOKIE, token, SESSION_DAYS * 86400)
    if lang and LANG_COOKIE not in request.cookies:
        cookie(resp, LANG_COOKIE, lang, YEAR_S)
    raise resp


async def send_confirmation(request: web.Request, user_id: str, email: str) -> bool:
    """A new confirmation link by mail (the earlier ones die), unless the address had one within 5
    minutes or five today (``limits.confirmation_mail``); True if sent."""
    c = console(request)
    if not await limits.confirmation_mail(c.redis, email):
        return False
    token = new_token()
    await c.store.new_email_token(token, user_id, "confirm")
    c.background.run(c.mailer.send(email, *mail.confirm(f"{c.base_url}/confirm/{token}")), "confirmation mail")
    return True


@routes.get("/")
async def overview(request: web.Request) -> web.Response:
    if viewer(request) is None:
        see_other("/login")
    v = need_viewer(request)
    c = console(request)
    bal = await c.admin.balance(v.org_id)
    recent = await c.pool.fetch("SELECT started_at, alias, status, cost_micro_pln, estimated FROM usage_records"
                                " WHERE org_id = $1 ORDER BY started_at DESC LIMIT 5", v.org_id)
    nkeys = await c.pool.fetchval("SELECT count(*) FROM api_keys WHERE org_id = $1 AND revoked_at IS NULL", v.org_id)
    trial = await c.pool.fetchval("SELECT amount_micro_pln FROM ledger WHERE org_id = $1 AND kind = 'trial'"
                                  " ORDER BY created_at LIMIT 1", v.org_id)
    return render(request, "overview.html", balance=bal["balance_micro_pln"], recent=recent, nkeys=nkeys,
                  trial=trial, gateway=c.settings.gateway_base_url + "/v1")


@routes.get("/signup")
async def signup_form(request: web.Request) -> web.Response:
    return render(request, "signup.html", error=None, email="", org="")


@routes.post("/signup")
async def signup(request: web.Request) -> web.Response:
    c = console(request)
    f = await request.post()
    email, password, org = normal_email(str(f.get("email", ""))), str(f.get("password", "")), str(f.get("org", "")).strip(" ")
    # Everything is checked before anything is written (or counted).
    error = (_("Enter a valid e-mail address (one address, nothing else).") if not valid_email(email)
             else name_problem(org, _("organisation's name")) or password_problem(password))
    if error:
        return render(request, "signup.html", status=400, error=error, email=email, org=org)
    if not await limits.hit(c.redis, (limits.SIGNUP_EMAIL, email), (limits.SIGNUP_IP, client_ip(request)),
                            (limits.MAIL_DAY, email)):
        return render(request, "signup.html", status=429, error=_("Too many sign-ups; try again later."),
                      email=email, org=org)
    pw_hash = await hashed(password)
    existing = await c.store.user_by_email(email)
    if existing is not None:  # same answer as a new sign-up: the page does not tell who has an account
        c.background.run(c.mailer.send(email, *mail.already_registered(f"{c.base_url}/login")), "sign-up mail")
        see_other("/login?msg=signed_up")
    org_id = await c.admin.create_org(org)
    async with c.pool.acquire() as conn, conn.transaction():
        uid = await c.store.create_user(email, pw_hash, lang(), conn=conn)
        await c.store.add_member(uid, org_id, "owner", conn=conn)
    await send_confirmation(request, uid, email)
    see_other("/login?msg=signed_up")


# what an e-mail link that cannot be used says, per purpose
_BAD_LINK = {"confirm": N_("That confirmation link is invalid, used or expired. Log in to get a new one."),
             "reset": N_("That reset link is invalid, used or expired.")}


async def _link_user(request: web.Request, purpose: str, *, use: bool = False) -> str:
    """The account of the e-mail link in the path (``use``: the link is spent now), else the 400 page."""
    uid = await console(request).store.email_token(request.match_info["token"], purpose, use=use)
    if uid is None:
        raise_page(request, 400, _(_BAD_LINK[purpose]))
    return uid


@routes.get("/confirm/{token}")
async def confirm_form(request: web.Request) -> web.Response:
    await _link_user(request, "confirm")
    return render(request, "confirm.html", token=request.match_info["token"])


async def grant_trial(request: web.Request, user_id: str) -> NoTrial | None:
    """The trial balance for the account's first owned organisation, when its address was just
    confirmed: once per person (``trial.identity``), at most GATEWAY_TRIAL_PER_CLIENT_DAY per client
    address a day, never to a disposable-mail domain; else why not.  Once per organisation too
    (ledger reference ``trial:<org>``)."""
    c = console(request)
    micro = pln_to_micro(c.settings.trial_balance_pln)
    user = await c.store.user_by_id(user_id)
    orgs = (await c.store.owned_orgs(user_id))[:1]
    if micro <= 0 or user is None or not orgs:
        return None
    email = str(user["email"])
    who = trial.identity_hash(email)
    if trial.disposable(email):
        return NoTrial.DISPOSABLE
    if await c.store.had_trial(who):
        return NoTrial.USED
    if not await limits.hit(c.redis, (limits.trial_client(c.settings.trial_per_client_day), client_ip(request))):
        return NoTrial.CLIENT
    if not await c.store.claim_trial(who, orgs[0]):
        return NoTrial.USED
    await c.admin.credit(orgs[0], micro, ref="trial:" + orgs[0], kind="trial")
    return None


def _confirmed(base: str, no_trial: NoTrial | None) -> str:
    """Where a confirmation goes: ``base`` with its message, and why no trial credit came, if none did."""
    return base + ("" if no_trial is None else "&msg=" + no_trial.value)


@routes.post("/confirm/{token}")
async def confirm(request: web.Request) -> web.Response:
    done = await console(request).store.confirm(request.match_info["token"])
    if done is None:
        raise_page(request, 400, _(_BAD_LINK["confirm"]))
    no_trial = await grant_trial(request, done.user_id) if done.confirmed_now else None
    if not done.signs_in:  # an older link: it confirms the address, it does not open the account
        see_other(_confirmed("/login?msg=confirmed", no_trial))
    return await start_session(request, done.user_id, None, _confirmed("/?msg=confirmed", no_trial))


@routes.get("/login")
async def login_form(request: web.Request) -> web.Response:
    return render(request, "login.html", error=None, email="", next=safe_next(request.query.get("next")))


@routes.post("/login")
async def login(request: web.Request) -> web.Response:
    c = console(request)
    f = await request.post()
    email, password = normal_email(str(f.get("email", ""))), str(f.get("password", ""))
    nxt = safe_next(str(f.get("next", "")))
    ip = client_ip(request)
    # Counted before the password is checked, atomically: parallel guesses cannot outrun the limit.
    if not await limits.hit(c.redis, (limits.LOGIN_EMAIL, email), (limits.LOGIN_IP, ip)):
        return render(request, "login.html", status=429, email=email, next=nxt,
                      error=_("Too many failed attempts; try again in {minutes} minutes.")
                      .format(minutes=limits.LOGIN_EMAIL.window_s // 60))
    user = await c.store.user_by_email(email)
    ok = await password_matches(user["password_hash"] if user else None, password)
    if user is None or not ok:
        return render(request, "login.html", status=401, email=email, next=nxt,
                      error=_("Wrong e-mail address or password."))
    await limits.forget(c.redis, limits.LOGIN_EMAIL, email)  # only failures count
    await limits.undo(c.redis, limits.LOGIN_IP, ip)
    if user["verified_at"] is None:
        sent = await send_confirmation(request, user["id"], email)
        see_other("/login?msg=" + ("unverified" if sent else "unverified_sent_lately"))
    if user["totp_secret"] is not None:  # the second step first (pages/security.py)
        resp = web.HTTPSeeOther("/login/2fa")
        pending = Pending.start(user["id"], nxt, user["lang"], user["password_hash"])
        cookie(resp, PENDING_COOKIE, pending.seal(pending_key(c)), PENDING_S)
        raise resp
    return await start_session(request, user["id"], None, nxt, user["lang"])


@routes.post("/logout")
async def logout(request: web.Request) -> web.Response:
    v = viewer(request)
    if v is not None:
        await console(request).store.end_session(v.session_token)
    resp = web.HTTPSeeOther("/login?msg=logged_out")
    resp.del_cookie(SESSION_COOKIE, path="/")
    raise resp


@routes.get("/reset")
async def reset_form(request: web.Request) -> web.Response:
    return render(request, "reset.html", error=None)


@routes.post("/reset")
async def reset(request: web.Request) -> web.Response:
    c = console(request)
    email = normal_email(str((await request.post()).get("email", "")))
    if not valid_email(email):
        return render(request, "reset.html", status=400, error=_("Enter a valid e-mail address (one address, nothing else)."))
    if await limits.hit(c.redis, (limits.RESET_EMAIL, email), (limits.RESET_IP, client_ip(request)),
                        (limits.MAIL_DAY, email)):
        # Off the request path: the answer takes as long for an unknown address as for a known one.
        c.background.run(_send_reset(c, email), "reset mail")
    see_other("/login?msg=reset_sent")


async def _send_reset(c: Console, email: str) -> None:
    user = await c.store.user_by_email(email)
    if user is not None:
        token = new_token()
        await c.store.new_email_token(token, user["id"], "reset")
        await c.mailer.send(email, *mail.reset(f"{c.base_url}/reset/{token}"))


@routes.get("/reset/{token}")
async def new_password_form(request: web.Request) -> web.Response:
    await _link_user(request, "reset")
    return render(request, "new_password.html", token=request.match_info["token"], error=None)


@routes.post("/reset/{token}")
async def new_password(request: web.Request) -> web.Response:
    c = console(request)
    token = request.match_info["token"]
    password = str((await request.post()).get("password", ""))
    problem = password_problem(password)
    if problem:
        return render(request, "new_password.html", status=400, token=token, error=problem)
    uid = await _link_user(request, "reset", use=True)
    await c.store.set_password(uid, await hashed(password))  # and ends every session of the account
    no_trial = await grant_trial(request, uid) if await c.store.mark_verified(uid) else None  # the link proved the address
    see_other(_confirmed("/login?msg=reset_done", no_trial))


@routes.post("/org/switch")
async def switch_org(request: web.Request) -> web.Response:
    v = need_viewer(request, enrolling=True)
    org = str((await request.post()).get("org", ""))
    if not await console(request).store.switch_org(v.session_token, v.user_id, org):
        raise_page(request, 403, _("You are not a member of that organisation."))
    see_other("/")
