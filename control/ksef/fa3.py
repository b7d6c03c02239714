"""A VAT invoice, or its correction, as an FA(3) document: the structured invoice KSeF takes (form
``FA (3)``, schema version ``1-0E``), built with ksef-client's FA(3) builders and checked against the
official XSD that package ships before it is returned (a document the schema refuses is never kept or
sent).

The typed invoice record (``control.console.invoices.Invoice``) maps one to one: ``P_1`` its issue date
and ``P_6`` its sale date (the day of the payment), ``P_2`` the number, ``Podmiot1`` the seller
(``GATEWAY_SELLER_*``), ``Podmiot2`` the buyer (its NIP, or ``BrakID`` for a private person), a
``FaWiersz`` per line (quantity, unit, net unit price; net, VAT and gross as the invoice has them, to
the grosz: the gross is the amount paid), and the payment made (``Platnosc``: ``Zaplacono``, its date,
form 6, a transfer).  A correction is ``KOR``: it names the corrected invoice by its number, issue
date and KSeF number (``DaneFaKorygowanej``), the buyer as the state it replaces had it (``Podmiot2K``)
and each line before and after (equal when only the buyer's details change).  The prepayment is said
by the line's name, as on the PDF: the document is a ``VAT`` invoice of the payment received."""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from ksef_client.documents.fa3 import (Address, FA3Invoice, InvoiceLine, InvoiceParty, PaymentMethod,
                                       PaymentTerms, VatClass)

if TYPE_CHECKING:
    from control.console.invoices import Buyer, Invoice, Line

FORM = ("FA (3)", "1-0E", "FA")  # system code, schema version, value: the session's form code


@dataclass(frozen=True, slots=True)
class Party:
    """The seller: its 10-digit NIP."""
    name: str
    nip: str
    address: str


def _zl(grosze: int) -> Decimal:
    return Decimal(grosze).scaleb(-2)


def _seller(p: Party) -> InvoiceParty:
    return InvoiceParty.polish_company(nip=p.nip, name=p.name, address=Address.polish(p.address))


def _buyer(b: Buyer) -> InvoiceParty:
    address = Address.polish(b.address) if b.address else None
    if b.person or not b.nip:
        return InvoiceParty.without_tax_id(name=b.name, address=address)
    return InvoiceParty.polish_company(nip=b.nip, name=b.name, address=address)


def _line(ln: Line) -> dict[str, Any]:
    """A line's values as the invoice has them, not recomputed (the gross is what was paid)."""
    assert ln.vat_pct == 23, "the console issues 23 % invoices only"
    return {"quantity": ln.quantity, "unit_net_price": _zl(ln.net_unit_grosze), "unit": ln.unit,
            "tax": VatClass.standard_23(), "net_amount": _zl(ln.net_grosze), "vat_amount": _zl(ln.vat_grosze),
            "gross_amount": _zl(ln.gross_grosze)}


def _paid(on: dt.date) -> PaymentTerms:
    return PaymentTerms(paid_date=on, method=PaymentMethod.TRANSFER.value)


def invoice_xml(inv: Invoice, seller: Party) -> bytes:
    """The FA(3) document (``VAT``) of an invoice, valid against the official schema."""
    assert inv.correction is None, "a correction is correction_xml's"
    doc = FA3Invoice.basic(inv.number)
    for ln in inv.lines:
        doc = doc.add_line(ln.name, **_line(ln))
    return (doc.issued_on(inv.issue_date).sale_date(inv.sale_date).seller(_seller(seller)).buyer(_buyer(inv.buyer))
            .payment(_paid(inv.paid_on)).build().to_xml(xsd_validate=True))


def correction_xml(inv: Invoice, seller: Party, original_ksef_number: str | None) -> bytes:
    """The FA(3) correction (``KOR``) of a correction: it names the original (number, issue date, KSeF
    number: None when the original never got one), the buyer and lines before and after; valid against
    the official schema."""
    fix = inv.correction
    assert fix is not None and len(fix.lines_before) == len(inv.lines), "a correction keeps its lines"
    doc = (FA3Invoice.correction(inv.number).issued_on(inv.issue_date).sale_date(inv.sale_date)
           .seller(_seller(seller)).buyer(_buyer(inv.buyer))
           .corrects_invoice(number=fix.original_number, issue_date=fix.original_issue_date, reason=fix.reason,
                             ksef_number=original_ksef_number)
           .corrected_buyer(_buyer(fix.buyer_before)))
    for before, after in zip(fix.lines_before, inv.lines):
        doc = doc.add_corrected_line_before_after(before=InvoiceLine.service(before.name, **_line(before)),
                                                  after=InvoiceLine.service(after.name, **_line(after)))
    return doc.build().to_xml(xsd_validate=True)
