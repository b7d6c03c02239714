"""PostgreSQL reads on a cache miss only (never once per request): keys and organisations.

Every read is bounded (``timeout``: waiting for a pooled connection and for the answer), so that a hung
PostgreSQL never holds a request past its budget; the caller bounds its own wait as well (``exchange``).
"""
from __future__ import annotations

from typing import Any

import asyncpg


class Directory:
    def __init__(self, pool: asyncpg.Pool, timeout: float = 3.0) -> None:
        self.pool = pool
        self.timeout = timeout

    async def _row(self, query: str, arg: str) -> Any:
        async with self.pool.acquire(timeout=self.timeout) as conn:
            return await conn.fetchrow(query, arg, timeout=self.timeout)

    async def key(self, key_hash: str) -> dict[str, Any] | None:
        row = await self._row(
            "SELECT id, org_id AS org, rpm FROM api_keys WHERE key_hash = $1 AND revoked_at IS NULL", key_hash)
        return None if row is None else dict(row)

    async def org(self, org_id: str) -> dict[str, Any]:
        row = await self._row(
            "SELECT o.status, o.rpm, o.concurrency AS conc,"
            " (SELECT COALESCE(SUM(amount_micro_pln), 0) FROM ledger l WHERE l.org_id = o.id)::bigint AS balance"
            " FROM orgs o WHERE o.id = $1", org_id)
        return {"status": "suspended", "balance": 0} if row is None else dict(row)
