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
"""
from __future__ import annotations

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


def key(key_hash: str) -> str:
    return KEY + key_hash


def org(org_id: str) -> str:
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
