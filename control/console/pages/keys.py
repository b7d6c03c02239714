"""API keys: create (the value shown once), name, list with creator and last use, revoke (a member
their own keys, an owner any key of the organisation)."""
from __future__ import annotations

from aiohttp import web

from ..store import Viewer, name_problem
from ..web import console, need_viewer, raise_page, render, see_other

routes = web.RouteTableDef()


async def _keys(request: web.Request, org_id: str) -> list[dict[str, object]]:
    rows = await console(request).pool.fetch(
        "SELECT k.id, k.name, k.prefix, k.created_at, k.revoked_at, k.created_by, u.email AS creator,"
        " (SELECT max(u.started_at) FROM usage_records u WHERE u.org_id = k.org_id AND u.key_id = k.id) AS last_used"
        " FROM api_keys k LEFT JOIN users u ON u.id = k.created_by WHERE k.org_id = $1 ORDER BY k.revoked_at IS NOT NULL, k.created_at DESC", org_id)
    return [dict(r) for r in rows]


def may_revoke(v: Viewer, created_by: str | None) -> bool:
    return v.owner or (created_by is not None and created_by == v.user_id)


@routes.get("/keys")
async def keys_page(request: web.Request) -> web.Response:
    v = need_viewer(request)
    return render(request, "keys.html", keys=await _keys(request, v.org_id), new_key=None, error=None,
                  may_revoke=may_revoke)


@routes.post("/keys")
async def create_key(request: web.Request) -> web.Response:
    v = need_viewer(request)
    name = str((await request.post()).get("name", "")).strip(" ")
    problem = name_problem(name, "key's name")
    if problem:
        return render(request, "keys.html", status=400, keys=await _keys(request, v.org_id), new_key=None,
                      error=problem, may_revoke=may_revoke)
    kid, key = await console(request).admin.create_key(v.org_id, name, created_by=v.user_id)
    # Shown in this answer only (not a redirect target, not cached): only its hash is stored.
    return render(request, "keys.html", keys=await _keys(request, v.org_id),
                  new_key={"id": kid, "name": name, "value": key}, error=None, may_revoke=may_revoke)


@routes.post("/keys/{key_id}/revoke")
async def revoke_key(request: web.Request) -> web.Response:
    v = need_viewer(request)
    c = console(request)
    kid = request.match_info["key_id"]
    row = await c.pool.fetchrow("SELECT created_by FROM api_keys WHERE id = $1 AND org_id = $2", kid, v.org_id)
    if row is None:
        raise_page(request, 404, "There is no such key in this organisation.")
    if not may_revoke(v, row["created_by"]):
        raise_page(request, 403, "Members revoke only the keys they created; ask an owner.")
    await c.admin.revoke_key(kid)
    see_other("/keys?msg=key_revoked")
