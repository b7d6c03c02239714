"""Usage: the organisation's requests newest first, filters, totals per day (Warsaw days: the From and To
dates too) and alias, a chart, CSV (machine-readable: UTC times, amounts with a dot, not translated).
The page refreshes its live part every few seconds (``/usage/live``)."""
from __future__ import annotations

import csv
import datetime as dt
import io
from dataclasses import dataclass, fields
from typing import Any, Callable
from urllib.parse import urlencode

from aiohttp import web

from control.admin import status_condition
from core.catalog import WARSAW
from core.cost import micro_to_pln
from core.decisions import UsageRecord

from ..i18n import DATE_HINT, _, day, day_short, money_exact, ngettext, parse_day
from ..web import console, load_catalog, need, render

routes = web.RouteTableDef()
PAGE_ROWS = 500
CSV_ROWS = 100_000


STATUSES = ("ok", "errors", "400", "402", "403", "404", "429", "499", "500", "502", "503", "504")


@dataclass(frozen=True)
class Filters:
    start: dt.date | None
    end: dt.date | None
    key: str
    alias: str
    status: str = ""      # "ok", "errors" or a status code (``control.admin.status_condition``)
    request_id: str = ""  # a request id (of an error reply, say): that request only
    problems: tuple[str, ...] = ()  # what was wrong with the filters asked for (then nothing is listed)

    @classmethod
    def of(cls, q: Any) -> "Filters":
        problems: list[str] = []
        hint = _(DATE_HINT)
        start = _date(q.get("from"), _("The From date is not a date ({hint}).").format(hint=hint), problems)
        end = _date(q.get("to"), _("The To date is not a date ({hint}).").format(hint=hint), problems)
        if start and end and start > end:
            problems.append(_("The From date is after the To date."))
        status = str(q.get("status", ""))[:8]
        try:
            status_condition(status)
        except ValueError:
            problems.append(_("Unknown status filter."))
            status = ""
        rid = str(q.get("request_id", "")).strip()[:100]
        return cls(start, end, str(q.get("key", ""))[:64], str(q.get("alias", ""))[:64], status, rid,
                   tuple(problems))

    def query(self) -> str:
        d = {"from": self.start.isoformat() if self.start else "", "to": self.end.isoformat() if self.end else "",
             "key": self.key, "alias": self.alias, "status": self.status, "request_id": self.request_id}
        return urlencode({k: v for k, v in d.items() if v})

    def where(self, org_id: str) -> tuple[str, list[Any]]:
        """A WHERE clause on usage_records ``u``; always the viewer's organisation first."""
        sql: list[str] = []
        args: list[Any] = []

        def add(condition: str, arg: Any = None) -> None:
            """A condition on ``u``; ``{}`` in it stands for ``arg``'s parameter number."""
            if arg is not None:
                args.append(arg)
            sql.append("u." + condition.format(len(args)))

        add("org_id = ${}", org_id)
        if self.start:
            add("started_at >= ${}", dt.datetime.combine(self.start, dt.time(), WARSAW))
        if self.end:
            add("started_at < ${}", dt.datetime.combine(self.end + dt.timedelta(days=1), dt.time(), WARSAW))
        if self.key:
            add("key_id = ${}", self.key)
        if self.alias:
            add("alias = ${}", self.alias)
        cond = status_condition(self.status)
        if cond is not None:
            add(*cond)
        if self.request_id:
            add("request_id = ${}", self.request_id)
        if self.problems:
            sql.append("false")  # a filter that could not be read lists nothing rather than everything
        return " AND ".join(sql), args


# the days a filter may name: a Warsaw day's bounds must stay datetimes PostgreSQL and Python both hold
FIRST_DAY, LAST_DAY = dt.date(1970, 1, 1), dt.date(9998, 12, 31)


def _date(v: Any, problem: str, problems: list[str]) -> dt.date | None:
    if not v:
        return None
    try:
        d = parse_day(str(v))
    except (ValueError, OverflowError):
        problems.append(problem)
        return None
    if not FIRST_DAY <= d <= LAST_DAY:
        problems.append(_("Dates from {first} to {last} only.").format(first=day(FIRST_DAY), last=day(LAST_DAY)))
        return None
    return d


async def _rows(db: Any, org_id: str, f: Filters, limit: int) -> list[Any]:
    """``db``: the pool, or a connection (``_live`` reads everything in one snapshot)."""
    where, args = f.where(org_id)
    return list(await db.fetch(
        "SELECT u.request_id, u.started_at, u.alias, u.key_id, k.name AS key_name, k.prefix, u.status, u.endpoint,"
        " u.error_code, (extract(epoch FROM u.ended_at - u.started_at) * 1000)::int AS latency_ms,"
        " u.prompt_tokens, u.completion_tokens, u.cost_micro_pln, u.estimated"
        f" FROM usage_records u LEFT JOIN api_keys k ON k.id = u.key_id AND k.org_id = u.org_id WHERE {where}"
        f" ORDER BY u.started_at DESC, u.request_id LIMIT {int(limit)}", *args))


