"""redis-py for everything but the request path's two scripts (control plane, console, usage writer)."""
from __future__ import annotations

import asyncio
import contextlib
from dataclasses import asdict
from typing import Any

import redis
import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.sentinel import MasterNotFoundError, Sentinel, SentinelManagedSSLConnection
from redis.backoff import ExponentialBackoff
from redis.asyncio.retry import Retry

from .redis_keys import CLUSTER, ONE, Layout
from .resp_sentinel import FOLLOW_EVERY_S
from .urls import RedisTarget, parse_redis

AnyRedis = aioredis.Redis | RedisCluster
_CLUSTER_TLS = {"ssl_ca_certs", "ssl_cert_reqs", "ssl_certfile", "ssl_check_hostname", "ssl_keyfile"}


def layout_of(r: AnyRedis) -> Layout:
    """The key layout (core/redis_keys.py) of the Redis ``r`` speaks to: one Redis, or a cluster."""
    return CLUSTER if isinstance(r, RedisCluster) else ONE


def redis_client(url: str, size: int) -> AnyRedis:
    """redis-py for everything but the request path's two scripts, opened from the same reading of
    REDIS_URL as the request path's client (core/urls.py), so that both log in alike.  A restarted
    Redis leaves dead pooled connections: a failed call is retried on a new one.  The pool waits for a
    free connection rather than failing when every one is busy; it is small and opened whole at start,
    so that a process's descriptors do not grow under load.  A cluster (redis+cluster://) gets redis-py's
    cluster client, ``size`` connections at most to each node; Sentinel (redis+sentinel://) its primary's
    client, which asks the sentinels again when the primary fails."""
    target = parse_redis(url)
    if target.cluster:
        opts = _redis_py_options(target)
        del opts["db"], opts["host"], opts["port"]
        opts.pop("connection_class", None)
        # redis-py's cluster client takes fewer TLS parameters than its Redis does
        opts = {k: v for k, v in opts.items() if not k.startswith("ssl_") or k in _CLUSTER_TLS}
        return RedisCluster(startup_nodes=[ClusterNode(h, p) for h, p in target.seeds], max_connections=size,
                            socket_timeout=2, socket_connect_timeout=2, ssl=target.tls is not None,
                            retry=Retry(ExponentialBackoff(cap=0.2, base=0.01), 2), **opts)
    if target.sentinel:
        opts = _redis_py_options(target)
        del opts["host"], opts["port"]
        # TLS (rediss+sentinel://): the sentinels are asked over TLS too, with the same parameters, as the
        # request path's client asks them (core/resp_cluster.py)
        tls = {k: v for k, v in opts.items() if k.startswith("ssl_")} | ({"ssl": True} if target.tls else {})
        sentinel = _NewestSentinel(  # type: ignore[no-untyped-call]
            list(target.seeds), sentinel_kwargs={"password": target.sentinel_password, "socket_timeout": 2, **tls},
            socket_timeout=2, socket_connect_timeout=2, health_check_interval=10,
            retry=Retry(ExponentialBackoff(cap=0.2, base=0.01), 2),
            retry_on_error=[redis.exceptions.ConnectionError, redis.exceptions.TimeoutError])
        if "connection_class" in opts:  # TLS: the primary's connections
            opts["connection_class"] = SentinelManagedSSLConnection
        primary: aioredis.Redis = sentinel.master_for(target.service, redis_class=_SentinelPrimary,
                                                      max_connections=size, **opts)
        return primary
    return aioredis.Redis(connection_pool=aioredis.BlockingConnectionPool(
        max_connections=size, timeout=5, socket_timeout=2, socket_connect_timeout=2,
        health_check_interval=10, retry=Retry(ExponentialBackoff(cap=0.2, base=0.01), 2),
        retry_on_error=[redis.exceptions.ConnectionError, redis.exceptions.TimeoutError],
        **_redis_py_options(parse_redis(url))))


class _NewestSentinel(Sentinel):
    """redis-py's Sentinel, which asks every sentinel and follows the answer of the newest configuration
    (its epoch), as the request path's client does (core/resp_sentinel.py): redis-py's own takes the
    first sentinel that names a primary, and one that has not yet heard of a failover names the old one."""

    async def discover_master(self, service_name: str) -> tuple[str, int]:
        got = await asyncio.gather(*(s.sentinel_masters() for s in self.sentinels), return_exceptions=True)
        states = [m[service_name] for m in got if isinstance(m, dict) and m.get(service_name)]
        if states:
            epoch = max(int(st.get("config-epoch", 0)) for st in states)
            for st in states:
                if int(st.get("config-epoch", 0)) == epoch and self.check_master_state(st, service_name):
                    return st["ip"], int(st["port"])
        raise MasterNotFoundError(f"no sentinel names a primary of {service_name!r} that is up")


class _SentinelPrimary(aioredis.Redis):
    """The client of the primary the sentinels name.  It asks them once a second and, when they name
    another, closes its connections (those in use too: their commands fail and redis-py sends them
    again, on the new primary).  Without that, redis-py stays on a primary until an error, and an old
    primary back from a freeze takes commands as a primary for seconds before the sentinels demote it.
    Closing it closes its connections to the sentinels too (redis-py's leaves them open)."""

    _follower: asyncio.Task[None] | None = None

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        if self._follower is None:
            self._follower = asyncio.create_task(self._follow())
        return await super().execute_command(*args, **options)  # type: ignore[no-untyped-call]

    async def _follow(self) -> None:
        pool: Any = self.connection_pool
        while True:
            await asyncio.sleep(FOLLOW_EVERY_S)
            try:
                named = await pool.sentinel_manager.discover_master(pool.service_name)
            except (redis.exceptions.RedisError, OSError):
                continue  # none named, or the sentinels unreachable: the calls themselves will say
            if pool.master_address is not None and named != pool.master_address:
                pool.master_address = named
                await pool.disconnect(inuse_connections=True)

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        if self._follower is not None:
            self._follower.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._follower
            self._follower = None
        await super().aclose(close_connection_pool)
        for s in self.connection_pool.sentinel_manager.sentinels:  # type: ignore[attr-defined]
            await s.aclose()


def _redis_py_options(t: RedisTarget) -> dict[str, Any]:
    opts: dict[str, Any] = {"db": t.db, "username": t.username, "password": t.password}
    if t.unix_path is not None:
        return opts | {"connection_class": aioredis.UnixDomainSocketConnection, "path": t.unix_path}
    opts |= {"host": t.host, "port": t.port}
    if t.tls is None:
        return opts
    # Tls's fields are redis-py's ssl_* parameters without the prefix; those not set are left to redis-py
    tls = {f"ssl_{k}": v for k, v in asdict(t.tls).items() if v is not None}
    return opts | tls | {"connection_class": aioredis.SSLConnection}
