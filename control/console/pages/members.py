"""Members: invite by e-mail, accept, roles (``roles.GRANTS``: owner everything; member keys and usage;
billing top-ups, invoices and usage), change a role, remove."""
from __future__ import annotations

from aiohttp import web

from .. import limits, mail, second_factor
from ..i18n import _, lang
from ..roles import ROLES, is_role
from ..security import hashed, new_token, password_problem
from ..store import normal_email, valid_email
from ..web import console, need, raise_page, render, see_other, viewer
from .auth import start_session

routes = web.RouteTableDef()


async def _page(request: web.Request, status: int = 200, error: str | None = None) -> web.Response:
    v = need(request, "members")
    c = console(request)
    return render(request, "members.html", status=status, error=error, members=await c.store.members(v.org_id),
                  invites=await c.store.pending_invites(v.org_id), roles=ROLES,
                  require_2fa=await second_factor.required(c.pool, v.org_id))


@routes.get("/members")
async def members_page(request: web.Request) -> web.Response:
    return await _page(request)


@routes.post("/members/invite")
async def invite(request: web.Request) -> web.Response:
    v = need(request, "members")
    c = console(request)
    f = await request.post()
    email, role = normal_email(str(f.get("email", ""))), str(f.get("role", "member"))
    if not valid_email(email):
        return await _page(request, 400, _("Enter a valid e-mail address (one address, nothing else)."))
    if not is_role(role):
        return await _page(request, 400, _("The role is owner, member or billing."))
    if any(m["email"] == email for m in await c.store.members(v.org_id)):
        return await _page(request, 400, _("That person is already a member."))
    if not await limits.hit(c.redis, (limits.INVITE_ORG, v.org_id), (limits.INVITE_EMAIL, email),
                            (limits.MAIL_DAY, email)):
        return await _page(request, 429, _("Too many invitations; try again later."))
    token = new_token()
    await c.store.create_invite(token, v.org_id, email, role, v.user_id)
    c.background.run(c.mailer.send(email, *mail.invite(v.org_name, v.email, f"{c.base_url}/invite/{token}")),
                     "invitation mail")
    see_other("/members?msg=invited")


@routes.post("/members/invites/{invite_id}/revoke")
async def revoke_invite(request: web.Request) -> web.Response:
    v = need(request, "members")
    if not await console(request).store.revoke_invite(v.org_id, request.match_info["invite_id"]):
        raise_page(request, 404, _("There is no such invitation in this organisation."))
    see_other("/members?msg=invite_revoked")


@routes.post("/members/{user_id}/role")
async def change_role(request: web.Request) -> web.Response:
    v = need(request, "members")
    role = str((await request.post()).get("role", ""))
    if not is_role(role):
        return await _page(request, 400, _("The role is owner, member or billing."))
    problem = await console(request).store.set_role(v.org_id, request.match_info["user_id"], role)
    if problem == "not_found":
        raise_page(request, 404, _("There is no such member in this organisation."))
    if problem == "last_owner":
        return await _page(request, 400, _("The organisation's last owner cannot become a member or billing:"
                                           " make another member an owner first."))
    see_other("/members?msg=role_changed")


@routes.post("/members/{user_id}/remove")
async def remove(request: web.Request) -> web.Response:
    v = need(request, "members")
    c = console(request)
    uid = request.match_info["user_id"]
    # The secure default: the keys the member created stop working with their membership, unless
    # the owner ticks "keep the keys they created working".
    keep = (await request.post()).get("keep_keys") == "1"
    done = await c.store.remove_member(v.org_id, uid, revoke_keys=not keep)
    if done.problem == "not_found":
        raise_page(request, 404, _("There is no such member in this organisation."))
    if done.problem == "last_owner":
        return await _page(request, 400, _("The organisation's last owner cannot be removed: make another member an owner first."))
    for kid in done.revoked_keys:
        await c.admin.revoke_key(kid)  # revoked already; this drops the gateway's cached entry at once
    see_other("/members?msg=member_removed" + ("" if keep else "_keys_revoked"))


@routes.get("/invite/{token}")
async def invite_page(request: web.Request) -> web.Response:
    c = console(request)
    inv = await c.store.invite(request.match_info["token"])
    if inv is None:
        raise_page(request, 400, _("That invitation is invalid, used or expired."))
    has_account = await c.store.user_by_email(inv["email"]) is not None
    return render(request, "invite.html", invite=inv, token=request.match_info["token"], has_account=has_account,
                  error=None)


@routes.post("/invite/{token}")
async def accept(request: web.Request) -> web.Response:
    c = console(request)
    token = request.match_info["token"]
    inv = await c.store.invite(token)
    if inv is None:
        raise_page(request, 400, _("That invitation is invalid, used or expired."))
    v = viewer(request)
    if v is not None:
        if v.email != inv["email"]:
            raise_page(request, 403, _("This invitation is for {email}; log out and accept it as that person.")
                       .format(email=inv["email"]))
        uid = v.user_id
    else:
        if await c.store.user_by_email(inv["email"]) is not None:
            see_other(f"/login?next=/invite/{token}")
        # A new account: the invitation's link proved the address.
        password = str((await request.post()).get("password", ""))
        problem = password_problem(password)
        if problem:
            return render(request, "invite.html", status=400, invite=inv, token=token, has_account=False, error=problem)
        uid = await c.store.create_user(inv["email"], await hashed(password), lang(), verified=True)
    org = await c.store.accept_invite(token, uid, inv["email"])
    if org is None:
        raise_page(request, 400, _("That invitation is invalid, used or expired."))
    if v is None:
        return await start_session(request, uid, org, "/?msg=joined")
    await c.store.switch_org(v.session_token, v.user_id, org)
    see_other("/?msg=joined")
