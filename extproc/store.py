"""The request path's one narrow interface to Redis: one round trip on the way in (``admit``), one on the
way out (``finish``).  Cache fills on a miss come from ``directory`` (PostgreSQL) and are rare.

The Redis key layout is ``core.redis_keys``'s.

A hung Redis (SIGSTOP) keeps accepting connections and queues commands: an admission whose caller timed
out would run when Redis resumes, take a slot and journal a request no model server ever sees.  So the
admission carries its caller's deadline (wall-clock ms, checked against Redis's TIME first of all) and
refuses itself when run after it; and a caller that gave up also sends ``cancel``, which undoes an
admission that ran just in time but whose answer came too late, and refuses one still to come.
"""
from __future__ import annotations

import json
import logging
import re
import time
from typing import Any

import redis.exceptions
from redis.asyncio.cluster import RedisCluster

from core.decisions import Admission, Identity, UsageRecord
from core.errors import (CONCURRENCY, INVALID_KEY, MODEL_NOT_FOUND, QUOTA, SUSPENDED, ApiError, key_limit_reached,
                         rate_limited)
from core.key_limits import month
from core.resp import RespClient, RespError, RespSetupError
from core.resp_cluster import ClusterClient, client_from_url
from core.resp_sentinel import SentinelClient
from core.settings import GatewaySettings
from core import redis_durability
from core import redis_keys as rk
from core.redis_client import AnyRedis, layout_of, redis_client
from core.urls import mask
from .billing_outcome import ANSWERED, LEFT
from .hold import WorstCase
from . import metrics


_ADMIT = rk.lua("""
local tag = ARGV[14]
if ARGV[8] ~= '' then
  local t = redis.call('TIME')
  if tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) > tonumber(ARGV[8]) then return {'late'} end
  if redis.call('EXISTS', '@CANCELLED@' .. tag .. ARGV[3]) == 1 then return {'late'} end
end
local k
if ARGV[15] then  -- a cluster's: the key record, read before (id, org, rpm, none, cap, models, exp; '' for none)
  k = {ARGV[15], ARGV[16], ARGV[17], ARGV[18], ARGV[19], ARGV[20], ARGV[21]}
  for i = 1, 7 do if k[i] == '' then k[i] = false end end
else
  k = redis.call('HMGET', '@KEY@' .. ARGV[1], 'id', 'org', 'rpm', 'none', 'cap', 'models', 'exp')
end
if k[4] then return {'bad_key'} end
if not k[1] then return {'miss_key'} end
if k[7] and tonumber(k[7]) <= tonumber(ARGV[12]) then return {'bad_key'} end
local org = k[2]
local o = redis.call('HMGET', '@ORG@' .. tag .. org, 'status', 'balance', 'rpm', 'conc', 'paid', 'climit', 'hold')
if not o[1] or not o[2] or not o[5] then return {'miss_org', k[1], org} end
if o[1] ~= 'active' then return {'suspended', k[1], org} end
if ARGV[2] == '0' then return {'ok', k[1], org, k[6] or ''} end
-- this request's admission sent again (the first one's answer was lost on the way: a connection cut, a
-- timeout, a failover): it stands as it was, nothing counted or held twice
if ARGV[7] ~= '' and redis.call('HEXISTS', '@JOURNAL@' .. tag, ARGV[3]) == 1 then return {'admitted', k[1], org} end
-- the key's allowed aliases: another is as unknown to it as a model that does not exist
if k[6] and not string.find(',' .. k[6] .. ',', ',' .. ARGV[13] .. ',', 1, true) then return {'model', k[1], org} end
-- the credit limit: 0 for an organisation that never paid, else its own ('none': no limit), else the default
local limit = ARGV[10]
if o[5] ~= '1' then limit = '0' elseif o[6] and o[6] ~= 'default' then limit = o[6] end
if limit == '' or limit == 'none' then
  if tonumber(o[2]) <= 0 then return {'quota', k[1], org} end
else
  local available = tonumber(o[2]) - tonumber(o[7] or '0') + tonumber(limit)
  if available <= 0 or tonumber(ARGV[9]) > available then
    return {'quota', k[1], org, string.format('%.0f', available)}
  end
end
-- the key's monthly cap, less its spend this month and the worst cases of its requests in flight
local sk = nil
if k[5] then
  sk = '@KEY_SPEND@' .. tag .. k[1] .. ':' .. ARGV[11]
  local s = redis.call('HMGET', sk, 'spent', 'hold')
  if not s[1] then return {'miss_spend', k[1], org} end
  local left = tonumber(k[5]) - tonumber(s[1]) - tonumber(s[2] or '0')
  if left <= 0 or tonumber(ARGV[9]) > left then
    return {'key_quota', k[1], org, string.format('%.0f', left), k[5]}
  end
end
local now = tonumber(redis.call('TIME')[1])
local rk = '@RATE@' .. tag .. k[1] .. ':' .. math.floor(now / 60)
local n = redis.call('INCR', rk)
if n == 1 then redis.call('EXPIRE', rk, 61) end
if n > tonumber(k[3] or o[3] or ARGV[4]) then
  redis.call('DECR', rk)
  return {'rate', k[1], org, tostring(60 - (now % 60))}
end
local ck = '@IN_FLIGHT@' .. tag .. org
local conc = tonumber(o[4] or ARGV[5])
if redis.call('ZCARD', ck) >= conc then
  -- leases left by a process that died are swept only when they could matter: at the limit
  redis.call('ZREMRANGEBYSCORE', ck, '-inf', now)
  if redis.call('ZCARD', ck) >= conc then
    redis.call('DECR', rk)
    return {'conc', k[1], org}
  end
end
redis.call('ZADD', ck, now + tonumber(ARGV[6]), ARGV[3])
if ARGV[7] ~= '' then
  local held = ARGV[9]
  if sk then
    held = held .. '/' .. ARGV[11]
    if ARGV[9] ~= '0' then redis.call('HINCRBY', sk, 'hold', ARGV[9]) end
  end
  redis.call('HSET', '@JOURNAL@' .. tag, ARGV[3], k[1] .. '|' .. org .. '|' .. held .. '|' .. ARGV[7])
  if ARGV[9] ~= '0' then redis.call('HINCRBY', '@ORG@' .. tag .. org, 'hold', ARGV[9]) end
end
return {'admitted', k[1], org}
""")

