"""``/changelog``: the history of prices and models, generated from the catalog in force (no login
needed: prices are public).  Each entry is a model's arrival (its ``created`` time), a price step or a
change of the upstream models behind it (their ``effective`` time, past or scheduled), newest first,
in Warsaw time."""
from __future__ import annotations

import time
from dataclasses import dataclass

from aiohttp import web

from core import catalog
from core.alias_policy import describe, timeline

from ..i18n import _
from ..web import load_catalog, render

routes = web.RouteTableDef()


@dataclass(frozen=True, slots=True)
class Entry:
    at: int          # unix seconds
    alias: str
    what: str        # "model", "price" or "upstream"
    input: int       # micro-PLN per 1M tokens (prices only)
    output: int
    scheduled: bool  # still to come
    before: str = ""  # upstream changes only: the upstream models and shares before, and from then on
    after: str = ""


def entries(cat: catalog.Catalog, now: float) -> list[Entry]:
    out = []
    for a in cat.aliases.values():
        out.append(Entry(a.created, a.id, "model", 0, 0, a.created > now))
        before = None
        for step in a.price_steps:
            if before is None or step.prices != before:
                out.append(Entry(step.effective, a.id, "price", step.prices.input, step.prices.output,
                                 step.effective > now))
            before = step.prices
        for c in timeline(a):
            out.append(Entry(c.effective, a.id, "upstream", 0, 0, c.effective > now, describe(c.before),
                             describe(c.after)))
    return sorted(out, key=lambda e: (-e.at, e.alias, e.what))


@routes.get("/changelog")
async def changelog_page(request: web.Request) -> web.Response:
    cat = load_catalog(request)
    if cat is None:
        return render(request, "changelog.html", status=503, entries=[], error=_("The catalog cannot be read now."))
    return render(request, "changelog.html", entries=entries(cat, time.time()), error=None)
