"""Whether a Redis can hold money: balances, holds and the usage records queued for PostgreSQL live in it,
so outside development mode the gateway refuses to start on a Redis that would lose them on a restart (no
append-only file) or throw keys away when full (an eviction policy).  Read from INFO, which managed Redis
services allow where CONFIG is often renamed or refused."""
from __future__ import annotations

from typing import Any, Awaitable, Callable


def _fields(info: Any) -> dict[str, str]:
    text = info.decode() if isinstance(info, bytes) else str(info)
    return dict(ln.split(":", 1) for ln in text.splitlines() if ":" in ln and not ln.startswith("#"))


def problem(persistence: Any, memory: Any) -> str | None:
    """What is wrong with a Redis for money, from its ``INFO persistence`` and ``INFO memory``, or None."""
    p, m = _fields(persistence), _fields(memory)
    if p.get("aof_enabled") != "1":
        return ("keeps no append-only file (appendonly no): a restart would lose balances and usage records "
                "not yet in PostgreSQL; set appendonly yes")
    policy = m.get("maxmemory_policy", "noeviction")
    if policy != "noeviction":
        return (f"evicts keys when full (maxmemory-policy {policy}): balances and usage records could be "
                "thrown away; set maxmemory-policy noeviction")
    return None


async def check(call: Callable[..., Awaitable[Any]]) -> str | None:
    """``problem`` of the Redis that ``call`` (a client's one-command function) reaches."""
    return problem(await call("INFO", "persistence"), await call("INFO", "memory"))