# A journal entry's hold (its third field), given back to its organisation's held total, and to its key's
# spend counter of the month it names, if any ("hold/YYYY-MM"); returns that counter (nil: none).  (An
# entry written before holds existed has the owner there, never digits alone followed by '|': it holds nothing.)
_RELEASE = """
local function release(ok, entry, tag)
  local key, held, month = string.match(entry, '^([^|]*)|[^|]*|(%d+)/?([%d-]*)|')
  held = tonumber(held)
  local sk = nil
  if month and month ~= '' then sk = '@KEY_SPEND@' .. tag .. key .. ':' .. month end
  if held and held > 0 then
    if redis.call('HINCRBY', ok, 'hold', -held) < 0 then redis.call('HSET', ok, 'hold', 0) end
    if sk and redis.call('EXISTS', sk) == 1 and redis.call('HINCRBY', sk, 'hold', -held) < 0 then
      redis.call('HSET', sk, 'hold', 0)
    end
  end
  return sk
end
"""

# The journal entry (gw:if) exists from admission to the first finish: removing it is what makes a
# finish the first one, so a repeated finish (a retry, the reaper) debits and releases nothing.
# A refusal (ARGV[5] = '1') was never admitted: it has no journal entry, costs nothing and is only
# queued for the usage log (a repeat is dropped by the usage record's primary key in PostgreSQL).
# A finish that finds no journal entry still queues its record (answer 2) unless it counts only as the
# first (ARGV[6] = '1'): the entry is gone because a finish came first (then PostgreSQL keeps the first
# record of a request id and drops this one) or because Redis lost it (emptied, or failed over without
# it): then this record is the only one, and the ledger in PostgreSQL still gets it.  The balance kept
# here is not debited (it may have been filled from the ledger since): `gateway reconcile` mends it.
_FINISH = rk.lua(_RELEASE + """
local tag = ARGV[7]
redis.call('ZREM', '@IN_FLIGHT@' .. tag .. ARGV[1], ARGV[2])
if ARGV[5] == '1' then
  redis.call('XADD', KEYS[1], '*', 'r', ARGV[4])
  return 1
end
local entry = redis.call('HGET', '@JOURNAL@' .. tag, ARGV[2])
if not entry then
  if ARGV[4] == '' or ARGV[6] == '1' then return 0 end
  redis.call('XADD', KEYS[1], '*', 'r', ARGV[4])
  return 2
end
redis.call('HDEL', '@JOURNAL@' .. tag, ARGV[2])
local ok = '@ORG@' .. tag .. ARGV[1]
local sk = release(ok, entry, tag)
if ARGV[4] == '' then return 0 end
if tonumber(ARGV[3]) > 0 and redis.call('HEXISTS', ok, 'balance') == 1 then
  redis.call('HINCRBY', ok, 'balance', -tonumber(ARGV[3]))
end
if sk and tonumber(ARGV[3]) > 0 and redis.call('HEXISTS', sk, 'spent') == 1 then
  redis.call('HINCRBY', sk, 'spent', ARGV[3])
end
redis.call('XADD', KEYS[1], '*', 'r', ARGV[4])
return 1
""")

