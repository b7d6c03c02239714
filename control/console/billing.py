"""Top-ups: a pending ``payments`` row, then the provider's notification settles it.  The credit is
written once per payment (ledger reference ``<provider>:<payment id>``), however many times the
notification arrives, and never because the buyer's browser came back."""
from __future__ import annotations

import logging
import secrets
from typing import Any

import asyncpg

from control.admin import Admin
from control.ksef import qr
from control.ksef import store as ksef_store
from control.ksef.settings import KsefSettings

from . import i18n, invoice_pdf, invoices, mail
from .mail import Mailer
from .payments import BadNotification, Notification, Provider
from .store import owner_emails

log = logging.getLogger("console.billing")

MIN_TOPUP_PLN = 1
MAX_TOPUP_PLN = 10_000
# a new invoice's e-mail waits at most this long for KSeF's loop to send its FA(3) document (KSeF
# configured), so that its PDF carries the KSeF number's QR code; after it, the OFFLINE code
KSEF_MAIL_WAIT_S = 20.0


async def create_payment(pool: asyncpg.Pool, provider: str, org_id: str, amount_micro: int, user_id: str) -> str:
    pid = "pay_" + secrets.token_hex(10)
    await pool.execute("INSERT INTO payments (id, org_id, provider, amount_micro_pln, created_by)"
                       " VALUES ($1, $2, $3, $4, $5)", pid, org_id, provider, amount_micro, user_id)
    return pid


async def payment_of(pool: asyncpg.Pool, org_id: str, payment_id: str) -> asyncpg.Record | None:
    return await pool.fetchrow("SELECT * FROM payments WHERE id = $1 AND org_id = $2", payment_id, org_id)


async def handle_notification(admin: Admin, provider: Provider, body: bytes, content_type: str) -> dict[str, Any]:
    """Verify and apply one notification; raises BadNotification (answer 400) for anything not ours."""
    n: Notification = provider.parse_notification(body, content_type)
    pay = await admin.pool.fetchrow("SELECT * FROM payments WHERE id = $1 AND provider = $2",
                                    n.payment_id, provider.name)
    if pay is None:
        raise BadNotification("unknown payment")
    if n.amount_micro_pln != pay["amount_micro_pln"]:
        raise BadNotification("amount differs from the registered one")
    if pay["status"] == "paid":
        return {"status": "paid", "credited": False, "payment_id": pay["id"]}
    if not n.paid:
        await admin.pool.execute("UPDATE payments SET status = 'failed' WHERE id = $1 AND status = 'pending'", pay["id"])
        return {"status": "failed", "credited": False}
    await provider.confirm(n)  # P24: the verify call; raises PaymentError (answer 502, the provider retries)
    credited = await admin.credit(pay["org_id"], pay["amount_micro_pln"], ref=f"{provider.name}:{pay['id']}",
                                  kind="topup")
    await admin.pool.execute("UPDATE payments SET status = 'paid', paid_at = COALESCE(paid_at, now()),"
                             " provider_ref = $2 WHERE id = $1", pay["id"], n.provider_ref)
    log.info("payment %s settled (credited=%s)", pay["id"], credited)
    return {"status": "paid", "credited": credited, "payment_id": pay["id"]}


async def mail_invoice(pool: asyncpg.Pool, mailer: Mailer, base_url: str, inv: invoices.Invoice,
                       seller: invoices.Seller, ksef: KsefSettings, ksef_wait_s: float = 0.0) -> int:
    """The invoice's e-mail to the organisation's owners, its PDF attached (with English labels for an
    owner whose language is English): a new invoice's is the payment's thanks.  The PDF carries KSeF's
    QR code as the download does: the KSeF number's once sent, OFFLINE while on its way; with KSeF
    configured the mail first waits up to ``ksef_wait_s`` for the loop's first try.  Returns how many
    went out."""
    doc = await ksef_store.document_settled(pool, inv.number, ksef_wait_s if ksef.ksef_on else 0.0)
    mark = qr.of_document(ksef, doc)
    sent = 0
    for owner, lang in await owner_emails(pool, inv.org_id):
        with i18n.speaking(lang):
            if inv.correction is None:
                subject, text = mail.paid(inv.paid_grosze * 10_000, inv.number, f"{base_url}/billing")
            else:
                subject, text = mail.corrected(inv.number, inv.correction.original_number, f"{base_url}/billing")
        pdf = await invoice_pdf.render_off_loop(inv, seller, mark, lang)
        sent += await mailer.send(owner, subject, text, attachment=(inv.file_name, "application/pdf", pdf))
    return sent
