"""Low-balance e-mails: every ``GATEWAY_LOW_BALANCE_CHECK_S`` the console compares each organisation's
live balance with the threshold its owner set and mails the owners once per fall under it (sent again
only after the balance has risen back to the threshold).  Off the request path, and one mail even with
several console instances (the ``UPDATE … WHERE low_balance_mailed_at IS NULL`` decides who sends)."""
from __future__ import annotations


from . import i18n, limits, mail
from .store import owner_emails
from .web import Console


async def check_once(c: Console) -> int:
    """One pass: mail the organisations newly under their threshold; re-arm those back above it.
    Returns how many mails were sent."""
    sent = 0
    rows = await c.pool.fetch("SELECT id, name, low_balance_micro_pln AS threshold, low_balance_mailed_at AS mailed"
                              " FROM orgs WHERE low_balance_micro_pln IS NOT NULL")
    for r in rows:
        balance = int((await c.admin.balance(r["id"]))["balance_micro_pln"])
        if balance >= r["threshold"]:
            if r["mailed"] is not None:
                await c.pool.execute("UPDATE orgs SET low_balance_mailed_at = NULL WHERE id = $1", r["id"])
            continue
        if r["mailed"] is not None:
            continue
        won = await c.pool.fetchval("UPDATE orgs SET low_balance_mailed_at = now() WHERE id = $1"
                                    " AND low_balance_mailed_at IS NULL RETURNING id", r["id"])
        if won is None:
            continue  # another console instance sent it
        for owner, lang in await owner_emails(c.pool, r["id"]):
            if not await limits.hit(c.redis, (limits.LOW_BALANCE_MAIL, owner)):
                continue  # saving the threshold again and again must not mail the owners again and again
            with i18n.speaking(lang):
                subject, text = mail.low_balance(r["name"], balance, r["threshold"], f"{c.base_url}/billing")
            await c.mailer.send(owner, subject, text)
            sent += 1
    return sent
