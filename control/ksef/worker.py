"""The console's KSeF loop: makes the FA(3) document of each invoice issued (``store.enqueue`` recorded it
in the issuing transaction), and, when KSeF is configured, sends the documents due, one online session a
round, retrying what could not be sent with a doubling wait (``store.retry``).  Everything it works
from is in PostgreSQL, so a restart loses nothing; several console instances share the work
(``store.claim`` leases rows).  Woken at once when an invoice is issued, else every
``GATEWAY_KSEF_RETRY_S`` (at most a minute).  It logs kinds and numbers only, never a document."""
from __future__ import annotations

import asyncio
import logging

import asyncpg

from control.console import invoices

from . import fa3, sender, store
from .settings import KsefSettings

log = logging.getLogger("console.ksef")


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
            if not self.s.ksef_offline_cert:
                log.warning("KSeF: no offline certificate (GATEWAY_KSEF_OFFLINE_CERT/KEY): invoices issued offline"
                            " carry KOD I only, no KOD II (docs/configuration.md, \"KSeF\")")

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
        for number, org_id in await store.to_make(self.pool):
            inv = await invoices.find(self.pool, org_id, number)
            assert inv is not None, "a document is enqueued by its invoice's transaction"
            try:
                xml = await self._document(inv)
                if xml is None:
                    continue
            except ValueError as e:  # the schema's or the builder's refusal (FA3XmlValidationError is one)
                log.error("KSeF: no FA(3) document for %s: %s", inv.number, e)
                await store.unmade(self.pool, inv.number, f"FA(3) not made: {e}")
                continue
            await store.made(self.pool, inv.number, xml, inv.issue_date, self.seller.nip, self.s.ksef_on)
        if not self.s.ksef_on:
            return
        due = await store.claim(self.pool)
        if not due:
            return
        outcomes = await sender.send(self.s, self.seller.nip, due)
        for d in due:
            await self._record(d, outcomes[d.number])

    async def _document(self, inv: invoices.Invoice) -> bytes | None:
        """An invoice's FA(3) document, a correction's KOR; None: not yet (a correction whose original
        is still on its way to KSeF waits for the original's KSeF number)."""
        assert self.seller is not None
        if inv.correction is None:
            return fa3.invoice_xml(inv, self.seller)
        original = await store.document(self.pool, inv.correction.original_number)
        if original is None or original["state"] in ("new", "queued"):
            return None
        return fa3.correction_xml(inv, self.seller, original["ksef_number"])

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
