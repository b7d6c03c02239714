"""Two-factor sign-in's records in PostgreSQL: enrolment, the codes taken, recovery codes and the
organisation's requirement (the arithmetic is ``totp``'s)."""
from __future__ import annotations

import asyncpg

from . import totp


async def pending_secret(pool: asyncpg.Pool, user_id: str) -> str:
    """The secret being enrolled: the same one until it is confirmed (a reload shows the same QR code)."""
    return str(await pool.fetchval("UPDATE users SET totp_pending = COALESCE(totp_pending, $2) WHERE id = $1"
                                   " RETURNING totp_pending", user_id, totp.new_secret()))


async def enable(pool: asyncpg.Pool, user_id: str, code: str) -> list[str] | None:
    """Confirm the pending secret with a code from it: two-factor sign-in is on, and these are the
    account's ten new recovery codes (only their hashes are kept).  None: the code is not the secret's."""
    async with pool.acquire() as c, c.transaction():
        row = await c.fetchrow("SELECT totp_pending FROM users WHERE id = $1 AND totp_secret IS NULL FOR UPDATE",
                               user_id)
        step = None if row is None or row["totp_pending"] is None else totp.matching_step(row["totp_pending"], code, 0)
        if step is None:
            return None
        await c.execute("UPDATE users SET totp_secret = totp_pending, totp_pending = NULL, totp_last_step = $2,"
                        " totp_enabled_at = now() WHERE id = $1", user_id, step)
        return await _new_recovery_codes(c, user_id)


async def _new_recovery_codes(conn: asyncpg.Connection, user_id: str) -> list[str]:
    codes = totp.new_recovery_codes()
    await conn.execute("DELETE FROM recovery_codes WHERE user_id = $1", user_id)
    await conn.executemany("INSERT INTO recovery_codes (user_id, code_hash) VALUES ($1, $2)",
                           [(user_id, totp.recovery_hash(code)) for code in codes])
    return codes


async def verify(pool: asyncpg.Pool, user_id: str, code: str) -> bool:
    """A code of the account's authenticator not taken before, or one of its unused recovery codes
    (spent now).  False for an account without two-factor sign-in."""
    if totp.looks_like_recovery(code):
        return await pool.fetchval(
            "UPDATE recovery_codes r SET used_at = now() FROM users u WHERE r.user_id = $1 AND u.id = r.user_id"
            " AND u.totp_secret IS NOT NULL AND r.code_hash = $2 AND r.used_at IS NULL RETURNING true",
            user_id, totp.recovery_hash(code)) is not None
    async with pool.acquire() as c, c.transaction():
        row = await c.fetchrow("SELECT totp_secret, totp_last_step FROM users WHERE id = $1 FOR UPDATE", user_id)
        step = None if row is None or row["totp_secret"] is None else \
            totp.matching_step(row["totp_secret"], code, row["totp_last_step"])
        if step is None:
            return False
        await c.execute("UPDATE users SET totp_last_step = $2 WHERE id = $1", user_id, step)
        return True


async def disable(pool: asyncpg.Pool, user_id: str) -> None:
    async with pool.acquire() as c, c.transaction():
        await c.execute("UPDATE users SET totp_secret = NULL, totp_pending = NULL, totp_enabled_at = NULL"
                        " WHERE id = $1", user_id)
        await c.execute("DELETE FROM recovery_codes WHERE user_id = $1", user_id)


async def renew_recovery_codes(pool: asyncpg.Pool, user_id: str) -> list[str]:
    async with pool.acquire() as c, c.transaction():
        return await _new_recovery_codes(c, user_id)


async def status(pool: asyncpg.Pool, user_id: str) -> asyncpg.Record:
    """enabled_at (None: off) and recovery_left, the unused recovery codes."""
    row = await pool.fetchrow(
        "SELECT totp_enabled_at AS enabled_at, (SELECT count(*) FROM recovery_codes r WHERE r.user_id = u.id"
        " AND r.used_at IS NULL) AS recovery_left FROM users u WHERE id = $1", user_id)
    assert row is not None
    return row


async def enabled(pool: asyncpg.Pool, user_id: str) -> bool:
    return bool(await pool.fetchval("SELECT totp_secret IS NOT NULL FROM users WHERE id = $1", user_id))


async def require(pool: asyncpg.Pool, org_id: str, on: bool) -> None:
    await pool.execute("UPDATE orgs SET require_2fa = $2 WHERE id = $1", org_id, on)


async def required(pool: asyncpg.Pool, org_id: str) -> bool:
    return bool(await pool.fetchval("SELECT require_2fa FROM orgs WHERE id = $1", org_id))
