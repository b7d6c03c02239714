"""Billing: the balance, the ledger, the prices in force, top-ups through the payment provider, the
providers' notifications, and the sandbox provider's payment page."""
from __future__ import annotations

import asyncio
import logging
import time
from typing import NoReturn

import aiohttp
import asyncpg
from aiohttp import web
from babel.numbers import format_decimal

from control.admin import AdminError, pln_to_micro

from .. import billing, einvoices, invoices
from ..i18n import _, lang, money
from ..payments import BadNotification, Payment, PaymentError
from ..store import Viewer, name_problem
from ..web import console, dev_only, load_catalog, need, raise_page, render, see_other

routes = web.RouteTableDef()
log = logging.getLogger("console.billing")
AMOUNTS = (10, 20, 50, 100, 200, 500)


async def _ledger(request: web.Request, org_id: str) -> list[dict[str, object]]:
    rows = await console(request).pool.fetch(
        "SELECT created_at AS at, kind, amount_micro_pln AS amount, 1 AS entries FROM ledger"
        " WHERE org_id = $1 AND kind <> 'usage'"
        " UNION ALL SELECT date_trunc('day', created_at AT TIME ZONE 'Europe/Warsaw') AT TIME ZONE 'Europe/Warsaw', 'usage',"
        " sum(amount_micro_pln)::bigint, count(*) FROM ledger WHERE org_id = $1 AND kind = 'usage' GROUP BY 2, 1"
        " ORDER BY 1 DESC LIMIT 200", org_id)
    return [dict(r) for r in rows]


def _prices(request: web.Request) -> list[dict[str, object]]:
    """Each alias's prices in force and its scheduled changes (``scheduled``: effective time, prices)."""
    cat = load_catalog(request)
    if cat is None:
        return []
    now = time.time()
    return [{**a.model_object(now), "scheduled": a.scheduled(now)}
            for a in sorted(cat.aliases.values(), key=lambda a: a.id) if a.offered_at(now)]


@routes.get("/billing")
async def billing_page(request: web.Request) -> web.Response:
    v = need(request, "billing")
    c = console(request)
    bal = await c.admin.balance(v.org_id)
    pid = request.query.get("payment", "")
    watched = await billing.payment_of(c.pool, v.org_id, pid) if pid else None
    # one banner per outcome: paid, waiting (with Cancel), or not paid (cancelled or failed, with Retry)
    outcome = None
    if watched is not None:
        outcome = {"paid": "paid", "pending": "pending"}.get(watched["status"], "unpaid")
        if outcome == "pending" and request.query.get("cancelled"):
            outcome = "unpaid"  # the buyer cancelled at the provider; its notice may still be on its way
    org = await c.pool.fetchrow("SELECT low_balance_micro_pln, billing_name, billing_nip, billing_address,"
                                " billing_person FROM orgs WHERE id = $1", v.org_id)
    return render(request, "billing.html", balance=bal["balance_micro_pln"], credit=bal, ledger=await _ledger(request, v.org_id),
                  prices=_prices(request), payments=await c.pool.fetch(
                      "SELECT * FROM payments WHERE org_id = $1 ORDER BY created_at DESC LIMIT 20", v.org_id),
                  amounts=AMOUNTS, watched=watched, outcome=outcome, provider=c.provider.name,
                  low_balance_text=threshold_text(org["low_balance_micro_pln"]), details=org,
                  invoices=await c.pool.fetch("SELECT i.id, i.number, i.issued_at, i.gross_grosze, d.state AS ksef_state,"
                                              " d.ksef_number, d.xml IS NOT NULL AS fa3 FROM invoices i LEFT JOIN"
                                              " ksef_documents d ON d.number = i.number WHERE i.org_id = $1"
                                              " ORDER BY i.issued_at DESC LIMIT 50", v.org_id),
                  min_pln=billing.MIN_TOPUP_PLN, max_pln=billing.MAX_TOPUP_PLN)


def threshold_text(micro: int | None) -> str:
    """The threshold as the form takes it back: "12,50" / "12.50" (nothing when off)."""
    return format_decimal(micro / 1_000_000, "0.00", locale=lang()) if micro else ""


async def _start_topup(request: web.Request, v: Viewer, micro: int) -> NoReturn:
    """Register a payment of ``micro`` with the provider and send the buyer there."""
    c = console(request)
    pid = await billing.create_payment(c.pool, c.provider.name, v.org_id, micro, v.user_id)
    payment = Payment(pid, v.org_id, micro, v.email, _("Top-up {org}").format(org=v.org_name)[:100])
    try:
        url = await c.provider.start(payment, f"{c.base_url}/billing/return/{pid}",
                                     f"{c.base_url}/payments/notify/{c.provider.name}")
    except PaymentError as e:
        log.warning("payment %s not registered: %s", pid, e)
        await c.pool.execute("UPDATE payments SET status = 'failed' WHERE id = $1", pid)
        raise_page(request, 502, _("The payment provider is not reachable now; try again later."))
    see_other(url)


