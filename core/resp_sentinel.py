"""The request path's Redis client behind Sentinel: the primary the sentinels name for the service
(``SENTINEL get-master-addr-by-name``), asked again after a lost connection or a ``READONLY`` reply (the
node it spoke to is a replica now: a failover happened).  While the sentinels still name a primary that
is gone, a call fails at once (the caller answers 500): nothing waits longer than the client's timeout.
A write that must survive a failover (``replicated``) waits for a replica's copy, as on a cluster.
"""
from __future__ import annotations

import hashlib
from typing import Any, Callable

from .resp import RespClient, RespError

Node = tuple[str, int]


class SentinelClient:
    def __init__(self, sentinels: tuple[Node, ...], service: str, make: Callable[[str, int], RespClient],
                 ask: Callable[[str, int], RespClient], timeout: float = 2.0) -> None:
        """``make(host, port)``: a client of a Redis (logged in as REDIS_URL says); ``ask``: of a sentinel."""
        self.sentinels, self.service, self._make, self._ask, self.timeout = sentinels, service, make, ask, timeout
        self._primary: RespClient | None = None
        self._replicas = 0
        self._shas: dict[str, str] = {}

    async def primary(self) -> RespClient:
        if self._primary is not None:
            return self._primary
        error: Exception = ConnectionError(f"no sentinel names a primary for {self.service}")
        for addr in self.sentinels:
            sentinel = self._ask(*addr)
            try:
                where = await sentinel.call("SENTINEL", "get-master-addr-by-name", self.service)
                if where is None:
                    continue
                replicas = await sentinel.call("SENTINEL", "replicas", self.service)
            except (ConnectionError, OSError, RespError) as e:
                error = e
                continue
            finally:
                await sentinel.close()
            # the replicas that can take a copy now (WAIT counts those connected)
            self._replicas = sum(1 for r in replicas if not _flags(r) & {"s_down", "o_down", "disconnected"})
            self._primary = self._make(where[0].decode(), int(where[1]))
            return self._primary
        raise error

    async def call(self, *args: Any) -> Any:
        client = await self.primary()
        try:
            return await client.call(*args)
        except (ConnectionError, OSError):
            await self._forget(client)
            raise
        except RespError as e:
            if str(e).startswith("READONLY"):  # a replica now: the primary moved
                await self._forget(client)
                raise ConnectionError("the Redis named primary is a replica now (a failover)") from None
            raise

    async def _forget(self, client: RespClient) -> None:
        if self._primary is client:
            self._primary = None
            await client.close()

    async def evalsha(self, script: str, keys: list[Any], args: list[Any], *, replicated: bool = False) -> Any:
        """The script on the primary; with ``replicated``, it counts once a replica has it too (``WAIT``:
        none confirming within half a second raises ``ConnectionError``, the caller sends it again)."""
        sha = self._shas.get(script)
        if sha is None:
            sha = self._shas[script] = hashlib.sha1(script.encode()).hexdigest()
        try:
            reply = await self.call("EVALSHA", sha, len(keys), *keys, *args)
        except RespError as e:
            if not str(e).startswith("NOSCRIPT"):
                raise
            reply = await self.call("EVAL", script, len(keys), *keys, *args)
        if replicated and self._replicas and int(await self.call("WAIT", 1, 500)) < 1:
            if self._primary is not None:  # its replicas may have changed: ask the sentinels again
                await self._forget(self._primary)
            raise ConnectionError("no replica of the Redis primary confirmed the write")
        return reply

    async def close(self) -> None:
        if self._primary is not None:
            await self._primary.close()


def _flags(fields: list[Any]) -> set[str]:
    """The flags of one entry of ``SENTINEL replicas`` (a flat list of names and values)."""
    info = dict(zip(fields[::2], fields[1::2]))
    return set(info.get(b"flags", b"").decode().split(","))