# An admission given up on: mark it refused (for one still queued) and undo one that ran (slot, journal).
_CANCEL = rk.lua(_RELEASE + """
local tag = ARGV[3]
redis.call('SET', '@CANCELLED@' .. tag .. ARGV[1], '1', 'EX', ARGV[2])
local v = redis.call('HGET', '@JOURNAL@' .. tag, ARGV[1])
if not v then return 0 end
redis.call('HDEL', '@JOURNAL@' .. tag, ARGV[1])
local org = string.match(v, '^[^|]*|([^|]*)|')
redis.call('ZREM', '@IN_FLIGHT@' .. tag .. org, ARGV[1])
release('@ORG@' .. tag .. org, v, tag)
return 1
""")

# Fill a cache entry unless something (a revocation, a suspension) wrote it first.
_FILL_KEY = """
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('HSET', KEYS[1], unpack(ARGV, 2))
  redis.call('EXPIRE', KEYS[1], ARGV[1])
end
return 1
"""
_FILL_ORG = """
for i = 1, #ARGV, 2 do redis.call('HSETNX', KEYS[1], ARGV[i], ARGV[i + 1]) end
return 1
"""
# A key's spend counter outlives its month by a few days (a request that straddles the month's end).
_FILL_SPEND = """
if redis.call('HSETNX', KEYS[1], 'spent', ARGV[1]) == 1 then redis.call('EXPIRE', KEYS[1], ARGV[2]) end
return 1
"""
_SPEND_TTL_S = 40 * 86400




# the admission script's other answers (but "rate") -> the error (None: may proceed)
_ANSWERS: dict[str, ApiError | None] = {"ok": None, "admitted": None, "suspended": SUSPENDED, "quota": QUOTA,
                                        "conc": CONCURRENCY, "model": MODEL_NOT_FOUND}


_TAGS_KEPT = 65536


class Late(Exception):
    """Redis ran the admission after its deadline (or after ``cancel``): it took no effect."""


class Miss(Exception):
    """A cache entry is missing: fill it from PostgreSQL and ask again."""

    def __init__(self, what: str, org_id: str | None = None, key_id: str | None = None) -> None:
        super().__init__(what)
        self.what = what
        self.org_id = org_id
        self.key_id = key_id  # "spend": the key whose spend counter of ``month`` is missing
        self.month = ""






async def open_store(settings: GatewaySettings, pool_size: int, owner: str = "") -> Store:
    """The process's store: redis-py with a pool of ``pool_size`` and the request path's own client.  A
    Redis that refuses REDIS_URL's credentials (or wants some it lacks) will not take them later, so the
    process exits saying so (the password masked) rather than answer every request with 500.  A Redis
    that is down is not a reason: it is waited for as ever."""
    store = Store(redis_client(settings.redis_url, pool_size),
                  client_from_url(settings.redis_url, name=rk.liveness(owner) if owner else ""),
                  default_rpm=settings.default_rpm, default_concurrency=settings.default_concurrency,
                  lease_s=int(settings.total_timeout_s) + 60, key_ttl_s=settings.key_cache_ttl_s,
                  credit_limit=settings.credit_limit_micro)
    try:
        await store.fast.call("PING")
        unfit = None if settings.dev else await redis_durability.check(store.fast.call)
    except RespSetupError as e:
        logging.getLogger("extproc").error("%s", e)
        raise SystemExit(2) from None
    except Exception:  # noqa: BLE001 - down or slow: requests get 500 until it is back
        unfit = None
    if unfit is not None:
        logging.getLogger("extproc").error("Redis at %s %s (or GATEWAY_DEV=1 for development)",
                                           mask(settings.redis_url), unfit)
        raise SystemExit(2)
    return store


