"""Operator actions: PostgreSQL is the record, Redis is brought in line at once (same call), so the
gateway sees a revocation, suspension or credit within a second on every instance."""
from __future__ import annotations

import secrets
from decimal import Decimal, InvalidOperation
from typing import Any

import asyncpg
import redis.asyncio as aioredis

from extproc import redis_keys as rk
from extproc.keys import key_hash, new_key

# Keep the cached balance in step with a ledger entry only where the balance is cached.
_CREDIT = """
if redis.call('HEXISTS', KEYS[1], 'balance') == 1 then
  return redis.call('HINCRBY', KEYS[1], 'balance', ARGV[1])
end
return false
"""


class AdminError(Exception):
    pass


MAX_PLN = 10**12  # far beyond any balance (bigint micro-PLN holds 9.2e12 PLN)


def pln_to_micro(pln: str | int | Decimal) -> int:
    try:
        d = Decimal(str(pln))
    except InvalidOperation:
        raise AdminError(f"not an amount in PLN: {pln!r}") from None
    # Infinity, NaN and sNaN are Decimals too, and 1e999999999 one whose int() would never end
    if not d.is_finite() or d.copy_abs() > MAX_PLN:  # copy_abs: no rounding, so no Overflow
        raise AdminError(f"not an amount in PLN (at most {MAX_PLN} either way)")
    micro = d * 1_000_000
    if micro != micro.to_integral_value():
        raise AdminError("amounts have at most 6 decimal places (1 micro-PLN)")
    return int(micro)


def micro_to_pln(micro: int) -> str:
    whole, fraction = divmod(abs(micro), 1_000_000)
    return f"{'-' if micro < 0 else ''}{whole}.{fraction:06d}"


