"""A small pipelined Redis client for the two scripts on the request path.

redis-py's asyncio client spends ~150 µs of Python per command; this one writes the command and
awaits its reply on one shared connection (replies come back in order, so concurrent requests
pipeline naturally).  Sans-I/O parser (``RespParser``) + a thin asyncio protocol.  A lost or hung
connection fails the calls waiting on it and is replaced on the next call.  It takes the URLs redis-py
takes (core/urls.py): password or ACL user, database number, TLS (rediss://), unix sockets; AUTH
and SELECT are sent on every new connection.
"""
from __future__ import annotations

import asyncio
import hashlib
import ssl
from collections import deque
from ssl import SSLContext
from typing import Any, cast

from .urls import mask, parse_redis


class RespError(Exception):
    """An error reply from Redis (``-ERR ...``)."""


class RespParser:
    """Fed bytes, yields complete RESP2 replies (bytes, int, None, list, or RespError values)."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[Any]:
        self._buf += data
        out: list[Any] = []
        while True:
            parsed = self._parse(0)
            if parsed is None:
                return out
            value, end = parsed
            del self._buf[:end]
            out.append(value)

    def _parse(self, at: int) -> tuple[Any, int] | None:
        buf = self._buf
        nl = buf.find(b"\r\n", at)
        if nl < 0:
            return None
        kind, line = buf[at:at + 1], bytes(buf[at + 1:nl])
        nxt = nl + 2
        if kind == b"+":
            return line, nxt
        if kind == b"-":
            return RespError(line.decode(errors="replace")), nxt
        if kind == b":":
            return int(line), nxt
        if kind == b"$":
            n = int(line)
            if n < 0:
                return None, nxt
            if len(buf) < nxt + n + 2:
                return None
            return bytes(buf[nxt:nxt + n]), nxt + n + 2
        if kind == b"*":
            n = int(line)
            if n < 0:
                return None, nxt
            items = []
            for _ in range(n):
                parsed = self._parse(nxt)
                if parsed is None:
                    return None
                item, nxt = parsed
                items.append(item)
            return items, nxt
        raise RespError(f"unexpected reply type {kind!r}")


def encode(args: tuple[Any, ...]) -> bytes:
    parts = [b"*%d\r\n" % len(args)]
    for a in args:
        b = a if isinstance(a, bytes) else str(a).encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(b), b))
    return b"".join(parts)


class _Conn(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = RespParser()
        self.waiting: deque[asyncio.Future[Any]] = deque()
        self.lost = False
        self._out: list[bytes] = []  # commands of this turn of the event loop, sent in one write

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # a stream transport (uvloop's are not subclasses of asyncio.Transport, only alike)
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        for reply in self.parser.feed(data):
            fut = self.waiting.popleft()
            if not fut.done():
                fut.set_result(reply)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        while self.waiting:
            fut = self.waiting.popleft()
            if not fut.done():
                fut.set_exception(ConnectionError("Redis connection lost"))

    def send(self, args: tuple[Any, ...]) -> asyncio.Future[Any]:
        assert self.transport is not None
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        self.waiting.append(fut)
        if not self._out:
            loop.call_soon(self._flush)
        self._out.append(encode(args))
        return fut

    def _flush(self) -> None:
        out, self._out = self._out, []
        if self.transport is not None and not self.lost:
            self.transport.write(b"".join(out) if len(out) > 1 else out[0])


def expire(fut: "asyncio.Future[Any]") -> None:
    """A timer's end for a future still awaited (here and in ``grpc_server``): it raises TimeoutError."""
    if not fut.done():
        fut.set_exception(TimeoutError())


class RespSetupError(ConnectionError):
    """A new connection was refused at login (AUTH, or NOAUTH: a password is needed) or at SELECT.
    The message names the server (its password masked) and quotes Redis's reply.  Not retried."""


def _setup_error(label: str, cmd: tuple[Any, ...], reply: RespError) -> RespSetupError:
    if str(reply).startswith("NOAUTH"):
        return RespSetupError(f"Redis at {label} needs a password (give it in REDIS_URL): {reply}")
    what = "the credentials (AUTH)" if cmd[0] == "AUTH" else f"SELECT {cmd[1]}"
    return RespSetupError(f"Redis at {label} refused {what}: {reply}")


