"""The console's attempt limits: fixed-window counters in Redis, counted BEFORE the work they guard
with one atomic transaction (SET NX EX + INCR), so parallel requests cannot all slip under a limit
that was read before any of them was recorded.  Keys hold a hash of the subject (an e-mail address,
a client address, an organisation), never the subject itself."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

from redis.asyncio.cluster import RedisCluster

from core.redis_client import AnyRedis

from core.redis_keys import CONSOLE_LIMITS

PREFIX = CONSOLE_LIMITS


@dataclass(frozen=True)
class Limit:
    name: str      # what is counted, e.g. "login:email"
    max: int       # attempts allowed per window
    window_s: int

    def key(self, subject: str) -> str:
        return PREFIX + self.name + ":" + hashlib.sha256(subject.encode()).hexdigest()[:32]


LOGIN_EMAIL = Limit("login:email", 5, 15 * 60)     # failed log-ins per address ...
LOGIN_IP = Limit("login:ip", 30, 15 * 60)          # ... and per client address, in 15 minutes
CODE_USER = Limit("2fa:user", 5, 15 * 60)          # failed second-step codes per account (and LOGIN_IP's)
RESET_EMAIL = Limit("reset:email", 3, 3600)        # reset mails per address per hour
RESET_IP = Limit("reset:ip", 30, 3600)
SIGNUP_EMAIL = Limit("signup:email", 3, 3600)      # sign-up mails per address per hour
SIGNUP_IP = Limit("signup:ip", 10, 3600)           # sign-ups per client address per hour
INVITE_ORG = Limit("invite:org", 20, 3600)         # invitations per organisation per hour
INVITE_EMAIL = Limit("invite:email", 3, 3600)      # invitations per invited address per hour
# Per recipient, whoever asks (mail bombing through someone else's address): a confirmation mail at
# most once per 5 minutes and 5 times a day; any of the console's other mails that a visitor can
# trigger (sign-up of an existing address, reset, invitation) at most 10 times a day.
CONFIRM_MAIL = Limit("mail:confirm", 1, 5 * 60)
CONFIRM_MAIL_DAY = Limit("mail:confirm:day", 5, 86400)
MAIL_DAY = Limit("mail:day", 10, 86400)
LOW_BALANCE_MAIL = Limit("mail:low-balance", 3, 86400)  # low-balance mails per owner a day (each save re-arms it)
TRIAL_CLIENT_WINDOW_S = 86400                      # trial credits per client address: GATEWAY_TRIAL_PER_CLIENT_DAY


def trial_client(per_day: int) -> Limit:
    return Limit("trial:client", per_day, TRIAL_CLIENT_WINDOW_S)


async def hit(r: AnyRedis, *checks: tuple[Limit, str]) -> bool:
    """Count one attempt against every (limit, subject); True when all are still within their limit."""
    # each counter's SET and INCR in a row (one Redis: in one transaction; a cluster's keys are in many slots)
    async with r.pipeline(transaction=not isinstance(r, RedisCluster)) as p:
        for limit, subject in checks:
            key = limit.key(subject)
            p.set(key, 0, ex=limit.window_s, nx=True)
            p.incr(key)
        res = await p.execute()
    return all(int(n) <= limit.max for n, (limit, _) in zip(res[1::2], checks))


async def confirmation_mail(r: AnyRedis, email: str) -> bool:
    """May a confirmation mail go to ``email`` now?  Counted only when it may: asking again within
    the 5 minutes does not use up the day's five."""
    return await hit(r, (CONFIRM_MAIL, email)) and await hit(r, (CONFIRM_MAIL_DAY, email))


async def forget(r: AnyRedis, limit: Limit, subject: str) -> None:
    """The subject's count starts again (a successful log-in)."""
    await r.delete(limit.key(subject))


_UNDO = "if redis.call('exists', KEYS[1]) == 1 then return redis.call('decr', KEYS[1]) end return 0"


async def undo(r: AnyRedis, limit: Limit, subject: str) -> None:
    """Take back one attempt that turned out not to count (a successful log-in from that address);
    a counter that expired meanwhile is not re-created."""
    await r.eval(_UNDO, 1, limit.key(subject))
