"""Drains the Redis usage stream into PostgreSQL: each record once, with its ledger debit, in one
transaction; acknowledged only after the commit, so a crash repeats a batch and the primary keys
(request id, ledger ref) make the repeat a no-op.  Entries left pending by a dead writer are claimed.

It runs as a process of its own, ``python -m extproc.usage_writer`` (the launcher, compose and the
Kubernetes manifests start one), so that its batches never hold up a request in an ext_proc's loop.
It also bills the requests that a stopped ext_proc left in flight (``reap``).  On SIGTERM it writes
what is queued, then exits.

On a Redis Cluster the stream is one per shard (core/redis_keys.py): each is read with the same consumer
group, and one batch takes from all of them (read in turn, none waiting); each entry is acknowledged
in its own shard after the commit.
"""
from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from dataclasses import Field, fields
from typing import Any

import asyncpg
import redis.exceptions

from core.decisions import UsageRecord
from core.usage_writer_settings import WriterSettings
from . import metrics
from .process import run, until_stopped
from .store import Store, open_store, orphans

log = logging.getLogger("extproc.usage")
GROUP = "writers"

def _from_json(f: Field[Any]) -> str:
    """A record field's type as its JSON is read (epoch seconds for a time)."""
    return "float8" if f.metadata["pg_type"] == "timestamptz" else str(f.metadata["pg_type"])


def _to_column(f: Field[Any]) -> str:
    """A record field's value as its usage_records column takes it."""
    if f.metadata["pg_type"] == "timestamptz":
        return f"to_timestamp({f.name})"
    return f"nullif({f.name}, '')" if f.default == "" else f.name


COLUMNS = fields(UsageRecord)

# One statement, one round trip: PostgreSQL parses the records' JSON itself (this process only joins
# the bytes it read from Redis), inserts the new ones and debits each new one's cost in the ledger.
# The column lists are UsageRecord's fields (core/decisions.py).
WRITE = f"""
WITH r AS (
  SELECT * FROM jsonb_to_recordset($1::jsonb) AS x({", ".join(f"{f.name} {_from_json(f)}" for f in COLUMNS)})
), new AS (
  INSERT INTO usage_records ({", ".join(f.name for f in COLUMNS)})
  SELECT {", ".join(_to_column(f) for f in COLUMNS)}
  FROM r
  ON CONFLICT (request_id) DO NOTHING
  RETURNING request_id, org_id, cost_micro_pln
)
INSERT INTO ledger (org_id, amount_micro_pln, kind, ref)
SELECT org_id, -cost_micro_pln, 'usage', 'usage:' || request_id FROM new WHERE cost_micro_pln > 0
ON CONFLICT (ref) DO NOTHING
"""


BATCH = 500
CLAIM_IDLE_MS = 15000  # a dead writer's pending entries are claimed this long after it read them
BUSY = 16  # records in one batch from which the writer waits longer for the next
DEAD_IDLE_MS = 60000  # a consumer that has not read for this long and holds no entry is a dead writer's
PRUNE_EVERY_S = 10.0

# An entry's acknowledgement and deletion at once (one key: the same on one Redis and on a cluster's shard).
_ACK = """
redis.call('XACK', KEYS[1], ARGV[1], unpack(ARGV, 2))
return redis.call('XDEL', KEYS[1], unpack(ARGV, 2))
"""

# The group's consumers that hold no pending entry and have not read for ARGV[3] ms, other than ARGV[2]
# (this writer), removed in one step: a consumer that reads between a look and its removal cannot lose
# the entries it just read (XGROUP DELCONSUMER drops a consumer's pending entries with it).
_PRUNE = """
local gone = {}
for _, c in ipairs(redis.call('XINFO', 'CONSUMERS', KEYS[1], ARGV[1])) do
  local f = {}
  for i = 1, #c, 2 do f[c[i]] = c[i + 1] end
  if f['name'] ~= ARGV[2] and f['pending'] == 0 and f['idle'] >= tonumber(ARGV[3]) then
    redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], f['name'])
    gone[#gone + 1] = f['name']
  end
end
return gone
"""


async def prune(r: Any, stream: str, group: str, keep: str, idle_ms: int = DEAD_IDLE_MS) -> list[str]:
    """Remove the consumers of dead writers from ``group`` (each start of a writer is a consumer of its
    own, host and pid): those idle ``idle_ms`` or more with no pending entry, never ``keep``.  A dead
    writer's pending entries are claimed first (``CLAIM_IDLE_MS``), which empties it.  Redis before 7.2
    counts the idle time from the last entries a consumer was given, so a live writer of a quiet system
    may be removed too: harmless, it holds no entry, and the next entries it reads add it back.
    Returns their names."""
    gone: Any = await r.eval(_PRUNE, 1, stream, group, keep, idle_ms)
    return [g.decode() if isinstance(g, bytes) else str(g) for g in gone]


def pause_after(written: int) -> float:
    """How long to let records gather after a batch of ``written``, so that they go to PostgreSQL in one
    transaction.  A light load gets 20 ms: each transaction stays small work for PostgreSQL, which
    shares the cores with Envoy and the ext_proc (0.2 s batches tripled the gateway's p99 at one
    connection, 20 ms ones do not).  A busy one (``BUSY`` records or more in 20 ms) gets 100 ms: a
    transaction and a Redis read cost about as much for 100 records as for 20, so PostgreSQL's and this
    process's CPU per request fall (BENCHMARKS.md, "CPU per request"), and a record is still in
    PostgreSQL well within a second.  A full batch means more is waiting: no pause."""
    return 0.0 if written >= BATCH else 0.1 if written >= BUSY else 0.02


