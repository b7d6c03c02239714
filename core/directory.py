"""PostgreSQL reads on a cache miss only (never once per request): keys and organisations.

Every read is bounded (``timeout``: waiting for a pooled connection and for the answer), so that a hung
PostgreSQL never holds a request past its budget; the caller bounds its own wait as well (``exchange``).
"""
from __future__ import annotations

from typing import Any

import asyncpg

from .key_limits import month_start, next_month_start


class Directory:
    def __init__(self, pool: asyncpg.Pool, timeout: float = 3.0) -> None:
        self.pool = pool
        self.timeout = timeout

    async def _row(self, query: str, arg: str) -> Any:
        async with self.pool.acquire(timeout=self.timeout) as conn:
            return await conn.fetchrow(query, arg, timeout=self.timeout)

    async def key(self, key_hash: str) -> dict[str, Any] | None:
        """The key's cache entry: its id, organisation, rate and own limits (core/redis_keys.py)."""
        row = await self._row(
            "SELECT id, org_id AS org, rpm, monthly_limit_micro_pln AS cap, array_to_string(models, ',') AS models,"
            " floor(extract(epoch FROM expires_at))::bigint AS exp"
            " FROM api_keys WHERE key_hash = $1 AND revoked_at IS NULL", key_hash)
        return None if row is None else dict(row)

    async def key_spend(self, org_id: str, key_id: str, now: float) -> int:
        """What the key's requests that started in the Warsaw month of ``now`` cost (micro-PLN)."""
        async with self.pool.acquire(timeout=self.timeout) as conn:
            spent = await conn.fetchval(KEY_SPEND_SQL, org_id, key_id, month_start(now), next_month_start(now),
                                        timeout=self.timeout)
        return int(spent)

    async def org(self, org_id: str) -> dict[str, Any]:
        """The organisation's cache entry: status, limits, balance, and what its credit limit follows
        (README, "Billing"): ``paid`` (1: money other than the trial credit was ever credited) and
        ``climit``, its own credit limit (micro-PLN, "none", or "default": GATEWAY_CREDIT_LIMIT_PLN's)."""
        row = await self._row(
            "SELECT o.status, o.rpm, o.concurrency AS conc,"
            " (SELECT COALESCE(SUM(amount_micro_pln), 0) FROM ledger l WHERE l.org_id = o.id)::bigint AS balance,"
            " " + PAID_SQL + " AS paid,"
            " " + CLIMIT_SQL + " AS climit"
            " FROM orgs o WHERE o.id = $1", org_id)
        return {"status": "suspended", "balance": 0, "paid": 0, "climit": "default"} if row is None else dict(row)

    async def applied(self, catalog_sha256: str) -> bool:
        """Whether ``gateway catalog apply`` put the catalog with this SHA-256 in force: it checked the
        alias change policy then (and recorded a breach it was told to force); a reload breaking the
        policy is taken only then."""
        row = await self._row("SELECT 1 FROM catalog_applies WHERE sha256 = $1", catalog_sha256)
        return row is not None


# 1 when the organisation ``o`` was ever credited money other than the console's trial credit (an
# operator's credit or a paid top-up), else 0
PAID_SQL = ("(EXISTS (SELECT 1 FROM ledger p WHERE p.org_id = o.id AND p.amount_micro_pln > 0"
            " AND p.kind NOT IN ('trial', 'usage')))::int")

# the organisation ``o``'s own credit limit as the cache holds it: micro-PLN, "none" or "default"
CLIMIT_SQL = ("CASE WHEN o.credit_unlimited THEN 'none'"
              " ELSE COALESCE(o.credit_limit_micro_pln::text, 'default') END")

# what the requests of the key $2 of the organisation $1 that started in a month ($3 to $4) cost, micro-PLN
KEY_SPEND_SQL = ("SELECT COALESCE(SUM(cost_micro_pln), 0)::bigint FROM usage_records"
                 " WHERE org_id = $1 AND key_id = $2 AND started_at >= $3 AND started_at < $4")