class RespClient:
    def __init__(self, host: str = "localhost", port: int = 6379, *, db: int = 0, timeout: float = 2.0,
                 username: str | None = None, password: str | None = None, unix_path: str | None = None,
                 tls: SSLContext | None = None, label: str = "", name: str = "") -> None:
        self.host, self.port, self.db, self.timeout = host, port, db, timeout
        self.name = name  # given to every connection (CLIENT SETNAME) when set
        self.unix_path, self.tls = unix_path, tls
        self.label = label or (f"unix://{unix_path}" if unix_path else f"redis://{host}:{port}/{db}")
        # sent first on every new connection (in one write, answered before any command is sent)
        self._setup: list[tuple[Any, ...]] = []
        if username:
            self._setup.append(("AUTH", username, password or ""))
        elif password:
            self._setup.append(("AUTH", password))
        if db:
            self._setup.append(("SELECT", db))
        self._conn: _Conn | None = None
        self._connecting: asyncio.Lock | None = None
        self._closed = False  # ``close``d: no new connection (a node left for another, after a failover)
        self._shas: dict[str, str] = {}

    @classmethod
    def from_url(cls, url: str, name: str = "") -> "RespClient":
        """Any URL redis-py's ``from_url`` takes (see core/urls.py): redis://, rediss://, unix://,
        user name and password, database number, TLS parameters."""
        t = parse_redis(url)
        return cls(t.host, t.port, db=t.db, username=t.username, password=t.password, unix_path=t.unix_path,
                   tls=t.tls.context() if t.tls else None, label=mask(t.url), name=name)

    async def _open(self) -> _Conn:
        loop = asyncio.get_running_loop()
        try:
            if self.unix_path is not None:
                _, conn = await loop.create_unix_connection(_Conn, self.unix_path)
            else:
                _, conn = await loop.create_connection(_Conn, self.host, self.port, ssl=self.tls)
        except ssl.SSLError as e:
            raise ConnectionError(f"TLS with Redis at {self.label} failed: {e}") from e
        except OSError as e:
            if isinstance(e, TimeoutError):
                raise
            raise ConnectionError(f"cannot reach Redis at {self.label}: {e}") from e
        setup = self._setup + ([("CLIENT", "SETNAME", self.name)] if self.name else [])
        if not setup:
            return conn
        try:
            replies = await asyncio.gather(*(conn.send(cmd) for cmd in setup))
            for cmd, reply in zip(setup, replies):
                if isinstance(reply, RespError) and cmd[0] != "CLIENT":  # a name refused: only a name
                    raise _setup_error(self.label, cmd, reply)
        except BaseException:
            assert conn.transport is not None
            conn.transport.close()
            raise
        return conn

    async def _connection(self) -> _Conn:
        if self._conn is not None and not self._conn.lost:
            return self._conn
        if self._connecting is None:
            self._connecting = asyncio.Lock()
        async with self._connecting:
            if self._conn is None or self._conn.lost:
                if self._closed:
                    raise ConnectionError(f"the client of Redis at {self.label} is closed")
                conn = await asyncio.wait_for(self._open(), self.timeout)
                if self._closed:  # closed while it connected (a frozen node that came back meanwhile)
                    assert conn.transport is not None
                    conn.transport.close()
                    raise ConnectionError(f"the client of Redis at {self.label} is closed")
                self._conn = conn
        return self._conn

    async def call(self, *args: Any) -> Any:
        """One command; a broken connection is replaced and the command tried once more."""
        for attempt in (0, 1):
            try:
                conn = await self._connection()
                fut = conn.send(args)
                timer = asyncio.get_running_loop().call_later(self.timeout, expire, fut)
                try:
                    reply = await fut
                finally:
                    timer.cancel()  # a plain timer: asyncio.timeout costs ~10 us per command
            except RespSetupError:
                raise
            except TimeoutError:  # first: it is an OSError too, and must not be retried on a new connection
                self._drop()
                raise ConnectionError("Redis did not answer in time") from None
            except (ConnectionError, OSError):
                if attempt:
                    raise
                continue
            if isinstance(reply, RespError):
                if str(reply).startswith("NOAUTH"):
                    raise _setup_error(self.label, args, reply)
                raise reply
            return reply
        raise AssertionError("unreachable")

    async def call_replicated(self, *args: Any, wait_ms: int = 500) -> tuple[Any, int]:
        """``args`` and then ``WAIT 1 wait_ms``, written together on one connection: (the reply, how many
        replicas have the write).  WAIT counts only the writes of its own connection, so the two never go
        on different ones: a WAIT on a new connection would count nothing and confirm at once.  A
        connection lost or silent meanwhile raises ``ConnectionError`` and nothing is sent again here
        (the caller sends the write again, whole)."""
        conn = await self._connection()
        reply_f, acked_f = conn.send(args), conn.send(("WAIT", 1, wait_ms))
        loop = asyncio.get_running_loop()
        timers = [loop.call_later(self.timeout, expire, reply_f),
                  loop.call_later(self.timeout + wait_ms / 1000, expire, acked_f)]
        try:
            got: tuple[Any, Any] = await asyncio.gather(reply_f, acked_f, return_exceptions=True)
            reply, acked = got
        finally:
            for t in timers:
                t.cancel()
        for r in (reply, acked):
            if isinstance(r, TimeoutError):
                self._drop()
                raise ConnectionError("Redis did not answer in time")
            if isinstance(r, BaseException) and not isinstance(r, RespError):  # the connection lost
                raise r
        if isinstance(reply, RespError):
            raise reply
        return reply, acked if isinstance(acked, int) else 0

    def _drop(self) -> None:
        # replies of a connection that stopped answering would come back out of order: never reuse it
        if self._conn is not None and self._conn.transport is not None:
            self._conn.transport.close()
        self._conn = None

    async def evalsha(self, script: str, keys: list[Any], args: list[Any]) -> Any:
        sha = self._shas.get(script)
        if sha is None:
            sha = self._shas[script] = hashlib.sha1(script.encode()).hexdigest()
        try:
            return await self.call("EVALSHA", sha, len(keys), *keys, *args)
        except RespError as e:
            if not str(e).startswith("NOSCRIPT"):
                raise
            await self.call("SCRIPT", "LOAD", script)
            return await self.call("EVALSHA", sha, len(keys), *keys, *args)

    async def close(self) -> None:
        self._closed = True
        self._drop()