class Store:
    """``fast`` carries the two per-request scripts; ``client`` (redis-py) the rare cache fills.
    ``credit_limit`` (micro-PLN): how far below zero a paid organisation without a limit of its own may
    go (GATEWAY_CREDIT_LIMIT_PLN); None: no limit."""

    def __init__(self, client: AnyRedis, fast: RespClient | ClusterClient | SentinelClient, *, default_rpm: int, default_concurrency: int,
                 lease_s: int, key_ttl_s: int, credit_limit: int | None = None) -> None:
        self.r = client
        self.fast = fast
        self.layout = layout_of(client)
        # a cluster's admissions with limits not finished yet: request id -> its shard's tag (for ``cancel``)
        self._tags: dict[str, str] = {}
        self._defaults = (str(default_rpm), str(default_concurrency), str(lease_s))
        self._credit_limit = "" if credit_limit is None else str(credit_limit)
        self._key_ttl = key_ttl_s
        self.margin_s = 0.25
        self.clock_offset_s = 0.0  # Redis's clock minus this host's (``sync_clock``): deadlines are in Redis's time
        self._fill_key = client.register_script(_FILL_KEY)
        self._fill_org = client.register_script(_FILL_ORG)
        self._fill_spend = client.register_script(_FILL_SPEND)

    async def admit(self, key_hash: str, request_id: str, *, limits: bool, pending: str = "",
                    deadline: float | None = None, hold: WorstCase | None = None, alias: str = "",
                    now: float | None = None) -> Admission:
        """Authenticate and, with ``limits``, check the key's allowed aliases (``alias``), balance, the
        key's monthly cap, rate and concurrency and take a slot.  ``now`` (unix s; the request's start):
        the moment the key's expiry is checked against and whose Warsaw month its spend counts in.
        ``pending`` is the journal entry kept while the request is in flight, with ``hold``'s cost held
        against the organisation's available balance until the request's first finish (README,
        "Billing"): one that does not fit is 402 saying what would.  ``deadline`` (unix s):
        the script refuses itself (``Late``) when Redis runs it later than that, or later than this call
        waits for its answer, less a margin for the answer's way back."""
        rpm, conc, lease = self._defaults
        until = ""
        if deadline is not None:
            until = str(int((min(deadline, time.time() + self.fast.timeout) - self.margin_s + self.clock_offset_s)
                            * 1000))
        held = 0 if hold is None else hold.cost
        at = time.time() if now is None else now
        this_month = month(at)
        args: list[Any] = [key_hash, "1" if limits else "0", request_id, rpm, conc, lease, pending, until, held,
                           self._credit_limit, this_month, int(at), alias]
        if not self.layout.cluster:
            res = await self.fast.evalsha(_ADMIT, [], [*args, ""])
        else:
            res = await self._admit_on_shard(key_hash, request_id, args)
        tag = res[0].decode()  # RespClient's replies: bytes
        if tag == "late":
            raise Late(request_id)
        if tag == "bad_key":
            return Admission(None, INVALID_KEY)
        if tag == "miss_key":
            raise Miss("key")
        ident = Identity(res[1].decode(), res[2].decode())
        if tag == "miss_org":
            raise Miss("org", ident.org_id)
        if tag == "miss_spend":
            miss = Miss("spend", ident.org_id, ident.key_id)
            miss.month = this_month
            raise miss
        if tag == "ok":
            return Admission(ident, None, tuple(res[3].decode().split(",")) if res[3] else None)
        if tag == "key_quota":
            left, cap = int(res[3]), int(res[4])
            return Admission(ident, key_limit_reached(cap) if hold is None else hold.key_refusal(left, cap))
        if tag == "rate":
            return Admission(ident, rate_limited(max(1, int(res[3]))))
        if tag == "quota" and len(res) > 3 and hold is not None:  # a credit limit applied: what would fit
            return Admission(ident, hold.refusal(int(res[3])))
        return Admission(ident, _ANSWERS[tag])

    async def _admit_on_shard(self, key_hash: str, request_id: str, args: list[Any]) -> Any:
        """A cluster's admission: the key record first (its own slot), then the script on its organisation's
        shard, given the record."""
        k = await self.fast.call("HMGET", rk.key(key_hash), "id", "org", "rpm", "none", "cap", "models", "exp")
        if k[3] is not None:
            return [b"bad_key"]
        if k[0] is None or k[1] is None:
            return [b"miss_key"]
        org = k[1].decode()
        tag = self.layout.tag(org)
        if args[1] == "1":  # the script may take a slot and journal: a ``cancel`` needs the shard
            self._tags[request_id] = tag
            if len(self._tags) > _TAGS_KEPT:  # the oldest: finished long ago, or never will be
                del self._tags[next(iter(self._tags))]
        return await self.fast.evalsha(_ADMIT, [self.layout.org(org)],
                                       [*args, tag, *(b"" if v is None else v for v in k)])

    async def finish(self, org_id: str, request_id: str, record: UsageRecord | None, *,
                     refused: bool = False, first_only: bool = False) -> None:
        """Release the request's slot and, with a record, debit its cost and queue the record (once).
        On a cluster or behind Sentinel it counts once a replica has it too (a finish sent again does no
        harm: the journal entry, gone with the first, makes it only queue its record, which PostgreSQL
        then drops).
        ``refused``: the request was never admitted; its record (cost 0) is only queued for the log.
        ``first_only``: a fallback record, dropped when another finish came first."""
        payload = "" if record is None else record.to_json()
        tag = self.layout.tag(org_id)
        self._tags.pop(request_id, None)
        args = [org_id, request_id, 0 if record is None else record.cost_micro_pln, payload,
                "1" if refused else "", "1" if first_only else "", tag]
        if isinstance(self.fast, (ClusterClient, SentinelClient)):  # on a replica too: a failover keeps it
            done = await self.fast.evalsha(_FINISH, [self.layout.stream(tag)], args, replicated=True)
        else:
            done = await self.fast.evalsha(_FINISH, [self.layout.stream(tag)], args)
        if done == 2:
            metrics.FINISHED_WITHOUT_JOURNAL.inc()
            logging.getLogger("extproc").warning(
                "finished with no in-flight entry in Redis (lost, or finished already): record queued for "
                "PostgreSQL, Redis's balance not debited (gateway reconcile)", extra={"request_id": request_id})

    async def release(self, org_id: str, request_id: str) -> None:
        """Give the request's concurrency slot back ahead of its finish (a reply that is over, billed
        later): its journal entry, hold and record stay for the finish."""
        await self.fast.call("ZREM", self.layout.in_flight(org_id), request_id)

    async def mark_ended(self, request_id: str, how: str) -> None:
        """How this request ended for its client (``access_log``: ``billing_outcome.LEFT`` or ``ANSWERED``),
        kept for two minutes."""
        await self.r.set(rk.left(request_id), how, ex=120)

    async def how_ended(self, request_id: str) -> str:
        """What ``mark_ended`` kept ("" if nothing; a mark of an older version, "1", is a client that left)."""
        v = await self.r.get(rk.left(request_id))
        return "" if v is None else ANSWERED if v == ANSWERED.encode() else LEFT

    async def sync_clock(self) -> None:
        """Measure how far Redis's clock is from this host's (to within half a round trip), so that a
        managed Redis whose clock differs by seconds neither refuses every admission nor lets late ones in."""
        before = time.time()
        secs, micros = await self.r.time()
        after = time.time()
        if after - before < 0.5:
            self.clock_offset_s = secs + micros / 1e6 - (before + after) / 2

    async def cancel(self, request_id: str) -> None:
        """The caller gave up on this request's admission: undo it if it ran, refuse it if it is still to run."""
        if not self.layout.cluster:
            await self.fast.evalsha(_CANCEL, [], [request_id, self._defaults[2], ""])
        elif (tag := self._tags.get(request_id)) is not None:  # else its script was never sent
            await self.fast.evalsha(_CANCEL, [self.layout.journal(tag)], [request_id, self._defaults[2], tag])
            self._tags.pop(request_id, None)  # taken (a failure leaves it for the retry)

    async def fill_key(self, key_hash: str, fields: dict[str, Any] | None) -> None:
        """Cache a key (fields) or its absence (None, for a short time)."""
        args: list[Any] = [5, "none", "1"] if fields is None else [self._key_ttl, *_flat(fields)]
        await self._fill_key(keys=[rk.key(key_hash)], args=args)

    async def fill_org(self, org_id: str, fields: dict[str, Any]) -> None:
        await self._fill_org(keys=[self.layout.org(org_id)], args=_flat(fields))

    async def fill_spend(self, org_id: str, key_id: str, month: str, spent: int) -> None:
        """Cache a key's spend in a month (PostgreSQL's usage records), unless a fill came first."""
        await self._fill_spend(keys=[self.layout.key_spend(org_id, key_id, month)], args=[spent, _SPEND_TTL_S])


