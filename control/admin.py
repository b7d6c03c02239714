"""Operator actions: PostgreSQL is the record, Redis is brought in line at once (same call), so the
gateway sees a revocation, suspension or credit within a second on every instance."""
from __future__ import annotations

import secrets
import time
from dataclasses import fields
from decimal import Decimal
from typing import Any, Literal

import asyncpg

from core.redis_client import AnyRedis, layout_of
from core import cost, redis_keys as rk
from core.cost import micro_to_pln
from core.decisions import UsageRecord
from core.directory import CLIMIT_SQL, PAID_SQL
from core.cost import credit_limit
from core.keys import key_hash, new_key
from core.key_limits import NONE, Change, expiry_day, expiry_moment, month
from core.key_limits import month_start, next_month_start

# Keep the cached balance in step with a ledger entry only where the balance is cached; money other than
# the trial credit makes the organisation a paying one (its credit limit, README "Billing").
_CREDIT = """
if ARGV[2] == '1' then redis.call('HSET', KEYS[1], 'paid', '1') end
if redis.call('HEXISTS', KEYS[1], 'balance') == 1 then
  return redis.call('HINCRBY', KEYS[1], 'balance', ARGV[1])
end
return false
"""

# An organisation's own credit limit as ``set_credit_limit`` takes it: micro-PLN, "none" (no limit) or
# "default" (GATEWAY_CREDIT_LIMIT_PLN's)
CreditLimit = int | Literal["none", "default"]


# A revoked key's cache entry: "none" for a day, whatever was cached (one key: a cluster's slot too).
_REVOKED = """
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'none', '1')
return redis.call('EXPIRE', KEYS[1], 86400)
"""


class AdminError(Exception):
    pass


def pln_to_micro(pln: str | int | Decimal) -> int:
    try:
        return cost.pln_to_micro(pln)
    except ValueError as e:
        raise AdminError(str(e)) from None


