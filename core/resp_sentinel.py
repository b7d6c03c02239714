"""The request path's Redis client behind Sentinel: the primary the sentinels name for the service,
asked again after a lost connection or a ``READONLY`` reply (the node it spoke to is a replica now: a
failover happened), and once a second besides.

Every sentinel is asked (``SENTINEL MASTER``), and the answer of the newest configuration (its epoch)
counts: a sentinel that has not yet heard of a failover still names the old primary, and an old primary
resumed after a freeze (a paused process, a stalled machine) takes writes as a primary until the
sentinels demote it, seconds later, and then drops them.  The once-a-second look moves a client that
connected to it meanwhile (named while the failover was under way) within a second of the sentinels'
change.  A primary its sentinels see down (``s_down``) is not connected to: while the sentinels still
name a primary that is gone or frozen, a call fails at once (the caller answers 500), and nothing
waits longer than the client's timeout.  A write that must survive a failover (``replicated``) waits
for a replica's copy, as on a cluster.
"""
from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, TypeVar

from .resp import RespClient, RespError, RespSetupError

Node = tuple[str, int]
T = TypeVar("T")
FOLLOW_EVERY_S = 1.0  # how often the sentinels are asked whether the primary moved
_DOWN = {"s_down", "o_down", "disconnected"}

log = logging.getLogger("redis.sentinel")


@dataclass(frozen=True)
class Named:
    """One sentinel's answer: the primary it names, in which configuration, whether it sees it down,
    and how many of its replicas can take a copy now (``WAIT`` counts those connected)."""
    where: Node
    epoch: int
    down: bool
    replicas: int


def newest(answers: list[Named]) -> Named | None:
    """The answer to follow: of the newest configuration, from a sentinel that sees the primary up;
    None when the newest configuration's primary is seen down (or nobody answered)."""
    if not answers:
        return None
    epoch = max(a.epoch for a in answers)
    return next((a for a in answers if a.epoch == epoch and not a.down), None)


class SentinelClient:
    def __init__(self, sentinels: tuple[Node, ...], service: str, make: Callable[[str, int], RespClient],
                 ask: Callable[[str, int], RespClient], timeout: float = 2.0) -> None:
        """``make(host, port)``: a client of a Redis (logged in as REDIS_URL says); ``ask``: of a sentinel."""
        self.sentinels, self.service, self._make, self._ask, self.timeout = sentinels, service, make, ask, timeout
        self._primary: RespClient | None = None
        self._replicas = 0
        self._shas: dict[str, str] = {}
        self._follower: asyncio.Task[None] | None = None
        self._looking: asyncio.Future[RespClient] | None = None  # the look at the sentinels under way

    async def primary(self) -> RespClient:
        """The named primary's client.  The calls that need one while none is known share one look at
        the sentinels (a failover under load would otherwise open three connections per request); a
        caller that gives up (its budget spent) leaves the look to the others."""
        if self._primary is not None:
            return self._primary
        if self._follower is None:
            self._follower = asyncio.create_task(self._follow())
        if self._looking is None:
            self._looking = asyncio.ensure_future(self._look())
            self._looking.add_done_callback(self._looked)
        return await asyncio.shield(self._looking)

    def _looked(self, look: "asyncio.Future[RespClient]") -> None:
        self._looking = None
        if not look.cancelled():
            look.exception()  # taken: every caller that still waits gets it

    async def _look(self) -> RespClient:
        answers, errors = await self._ask_all()
        named = newest(answers)
        if named is None:  # a sentinel that refused our login says so (not retried); else "down"
            refused = next((e for e in errors if isinstance(e, RespSetupError)), None)
            raise refused or ConnectionError(f"no sentinel names a primary of {self.service} that is up"
                                             + (f" ({errors[0]})" if errors and not answers else ""))
        self._replicas = named.replicas
        self._primary = self._make(*named.where)
        return self._primary

    async def _ask_all(self) -> tuple[list[Named], list[Exception]]:
        """The sentinels' answers (each asked within the client's timeout), and the errors of the others."""
        got = await asyncio.gather(*(self._ask_one(*addr) for addr in self.sentinels), return_exceptions=True)
        return [g for g in got if isinstance(g, Named)], [g for g in got if isinstance(g, Exception)]

    async def _ask_one(self, host: str, port: int) -> Named:
        sentinel = self._ask(host, port)
        try:
            master = _fields(await sentinel.call("SENTINEL", "MASTER", self.service))
            replicas = await sentinel.call("SENTINEL", "REPLICAS", self.service)
        finally:
            await sentinel.close()
        flags = _flags(master)
        up = sum(1 for r in replicas if not _flags(_fields(r)) & _DOWN)
        return Named((master[b"ip"].decode(), int(master[b"port"])), int(master.get(b"config-epoch", 0)),
                     bool(flags & {"s_down", "o_down"}), up)

    async def _follow(self) -> None:
        """Once a second: a primary the sentinels no longer name is left (its client closed, so the calls
        on it fail and are sent again by their callers; the next call connects to the one named)."""
        while True:
            await asyncio.sleep(FOLLOW_EVERY_S)
            if self._primary is None:
                continue
            try:
                named = newest((await self._ask_all())[0])
                primary = self._primary
                if named is not None and primary is not None and named.where != (primary.host, primary.port):
                    log.warning("the sentinels name another Redis primary: following it")
                    await self._forget(primary)
            except Exception as e:  # noqa: BLE001 - the next look may do better; calls go on meanwhile
                log.warning("could not ask the sentinels: %s", type(e).__name__)

    async def call(self, *args: Any) -> Any:
        client = await self.primary()
        return await self._on(client, client.call(*args))

    async def _on(self, client: RespClient, work: Awaitable[T]) -> T:
        """``work`` on ``client``; a lost connection or a ``READONLY`` reply leaves that primary."""
        try:
            return await work
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
        """The script on the primary; with ``replicated``, it counts once a replica has it too (``WAIT``
        on the same connection: none confirming within half a second raises ``ConnectionError``, the
        caller sends it again)."""
        sha = self._shas.get(script)
        if sha is None:
            sha = self._shas[script] = hashlib.sha1(script.encode()).hexdigest()
        client = await self.primary()
        wait = replicated and self._replicas > 0

        async def run(*cmd: Any) -> Any:
            if not wait:
                return await self._on(client, client.call(*cmd, len(keys), *keys, *args))
            reply, acked = await self._on(client, client.call_replicated(*cmd, len(keys), *keys, *args))
            if acked < 1:  # its replicas may have changed: ask the sentinels again
                await self._forget(client)
                raise ConnectionError("no replica of the Redis primary confirmed the write")
            return reply
        try:
            return await run("EVALSHA", sha)
        except RespError as e:
            if not str(e).startswith("NOSCRIPT"):
                raise
            return await run("EVAL", script)

    async def close(self) -> None:
        if self._looking is not None:
            self._looking.cancel()
        if self._follower is not None:
            self._follower.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._follower
            self._follower = None
        if self._primary is not None:
            await self._primary.close()


def _fields(flat: list[Any]) -> dict[bytes, Any]:
    """A sentinel's description of an instance (a flat list of names and values) as a dict."""
    return dict(zip(flat[::2], flat[1::2]))


def _flags(info: dict[bytes, Any]) -> set[str]:
    return set(info.get(b"flags", b"").decode().split(","))