def _flat(fields: dict[str, Any]) -> list[Any]:
    """A hash's fields as HSET's arguments (name, value, ...), those without a value left out."""
    return [x for k, v in fields.items() if v is not None for x in (k, v)]


async def heartbeat(fast: RespClient | ClusterClient | SentinelClient, owner: str) -> None:
    """This process is alive (for 3 s): written by the request path's client, on the primary its
    requests' journal entries are on, where the reaper looks (``orphans``)."""
    await fast.call("SET", rk.heartbeat(owner), "1", "EX", 3)


async def orphans(r: AnyRedis, fast: RespClient | ClusterClient | SentinelClient) -> list[tuple[str, str, str, dict[str, Any]]]:
    """In-flight entries whose ext_proc process is gone: (request id, key id, org id, pending record).
    On one Redis or behind Sentinel they are read through ``fast``, the client the reaper bills them
    with: after a failover redis-py and it may speak to different primaries for seconds (an old primary
    back from a freeze takes commands until the sentinels demote it), and an owner silent on one must
    not have its requests billed on the other.  On a cluster, through redis-py (every shard's journal,
    every node's clients)."""
    layout = layout_of(r)
    cluster = r if isinstance(r, RedisCluster) else None
    entries: list[tuple[bytes, bytes]]
    if cluster is not None:
        journals: list[Any] = [await cluster.hgetall(layout.journal(tag)) for tag in layout.tags]
        entries = [e for j in journals for e in j.items()]
    else:
        flat = await fast.call("HGETALL", layout.journal(layout.tags[0]))
        entries = list(zip(flat[::2], flat[1::2]))
    parsed = [(rid.decode(), *_journal_entry(v.decode())) for rid, v in entries]
    if not parsed:
        return []
    owners = sorted({p[3] for p in parsed})
    beats = [rk.heartbeat(o) for o in owners]
    found: Any = await (cluster.mget_nonatomic(beats) if cluster is not None else fast.call("MGET", *beats))
    silent = {o for o, beat in zip(owners, found) if beat is None}
    if silent:
        silent -= await (_connected(cluster) if cluster is not None else _connected_to(fast))
    return [(rid, key_id, org, json.loads(payload)) for rid, key_id, org, owner, payload in parsed
            if owner in silent]


