"""Model-change e-mails (README, "Changing the model behind an alias"): every model change behind an
alias that ``gateway catalog apply`` announced is mailed once to every organisation owner, in the
owner's language. Off the request path, every ``GATEWAY_LOW_BALANCE_CHECK_S`` as the low-balance check;
one mail per owner per change even with several console instances (the ``UPDATE … WHERE mailed_at IS
NULL`` decides who sends)."""
from __future__ import annotations


from . import i18n, mail
from .web import Console


async def mail_once(c: Console) -> int:
    """Mail the changes not mailed yet; returns how many mails were sent."""
    sent = 0
    while True:
        row = await c.pool.fetchrow(
            "UPDATE model_changes SET mailed_at = now() WHERE id = (SELECT id FROM model_changes"
            " WHERE mailed_at IS NULL ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED)"
            " RETURNING alias, effective, before, after")
        if row is None:
            return sent
        owners = await c.pool.fetch("SELECT DISTINCT u.email, u.lang FROM memberships m JOIN users u"
                                    " ON u.id = m.user_id WHERE m.role = 'owner' AND u.verified_at IS NOT NULL"
                                    " ORDER BY u.email")
        for owner in owners:
            with i18n.speaking(owner["lang"]):
                subject, text = mail.model_change(row["alias"], row["effective"], row["before"], row["after"],
                                                  f"{c.base_url}/changelog")
            sent += await c.mailer.send(owner["email"], subject, text)
