"""The ext_proc's health loop: every ``INTERVAL_S`` it asks Redis and PostgreSQL, each with a timeout of
its own (``TIMEOUT_S``, below the interval), so that a dependency that stops answering (a stopped or
frozen process keeps accepting connections and never replies) shows as down within
``INTERVAL_S + TIMEOUT_S`` and as back within ``INTERVAL_S`` of answering again.

What it sets:

- the gRPC health (``grpc.health.v1``) that Envoy's health checker and Kubernetes ask: the process's
  services ("" and the ext_proc's) are SERVING only while Redis answers, since without Redis every
  request fails; the services "redis" and "postgres" tell each dependency apart.  A PostgreSQL that is
  down does not take the process out of rotation: requests of keys cached in Redis go on being served;
- the gauge ``gateway_dependency_up{dependency}``;
- one log line when a dependency goes down (with why) and one when it is back: not one per request.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import asyncpg

from . import metrics

log = logging.getLogger("extproc")

INTERVAL_S = 0.5
TIMEOUT_S = 0.4  # below INTERVAL_S: a check never runs into the next one

Check = Callable[[], Awaitable[None]]


class PostgresCheck:
    """``SELECT 1`` on a connection of its own (never one of the request path's pool, whose connection a
    frozen server would hold): a connection that failed a check is dropped and opened anew next time."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.conn: asyncpg.Connection | None = None

    async def __call__(self) -> None:
        try:
            if self.conn is None or self.conn.is_closed():
                self.conn = await asyncpg.connect(self.url, timeout=TIMEOUT_S)
            await self.conn.fetchval("SELECT 1")
        except BaseException:  # a timeout's cancellation too: that connection may be stuck mid-reply
            self.close()
            raise

    def close(self) -> None:
        if self.conn is not None:
            self.conn.terminate()
            self.conn = None


async def probe(check: Check, timeout: float = TIMEOUT_S) -> str | None:
    """None when ``check`` answered within ``timeout``, else why not (an exception's type: its message
    may name a server's address, never data)."""
    try:
        await asyncio.wait_for(check(), timeout)
        return None
    except asyncio.TimeoutError:
        return f"no answer within {timeout:g} s"
    except Exception as e:  # noqa: BLE001 - any failure is "down"; the next round asks again
        return type(e).__name__


class Health:
    """The last result of each check, and what follows from it (``changed`` is called on every round)."""

    def __init__(self, checks: dict[str, Check], changed: Callable[[dict[str, bool]], None]) -> None:
        self.checks = checks
        self.changed = changed
        self.up: dict[str, bool] = {}

    async def round(self) -> dict[str, bool]:
        """Every check at once, each within its timeout."""
        why = await asyncio.gather(*(probe(c) for c in self.checks.values()))
        now = {}
        for name, problem in zip(self.checks, why):
            now[name] = problem is None
            was = self.up.get(name)
            if problem is not None and was is not False:
                log.warning("%s is down: %s", name, problem)
            elif problem is None and was is False:
                log.warning("%s is back", name)
            metrics.labelled(metrics.DEPENDENCY_UP, name).set(1 if problem is None else 0)
        self.up = now
        self.changed(now)
        return now

    async def run(self, interval: float = INTERVAL_S) -> None:
        """A round every ``interval`` seconds, counted from the start of the last one."""
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            await self.round()
            await asyncio.sleep(max(0.0, interval - (loop.time() - started)))
