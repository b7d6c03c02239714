"""VAT invoices for top-ups: one per paid payment, numbered without gaps per calendar year in Warsaw
(``FV/2026/000123``), 23% VAT with the amount paid as the gross, net and VAT exact in grosze; the
buyer's details as the organisation's billing details stood when the invoice was issued; rendered as a
PDF with fpdf2 and an embedded font with Polish letters (Source Sans Pro, from pip).

Gap-free numbering: the year's counter row is incremented in the same transaction that inserts the
invoice (``INSERT … ON CONFLICT DO UPDATE … RETURNING`` locks the row until commit), so concurrent
payments queue on it and a rolled-back issue gives its number back."""
from __future__ import annotations

import datetime as dt
import os
import secrets
from dataclasses import dataclass
from typing import Any

import asyncpg

from control.ksef import store as ksef_store
from control.ksef.qr import Mark
from core.catalog import WARSAW

from .settings import ConsoleSettings

VAT_PCT = 23
_NIP_WEIGHTS = (6, 5, 7, 2, 3, 4, 5, 6, 7)


def nip_valid(nip: str) -> bool:
    """A Polish tax number: 10 digits (dashes and spaces allowed) whose last is the checksum: the
    weighted sum of the first nine modulo 11 (never 10)."""
    digits = normal_nip(nip)
    if len(digits) != 10 or not digits.isdigit():
        return False
    check = sum(int(d) * w for d, w in zip(digits, _NIP_WEIGHTS)) % 11
    return check != 10 and check == int(digits[9])


def normal_nip(nip: str) -> str:
    return nip.replace("-", "").replace(" ", "")


def split_gross(gross_grosze: int) -> tuple[int, int]:
    """(net, VAT) in grosze of a gross amount at 23%: net = gross / 1.23 rounded half up, VAT = the rest,
    so net + VAT is the amount paid to the grosz."""
    net = (gross_grosze * 200 + (100 + VAT_PCT)) // (2 * (100 + VAT_PCT))
    return net, gross_grosze - net


def grosze(micro_pln: int) -> int:
    assert micro_pln % 10_000 == 0, "top-ups are whole grosze"
    return micro_pln // 10_000


def pln_text(g: int) -> str:
    """Grosze as Polish invoices write them: 1 234,56 zł."""
    whole = f"{g // 100:,}".replace(",", "\u00a0")
    return f"{whole},{g % 100:02d} zł"


@dataclass(frozen=True, slots=True)
class Seller:
    name: str
    nip: str
    address: str

    @classmethod
    def of(cls, s: ConsoleSettings) -> "Seller":
        """The operator's company as GATEWAY_SELLER_* give it (placeholders say what to set)."""
        return cls(s.seller_name or "(set GATEWAY_SELLER_NAME)", s.seller_nip or "(set GATEWAY_SELLER_NIP)",
                   s.seller_address or "(set GATEWAY_SELLER_ADDRESS)")


async def issue_for_payment(pool: asyncpg.Pool, payment_id: str) -> tuple[asyncpg.Record | None, bool]:
    """(the invoice of a paid payment, whether this call issued it): issued once (idempotent, the
    payment's row locked while deciding); (None, False) if the payment is not paid."""
    async with pool.acquire() as conn, conn.transaction():
        pay = await conn.fetchrow("SELECT * FROM payments WHERE id = $1 AND status = 'paid' FOR UPDATE", payment_id)
        if pay is None:
            return None, False
        existing = await conn.fetchrow("SELECT * FROM invoices WHERE payment_id = $1", payment_id)
        if existing is not None:
            return existing, False
        org = await conn.fetchrow("SELECT name, billing_name, billing_nip, billing_address, billing_person"
                                  " FROM orgs WHERE id = $1", pay["org_id"])
        issued = dt.datetime.now(WARSAW)
        seq = await conn.fetchval(
            "INSERT INTO invoice_counters (year, last) VALUES ($1, 1)"
            " ON CONFLICT (year) DO UPDATE SET last = invoice_counters.last + 1 RETURNING last", issued.year)
        gross = grosze(pay["amount_micro_pln"])
        net, vat = split_gross(gross)
        inv = await conn.fetchrow(
            "INSERT INTO invoices (id, number, year, seq, org_id, payment_id, issued_at, gross_grosze, net_grosze,"
            " vat_grosze, vat_pct, buyer_name, buyer_nip, buyer_address, buyer_person)"
            " VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15) RETURNING *",
            "inv_" + secrets.token_hex(8), f"FV/{issued.year}/{seq:06d}", issued.year, seq, pay["org_id"],
            payment_id, issued, gross, net, vat, VAT_PCT, org["billing_name"] or org["name"],
            org["billing_nip"], org["billing_address"], bool(org["billing_person"]))
        await ksef_store.enqueue(conn, inv["number"], inv["org_id"])  # its FA(3) document, for KSeF
        return inv, True


def render_pdf(inv: Any, seller: Seller, ksef: Mark | None = None) -> bytes:
    """The invoice as a PDF (A4, one page), with its KSeF QR code when it has one."""
    from importlib.util import find_spec

    from fpdf import FPDF
    spec = find_spec("font_source_sans_pro")
    assert spec is not None and spec.origin is not None, "font-source-sans-pro is a dependency"
    fonts = os.path.join(os.path.dirname(spec.origin), "files")
    pdf = FPDF(format="A4")
    pdf.set_title(f"Faktura VAT {inv['number']}")
    pdf.add_font("SSP", "", os.path.join(fonts, "SourceSansPro-Regular.ttf"))
    pdf.add_font("SSP", "B", os.path.join(fonts, "SourceSansPro-Bold.ttf"))
    pdf.add_page()

    def line(h: float, text: str, style: str = "", size: int = 10) -> None:
        pdf.set_font("SSP", style, size)
        pdf.cell(0, h, text, new_x="LMARGIN", new_y="NEXT")

    line(10, f"Faktura VAT nr {inv['number']}", "B", 16)
    line(6, f"Data wystawienia i sprzedaży: {inv['issued_at'].astimezone(WARSAW):%Y-%m-%d}")
    pdf.ln(4)
    buyer_id = "osoba prywatna" if inv["buyer_person"] else f"NIP: {inv['buyer_nip'] or '-'}"
    for title, lines in (("Sprzedawca", [seller.name, seller.address, f"NIP: {seller.nip}"]),
                         ("Nabywca", [inv["buyer_name"], inv["buyer_address"] or "", buyer_id])):
        line(6, title, "B", 11)
        pdf.set_font("SSP", "", 10)
        for text in lines:
            pdf.multi_cell(0, 5, text, new_x="LMARGIN", new_y="NEXT")
        pdf.ln(3)
    row = ("Doładowanie salda usługi (przedpłata)", pln_text(inv["net_grosze"]), f"{inv['vat_pct']}%",
           pln_text(inv["vat_grosze"]), pln_text(inv["gross_grosze"]))
    for style, cells, gap in (("B", ("Nazwa", "Netto", "VAT %", "VAT", "Brutto"), 7), ("", row, 10)):
        pdf.set_font("SSP", style, 10)
        for w, text in zip((80, 30, 20, 30, 30), cells):
            pdf.cell(w, 7, text, border=1)
        pdf.ln(gap)
    line(7, f"Do zapłaty: {pln_text(inv['gross_grosze'])} (zapłacono)", "B", 11)
    line(6, f"Płatność: {inv['payment_id']}", "", 9)
    if ksef is not None:
        ksef.draw(pdf)
    return bytes(pdf.output())
