"""The verification QR codes an invoice's PDF carries once its FA(3) document is for KSeF.  KOD I: a link
to KSeF's invoice check (``<qr address>/invoice/<seller NIP>/<issue date DD-MM-YYYY>/<SHA-256 of the
XML, Base64URL>``, built by ksef-client), labelled with the KSeF number, or ``OFFLINE`` while the
invoice has none (the offline mode: KSeF not reached yet).  KOD II, only while offline and only with the
seller's KSeF offline certificate configured (``offline``): the certificate check
(``<qr address>/certificate/Nip/<seller NIP>/<seller NIP>/<certificate serial>/<SHA-256 of the XML>/
<signature of that path>``), labelled ``CERTYFIKAT``."""
from __future__ import annotations

import datetime as dt
import io
from dataclasses import dataclass
from typing import Any

from ksef_client import KsefClientOptions
from ksef_client.services.qr import add_label_to_qr, generate_qr_png
from ksef_client.services.verification_link import VerificationLinkService

from . import offline
from .sender import sha256_b64
from .settings import KsefSettings

OFFLINE = "OFFLINE"
CERTIFICATE = "CERTYFIKAT"


@dataclass(frozen=True, slots=True)
class Mark:
    """What the PDF shows for KSeF: the link its QR code holds and the label under it."""
    url: str
    label: str
    certificate_url: str | None = None  # KOD II: offline, with the offline certificate configured

    @property
    def offline(self) -> bool:
        return self.label == OFFLINE

    def codes(self) -> list[tuple[str, str]]:
        """(link, label) of each code, KOD I first."""
        return [(self.url, self.label)] + ([(self.certificate_url, CERTIFICATE)] if self.certificate_url else [])

    def draw(self, pdf: Any) -> None:
        """On an fpdf2 page, under what is there: the codes side by side and, in words, what they are."""
        pdf.ln(6)
        pdf.set_font(size=9)
        said = ("Faktura wystawiona w trybie offline: numer KSeF po jej przesłaniu (OFFLINE)" if self.offline
                else f"Numer KSeF: {self.label}")
        pdf.cell(0, 5, said, new_x="LMARGIN", new_y="NEXT")
        if pdf.get_y() + 50 > pdf.page_break_trigger:
            pdf.add_page()
        x, y = pdf.get_x(), pdf.get_y()
        pngs = [add_label_to_qr(generate_qr_png(url, box_size=6, border=2), label) for url, label in self.codes()]
        drawn = [pdf.image(io.BytesIO(png), x=x + 50 * i, y=y, w=40) for i, png in enumerate(pngs)]
        pdf.set_y(y + max(d.rendered_height for d in drawn))
        pdf.set_font(size=7)
        for name, (url, label) in zip(("KOD I", "KOD II"), self.codes()):
            pdf.multi_cell(0, 4, f"{name} ({label}): {url}", new_x="LMARGIN", new_y="NEXT")


def mark(s: KsefSettings, seller_nip: str, issued_on: dt.date, xml: bytes, ksef_number: str | None) -> Mark:
    service = VerificationLinkService(KsefClientOptions(base_url=s.ksef_api_url, base_qr_url=s.ksef_qr_url))
    digest = sha256_b64(xml)
    url = service.build_invoice_verification_url(seller_nip, issued_on, digest)
    if ksef_number or not s.ksef_offline_cert:
        return Mark(url, ksef_number or OFFLINE)
    cert = offline.load(s.ksef_offline_cert, s.ksef_offline_key)
    return Mark(url, OFFLINE, service.build_certificate_verification_url(
        seller_nip=seller_nip, context_identifier_type="Nip", context_identifier_value=seller_nip,
        certificate_serial=cert.serial, invoice_hash=digest, signing_certificate_pem=cert.cert_pem,
        private_key_pem=cert.key_pem))


def of_document(s: KsefSettings, doc: Any) -> Mark | None:
    """The mark of a ``ksef_documents`` row: None when it is not for KSeF (kept, rejected, not made)."""
    if doc is None or doc["state"] not in ("queued", "sent"):
        return None
    return mark(s, doc["seller_nip"], doc["issued_on"], bytes(doc["xml"]), doc["ksef_number"])
