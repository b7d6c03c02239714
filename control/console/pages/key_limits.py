"""A key's own limits (docs/limits.md, "Key limits"): owners set or lift its monthly spending limit, the
aliases it may use and its expiry date; everyone of the organisation sees them and the key's spend this
month on the Keys page."""
from __future__ import annotations

import datetime as dt
from typing import Any, Literal

from aiohttp import web
from babel.numbers import format_decimal

from control.admin import AdminError
from core import key_limits
from core.cost import pln_to_micro

from ..i18n import DATE_HINT, _, day_typed, lang, money, parse_day
from ..web import console, load_catalog, need, raise_page, render, see_other

routes = web.RouteTableDef()

# the most a key's monthly limit may be here (the CLI takes more)
MAX_PLN = 1_000_000


async def _key(request: web.Request, org_id: str) -> Any:
    row = await console(request).pool.fetchrow(
        "SELECT id, name, prefix, monthly_limit_micro_pln AS cap, models, expires_at FROM api_keys"
        " WHERE id = $1 AND org_id = $2 AND revoked_at IS NULL", request.match_info["key_id"], org_id)
    if row is None:
        raise_page(request, 404, _("There is no such key in this organisation."))
    return row


def _aliases(request: web.Request, allowed: list[str] | None) -> list[str]:
    """The catalog's aliases, and those the key is allowed that it no longer has, in order."""
    cat = load_catalog(request)
    names = sorted(cat.aliases) if cat is not None else []
    return names + sorted(set(allowed or ()) - set(names))


def _page(request: web.Request, k: Any, status: int = 200, error: str | None = None,
          typed: dict[str, Any] | None = None) -> web.Response:
    expires = None if k["expires_at"] is None else key_limits.expiry_day(k["expires_at"])
    shown = typed or {"limit": "" if k["cap"] is None else format_decimal(k["cap"] / 1_000_000, "0.00####", locale=lang()),
                      "models": list(k["models"] or ()), "expires": day_typed(expires)}
    return render(request, "key_limits.html", status=status, key=k, error=error, form=shown,
                  aliases=_aliases(request, k["models"]), date_hint=_(DATE_HINT), max_pln=money(MAX_PLN * 1_000_000))


@routes.get("/keys/{key_id}/limits")
async def limits_page(request: web.Request) -> web.Response:
    v = need(request, "key_limits")
    return _page(request, await _key(request, v.org_id))


@routes.post("/keys/{key_id}/limits")
async def set_limits(request: web.Request) -> web.Response:
    """Empty fields lift a limit; no alias ticked: every alias."""
    v = need(request, "key_limits")
    k = await _key(request, v.org_id)
    form = await request.post()
    typed = {"limit": str(form.get("limit", "")).strip(), "models": [str(m) for m in form.getall("models", [])],
             "expires": str(form.get("expires", "")).strip()}
    try:
        change = _change(typed, _aliases(request, k["models"]))
    except ValueError as e:
        return _page(request, k, status=400, error=str(e), typed=typed)
    try:
        await console(request).admin.set_key_limits(k["id"], limits=change, org_id=v.org_id)
    except AdminError:
        raise_page(request, 404, _("There is no such key in this organisation."))
    see_other("/keys?msg=key_limits_saved")


def _change(typed: dict[str, Any], offered: list[str]) -> key_limits.Change:
    """The form as a change of all three limits (ValueError: a message for the owner); ``offered``: the
    aliases the form lists, the only ones it takes."""
    limit: int | Literal["none"] = key_limits.NONE
    if typed["limit"]:
        try:
            limit = pln_to_micro(typed["limit"].replace(",", ".").replace(" ", "").replace("\u00a0", ""))
        except ValueError:
            limit = 0
        if not 0 < limit <= MAX_PLN * 1_000_000 or limit % 10_000:
            raise ValueError(_("Enter a monthly limit from {min} to {max} (at most 2 decimal places), or nothing"
                               " for no limit.").format(min=money(10_000), max=money(MAX_PLN * 1_000_000)))
    models: tuple[str, ...] | Literal["none"] = key_limits.NONE
    if typed["models"]:
        try:
            models = key_limits.parse_models(",".join(typed["models"]), offered)
        except ValueError:
            raise ValueError(_("Choose models from the list.")) from None
    expires: dt.date | Literal["none"] = key_limits.NONE
    if typed["expires"]:
        try:
            expires = parse_day(typed["expires"])
        except ValueError:
            raise ValueError(_("Enter the expiry date as {hint}, or nothing for none.").format(hint=_(DATE_HINT))) from None
    return key_limits.Change(limit, models, expires)
