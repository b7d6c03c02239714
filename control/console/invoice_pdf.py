"""An invoice (or correction) as the PDF a Polish bookkeeper expects: A4, the legal text in Polish, and
English labels beside the Polish ones when the reader's language is English; dates as dd.mm.rrrr;
quantity, unit, net unit price, the totals per VAT rate, the amount due, the payment's method and
date; a correction shows the state before and after; KSeF's verification QR code (``control.ksef.qr``)
when the invoice's FA(3) document is for KSeF.  fpdf2 with an embedded font with Polish letters
(Source Sans Pro, from pip)."""
from __future__ import annotations

import asyncio
import datetime as dt
import os
from concurrent.futures import ThreadPoolExecutor
from functools import cache

from control.ksef.qr import Mark

from .invoices import Buyer, Invoice, Line, RateTotal, Seller, pln_text

METHODS = {"p24": ("Przelewy24 (płatność online)", "Przelewy24 (online payment)"),
           "sandbox": ("płatność testowa (tryb deweloperski)", "test payment (development mode)")}
LINE_NAMES_EN = {"Doładowanie salda usługi (przedpłata)": "Top-up of the service balance (prepayment)"}


# one PDF at a time, off the event loop (a few hundred ms of CPU each, mostly the font's subsetting): a
# burst of payments queues its invoices here, not in the default executor in front of other work (mail)
_RENDERER = ThreadPoolExecutor(1, thread_name_prefix="invoice-pdf")


async def render_off_loop(inv: Invoice, seller: Seller, ksef: Mark | None, lang: str = "pl") -> bytes:
    return await asyncio.get_running_loop().run_in_executor(_RENDERER, render, inv, seller, ksef, lang)


def day(d: dt.date) -> str:
    """A date as Polish documents write it: 28.11.2026."""
    return f"{d:%d.%m.%Y}"


@cache
def _fonts() -> str:
    from importlib.util import find_spec
    spec = find_spec("font_source_sans_pro")
    assert spec is not None and spec.origin is not None, "font-source-sans-pro is a dependency"
    return os.path.join(os.path.dirname(spec.origin), "files")


