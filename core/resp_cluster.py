"""The request path's Redis client for a Redis Cluster: one ``RespClient`` per primary, each command sent
to the primary that serves its first key's hash slot.

The slot map comes from ``CLUSTER SLOTS`` (asked of any node it knows, the URL's seeds first) and is
asked again after a ``MOVED`` reply (a slot moved, or a replica took over a primary that failed) or a
lost connection.  ``MOVED`` is followed at once (the command did not run), ``ASK`` too, with ``ASKING``
sent before the command on the same connection (a slot being migrated).  A node that cannot be reached
fails the call (the caller answers 500), as ``CLUSTERDOWN`` does while a failover is under way: nothing
waits longer than the client's timeout.
"""
from __future__ import annotations

import asyncio
import hashlib
from typing import Any, Callable

from redis.crc import key_slot

from .resp import RespClient, RespError
from .resp_sentinel import SentinelClient
from .urls import mask, parse_redis

SLOTS = 16384
REDIRECTS = 3  # MOVED/ASK followed at most this many times for one command

Node = tuple[str, int]


class ClusterClient:
    def __init__(self, seeds: tuple[Node, ...], make: Callable[[str, int], RespClient], timeout: float = 2.0) -> None:
        """``make(host, port)``: a ``RespClient`` for one node, logged in as REDIS_URL says."""
        self.seeds, self._make, self.timeout = seeds, make, timeout
        self._nodes: dict[Node, RespClient] = {}
        self._slots: list[Node | None] = [None] * SLOTS
        self._replicas: dict[Node, int] = {}  # each primary's replicas, as CLUSTER SLOTS last listed them
        self._stale = True
        self._refreshing: asyncio.Lock | None = None
        self._shas: dict[str, str] = {}

    def node(self, addr: Node) -> RespClient:
        client = self._nodes.get(addr)
        if client is None:
            client = self._nodes[addr] = self._make(*addr)
        return client

    async def refresh(self) -> None:
        """Read the slot map from the first node that answers (those it knows first, then the seeds)."""
        if self._refreshing is None:
            self._refreshing = asyncio.Lock()
        async with self._refreshing:
            if not self._stale:
                return
            error: Exception = ConnectionError("no Redis Cluster node to ask for its slots")
            for addr in [*dict.fromkeys([*self._nodes, *self.seeds])]:
                try:
                    ranges = await self.node(addr).call("CLUSTER", "SLOTS")
                except (ConnectionError, OSError, RespError) as e:
                    error = e
                    continue
                slots: list[Node | None] = [None] * SLOTS
                replicas: dict[Node, int] = {}
                for start, end, primary, *others in ranges:
                    node = (primary[0].decode() or addr[0], int(primary[1]))  # an empty host: the node answering
                    replicas[node] = len(others)
                    for s in range(int(start), int(end) + 1):
                        slots[s] = node
                self._slots, self._replicas, self._stale = slots, replicas, False
                return
            raise error

    async def _target(self, key: Any) -> RespClient:
        if self._stale:
            await self.refresh()
        if key is None:
            addr = next((a for a in self._slots if a is not None), self.seeds[0])
        else:
            addr = self._slots[key_slot(key if isinstance(key, bytes) else str(key).encode())] or self.seeds[0]
        return self.node(addr)

    async def send(self, key: Any, *args: Any) -> Any:
        """``args`` to the primary serving ``key``'s slot (any node for None), redirections followed."""
        return await self._send(key, args)

    async def send_replicated(self, key: Any, *args: Any, wait_ms: int = 500) -> Any:
        """``send``, then ``WAIT`` on the same connection until a replica has the write too, so that a
        failover does not take it back: a primary with a replica that does not confirm it within
        ``wait_ms`` raises ``ConnectionError`` (the write may be lost; the caller sends it again)."""
        return await self._send(key, args, wait_ms)

    async def _send(self, key: Any, args: tuple[Any, ...], wait_ms: int | None = None) -> Any:
        """``args`` where ``key`` lives; with ``wait_ms``, on a primary with replicas, the write and its
        ``WAIT`` together on one connection (``RespClient.call_replicated``)."""
        client = await self._target(key)
        asking = False
        for _ in range(REDIRECTS + 1):
            try:
                if wait_ms is not None and self._replicas.get((client.host, client.port), 0) > 0:
                    sent = client.call_replicated(*args, wait_ms=wait_ms)
                    reply, acked = (await asyncio.gather(client.call("ASKING"), sent))[1] if asking else await sent
                    if acked < 1:
                        self._stale = True  # its replica may be gone: read the map again
                        raise ConnectionError("no replica of the Redis Cluster's primary confirmed the write")
                elif asking:
                    _, reply = await asyncio.gather(client.call("ASKING"), client.call(*args))
                else:
                    reply = await client.call(*args)
                return reply
            except RespError as e:
                kind, _, where = str(e).partition(" ")
                if kind not in ("MOVED", "ASK"):
                    raise
                host, _, port = where.partition(" ")[2].rpartition(":")
                addr = (host or client.host, int(port))
                if kind == "MOVED":
                    self._stale = True  # the whole map is read again on the next call
                    asking = False
                else:
                    asking = True
                client = self.node(addr)
            except (ConnectionError, OSError):
                self._stale = True  # a primary gone: the next call finds who took its slots over
                raise
        raise ConnectionError("Redis Cluster redirected a command too many times")

    async def call(self, *args: Any) -> Any:
        """One command, sent where its first argument after the name (its key) lives."""
        return await self.send(args[1] if len(args) > 1 else None, *args)

    async def evalsha(self, script: str, keys: list[Any], args: list[Any], *, replicated: bool = False) -> Any:
        """The script, sent to its first key's primary (``send_replicated`` with ``replicated``)."""
        sha = self._shas.get(script)
        if sha is None:
            sha = self._shas[script] = hashlib.sha1(script.encode()).hexdigest()
        key = keys[0] if keys else None
        send = self.send_replicated if replicated else self.send
        try:
            return await send(key, "EVALSHA", sha, len(keys), *keys, *args)
        except RespError as e:
            if not str(e).startswith("NOSCRIPT"):
                raise
            return await send(key, "EVAL", script, len(keys), *keys, *args)

    async def close(self) -> None:
        for client in self._nodes.values():
            await client.close()


def client_from_url(url: str, name: str = "") -> RespClient | ClusterClient | SentinelClient:
    """The request path's client for REDIS_URL: one Redis, a cluster (redis+cluster://) or the primary
    Sentinel names (redis+sentinel://, core/urls.py)."""
    t = parse_redis(url)
    if not t.seeds:
        return RespClient.from_url(url, name=name)
    tls = t.tls.context() if t.tls else None
    scheme = "rediss" if tls else "redis"

    def make(host: str, port: int) -> RespClient:
        return RespClient(host, port, db=t.db, username=t.username, password=t.password, tls=tls, name=name,
                          label=mask(f"{scheme}://{host}:{port}/{t.db}"))
    if t.cluster:
        return ClusterClient(t.seeds, make)

    def ask(host: str, port: int) -> RespClient:
        return RespClient(host, port, password=t.sentinel_password, tls=tls, label=f"sentinel {host}:{port}")
    return SentinelClient(t.seeds, t.service, make, ask)