class Admin:
    def __init__(self, pool: asyncpg.Pool, r: aioredis.Redis) -> None:
        self.pool = pool
        self.r = r

    async def create_org(self, name: str, balance_micro: int = 0) -> str:
        oid = "org_" + secrets.token_hex(8)
        async with self.pool.acquire() as c, c.transaction():
            await c.execute("INSERT INTO orgs (id, name) VALUES ($1, $2)", oid, name)
            if balance_micro:
                await c.execute("INSERT INTO ledger (org_id, amount_micro_pln, kind, ref) VALUES ($1,$2,'trial',$3)",
                                oid, balance_micro, "trial:" + oid)
        return oid

    async def _org_exists(self, org_id: str) -> None:
        if await self.pool.fetchval("SELECT 1 FROM orgs WHERE id = $1", org_id) is None:
            raise AdminError(f"no such organisation: {org_id}")

    async def create_key(self, org_id: str, name: str | None = None, created_by: str | None = None) -> tuple[str, str]:
        """(key id, the key itself): the key is returned once and only its hash is stored; ``created_by``
        is the console user who created it (None from the CLI)."""
        await self._org_exists(org_id)
        key = new_key()
        kid = "key_" + secrets.token_hex(8)
        h = key_hash(key)
        await self.pool.execute("INSERT INTO api_keys (id, org_id, key_hash, prefix, name, created_by)"
                                " VALUES ($1,$2,$3,$4,$5,$6)", kid, org_id, h, key[:15], name, created_by)
        await self.r.delete(rk.key(h))  # drop a cached "unknown key"
        return kid, key

    async def revoke_key(self, key_id: str) -> None:
        h = await self.pool.fetchval("UPDATE api_keys SET revoked_at = COALESCE(revoked_at, now())"
                                     " WHERE id = $1 RETURNING key_hash", key_id)
        if h is None:
            raise AdminError(f"no such key: {key_id}")
        async with self.r.pipeline(transaction=True) as p:
            p.delete(rk.key(h))
            p.hset(rk.key(h), "none", "1")
            p.expire(rk.key(h), 86400)
            await p.execute()

    async def set_status(self, org_id: str, status: str) -> None:
        n = await self.pool.execute("UPDATE orgs SET status = $2 WHERE id = $1", org_id, status)
        if n.endswith(" 0"):
            raise AdminError(f"no such organisation: {org_id}")
        await self.r.hset(rk.org(org_id), "status", status)

    async def set_limits(self, org_id: str, rpm: int | None, concurrency: int | None) -> None:
        await self._org_exists(org_id)
        await self.pool.execute("UPDATE orgs SET rpm = COALESCE($2, rpm), concurrency = COALESCE($3, concurrency)"
                                " WHERE id = $1", org_id, rpm, concurrency)
        mapping: dict[Any, Any] = {k: v for k, v in (("rpm", rpm), ("conc", concurrency)) if v is not None}
        if mapping:
            await self.r.hset(rk.org(org_id), mapping=mapping)

    async def set_key_limits(self, key_id: str, rpm: int) -> None:
        h = await self.pool.fetchval("UPDATE api_keys SET rpm = $2 WHERE id = $1 RETURNING key_hash", key_id, rpm)
        if h is None:
            raise AdminError(f"no such key: {key_id}")
        await self.r.delete(rk.key(h))

    async def credit(self, org_id: str, micro: int, *, ref: str | None = None, kind: str = "topup") -> bool:
        """Write a credit once per ``ref`` (idempotent); True if it was new."""
        await self._org_exists(org_id)
        ref = ref or f"{kind}:{secrets.token_hex(12)}"
        new = await self.pool.fetchval(
            "INSERT INTO ledger (org_id, amount_micro_pln, kind, ref) VALUES ($1,$2,$3,$4)"
            " ON CONFLICT (ref) DO NOTHING RETURNING id", org_id, micro, kind, ref)
        if new is None:
            return False
        await self.r.eval(_CREDIT, 1, rk.org(org_id), micro)
        return True

    async def balance(self, org_id: str) -> dict[str, Any]:
        await self._org_exists(org_id)
        ledger = int(await self.pool.fetchval(
            "SELECT COALESCE(SUM(amount_micro_pln), 0) FROM ledger WHERE org_id = $1", org_id))
        cached = await self.r.hget(rk.org(org_id), "balance")
        live = int(cached) if cached is not None else ledger
        return {"org": org_id, "balance_micro_pln": live, "balance_pln": micro_to_pln(live),
                "ledger_micro_pln": ledger}

    async def usage(self, org_id: str, limit: int = 50, *, status: str = "",
                    request_id: str = "") -> list[dict[str, Any]]:
        """The organisation's usage log, newest first: every request (refusals at cost 0).  ``status``:
        "ok" (2xx), "errors" (anything else) or one status code; ``request_id``: that request only."""
        await self._org_exists(org_id)
        where: list[str] = ["org_id = $1"]
        args: list[Any] = [org_id]
        try:
            cond = status_condition(status)
        except ValueError as e:
            raise AdminError(str(e)) from None
        if cond is not None:
            sql, arg = cond
            if arg is not None:
                args.append(arg)
                sql = sql.format(len(args))
            where.append(sql)
        if request_id:
            args.append(request_id)
            where.append(f"request_id = ${len(args)}")
        args.append(limit)
        rows = await self.pool.fetch(
            "SELECT request_id, key_id, alias, upstream_model, endpoint, status, error_code, stream, prompt_tokens,"
            " completion_tokens, estimated, cost_micro_pln, input_price, output_price, started_at, ttfb_ms,"
            " ended_at, (extract(epoch FROM ended_at - started_at) * 1000)::int AS latency_ms"
            f" FROM usage_records WHERE {' AND '.join(where)} ORDER BY started_at DESC, request_id LIMIT ${len(args)}",
            *args)
        return [{**r, "started_at": r["started_at"].isoformat(), "ended_at": r["ended_at"].isoformat()}
                for r in rows]


def status_condition(status: str) -> tuple[str, int | None] | None:
    """The usage log's status filter as SQL on ``status`` ({} stands for the parameter's number), or
    None for no filter; ValueError for a value that is none of "", "ok", "errors", or a status code."""
    if not status:
        return None
    if status == "ok":
        return "status BETWEEN 200 AND 299", None
    if status == "errors":
        return "status NOT BETWEEN 200 AND 299", None
    if status.isdigit() and len(status) == 3 and 100 <= int(status) <= 599:
        return "status = ${}", int(status)
    raise ValueError("status must be ok, errors or a status code such as 429")