class UsageWriter:
    def __init__(self, pool: asyncpg.Pool, store: Store) -> None:
        self.r = store.r
        self.store = store
        self._last_reap = 0.0
        self._last_prune = 0.0
        self._recover = True  # look for this consumer's own pending entries (at start, after a failure)
        self._suspects: dict[str, float] = {}  # request id -> when its owner was first seen gone
        self.pool = pool
        self.consumer = f"{socket.gethostname()}-{os.getpid()}"
        self.streams = store.layout.streams()
        self._recovering = set(self.streams)
        self._ack = self.r.register_script(_ACK)

    async def _ensure_group(self) -> None:
        for stream in self.streams:
            try:
                await self.r.xgroup_create(stream, GROUP, id="0", mkstream=True)
            except redis.exceptions.ResponseError as e:
                if "BUSYGROUP" not in str(e):
                    raise

    async def _take_all(self, claim: bool) -> list[tuple[str, list[tuple[bytes, dict[bytes, bytes] | None]]]]:
        """Each stream's entries (``_take``): one stream waits for new ones, several are read in turn, none
        waiting (each is a short command on its shard's primary; the pool holds a few connections a node)."""
        if len(self.streams) == 1:
            return [(self.streams[0], await self._take(self.streams[0], claim, block=200))]
        taken = [(s, await self._take(s, claim, block=None)) for s in self.streams]
        return [(s, t) for s, t in taken if t]

    async def _take(self, stream: str, claim: bool,
                    block: int | None) -> list[tuple[bytes, dict[bytes, bytes] | None]]:
        """First what this consumer left pending (a batch that failed), then a dead one's, then new; the
        first two are looked for only after a failure and once a second, not on every batch.  An entry
        deleted after it was read comes back without fields."""
        entries: Any = []
        if self._recover or stream in self._recovering:
            own: Any = await self.r.xreadgroup(GROUP, self.consumer, {stream: "0"}, count=BATCH)
            entries = own[0][1] if own else []
            if entries:
                self._recovering.add(stream)
            else:
                self._recovering.discard(stream)
        if not entries and claim:
            claimed: Any = await self.r.xautoclaim(stream, GROUP, self.consumer, CLAIM_IDLE_MS,
                                                   start_id="0-0", count=BATCH)
            entries = claimed[1] if claimed else []
        if not entries:
            res: Any = await self.r.xreadgroup(GROUP, self.consumer, {stream: ">"}, count=BATCH, block=block)
            entries = res[0][1] if res else []
        return [e for e in entries if e]

    async def reap(self) -> int:
        """Bill the requests of ext_proc processes that died mid-request (estimated input tokens):
        such a request reached the model server, but its process can no longer see its end."""
        now = asyncio.get_running_loop().time()
        found = await orphans(self.r, self.store.fast)
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
        periodic = now - self._last_reap > 1.0
        if periodic:
            self._last_reap = now
            # before PostgreSQL: set while it is down
            metrics.RECORDS_QUEUED.set(sum([await self.r.xlen(s) for s in self.streams]))
            await self.reap()
        if now - self._last_prune > PRUNE_EVERY_S:
            self._last_prune = now
            for stream in self.streams:
                if gone := await prune(self.r, stream, GROUP, self.consumer, DEAD_IDLE_MS):
                    log.info("removed %d idle consumer(s) holding no entry from the usage group: %s", len(gone),
                             ", ".join(gone))
        self._recover, taken = False, await self._take_all(claim=periodic)
        entries = [e for _, es in taken for e in es]
        if not entries:
            return 0
        records = [f[b"r"] for _, f in entries if f]
        if records:  # the records and their debits in one transaction; one already written is skipped
            async with self.pool.acquire() as conn:
                await conn.execute(WRITE, (b"[" + b",".join(records) + b"]").decode())
        now_ms = time.time() * 1000
        ids = [i for i, _ in entries]  # acknowledged all, those without fields too
        for i in ids:  # an entry's id is "<ms>-<n>", the time it was queued: the request's end
            metrics.WRITE_LAG.observe(max(0.0, now_ms - int(i.split(b"-", 1)[0])) / 1000)
        for stream, es in taken:
            await self._ack(keys=[stream], args=[GROUP, *(i for i, _ in es)])
        return len(entries)

    async def run(self) -> None:
        delay = 0.2
        while True:
            try:
                await self._ensure_group()
                while True:
                    if pause := pause_after(await self.step()):
                        await asyncio.sleep(pause)
                    delay = 0.2
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - a dependency is down: wait and go on
                self._recover = True
                log.warning("usage writer: %s; retrying in %.1fs", type(e).__name__, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    async def drain(self) -> None:
        """Write everything queued now (used at shutdown)."""
        await self._ensure_group()
        while await self.step():
            pass


async def serve(settings: WriterSettings) -> None:
    store = await open_store(settings, 2)
    pool = await asyncpg.create_pool(settings.database_url, min_size=1, max_size=1)
    writer = UsageWriter(pool, store)
    metrics.serve(settings.writer_metrics_http_port, settings.metrics_host, None)
    task = asyncio.create_task(writer.run())
    log.info("usage writer started (consumer %s)", writer.consumer)
    await until_stopped()
    task.cancel()
    try:
        await writer.drain()
    except Exception:  # noqa: BLE001 - what is left stays in Redis for the next writer
        log.warning("usage drain at shutdown incomplete; the next writer finishes it")
    await pool.close()
    await store.r.aclose()


if __name__ == "__main__":
    run(WriterSettings, serve)
