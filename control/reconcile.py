"""Redis's working balances against the ledger (PostgreSQL, the record): after Redis lost data, or an older
PostgreSQL backup was restored under a live Redis, the two part for good, since a cached balance is filled
from the ledger once and then only debited.  ``gateway reconcile`` compares them (dry run) and, with
``--apply``, moves each cached balance by its drift.

What Redis should hold for an organisation: its ledger sum less the costs of its usage records still queued
in the usage stream (debited in Redis already, not yet in the ledger).  The stream is read before and after
the ledger: an organisation whose queued records changed meanwhile is left for the next run."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

import asyncpg

from core.redis_client import AnyRedis, layout_of
from core import redis_keys as rk


@dataclass(frozen=True)
class Drift:
    org: str
    redis_micro_pln: int
    ledger_micro_pln: int
    queued_micro_pln: int  # costs of its records in the usage stream, not yet in the ledger
    drift_micro_pln: int   # Redis minus (ledger - queued)
    repaired: bool

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


async def _queued(r: AnyRedis) -> dict[str, int]:
    out: dict[str, int] = {}
    for stream in layout_of(r).streams():  # a cluster's: one per shard
        last = "-"
        while True:
            batch: Any = await r.xrange(stream, min=last, count=1000)
            for entry_id, fields in batch:
                if entry_id == last:
                    continue
                try:
                    rec = json.loads(fields[b"r"])
                    out[rec["org_id"]] = out.get(rec["org_id"], 0) + int(rec["cost_micro_pln"])
                except (KeyError, ValueError, TypeError):
                    continue
            if len(batch) < 1000:
                break
            last = batch[-1][0]
    return out


async def reconcile(pool: asyncpg.Pool, r: AnyRedis, apply: bool) -> list[Drift]:
    """The organisations whose cached balance is apart from what the ledger says it should be."""
    cached: dict[str, int] = {}
    layout = layout_of(r)
    async for name in r.scan_iter(match=rk.ORG + "*", count=1000):  # a cluster's: every primary's
        org = layout.org_of(name.decode())
        balance = await r.hget(name, "balance")
        if balance is not None:
            cached[org] = int(balance)
    if not cached:
        return []
    before = await _queued(r)
    rows = await pool.fetch("SELECT org_id, COALESCE(SUM(amount_micro_pln), 0)::bigint AS s FROM ledger"
                            " WHERE org_id = ANY($1::text[]) GROUP BY org_id", list(cached))
    ledger = {row["org_id"]: int(row["s"]) for row in rows}
    after = await _queued(r)
    out = []
    for org, redis_balance in sorted(cached.items()):
        if before.get(org, 0) != after.get(org, 0):
            continue  # its records were being written meanwhile: the next run sees it still
        queued = after.get(org, 0)
        drift = redis_balance - (ledger.get(org, 0) - queued)
        if drift:
            if apply:
                await r.hincrby(layout.org(org), "balance", -drift)
            out.append(Drift(org, redis_balance, ledger.get(org, 0), queued, drift, apply))
    return out
