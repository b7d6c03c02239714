"""The verification QR code ("KOD I") an invoice's PDF carries once its FA(3) document is for KSeF: a link
to KSeF's invoice check (``<qr address>/invoice/<seller NIP>/<issue date DD-MM-YYYY>/<SHA-256 of the
XML, Base64URL>``, built by ksef-client), labelled with the KSeF number, or ``OFFLINE`` while the
invoice has none (the offline mode: KSeF not reached yet)."""
from __future__ import annotations

import datetime as dt
import io
from dataclasses import dataclass
from typing import Any

from ksef_client import KsefClientOptions
from ksef_client.services.qr import add_label_to_qr, generate_qr_png
from ksef_client.services.verification_link import VerificationLinkService

from .sender import sha256_b64
from .settings import KsefSettings

OFFLINE = "OFFLINE"


@dataclass(frozen=True, slots=True)
class Mark:
    """What the PDF shows for KSeF: the link its QR code holds and the label under it."""
    url: str
    label: str

    @property
    def offline(self) -> bool:
        return self.label == OFFLINE

    def png(self) -> bytes:
        return add_label_to_qr(generate_qr_png(self.url, box_size=6, border=2), self.label)

    def draw(self, pdf: Any) -> None:
        """On an fpdf2 page, under what is there: the code and, in words, what it is."""
        pdf.ln(6)
        pdf.set_font(size=9)
        said = ("Faktura wystawiona w trybie offline: numer KSeF po jej przesłaniu (OFFLINE)" if self.offline
                else f"Numer KSeF: {self.label}")
        pdf.cell(0, 5, said, new_x="LMARGIN", new_y="NEXT")
        pdf.image(io.BytesIO(self.png()), w=40)
        pdf.set_font(size=7)
        pdf.multi_cell(0, 4, f"Weryfikacja: {self.url}", new_x="LMARGIN", new_y="NEXT")


def mark(s: KsefSettings, seller_nip: str, issued_on: dt.date, xml: bytes, ksef_number: str | None) -> Mark:
    service = VerificationLinkService(KsefClientOptions(base_url=s.ksef_api_url, base_qr_url=s.ksef_qr_url))
    url = service.build_invoice_verification_url(seller_nip, issued_on, sha256_b64(xml))
    return Mark(url, ksef_number or OFFLINE)


def of_document(s: KsefSettings, doc: Any) -> Mark | None:
    """The mark of a ``ksef_documents`` row: None when it is not for KSeF (kept, rejected, not made)."""
    if doc is None or doc["state"] not in ("queued", "sent"):
        return None
    return mark(s, doc["seller_nip"], doc["issued_on"], bytes(doc["xml"]), doc["ksef_number"])
