"""Redis's working balances against the ledger (PostgreSQL, the record): after Redis lost data, or an older
PostgreSQL backup was restored under a live Redis, the two part for good, since a cached balance is filled
from the ledger once and then only debited.  ``gateway reconcile`` compares them (dry run) and, with
``--apply``, moves each cached balance by its drift.

What Redis should hold for an organisation: its ledger sum less the costs of its usage records still queued
in the usage stream (debited in Redis already, not yet in the ledger), each request once, and none the
ledger already has (the usage writer commits a record before it takes it off the stream, and a repeated
finish queues a copy PostgreSQL drops).  The ledger's sums and which queued requests it has are read in one
statement, one snapshot; the stream is read before and after the balances and the ledger: an organisation
whose queued records changed meanwhile (a request finished, the writer took some) is left for the next
run.  The mend is an increment, so a request that finishes after the reads keeps its own debit."""
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


async def _queued(r: AnyRedis) -> dict[str, dict[str, int]]:
    """The usage stream's records by organisation: {org: {request id: cost}}, the first of each request."""
    out: dict[str, dict[str, int]] = {}
    for stream in layout_of(r).streams():  # a cluster's: one per shard
        last = "-"
        while True:
            batch: Any = await r.xrange(stream, min=last, count=1000)
            for entry_id, fields in batch:
                if entry_id == last:
                    continue
                try:
                    rec = json.loads(fields[b"r"])
                    out.setdefault(rec["org_id"], {}).setdefault(rec["request_id"], int(rec["cost_micro_pln"]))
                except (KeyError, ValueError, TypeError):
                    continue
            if len(batch) < 1000:
                break
            last = batch[-1][0]
    return out


# Each organisation's ledger sum and which of the queued requests ($2: their refs) it has a debit of, in
# one statement: one snapshot of the ledger for both.
_LEDGER = """
SELECT org_id, COALESCE(SUM(amount_micro_pln), 0)::bigint AS s,
       COALESCE(array_agg(ref) FILTER (WHERE ref = ANY($2::text[])), '{}') AS written
FROM ledger WHERE org_id = ANY($1::text[]) GROUP BY org_id
"""


async def reconcile(pool: asyncpg.Pool, r: AnyRedis, apply: bool) -> list[Drift]:
    """The organisations whose cached balance is apart from what the ledger says it should be."""
    layout = layout_of(r)
    names = [name async for name in r.scan_iter(match=rk.ORG + "*", count=1000)]  # a cluster's: every primary's
    if not names:
        return []
    before = await _queued(r)
    cached: dict[str, int] = {}
    for name in names:
        balance = await r.hget(name, "balance")
        if balance is not None:
            cached[layout.org_of(name.decode())] = int(balance)
    if not cached:
        return []
    refs = [f"usage:{rid}" for rids in before.values() for rid in rids]
    rows = await pool.fetch(_LEDGER, list(cached), refs)
    ledger = {row["org_id"]: (int(row["s"]), set(row["written"])) for row in rows}
    after = await _queued(r)
    out = []
    for org, redis_balance in sorted(cached.items()):
        if before.get(org, {}) != after.get(org, {}):
            continue  # its records were being queued or written meanwhile: the next run sees it still
        total, written = ledger.get(org, (0, set()))
        # a request the ledger has counts there, whatever its queued copy says (a reaper's estimate may
        # stand in the ledger, the ext_proc's own record queued after it)
        queued = sum(cost for rid, cost in before.get(org, {}).items() if f"usage:{rid}" not in written)
        drift = redis_balance - (total - queued)
        if drift:
            if apply:
                await r.hincrby(layout.org(org), "balance", -drift)
            out.append(Drift(org, redis_balance, total, queued, drift, apply))
    return out