def chart(days: list[dict[str, Any]], width: int = 640, height: int = 160) -> dict[str, Any]:
    """Bars of cost per day (oldest left) as SVG geometry."""
    days = sorted(days, key=lambda d: d["day"])[-60:]
    top = max((d["cost"] for d in days), default=0) or 1
    slot = min(width / max(len(days), 1), 56.0)
    bars = []
    for i, d in enumerate(days):
        h = max(1.0, (height - 20) * d["cost"] / top) if d["cost"] else 0.0
        bars.append({"x": round(i * slot + slot * 0.15, 1), "w": round(slot * 0.7, 1), "y": round(height - 16 - h, 1),
                     "h": round(h, 1), "label": day_short(d["day"]), "cx": round(i * slot + slot / 2, 1),
                     "title": ngettext("{day}: {cost}, {n} request", "{day}: {cost}, {n} requests", d["requests"])
                     .format(day=day(d["day"]), cost=money_exact(d["cost"]), n=d["requests"])})
    return {"width": width, "height": height, "bars": bars, "top": money_exact(top if days else 0)}


async def _live(request: web.Request, org_id: str, f: Filters) -> dict[str, Any]:
    where, args = f.where(org_id)
    sums = ("count(*) AS requests, sum(u.prompt_tokens)::bigint AS prompt, sum(u.completion_tokens)::bigint AS"
            f" completion, sum(u.cost_micro_pln)::bigint AS cost FROM usage_records u WHERE {where} GROUP BY 1")
    # one snapshot: the totals add up to the rows listed, even while the usage writer adds records
    async with console(request).pool.acquire() as conn, conn.transaction(isolation="repeatable_read",
                                                                            readonly=True):
        per_day = [dict(r) for r in await conn.fetch(
            f"SELECT (u.started_at AT TIME ZONE 'Europe/Warsaw')::date AS day, {sums} ORDER BY 1 DESC", *args)]
        per_alias = [dict(r) for r in await conn.fetch(f"SELECT u.alias, {sums} ORDER BY 1", *args)]
        rows = await _rows(conn, org_id, f, PAGE_ROWS)
    return {"rows": rows, "per_day": per_day, "per_alias": per_alias, "chart": chart(per_day),
            "total": sum(d["cost"] for d in per_day), "count": sum(d["requests"] for d in per_day)}


@routes.get("/usage")
async def usage_page(request: web.Request) -> web.Response:
    v = need(request, "usage")
    c = console(request)
    f = Filters.of(request.query)
    keys = await c.pool.fetch("SELECT id, name, prefix FROM api_keys WHERE org_id = $1 ORDER BY created_at", v.org_id)
    aliases = sorted(await _aliases(request, v.org_id))
    return render(request, "usage.html", status=400 if f.problems else 200, f=f, q=f.query(), keys=keys,
                  aliases=aliases, statuses=STATUSES, **await _live(request, v.org_id, f))


async def _aliases(request: web.Request, org_id: str) -> set[str]:
    cat = load_catalog(request)
    used = await console(request).pool.fetch("SELECT DISTINCT alias FROM usage_records WHERE org_id = $1", org_id)
    return set(cat.aliases if cat is not None else ()) | {r["alias"] for r in used}


@routes.get("/usage/live")
async def usage_live(request: web.Request) -> web.Response:
    v = need(request, "usage")
    f = Filters.of(request.query)
    if f.problems:  # the page itself shows them beside the filters; its refresh keeps what it shows
        return render(request, "error.html", status=400, error=" ".join(f.problems))
    return render(request, "usage_live.html", f=f, **await _live(request, v.org_id, f))


FORMULA_START = ("=", "+", "-", "@", "\t", "\r", "\n")


def cell(text: str) -> str:
    """A text cell a spreadsheet shows as text: one that starts like a formula (= + - @, tab, CR, LF)
    gets a leading apostrophe (OWASP's CSV injection advice), so a key named =HYPERLINK(...) stays a name."""
    return "'" + text if text.startswith(FORMULA_START) else text


# The CSV's columns in order: a usage record's field (core/decisions.py), written as its column's type
# is, or one worked out from the row (``WORKED_OUT``)
CSV_COLUMNS = ("started_at", "request_id", "key_id", "key_name", "alias", "endpoint", "status", "error_code",
               "latency_ms", "prompt_tokens", "completion_tokens", "cost_pln", "cost_micro_pln", "estimated")
RECORD_TYPES = {f.name: f.metadata["pg_type"] for f in fields(UsageRecord)}
WORKED_OUT: dict[str, Callable[[Any], object]] = {
    "key_name": lambda r: cell(r["key_name"] or ""), "latency_ms": lambda r: r["latency_ms"],
    "cost_pln": lambda r: micro_to_pln(r["cost_micro_pln"])}


def csv_value(name: str, row: Any) -> object:
    """Column ``name`` of a usage row in the CSV: a time in ISO 8601 (UTC), a text as ``cell`` writes it (empty
    for none), yes or no, a number as it is."""
    if (work := WORKED_OUT.get(name)) is not None:
        return work(row)
    kind, v = RECORD_TYPES[name], row[name]
    if kind == "timestamptz":
        return v.isoformat()
    if kind == "text":
        return cell(v or "")
    if kind == "boolean":
        return "yes" if v else "no"
    return v


@routes.get("/usage.csv")
async def usage_csv(request: web.Request) -> web.Response:
    v = need(request, "usage")
    f = Filters.of(request.query)
    if f.problems:
        raise web.HTTPBadRequest(text=" ".join(f.problems))
    rows = await _rows(console(request).pool, v.org_id, f, CSV_ROWS)
    out = io.StringIO()
    w = csv.writer(out)
    w.writerow(CSV_COLUMNS)
    for r in rows:
        w.writerow([csv_value(name, r) for name in CSV_COLUMNS])
    return web.Response(text=out.getvalue(), content_type="text/csv",
                        headers={"Content-Disposition": 'attachment; filename="usage.csv"'})
