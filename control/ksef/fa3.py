"""A VAT invoice, or its correction, as an FA(3) document: the structured invoice KSeF takes (form
``FA (3)``, schema version ``1-0E``), built with ksef-client's FA(3) builders and checked against the
official XSD that package ships before it is returned (a document the schema refuses is never kept or
sent).

What an invoice says maps one to one: ``P_1`` the issue date and ``P_6`` the sale date (the day of the
payment), ``P_2`` the number, ``Podmiot1`` the seller (``GATEWAY_SELLER_*``), ``Podmiot2`` the buyer (its
NIP, or ``BrakID`` for a private person), one line ``FaWiersz`` (one unit of the prepaid service; net,
VAT at 23 % and gross as the invoice has them, to the grosz: the gross is the amount paid), and the
payment made (``Platnosc``: ``Zaplacono``, its date, form 6, a transfer).  A correction is ``KOR``: it
names the corrected invoice by its number, issue date and KSeF number (``DaneFaKorygowanej``), the
buyer as the original had it (``Podmiot2K``) and the line before and after (equal when only the buyer's
details change)."""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from ksef_client.documents.fa3 import (Address, FA3Invoice, InvoiceLine, InvoiceParty, PaymentMethod,
                                       PaymentTerms, VatClass)

FORM = ("FA (3)", "1-0E", "FA")  # system code, schema version, value: the session's form code
LINE = "Doładowanie salda usługi (przedpłata)"


@dataclass(frozen=True, slots=True)
class Party:
    """A seller or buyer: ``nip`` None for a private person."""
    name: str
    nip: str | None
    address: str | None


@dataclass(frozen=True, slots=True)
class Amounts:
    """An invoice's one line in grosze (net + VAT = gross) at ``vat_pct``."""
    net: int
    vat: int
    gross: int
    vat_pct: int


@dataclass(frozen=True, slots=True)
class Invoice:
    """What an FA(3) document of an issued invoice is made of."""
    number: str
    issued_on: dt.date
    seller: Party
    buyer: Party
    amounts: Amounts


@dataclass(frozen=True, slots=True)
class Corrected:
    """The invoice a correction corrects: as it was issued, and its KSeF number if it got one."""
    invoice: Invoice
    ksef_number: str | None


def _zl(grosze: int) -> Decimal:
    return Decimal(grosze).scaleb(-2)


def _party(p: Party) -> InvoiceParty:
    address = Address.polish(p.address) if p.address else None
    if p.nip is None:
        return InvoiceParty.without_tax_id(name=p.name, address=address)
    return InvoiceParty.polish_company(nip=p.nip, name=p.name, address=address)


def _line(a: Amounts) -> dict[str, Any]:
    """One unit of the service; net, VAT and gross given, not recomputed (the gross is what was paid)."""
    return {"quantity": 1, "unit_net_price": _zl(a.net), "unit": "usł.", "tax": VatClass.standard_23(),
            "net_amount": _zl(a.net), "vat_amount": _zl(a.vat), "gross_amount": _zl(a.gross)}


def _paid(on: dt.date) -> PaymentTerms:
    return PaymentTerms(paid_date=on, method=PaymentMethod.TRANSFER.value)


def invoice_xml(inv: Invoice) -> bytes:
    """The FA(3) document (``VAT``) of an invoice, valid against the official schema."""
    assert inv.amounts.vat_pct == 23, "the console issues 23 % invoices only"
    doc = (FA3Invoice.basic(inv.number).add_line(LINE, **_line(inv.amounts)).issued_on(inv.issued_on).sale_date(inv.issued_on)
           .seller(_party(inv.seller)).buyer(_party(inv.buyer)).payment(_paid(inv.issued_on))
           .build())
    return doc.to_xml(xsd_validate=True)


def correction_xml(corr: Invoice, of: Corrected, reason: str) -> bytes:
    """The FA(3) correction (``KOR``) ``corr`` of invoice ``of``, valid against the official schema."""
    before = of.invoice
    doc = (FA3Invoice.correction(corr.number).issued_on(corr.issued_on).sale_date(before.issued_on)
           .seller(_party(corr.seller)).buyer(_party(corr.buyer))
           .corrects_invoice(number=before.number, issue_date=before.issued_on, reason=reason,
                             ksef_number=of.ksef_number)
           .corrected_buyer(_party(before.buyer))
           .add_corrected_line_before_after(before=InvoiceLine.service(LINE, **_line(before.amounts)),
                                            after=InvoiceLine.service(LINE, **_line(corr.amounts)))
           .build())
    return doc.to_xml(xsd_validate=True)
