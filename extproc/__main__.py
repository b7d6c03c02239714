"""Runs the ext_proc service: ``python -m extproc`` (the launcher starts it with the stack's settings)."""
from __future__ import annotations

import asyncio
import gc
import hashlib
import logging
import os
import uuid
import time
from pathlib import Path
from typing import Awaitable, Callable

import asyncpg
from grpc_health.v1 import health_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep

from core import catalog as catalog_mod
from core import alias_policy, envoy_admin
from core.directory import Directory
from core.settings import GatewaySettings
from . import access_log, health, metrics, policies, tracing
from .exchange import Gateway
from .grpc_server import Server
from .process import run, until_stopped
from .server import PROCESS_PATH, Processor
from .spool import Spool
from .store import heartbeat, open_store


log = logging.getLogger("extproc")
HEALTH_SERVICES = ("", "envoy.service.ext_proc.v3.ExternalProcessor")
REDIS_POOL = 8
PG_POOL = 4  # key and organisation lookups on a cache miss


async def watch_catalog(path: str, gw: Gateway, applied: Callable[[str], Awaitable[bool]],
                        every: float = 0.5, settle: float = 1.0) -> None:
    """Apply a changed catalog without a restart.  The change is taken ``settle`` seconds after it is
    seen, by which time Envoy has loaded the clusters rendered from it; a catalog that does not load, or
    that breaks the alias change policy (a model change under 14 days ahead, a smaller limit: see
    ``alias_policy``) and that ``gateway catalog apply`` did not put in force (``applied``, asked with the
    file's SHA-256: the command checked it at its own time, and a breach there needs --force) is refused
    (one line logged) and the one in force stays."""
    seen = os.stat(path).st_mtime_ns
    while True:
        await asyncio.sleep(every)
        try:
            mtime = os.stat(path).st_mtime_ns
            if mtime == seen:
                continue
            seen = mtime
            await asyncio.sleep(settle)
            data = Path(path).read_bytes()
            new = catalog_mod.load(path, data)
            sha = hashlib.sha256(data).hexdigest()
            breaches = alias_policy.breaches(gw.catalog, new, int(time.time()))
            if breaches and not await applied(sha):
                log.error("catalog not reloaded, the one in force stays: %s (apply it with"
                          " gateway catalog apply --force to force it)", "; ".join(breaches))
                continue
            gw.catalog = new
            log.info("catalog reloaded: %d aliases", len(gw.catalog.aliases))
        except (OSError, catalog_mod.CatalogError) as e:
            log.error("catalog not reloaded, the one in force stays: %s", e)
        except Exception:  # noqa: BLE001 - whatever a catalog holds, the watcher lives on
            log.exception("catalog not reloaded, the one in force stays")


def serving(server: Server, up: dict[str, bool]) -> None:
    """The gRPC health (extproc/health.py): the process's services follow Redis, without which every
    request fails; "redis" and "postgres" tell each dependency."""
    def status(ok: bool) -> int:
        return int(health_pb2.HealthCheckResponse.SERVING if ok else health_pb2.HealthCheckResponse.NOT_SERVING)
    for service in HEALTH_SERVICES:
        server.health[service] = status(up.get("redis", False))
    for name, ok in up.items():
        server.health[name] = status(ok)


async def serve(settings: GatewaySettings) -> None:
    cat = catalog_mod.load(settings.catalog)
    request_policies = policies.load(settings.request_policies)
    # the request path has its own Redis connection (store.fast); the pool serves cache fills and the
    # heartbeat. Usage records go to PostgreSQL from a process of their own (extproc.usage_writer).
    owner = uuid.uuid4().hex  # this process, in the in-flight journal and its connection's name
    store = await open_store(settings, REDIS_POOL, owner)
    r = store.r
    pool = await asyncpg.create_pool(settings.database_url, min_size=PG_POOL, max_size=PG_POOL)
    gw = Gateway(catalog=cat, store=store, directory=Directory(pool), pick=lambda a, when: a.pick_upstream(when),
                 owner=owner, max_body_bytes=settings.max_body_bytes, idle_timeout_s=settings.idle_timeout_s,
                 total_timeout_s=settings.total_timeout_s, policies=request_policies)
    gw.spool = Spool(settings.state / "spool")
    for pending in gw.spool.pending():  # kept by a process before this one: Redis may take them now
        gw.finish_until_taken(pending, kept=True)
    spans = tracing.tracer(settings.otlp_endpoint)
    server = Server({PROCESS_PATH: (Processor(gw, spans).process, ep.ProcessingRequest.FromString),
                     access_log.ALS_PATH: (access_log.ClientsLeft(store, gw.leaving).stream, access_log.parse)})
    metrics.serve(settings.metrics_http_port, settings.metrics_host,
                  settings.envoy_admin_port if settings.metrics_envoy else None)
    try:
        await heartbeat(store.fast, gw.owner)
        await asyncio.gather(*(r.ping() for _ in range(REDIS_POOL)))  # every pooled connection open
        redis_ok = True
    except Exception as e:  # noqa: BLE001 - Redis down at start: NOT_SERVING until it is back
        log.warning("Redis unreachable at start: %s: %s", type(e).__name__, e)
        redis_ok = False
    # Everything loaded so far lives as long as the process: keep it out of the collector's scans, and
    # collect the young generation less often (a request allocates a few hundred objects), so a full
    # collection never stalls a request for milliseconds.
    gc.collect()
    gc.freeze()
    gc.set_threshold(20000, 20, 20)
    await server.start("127.0.0.1", settings.grpc_port, settings.extproc_socket(settings.grpc_port))
    serving(server, {"redis": redis_ok})

    async def redis_check() -> None:
        # the request path's own connection first: that is the one every request needs
        await store.fast.call("PING")
        await heartbeat(store.fast, gw.owner)
        await store.sync_clock()

    postgres_check = health.PostgresCheck(settings.database_url)
    watch = health.Health({"redis": redis_check, "postgres": postgres_check},
                          lambda up: serving(server, up))
    beat_task = asyncio.create_task(watch.run())
    watch_task = asyncio.create_task(watch_catalog(settings.catalog, gw, gw.directory.applied))
    log.info("ext_proc listening on 127.0.0.1:%d", settings.grpc_port)
    await until_stopped()
    beat_task.cancel()
    serving(server, {})
    if settings.drain_envoy_on_stop:  # compose stops it before its Envoy, Kubernetes both at once: drain
        # that Envoy, serving what it still relays, before stopping
        await asyncio.to_thread(envoy_admin.drain, settings.envoy_admin_port, settings.drain_grace_s)
    await server.stop(grace=settings.drain_grace_s)
    watch_task.cancel()
    postgres_check.close()
    await pool.close()
    await r.aclose()


if __name__ == "__main__":
    run(GatewaySettings, serve)