def render(inv: Invoice, seller: Seller, ksef: Mark | None, lang: str = "pl") -> bytes:
    """The PDF of ``inv``; ``ksef``: its KSeF QR code (None: not for KSeF); ``lang`` "en" adds the English
    labels beside the Polish."""
    from fpdf import FPDF
    from fpdf.fonts import FontFace

    def t(pl: str, en: str) -> str:
        return f"{pl} / {en}" if lang == "en" else pl

    fix = inv.correction
    title = t("Faktura korygująca nr", "Corrective invoice No.") if fix else t("Faktura VAT nr", "VAT invoice No.")
    pdf = FPDF(format="A4")
    pdf.set_title(f"{title} {inv.number}")
    pdf.add_font("SSP", "", os.path.join(_fonts(), "SourceSansPro-Regular.ttf"))
    pdf.add_font("SSP", "B", os.path.join(_fonts(), "SourceSansPro-Bold.ttf"))
    pdf.add_page()

    def line(h: float, text: str, style: str = "", size: int = 10) -> None:
        pdf.set_font("SSP", style, size)
        pdf.multi_cell(0, h, text, align="L", new_x="LMARGIN", new_y="NEXT")

    def party(heading: str, name: str, address: str, ident: str) -> None:
        line(6, heading, "B", 11)
        for text in (name, address, ident):
            line(5, text)
        pdf.ln(2)

    def buyer(heading: str, b: Buyer) -> None:
        party(heading, b.name, b.address, t("osoba prywatna", "private person") if b.person else f"NIP: {b.nip or '-'}")

    def lines_table(rows: tuple[Line, ...]) -> None:
        pdf.set_font("SSP", "", 8)
        head = (t("Lp.", "No."), t("Nazwa", "Description"), t("Ilość", "Qty"), t("J.m.", "Unit"),
                t("Cena netto", "Net unit price"), t("Wartość netto", "Net amount"), t("VAT %", "VAT rate"),
                t("Kwota VAT", "VAT amount"), t("Wartość brutto", "Gross amount"))
        with pdf.table(col_widths=(8, 52, 12, 12, 22, 22, 16, 22, 24), text_align="CENTER",
                       headings_style=FontFace(emphasis="BOLD")) as table:
            table.row(head)
            for n, r in enumerate(rows, 1):
                name = f"{r.name} / {LINE_NAMES_EN.get(r.name, r.name)}" if lang == "en" else r.name
                table.row((str(n), name, str(r.quantity), r.unit, pln_text(r.net_unit_grosze),
                           pln_text(r.net_grosze), f"{r.vat_pct}%", pln_text(r.vat_grosze), pln_text(r.gross_grosze)))
        pdf.ln(2)

    def rate_table(totals: tuple[RateTotal, ...]) -> None:
        pdf.set_font("SSP", "", 9)
        with pdf.table(col_widths=(40, 50, 50, 50), text_align="RIGHT",
                       headings_style=FontFace(emphasis="BOLD")) as table:
            table.row((t("Stawka VAT", "VAT rate"), t("Wartość netto", "Net amount"), t("Kwota VAT", "VAT amount"),
                       t("Wartość brutto", "Gross amount")))
            for r in totals:
                table.row((f"{r.vat_pct}%", pln_text(r.net_grosze), pln_text(r.vat_grosze), pln_text(r.gross_grosze)))
            table.row((t("Razem", "Total"), pln_text(sum(r.net_grosze for r in totals)),
                       pln_text(sum(r.vat_grosze for r in totals)), pln_text(sum(r.gross_grosze for r in totals))))
        pdf.ln(3)

    line(10, f"{title} {inv.number}", "B", 16)
    line(6, f"{t('Data wystawienia', 'Issue date')}: {day(inv.issue_date)}")
    line(6, f"{t('Data sprzedaży (otrzymania zapłaty)', 'Date of sale (payment received)')}: {day(inv.sale_date)}")
    if fix:
        line(6, f"{t('Dotyczy faktury', 'Corrects invoice')} {fix.original_number}"
                f" {t('z dnia', 'of')} {day(fix.original_issue_date)}")
        line(6, f"{t('Przyczyna korekty', 'Reason for correction')}: {fix.reason}")
    pdf.ln(3)
    party(t("Sprzedawca", "Seller"), seller.name, seller.address, f"NIP: {seller.nip}")
    if fix:
        buyer(t("Nabywca przed korektą", "Buyer before correction"), fix.buyer_before)
        buyer(t("Nabywca po korekcie", "Buyer after correction"), inv.buyer)
        line(6, t("Pozycje przed korektą", "Items before correction"), "B", 11)
        lines_table(fix.lines_before)
        line(6, t("Pozycje po korekcie", "Items after correction"), "B", 11)
    else:
        buyer(t("Nabywca", "Buyer"), inv.buyer)
    lines_table(inv.lines)
    rate_table(inv.totals)
    if fix:
        diff = inv.gross_grosze - sum(r.gross_grosze for r in fix.totals_before)
        line(6, f"{t('Różnica (korekta wartości)', 'Difference (value corrected)')}: {pln_text(diff)}", "B", 11)
    if inv.prepayment:
        line(5, t("Faktura dokumentuje otrzymanie całości zapłaty przed wykonaniem usługi (przedpłata na saldo"
                  " usługi, rozliczana z opłatami za jej użycie).",
                  "This invoice documents a prepayment received in full before the service is provided (a top-up"
                  " of the service balance, settled against the charges for its use)."), "", 9)
    pdf.ln(2)
    method = METHODS.get(inv.payment_method, (inv.payment_method, inv.payment_method))
    line(6, f"{t('Sposób płatności', 'Payment method')}: {t(*method)}")
    line(6, f"{t('Zapłacono', 'Paid')}: {pln_text(inv.paid_grosze)}, {t('dnia', 'on')} {day(inv.paid_on)}")
    line(7, f"{t('Do zapłaty', 'Amount due')}: {pln_text(inv.due_grosze)}", "B", 11)
    line(5, f"{t('Płatność', 'Payment')}: {inv.payment_id}", "", 8)
    if ksef is not None:
        ksef.draw(pdf)
    return bytes(pdf.output())
