"""Near-the-limit e-mails: every ``GATEWAY_LOW_BALANCE_CHECK_S`` the console compares the spend this
month of each active key with a monthly limit against ``NEAR`` of that limit and mails the organisation's
owners once per key and month (Warsaw calendar month).  Off the request path, and one mail even with
several console instances (the ``UPDATE … WHERE limit_mailed_month IS DISTINCT FROM`` decides who sends)."""
from __future__ import annotations

import time

from core.key_limits import month

from . import i18n, mail
from .store import owner_emails
from .web import Console


NEAR = (80, 100)  # a key's spend at 80 % of its monthly limit or more is near it


async def check_once(c: Console) -> int:
    """One pass: mail the owners of each key newly near its limit this month.  Returns how many mails went."""
    this_month = month(time.time())
    rows = await c.pool.fetch(
        "SELECT k.id, k.org_id, k.name, k.prefix, k.monthly_limit_micro_pln AS cap, o.name AS org_name"
        " FROM api_keys k JOIN orgs o ON o.id = k.org_id WHERE k.monthly_limit_micro_pln IS NOT NULL"
        " AND k.revoked_at IS NULL AND k.limit_mailed_month IS DISTINCT FROM $1", this_month)
    sent = 0
    for r in rows:
        spent = (await c.admin.key_spend(r["org_id"], [r["id"]]))[r["id"]]
        if spent * NEAR[1] < r["cap"] * NEAR[0]:
            continue
        won = await c.pool.fetchval("UPDATE api_keys SET limit_mailed_month = $2 WHERE id = $1"
                                    " AND limit_mailed_month IS DISTINCT FROM $2 RETURNING id", r["id"], this_month)
        if won is None:
            continue  # another console instance sent it
        for owner, lang in await owner_emails(c.pool, r["org_id"]):
            with i18n.speaking(lang):
                subject, text = mail.key_near_limit(r["org_name"], r["name"] or r["prefix"], spent, r["cap"],
                                                    f"{c.base_url}/keys/{r['id']}/limits")
            await c.mailer.send(owner, subject, text)
            sent += 1
    return sent