async def _form_micro(request: web.Request, name: str) -> int | None:
    """The form's amount in PLN ("12,50" or "12.50") in micro-PLN: None when empty, 0 when not an amount."""
    raw = str((await request.post()).get(name, "")).strip().replace(",", ".")
    if not raw:
        return None
    try:
        return pln_to_micro(raw)
    except AdminError:
        return 0


async def _payment(request: web.Request, v: Viewer) -> asyncpg.Record:
    """The organisation's payment named in the path, else the 404 page."""
    row = await billing.payment_of(console(request).pool, v.org_id, request.match_info["payment_id"])
    if row is None:
        raise_page(request, 404, _("There is no such payment in this organisation."))
    return row


@routes.post("/billing/topup")
async def topup(request: web.Request) -> web.Response:
    v = need(request, "billing")
    micro = await _form_micro(request, "amount") or 0
    if not billing.MIN_TOPUP_PLN * 1_000_000 <= micro <= billing.MAX_TOPUP_PLN * 1_000_000 or micro % 10_000:
        raise_page(request, 400, _("Choose an amount from {min} to {max} (at most 2 decimal places).")
                   .format(min=money(billing.MIN_TOPUP_PLN * 1_000_000), max=money(billing.MAX_TOPUP_PLN * 1_000_000)))
    await _start_topup(request, v, micro)


LOW_BALANCE_MAX_PLN = 100_000


@routes.post("/billing/details")
async def set_details(request: web.Request) -> web.Response:
    """The organisation's billing details for its invoices: a company (name, NIP checked by its
    checksum, address) or a private person (name, address).  Invoices already issued keep theirs."""
    v = need(request, "billing")
    form = await request.post()
    person = form.get("person") == "1"
    name = str(form.get("name", "")).strip()
    nip = invoices.normal_nip(str(form.get("nip", "")))
    address = str(form.get("address", "")).strip().replace("\r\n", "\n")
    problems = [p for p in (name_problem(name, _("name")),) if p]
    if not name or len(name) > 200:
        problems.append(_("Enter the name to put on invoices (at most 200 characters)."))
    if not address or len(address) > 300:
        problems.append(_("Enter the address (at most 300 characters)."))
    if not person and not invoices.nip_valid(nip):
        problems.append(_("The NIP is not valid: 10 digits whose last one is the checksum."))
    if problems:
        raise_page(request, 400, " ".join(problems))
    await console(request).pool.execute(
        "UPDATE orgs SET billing_name = $2, billing_nip = $3, billing_address = $4, billing_person = $5 WHERE id = $1",
        v.org_id, name, None if person else nip, address, person)
    see_other("/billing?msg=details_saved")


@routes.get("/billing/invoices/{invoice_id}.pdf")
async def invoice_pdf(request: web.Request) -> web.Response:
    v = need(request, "billing")
    inv = await console(request).pool.fetchrow("SELECT * FROM invoices WHERE id = $1 AND org_id = $2",
                                                request.match_info["invoice_id"], v.org_id)
    if inv is None:
        raise_page(request, 404, _("There is no such invoice in this organisation."))
    pdf = invoices.render_pdf(inv, invoices.Seller.of(console(request).settings),
                              await einvoices.mark(console(request), inv["number"]))
    return web.Response(body=pdf, content_type="application/pdf", headers={
        "Content-Disposition": f'attachment; filename="{inv["number"].replace("/", "-")}.pdf"'})


@routes.get("/billing/invoices/{invoice_id}.xml")
async def invoice_fa3(request: web.Request) -> web.Response:
    """The invoice's FA(3) structured document (what KSeF has, or would have)."""
    v = need(request, "billing")
    doc = await console(request).pool.fetchrow(
        "SELECT d.number, d.xml FROM invoices i JOIN ksef_documents d ON d.number = i.number"
        " WHERE i.id = $1 AND i.org_id = $2 AND d.xml IS NOT NULL", request.match_info["invoice_id"], v.org_id)
    if doc is None:
        raise_page(request, 404, _("There is no such invoice in this organisation."))
    return web.Response(body=bytes(doc["xml"]), content_type="application/xml", charset="utf-8", headers={
        "Content-Disposition": f'attachment; filename="{doc["number"].replace("/", "-")}.xml"'})


@routes.post("/billing/low-balance")
async def set_low_balance(request: web.Request) -> web.Response:
    """The owner's threshold for the low-balance e-mail (PLN; empty: no e-mail)."""
    v = need(request, "billing")
    micro = await _form_micro(request, "threshold")
    if micro is not None and (not 0 < micro <= LOW_BALANCE_MAX_PLN * 1_000_000 or micro % 10_000):
        raise_page(request, 400, _("Enter a threshold from {min} to {max} (at most 2 decimal places), or nothing"
                                   " to turn the e-mail off.").format(min=money(10_000),
                                                                      max=money(LOW_BALANCE_MAX_PLN * 1_000_000)))
    await console(request).pool.execute(
        "UPDATE orgs SET low_balance_micro_pln = $2, low_balance_mailed_at = NULL WHERE id = $1", v.org_id, micro)
    see_other("/billing?msg=" + ("low_balance_set" if micro else "low_balance_off"))


