"""The console's KSeF loop: makes the FA(3) document of each invoice issued (``store.enqueue`` recorded it
in the issuing transaction), and, when KSeF is configured, sends the documents due, one online session a
round, retrying what could not be sent with a doubling wait (``store.retry``).  Everything it works
from is in PostgreSQL, so a restart loses nothing; several console instances share the work
(``store.claim`` leases rows).  Woken at once when an invoice is issued, else every
``GATEWAY_KSEF_RETRY_S`` (at most a minute).  It logs kinds and numbers only, never a document."""
from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from typing import Any

import asyncpg

from core.catalog import WARSAW

from . import fa3, sender, store
from .settings import KsefSettings

log = logging.getLogger("console.ksef")


def invoice_of(row: Any, seller: fa3.Party) -> fa3.Invoice:
    """An ``invoices`` row as the FA(3) builder takes it."""
    nip = None if row["buyer_person"] or not row["buyer_nip"] else row["buyer_nip"]
    return fa3.Invoice(row["number"], row["issued_at"].astimezone(WARSAW).date(), seller,
                       fa3.Party(row["buyer_name"], nip, row["buyer_address"] or None),
                       fa3.Amounts(row["net_grosze"], row["vat_grosze"], row["gross_grosze"], row["vat_pct"]))


def correction_of(row: Any, original: Any, previous: Any, ksef_number: str | None, seller: fa3.Party) -> bytes:
    """The ``KOR`` document of a correction's row: it names the original (number, issue date, KSeF number)
    and replaces ``previous`` (the original, or its latest correction before this one)."""
    before = replace(invoice_of(previous, seller), number=original["number"],
                     issued_on=original["issued_at"].astimezone(WARSAW).date())
    return fa3.correction_xml(invoice_of(row, seller), fa3.Corrected(before, ksef_number), row["reason"])


class Worker:
    def __init__(self, pool: asyncpg.Pool, s: KsefSettings, seller: fa3.Party | None, wake: asyncio.Event) -> None:
        """``seller`` None: the seller's details cannot make a valid FA(3) document (no NIP)."""
        self.pool, self.s, self.seller, self.wake = pool, s, seller, wake

    def announce(self) -> None:
        """The operator is told at start what happens to invoices."""
        if self.seller is None:
            log.warning("KSeF: no FA(3) invoices (GATEWAY_SELLER_NAME, GATEWAY_SELLER_NIP and"
                        " GATEWAY_SELLER_ADDRESS must name the seller); none sent to KSeF")
        elif not self.s.ksef_on:
            log.warning("KSeF: not configured (GATEWAY_KSEF_ENV): invoices are kept as FA(3) documents and"
                        " not sent to KSeF (docs/configuration.md, \"KSeF\")")
        else:
            log.info("KSeF: invoices are sent to the %s environment for NIP %s", self.s.ksef_env, self.seller.nip)

    async def watch(self) -> None:
        """Runs for the console's lifetime."""
        self.announce()
        pause = min(self.s.ksef_retry_s, 60.0)
        while True:
            self.wake.clear()
            try:
                await self.round()
            except Exception as e:  # noqa: BLE001 - a database outage, an answer the SDK could not read: next time
                log.warning("KSeF round failed: %s", type(e).__name__)
            try:
                await asyncio.wait_for(self.wake.wait(), pause)
            except TimeoutError:
                pass

    async def round(self) -> None:
        if self.seller is None:
            return
        for row in await store.to_make(self.pool):
            inv = invoice_of(row, self.seller)
            try:
                xml = await self._document(row, inv)
                if xml is None:
                    continue
            except ValueError as e:  # the schema's or the builder's refusal (FA3XmlValidationError is one)
                log.error("KSeF: no FA(3) document for %s: %s", inv.number, e)
                await store.unmade(self.pool, inv.number, f"FA(3) not made: {e}")
                continue
            await store.made(self.pool, inv.number, xml, inv.issued_on, self.seller.nip or "", self.s.ksef_on)
        if not self.s.ksef_on:
            return
        due = await store.claim(self.pool)
        if not due:
            return
        outcomes = await sender.send(self.s, self.seller.nip or "", due)
        for d in due:
            await self._record(d, outcomes[d.number])

    async def _document(self, row: Any, inv: fa3.Invoice) -> bytes | None:
        """An invoice's FA(3) document, a correction's KOR; None: not yet (a correction whose original
        is still on its way to KSeF waits for the original's KSeF number)."""
        assert self.seller is not None
        if row.get("corrects") is None:
            return fa3.invoice_xml(inv)
        found = await store.corrected(self.pool, row)
        if found is None or found[3] in ("new", "queued"):
            return None
        original, previous, ksef_number, _ = found
        return correction_of(row, original, previous, ksef_number, self.seller)

    async def _record(self, d: store.Due, o: sender.Outcome) -> None:
        if isinstance(o, sender.Sent):
            await store.sent(self.pool, d.number, o.ksef_number)
            log.info("KSeF: %s sent, %s", d.number, o.ksef_number)
        elif isinstance(o, sender.Taken):
            await store.taken(self.pool, d.number, o.ksef_ref, self.s.ksef_retry_s)
        elif isinstance(o, sender.Rejected):
            await store.rejected(self.pool, d.number, o.problem)
            log.warning("KSeF: %s rejected: %s", d.number, o.problem)
        else:
            await store.retry(self.pool, d, o.problem, self.s.ksef_retry_s, o.resend)
            log.warning("KSeF: %s not sent (%s); offline mode, tried again later", d.number, o.problem)