async def _connected(r: RedisCluster) -> set[str]:
    """The owners whose request-path connection a node of the cluster still holds: a paused process's
    (SIGSTOP, a long pause of its machine) stays, a dead one's goes with the process.  A Redis that
    refuses CLIENT LIST (an ACL without it) leaves the heartbeat alone to judge."""
    try:
        per_node: Any = await r.client_list(target_nodes=RedisCluster.ALL_NODES)
    except redis.exceptions.ResponseError:
        return set()
    clients: Any = [c for cs in per_node.values() for c in cs] if isinstance(per_node, dict) else per_node
    prefix = rk.liveness("")
    return {c["name"][len(prefix):] for c in clients if c.get("name", "").startswith(prefix)}


async def _connected_to(fast: RespClient | ClusterClient | SentinelClient) -> set[str]:
    """``_connected`` on one Redis, asked through ``fast`` (CLIENT LIST: a line per client)."""
    try:
        listed: bytes = await fast.call("CLIENT", "LIST")
    except RespError:
        return set()
    name = b"name=" + rk.liveness("").encode()
    return {f[len(name):].decode() for line in listed.splitlines() for f in line.split(b" ") if f.startswith(name)}


_HOLD = re.compile(r"\d+(/[\d-]*)?")


def _journal_entry(entry: str) -> tuple[str, str, str, str]:
    """(key id, org id, owner, pending record) of a journal entry "key|org|hold|owner|record" (one written
    before holds existed: "key|org|owner|record")."""
    key_id, org, rest = entry.split("|", 2)
    held, _, tail = rest.partition("|")
    owner, payload = tail.split("|", 1) if _HOLD.fullmatch(held) else (held, tail)
    return key_id, org, owner, payload