@routes.post("/billing/payment/{payment_id}/cancel")
async def cancel_payment(request: web.Request) -> web.Response:
    """Give up on a pending top-up (the buyer left the provider's page).  Should the provider still
    report it paid, it is credited all the same: money received is never lost."""
    c = console(request)
    pid = (await _payment(request, need(request, "billing")))["id"]
    await c.pool.execute("UPDATE payments SET status = 'cancelled' WHERE id = $1 AND status = 'pending'", pid)
    see_other(f"/billing?payment={pid}")


@routes.post("/billing/payment/{payment_id}/retry")
async def retry_payment(request: web.Request) -> web.Response:
    """A new top-up of the same amount as one that was cancelled or failed."""
    v = need(request, "billing")
    row = await _payment(request, v)
    if row["status"] not in ("failed", "cancelled"):
        see_other(f"/billing?payment={row['id']}")
    await _start_topup(request, v, row["amount_micro_pln"])


@routes.get("/billing/return/{payment_id}")
async def payment_return(request: web.Request) -> web.Response:
    """The buyer's browser comes back: this credits nothing, it only shows the payment's state."""
    pid = (await _payment(request, need(request, "billing")))["id"]
    see_other(f"/billing?payment={pid}" + ("&cancelled=1" if request.query.get("cancelled") else ""))


@routes.get("/billing/payment/{payment_id}")
async def payment_status(request: web.Request) -> web.Response:
    row = await _payment(request, need(request, "billing"))
    return web.json_response({"id": row["id"], "status": row["status"], "amount_micro_pln": row["amount_micro_pln"]})


@routes.post("/payments/notify/{provider}")
async def notify(request: web.Request) -> web.Response:
    c = console(request)
    if request.match_info["provider"] != c.provider.name:
        return web.Response(status=404, text="unknown provider")
    body = await request.read()
    try:
        result = await billing.handle_notification(c.admin, c.provider, body, request.content_type)
    except BadNotification as e:
        log.warning("notification refused: %s", e)
        return web.Response(status=400, text="refused")
    except PaymentError as e:
        log.warning("notification not verified: %s", e)
        return web.Response(status=502, text="not verified")
    paid = result.pop("payment_id", None)
    if paid is not None:
        # the invoice is issued before the provider is answered (a failure here makes it retry; the
        # credit and the invoice are both once per payment); its e-mail goes out off this answer
        inv, created = await invoices.issue_for_payment(c.pool, paid)
        if created and inv is not None:
            c.ksef_wake.set()  # its FA(3) document made and sent now
            c.background.run(billing.mail_invoice(c.pool, c.mailer, c.base_url, inv, invoices.Seller.of(c.settings)),
                             "invoice mail")
    return web.json_response(result)


# ---- the sandbox provider's payment page ------------------------------------------------------

async def _sandbox_payment(request: web.Request) -> asyncpg.Record:
    dev_only(request)  # free money: development mode, loopback only
    if console(request).provider.name != "sandbox":
        raise web.HTTPNotFound()
    return await _payment(request, need(request, "billing"))


@routes.get("/sandbox/pay/{payment_id}")
async def sandbox_page(request: web.Request) -> web.Response:
    row = await _sandbox_payment(request)
    return render(request, "sandbox_pay.html", payment=row)


@routes.post("/sandbox/pay/{payment_id}")
async def sandbox_pay(request: web.Request) -> web.Response:
    row = await _sandbox_payment(request)
    c = console(request)
    paid = (await request.post()).get("action") == "pay"
    doc = c.provider.notification(row["id"], row["amount_micro_pln"], paid)  # type: ignore[attr-defined]
    host = c.settings.gateway_host if c.settings.gateway_host not in ("0.0.0.0", "::", "") else "127.0.0.1"
    url = f"http://{host}:{c.settings.console_http_port}/payments/notify/sandbox"
    c.background.run(_deliver(url, doc), "sandbox notification")
    see_other(f"/billing/return/{row['id']}" + ("" if paid else "?cancelled=1"))


async def _deliver(url: str, doc: dict[str, object]) -> None:
    """Like a real provider: server to server, after the buyer's redirect, retried on failure."""
    await asyncio.sleep(0.2)
    for attempt in range(5):
        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
                async with http.post(url, json=doc) as r:
                    if r.status < 500:
                        return
        except (aiohttp.ClientError, TimeoutError):
            pass
        await asyncio.sleep(0.5 * (attempt + 1))
