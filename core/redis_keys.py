"""The Redis key layout, owned here: the ext_proc's scripts, the reaper, the usage writer and the
operator's ``Admin`` all name keys through this module (a test holds every other module to it).

All keys under ``gw:``:
  gw:k:<sha256>    hash  id, org, rpm, and the key's own limits: cap (monthly, micro-PLN), models (allowed
                   aliases, comma-joined), exp (unix s it stops working); absent: no such limit
                   | none=1 (unknown or revoked; written by revocation)  TTL-bounded
  gw:ks:<key>:<YYYY-MM>  hash  spent, hold (micro-PLN): a key with a cap, its spend in that Warsaw month and
                   the worst cases of its requests in flight; filled from PostgreSQL's usage records when
                   missing (a Redis that lost it)   TTL 40 days
  gw:o:<org>       hash  status, balance (micro-PLN), rpm, conc, paid (1: credited other than the trial
                   credit), climit (its own credit limit: micro-PLN, "none" or "default"), hold (the
                   worst cases of its requests in flight, micro-PLN)   (no TTL; kept current by control)
  gw:rl:<key>:<minute>  counter of the key's requests in that minute
  gw:c:<org>       zset  request id -> lease expiry (unix s): the organisation's in-flight requests
  gw:usage         stream of usage records, drained into PostgreSQL by the usage writer
  gw:if            hash  request id -> "key|org|hold|owner|pending record": requests admitted and not finished
                   (hold: micro-PLN, "<micro-PLN>/<YYYY-MM>" when the key's spend counter of that month holds
                   it too and takes the request's cost)
                   yet (the first finish removes the entry: no double debit), so that a
                   request whose ext_proc process died is still billed (the usage writer's ``reap``)
  gw:hb:<owner>    an ext_proc process's heartbeat (expires 3 s after the process stops or pauses;
                   its connection named gwx-<owner> tells the two apart)
  gw:x:<request>   an admission its caller gave up on (``cancel``): should it still reach Redis, it refuses itself
  gw:left:<request>  the client of this request went away (Envoy's access log, ``access_log``)  TTL 2 min
  gw:console:lim:<name>:<who>  the console's attempt counters (control/console/limits.py)

On a Redis Cluster every key a request's scripts touch lives in one hash slot: that of its organisation's
shard.  An organisation belongs to one of ``SHARDS`` shards (a CRC-32 of its id), and the shard's hash tag
is written after the prefix: gw:o:{g3}<org>, gw:c:{g3}<org>, gw:rl:{g3}<key>:<minute>, gw:x:{g3}<request>,
gw:ks:{g3}<key>:<month>,
and each shard has its own journal (gw:if{g3}) and usage stream (gw:usage{g3}), which the usage writer
reads all of.  The key record (gw:k:) is read before the admission script, which is given the
organisation it names.  On one Redis the tag is empty: the layout above, one journal and one stream.
The shards' tags are chosen so that shard i's slot is about i/SHARDS of the way through the slots: a
cluster whose primaries split the slots evenly splits the shards evenly.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass
from itertools import count

from redis.crc import key_slot

KEY = "gw:k:"
ORG = "gw:o:"
RATE = "gw:rl:"
IN_FLIGHT = "gw:c:"
USAGE_STREAM = "gw:usage"
JOURNAL = "gw:if"
HEARTBEAT = "gw:hb:"
CANCELLED = "gw:x:"
CONSOLE_LIMITS = "gw:console:lim:"
KEY_SPEND = "gw:ks:"
LEFT = "gw:left:"

_LUA = {"@KEY@": KEY, "@ORG@": ORG, "@RATE@": RATE, "@IN_FLIGHT@": IN_FLIGHT, "@JOURNAL@": JOURNAL,
        "@CANCELLED@": CANCELLED, "@KEY_SPEND@": KEY_SPEND}


SHARDS = 16
SLOTS = 16384


def _shard_tag(i: int) -> str:
    """The first tag {g<i>}, {g<i>.1}, ... whose slot lies in shard i's sixteenth of the slots."""
    low, high = i * SLOTS // SHARDS, (i + 1) * SLOTS // SHARDS
    for n in count():
        tag = "{g%d%s}" % (i, f".{n}" if n else "")
        if low <= key_slot(tag.encode()) < high:
            return tag
    raise AssertionError("unreachable")


CLUSTER_TAGS = tuple(_shard_tag(i) for i in range(SHARDS))


@dataclass(frozen=True)
class Layout:
    """Where an organisation's keys are: ``tags`` is ("",) on one Redis, the shards' on a cluster."""
    tags: tuple[str, ...] = ("",)

    @property
    def cluster(self) -> bool:
        return self.tags != ("",)

    def tag(self, org_id: str) -> str:
        return self.tags[zlib.crc32(org_id.encode()) % len(self.tags)] if self.cluster else ""

    def org(self, org_id: str) -> str:
        return ORG + self.tag(org_id) + org_id

    def in_flight(self, org_id: str) -> str:
        return IN_FLIGHT + self.tag(org_id) + org_id

    def key_spend(self, org_id: str, key_id: str, month: str) -> str:
        """A key's spend counter of a Warsaw month, on its organisation's shard."""
        return KEY_SPEND + self.tag(org_id) + key_id + ":" + month

    def journal(self, tag: str) -> str:
        return JOURNAL + tag

    def stream(self, tag: str) -> str:
        return USAGE_STREAM + tag

    def streams(self) -> list[str]:
        return [self.stream(t) for t in self.tags]

    def org_of(self, name: str) -> str:
        """The organisation id of an org key's name (gw:o:[tag]<org>)."""
        rest = name.removeprefix(ORG)
        return rest.partition("}")[2] if self.cluster and rest.startswith("{") else rest


ONE = Layout()
CLUSTER = Layout(CLUSTER_TAGS)


def key(key_hash: str) -> str:
    return KEY + key_hash


def org(org_id: str) -> str:
    """An organisation's key on one Redis (``Layout.org`` on either)."""
    return ORG + org_id


def key_spend(key_id: str, month: str) -> str:
    """The key's spend counter of a Warsaw month ("YYYY-MM", core/key_limits.py)."""
    return KEY_SPEND + key_id + ":" + month


def left(request_id: str) -> str:
    return LEFT + request_id


def heartbeat(owner: str) -> str:
    return HEARTBEAT + owner


def liveness(owner: str) -> str:
    """The client name an ext_proc process gives its request-path connection (CLIENT SETNAME): Redis drops
    the connection of a process that died (the kernel closes it), never that of one that is only paused,
    so the reaper takes a silent process for dead only when no connection bears its name."""
    return "gwx-" + owner


def lua(script: str) -> str:
    """A Lua script with its key prefixes written as @KEY@, @ORG@ … filled in from this layout."""
    for mark, prefix in _LUA.items():
        script = script.replace(mark, prefix)
    assert "@" not in script, "an unknown key prefix mark"
    return script
