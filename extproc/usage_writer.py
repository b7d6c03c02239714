"""Drains the Redis usage stream into PostgreSQL: each record once, with its ledger debit, in one
transaction; acknowledged only after the commit, so a crash repeats a batch and the primary keys
(request id, ledger ref) make the repeat a no-op.  Entries left pending by a dead writer are claimed.
"""
from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
import os
import socket
import time
from typing import Any

import asyncpg
import redis.asyncio as aioredis
import redis.exceptions

from . import metrics
from .decisions import UsageRecord
from .store import USAGE_STREAM, Store, orphans

log = logging.getLogger("extproc.usage")
GROUP = "writers"

_INSERT = """
INSERT INTO usage_records (request_id, org_id, key_id, alias, upstream_model, endpoint, status, stream,
  prompt_tokens, completion_tokens, estimated, cost_micro_pln, input_price, output_price,
  started_at, ttfb_ms, ended_at)
SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::int[],
  $8::bool[], $9::int[], $10::int[], $11::bool[], $12::bigint[], $13::bigint[], $14::bigint[],
  $15::timestamptz[], $16::int[], $17::timestamptz[])
ON CONFLICT (request_id) DO NOTHING
RETURNING request_id, org_id, cost_micro_pln
"""
_DEBIT = """
INSERT INTO ledger (org_id, amount_micro_pln, kind, ref)
SELECT * FROM unnest($1::text[], $2::bigint[], $3::text[], $4::text[])
ON CONFLICT (ref) DO NOTHING
"""
_COLS = ["request_id", "org_id", "key_id", "alias", "upstream_model", "endpoint", "status", "stream",
         "prompt_tokens", "completion_tokens", "estimated", "cost_micro_pln", "input_price", "output_price",
         "started_at", "ttfb_ms", "ended_at"]


def _ts(x: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(x, dt.timezone.utc)


async def write_batch(pool: asyncpg.Pool, records: list[dict[str, Any]]) -> None:
    cols: list[list[Any]] = [[] for _ in _COLS]
    for r in records:
        for i, c in enumerate(_COLS):
            v = r[c]
            cols[i].append(_ts(v) if c in ("started_at", "ended_at") else v)
    async with pool.acquire() as conn, conn.transaction():
        rows = await conn.fetch(_INSERT, *cols)
        debits = [(r["org_id"], -r["cost_micro_pln"], "usage", "usage:" + r["request_id"])
                  for r in rows if r["cost_micro_pln"] > 0]
        if debits:
            await conn.execute(_DEBIT, *[list(c) for c in zip(*debits)])


class UsageWriter:
    def __init__(self, r: aioredis.Redis, pool: asyncpg.Pool, store: Store, *, batch: int = 500,
                 claim_idle_ms: int = 15000) -> None:
        self.r = r
        self.store = store
        self._last_reap = 0.0
        self._suspects: dict[str, float] = {}  # request id -> when its owner was first seen gone
        self.pool = pool
        self.batch = batch
        self.claim_idle_ms = claim_idle_ms
        self.pace_s = 0.2
        self.consumer = f"{socket.gethostname()}-{os.getpid()}"

    async def _ensure_group(self) -> None:
        try:
            await self.r.xgroup_create(USAGE_STREAM, GROUP, id="0", mkstream=True)
        except redis.exceptions.ResponseError as e:
            if "BUSYGROUP" not in str(e):
                raise

    async def _take(self) -> list[tuple[bytes, dict[bytes, bytes]]]:
        # first what this consumer left pending (a batch that failed), then a dead one's, then new
        own: Any = await self.r.xreadgroup(GROUP, self.consumer, {USAGE_STREAM: "0"}, count=self.batch)
        if own and own[0][1]:
            return [e for e in own[0][1] if e and e[1]]
        claimed: Any = await self.r.xautoclaim(USAGE_STREAM, GROUP, self.consumer, self.claim_idle_ms,
                                          start_id="0-0", count=self.batch)
        entries = claimed[1] if claimed else []
        if entries:
            return [e for e in entries if e and e[1]]
        res: Any = await self.r.xreadgroup(GROUP, self.consumer, {USAGE_STREAM: ">"}, count=self.batch, block=200)
        return res[0][1] if res else []

    async def reap(self) -> int:
        """Bill the requests of ext_proc processes that died mid-request (estimated input tokens):
        such a request reached the model server, but its process can no longer see its end."""
        now = asyncio.get_running_loop().time()
        found = await orphans(self.r)
        # an owner must stay silent for 3 s more (past Redis's own outages) before its requests are taken
        self._suspects = {rid: self._suspects.get(rid, now) for rid, *_ in found}
        reaped = 0
        for rid, key_id, org, pending in found:
            if now - self._suspects[rid] < 3.0:
                continue
            pending.update(org_id=org, key_id=key_id)
            await self.store.finish(org, rid, UsageRecord(**pending))
            reaped += 1
        if reaped:
            log.warning("billed %d request(s) left in flight by a stopped ext_proc", reaped)
        return reaped

    async def step(self) -> int:
        now = asyncio.get_running_loop().time()
        if now - self._last_reap > 1.0:
            self._last_reap = now
            await self.reap()
        entries = await self._take()
        if not entries:
            return 0
        records = [json.loads(f[b"r"]) for _, f in entries]
        await write_batch(self.pool, records)
        now = time.time()
        for r in records:
            metrics.WRITE_LAG.observe(max(0.0, now - r["ended_at"]))
        ids = [i for i, _ in entries]
        async with self.r.pipeline(transaction=True) as p:
            p.xack(USAGE_STREAM, GROUP, *ids)
            p.xdel(USAGE_STREAM, *ids)
            await p.execute()
        return len(entries)

    async def run(self) -> None:
        delay = 0.2
        while True:
            try:
                await self._ensure_group()
                while True:
                    if await self.step() < self.batch:
                        # a short pause lets records gather into one PostgreSQL transaction under load;
                        # a record still shows within half a second
                        await asyncio.sleep(self.pace_s)
                    delay = 0.2
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - a dependency is down: wait and go on
                log.warning("usage writer: %s; retrying in %.1fs", type(e).__name__, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    async def drain(self) -> None:
        """Write everything queued now (used at shutdown)."""
        await self._ensure_group()
        while await self.step():
            pass
