"""``gateway invoices list|show|resend|correct|ksef ORG``: an organisation's invoices for the operator
(docs/cli.md): read them, mail one again to the owners, issue the corrections of those whose buyer's
details have changed since (control/console/invoices.py), and see each one's way to KSeF
(control/ksef/cli.py)."""
from __future__ import annotations

import argparse
import datetime as dt
import json
from typing import TYPE_CHECKING, Any

from .admin import Admin, AdminError
from .ksef import cli as ksef_cli
from .settings import Settings

if TYPE_CHECKING:
    from .console.invoices import Invoice


COMMANDS = ("list", "show", "resend", "correct", "ksef")


def add_commands(group: Any) -> None:
    """Under ``gateway invoices``."""
    ls = group.add_parser("list", help="the organisation's invoices and corrections, the latest first")
    ls.add_argument("org")
    sh = group.add_parser("show", help="one invoice: buyer, lines, totals, payment, what it corrects")
    sh.add_argument("org"); sh.add_argument("invoice", help="its number (FV/2026/000001) or id")
    rs = group.add_parser("resend", help="mail the invoice's PDF to the organisation's owners again")
    rs.add_argument("org"); rs.add_argument("invoice", help="its number or id")
    co = group.add_parser("correct", help="issue corrective invoices (series FK) for the invoices whose buyer"
                          " differs from the organisation's billing details now, and mail them to the owners")
    co.add_argument("org"); co.add_argument("invoice", nargs="*", help="only these (numbers); default: all")
    ksef_cli.add_command(group)


def _line(inv: Invoice) -> str:
    from .console.invoices import pln_text
    who = "private person" if inv.buyer.person else f"NIP {inv.buyer.nip or '-'}"
    fix = f"  corrects {inv.correction.original_number}" if inv.correction else ""
    return f"{inv.number}  {inv.issue_date:%d.%m.%Y}  {pln_text(inv.gross_grosze)}  {inv.buyer.name} ({who}){fix}"


def _details(inv: Invoice) -> str:
    from .console.invoices import pln_text
    b = inv.buyer
    rows = [_line(inv), f"  id {inv.id}, payment {inv.payment_id} ({inv.payment_method}, paid {inv.paid_on:%d.%m.%Y})",
            f"  buyer: {b.name}; {b.address or '-'}; {'private person' if b.person else 'NIP ' + (b.nip or '-')}"]
    rows += [f"  {ln.quantity} {ln.unit} {ln.name}: net {pln_text(ln.net_unit_grosze)} each, {ln.vat_pct}% VAT,"
             f" gross {pln_text(ln.gross_grosze)}" for ln in inv.lines]
    rows += [f"  at {t.vat_pct}%: net {pln_text(t.net_grosze)}, VAT {pln_text(t.vat_grosze)},"
             f" gross {pln_text(t.gross_grosze)}" for t in inv.totals]
    if (fix := inv.correction) is not None:
        before = fix.buyer_before
        rows.append(f"  corrects {fix.original_number} of {fix.original_issue_date:%d.%m.%Y}: {fix.reason};"
                    f" buyer before: {before.name}; {before.address or '-'};"
                    f" {'private person' if before.person else 'NIP ' + (before.nip or '-')}")
    return "\n".join(rows)


def _iso(v: object) -> str:
    """Dates and moments in JSON: ISO 8601."""
    return v.isoformat() if isinstance(v, (dt.date, dt.datetime)) else str(v)


async def _one(a: Admin, org: str, ref: str) -> Invoice:
    from .console import invoices
    inv = await invoices.find(a.pool, org, ref)
    if inv is None:
        raise AdminError(f"organisation {org} has no invoice {ref} (gateway invoices list {org})")
    return inv


async def run(args: argparse.Namespace, a: Admin, s: Settings) -> int:
    """One command (the console's modules imported here: the other commands start without them)."""
    from .console import billing, invoices
    from .console.mail import Mailer
    if await a.pool.fetchval("SELECT 1 FROM orgs WHERE id = $1", args.org) is None:
        raise AdminError(f"no organisation {args.org}")
    as_json = getattr(args, "json", False)

    def out(data: Any, text: str) -> None:
        print(json.dumps(data, default=_iso) if as_json else text)

    if args.sub == "list":
        found = await invoices.org_invoices(a.pool, args.org)
        out([i.as_dict() for i in found], "\n".join(map(_line, found)) or "no invoices yet")
    elif args.sub == "show":
        inv = await _one(a, args.org, args.invoice)
        out(inv.as_dict(), _details(inv))
    elif args.sub == "resend":
        inv = await _one(a, args.org, args.invoice)
        sent = await billing.mail_invoice(a.pool, Mailer(s), s.console_base_url, inv, invoices.Seller.of(s), s)
        out({"number": inv.number, "sent": sent}, f"{inv.number} sent to {sent} owner(s)")
        return 0 if sent else 1
    elif args.sub == "correct":
        issued = await invoices.correct(a.pool, args.org, frozenset(args.invoice))
        for inv in issued:
            await billing.mail_invoice(a.pool, Mailer(s), s.console_base_url, inv, invoices.Seller.of(s), s)
        out([i.as_dict() for i in issued], "\n".join(map(_line, issued))
            or "nothing to correct: every invoice carries the billing details in force")
    elif args.sub == "ksef":
        docs = await ksef_cli.run(a.pool, args.org)
        out(docs, "\n".join(map(ksef_cli.line, docs)) or "no invoices yet")
    return 0
