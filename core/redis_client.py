"""redis-py for everything but the request path's two scripts (control plane, console, usage writer)."""
from __future__ import annotations

from dataclasses import asdict
from typing import Any

import redis
import redis.asyncio as aioredis
from redis.backoff import ExponentialBackoff
from redis.asyncio.retry import Retry

from .urls import RedisTarget, parse_redis


def redis_client(url: str, size: int) -> aioredis.Redis:
    """redis-py for everything but the request path's two scripts, opened from the same reading of
    REDIS_URL as the request path's client (core/urls.py), so that both log in alike.  A restarted
    Redis leaves dead pooled connections: a failed call is retried on a new one.  The pool waits for a
    free connection rather than failing when every one is busy; it is small and opened whole at start,
    so that a process's descriptors do not grow under load."""
    return aioredis.Redis(connection_pool=aioredis.BlockingConnectionPool(
        max_connections=size, timeout=5, socket_timeout=2, socket_connect_timeout=2,
        health_check_interval=10, retry=Retry(ExponentialBackoff(cap=0.2, base=0.01), 2),
        retry_on_error=[redis.exceptions.ConnectionError, redis.exceptions.TimeoutError],
        **_redis_py_options(parse_redis(url))))


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
