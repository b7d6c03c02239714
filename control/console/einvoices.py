"""The console's side of KSeF (``control.ksef``): its loop made from the console's settings (the seller
from ``GATEWAY_SELLER_*``), and what an invoice's PDF shows for KSeF."""
from __future__ import annotations

from control.ksef import fa3, qr, store
from control.ksef.worker import Worker

from .invoices import nip_valid, normal_nip
from .settings import ConsoleSettings
from .web import Console


def seller(s: ConsoleSettings) -> fa3.Party | None:
    """The seller of FA(3) documents; None when its name, NIP (checksum) or address is missing."""
    if not (s.seller_name and s.seller_address and nip_valid(s.seller_nip)):  # as launch.refusal checks
        return None
    return fa3.Party(s.seller_name, normal_nip(s.seller_nip), s.seller_address)


def worker(c: Console) -> Worker:
    return Worker(c.pool, c.settings, seller(c.settings), c.ksef_wake)


async def mark(c: Console, number: str) -> qr.Mark | None:
    """The KSeF QR code for invoice ``number``'s PDF, or None (not for KSeF)."""
    return qr.of_document(c.settings, await store.document(c.pool, number))
