"""The console's PostgreSQL records: users, memberships, sessions, e-mail tokens and invitations
(attempt limits are in Redis: ``limits``).  Every query that reads an organisation's data takes the organisation's id."""
from __future__ import annotations

import contextlib
import re
import secrets
import unicodedata
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

import asyncpg

from .i18n import _
from .roles import Capability, may
from .security import token_hash

SESSION_DAYS = 7
CONFIRM_HOURS = 24
RESET_HOURS = 1
INVITE_DAYS = 7


@dataclass(frozen=True)
class Viewer:
    """Who is asking, for which organisation, in which role."""
    user_id: str
    email: str
    org_id: str
    org_name: str
    role: str
    session_token: str
    must_enrol: bool = False  # the organisation requires two-factor sign-in, which this account has not set up

    @property
    def owner(self) -> bool:
        return self.role == "owner"

    def may(self, capability: Capability) -> bool:
        return may(self.role, capability)


@dataclass(frozen=True)
class Removal:
    """A member's removal: why not (``not_found``, ``last_owner``), or done with these keys revoked."""
    problem: str | None
    revoked_keys: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Confirmation:
    """A confirmation link used: whose, whether it confirmed the address now, whether it signs in."""
    user_id: str
    confirmed_now: bool
    signs_in: bool


# the account's unused e-mail links of the given purposes die
_SPEND_LINKS = ("UPDATE email_tokens SET used_at = now() WHERE user_id = $1 AND purpose = ANY($2::text[])"
                " AND used_at IS NULL")


@contextlib.asynccontextmanager
async def _connection(pool: asyncpg.Pool, conn: Any) -> AsyncIterator[Any]:
    """``conn`` if given (the caller's transaction), else one of the pool's."""
    if conn is not None:
        yield conn
    else:
        async with pool.acquire() as c:
            yield c


def _opt_str(v: Any) -> str | None:
    return None if v is None else str(v)


def normal_email(email: str) -> str:
    return email.strip(" ").lower()  # spaces only: a CR, LF or tab anywhere makes the address invalid


# One mailbox, nothing else: no display name, no angle brackets, no list, no quoting, no comment,
# no whitespace or control character (a CR/LF would write headers of its own).  Letters beyond
# ASCII are allowed (\w is Unicode-aware; it never matches a control character or punctuation).
_ATOM = r"[\w!#$%&'*+/=?^`{|}~-]+"
_EMAIL = re.compile(rf"{_ATOM}(?:\.{_ATOM})*@(?:[^\W_](?:(?:[^\W_]|-)*[^\W_])?\.)+[^\W\d_]{{2,63}}")


def valid_email(email: str) -> bool:
    return len(email) <= 254 and _EMAIL.fullmatch(email) is not None