class Admin:
    """``credit_limit``: GATEWAY_CREDIT_LIMIT_PLN in micro-PLN (None: no limit), for showing an
    organisation's credit limit in force (the ext_proc applies its own reading of it)."""

    def __init__(self, pool: asyncpg.Pool, r: AnyRedis, credit_limit: int | None = None) -> None:
        self.pool = pool
        self.r = r
        self.layout = layout_of(r)
        self.credit_limit = credit_limit

    async def create_org(self, name: str, balance_micro: int = 0, kind: str = "topup") -> str:
        """A new organisation with an opening credit of ``balance_micro`` (an operator's: ``kind`` topup;
        the demo organisation's trial balance: trial)."""
        oid = "org_" + secrets.token_hex(8)
        async with self.pool.acquire() as c, c.transaction():
            await c.execute("INSERT INTO orgs (id, name) VALUES ($1, $2)", oid, name)
            if balance_micro:
                await c.execute("INSERT INTO ledger (org_id, amount_micro_pln, kind, ref) VALUES ($1,$2,$3,$4)",
                                oid, balance_micro, kind, f"{kind}:{oid}")
        return oid

    async def _org_exists(self, org_id: str) -> None:
        if await self.pool.fetchval("SELECT 1 FROM orgs WHERE id = $1", org_id) is None:
            raise AdminError(f"no such organisation: {org_id}")

    async def create_key(self, org_id: str, name: str | None = None, created_by: str | None = None,
                         limits: Change = Change()) -> tuple[str, str]:
        """(key id, the key itself): the key is returned once and only its hash is stored; ``created_by``
        is the console user who created it (None from the CLI); ``limits``: its own (docs/limits.md)."""
        await self._org_exists(org_id)
        key = new_key()
        kid = "key_" + secrets.token_hex(8)
        h = key_hash(key)
        cap, models, expires = _columns(limits)
        await self.pool.execute("INSERT INTO api_keys (id, org_id, key_hash, prefix, name, created_by,"
                                " monthly_limit_micro_pln, models, expires_at) VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9)",
                                kid, org_id, h, key[:15], name, created_by, cap, models, expires)
        await self.r.delete(rk.key(h))  # drop a cached "unknown key"
        return kid, key

    async def revoke_key(self, key_id: str) -> None:
        h = await self.pool.fetchval("UPDATE api_keys SET revoked_at = COALESCE(revoked_at, now())"
                                     " WHERE id = $1 RETURNING key_hash", key_id)
        if h is None:
            raise AdminError(f"no such key: {key_id}")
        await self.r.eval(_REVOKED, 1, rk.key(h))

    async def set_status(self, org_id: str, status: str) -> None:
        n = await self.pool.execute("UPDATE orgs SET status = $2 WHERE id = $1", org_id, status)
        if n.endswith(" 0"):
            raise AdminError(f"no such organisation: {org_id}")
        await self.r.hset(self.layout.org(org_id), "status", status)

    async def set_limits(self, org_id: str, rpm: int | None, concurrency: int | None) -> None:
        await self._org_exists(org_id)
        await self.pool.execute("UPDATE orgs SET rpm = COALESCE($2, rpm), concurrency = COALESCE($3, concurrency)"
                                " WHERE id = $1", org_id, rpm, concurrency)
        mapping: dict[Any, Any] = {k: v for k, v in (("rpm", rpm), ("conc", concurrency)) if v is not None}
        if mapping:
            await self.r.hset(self.layout.org(org_id), mapping=mapping)

    async def set_credit_limit(self, org_id: str, limit: CreditLimit) -> None:
        """The organisation's own credit limit (README, "Billing"); it applies once the organisation has
        paid (until then its limit is 0)."""
        if isinstance(limit, int) and limit < 0:
            raise AdminError("a credit limit is 0 or more PLN")
        n = await self.pool.execute(
            "UPDATE orgs SET credit_limit_micro_pln = $2, credit_unlimited = $3 WHERE id = $1", org_id,
            limit if isinstance(limit, int) else None, limit == "none")
        if n.endswith(" 0"):
            raise AdminError(f"no such organisation: {org_id}")
        await self.r.hset(self.layout.org(org_id), "climit", str(limit))

    async def set_key_limits(self, key_id: str, rpm: int | None = None, limits: Change = Change(),
                             org_id: str | None = None) -> None:
        """The key's requests per minute and own limits (``limits``: None leaves one, "none" lifts it);
        ``org_id``: the key must be of that organisation (the console's).  Every instance sees them within
        a second: the key's cache entry is dropped and refilled from here."""
        cap, models, expires = _columns(limits)
        given = [(col, v) for col, v, was in (
            ("rpm", rpm, rpm), ("monthly_limit_micro_pln", cap, limits.monthly_limit), ("models", models, limits.models),
            ("expires_at", expires, limits.expires)) if was is not None]
        sets = [f"{col} = ${i}::{_TYPES[col]}" for i, (col, _) in enumerate(given, start=3)]
        row = await self.pool.fetchrow(
            "UPDATE api_keys k SET " + (", ".join(sets) or "rpm = k.rpm") +
            " FROM (SELECT id, monthly_limit_micro_pln AS cap FROM api_keys WHERE id = $1) old"
            " WHERE k.id = old.id AND ($2::text IS NULL OR k.org_id = $2) RETURNING k.key_hash, k.org_id, old.cap",
            key_id, org_id, *[v for _, v in given])
        if row is None:
            raise AdminError(f"no such key: {key_id}")
        async with self.r.pipeline(transaction=not self.layout.cluster) as p:  # a cluster's: two slots
            p.delete(rk.key(row["key_hash"]))
            if row["cap"] is None and cap is not None:  # its spend went uncounted while it had no cap
                p.delete(self.layout.key_spend(row["org_id"], key_id, month(time.time())))
            await p.execute()

    async def key_limits(self, key_id: str) -> dict[str, Any]:
        """The key's own limits and its spend this month (``gateway key limits``' answer)."""
        row = await self.pool.fetchrow("SELECT org_id, rpm, monthly_limit_micro_pln, models, expires_at FROM api_keys"
                                       " WHERE id = $1", key_id)
        if row is None:
            raise AdminError(f"no such key: {key_id}")
        spent = (await self.key_spend(row["org_id"], [key_id]))[key_id]
        return {"id": key_id, "rpm": row["rpm"],
                **key_limits_view(row["monthly_limit_micro_pln"], row["models"], row["expires_at"]),
                "spent_this_month_micro_pln": spent, "spent_this_month_pln": micro_to_pln(spent)}

    async def key_spend(self, org_id: str, key_ids: list[str]) -> dict[str, int]:
        """Each key's spend this month (micro-PLN, Warsaw time): Redis's counter where a key with a cap has
        one, else its usage records'."""
        now = time.time()
        async with self.r.pipeline(transaction=False) as p:
            for k in key_ids:
                p.hget(self.layout.key_spend(org_id, k, month(now)), "spent")
            cached = await p.execute()
        spend = {k: int(c) for k, c in zip(key_ids, cached) if c is not None}
        missing = [k for k in key_ids if k not in spend]
        if missing:
            rows = await self.pool.fetch(
                "SELECT key_id, SUM(cost_micro_pln)::bigint AS s FROM usage_records WHERE org_id = $1"
                " AND key_id = ANY($2::text[]) AND started_at >= $3 AND started_at < $4 GROUP BY key_id",
                org_id, missing, month_start(now), next_month_start(now))
            spend.update({k: 0 for k in missing} | {r["key_id"]: int(r["s"]) for r in rows})
        return spend

    async def credit(self, org_id: str, micro: int, *, ref: str | None = None, kind: str = "topup") -> bool:
        """Write a credit once per ``ref`` (idempotent); True if it was new."""
        await self._org_exists(org_id)
        ref = ref or f"{kind}:{secrets.token_hex(12)}"
        new = await self.pool.fetchval(
            "INSERT INTO ledger (org_id, amount_micro_pln, kind, ref) VALUES ($1,$2,$3,$4)"
            " ON CONFLICT (ref) DO NOTHING RETURNING id", org_id, micro, kind, ref)
        if new is None:
            return False
        await self.r.eval(_CREDIT, 1, self.layout.org(org_id), micro, "1" if micro > 0 and kind != "trial" else "0")
        return True

    async def balance(self, org_id: str) -> dict[str, Any]:
        """The live balance (Redis's, else the ledger's), and the credit limit in force: ``credit_limit_*``
        None means no limit; ``held_micro_pln`` is the worst cases of the requests in flight."""
        row = await self.pool.fetchrow(
            "SELECT (SELECT COALESCE(SUM(amount_micro_pln), 0) FROM ledger WHERE org_id = o.id)::bigint AS ledger,"
            f" {PAID_SQL} AS paid, {CLIMIT_SQL} AS climit FROM orgs o WHERE o.id = $1", org_id)
        if row is None:
            raise AdminError(f"no such organisation: {org_id}")
        cached, held = await self.r.hmget(self.layout.org(org_id), ["balance", "hold"])
        live = int(cached) if cached is not None else row["ledger"]
        limit = credit_limit(bool(row["paid"]), row["climit"], self.credit_limit)
        return {"org": org_id, "balance_micro_pln": live, "balance_pln": micro_to_pln(live),
                "ledger_micro_pln": row["ledger"], "paid": bool(row["paid"]),
                "credit_limit_micro_pln": limit, "credit_limit_pln": None if limit is None else micro_to_pln(limit),
                "credit_limit_own": row["climit"], "held_micro_pln": max(0, int(held or 0))}

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
            f"SELECT {USAGE_COLUMNS}, (extract(epoch FROM ended_at - started_at) * 1000)::int AS latency_ms"
            f" FROM usage_records WHERE {' AND '.join(where)} ORDER BY started_at DESC, request_id LIMIT ${len(args)}",
            *args)
        return [{**r, "started_at": r["started_at"].isoformat(), "ended_at": r["ended_at"].isoformat()}
                for r in rows]


_TYPES = {"rpm": "integer", "monthly_limit_micro_pln": "bigint", "models": "text[]", "expires_at": "timestamptz"}


def _columns(c: Change) -> tuple[int | None, list[str] | None, Any]:
    """A change's limits as ``api_keys``'s columns (a limit not given or lifted: NULL)."""
    cap = None if c.monthly_limit is None or c.monthly_limit == NONE else c.monthly_limit
    models = None if c.models is None or c.models == NONE else list(c.models)
    expires = None if c.expires is None or c.expires == NONE else expiry_moment(c.expires)
    return cap, models, expires


def key_limits_view(cap: int | None, models: list[str] | None, expires_at: Any) -> dict[str, Any]:
    """A key's own limits as ``gateway key list`` and the console show them."""
    return {"monthly_limit_micro_pln": cap, "monthly_limit_pln": None if cap is None else micro_to_pln(cap),
            "models": models, "expires": None if expires_at is None else expiry_day(expires_at).isoformat()}


# ``gateway usage``'s columns: a usage record's fields (core/decisions.py), its organisation aside
USAGE_COLUMNS = ", ".join(f.name for f in fields(UsageRecord) if f.name != "org_id")


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
