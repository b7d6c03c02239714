"""API keys: create (the value shown once), name, list with creator and last use, revoke (a member
their own keys, an owner any key of the organisation)."""
from __future__ import annotations

import secrets

from aiohttp import web

from core.key_limits import expiry_day

from ..i18n import _
from ..store import Viewer, name_problem
from ..web import console, load_catalog, need, raise_page, render, see_other

routes = web.RouteTableDef()


async def _keys(request: web.Request, org_id: str) -> list[dict[str, object]]:
    """The organisation's keys, active first, each with its own limits and (active ones) its spend this month."""
    c = console(request)
    rows = await c.pool.fetch(
        "SELECT k.id, k.name, k.prefix, k.created_at, k.revoked_at, k.created_by, u.email AS creator,"
        " k.monthly_limit_micro_pln AS cap, k.models, k.expires_at,"
        " (SELECT max(u.started_at) FROM usage_records u WHERE u.org_id = k.org_id AND u.key_id = k.id) AS last_used"
        " FROM api_keys k LEFT JOIN users u ON u.id = k.created_by WHERE k.org_id = $1 ORDER BY k.revoked_at IS NOT NULL, k.created_at DESC", org_id)
    spend = await c.admin.key_spend(org_id, [r["id"] for r in rows if r["revoked_at"] is None])
    return [{**r, "spent": spend.get(r["id"]),
             "expires": None if r["expires_at"] is None else expiry_day(r["expires_at"])} for r in rows]


def may_revoke(v: Viewer, created_by: str | None) -> bool:
    return v.owner or (created_by is not None and created_by == v.user_id)


FORM_TTL_S = 24 * 3600  # a key form left open this long can still be sent once


def _example_alias(request: web.Request) -> str:
    """A chat alias of the catalog in force, for the first-call snippets."""
    cat = load_catalog(request)
    chat = sorted(a for a, v in cat.aliases.items() if "chat" in v.capabilities) if cat is not None else []
    return "polish-pro" if "polish-pro" in chat else (chat[0] if chat else "polish-pro")


async def _page(request: web.Request, v: Viewer, *, status: int = 200, new_key: dict[str, str] | None = None,
                error: str | None = None) -> web.Response:
    c = console(request)
    return render(request, "keys.html", status=status, keys=await _keys(request, v.org_id), new_key=new_key,
                  error=error, may_revoke=may_revoke, form_id=secrets.token_urlsafe(16),
                  gateway=f"http://{c.settings.gateway_host}:{c.settings.gateway_port}/v1",
                  alias=_example_alias(request))


@routes.get("/keys")
async def keys_page(request: web.Request) -> web.Response:
    return await _page(request, need(request, "keys"))


@routes.post("/keys")
async def create_key(request: web.Request) -> web.Response:
    v = need(request, "keys")
    form = await request.post()
    name = str(form.get("name", "")).strip(" ")
    problem = name_problem(name, _("key's name"))
    if problem:
        return await _page(request, v, status=400, error=problem)
    # Each form creates one key at most: a reload of this page (the browser sending the same form
    # again) is turned away rather than creating a second key.  The new key itself is never stored
    # anywhere (only its hash), so it is shown in this answer only, which is not cached.
    form_id = str(form.get("form_id", ""))[:64]
    if not form_id or not await console(request).redis.set(f"console:form:{form_id}", "1", nx=True,
                                                            ex=FORM_TTL_S):
        see_other("/keys?msg=key_form_used")
    kid, key = await console(request).admin.create_key(v.org_id, name, created_by=v.user_id)
    return await _page(request, v, new_key={"id": kid, "name": name, "value": key})


@routes.post("/keys/{key_id}/revoke")
async def revoke_key(request: web.Request) -> web.Response:
    v = need(request, "keys")
    c = console(request)
    kid = request.match_info["key_id"]
    row = await c.pool.fetchrow("SELECT created_by FROM api_keys WHERE id = $1 AND org_id = $2", kid, v.org_id)
    if row is None:
        raise_page(request, 404, _("There is no such key in this organisation."))
    if not may_revoke(v, row["created_by"]):
        raise_page(request, 403, _("Members revoke only the keys they created; ask an owner."))
    await c.admin.revoke_key(kid)
    see_other("/keys?msg=key_revoked")