def name_problem(name: str, what: str) -> str | None:
    """Why a name (an organisation's, a key's) cannot be used, or None: 1 to 100 characters, no
    control or format character (CR/LF above all: names go into e-mail headers), no angle brackets."""
    if not name or len(name) > 100:
        return _("Enter the {what} (up to 100 characters).").format(what=what)
    if any(unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn") or ch in "<>" for ch in name):
        return _("The {what} cannot contain line breaks, control characters or angle brackets.").format(what=what)
    return None


async def owner_emails(pool: asyncpg.Pool, org_id: str) -> list[tuple[str, str]]:
    """Where the organisation's billing mail goes: its owners' addresses, each with its language."""
    rows = await pool.fetch("SELECT u.email, u.lang FROM memberships m JOIN users u ON u.id = m.user_id"
                            " WHERE m.org_id = $1 AND m.role = 'owner' ORDER BY u.email", org_id)
    return [(r["email"], r["lang"]) for r in rows]


async def _owners(conn: Any, org_id: str) -> int:
    return int(await conn.fetchval("SELECT count(*) FROM memberships WHERE org_id = $1 AND role = 'owner'", org_id))


class Store:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool

    # ---- users ---------------------------------------------------------------------------
    async def user_by_email(self, email: str) -> asyncpg.Record | None:
        return await self.pool.fetchrow("SELECT * FROM users WHERE email = $1", normal_email(email))

    async def user_by_id(self, user_id: str) -> asyncpg.Record | None:
        return await self.pool.fetchrow("SELECT * FROM users WHERE id = $1", user_id)

    async def create_user(self, email: str, password_hash: str, lang: str, *, verified: bool = False,
                          conn: Any = None) -> str:
        """``lang``: the language of the page the account was made on (its e-mails' language)."""
        uid = "usr_" + secrets.token_hex(8)
        await (conn or self.pool).execute(
            "INSERT INTO users (id, email, password_hash, verified_at, lang) VALUES ($1, $2, $3,"
            " CASE WHEN $4 THEN now() END, $5)", uid, normal_email(email), password_hash, verified, lang)
        return uid

    async def set_lang(self, user_id: str, lang: str) -> None:
        await self.pool.execute("UPDATE users SET lang = $2 WHERE id = $1", user_id, lang)

    async def set_password(self, user_id: str, password_hash: str) -> None:
        """The new password ends every session of the account, spends every e-mail link it has
        (confirmation and reset) and withdraws the invitations pending for its address."""
        async with self.pool.acquire() as c, c.transaction():
            email = await c.fetchval("UPDATE users SET password_hash = $2 WHERE id = $1 RETURNING email",
                                     user_id, password_hash)
            await c.execute("DELETE FROM console_sessions WHERE user_id = $1", user_id)
            await c.execute(_SPEND_LINKS, user_id, ["confirm", "reset"])
            await c.execute("DELETE FROM invites WHERE email = $1 AND accepted_at IS NULL", email)

    async def mark_verified(self, user_id: str, conn: Any = None) -> bool:
        """True the first time; every confirmation link of the account dies with it."""
        async with _connection(self.pool, conn) as c, c.transaction():
            r = await c.execute("UPDATE users SET verified_at = now() WHERE id = $1 AND verified_at IS NULL",
                                user_id)
            await c.execute(_SPEND_LINKS, user_id, ["confirm"])
        return str(r).endswith(" 1")

    async def confirm(self, token: str) -> Confirmation | None:
        """Use a confirmation link: the address is confirmed (once); the link signs in only if it was
        the account's newest and the account was still unconfirmed.  None: no such valid link."""
        async with self.pool.acquire() as c, c.transaction():
            row = await c.fetchrow(
                "UPDATE email_tokens t SET used_at = now() WHERE token_hash = $1 AND purpose = 'confirm'"
                " AND used_at IS NULL AND expires_at > now() RETURNING user_id, NOT EXISTS (SELECT 1 FROM"
                " email_tokens n WHERE n.user_id = t.user_id AND n.purpose = 'confirm'"
                " AND n.created_at > t.created_at) AS newest", token_hash(token))
            if row is None:
                return None
            first = await self.mark_verified(row["user_id"], conn=c)
            return Confirmation(str(row["user_id"]), first, first and bool(row["newest"]))

    async def claim_trial(self, identity_hash: str, org_id: str) -> bool:
        """True if this person (``trial.identity_hash``) had no trial yet; it is theirs now."""
        return await self.pool.fetchval(
            "INSERT INTO trial_grants (identity_hash, org_id) VALUES ($1, $2) ON CONFLICT DO NOTHING"
            " RETURNING true", identity_hash, org_id) is not None

    async def had_trial(self, identity_hash: str) -> bool:
        return bool(await self.pool.fetchval("SELECT EXISTS (SELECT 1 FROM trial_grants WHERE identity_hash = $1)",
                                             identity_hash))

    async def owned_orgs(self, user_id: str) -> list[str]:
        rows = await self.pool.fetch("SELECT org_id FROM memberships WHERE user_id = $1 AND role = 'owner'"
                                     " ORDER BY created_at", user_id)
        return [r["org_id"] for r in rows]

    # ---- memberships ---------------------------------------------------------------------
    async def add_member(self, user_id: str, org_id: str, role: str, conn: Any = None) -> None:
        await (conn or self.pool).execute(
            "INSERT INTO memberships (user_id, org_id, role) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING",
            user_id, org_id, role)

    async def orgs_of(self, user_id: str) -> list[asyncpg.Record]:
        return list(await self.pool.fetch(
            "SELECT o.id, o.name, m.role FROM memberships m JOIN orgs o ON o.id = m.org_id"
            " WHERE m.user_id = $1 ORDER BY m.created_at", user_id))

    async def members(self, org_id: str) -> list[asyncpg.Record]:
        return list(await self.pool.fetch(
            "SELECT u.id, u.email, m.role, m.created_at, u.totp_secret IS NOT NULL AS two_factor"
            " FROM memberships m JOIN users u ON u.id = m.user_id"
            " WHERE m.org_id = $1 ORDER BY m.created_at", org_id))

    async def set_role(self, org_id: str, user_id: str, role: str) -> str | None:
        """The member's new role, or why not (``not_found``, ``last_owner``: an organisation keeps an owner)."""
        async with self.pool.acquire() as c, c.transaction():
            await c.execute("SELECT 1 FROM orgs WHERE id = $1 FOR UPDATE", org_id)  # one change at a time
            was = await c.fetchval("SELECT role FROM memberships WHERE org_id = $1 AND user_id = $2", org_id, user_id)
            if was is None:
                return "not_found"
            if was == "owner" and role != "owner" and await _owners(c, org_id) <= 1:
                return "last_owner"
            await c.execute("UPDATE memberships SET role = $3 WHERE org_id = $1 AND user_id = $2", org_id, user_id, role)
        return None

    async def remove_member(self, org_id: str, user_id: str, revoke_keys: bool) -> Removal:
        """The membership and its sessions end; with ``revoke_keys`` the keys the member created in the
        organisation are revoked in the same transaction (the caller then drops them from the gateway's
        cache: ``Admin.revoke_key``, which is idempotent)."""
        async with self.pool.acquire() as c, c.transaction():
            await c.execute("SELECT 1 FROM orgs WHERE id = $1 FOR UPDATE", org_id)
            role = await c.fetchval("SELECT role FROM memberships WHERE org_id = $1 AND user_id = $2",
                                    org_id, user_id)
            if role is None:
                return Removal("not_found")
            if role == "owner" and await _owners(c, org_id) <= 1:
                return Removal("last_owner")
            await c.execute("DELETE FROM memberships WHERE org_id = $1 AND user_id = $2", org_id, user_id)
            await c.execute("DELETE FROM console_sessions WHERE org_id = $1 AND user_id = $2", org_id, user_id)
            revoked = [] if not revoke_keys else [r["id"] for r in await c.fetch(
                "UPDATE api_keys SET revoked_at = now() WHERE org_id = $1 AND created_by = $2 AND revoked_at IS NULL"
                " RETURNING id", org_id, user_id)]
        return Removal(None, revoked)

    # ---- sessions ------------------------------------------------------------------------
    async def create_session(self, token: str, user_id: str, org_id: str) -> None:
        await self.pool.execute(
            "INSERT INTO console_sessions (token_hash, user_id, org_id, expires_at)"
            f" VALUES ($1, $2, $3, now() + interval '{SESSION_DAYS} days')", token_hash(token), user_id, org_id)

    async def viewer(self, token: str) -> Viewer | None:
        r = await self.pool.fetchrow(
            "SELECT s.user_id, u.email, s.org_id, o.name AS org_name, m.role,"
            " o.require_2fa AND u.totp_secret IS NULL AS must_enrol FROM console_sessions s"
            " JOIN users u ON u.id = s.user_id JOIN orgs o ON o.id = s.org_id"
            " JOIN memberships m ON m.user_id = s.user_id AND m.org_id = s.org_id"
            " WHERE s.token_hash = $1 AND s.expires_at > now()", token_hash(token))
        return None if r is None else Viewer(r["user_id"], r["email"], r["org_id"], r["org_name"], r["role"], token,
                                           r["must_enrol"])

    async def switch_org(self, token: str, user_id: str, org_id: str) -> bool:
        r = await self.pool.execute(
            "UPDATE console_sessions SET org_id = $3 WHERE token_hash = $1 AND user_id = $2"
            " AND EXISTS (SELECT 1 FROM memberships WHERE user_id = $2 AND org_id = $3)",
            token_hash(token), user_id, org_id)
        return str(r).endswith(" 1")

    async def end_session(self, token: str) -> None:
        await self.pool.execute("DELETE FROM console_sessions WHERE token_hash = $1", token_hash(token))

    # ---- single-use e-mail tokens --------------------------------------------------------
    async def new_email_token(self, token: str, user_id: str, purpose: str) -> None:
        """A new link of ``purpose``; the account's earlier ones of that purpose die."""
        hours = CONFIRM_HOURS if purpose == "confirm" else RESET_HOURS
        async with self.pool.acquire() as c, c.transaction():
            await c.execute(_SPEND_LINKS, user_id, [purpose])
            await c.execute(
                "INSERT INTO email_tokens (token_hash, user_id, purpose, expires_at)"
                f" VALUES ($1, $2, $3, now() + interval '{hours} hours')", token_hash(token), user_id, purpose)

    async def email_token(self, token: str, purpose: str, *, use: bool = False) -> str | None:
        """The user id of a valid (unused, unexpired) token, else None; ``use`` marks it used."""
        valid = "token_hash = $1 AND purpose = $2 AND used_at IS NULL AND expires_at > now()"
        return _opt_str(await self.pool.fetchval(
            f"UPDATE email_tokens SET used_at = now() WHERE {valid} RETURNING user_id" if use
            else f"SELECT user_id FROM email_tokens WHERE {valid}", token_hash(token), purpose))

    # ---- invitations ---------------------------------------------------------------------
    async def create_invite(self, token: str, org_id: str, email: str, role: str, by: str) -> str:
        """A new invitation replaces the organisation's pending one to the same address (its link dies)."""
        iid = "inv_" + secrets.token_hex(8)
        async with self.pool.acquire() as c, c.transaction():
            await c.execute("DELETE FROM invites WHERE org_id = $1 AND email = $2 AND accepted_at IS NULL",
                            org_id, normal_email(email))
            await c.execute(
                "INSERT INTO invites (id, org_id, email, role, token_hash, invited_by, expires_at)"
                f" VALUES ($1, $2, $3, $4, $5, $6, now() + interval '{INVITE_DAYS} days')",
                iid, org_id, normal_email(email), role, token_hash(token), by)
        return iid

    async def invite(self, token: str) -> asyncpg.Record | None:
        return await self.pool.fetchrow(
            "SELECT i.*, o.name AS org_name FROM invites i JOIN orgs o ON o.id = i.org_id"
            " WHERE i.token_hash = $1 AND i.accepted_at IS NULL AND i.expires_at > now()", token_hash(token))

    async def accept_invite(self, token: str, user_id: str, email: str) -> str | None:
        """The organisation joined, or None; the invitation is for one e-mail address and used once."""
        async with self.pool.acquire() as c, c.transaction():
            inv = await c.fetchrow(
                "UPDATE invites SET accepted_at = now() WHERE token_hash = $1 AND accepted_at IS NULL"
                " AND expires_at > now() AND email = $2 RETURNING org_id, role", token_hash(token), normal_email(email))
            if inv is None:
                return None
            await self.add_member(user_id, inv["org_id"], inv["role"], conn=c)
            return str(inv["org_id"])

    async def pending_invites(self, org_id: str) -> list[asyncpg.Record]:
        return list(await self.pool.fetch(
            "SELECT id, email, role, created_at, expires_at FROM invites WHERE org_id = $1 AND accepted_at IS NULL"
            " AND expires_at > now() ORDER BY created_at DESC", org_id))

    async def revoke_invite(self, org_id: str, invite_id: str) -> bool:
        r = await self.pool.execute("DELETE FROM invites WHERE id = $1 AND org_id = $2 AND accepted_at IS NULL",
                                    invite_id, org_id)
        return str(r).endswith(" 1")
